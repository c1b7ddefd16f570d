//! The client's watchdog over its own provider calls.
//!
//! The server watches its lcores (their poll counters); a client's provider
//! calls run on the caller's thread or on its rail threads, and one that
//! never returns (shm spinning on the lock of a peer process that died
//! holding it: once a rank spun inside libfabric for 45 minutes) left no
//! trace. This thread samples each endpoint's [`CallWatch`] and, when one
//! has been inside the same call for the limit (`TALLY_PROVIDER_WATCHDOG_S`,
//! default 10 s), logs an error naming the call, the endpoint and the
//! provider, and a line when it returns after all.
//!
//! Where rails drive the endpoints, the caller's thread is free: it turns
//! the report into the error of the all-reduce it waits on (the client
//! checks [`Watchdog::stuck`] where it reads its control connections) and
//! abandons the stuck rails ([`Watchdog::stuck_rails`]), so the caller, or
//! NCCL through the plugin, gets an error naming the call instead of a hang.
//! Where the caller's own thread is the one inside the call, nothing outside
//! it can hand it an error. Over shm, whose calls spin on locks in memory
//! shared with other processes (a peer killed holding one leaves the call
//! spinning for ever), the watchdog then ends the process ([`OnStuck::Exit`]):
//! the rank exits with the report, as a rank whose rail was stuck does, and
//! its job fails over or ends instead of hanging (and PyTorch's own watchdog
//! would end a hung rank after its timeout, minutes later). shm's one
//! endpoint is driven by the caller for this reason's cost: a rail thread
//! there put a thread hop on every small all-reduce (`client::rails`;
//! `TALLY_SHM_RAIL=1` keeps it, and the error instead of the exit). Over tcp
//! or EFA, whose locks live in this process, the log line is all
//! ([`OnStuck::Log`]), as for the plugin's ncclNet endpoints (point-to-point,
//! driven by NCCL's threads).
//!
//! The same thread runs the client's one periodic chore off the data path
//! ([`Chore`], every [`CHORE_EVERY`], sooner where it asks, or when
//! [`Poke`]d): over tcp, setting the floor of the TCP timers on the
//! connections the provider opened to the servers since (`tcp_floor`). It
//! runs even where the watchdog's limit is 0.
use crate::dataplane::fabric::call_watch::CallWatch;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the watchdog does once a call passed the limit, besides its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStuck {
    /// Rails drive the endpoints: raise the report for the caller (the
    /// client turns it into the error of the all-reduce it waits on) and
    /// mark the rail stuck.
    Report,
    /// The caller's thread is the one inside the call, and the call may
    /// never return (shm): end the process with the report.
    Exit,
    /// The log line only.
    Log,
}

/// The exit status of a process the watchdog ends ([`OnStuck::Exit`]):
/// sysexits' EX_SOFTWARE.
pub const EXIT_STUCK: i32 = 70;

/// Work the watchdog's thread does off the data path; it returns how soon
/// it wants to run again (at most [`CHORE_EVERY`] is waited).
pub type Chore = Box<dyn FnMut() -> Duration + Send>;

/// How often the watchdog's thread runs its [`Chore`] at most.
pub const CHORE_EVERY: Duration = Duration::from_secs(1);

/// Asks the watchdog's thread to run its chore now, whenever it is due
/// next (the client's failover state, when it learns new server addresses).
#[derive(Clone)]
pub struct Poke {
    asked: Arc<AtomicBool>,
    thread: std::thread::Thread,
}

