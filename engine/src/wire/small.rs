//! Small all-reduces' paths, as servers and clients agree on them: which
//! pieces a two-rank job relays, and how a split job's ranks are cut into
//! groups over lcores (the module above describes both).
//!
//! # Small all-reduces and what bounds their latency
//!
//! A one-piece all-reduce costs one hop through a server, plus, for each rank past the first, the
//! server's copy in and result out on the critical path; what keeps that short (command and clock
//! checks every 32nd empty poll, inject, rotation over lcores) and what did not help:
//! [measurements](docs/measurements.md#small-all-reduces-and-what-bounds-their-latency).
//!
//! **Two ranks: the relay.** A two-rank job's pieces of at most `RELAY_MAX` (4 KiB, shm's inject
//! size) go on as they arrive, by inject from their receive buffer, to the *other* rank, which
//! reduces the two in rank order itself (`client/progress/relay.rs`; the long version: the module docs
//! of `engine/src/wire/mod.rs` and `engine/src/dataplane/shard/relay.rs`). The client asks for it
//! (`Hello::RELAY`) for a job on one server only (`ClientConfig::relay`; `TALLY_RELAY=0` turns it
//! off): why, the test that checks it, and the figures:
//! [measurements](docs/measurements.md#two-ranks-the-relay). Ranks that disagree on the flag are
//! refused ("flags ... differs"), a server refuses it above two ranks, and a relay job is never
//! staged (staging shares receive buffers between ranks). Three rules make it safe, each found by
//! `tests/suites/agg.rs` (every type and op, in place and not, pieces at, just above and far above 4
//! KiB, shm by inject and by send, tcp):
//! - the server sends a rank nothing before it has had a piece from it (`Job::heard`; a round's first
//!   piece waits for the second, `Slot::deferred`): a server-initiated send to a rank whose side of
//!   the connection was not set up made shm 1.17 refuse that rank's sends forever and tcp;ofi_rxm
//!   lose the piece;
//! - a rank posts a relayed chunk's receive only once its send is posted: the other rank's piece can
//!   come back before this rank's own went out (it sat on the retry list);
//! - the reduce waits for both the receive and the send: in place, the result overwrites this rank's
//!   piece, which a send in progress may be reading.
//!
//! **Several ranks: the split.** Past two ranks each rank still costs the lcore a copy in and a
//! result out, one after another (about 1.1 us a rank on libfabric 1.22, 1.7 on 1.17, shm). So a job
//! of 4 to 64 ranks on one server whose ranks set `Hello::SPLIT` (`ClientConfig::split`, default on,
//! `TALLY_SPLIT=0` off; a server refuses it outside 4-64 ranks) cuts its *ranks* instead, into
//! contiguous groups of at least two ranks over the lcores that take small operations (the latency
//! lcores where there are, else all): each lcore folds its group's pieces into a partial, the last
//! group in combines the partials, and each lcore sends the result to its own group. The long version
//! (slots, `SplitShared` and why no buffer is read while rewritten, the combine's bits, 16-bit
//! floats): the module docs of `engine/src/dataplane/split.rs` and `engine/src/wire/mod.rs`. Not
//! there: the partials are skipped past 8 groups; an lcore waiting for a combiner does not sleep
//! (adaptive mode yields instead), and the op timeout covers that wait: a group that never completes
//! fails the job from whichever lcore waited (`tests/suites/timeouts.rs`); an lcore whose group is
//! complete gives up five housekeeping ticks (250 ms) after the op timeout, so that one missing part
//! of its group goes first and names the silent ranks. What it gains, how `tests/suites/agg.rs`
//! checks it, and what was tried and not kept: [measurements, "Several ranks: the
//! split"](docs/measurements.md#several-ranks-the-split).
//!
//! **Latency lcores.** A small job sharing lcores with a bulk job waits behind the bytes queued at
//! the lcore ahead of its piece (the bulk job's window x ranks x piece) at the lcore's rate, whatever
//! the order of completions: shm copies a message above its inject size (4 KiB) by process_vm_readv
//! inside the receiver's `fi_cq_read`, every queued message in arrival order in one call, before any
//! completion is returned (`smr_progress_cmd`), so reordering or capping completions per job in
//! `poll_once` cannot help. A 5x target (p99 against the alone p50) needs at most about 100 KiB
//! queued ahead of a small piece ([measurements](docs/measurements.md#latency-lcores)). So
//! `--latency-lcores N` (`latency_lcores`) makes a server's first N lcores take only operations of at
//! most `--latency-max` bytes (default 64 KiB, a power of two), the others only larger ones. The
//! Accept says so (`latency_lcores`, `latency_max_log2`, in what was padding: an older client ignores
//! them and is still served right); the client keeps a stream set per size class, each with its own
//! rotation (`SubJob::gen_for`: per server, its latency lcores for small operations, its other lcores
//! for the rest, all of them where it has none of a class), and every rank, getting the same Accepts,
//! classes and cuts alike. A job placed on no more lcores than the latency ones (`shards`) has no
//! split. A latency lcore's region holds pieces of at most `latency_max` (`ControlPlane::admit`'s
//! `shape`): a job asking for 256 KiB pieces takes a quarter of its bulk region there at the default,
//! a sixteenth at 16 KiB. `tests/suites/latency_lcores.rs` checks where operations go and how regions
//! are sized (its module doc), also for a job over a server with latency lcores and one without, and
//! with the slab gauges (`tally_lcore_slab_used_bytes`) that a latency lcore's region (128 KiB
//! against 2 MiB for 2 ranks x window 4 at 16 KiB against 256 KiB) is freed with the job. The cost is
//! the latency lcores' share of the server's cores; what they gain:
//! [measurements](docs/measurements.md#latency-lcores).
use crate::reduce::DataType;

