//! The host: what tally reads from, and prepares on, the machine it runs
//! on: its configuration file, CPU lists, sizes and durations as people
//! write them, and hugepage pools. Nothing here is on a data path.
pub mod config;
pub mod cpuset;
#[cfg(feature = "fabric")]
pub mod limits;
pub mod units;

#[cfg(feature = "fabric")]
pub mod hugepages;
