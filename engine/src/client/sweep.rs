//! Sweeping a rank's unexpected messages: what reached one of its endpoints
//! for no receive it posted (`fabric::endpoint::unexpected`), the rank's
//! side of what the server's lcores do (`dataplane::shard::sweep`).
//!
//! A rank posts each result's receive before the piece's send, so a result
//! waits unmatched only for a moment (a relayed piece, which may come back
//! before this rank's receive is posted; a receive refused with EAGAIN and
//! posted again). Anything else waits for good, holding the provider's
//! memory (tcp;ofi_rxm 1.17 keeps each such message past 16 KiB in a
//! buffer of its own): above all, the results a fenced job's server sends
//! once it runs again. A server frozen (SIGSTOP) or cut off while pieces
//! are in flight takes them in when it resumes and sends their sums back
//! under the job's old sequence key, after the ranks failed over and took
//! it back under a new one; no receive matches them. On the device's soak
//! (4 + 4 hosts at 16 Gbit/s, a fault every 45 s) each such stop left
//! about 1.1-1.4 MB more in every rank. Anyone who can reach a rank's
//! endpoint can send it messages for no receive too.
//!
//! So at its control checks (never per chunk), at most every
//! [`LOOK_EVERY`] (at every check for [`EAGER_FOR`] after a discard, so
//! that a burst goes as it comes), the client asks each rail for its oldest
//! unexpected message and, when no receive of its will ever take it,
//! discards it and asks for the next, until the oldest is one it awaits or
//! there is none. A message is awaited when its tag names a live stream of
//! this rank (a sub-job's or a recovery's redo job's), one of the stream's
//! slots, and a sequence (decoded with the stream's key) within a few
//! windows of where the stream stands (`Stream::awaits`). A stale key
//! decodes to a sequence anywhere in 2^32, so a fenced job's results are
//! told from the new job's even where the server reuses its job's tag.
//! After discards, the allocator gives the freed memory back (as the
//! server does), at most every [`TRIM_EVERY`].
//!
//! The peeks and discards use two context ids per rail past every
//! sub-job's (`Client::connect` sizes the table for them); their
//! completions do not count as the all-reduce's progress. Rail threads
//! hold them in a ring of their own (`Shared::sweep`), handed over by a
//! poll that found nothing else and at the control checks: in the data
//! ring, a look's completion on its way made a lost server's rail look
//! unsettled (`Rails::settle`), and on the device three ranks of four put
//! off taking a restarted server back (the fourth, refused, stalled the
//! job). shm and efa do not sweep (`Endpoint::can_sweep`).
use super::failover::Failover;
use super::rails::MAX_RAILS;
use super::state::Core;
use crate::dataplane::fabric::{Completion, CompletionError, PostError};
use crate::wire::Tag;
use std::time::{Duration, Instant};

/// How often a rank looks, where nothing was discarded lately.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(50);
/// How long after a discard it looks at every control check.
const EAGER_FOR: Duration = Duration::from_secs(2);
/// A look whose completion has not come by then is taken as lost (a rail
/// that dropped its queue while cancelling everything): the next look
/// goes out, and a context still busy waits for the one after.
const LOOK_LOST_AFTER: Duration = Duration::from_secs(5);
/// How often at most the allocator is asked to give freed memory back.
const TRIM_EVERY: Duration = Duration::from_secs(1);
/// Context ids the sweep takes past every sub-job's: a peek and a discard per rail.
pub(super) const SWEEP_CONTEXTS: u32 = 2 * MAX_RAILS as u32;

/// One rail's look in progress.
#[derive(Clone, Copy, Default)]
struct Look {
    /// A peek is out, since then.
    peeking: Option<Instant>,
    /// A discard is out, since then.
    discarding: Option<Instant>,
    /// A tag to discard once the discard under way completes.
    next: Option<u64>,
}

/// The sweep's state (one per client).
pub(super) struct Sweep {
    /// The provider cannot, or refused to: no sweeping.
    off: bool,
    /// The first of the sweep's context ids: rail `r` peeks under
    /// `base + 2r` and discards under `base + 2r + 1`.
    base: u32,
    looks: [Look; MAX_RAILS],
    last_look: Instant,
    eager_until: Option<Instant>,
    trim_due: bool,
    last_trim: Instant,
    /// Messages discarded so far.
    pub(super) discarded: u64,
}

