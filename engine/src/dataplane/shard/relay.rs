//! Relay: a two-rank job's small pieces are not reduced here. Each goes on
//! to the other rank as it comes, which reduces the two itself (the rule is
//! `JobSpec::relays`, the bound `RELAY_MAX` in `wire/small.rs`); a slot's
//! round ends when both pieces went on. A piece goes on to a rank only once
//! that rank was heard from (see `Job::heard`).
use super::ShardWorker;

impl ShardWorker {
    /// Rank `rank`'s piece of relay slot `slot` is in (checked and
    /// counted): it goes on to the other rank now, or with the second piece
    /// if that rank was never heard from.
    // Always inlined: a branch of `on_completion` (one function, inlined
    // into `poll_once`, before the modes had files of their own).
    #[inline(always)]
    pub(super) fn relay_piece(&mut self, ji: usize, slot: usize, rank: usize) {
        let job = self.jobs[ji].as_mut().unwrap();
        let n = job.on.spec.nranks;
        let s = &mut job.slots[slot];
        // Relay (two ranks, a small piece): it goes on to the other rank
        // now, which reduces the two itself. The round ends when both
        // pieces went on.
        let base = ji as u32 * self.per_job;
        let to = 1 - rank as u32;
        job.heard |= 1 << rank;
        let mut sends = [None, None];
        if s.arrived == 1 {
            s.sends_left = 2;
            s.sending_since = s.first;
            // Deferred to the other piece's arrival if `to` was never heard from.
            s.deferred = job.heard & (1 << to) == 0;
            if !s.deferred {
                sends[0] = Some(to);
            }
        } else {
            if let Some(first) = s.first.take() {
                self.metrics.job(self.lcore, ji).record_round(first.elapsed().as_nanos() as u64);
            }
            sends = [Some(to), s.deferred.then_some(rank as u32)];
            s.deferred = false;
        }
        for dest in sends.into_iter().flatten() {
            if let Err(e) = self.post(base + ((slot as u32 * n + dest) << 1 | 1)) {
                self.fail(ji, format!("relaying a piece: {e}"));
                return;
            }
        }
    }
}
