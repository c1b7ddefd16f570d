//! What failover did, counted for logs and benchmarks
//! (`Client::failover_stats`): failover's own counters, and those the
//! per-chunk path and the sweep keep.
use std::time::Duration;

/// Counters of what failover did, for logs and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailoverStats {
    /// Recoveries completed on this rank.
    pub recoveries: u32,
    /// Chunks relayed from a rank that had the result.
    pub relayed: u64,
    /// Chunks recomputed from every rank's input.
    pub recomputed: u64,
    /// From noticing the loss to the recovery's last redone chunk, last recovery.
    pub last_recovery: Duration,
    /// Lost servers taken back into the job.
    pub rejoins: u32,
    /// Results that went through the staging area (received into a slot and
    /// copied out), while failover was on: every one.
    pub staged: u64,
    /// What the first sub-job holds now, lost servers' part included: its
    /// streams (a server taken back as another process takes its lost
    /// streams' places; as the same process, places of its own), and the
    /// bytes of its staging area, which a server lost and taken back any
    /// number of times, either way, does not grow (`Stage::hand_over`).
    pub streams: u32,
    pub staging_bytes: u64,
    /// Receives of lost streams that completed after the loss (their
    /// results are ignored): the provider had already taken them when the
    /// rank cancelled, and wrote them once the lost server's data came.
    pub late_receives: u64,
    /// Messages for no receive of this rank, discarded (`client::sweep`):
    /// results a fenced job's server sent once it ran again, or anything
    /// else no receive would ever take.
    pub discarded: u64,
}