impl Sweep {
    /// For a client whose sweep contexts start at `base`.
    pub(super) fn new(can_sweep: bool, base: u32) -> Sweep {
        let now = Instant::now();
        Sweep {
            off: !can_sweep,
            base,
            looks: [Look::default(); MAX_RAILS],
            last_look: now,
            eager_until: None,
            trim_due: false,
            last_trim: now,
            discarded: 0,
        }
    }

    /// Whether a context id is the sweep's.
    #[inline(always)]
    pub(super) fn owns(&self, context: u32) -> bool {
        context >= self.base
    }

    /// From the client's control checks: looks on every rail where one is
    /// due, and gives memory back after discards.
    pub(super) fn tick(&mut self, c: &mut Core, fo: &Failover) {
        if self.off {
            return;
        }
        // Rail threads hold their sweep completions apart: take them first.
        for r in 0..c.rails.count().min(MAX_RAILS) {
            while let Some(event) = c.rails.take_sweep_event(r) {
                match event {
                    Ok(done) => self.on_done(c, fo, done),
                    Err(e) => self.on_failed(&e),
                }
            }
        }
        let now = Instant::now();
        let eager = self.eager_until.is_some_and(|t| now < t);
        if eager || now.duration_since(self.last_look) >= LOOK_EVERY {
            self.last_look = now;
            for r in 0..c.rails.count().min(MAX_RAILS) {
                let look = self.looks[r];
                let out = |t: Option<Instant>| t.is_some_and(|t| now.duration_since(t) < LOOK_LOST_AFTER);
                if !out(look.peeking) && !out(look.discarding) {
                    self.peek(c, r);
                }
            }
        }
        let idle = self.looks.iter().all(|l| l.peeking.is_none() && l.discarding.is_none());
        if self.trim_due && idle && now.duration_since(self.last_trim) >= TRIM_EVERY {
            self.trim_due = false;
            self.last_trim = now;
            // SAFETY: malloc_trim takes each arena's lock; any thread may call it.
            unsafe { libc::malloc_trim(0) };
        }
    }

    fn peek(&mut self, c: &mut Core, r: usize) {
        match c.rails.peek_unexpected(r, self.base + 2 * r as u32) {
            Ok(()) => self.looks[r].peeking = Some(Instant::now()),
            // The next look tries again.
            Err(PostError::Again | PostError::ContextBusy(_)) => {}
            Err(e) => self.refused(e.to_string()),
        }
    }

    /// Discards rail `r`'s oldest message of `tag`; whether the discard went out.
    fn discard(&mut self, c: &mut Core, r: usize, tag: u64) -> bool {
        match c.rails.discard_unexpected(r, tag, self.base + 2 * r as u32 + 1) {
            Ok(()) => {
                self.looks[r].discarding = Some(Instant::now());
                true
            }
            Err(PostError::Again | PostError::ContextBusy(_)) => false,
            Err(e) => {
                self.refused(e.to_string());
                false
            }
        }
    }

    /// A completion of the sweep's: the oldest message's tag (a peek), or
    /// a message gone (a discard).
    pub(super) fn on_done(&mut self, c: &mut Core, fo: &Failover, done: Completion) {
        let (r, is_discard) = self.place(done.context);
        if r >= MAX_RAILS {
            return;
        }
        if is_discard {
            self.looks[r].discarding = None;
            self.discarded += 1;
            self.trim_due = true;
            self.eager_until = Some(Instant::now() + EAGER_FOR);
            if let Some(tag) = self.looks[r].next.take() {
                if self.discard(c, r, tag) && self.looks[r].peeking.is_none() {
                    self.peek(c, r);
                }
            }
            return;
        }
        self.looks[r].peeking = None;
        if self.off || awaits(c, fo, Tag(done.tag)) {
            return;
        }
        if self.looks[r].discarding.is_some() {
            // One discard at a time: this one follows, and the next look after it.
            self.looks[r].next = Some(done.tag);
        } else if self.discard(c, r, done.tag) {
            // rxm discards within the call: look at the next one now.
            self.peek(c, r);
        }
    }

