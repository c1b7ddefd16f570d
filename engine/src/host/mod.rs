//! The host: what tally reads from, and prepares on, the machine it runs
//! on: its configuration file, its random source, CPU lists, sizes and
//! durations as people write them, hugepage pools, the service manager's
//! notify socket, this process's TCP connections (those that wait out a
//! retransmission backoff, the floor of their timers, and BBR started afresh after an outage), and wall-clock
//! times for log lines. Nothing here is on a data path (an lcore reads the
//! wall clock only when a round breaks its job's record wait).
pub mod config;
#[cfg(feature = "fabric")]
pub mod cpu_wait;
pub mod cpuset;
pub mod fault;
#[cfg(feature = "fabric")]
pub mod limits;
pub mod random;
pub mod units;
pub mod wall_clock;

#[cfg(feature = "fabric")]
pub mod hugepages;
#[cfg(feature = "fabric")]
pub mod sd_notify;
#[cfg(feature = "fabric")]
pub mod tcp_backoff;
#[cfg(feature = "fabric")]
pub mod tcp_renew;
#[cfg(feature = "fabric")]
pub mod tcp_rto_min;
