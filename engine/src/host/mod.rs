//! The host: what tally reads from, and prepares on, the machine it runs
//! on: its configuration file, CPU lists, sizes and durations as people
//! write them, hugepage pools, and the service manager's notify socket.
//! Nothing here is on a data path.
pub mod config;
pub mod cpuset;
pub mod fault;
#[cfg(feature = "fabric")]
pub mod limits;
pub mod units;

#[cfg(feature = "fabric")]
pub mod hugepages;
#[cfg(feature = "fabric")]
pub mod sd_notify;
