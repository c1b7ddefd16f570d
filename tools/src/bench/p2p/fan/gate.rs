//! What the threads of a fan run share: a gate (a barrier that a failing
//! thread opens for everyone), the endpoint names and the clock readings.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;
use tally_engine::dataplane::fabric::EndpointName;

pub(super) const ABORTED: &str = "stopped: another thread failed";

/// What the threads share.
pub(super) struct Shared {
    pub(super) gate: Gate,
    /// Endpoint names, hubs first, then leaves.
    pub(super) names: Mutex<Vec<Option<EndpointName>>>,
    pub(super) provider_used: Mutex<Option<String>>,
    pub(super) times: Mutex<RepTimes>,
}

/// One repetition's clock readings.
pub(super) struct RepTimes {
    /// Per thread (hubs, then leaves): when the start gate let it go.
    pub(super) starts: Vec<Option<Instant>>,
    /// Per leaf: its last completion.
    pub(super) ends: Vec<Option<Instant>>,
}

/// A barrier that a failing thread can open for everyone: with
/// `std::sync::Barrier` the others would wait for it forever.
pub(super) struct Gate {
    pub(super) n: usize,
    pub(super) state: Mutex<GateState>,
    pub(super) cv: Condvar,
    /// Mirrors `state.failure.is_some()`, for the data loops to look at without locking.
    pub(super) failed: AtomicBool,
}

pub(super) struct GateState {
    pub(super) arrived: usize,
    pub(super) generation: u64,
    /// The first failure; later ones are its consequences.
    pub(super) failure: Option<String>,
}

impl Gate {
    pub(super) fn new(n: usize) -> Gate {
        Gate {
            n,
            state: Mutex::new(GateState { arrived: 0, generation: 0, failure: None }),
            cv: Condvar::new(),
            failed: AtomicBool::new(false),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until all `n` parties have arrived, or until one has failed.
    pub(super) fn wait(&self) -> Result<(), String> {
        let mut s = self.lock();
        if s.failure.is_some() {
            return Err(ABORTED.into());
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.n {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while s.generation == generation && s.failure.is_none() {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.generation != generation {
            Ok(())
        } else {
            Err(ABORTED.into())
        }
    }

    pub(super) fn fail(&self, why: String) {
        let mut s = self.lock();
        if s.failure.is_none() {
            s.failure = Some(why);
        }
        self.failed.store(true, Ordering::Relaxed);
        self.cv.notify_all();
    }

    pub(super) fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    pub(super) fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }
}

/// Opens the gate for the others if its thread panics.
pub(super) struct FailOnPanic<'a> {
    pub(super) gate: &'a Gate,
    pub(super) who: &'a str,
}

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.gate.fail(format!("{} panicked", self.who));
        }
    }
}
