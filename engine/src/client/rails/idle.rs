//! When a polling thread of the client (a rail, the copier) sleeps: after
//! `spin_polls` empty turns in a row, and, once it is quiet (nothing to do
//! over several sleeps: no all-reduce in flight, as between training
//! steps), after every empty turn, for longer. The per-turn count is the
//! only cost on the busy path.

/// A polling thread's empty turns in a row, and when they call for a sleep
/// (after `spin_polls`): the rails' and the copier's loops. A thread that
/// slept [`QUIET_AFTER`] times in a row with nothing to do between is
/// quiet, not between two operations: it then sleeps again after a single
/// empty turn, rather than spinning `spin_polls` turns at each wake. (A
/// rail woken every `sleep_ms` to spin 2,048 empty turns took a quarter of
/// a core with no all-reduce in flight.) Work ends the quiet at once.
pub(super) struct EmptyTurns {
    empty: u32,
    spin_polls: u32,
    /// Sleeps in a row with no work since.
    sleeps: u32,
}

/// Sleeps in a row with nothing to do, after which a polling thread is quiet.
const QUIET_AFTER: u32 = 4;

/// How long a quiet rail with nothing in flight sleeps at most: the client's
/// bell (a command queued) wakes it, so this only bounds how late it sees
/// its stop flag.
pub(super) const QUIET_SLEEP_MS: u32 = 50;

impl EmptyTurns {
    pub(super) fn new(spin_polls: u32) -> EmptyTurns {
        EmptyTurns { empty: 0, spin_polls, sleeps: 0 }
    }

    /// Counts a turn; true when the thread should sleep now.
    #[inline]
    pub(super) fn sleep_after(&mut self, worked: bool) -> bool {
        if worked {
            self.empty = 0;
            self.sleeps = 0;
            return false;
        }
        self.empty = self.empty.saturating_add(1);
        let budget = if self.quiet() { 1 } else { self.spin_polls };
        if self.empty >= budget {
            self.empty = 0;
            self.sleeps = self.sleeps.saturating_add(1);
            return true;
        }
        false
    }

    /// Whether the thread has had nothing to do over its last sleeps.
    #[inline]
    pub(super) fn quiet(&self) -> bool {
        self.sleeps > QUIET_AFTER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_sleeps_after_spin_polls_empty_turns_in_a_row() {
        let mut t = EmptyTurns::new(3);
        let turns = [false, false, true, false, false, false, false, false, false];
        let slept: Vec<bool> = turns.iter().map(|&w| t.sleep_after(w)).collect();
        assert_eq!(slept, [false, false, false, false, false, true, false, false, true]);
    }

    #[test]
    fn a_thread_quiet_over_its_last_sleeps_sleeps_after_each_empty_turn_until_it_works() {
        let mut t = EmptyTurns::new(3);
        // QUIET_AFTER + 1 sleeps of 3 empty turns each, then quiet.
        for _ in 0..(QUIET_AFTER + 1) * 3 {
            t.sleep_after(false);
        }
        assert!(t.quiet());
        assert_eq!([t.sleep_after(false), t.sleep_after(false)], [true, true]);
        // Work ends it: spin_polls empty turns again before the next sleep.
        assert!(!t.sleep_after(true));
        assert!(!t.quiet());
        assert_eq!([t.sleep_after(false), t.sleep_after(false), t.sleep_after(false)], [false, false, true]);
    }
}
