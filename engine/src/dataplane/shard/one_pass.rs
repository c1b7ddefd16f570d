//! One-pass, the plain mode: a slot holds a piece per rank, and once the
//! last is in the pieces are reduced in rank order into piece 0 (so the
//! result is the same bit for bit whatever the arrival order), which goes
//! back to every rank.
use super::ShardWorker;
use crate::dataplane::lcore::bump;
use crate::dataplane::shard::error::RoundError;
use crate::reduce::MAX_INPUTS;
use std::time::Instant;

impl ShardWorker {
    /// A piece of one-pass slot `slot` is in (checked and counted): after
    /// the last rank's, the slot is reduced and its result sent.
    // Always inlined: a branch of `on_completion` (one function, inlined
    // into `poll_once`, before the modes had files of their own).
    #[inline(always)]
    pub(super) fn one_pass_piece(&mut self, ji: usize, slot: usize, elems: usize) {
        let job = self.jobs[ji].as_ref().unwrap();
        let n = job.on.spec.nranks;
        if job.slots[slot].arrived < n {
            return;
        }
        // Every piece is here: reduce in rank order into piece 0, send it back.
        let mut inputs = [core::ptr::null::<u8>(); MAX_INPUTS];
        for (r, p) in inputs.iter_mut().enumerate().take(n as usize) {
            *p = job.piece_ptr(slot, r);
        }
        let out = inputs[0] as *mut u8;
        let t0 = Instant::now();
        // SAFETY: every input is a completed receive of `elems` elements in
        // this job's region; out == inputs[0] exactly, which reduce_raw allows.
        if let Err(e) = unsafe { self.kernels.reduce_raw(job.on.spec.dtype, job.on.spec.op, out, &inputs[..n as usize], elems) } {
            self.fail(ji, RoundError::Reduce(e).to_string());
            return;
        }
        let now = Instant::now();
        bump(&self.metrics.job(self.lcore, ji).reduce_ns, now.duration_since(t0).as_nanos() as u64);
        self.send_results(ji, slot, now);
    }
}
