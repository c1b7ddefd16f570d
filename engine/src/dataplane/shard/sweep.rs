//! Sweeping the lcore's unexpected messages: what reached its endpoint for
//! no receive it posted (`fabric::endpoint::unexpected`). A rank's piece may
//! arrive a moment before its slot's receive is posted again, and waits
//! there to be matched; anything else waits for good, holding the
//! provider's memory, and anyone who can reach the lcore's port can send
//! it: pieces of jobs this lcore does not run (ended, failed, or never
//! admitted) and pieces whose sequence does not carry their job's key.
//!
//! So the lcore looks at the oldest unexpected message at housekeeping
//! (every 50 ms at most, never per chunk) and, when no receive of its will
//! ever take it, discards it and looks at the next, and so on until the
//! oldest is one it awaits or there is none. Whether it awaits a message is
//! decided by its tag alone, as `check_piece` would take it: a running job
//! of this lcore, a slot of that job, a sequence within a few windows of
//! the slot's round. Each discarded message is counted
//! (`tally_lcore_unexpected_discarded_total`). A sender that holds a job's
//! key (a rank, or an on-path observer, against whom only isolation helps;
//! docs/security.md) can still park messages that look awaited until the
//! slot moves past them.
//!
//! After a discard the lcore looks at every turn of its loop for a while
//! ([`Sweep::eager`]): a flood is taken as it arrives, and a look that
//! finds nothing costs a provider call, only while messages for no
//! receive keep coming.
//!
//! The peeks and discards complete on the lcore's own queue under two
//! context ids past every job's ([`Sweep::peek`], [`Sweep::discard`]),
//! which the completion path sends here from the branch where it finds no
//! job: the per-chunk path does not change. ofi_rxm discards before the
//! call returns, so the next peek goes out with the discard: a turn of the
//! loop takes one message, not one every other turn. (Reading the queue
//! itself to take many a turn did worse: each peek and poll is a progress
//! call, and rxm reads a socket's worth of messages in each, so draining
//! the sockets faster let the sender send faster. The kernel's socket
//! buffer, left to fill, is what holds a sender back.)
use super::complete::near_round;
use super::{ShardWorker, State};
use crate::dataplane::fabric::{Completion, CompletionError, PostError};
use crate::dataplane::lcore::{bump, Counters};
use crate::wire::Tag;

/// Turns of eager looking after a discard: a few ms of a busy loop, some
/// seconds of a sleeping one (each wake is a turn).
const EAGER_TURNS: u32 = 1 << 16;

pub(super) struct Sweep {
    /// The provider cannot peek (shm, efa) or refused to: no sweeping.
    off: bool,
    /// A peek is out (its completion not read yet).
    peeking: bool,
    /// A discard is out.
    discarding: bool,
    /// A message to discard once the discard under way completes.
    next: Option<u64>,
    /// Turns of the loop left in which to look at every turn rather than
    /// at housekeeping: set by each discard, so that a flood is taken as
    /// it arrives (at one look per 50 ms it queued tens of MB between
    /// looks, and the provider's buffer pools never shrink).
    pub(super) eager: u32,
    /// Messages were discarded since the allocator last gave back memory.
    trim_due: bool,
    /// The context ids of the sweep's peeks and of its discards: the
    /// endpoint's last two, past every job's.
    pub(super) peek: u32,
    pub(super) discard: u32,
}

impl Sweep {
    /// Context ids `first` and `first + 1` are the sweep's.
    pub(super) fn new(can_sweep: bool, first: u32) -> Sweep {
        Sweep { off: !can_sweep, peeking: false, discarding: false, next: None, eager: 0, trim_due: false, peek: first, discard: first + 1 }
    }

    /// Whether a completion's context is the sweep's.
    pub(super) fn owns(&self, context: u32) -> bool {
        context == self.peek || context == self.discard
    }
}

impl ShardWorker {
    /// From housekeeping (and every turn while eager): look at the oldest
    /// unexpected message, unless a look is under way.
    pub(super) fn sweep(&mut self) {
        if !self.sweep.off && !self.sweep.peeking {
            self.peek_oldest();
        }
    }

    fn peek_oldest(&mut self) {
        match self.ep.peek_unexpected(self.sweep.peek) {
            Ok(()) => self.sweep.peeking = true,
            // The next housekeeping tries again.
            Err(PostError::Again) => {}
            Err(e) => self.sweep_refused(e.to_string()),
        }
    }

    /// Discards the oldest message of `tag`; whether the discard went out.
    fn discard(&mut self, tag: u64) -> bool {
        match self.ep.discard_unexpected(tag, self.sweep.discard) {
            Ok(()) => {
                self.sweep.discarding = true;
                true
            }
            Err(PostError::Again) => false,
            Err(e) => {
                self.sweep_refused(e.to_string());
                false
            }
        }
    }

    /// From housekeeping, after discards, once no look is out: give the
    /// freed memory back. rxm 1.17 mallocs each unexpected message larger
    /// than its bounce buffer and frees it on discard, and glibc keeps freed
    /// memory below the top of its heaps resident until trimmed.
    pub(super) fn trim_after_sweep(&mut self) {
        if self.sweep.trim_due && !self.sweep.peeking && !self.sweep.discarding {
            self.sweep.trim_due = false;
            // SAFETY: malloc_trim takes each arena's lock; any thread may call it.
            unsafe { libc::malloc_trim(0) };
        }
    }

    /// A completion of one of the sweep's contexts: the oldest message's
    /// tag (a peek), or a message gone (a discard).
    pub(super) fn on_sweep(&mut self, c: Completion, stats: &Counters) {
        if c.context == self.sweep.discard {
            self.sweep.discarding = false;
            bump(&stats.discarded, 1);
            self.sweep.eager = EAGER_TURNS;
            self.sweep.trim_due = true;
            if let Some(tag) = self.sweep.next.take() {
                if self.discard(tag) && !self.sweep.peeking {
                    self.peek_oldest();
                }
            }
            return;
        }
        self.sweep.peeking = false;
        if self.sweep.off || self.awaits(Tag(c.tag)) {
            return;
        }
        if self.sweep.discarding {
            // One discard at a time: this one follows, and the next look after it.
            self.sweep.next = Some(c.tag);
        } else if self.discard(c.tag) {
            // Gone already (rxm discards within the call): look at the next.
            self.peek_oldest();
        }
    }

    /// A failed completion of the sweep's contexts: nothing left (a peek
    /// that found nothing, or a discard whose message a receive took
    /// first), or the provider's refusal, which turns the sweep off.
    pub(super) fn on_sweep_failed(&mut self, e: CompletionError) {
        if e.context == Some(self.sweep.discard) {
            self.sweep.discarding = false;
        } else {
            self.sweep.peeking = false;
        }
        if !e.is_no_message() {
            self.sweep_refused(e.to_string());
        }
    }

    #[cold]
    fn sweep_refused(&mut self, reason: String) {
        if !self.sweep.off {
            log::warn!("lcore {}: not sweeping unexpected messages any more: {reason}", self.lcore);
        }
        self.sweep.off = true;
    }

    /// Whether a receive of this lcore will take a message with this tag:
    /// one of its running jobs' slots, a sequence near the slot's round.
    fn awaits(&self, tag: Tag) -> bool {
        self.jobs.iter().flatten().any(|job| {
            job.state == State::Running
                && job.on.tag == tag.job()
                && job.slots.get(tag.slot() as usize).is_some_and(|s| near_round(job, s.seq, tag))
        })
    }
}
