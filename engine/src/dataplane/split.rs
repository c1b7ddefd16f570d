//! Split rounds: one small all-reduce served by several lcores at once.
//!
//! A small all-reduce (a few KiB) normally goes whole to one lcore, which
//! then copies every rank's piece in and the result out to every rank, one
//! after another: with shm each rank costs the lcore about a microsecond
//! (measured: 4.3, 5.4, 6.5, 8.6 and 11 us for 2, 3, 4, 6 and 8 ranks on
//! one lcore, libfabric 1.22), while the ring's steps run on every rank's
//! core in parallel. A split job (`Hello::SPLIT`, see `wire`) cuts its ranks
//! into contiguous groups, one per lcore ([`crate::wire::split_ranks`]):
//! each lcore takes in only its group's pieces, and sends the result only
//! to its group.
//!
//! The lcores of a split job meet in a [`SplitShared`], which the control
//! plane creates with the job; this is the one place where lcores share a
//! job's state, and they do it without locks:
//!
//! - When an lcore has all its group's pieces of split slot `j`, it folds
//!   them in rank order into its first rank's piece (the group's *partial*;
//!   an average's is a sum), then adds one to `complete[j]`
//!   (acquire-release). The lcore that brings it to the number of groups is
//!   the *combiner*: it has seen every other group complete, so their
//!   partials (written by their own lcores before their increments) are
//!   visible to it. It resets the count, combines the partials in group
//!   order (`Kernels::reduce_partials`, dividing an average by the job's
//!   ranks) into the result buffer of its own area, then publishes the
//!   round in `ready[j]` (release) and sends to its group. So the combiner
//!   reads one partial per other lcore, lines another core just wrote,
//!   instead of every other rank's piece: on the device (4 ranks over 2
//!   lcores, 4 KiB, libfabric 1.22) 2-12% faster than one fold of every
//!   piece, in each of five alternated rounds (1.17: -9% to +5%). The
//!   result is associated by group, `(r0 + r1) + (r2 + r3)`: the same bits
//!   on every rank whatever the arrival order, not those of a one-lcore
//!   round. 16-bit floats, which a fold
//!   combines in `f32` and rounds once, and more than
//!   `wire::SPLIT_MAX_FOLDED_GROUPS` groups skip the partials: the combiner
//!   folds every rank's piece in rank order (`wire::split_folds_groups`).
//! - The other lcores wait for `ready[j]` to name their round (checked in
//!   their poll loop, acquire), then send the combiner's result to their own
//!   groups: by inject straight from the combiner's buffer (inject copies
//!   before it returns), else from a copy in their own area (a send reads
//!   its buffer until it completes, and must use memory registered with
//!   its own endpoint).
//!
//! Why buffers are never read while rewritten: an lcore reposts its
//! group's receives only after it has seen `ready` (so after the combiner
//! read its pieces); and the next round of slot `j` cannot complete until
//! every rank has had this round's result (a rank's window holds the slot
//! until then), so no result buffer is rewritten while a send of it may
//! still read it, and `complete[j]` is reset before any lcore can count the
//! next round.
//!
//! Areas: each lcore's split area (in its own slab, after the job's region)
//! holds, per split slot, its group's pieces and a result buffer, each
//! [`SPLIT_MAX`] bytes. Lcores publish their area's address when they take
//! the job, before it starts. A job that fails on one lcore is ended on all
//! by the control plane; its regions are freed only once every lcore
//! ended it, so a combiner never reads freed memory.
//!
//! The orderings above are checked by loom (engine/loom: `make test-loom`),
//! which compiles this file against its own atomics (`--cfg loom`) and runs
//! every interleaving, and every weaker-than-sequential outcome, of lcores
//! meeting here.
use crate::wire::{split_ranks, SPLIT_MAX};
use core::ops::Range;
#[cfg(not(loom))]
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
use loom::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// The state the lcores of one split job share (see the module doc).
pub struct SplitShared {
    nranks: u32,
    groups: u32,
    window: u32,
    /// Per split slot: the groups complete in the current round.
    complete: Box<[AtomicU32]>,
    /// Per split slot: the round whose result is ready and which position
    /// holds it, as [`SplitShared::ready_word`]; 0: none yet.
    ready: Box<[AtomicU64]>,
    /// Each position's split area (null until its lcore took the job).
    areas: Box<[AtomicPtr<u8>]>,
}

impl SplitShared {
    pub fn new(nranks: u32, groups: u32, window: u32) -> SplitShared {
        SplitShared {
            nranks,
            groups,
            window,
            complete: (0..window).map(|_| AtomicU32::new(0)).collect(),
            ready: (0..window).map(|_| AtomicU64::new(0)).collect(),
            areas: (0..groups).map(|_| AtomicPtr::new(core::ptr::null_mut())).collect(),
        }
    }

