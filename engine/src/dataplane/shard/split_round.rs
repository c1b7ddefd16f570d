//! A split job's small pieces (see `wire` and `dataplane::split`): each
//! lcore of the group folds its ranks' pieces, and the combining lcore adds
//! the groups' partials in group order and sends the result to every rank.
use super::{ShardWorker, State};
use crate::dataplane::lcore::bump;
use crate::dataplane::shard::error::RoundError;
use crate::wire::{self, SPLIT_MAX_RANKS};
use std::time::Instant;

impl ShardWorker {
    /// A piece of split slot `slot` is in (checked and counted): this
    /// lcore's group only; once the group is in, its partial is folded, and
    /// the last group in combines (see `dataplane::split`) and sends the
    /// result to its group; the others wait for it (`check_split_waits`).
    // Always inlined: a branch of `on_completion` (one function, inlined
    // into `poll_once`, before the modes had files of their own).
    #[inline(always)]
    pub(super) fn split_piece(&mut self, ji: usize, slot: usize, elems: usize) {
        let job = self.jobs[ji].as_ref().unwrap();
        // A split slot: this lcore's group only; the last group in
        // combines (see `dataplane::split`).
        if job.slots[slot].arrived < job.expected(slot) {
            return;
        }
        let sp = job.split.as_ref().unwrap();
        let t0 = Instant::now();
        if wire::split_folds_groups(sp.shared.groups(), job.on.spec.dtype) {
            // The group's partial, before counting: the combiner reads
            // it once the count says this group is in.
            if let Err(e) = self.fold_group(ji, slot, elems) {
                self.fail(ji, e.to_string());
                return;
            }
        }
        let job = self.jobs[ji].as_mut().unwrap();
        let sp = job.split.as_ref().unwrap();
        if !sp.shared.group_complete(slot - job.on.spec.window as usize) {
            job.slots[slot].combine_wait = true;
            self.split_waits += 1;
            bump(&self.metrics.job(self.lcore, ji).reduce_ns, t0.elapsed().as_nanos() as u64);
            return;
        }
        if let Err(e) = self.combine(ji, slot, elems) {
            self.fail(ji, e.to_string());
            return;
        }
        bump(&self.metrics.job(self.lcore, ji).reduce_ns, t0.elapsed().as_nanos() as u64);
        self.send_results(ji, slot, Instant::now());
    }

    /// Split slot `slot`'s group is in: folds its pieces in rank order (an
    /// average: summed) into its first rank's piece, the group's partial
    /// (see `dataplane::split`).
    pub(super) fn fold_group(&mut self, ji: usize, slot: usize, elems: usize) -> Result<(), RoundError> {
        let job = self.jobs[ji].as_ref().unwrap();
        let sp = job.split.as_ref().unwrap();
        let j = slot - job.on.spec.window as usize;
        let mut inputs = [core::ptr::null::<u8>(); SPLIT_MAX_RANKS as usize];
        let group = sp.ranks.clone();
        for rank in group.clone() {
            // SAFETY: the offset is inside this lcore's area (add_job checked).
            inputs[(rank - group.start) as usize] = unsafe { sp.area.add(sp.shared.offset(sp.position, j, Some(rank))) };
        }
        let op = match job.on.spec.op {
            crate::reduce::ReduceOp::Avg => crate::reduce::ReduceOp::Sum,
            op => op,
        };
        // SAFETY: every input is a completed receive of `elems` elements of
        // this lcore's group, and out is exactly inputs[0], which reduce_raw
        // allows; no other lcore reads them before this group is counted.
        unsafe { self.kernels.reduce_raw(job.on.spec.dtype, op, inputs[0] as *mut u8, &inputs[..group.len()], elems) }
            .map_err(RoundError::Reduce)
    }

