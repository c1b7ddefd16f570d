//! Lcores: one pinned worker thread per core, each running its own loop.
//!
//! The DPDK model: an lcore is a thread pinned to one core that owns its
//! resources outright (endpoint, completion queue, slab). It is built *on*
//! its thread, after pinning, so its memory is touched by the core that will
//! use it (NUMA-local) and nothing else ever holds a reference to it. Other
//! threads see an lcore only through its [`LcoreStats`] (cache-padded
//! counters that only the lcore writes) and the shared stop flag.
//!
//! The loop is run-to-completion: [`Worker::poll_once`] polls the CQ and
//! does whatever the completions ask for (reduce, send, repost). The poll
//! mode decides what happens when a poll finds nothing:
//! - `busy`: spin (production, one lcore per isolated core);
//! - `adaptive`: spin for a bounded number of empty polls, then sleep on the
//!   CQ's wait object (or briefly, on providers without one) until the next
//!   completion or the stop request. Tests and small machines use this: a
//!   busy poller on an oversubscribed machine starves everything else.
//!
//! # Poll modes
//!
//! `busy` spins (dedicated, isolated cores). `adaptive` spins 16 empty polls (`TALLY_ADAPTIVE_SPIN`),
//! then sleeps in `poll(2)` on the CQ's wait fd, after `fi_trywait`, where the provider has one
//! (tcp;ofi_rxm), else naps 50 us (shm 1.17, EFA), with a 1 us timer slack (`lcore::precise_naps`);
//! why: [measurements](docs/measurements.md#poll-modes). The loop is `fn run` in
//! `engine/src/dataplane/lcore.rs`; a rail thread sleeps the same way (`RailLoop::sleep`), after
//! `ClientConfig::spin_polls` empty turns. A rail or copier with nothing to do over several sleeps
//! is quiet (`engine/src/client/rails/idle.rs`): it sleeps after every empty turn, and with nothing
//! in flight on the client's bell alone for up to 50 ms, so a rank between all-reduces costs about
//! 0.2% of a core, not half of one (`tests/suites/idle.rs`).
use crate::host::cpuset::{self, CoreList};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// What an lcore does when a poll finds no completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    Busy,
    Adaptive { spin_polls: u32, sleep_ms: i32 },
}

impl PollMode {
    /// A short spin, then sleep: on a machine with more pollers than cores
    /// a long spin only burns the timeslice another poller needs (measured
    /// here: 4 ranks + 2 lcores on 2 cores, 4 KiB agg took 5.7 ms with 4096
    /// spins and 0.29 ms with 16). Busy mode is for dedicated cores.
    pub const ADAPTIVE: PollMode = PollMode::Adaptive { spin_polls: 16, sleep_ms: 1 };

    /// `busy` or `adaptive`; `TALLY_ADAPTIVE_SPIN` overrides how many
    /// empty polls an adaptive poller makes before it sleeps.
    pub fn parse(s: &str) -> Option<PollMode> {
        match s {
            "busy" => Some(PollMode::Busy),
            "adaptive" => Some(PollMode::Adaptive { spin_polls: adaptive_spin(), sleep_ms: 1 }),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            PollMode::Busy => "busy",
            PollMode::Adaptive { .. } => "adaptive",
        }
    }

    /// Whether the CQ should be opened with a wait object.
    pub fn wants_wait_object(&self) -> bool {
        matches!(self, PollMode::Adaptive { .. })
    }
}

