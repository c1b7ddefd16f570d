//! Failover's messages: a rank's `Lost` report, the leader's `Failover`
//! (report too) and `Recover` (every report and the switch operation).
//!
//! # Failover around these messages: staging, streams, recovery, rejoin
//!
//! A server can also die without warning (SIGKILL, a crashed host). A job with other servers keeps
//! running: the interrupted all-reduces are redone on the survivors with a bit-identical result, and
//! the caller sees a slower all-reduce, not an error. The module doc of
//! `engine/src/client/failover/mod.rs` is the long version (why staging results makes a redo
//! always possible; the recovery, the rejoin, the limits); the messages are
//! `engine/src/wire/failover.rs`, the servers' part `ControlPlane::lost`
//! (`engine/src/control/failover.rs`). Not said there:
//!
//! **Staging** (`client/stage.rs`, owned by `Failover`) takes per stream twice the window of piece-sized slots (2 MiB
//! blocks and up on transparent huge pages), and every result goes through it: into its slot, then
//! copied into the caller's buffer by the rail that received it (or the caller's thread). Results
//! once skipped it where a proof within the operation said no rank could need them from here after
//! it completed (a later result of the same stream, or an empty last piece per stream, the *seal*,
//! from 8 MiB); but a link cut in the middle of a piece left a receive the provider could not
//! cancel, which wrote the rest of that piece into the caller's buffer after the heal, long after
//! the recovery had completed the all-reduce and the caller had reused the memory
//! (`tests/suites/linkcut.rs` watches for it). On the device the copy had cost what the seals did
//! at 16 and 64 MiB ([measurements, "Failover"](docs/measurements.md#failover)). Every rank must
//! take part in a recovery, so `TALLY_FAILOVER` must agree across a job's ranks: the Hello's
//! `FAILOVER` flag, and a server refuses a rank whose flag differs
//! (`tests/suites/failover.rs`, `ranks_that_disagree_on_failover_are_refused_at_the_join`); it
//! holds ranks to one `seal_shift` too, which builds from before the change set.
//! Servers hold ranks alike on everything that decides the cut as well: the stream order (`TALLY_INTERLEAVE`,
//! the Hello's `INTERLEAVE` flag) and the smallest spread piece (`TALLY_MIN_PIECE`, the Hello's
//! `min_piece`, 0 for the default so that older ranks meet newer ones); ranks that differ would
//! meet with different pieces in one slot, so the server refuses them (`tests/suites/agg.rs`).
//! Failover is off over shm; single-server jobs and `TALLY_FAILOVER=0` skip staging.
//!
//! **Streams live from one operation to another**: from `born` (0, or the switch operation of the
//! rejoin that added it) to `died` (that of the recovery from losing it); operation k's stream set is
//! every stream with `born <= k < died` on a server not drained away, so every rank cuts k alike,
//! even one that issues k only after the switch.
//!
//! **Recovery details.** Redo jobs (`failover/redo.rs`) run on lcore 0 with window 4; a rank whose
//! chunks are redone and whose operations before K are cut says Bye to them. A second loss while a
//! recovery's chunks are in flight fails the job with an error naming both losses. With no server
//! left every rank fails with "every server of job ... is lost ... no server left to fail over to".
//! The window limit of 32 is the report's bitmap. On EFA the redo jobs' slots and the identity piece
//! are registered too. A vanished host (powered off, link down) or a server making no progress
//! (frozen, hung) is noticed by missing heartbeats ("Failure detection").
//!
//! **Rejoin** (`failover/rejoin.rs`). The `Watcher` thread (`failover/watcher.rs`) tries the lost servers every half second
//! (a blocking connect to a dead host must not stall the data path). One that answers `busy` (every
//! rank of every job reconnecting at once) is tried again half a second later, the ranks already in
//! waiting within the server's `join_timeout_s`
//! (`a_restarted_server_that_answers_busy_is_taken_back_once_it_has_room`); one that refuses
//! otherwise, or grants smaller pieces than the job uses, is left out for good. After a cut link,
//! tcp;ofi_rxm's connections (one per endpoint pair, for the process's life) still hold the data in
//! flight at the cut, resent only when TCP's backoff timer fires, up to about as long again as the
//! cut lasted: a server taken back at once made the next all-reduce wait for it (5.2 s after a 20 s
//! cut). So over tcp a lost server is taken back only once none of the process's connections to
//! its endpoints is backed off, on the rank (the watcher) and on the server (a rejoin Hello is
//! answered `busy` meanwhile), and while it is away the watcher caps their backoff at 1 s on
//! kernels that can (`engine/src/host/tcp_backoff.rs` says how, and why the give-up time is kept).
//! Recovery and rejoin times: [measurements, "Failover"](docs/measurements.md#failover).
use super::{expect_kind, Header, Kind, WireError, MAX_RANKS};
use bytemuck::{Pod, Zeroable};
use core::mem::size_of;
use static_assertions::const_assert_eq;

