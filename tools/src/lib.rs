//! The library behind the `tally` command: every command's code, so that
//! `main.rs` is only the command line, and tests can use what the commands
//! use (the NCCL-sequence driver, the benchmark rows).
//!
//! Layers, each using only the ones below it:
//! - [`cmd`]: the commands that are not benchmarks or host preparation
//!   (`server`, `stats`, `demo`, `settings`);
//! - [`bench`](mod@bench): `tally bench reduce | p2p | allreduce | cluster`, their
//!   result rows, tables and plots;
//! - [`host`]: `tally hugepages | efa-env | doctor`, the host's facts;
//! - [`collnet_driver`]: the plugin driven as NCCL drives a CollNet;
//! - [`cli_args`], [`logfile`], [`progress`], [`self_exec`]: the flags, log
//!   lines, progress line and self-started processes that commands share.
pub mod bench;
pub mod cli_args;
pub mod cmd;
pub mod collnet_driver;
pub mod host;
pub mod logfile;
pub mod progress;
pub mod self_exec;