/// Empty polls before an adaptive poller sleeps: `TALLY_ADAPTIVE_SPIN`, or
/// the default of [`PollMode::ADAPTIVE`].
pub fn adaptive_spin() -> u32 {
    let default = match PollMode::ADAPTIVE {
        PollMode::Adaptive { spin_polls, .. } => spin_polls,
        PollMode::Busy => 0,
    };
    std::env::var("TALLY_ADAPTIVE_SPIN").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Counters one lcore publishes. Only the lcore writes them (plain
/// load + store, no read-modify-write); readers may see a value one update
/// old. Padded so that two lcores' counters never share a cache line.
#[derive(Default)]
pub struct Counters {
    pub polls: AtomicU64,
    pub empty_polls: AtomicU64,
    pub completions: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub errors: AtomicU64,
    pub sleeps: AtomicU64,
    /// Pieces dropped because their sequence did not carry their job's key
    /// (`wire::JobTag`): sent by a third party, not a rank.
    pub foreign: AtomicU64,
    /// Messages that reached the lcore for no receive of its and were
    /// discarded (`shard::sweep`).
    pub discarded: AtomicU64,
    /// The lcore thread's id, set once it starts (0 before): the watchdog
    /// reads its wait for a CPU (`host::cpu_wait`).
    pub tid: AtomicU32,
}

pub type LcoreStats = CachePadded<Counters>;

/// Adds to a counter that only the calling thread writes.
#[inline(always)]
pub fn bump(c: &AtomicU64, by: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
}

/// A copy of an lcore's counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub polls: u64,
    pub empty_polls: u64,
    pub completions: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub errors: u64,
    pub sleeps: u64,
    pub foreign: u64,
    pub discarded: u64,
}

impl Counters {
    pub fn snapshot(&self) -> Snapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            polls: r(&self.polls),
            empty_polls: r(&self.empty_polls),
            completions: r(&self.completions),
            bytes_in: r(&self.bytes_in),
            bytes_out: r(&self.bytes_out),
            errors: r(&self.errors),
            sleeps: r(&self.sleeps),
            foreign: r(&self.foreign),
            discarded: r(&self.discarded),
        }
    }
}

/// The per-core work, built on its lcore's thread.
pub trait Worker {
    /// One turn of the loop: poll the CQ and handle what arrived. Returns the
    /// number of completions handled (0 is an empty poll). Must not block,
    /// allocate or log in the steady state.
    fn poll_once(&mut self, stats: &Counters) -> usize;
    /// Sleep until work may be ready or `timeout_ms` passes (adaptive mode).
    fn wait(&mut self, timeout_ms: i32);
    /// Called once when the lcore stops: cancel or drain what is in flight.
    /// Resources are released when the worker is dropped right after.
    fn shutdown(&mut self) {}
}

/// Where an lcore runs, handed to its set-up function.
#[derive(Debug, Clone, Copy)]
pub struct LcoreInfo {
    /// Index within the core list: lcore k serves shard k.
    pub id: usize,
    /// The CPU it is pinned to.
    pub core: usize,
}

#[derive(Debug)]
pub enum LcoreError {
    /// A core is outside this process's affinity mask, or pinning failed.
    Pin {
        core: usize,
        reason: String,
    },
    /// The set-up function failed on lcore `id`.
    Setup {
        id: usize,
        core: usize,
        reason: String,
    },
    Spawn(std::io::Error),
}

impl fmt::Display for LcoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LcoreError::Pin { core, reason } => write!(f, "cannot pin an lcore to core {core}: {reason}"),
            LcoreError::Setup { id, core, reason } => write!(f, "lcore {id} (core {core}) failed to start: {reason}"),
            LcoreError::Spawn(e) => write!(f, "cannot start an lcore thread: {e}"),
        }
    }
}

impl std::error::Error for LcoreError {}

/// A running lcore, as seen from outside.
pub struct LcoreHandle {
    pub info: LcoreInfo,
    pub stats: Arc<LcoreStats>,
    thread: Option<JoinHandle<()>>,
}

/// Every lcore of one launch, with their shared stop flag. Dropping it stops
/// and joins them all.
pub struct LcoreSet {
    lcores: Vec<LcoreHandle>,
    stop: Arc<AtomicBool>,
}

