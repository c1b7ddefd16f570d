//! How much of an lcore's slab one job gets, and the piece size that follows.
//!
//! A job's region on each lcore it uses holds one piece per (slot, rank):
//! `window x nranks` pieces, each padded to a cache line. The client asks for
//! the piece (its chunk), but the region grows with the ranks: 1024 ranks x
//! window 4 x 256 KiB is 1 GiB per lcore, four times the default slab. So the
//! server has the last word on the piece. It grants the piece asked for when
//! the region fits the job's budget, else the largest piece that does, in
//! whole cache lines (64 bytes: whole elements of every type), but not below
//! [`MIN_PIECE`]. A job that does not fit even then is refused with the rank
//! count and the window that would fit ([`NoFit`]). Every rank learns the
//! piece from its `Accept` (`piece_elems`) and cuts no piece larger.
//!
//! The budget on an lcore is the smaller of a share of its slab,
//! 1/[`JOB_SHARE`], and its largest free range. Free space alone would let
//! the first large job spread its pieces over the whole slab, and every
//! later job would be refused; a quarter keeps room for four jobs at full
//! budget, and still grants 64 ranks x window 4 x 256 KiB (the old rank
//! limit at the client's default chunk and window: 64 MiB) as asked from the
//! default 256 MiB slab. 1024 ranks at window 4 get 16 KiB pieces there.
//!
//! A job that may be staged (`stage_buffers` in the config; not over shm) is
//! not cut to smaller pieces: it gets a staged region of window x (stage + 1)
//! pieces instead (stage + 2 for 16-bit floats, whose accumulator holds f32
//! partials), `stage` receive buffers per slot and the slot's accumulator,
//! and the shard receives the ranks' pieces
//! `stage` at a time and folds them in rank order (`dataplane/shard/staged.rs`, "Staged
//! receives"). 1024 ranks x window 2 x 256 KiB staged 64 at a time take
//! 32.5 MiB instead of 512.
//!
//! Results do not depend on the piece: each element of a result is the
//! rank-order sum of that element, however the all-reduce was cut, and every
//! rank cuts alike (a server gives every rank of a job the same answer, and
//! each rank takes the smallest piece over its servers).
//!
//! # Many ranks: staged receives, what a server holds
//!
//! `tally bench allreduce --ranks N` runs ranks past 64 as threads, 64 per process
//! (`--ranks-per-process`; `tools/src/bench/allreduce/mod.rs`); hundreds fit a small machine because
//! they run in `SCHED_IDLE`, sleep up to 20 ms on their CQ (`ClientConfig::sleep_ms`) and shrink
//! tcp;ofi_rxm's buffers. Over tcp what grows with ranks is per connection (libfabric 1.17's
//! `tcpx_progress` walks every connection on every CQ read; `scripts/build/libfabric.sh` builds a
//! later one to run beside it). `scripts/device/session.sh rankscale` measures issue 18's target,
//! server input GB/s per lcore at 1024 against 8 ranks: with equal messages 1024 ranks are within 20%
//! of 8 where loopback's receive processing leaves the sending core, as a NIC's does. Each of these,
//! and the figures: [measurements, "Many ranks"](docs/measurements.md#many-ranks).
//!
//! **Staged receives** (the mode: "The data path of one chunk"; the budget's side:
//! `engine/src/control/budget.rs`). A job whose pieces would have to shrink to fit its budget keeps
//! its piece and is staged instead (`stage_buffers`, `--stage-buffers`, default 64; not over shm;
//! `budget::can_stage`). The staged default slab measures as a 2 GiB slab did, and 16, 64 or 120
//! buffers a slot alike, so the default stays 64
//! ([measurements](docs/measurements.md#staged-receives)). `tests/suites/many_ranks.rs` runs a staged
//! job of 48 rank threads (8 buffers a slot) and compares every element bit for bit with the
//! rank-order fold (f32 sum and f64 avg of mixed-magnitude floats, where reversing the order inside
//! one fold group fails it; bf16 sum and f16 avg against the f32 sum rounded once, which a 16-bit
//! accumulator fails in 23,563 of 40,001 elements), plus i32 max, f32 prod, u64 min, i8 sum and bf16
//! max through the load generator; and a staged job of 12 whose rank 9 (not yet posted) vanishes
//! without a word: the others are refused naming rank 9 within 5 s, the job is freed, a job running
//! meanwhile is untouched and the next staged job is exact. A staged job of 12 also goes through a
//! drain (`tests/suites/drain.rs`) and a SIGKILL failover (`tests/suites/failover.rs`), whose redo
//! job is staged too: a redo job must keep the job's piece (a rank refuses smaller ones), and with a
//! slab too small for a piece per rank the redo was refused before staging, so the failover failed.
//!
//! **What a server holds.** The default `max_ranks` of 1024 also sizes each lcore's operation-context
//! table (`max_jobs x max_window x max_ranks x 2` entries), allocated zeroed so that only the
//! contexts jobs use become resident (`engine/tests/fabric.rs` checks it). shm's 256 peers and
//! tcp;ofi_rxm's 2048 receives per endpoint bound jobs too ("Provider facts"). Memory, threads and
//! join times from 8 to 1024 ranks, and join storms:
//! [measurements](docs/measurements.md#threads-memory-joins).
use super::alloc::RangeAlloc;
use crate::dataplane::shard::slot_strides;
use crate::host::units::format_size;
use crate::wire::JobSpec;
use core::fmt;

