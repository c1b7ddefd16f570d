//! The staged form: a job whose pieces cannot all be held at once folds
//! them into an accumulator as they come (`Kernels::fold`), a few at a time
//! (see "Staged receives" in the `shard` module doc).
use super::ShardWorker;
use crate::dataplane::lcore::bump;
use crate::dataplane::shard::error::RoundError;
use std::time::Instant;

impl ShardWorker {
    /// A piece of staged slot `slot` is in (checked and counted): the run
    /// of arrived ranks from the slot's `next` is folded, and after the
    /// last rank the result is sent.
    // Always inlined: a branch of `on_completion` (one function, inlined
    // into `poll_once`, before the modes had files of their own).
    #[inline(always)]
    pub(super) fn staged_piece(&mut self, ji: usize, slot: usize, elems: usize) {
        let t0 = Instant::now();
        if let Err(e) = self.fold(ji, slot, elems) {
            self.fail(ji, e.to_string());
            return;
        }
        let job = self.jobs[ji].as_ref().unwrap();
        if job.slots[slot].next < job.on.spec.nranks {
            bump(&self.metrics.job(self.lcore, ji).reduce_ns, t0.elapsed().as_nanos() as u64);
            return;
        }
        let now = Instant::now();
        bump(&self.metrics.job(self.lcore, ji).reduce_ns, now.duration_since(t0).as_nanos() as u64);
        self.send_results(ji, slot, now);
    }

    /// Staged: folds the run of arrived ranks from the slot's `next` into
    /// its accumulator, in rank order, reposting each folded rank's buffer
    /// for rank + stage; after the last rank the fold is finished (an
    /// average divided, 16-bit partials rounded) into the accumulator.
    /// It runs as soon as rank `next` is in, even for one piece: waiting
    /// for groups of 4 (fewer passes over the accumulator) was 15-25%
    /// slower on the device at 1024 ranks, since it also holds back the
    /// buffers' reposts.
    pub(super) fn fold(&mut self, ji: usize, slot: usize, elems: usize) -> Result<(), RoundError> {
        /// Ranks per kernel call: a bound for the stack array, not for the
        /// result (every grouping gives the same bytes).
        const GROUP: usize = 8;
        let job = self.jobs[ji].as_ref().unwrap();
        let (n, stage) = (job.on.spec.nranks as usize, job.on.stage as usize);
        let (dtype, op) = (job.on.spec.dtype, job.on.spec.op);
        let acc = job.result_ptr(slot);
        let base = ji as u32 * self.per_job;
        loop {
            let job = self.jobs[ji].as_ref().unwrap();
            let next = job.slots[slot].next as usize;
            let mut inputs = [core::ptr::null::<u8>(); GROUP];
            let mut r = next;
            while r - next < GROUP && r < n && job.has_arrived(slot, r) {
                inputs[r - next] = job.piece_ptr(slot, r);
                r += 1;
            }
            if r == next {
                return Ok(());
            }
            // SAFETY: every input is a completed receive of `elems` elements;
            // the accumulator (ranks 0..next folded) has its own strides of
            // the region, room for `elems` accumulator elements, and overlaps
            // no piece.
            unsafe { self.kernels.fold(dtype, op, acc, next > 0, &inputs[..r - next], elems) }?;
            self.jobs[ji].as_mut().unwrap().slots[slot].next = r as u32;
            // The folded ranks' buffers are free: each takes the receive of
            // the rank `stage` further on.
            for folded in next..r {
                if folded + stage < n {
                    self.post(base + (((slot * n + folded + stage) as u32) << 1)).map_err(RoundError::Refill)?;
                }
            }
            if r == n {
                // SAFETY: as above; nothing else refers to the accumulator now.
                unsafe { self.kernels.finish_fold(dtype, op, acc, elems, n) }?;
                return Ok(());
            }
        }
    }
}
