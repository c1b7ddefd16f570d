//! Taking a completion, where the per-chunk path starts. A send's
//! completion is a rank taking its result; a receive's is a rank's piece
//! in, which is checked (tag, sequence number, length), counted, and handed
//! to its slot's mode: one-pass (`one_pass.rs`), staged (`staged.rs`),
//! relay (`relay.rs`) or split (`split_round.rs`). A completion with an
//! error fails its job, and a rank's connection that failed is told to the
//! other lcores. Nothing here allocates, locks, makes a system call of its
//! own or logs per chunk.
use super::{finished_message, Event, Job, ShardWorker, State};
use crate::dataplane::fabric::{Completion, CompletionError};
use crate::dataplane::lcore::{bump, Counters};
use crate::wire::{JobTag, Tag};
use std::time::Instant;

impl ShardWorker {
    /// A completion of this lcore's endpoint, decoded from its context id
    /// alone (see the `shard` module doc).
    pub(super) fn on_completion(&mut self, c: Completion, stats: &Counters) {
        let (ji, local) = ((c.context / self.per_job) as usize, c.context % self.per_job);
        let Some(job) = self.jobs.get_mut(ji).and_then(Option::as_mut) else {
            if self.sweep.owns(c.context) {
                self.on_sweep(c, stats);
            } else {
                bump(&stats.errors, 1);
            }
            return;
        };
        job.outstanding = job.outstanding.saturating_sub(1);
        if job.state != State::Running {
            self.maybe_finish_drain(ji);
            return;
        }
        let n = job.on.spec.nranks;
        let (piece, is_send) = (local >> 1, local & 1 == 1);
        let (slot, rank) = ((piece / n) as usize, (piece % n) as usize);
        if is_send {
            bump(&stats.bytes_out, job.slots[slot].len as u64);
            self.result_taken(ji, slot, rank);
            return;
        }
        match check_piece(job, &c, slot) {
            Piece::Fits => {}
            Piece::Foreign => {
                // Not from the job's rank (see `check_piece`): dropped, and
                // the receive posted again for the rank's own piece.
                bump(&stats.foreign, 1);
                if let Err(e) = self.post(c.context) {
                    self.fail(ji, format!("reposting a receive after a foreign piece: {e}"));
                }
                return;
            }
            Piece::Bad(p) => {
                let s = job.slots[slot];
                let msg = format!("{p} (rank {rank}, slot {slot}, tag {:#x}, expected seq {}, length {})", c.tag, s.seq, c.len);
                self.fail(ji, msg);
                return;
            }
        }
        bump(&stats.bytes_in, c.len as u64);
        bump(&self.metrics.job(self.lcore, ji).bytes_in, c.len as u64);
        job.arrived_bits[slot * job.words_per_slot + rank / 64] |= 1 << (rank % 64);
        if job.slots[slot].arrived == 0 {
            if let Some(done) = job.finished {
                self.fail(ji, finished_message(done));
                return;
            }
        }
        let expected = job.expected(slot);
        let s = &mut job.slots[slot];
        s.len = c.len as u32;
        s.arrived += 1;
        // The clock is read for the first piece and the last two (the last
        // one's wait is timed from the one before it), not for every rank's.
        if s.arrived == 1 || s.arrived + 1 >= expected {
            let now = Instant::now();
            if s.arrived == 1 {
                s.first = Some(now);
            }
            // The round waited for this rank alone since the piece before
            // it. Not in a slot's first round, which waits for the ranks to start.
            let steady = s.seq >= job.on.spec.window;
            if let (true, Some(prev)) = (s.arrived == expected && expected > 1 && steady, s.latest) {
                self.metrics.job(self.lcore, ji).record_last_wait(rank, now.duration_since(prev).as_nanos() as u64);
            }
            s.latest = Some(now);
        }
        let elems = c.len / job.on.spec.dtype.size();
        if job.split_of(slot).is_some() {
            self.split_piece(ji, slot, elems);
        } else if job.on.spec.relays(c.len) {
            self.relay_piece(ji, slot, rank);
        } else if job.on.stage > 0 {
            self.staged_piece(ji, slot, elems);
        } else {
            self.one_pass_piece(ji, slot, elems);
        }
    }