    /// Split slot `slot`'s groups are all in and this lcore is the last:
    /// combines the groups' partials in group order (or, see
    /// `wire::split_folds_groups`, every rank's piece in rank order) into
    /// its own area's result buffer and publishes the round (see
    /// `dataplane::split`).
    pub(super) fn combine(&mut self, ji: usize, slot: usize, elems: usize) -> Result<(), RoundError> {
        let job = self.jobs[ji].as_mut().unwrap();
        let sp = job.split.as_ref().unwrap();
        let (n, j) = (job.on.spec.nranks as usize, slot - job.on.spec.window as usize);
        let (dtype, op) = (job.on.spec.dtype, job.on.spec.op);
        let folded = wire::split_folds_groups(sp.shared.groups(), dtype);
        // The inputs: each group's partial (its first rank's piece), or every rank's piece.
        let mut inputs = [core::ptr::null::<u8>(); SPLIT_MAX_RANKS as usize];
        let mut count = 0;
        for p in 0..sp.shared.groups() {
            let area = sp.shared.area(p).ok_or(RoundError::NoSplitArea(p))?;
            let ranks = sp.shared.ranks(p);
            for rank in if folded { ranks.start..ranks.start + 1 } else { ranks } {
                // SAFETY: the offset is inside position p's area, which is
                // SplitShared::area_len bytes of p's slab (add_job checked).
                inputs[count] = unsafe { area.add(sp.shared.offset(p, j, Some(rank))) };
                count += 1;
            }
        }
        // SAFETY: as above, for this lcore's result buffer of slot j.
        let out = unsafe { sp.area.add(sp.shared.offset(sp.position, j, None)) };
        // SAFETY: every input holds `elems` elements: a completed receive, or
        // a partial folded from them, this lcore's or another group's,
        // whose lcore wrote it before counting its group complete (release)
        // and this lcore's count (acquire), and reposts nothing before the
        // result is published below. `out` is a result buffer, which
        // overlaps no piece.
        let r = unsafe {
            match folded {
                true => self.kernels.reduce_partials(dtype, op, out, &inputs[..count], elems, n),
                false => self.kernels.reduce_raw(dtype, op, out, &inputs[..count], elems),
            }
        };
        r?;
        sp.shared.publish_result(j, job.slots[slot].seq, sp.position);
        job.slots[slot].from = sp.position;
        Ok(())
    }

    /// Split slots waiting for their combiner: those whose result is
    /// published now go out to this lcore's group. Returns how many did.
    pub(super) fn check_split_waits(&mut self) -> usize {
        let (mut waits, mut released) = (0, 0);
        for ji in 0..self.jobs.len() {
            let Some(window) = self.jobs[ji].as_ref().filter(|j| j.split.is_some()).map(|j| j.on.spec.window as usize) else { continue };
            for slot in window..2 * window {
                let Some(job) = self.jobs[ji].as_mut().filter(|j| j.state == State::Running) else { break };
                let s = job.slots[slot];
                if !s.combine_wait {
                    continue;
                }
                let sp = job.split.as_ref().unwrap();
                let Some(from) = sp.shared.result_of(slot - window, s.seq) else {
                    waits += 1;
                    continue;
                };
                let position = sp.position;
                job.slots[slot].combine_wait = false;
                job.slots[slot].from = from;
                if s.len as usize > self.ep.inject_size() && from != position {
                    // A send reads its buffer until it completes, from
                    // memory registered with this endpoint: send a copy.
                    let src = job.result_ptr(slot);
                    job.slots[slot].from = position;
                    // SAFETY: both are result buffers of SPLIT_MAX >= len
                    // bytes in different lcores' areas; the combiner's is
                    // not rewritten before every rank has this round's
                    // result (see `dataplane::split`).
                    unsafe { core::ptr::copy_nonoverlapping(src, job.result_ptr(slot), s.len as usize) };
                }
                self.send_results(ji, slot, Instant::now());
                released += 1;
            }
        }
        self.split_waits = waits;
        released
    }
}
