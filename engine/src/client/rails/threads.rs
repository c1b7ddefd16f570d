//! The rail threads and the copier: their set-up (each rail's endpoint
//! handed to a thread of its own, pinned where a core is given; the caller's
//! rail kept back for the caller's thread) and their tear-down (every thread
//! stopped and joined when [`Threads`] drops; a rail stuck in a provider call
//! is left behind). The steady state is `rails.rs` (the client's calls) and
//! `rail_loop.rs` (a rail's loop).
use super::copier;
use super::queue::{Bell, CopierShared, CopyLane, Shared, RING, SWEEP_RING};
use super::rail_loop::RailLoop;
use crate::dataplane::fabric::{Endpoint, EndpointName, FabricError};
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// One rail thread: what it shares with the client, and its handle.
pub(super) struct Rail {
    pub(super) shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// The client's rail threads, in rail order (the caller's rail, rail 0,
/// has none), and the copier where it runs. Dropping it stops them.
pub(super) struct Threads {
    rails: Vec<Rail>,
    pub(super) copier: Option<(Arc<CopierShared>, JoinHandle<()>)>,
}

impl std::ops::Deref for Threads {
    type Target = [Rail];
    fn deref(&self) -> &[Rail] {
        &self.rails
    }
}

/// What [`start`] made: the caller's rail's endpoint (with `caller_rail`),
/// the threads, the bell they ring for the client, and every rail's name.
pub(super) struct Started {
    pub(super) own: Option<Endpoint>,
    pub(super) threads: Threads,
    pub(super) owner: Arc<Bell>,
    pub(super) names: Vec<EndpointName>,
}

/// Says so when rail `r`, given no core of its own, would share the one core
/// the connecting thread is pinned to (its threads inherit that mask): two
/// pollers on one core take turns, and every hand-over between the caller
/// and its rail waits for one.
fn warn_if_one_core(r: usize) {
    if let Ok(cores) = crate::host::cpuset::allowed() {
        if let [only] = cores.as_slice() {
            log::warn!(
                "rail {r} has no core of its own (TALLY_RAIL_CORES) and shares core {only}, the one this thread is pinned to, with the caller: small all-reduces wait for the two to take turns"
            );
        }
    }
}

/// How `Rails::threaded` runs its rails.
pub struct RailThreads<'a> {
    /// Empty turns before a rail (or the copier) sleeps.
    pub spin_polls: u32,
    /// Longest sleep (ms) before a rail polls again.
    pub sleep_ms: u32,
    /// The cores of the rail threads, in order (the caller's rail has
    /// none), then the copier's; each pinned where its core is given.
    pub cores: &'a [usize],
    /// Context ids per endpoint; those from `sweep_base` on are the
    /// client's sweep's (`client::sweep`).
    pub contexts: usize,
    pub sweep_base: u32,
    /// Each rail times its copies of staged results and its turns
    /// (`Rails::copy_times`, `Rails::busy_shares`).
    pub timed: bool,
    /// One more thread copies staged results out for every rail (see
    /// `copier`), pinned to the core after the rails' where there is one.
    pub copier: bool,
    /// The first endpoint stays the caller's (no thread: the caller's polls
    /// and waits drive it, and the caller copies its staged results).
    pub caller_rail: bool,
}

/// The threads of `Rails::threaded`.
pub(super) fn start(mut eps: Vec<Endpoint>, how: &RailThreads) -> Result<Started, FabricError> {
    let RailThreads { spin_polls, sleep_ms, cores, contexts, sweep_base, timed, copier, caller_rail } = *how;
    let os_error = |call: &'static str| move |e: std::io::Error| FabricError { call, code: e.raw_os_error().unwrap_or(libc::EIO) };
    let owner = Arc::new(Bell::new().map_err(os_error("eventfd"))?);
    let copier_sh = if copier { Some(Arc::new(CopierShared::new().map_err(os_error("eventfd"))?)) } else { None };
    let own = if caller_rail && eps.len() > 1 { Some(eps.remove(0)) } else { None };
    let mut names = Vec::with_capacity(eps.len() + 1);
    if let Some(ep) = &own {
        names.push(ep.name()?);
    }
    let first_thread = usize::from(own.is_some());
    // Built up rail by rail: on an error, dropping it stops and joins the
    // threads already started.
    let mut threads = Threads { rails: Vec::with_capacity(eps.len()), copier: None };
    let count = eps.len();
    for (t, ep) in eps.into_iter().enumerate() {
        let i = first_thread + t;
        names.push(ep.name()?);
        let shared = Arc::new(Shared {
            cmds: ArrayQueue::new(RING),
            events: ArrayQueue::new(RING),
            sweep: ArrayQueue::new(SWEEP_RING),
            replies: ArrayQueue::new(4),
            bell: Bell::new().map_err(os_error("eventfd"))?,
            owner: owner.clone(),
            stop: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            copies: AtomicU64::new(0),
            copy_ns: AtomicU64::new(0),
            turn_ns: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            copy: copier_sh.clone().map(CopyLane::new),
        });
        let sh = shared.clone();
        let core = cores.get(t).copied();
        if core.is_none() {
            warn_if_one_core(i);
        }
        let thread = std::thread::Builder::new()
            .name(format!("tally-rail{i}"))
            .spawn(move || {
                if let Some(c) = core {
                    if let Err(e) = crate::host::cpuset::pin_current_thread(c) {
                        log::warn!("rail {i}: cannot pin to core {c}: {e}");
                    }
                }
                RailLoop::new(i, ep, sh, (spin_polls, sleep_ms), contexts, sweep_base, timed).run()
            })
            .map_err(os_error("spawning a rail thread"))?;
        threads.rails.push(Rail { shared, thread: Some(thread) });
    }
    if let Some(sh) = copier_sh {
        let served: Vec<Arc<Shared>> = threads.rails.iter().map(|r| r.shared.clone()).collect();
        let core = cores.get(count).copied();
        let job = copier::Copier::new(served, sh.clone(), spin_polls, sleep_ms, timed);
        let thread = std::thread::Builder::new()
            .name("tally-copier".into())
            .spawn(move || {
                if let Some(c) = core {
                    if let Err(e) = crate::host::cpuset::pin_current_thread(c) {
                        log::warn!("copier: cannot pin to core {c}: {e}");
                    }
                }
                job.run()
            })
            .map_err(os_error("spawning the copier thread"))?;
        threads.copier = Some((sh, thread));
    }
    Ok(Started { own, threads, owner, names })
}

impl Drop for Threads {
    fn drop(&mut self) {
        for r in self.rails.iter() {
            r.shared.stop.store(true, Ordering::SeqCst);
            r.shared.bell.sleeping.store(true, Ordering::SeqCst);
            r.shared.bell.ring();
        }
        for r in self.rails.iter_mut() {
            if let Some(t) = r.thread.take() {
                if r.shared.abandoned.load(Ordering::SeqCst) {
                    // Stuck in the provider: joining would hang the
                    // owner too. The thread keeps its Arc of `shared`.
                    drop(t);
                } else {
                    let _ = t.join();
                }
            }
        }
        // After the rails: a rail waits for the copier's jobs to come
        // back before it answers a cancel.
        if let Some((sh, t)) = self.copier.take() {
            sh.stop.store(true, Ordering::SeqCst);
            sh.bell.sleeping.store(true, Ordering::SeqCst);
            sh.bell.ring();
            let _ = t.join();
        }
    }
}
