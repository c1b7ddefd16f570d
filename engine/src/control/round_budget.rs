//! How many recovery rounds one job may have this server lead, and how many
//! of its recovery lines reach the log.
//!
//! A round starts when a rank of the job reports losing servers
//! (`ControlPlane::lost`, `control/failover.rs`) and ends with the
//! `Recover` once every rank reported the same set. Each costs the control
//! thread, which serves every job, a `Failover` and a `Recover` to every
//! rank (the Recover carries every rank's report: up to
//! `nranks x wire::MAX_REPORT` bytes to each) and two log lines. A job's
//! own ranks hold its secret and may report anything, so nothing but this
//! bounds how often they do: two ranks flooding their leader with reports
//! completed a round every few hundred microseconds, two log lines each.
//!
//! Real losses are rare and slow: a server is declared lost after the
//! ranks' liveness time (2 s) or when its connections fail, and a job has
//! at most 64 servers (the `dead` bit set). So a job gets [`ROUND_BURST`]
//! rounds at once, enough for every one of its servers lost in turn, and
//! one more every [`ROUND_EVERY`] after; a job that starts more is ended,
//! by name, and every other job goes on. And [`LINES_PER_SPELL`] of its
//! recovery lines are logged in each [`LOG_SPELL`]; the rest are counted and
//! said in one line when the next spell begins.
use std::time::{Duration, Instant};

/// Rounds a job may start at once.
pub const ROUND_BURST: u32 = 64;

/// One more round per this, up to [`ROUND_BURST`].
pub const ROUND_EVERY: Duration = Duration::from_secs(1);

/// Recovery lines a job logs in full per [`LOG_SPELL`].
pub const LINES_PER_SPELL: u32 = 8;

pub const LOG_SPELL: Duration = Duration::from_secs(10);

/// One job's rounds and lines so far.
#[derive(Debug)]
pub struct RoundBudget {
    rounds_left: u32,
    refilled: Instant,
    spell: Instant,
    lines_left: u32,
    held: u32,
}

/// Whether to log a line (`Log::Line`), and the lines held back in the
/// spell before, to say first (`held`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Log {
    pub line: bool,
    pub held: u32,
}

impl RoundBudget {
    pub fn new(now: Instant) -> RoundBudget {
        RoundBudget { rounds_left: ROUND_BURST, refilled: now, spell: now, lines_left: LINES_PER_SPELL, held: 0 }
    }

    /// A round starts at `now`: false if the job has none left.
    pub fn take_round(&mut self, now: Instant) -> bool {
        let earned = (now.saturating_duration_since(self.refilled).as_nanos() / ROUND_EVERY.as_nanos()) as u32;
        if earned > 0 {
            self.rounds_left = self.rounds_left.saturating_add(earned).min(ROUND_BURST);
            self.refilled = if self.rounds_left == ROUND_BURST { now } else { self.refilled + ROUND_EVERY * earned };
        }
        if self.rounds_left == 0 {
            return false;
        }
        self.rounds_left -= 1;
        true
    }

    /// A recovery line is due at `now`: whether to log it, and how many
    /// were held back in the spell that just ended.
    pub fn line(&mut self, now: Instant) -> Log {
        let mut held = 0;
        if now.saturating_duration_since(self.spell) >= LOG_SPELL {
            held = std::mem::take(&mut self.held);
            self.spell = now;
            self.lines_left = LINES_PER_SPELL;
        }
        if self.lines_left == 0 {
            self.held += 1;
            return Log { line: false, held };
        }
        self.lines_left -= 1;
        Log { line: true, held }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_round_a_second() {
        let t = Instant::now();
        let mut b = RoundBudget::new(t);
        assert!((0..ROUND_BURST).all(|_| b.take_round(t)));
        assert!(!b.take_round(t), "the burst is spent");
        assert!(!b.take_round(t + ROUND_EVERY / 2));
        assert!(b.take_round(t + ROUND_EVERY), "one earned");
        assert!(!b.take_round(t + ROUND_EVERY));
        // Rounds earned while idle stop at the burst.
        let later = t + ROUND_EVERY * 1000;
        assert!((0..ROUND_BURST).all(|_| b.take_round(later)));
        assert!(!b.take_round(later));
    }

    #[test]
    fn lines_past_the_spells_share_are_counted_and_said_once() {
        let t = Instant::now();
        let mut b = RoundBudget::new(t);
        let logged = (0..100).filter(|_| b.line(t).line).count() as u32;
        assert_eq!(logged, LINES_PER_SPELL);
        assert_eq!(b.line(t + LOG_SPELL), Log { line: true, held: 100 - LINES_PER_SPELL });
        assert_eq!(b.line(t + LOG_SPELL), Log { line: true, held: 0 });
    }
}
