//! Posting, on the per-chunk path: a slot's receives at the start of its
//! round, its results to every rank once reduced (or a relayed piece), and
//! the round's end once every rank took its result, which reposts the
//! slot's receives. A refused post is a [`PostError`] (no allocation); it
//! becomes the job's failure reason only when the job fails. Nothing here
//! allocates, locks, makes a system call of its own or logs per chunk.
use super::{ShardWorker, State};
use crate::dataplane::fabric::PostError;
use crate::dataplane::lcore::bump;
use crate::wire::{JobTag, Tag};
use std::time::Instant;

impl ShardWorker {
    /// Posts the operation a context id stands for (receive into its piece,
    /// or send of its slot's result). On EAGAIN it is queued for retry.
    pub(super) fn post(&mut self, context: u32) -> Result<(), PostError> {
        let (ji, local) = ((context / self.per_job) as usize, context % self.per_job);
        let Some(job) = self.jobs[ji].as_ref() else { return Ok(()) };
        if job.state != State::Running {
            return Ok(());
        }
        let n = job.on.spec.nranks;
        let (piece, is_send) = (local >> 1, local & 1 == 1);
        let (slot, rank) = ((piece / n) as usize, (piece % n) as usize);
        let s = job.slots[slot];
        let keyed = JobTag { job: job.on.tag, key: job.on.key };
        if is_send && s.len as usize <= self.ep.inject_size() {
            let buf = job.send_ptr(slot, rank, s.len);
            let tag = keyed.tag(slot as u16, s.seq);
            // SAFETY: the buffer holds the reduced result (or the relayed
            // piece, received whole); inject copies it before returning.
            return match unsafe { self.ep.inject(buf, s.len as usize, job.peers[rank], tag.0) } {
                Ok(()) => {
                    self.injected_bytes += s.len as u64;
                    self.result_taken(ji, slot, rank);
                    Ok(())
                }
                Err(PostError::Again) => {
                    self.retry.push(context);
                    Ok(())
                }
                Err(e) => Err(e),
            };
        }
        let r = if is_send {
            let buf = job.send_ptr(slot, rank, s.len);
            let tag = keyed.tag(slot as u16, s.seq);
            // SAFETY: the slot's result (piece 0, or the accumulator) or the
            // relayed piece is not written again until every send of this
            // round completed (the receives are reposted only then).
            unsafe { self.ep.send(buf, s.len as usize, Some(self.mh), job.peers[rank], tag.0, context) }
        } else {
            let buf = job.piece_ptr(slot, rank);
            let tag = Tag::new(job.on.tag, slot as u16, 0);
            // SAFETY: each (slot, rank) piece has exactly one receive in
            // flight, and nothing reads it until that receive completed.
            unsafe { self.ep.recv(buf, job.recv_len(slot), Some(self.mh), Some(job.peers[rank]), tag.0, Tag::SEQ_BITS, context) }
        };
        match r {
            Ok(()) => {
                self.jobs[ji].as_mut().unwrap().outstanding += 1;
                Ok(())
            }
            Err(PostError::Again) => {
                self.retry.push(context);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn post_slot_receives(&mut self, ji: usize, slot: usize) -> Result<(), PostError> {
        let (n, first) = self.jobs[ji].as_ref().map_or((0, 0..0), |j| (j.on.spec.nranks, j.first_posted(slot)));
        let base = ji as u32 * self.per_job;
        for rank in first {
            self.post(base + ((slot as u32 * n + rank) << 1))?;
        }
        Ok(())
    }

    /// Rank `rank` has its result of `slot` (its send completed, or went
    /// out by inject). After the last rank's, the slot starts its next round.
    pub(super) fn result_taken(&mut self, ji: usize, slot: usize, rank: usize) {
        let Some(job) = self.jobs[ji].as_mut() else { return };
        let s = &mut job.slots[slot];
        bump(&self.metrics.job(self.lcore, ji).bytes_out, s.len as u64);
        s.sends_left -= 1;
        // The piece bits now track which ranks still have to take their result.
        job.arrived_bits[slot * job.words_per_slot + rank / 64] &= !(1 << (rank % 64));
        let s = &mut job.slots[slot];
        if s.sends_left == 0 {
            s.sending_since = None;
            s.seq = s.seq.wrapping_add(job.on.spec.window);
            s.arrived = 0;
            s.next = 0;
            let w = job.words_per_slot;
            job.arrived_bits[slot * w..(slot + 1) * w].fill(0);
            if let Err(e) = self.post_slot_receives(ji, slot) {
                self.fail(ji, format!("reposting receives: {e}"));
            }
        }
    }

    /// A slot's result is ready: send it to every rank (a split slot: to
    /// this lcore's group).
    pub(super) fn send_results(&mut self, ji: usize, slot: usize, now: Instant) {
        let block = self.metrics.job(self.lcore, ji);
        let job = self.jobs[ji].as_mut().unwrap();
        // The round's latency (first piece in to results going out) is known
        // now; recorded before the sends, which may (by inject) finish the
        // round and start the slot's next one.
        if let Some(first) = job.slots[slot].first.take() {
            block.record_round(now.duration_since(first).as_nanos() as u64);
        }
        let n = job.on.spec.nranks;
        let to = job.split_of(slot).map_or(0..n, |sp| sp.ranks.clone());
        job.slots[slot].sends_left = to.len() as u32;
        job.slots[slot].sending_since = Some(now);
        let base = ji as u32 * self.per_job;
        for rank in to {
            if let Err(e) = self.post(base + ((slot as u32 * n + rank) << 1 | 1)) {
                self.fail(ji, format!("sending results: {e}"));
                return;
            }
        }
    }
}