/// A job takes at most 1/JOB_SHARE of an lcore's slab.
pub const JOB_SHARE: usize = 4;
/// The smallest piece the server cuts a job's pieces to. Below it a piece's
/// fixed costs (a message, a completion, a repost per rank) outweigh its
/// bytes; it is also the floor the client spreads small all-reduces to
/// (`client::MIN_SPREAD_PIECE`). A client may ask for smaller pieces itself.
pub const MIN_PIECE: usize = 4096;
/// Pieces start on cache lines; 64 is a multiple of every element size.
pub const PIECE_ALIGN: usize = 64;

/// What a job gets on each lcore it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Elements per piece: the Hello's `chunk_elems`, or fewer.
    pub chunk_elems: u32,
    /// Distance between pieces: the piece rounded up to a cache line.
    pub stride: usize,
    /// Receive buffers per slot when staged (0: one per rank; see
    /// [`fit`] and the shard's staged receives).
    pub stage: u32,
    /// The region: window x nranks x stride, or staged window x (stage +
    /// the accumulator's strides) x stride ([`slot_strides`]).
    pub len: usize,
}

/// A job that does not fit even with the smallest piece, and what would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoFit {
    pub window: u32,
    pub nranks: u32,
    /// The smallest piece tried: [`MIN_PIECE`], or the one asked for when smaller.
    pub piece: usize,
    /// The most a job may take on the tightest lcore, and which lcore that is.
    pub budget: usize,
    pub lcore: usize,
    /// The most ranks that fit at this window, and the largest window at
    /// this many ranks (0: none).
    pub fits_ranks: u64,
    pub fits_window: u64,
}

impl fmt::Display for NoFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Short enough for a Reject's message (215 bytes).
        let need = self.window as u64 * self.nranks as u64 * self.piece as u64;
        write!(
            f,
            "window {} x {} ranks x {} piece = {} per lcore, above the {} a job may take on lcore {}: ",
            self.window,
            self.nranks,
            format_size(self.piece as u64),
            format_size(need),
            format_size(self.budget as u64),
            self.lcore
        )?;
        match (self.fits_ranks, self.fits_window) {
            (0, _) => write!(f, "not even 1 rank fits at window {}", self.window),
            (r, 0) => write!(f, "at most {r} ranks fit at window {}", self.window),
            (r, w) => write!(f, "at most {r} ranks fit at window {}, or window {w} at {} ranks", self.window, self.nranks),
        }
    }
}

/// The most one job may take from an lcore's slab of `total` bytes whose
/// largest free range is `largest_free` (whole units of `align`, the
/// allocator's granularity).
pub fn budget(total: usize, largest_free: usize, align: usize) -> usize {
    (total / JOB_SHARE).min(largest_free) / align * align
}

/// Whether a job of `spec` may be staged with `stage` receive buffers per
/// slot: only when that is fewer buffers than ranks. Every type may: the
/// fold ([`crate::reduce::Kernels::fold`]) gives the one pass's bytes, 16-bit
/// floats by keeping `f32` partials (two strides: [`slot_strides`]).
pub fn can_stage(spec: &JobSpec, stage: u32) -> bool {
    // A relay job's pieces are sent on from their own receive buffers,
    // which staging shares between ranks (and two ranks gain nothing).
    stage > 0 && stage < spec.nranks && !spec.relay
}