    /// A completion that carries an error: its job fails (canceled
    /// operations of a draining job are how jobs end, not errors); one
    /// without a job of this lcore's is the lcore's error. Returns the
    /// completions it stands for (1).
    pub(super) fn on_failed_completion(&mut self, e: CompletionError, stats: &Counters) -> usize {
        if e.context.is_some_and(|c| self.sweep.owns(c)) {
            self.on_sweep_failed(e);
            return 1;
        }
        // Canceled operations of a draining job are how jobs end, not errors.
        if !e.is_canceled() {
            bump(&stats.errors, 1);
        }
        match e.context {
            Some(ctx) if (ctx / self.per_job) < self.jobs.len() as u32 => {
                let ji = (ctx / self.per_job) as usize;
                if let Some(job) = self.jobs[ji].as_mut() {
                    job.outstanding = job.outstanding.saturating_sub(1);
                    // The provider says the rank's connection failed:
                    // what is queued to it was dropped with it.
                    if matches!(e.prov_errno, libc::ENOTCONN | libc::ECONNRESET | libc::EPIPE | libc::ECONNREFUSED) {
                        let n = job.on.spec.nranks;
                        let rank = (((ctx % self.per_job) >> 1) % n) as usize;
                        if job.gone.get(rank) == Some(&false) {
                            job.gone[rank] = true;
                            // The other lcores have connections of their own to it.
                            let _ = self.events.send(Event::RankGone { tag: job.on.tag, rank: rank as u32 });
                        }
                    }
                    if job.state == State::Running {
                        self.fail(ji, e.to_string());
                    } else {
                        self.maybe_finish_drain(ji);
                    }
                }
            }
            _ => {
                let _ = self.events.send(Event::LcoreError { lcore: self.lcore, reason: e.to_string() });
            }
        }
        1
    }
}

/// What a received piece is to its slot.
enum Piece {
    Fits,
    /// Its sequence, read with the job's key, is nowhere near the slot's
    /// round: it was not sent by a rank of the job, which all hold the key
    /// (`wire::JobTag`), but by a third party on the fabric that learnt the
    /// job's tag. Dropped and counted; the job goes on.
    Foreign,
    /// Wrong in a way a rank of the job could be: the job fails.
    Bad(&'static str),
}

/// What a piece received for `slot` is: its tag names another job or slot,
/// its sequence number is not the slot's round's (a few rounds off: a rank
/// out of step; further: a piece without the job's key), or its length is
/// not whole elements or not the round's.
#[inline]
fn check_piece(job: &Job, c: &Completion, slot: usize) -> Piece {
    let tag = Tag(c.tag);
    let s = job.slots[slot];
    if tag.job() != job.on.tag || tag.slot() as usize != slot {
        Piece::Bad("a chunk carried another job's or slot's tag")
    } else if !near_round(job, s.seq, tag) {
        Piece::Foreign
    } else if round_off(job, s.seq, tag) != 0 {
        Piece::Bad("a chunk arrived with an unexpected sequence number")
    } else if !c.len.is_multiple_of(job.on.spec.dtype.size()) {
        Piece::Bad("a chunk's length is not a whole number of elements")
    } else if s.arrived > 0 && c.len as u32 != s.len {
        Piece::Bad("ranks sent chunks of different lengths")
    } else {
        Piece::Fits
    }
}

/// How far a piece's round is from its slot's (`seq`), in sequence numbers,
/// its tag's sequence read with the job's key.
#[inline(always)]
fn round_off(job: &Job, seq: u32, tag: Tag) -> i32 {
    JobTag { job: job.on.tag, key: job.on.key }.seq_of(tag).wrapping_sub(seq) as i32
}

/// Whether a piece's round is near its slot's (`seq`): a rank out of step
/// is off by a few windows; a guess without the job's key is almost never
/// this close (4 windows of 2^32). Also how the sweep (`sweep.rs`) tells an
/// early piece, which a receive will take, from a third party's.
#[inline(always)]
pub(super) fn near_round(job: &Job, seq: u32, tag: Tag) -> bool {
    round_off(job, seq, tag).unsigned_abs() <= 4 * job.on.spec.window
}