/// Pieces of a relay job (see the module doc) of at most this many bytes
/// are relayed: shm's inject size, at or below which a piece costs the
/// server one copy to send on.
pub const RELAY_MAX: usize = 4096;

/// Pieces of a split job (see the module doc) of at most this many bytes are
/// split by rank over lcores.
pub const SPLIT_MAX: usize = 4096;

/// Split jobs have at least this many ranks (two lcores of two ranks each)
/// and at most [`SPLIT_MAX_RANKS`] (the combining lcore reads every rank's
/// piece at once).
pub const SPLIT_MIN_RANKS: u32 = 4;

pub const SPLIT_MAX_RANKS: u32 = 64;

/// The most groups whose partials a split round combines (one kernel pass).
pub const SPLIT_MAX_FOLDED_GROUPS: u32 = 8;

/// Whether a split round of `groups` groups of `dtype` folds each group into
/// a partial and combines the partials in group order (see the module doc);
/// otherwise every piece is folded in rank order. Servers and tests agree
/// through this.
pub fn split_folds_groups(groups: u32, dtype: DataType) -> bool {
    (2..=SPLIT_MAX_FOLDED_GROUPS).contains(&groups) && !dtype.is_half()
}

/// How many lcores a split job's small pieces go to, of `lcores` that take
/// its small operations: at least two ranks each. Below 2 the job is not
/// split. The client and the server compute it from the same Accept.
pub fn split_lcores(nranks: u32, lcores: u32) -> u32 {
    lcores.min(nranks / 2)
}

/// Which of the `groups` lcores rank `rank`'s small pieces go to: ranks in
/// contiguous blocks, so that lcore p serves [`split_ranks`]`(p, ..)`.
pub fn split_position(rank: u32, nranks: u32, groups: u32) -> u32 {
    (rank as u64 * groups as u64 / nranks as u64) as u32
}

/// The ranks lcore position `p` of `groups` serves in a split job.
pub fn split_ranks(p: u32, nranks: u32, groups: u32) -> core::ops::Range<u32> {
    let first = |p: u32| (p as u64 * nranks as u64).div_ceil(groups as u64) as u32;
    first(p)..first(p + 1)
}