    /// A failed completion of the sweep's: nothing left (a peek that found
    /// nothing, or a discard whose message a receive took first), or the
    /// provider's refusal, which turns the sweep off.
    pub(super) fn on_failed(&mut self, e: &CompletionError) {
        let Some((r, is_discard)) = e.context.map(|ctx| self.place(ctx)) else { return };
        if r < MAX_RAILS {
            if is_discard {
                self.looks[r].discarding = None;
            } else {
                self.looks[r].peeking = None;
            }
        }
        if !e.is_no_message() {
            self.refused(format!("{e}"));
        }
    }

    /// The rail and kind (discard: true) of a sweep context id.
    fn place(&self, context: u32) -> (usize, bool) {
        let k = context.wrapping_sub(self.base);
        ((k / 2) as usize, k % 2 == 1)
    }

    #[cold]
    fn refused(&mut self, reason: String) {
        if !self.off {
            log::warn!("not sweeping this rank's unexpected messages any more: {reason}");
        }
        self.off = true;
    }
}

/// Whether a receive of this rank will take a message with this tag: a live
/// stream of a sub-job or of a recovery's redo job, at one of its slots and
/// near its sequence.
fn awaits(c: &Core, fo: &Failover, tag: Tag) -> bool {
    let window = c.cfg.window;
    c.subs.iter().any(|s| s.streams.iter().any(|st| st.awaits(window, tag))) || fo.redo_awaits(tag)
}

#[cfg(test)]
mod tests {
    use crate::client::state::Stream;
    use crate::wire::{JobTag, Tag};

    fn stream_awaits(s: &Stream, window: u32, tag: Tag) -> bool {
        s.awaits(window, tag)
    }

    fn stream(job: u16, key: u32, head: u32, next: u32) -> Stream {
        let mut s = Stream::new(0, 0, 0, JobTag { job, key });
        s.head_seq = head;
        s.next_seq = next;
        s
    }

    #[test]
    fn a_stream_awaits_its_own_slots_near_its_sequence_and_nothing_of_an_old_key() {
        let window = 4;
        let s = stream(7, 0xdead_beef, 100, 103);
        let live = JobTag { job: 7, key: 0xdead_beef };
        // In flight, just past, a relayed piece ahead, just before the head.
        for seq in [99, 100, 102, 103, 110] {
            assert!(stream_awaits(&s, window, live.tag(1, seq)), "seq {seq}");
        }
        // Far behind or far ahead, another slot range, another job.
        assert!(!stream_awaits(&s, window, live.tag(1, 95)));
        assert!(!stream_awaits(&s, window, live.tag(1, 111)));
        assert!(!stream_awaits(&s, window, live.tag(4, 100)));
        assert!(!stream_awaits(&s, window, JobTag { job: 8, key: 0xdead_beef }.tag(1, 100)));
        // The fenced job's results: the same job tag, its old key.
        let fenced = JobTag { job: 7, key: 0x1234_5678 };
        assert!((90..120).all(|seq| !stream_awaits(&s, window, fenced.tag(1, seq))));
        // A lost stream awaits nothing.
        let mut lost = stream(7, 0xdead_beef, 100, 103);
        lost.lost = true;
        assert!(!stream_awaits(&lost, window, live.tag(1, 100)));
    }

    #[test]
    fn sequences_wrap_and_split_streams_count_from_their_slot_base() {
        let window = 8;
        let mut s = stream(3, 0, u32::MAX - 2, 2);
        let live = JobTag { job: 3, key: 0 };
        assert!(stream_awaits(&s, window, live.tag(0, u32::MAX)));
        assert!(stream_awaits(&s, window, live.tag(0, 5)));
        assert!(!stream_awaits(&s, window, live.tag(0, 40)));
        s.slot_base = 8;
        assert!(!stream_awaits(&s, window, live.tag(0, 0)));
        assert!(stream_awaits(&s, window, live.tag(15, 0)));
        assert!(!stream_awaits(&s, window, live.tag(16, 0)));
    }
}