    pub fn groups(&self) -> u32 {
        self.groups
    }

    /// The ranks position `p` serves.
    pub fn ranks(&self, p: u32) -> Range<u32> {
        split_ranks(p, self.nranks, self.groups)
    }

    /// Bytes of position `p`'s area: per split slot, its group's pieces and
    /// a result buffer.
    pub fn area_len(&self, p: u32) -> usize {
        self.window as usize * (self.ranks(p).len() + 1) * SPLIT_MAX
    }

    /// Offset in position `p`'s area of split slot `j`'s piece of `rank`
    /// (a rank of `p`'s group), or of its result buffer (`rank` None).
    pub fn offset(&self, p: u32, j: usize, rank: Option<u32>) -> usize {
        let r = self.ranks(p);
        let k = rank.map_or(r.len(), |rank| (rank - r.start) as usize);
        (j * (r.len() + 1) + k) * SPLIT_MAX
    }

    /// Position `p`'s lcore took the job: its area is at `area`.
    pub fn publish_area(&self, p: u32, area: *mut u8) {
        self.areas[p as usize].store(area, Ordering::Release);
    }

    /// Position `p`'s area, or None if its lcore has not taken the job.
    pub fn area(&self, p: u32) -> Option<*mut u8> {
        Some(self.areas[p as usize].load(Ordering::Acquire)).filter(|a| !a.is_null())
    }

    /// This position's group is complete for split slot `j`'s current
    /// round: true if it is the last, and so combines.
    pub fn group_complete(&self, j: usize) -> bool {
        let last = self.complete[j].fetch_add(1, Ordering::AcqRel) + 1 == self.groups;
        if last {
            // No lcore counts the slot's next round before it has seen this
            // round's `ready`, published after this store.
            self.complete[j].store(0, Ordering::Relaxed);
        }
        last
    }

    fn ready_word(seq: u32, p: u32) -> u64 {
        1 << 48 | (seq as u64) << 16 | p as u64
    }

    /// The combiner at position `p` has the result of split slot `j`'s
    /// round `seq` in its area.
    pub fn publish_result(&self, j: usize, seq: u32, p: u32) {
        self.ready[j].store(Self::ready_word(seq, p), Ordering::Release);
    }

    /// The position holding the result of split slot `j`'s round `seq`, if
    /// it is ready.
    pub fn result_of(&self, j: usize, seq: u32) -> Option<u32> {
        let w = self.ready[j].load(Ordering::Acquire);
        (w >> 16 == Self::ready_word(seq, 0) >> 16).then_some((w & 0xffff) as u32)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::SplitShared;
    use crate::wire::SPLIT_MAX;

    #[test]
    fn areas_hold_each_groups_pieces_and_a_result_per_slot() {
        // 5 ranks over 2 lcores: ranks 0-2 and 3-4; window 2.
        let s = SplitShared::new(5, 2, 2);
        assert_eq!((s.ranks(0), s.ranks(1)), (0..3, 3..5));
        assert_eq!((s.area_len(0), s.area_len(1)), (2 * 4 * SPLIT_MAX, 2 * 3 * SPLIT_MAX));
        assert_eq!(s.offset(0, 0, Some(0)), 0);
        assert_eq!(s.offset(0, 0, None), 3 * SPLIT_MAX);
        assert_eq!(s.offset(0, 1, Some(1)), 5 * SPLIT_MAX);
        assert_eq!(s.offset(1, 1, Some(4)), 4 * SPLIT_MAX);
        assert_eq!(s.offset(1, 1, None), 5 * SPLIT_MAX);
        assert!(s.offset(1, 1, None) + SPLIT_MAX <= s.area_len(1));
    }

    #[test]
    fn the_last_group_in_combines_and_the_count_starts_over() {
        let s = SplitShared::new(8, 3, 2);
        for round in 0..3u32 {
            assert!(!s.group_complete(1) && !s.group_complete(1));
            assert!(s.group_complete(1), "round {round}");
            assert_eq!(s.result_of(1, 1 + 2 * round), None);
            s.publish_result(1, 1 + 2 * round, 2);
            assert_eq!(s.result_of(1, 1 + 2 * round), Some(2));
            // Another round's sequence is not this one.
            assert_eq!(s.result_of(1, 3 + 2 * round), None);
        }
        // Slots count apart.
        assert!(!s.group_complete(0));
        assert_eq!(s.result_of(0, 0), None);
    }

    #[test]
    fn areas_are_published_per_position() {
        let s = SplitShared::new(4, 2, 1);
        let mut a = [0u8; 64];
        assert!(s.area(1).is_none());
        s.publish_area(1, a.as_mut_ptr());
        assert_eq!(s.area(1), Some(a.as_mut_ptr()));
        assert!(s.area(0).is_none());
    }
}
