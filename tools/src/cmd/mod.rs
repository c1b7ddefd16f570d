//! The commands that run or inspect a reduction server (`tally server`,
//! `tally stats`, `tally settings`) and `tally demo`, which strings the
//! benchmarks together. Benchmarks are in [`crate::bench`], host
//! preparation in [`crate::host`].
pub mod demo;
pub mod server;
pub mod server_check;
pub mod settings;
pub mod stats;