/// Starts one lcore per core in `cores`. On each, after pinning, `setup`
/// builds the worker and a value for the caller (e.g. the endpoint's name).
/// Returns once every lcore has finished set-up, with those values in lcore
/// order, or the first failure (after stopping the lcores that did start).
pub fn launch<W, T, E, F>(cores: &CoreList, mode: PollMode, setup: F) -> Result<(LcoreSet, Vec<T>), LcoreError>
where
    W: Worker + 'static,
    T: Send + 'static,
    E: std::fmt::Display,
    F: Fn(LcoreInfo) -> Result<(W, T), E> + Send + Sync + 'static,
{
    cores.validate_against_allowed().map_err(|e| LcoreError::Pin { core: cores.get(0).unwrap_or(0), reason: e.to_string() })?;
    let stop = Arc::new(AtomicBool::new(false));
    let setup = Arc::new(setup);
    let mut set = LcoreSet { lcores: Vec::new(), stop: stop.clone() };
    let (tx, rx) = mpsc::channel::<(usize, Result<T, LcoreError>)>();
    for (id, core) in cores.iter().enumerate() {
        let info = LcoreInfo { id, core };
        let stats: Arc<LcoreStats> = Arc::new(CachePadded::new(Counters::default()));
        let (stats2, stop2, setup2, tx2) = (stats.clone(), stop.clone(), setup.clone(), tx.clone());
        let thread = std::thread::Builder::new()
            .name(format!("lcore-{id}"))
            .spawn(move || {
                stats2.tid.store(crate::host::cpu_wait::current_tid(), Ordering::Relaxed);
                precise_naps();
                if let Err(e) = cpuset::pin_current_thread(core) {
                    let _ = tx2.send((id, Err(LcoreError::Pin { core, reason: e.to_string() })));
                    return;
                }
                let mut worker = match setup2(info) {
                    Ok((w, t)) => {
                        let _ = tx2.send((id, Ok(t)));
                        w
                    }
                    Err(e) => {
                        let _ = tx2.send((id, Err(LcoreError::Setup { id, core, reason: e.to_string() })));
                        return;
                    }
                };
                drop(tx2);
                run(&mut worker, mode, &stats2, &stop2);
                worker.shutdown();
            })
            .map_err(LcoreError::Spawn)?;
        set.lcores.push(LcoreHandle { info, stats, thread: Some(thread) });
    }
    drop(tx);
    let mut out: Vec<Option<T>> = (0..cores.len()).map(|_| None).collect();
    for _ in 0..cores.len() {
        match rx.recv() {
            Ok((id, Ok(t))) => out[id] = Some(t),
            Ok((_, Err(e))) => return Err(e), // `set` drops here: stops the others
            Err(_) => return Err(LcoreError::Spawn(std::io::Error::other("an lcore thread exited during set-up"))),
        }
    }
    Ok((set, out.into_iter().map(|t| t.expect("every lcore reported")).collect()))
}

/// Makes this thread's short sleeps short: the default timer slack (50 us)
/// would stretch an adaptive poller's 20 us nap to 70 us.
pub fn precise_naps() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only the calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };
}

/// The steady state: poll, handle, repeat. Nothing here allocates, locks or
/// makes a syscall, except the adaptive mode's sleep once the CQ went quiet.
fn run<W: Worker>(worker: &mut W, mode: PollMode, stats: &Counters, stop: &AtomicBool) {
    let mut empty_streak: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        let n = worker.poll_once(stats);
        bump(&stats.polls, 1);
        if n > 0 {
            bump(&stats.completions, n as u64);
            empty_streak = 0;
            continue;
        }
        bump(&stats.empty_polls, 1);
        match mode {
            PollMode::Busy => std::hint::spin_loop(),
            PollMode::Adaptive { spin_polls, sleep_ms } => {
                empty_streak += 1;
                if empty_streak >= spin_polls {
                    worker.wait(sleep_ms);
                    bump(&stats.sleeps, 1);
                    empty_streak = 0;
                }
            }
        }
    }
}

impl LcoreSet {
    pub fn lcores(&self) -> &[LcoreHandle] {
        &self.lcores
    }

    /// Snapshot of every lcore's counters, in lcore order.
    pub fn snapshot(&self) -> Vec<Snapshot> {
        self.lcores.iter().map(|l| l.stats.snapshot()).collect()
    }

    /// Asks every lcore to stop (each finishes its current turn, runs
    /// `shutdown`, drops its resources) and waits for all of them.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    /// The shared flag, for signal handlers or supervisors.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for l in &mut self.lcores {
            if let Some(t) = l.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for LcoreSet {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