/// The piece and region of `spec` on lcores that each give a job at most
/// `budget` bytes (`lcore`: the one that gives least, named in a refusal).
///
/// A job whose piece per rank fits gets it. One that does not, and that may
/// be staged (`stage` receive buffers per slot, [`can_stage`]), keeps the
/// piece it asked for in a staged region of window x [`slot_strides`] pieces, if
/// that fits: many ranks then cost receive turns, not smaller pieces (whose
/// per-message costs are what slowed a thousand ranks). Otherwise the piece
/// shrinks until window x nranks pieces fit.
pub fn fit(spec: &JobSpec, budget: usize, lcore: usize, stage: u32) -> Result<Grant, NoFit> {
    let slots = spec.window as usize * spec.nranks as usize;
    let asked = spec.piece_bytes();
    let stride = asked.next_multiple_of(PIECE_ALIGN);
    if slots * stride <= budget {
        return Ok(Grant { chunk_elems: spec.chunk_elems, stride, stage: 0, len: slots * stride });
    }
    if can_stage(spec, stage) {
        let len = spec.window as usize * slot_strides(spec.dtype, spec.nranks, stage) * stride;
        if len <= budget {
            return Ok(Grant { chunk_elems: spec.chunk_elems, stride, stage, len });
        }
    }
    // A multiple of 64 below the asked stride: smaller than the piece asked,
    // and whole elements of any type.
    let piece = budget / slots / PIECE_ALIGN * PIECE_ALIGN;
    if piece >= MIN_PIECE {
        return Ok(Grant { chunk_elems: (piece / spec.dtype.size()) as u32, stride: piece, stage: 0, len: slots * piece });
    }
    let least = stride.min(MIN_PIECE);
    Err(NoFit {
        window: spec.window,
        nranks: spec.nranks,
        piece: least,
        budget,
        lcore,
        fits_ranks: (budget / (spec.window as usize * least)) as u64,
        fits_window: (budget / (spec.nranks as usize * least)) as u64,
    })
}