/// The largest report a rank may attach to a [`Lost`] (the server keeps
/// one per rank until every rank reported).
pub const MAX_REPORT: u32 = 64 << 10;

/// Rank to the surviving server it takes as the recovery's leader (the
/// first in its server list that it has not lost): it lost the servers in
/// `dead` (bit i: the i-th server of the job's list, the same list on every
/// rank). `boundary` is its first all-reduce not yet cut, as in
/// [`Boundary`]. `report_len` bytes follow: the rank's view of the lost
/// servers' work, opaque to the server, which hands every rank's report to
/// every rank in the [`Recover`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Lost {
    pub header: Header,
    pub dead: u64,
    pub boundary: u64,
    pub report_len: u32,
    pub _pad: u32,
}
const_assert_eq!(size_of::<Lost>(), 32);

/// Server to every rank of a job: a rank reported losing the servers in
/// `dead` (the union of what ranks reported so far). A rank that has not
/// reported this set reports it (after dropping those servers itself).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Failover {
    pub header: Header,
    pub dead: u64,
}
const_assert_eq!(size_of::<Failover>(), 16);

/// Server to every rank, once every rank reported the same `dead` set:
/// operations from `switch_op` (the largest boundary) on run without those
/// servers; `nranks` reports of `report_len` bytes follow, in rank order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Recover {
    pub header: Header,
    pub dead: u64,
    pub switch_op: u64,
    pub nranks: u32,
    pub report_len: u32,
}
const_assert_eq!(size_of::<Recover>(), 32);

impl Lost {
    pub fn new(dead: u64, boundary: u64, report_len: u32) -> Lost {
        Lost { header: Header::new(Kind::Lost), dead, boundary, report_len, _pad: 0 }
    }

    /// Checks the header, the padding, a non-empty dead set and the report's bound.
    pub fn check(&self) -> Result<(), WireError> {
        expect_kind(&self.header, Kind::Lost)?;
        if self._pad != 0 {
            return Err(WireError::BadPadding);
        }
        if self.dead == 0 || self.report_len > MAX_REPORT {
            return Err(WireError::BadField("lost"));
        }
        Ok(())
    }
}

impl Failover {
    pub fn new(dead: u64) -> Failover {
        Failover { header: Header::new(Kind::Failover), dead }
    }

    pub fn check(&self) -> Result<u64, WireError> {
        expect_kind(&self.header, Kind::Failover)?;
        Ok(self.dead)
    }
}

impl Recover {
    pub fn new(dead: u64, switch_op: u64, nranks: u32, report_len: u32) -> Recover {
        Recover { header: Header::new(Kind::Recover), dead, switch_op, nranks, report_len }
    }

    pub fn check(&self) -> Result<(), WireError> {
        expect_kind(&self.header, Kind::Recover)?;
        if self.dead == 0 || self.report_len > MAX_REPORT || self.nranks == 0 || self.nranks > MAX_RANKS {
            return Err(WireError::BadField("recover"));
        }
        Ok(())
    }
}
