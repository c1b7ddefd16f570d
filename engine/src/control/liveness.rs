//! Whether the lcores still turn (the control plane's watchdog: a stuck lcore
//! ends its jobs), the systemd watchdog fed from this loop, and the
//! heartbeats sent to ranks that asked for them (only for jobs whose lcores
//! all polled lately, so that a frozen or stuck server sends none).
use super::{ControlPlane, Phase, Watch, LCORE_QUIET_AFTER, LCORE_STUCK_AFTER};
use crate::host::cpu_wait;
use crate::wire::{Header, Kind, RejectCode};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl ControlPlane {
    /// Sends `WATCHDOG=1` when it is due (see [`WatchdogFeed`]).
    pub(super) fn feed_watchdog(&mut self, now: Instant) {
        let Some(w) = self.systemd_watchdog.as_mut().filter(|w| now >= w.next) else { return };
        w.next = now + w.every;
        if let Err(e) = crate::host::sd_notify::notify("WATCHDOG=1\n") {
            if !std::mem::replace(&mut w.warned, true) {
                log::warn!("systemd watchdog: cannot notify: {e}");
            } else {
                log::debug!("systemd watchdog: cannot notify: {e}");
            }
        }
    }

    /// Fails the jobs of an lcore that stopped polling, and refuses jobs that
    /// would need it, instead of letting their ranks wait for their timeouts.
    pub(super) fn check_lcores(&mut self, now: Instant) {
        if now.duration_since(self.watched_at) > LCORE_QUIET_AFTER {
            // This thread did not run either: the process was frozen. Give
            // the lcores, resumed at the same moment, a fresh start (else a
            // server resumed after 5 s failed every job as "stuck").
            for w in &mut self.watchdog {
                w.moved = now;
            }
        }
        self.watched_at = now;
        let mut newly_stuck = Vec::new();
        for (l, w) in self.watchdog.iter_mut().enumerate() {
            let polls = w.stats.snapshot().polls;
            if polls != w.polls {
                if w.stuck {
                    log::warn!("lcore {l} polls again");
                }
                (w.polls, w.moved, w.stuck) = (polls, now, false);
                if w.waited.is_none_or(|(at, _)| now.duration_since(at) >= WAITED_EVERY) {
                    w.waited = w.waited_now().map(|d| (now, d));
                }
            } else if !w.stuck && now.duration_since(w.moved) >= LCORE_STUCK_AFTER && could_run(w, now, w.waited_now()) >= LCORE_STUCK_AFTER
            {
                w.stuck = true;
                newly_stuck.push(l);
            }
        }
        for l in newly_stuck {
            log::error!(
                "lcore {l} has not polled for {:?}: it is stuck inside the fabric provider; failing its jobs (restart the server to recover it)",
                LCORE_STUCK_AFTER
            );
            for i in 0..self.active.len() {
                if self.active[i].as_ref().is_some_and(|a| (l as u32) < a.spec.shards) {
                    self.end(i, RejectCode::JobFailed, &format!("lcore {l} of the server is stuck inside the fabric provider"));
                }
            }
        }
    }

    /// The first stuck lcore among the first `shards`, if any.
    pub(super) fn stuck_lcore(&self, shards: u32) -> Option<usize> {
        self.watchdog.iter().take(shards as usize).position(|w| w.stuck)
    }

    /// Sends every rank that asked for them a heartbeat, every `heartbeat`,
    /// for each running job whose lcores all polled within
    /// [`LCORE_QUIET_AFTER`]. The control thread sends them, so a frozen
    /// process sends none; the lcores' poll counters gate them, so a stuck
    /// lcore withholds its jobs'. (Not per chunk: a few bytes per rank a tick.)
    pub(super) fn beat(&mut self, now: Instant) {
        let Some(every) = self.heartbeat else { return };
        if now < self.next_beat {
            return;
        }
        self.next_beat = now + every;
        let alive = Header::new(Kind::Alive);
        for a in self.active.iter_mut().flatten() {
            if a.phase != Phase::Running {
                continue;
            }
            let quiet = self.watchdog.iter().take(a.spec.shards as usize).position(|w| now.duration_since(w.moved) >= LCORE_QUIET_AFTER);
            if let Some(l) = quiet {
                self.counters.heartbeats_withheld.fetch_add(1, Ordering::Relaxed);
                if !a.withheld {
                    log::warn!(
                        "job {:#x}: heartbeats withheld: lcore {l} has not polled for {:?} (its ranks fail over after their liveness time)",
                        a.job_id,
                        LCORE_QUIET_AFTER
                    );
                    a.withheld = true;
                }
                continue;
            }
            a.withheld = false;
            for c in a.conns.iter().filter(|c| c.heartbeats) {
                let _ = self.net.send(c.id, bytemuck::bytes_of(&alive));
            }
        }
    }
}

/// How often a moving lcore's wait for a CPU is read (a file in /proc per
/// lcore): the baseline [`could_run`] measures from is at most this old.
const WAITED_EVERY: Duration = Duration::from_secs(1);

impl Watch {
    /// The lcore thread's wait for a CPU so far (`host::cpu_wait`).
    fn waited_now(&self) -> Option<Duration> {
        cpu_wait::waited(self.stats.tid.load(Ordering::Relaxed))
    }
}

/// How long lcore `w` could have run since it last moved: the time since,
/// less what it spent waiting for a CPU (`waited_now`, against the reading
/// at or before its last move; all of the time where the kernel does not say).
fn could_run(w: &Watch, now: Instant, waited_now: Option<Duration>) -> Duration {
    match (w.waited, waited_now) {
        (Some((at, before)), Some(after)) => now.duration_since(at).saturating_sub(after.saturating_sub(before)),
        _ => now.duration_since(w.moved),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn time_spent_waiting_for_a_cpu_is_not_time_stuck() {
        let now = Instant::now();
        let at = now - Duration::from_secs(6);
        let base = Duration::from_secs(10);
        let w = Watch { stats: Arc::default(), polls: 0, moved: at, waited: Some((at, base)), stuck: false };
        let s = |d: u64| Some(base + Duration::from_secs(d));
        assert_eq!(could_run(&w, now, s(3)), Duration::from_secs(3), "3 of the 6 s spent waiting for a CPU");
        assert!(could_run(&w, now, s(3)) < LCORE_STUCK_AFTER);
        assert_eq!(could_run(&w, now, s(0)), Duration::from_secs(6), "a thread that waited for nothing is held to all 6 s");
        assert_eq!(could_run(&w, now, None), Duration::from_secs(6), "where the kernel does not say: all of it");
        let w = Watch { waited: None, ..w };
        assert_eq!(could_run(&w, now, s(3)), Duration::from_secs(6));
    }
}