/// [`fit`] against the tightest of the job's lcores (`allocs[..shards]`).
pub fn grant(spec: &JobSpec, allocs: &[RangeAlloc], align: usize, stage: u32) -> Result<Grant, NoFit> {
    let (lcore, least) = allocs
        .iter()
        .take(spec.shards as usize)
        .map(|a| budget(a.total(), a.largest_free(), align))
        .enumerate()
        .min_by_key(|&(_, b)| b)
        .unwrap_or((0, 0));
    fit(spec, least, lcore, stage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::{DataType, ReduceOp};

    fn spec(nranks: u32, window: u32, piece: usize, dtype: DataType) -> JobSpec {
        JobSpec::new(1, nranks, dtype, ReduceOp::Sum, (piece / dtype.size()) as u32, window, 1)
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn a_job_that_fits_gets_what_it_asked() {
        // The old default limit: 64 ranks x window 4 x 256 KiB from a 256 MiB slab.
        let s = spec(64, 4, 256 << 10, DataType::Float32);
        let g = fit(&s, budget(256 * MIB, 256 * MIB, 4096), 0, 0).unwrap();
        assert_eq!(g, Grant { chunk_elems: 64 << 10, stride: 256 << 10, stage: 0, len: 64 * MIB });
        // A piece that is not whole cache lines keeps its elements, padded.
        let s = JobSpec { chunk_elems: 1000, ..s };
        assert_eq!(fit(&s, 64 * MIB, 0, 0).unwrap(), Grant { chunk_elems: 1000, stride: 4032, stage: 0, len: 256 * 4032 });
    }

    #[test]
    fn many_ranks_get_smaller_pieces_that_fit() {
        // 1024 ranks x window 4 x 256 KiB = 1 GiB; a quarter of 256 MiB is 64 MiB: 16 KiB pieces.
        let s = spec(1024, 4, 256 << 10, DataType::Float32);
        let g = fit(&s, budget(256 * MIB, 256 * MIB, 4096), 0, 0).unwrap();
        assert_eq!(g, Grant { chunk_elems: 4096, stride: 16 << 10, stage: 0, len: 64 * MIB });
        // Odd budgets: whole cache lines, whole elements, within the budget, below the ask.
        for (n, w, b, t) in [(1000u32, 3u32, 50 * MIB + 12345, DataType::Float64), (777, 5, 99 * MIB, DataType::Bfloat16)] {
            let s = spec(n, w, 1 << 20, t);
            let g = fit(&s, b, 0, 0).unwrap();
            let piece = g.chunk_elems as usize * t.size();
            assert!(piece.is_multiple_of(64) && piece >= MIN_PIECE && piece < s.piece_bytes(), "{g:?}");
            assert!(g.len <= b && g.stride == piece && g.len == n as usize * w as usize * piece, "{g:?}");
            // The next cache line more would not fit.
            assert!(n as usize * w as usize * (piece + 64) > b, "{g:?}");
        }
    }

    #[test]
    fn many_ranks_keep_their_piece_when_staged() {
        // 1024 ranks x window 2 x 256 KiB = 512 MiB, over a 64 MiB budget:
        // staged with 64 buffers a slot, 2 x 65 x 256 KiB = 32.5 MiB.
        let s = spec(1024, 2, 256 << 10, DataType::Float32);
        let b = budget(256 * MIB, 256 * MIB, 4096);
        assert_eq!(fit(&s, b, 0, 64).unwrap(), Grant { chunk_elems: 64 << 10, stride: 256 << 10, stage: 64, len: 2 * 65 * (256 << 10) });
        // Without staging, the piece shrinks as before.
        assert_eq!(fit(&s, b, 0, 0).unwrap().stage, 0);
        // A job whose pieces fit is never staged.
        assert_eq!(fit(&spec(8, 2, 256 << 10, DataType::Float32), b, 0, 64).unwrap().stage, 0);
        // 16-bit floats are staged with an f32 accumulator: two strides.
        let g = fit(&spec(1024, 2, 256 << 10, DataType::Bfloat16), b, 0, 64).unwrap();
        assert_eq!((g.stage, g.stride, g.len), (64, 256 << 10, 2 * 66 * (256 << 10)));
        let g = fit(&spec(1024, 2, 256 << 10, DataType::Int8), b, 0, 64).unwrap();
        assert_eq!((g.stage, g.len), (64, 2 * 65 * (256 << 10)));
        // Jobs with no more ranks than buffers are not staged.
        assert!(!can_stage(&spec(64, 2, 4096, DataType::Float64), 64) && can_stage(&spec(65, 2, 4096, DataType::Int32), 64));
        // A staged region that does not fit either: the piece shrinks.
        let g = fit(&s, 16 * MIB, 0, 64).unwrap();
        assert_eq!((g.stage, g.stride), (0, 8 << 10));
    }

    #[test]
    fn a_job_that_cannot_fit_says_what_would() {
        // 1024 ranks x window 16 x 4 KiB = 64 MiB against 16 MiB.
        let s = spec(1024, 16, 256 << 10, DataType::Float32);
        let e = fit(&s, 16 * MIB, 3, 0).unwrap_err();
        assert_eq!((e.piece, e.fits_ranks, e.fits_window, e.lcore), (MIN_PIECE, 256, 4, 3));
        let text = e.to_string();
        assert_eq!(
            text,
            "window 16 x 1024 ranks x 4 KiB piece = 64 MiB per lcore, above the 16 MiB a job may take on lcore 3: \
             at most 256 ranks fit at window 16, or window 4 at 1024 ranks"
        );
        assert!(text.len() < 215);
        // Asking for pieces below the floor: the floor is the ask.
        let s = spec(8, 16, 1024, DataType::Float32);
        let e = fit(&s, 64 << 10, 0, 0).unwrap_err();
        assert_eq!((e.piece, e.fits_ranks, e.fits_window), (1024, 4, 8));
        // Nothing fits at all.
        let e = fit(&spec(4, 4, 4096, DataType::Float32), 0, 0, 0).unwrap_err();
        assert!(e.to_string().ends_with("not even 1 rank fits at window 4"), "{e}");
    }

    #[test]
    fn the_tightest_lcore_sets_the_budget() {
        let mut a = vec![RangeAlloc::new(64 * MIB, 4096), RangeAlloc::new(64 * MIB, 4096)];
        a[1].alloc(60 * MIB).unwrap();
        let s = JobSpec { shards: 2, ..spec(64, 4, 64 << 10, DataType::Float32) };
        // lcore 0: a quarter, 16 MiB; lcore 1: 4 MiB free.
        assert_eq!(grant(&s, &a, 4096, 0).unwrap().stride, 16 << 10);
        let s = JobSpec { nranks: 1024, ..s };
        assert_eq!(grant(&s, &a, 4096, 0).unwrap_err().lcore, 1);
        // A job on lcore 0 only does not see lcore 1.
        let s = JobSpec { shards: 1, nranks: 64, ..s };
        assert_eq!(grant(&s, &a, 4096, 0).unwrap().stride, 64 << 10);
    }
}