impl Poke {
    pub fn now(&self) {
        self.asked.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

pub struct Watchdog {
    stop: Arc<AtomicBool>,
    asked: Arc<AtomicBool>,
    /// Woken and joined on drop: no thread outlives its owner (the plugin's
    /// finalize promises NCCL that).
    thread: Option<std::thread::JoinHandle<()>>,
    /// Raised with `report` once a rail's call passed the limit.
    raised: Arc<AtomicBool>,
    report: Arc<Mutex<Option<String>>>,
    /// Bit i: rail i was reported stuck (sticky).
    stuck_rails: Arc<AtomicU32>,
}

impl Watchdog {
    /// Watches `watches` (rail i's endpoint, or the caller's one unless
    /// [`OnStuck::Report`]) for `limit`; `who` names the owner in the report
    /// ("rank 3"), and runs `chore` every [`CHORE_EVERY`]. None: neither
    /// (the limit is zero, or nothing to watch, and no chore), or no thread.
    pub fn start(
        who: String,
        provider: &str,
        mut watches: Vec<Arc<CallWatch>>,
        on_stuck: OnStuck,
        limit: Duration,
        mut chore: Option<Chore>,
    ) -> Option<Watchdog> {
        let threaded = on_stuck == OnStuck::Report;
        if limit.is_zero() {
            watches.clear();
        }
        if watches.is_empty() && chore.is_none() {
            return None;
        }
        let (stop, raised, report) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(None)));
        let asked = Arc::new(AtomicBool::new(false));
        let poked = asked.clone();
        let stuck_rails = Arc::new(AtomicU32::new(0));
        let (s, r, rep, provider, mask) = (stop.clone(), raised.clone(), report.clone(), provider.to_string(), stuck_rails.clone());
        let period =
            if watches.is_empty() { CHORE_EVERY } else { (limit / 4).clamp(Duration::from_millis(10), Duration::from_millis(500)) };
        let thread = std::thread::Builder::new()
            .name("tally-watchdog".into())
            .spawn(move || {
                // Per endpoint: the count last seen, since when, reported.
                let mut seen: Vec<(u32, Instant, bool)> = watches.iter().map(|w| (w.sample().0, Instant::now(), false)).collect();
                let mut chore_due = Instant::now();
                while !s.load(Ordering::Relaxed) {
                    let chore_in = if chore.is_some() { chore_due.saturating_duration_since(Instant::now()) } else { period };
                    std::thread::park_timeout(period.min(chore_in));
                    if s.load(Ordering::Relaxed) {
                        break;
                    }
                    let poked = poked.swap(false, Ordering::AcqRel);
                    if let Some(c) = chore.as_mut().filter(|_| poked || Instant::now() >= chore_due) {
                        chore_due = Instant::now() + c().min(CHORE_EVERY);
                    }
                    for (i, w) in watches.iter().enumerate() {
                        let (seq, call) = w.sample();
                        let (last, since, reported) = &mut seen[i];
                        let place = if threaded { format!("rail {i}") } else { "the caller's thread".to_string() };
                        if seq != *last {
                            if *reported {
                                log::warn!("{who}: {place}'s provider call returned after {:.1} s", since.elapsed().as_secs_f64());
                            }
                            (*last, *since, *reported) = (seq, Instant::now(), false);
                            continue;
                        }
                        let Some(call) = call else { continue };
                        if *reported || since.elapsed() < limit {
                            continue;
                        }
                        *reported = true;
                        let msg = format!(
                            "{who}: {} on {place} (provider {provider}) has not returned for {:.0} s: the fabric provider is stuck \
                             (a peer that died holding a lock, a NIC that stopped completing); TALLY_PROVIDER_WATCHDOG_S sets the limit",
                            call.name(),
                            since.elapsed().as_secs_f64()
                        );
                        log::error!("{msg}");
                        if on_stuck == OnStuck::Exit {
                            // Straight to the kernel: exit's handlers and
                            // destructors could call into the stuck provider.
                            eprintln!("tally: {msg}; ending the process (exit status {EXIT_STUCK}): no thread can return it to the caller");
                            // SAFETY: _exit takes no pointer and does not return.
                            unsafe { libc::_exit(EXIT_STUCK) };
                        }
                        if threaded {
                            if let Ok(mut m) = rep.lock() {
                                m.get_or_insert(msg);
                            }
                            mask.fetch_or(1 << i.min(31), Ordering::Release);
                            r.store(true, Ordering::Release);
                        }
                    }
                }
            })
            .ok()?;
        Some(Watchdog { stop, asked, thread: Some(thread), raised, report, stuck_rails })
    }

    /// The report of a rail stuck in a provider call, if any (one load when none).
    #[inline]
    pub fn stuck(&self) -> Option<String> {
        if !self.raised.load(Ordering::Acquire) {
            return None;
        }
        self.report.lock().ok().and_then(|m| m.clone())
    }

    /// Bit i set: rail i was reported stuck.
    pub fn stuck_rails(&self) -> u32 {
        self.stuck_rails.load(Ordering::Acquire)
    }

    /// What runs the chore now from another thread.
    pub fn poke(&self) -> Option<Poke> {
        Some(Poke { asked: self.asked.clone(), thread: self.thread.as_ref()?.thread().clone() })
    }
}

/// The limit from `TALLY_PROVIDER_WATCHDOG_S` (default 10 s; 0: off).
pub fn limit_from_env() -> Duration {
    Duration::from_secs(std::env::var("TALLY_PROVIDER_WATCHDOG_S").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(10))
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::fabric::call_watch::Call;

    #[test]
    fn a_call_that_does_not_return_is_reported_by_name_and_one_that_returns_is_not() {
        let (stuck, busy) = (Arc::new(CallWatch::default()), Arc::new(CallWatch::default()));
        let limit = Duration::from_millis(200);
        let w = Watchdog::start("rank 3".into(), "tcp;ofi_rxm", vec![busy.clone(), stuck.clone()], OnStuck::Report, limit, None).unwrap();
        stuck.enter(Call::CqRead);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) && w.stuck().is_none() {
            // Rail 0 keeps making calls that return.
            busy.enter(Call::Send);
            busy.leave();
            std::thread::sleep(Duration::from_millis(5));
        }
        let report = w.stuck().expect("the stuck call was not reported");
        assert!(t0.elapsed() >= limit, "reported before the limit");
        assert!(report.contains("fi_cq_read on rail 1") && report.contains("rank 3"), "{report}");
        assert!(report.contains("tcp;ofi_rxm"), "{report}");
        assert_eq!(w.stuck_rails(), 0b10, "only rail 1 is stuck");
    }
}
