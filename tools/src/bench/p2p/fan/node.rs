//! One thread's endpoint (a hub's or a leaf's): its slab, registered once,
//! its peers and its completions.
use super::gate::{Shared, ABORTED};
use super::plan::{FanPlan, CHECK_EVERY, STALL};
use std::time::Instant;
use tally_engine::dataplane::fabric::{
    Completion, Endpoint, EndpointConfig, EndpointName, Hints, MemoryHandle, PeerAddr, PollError, PostError,
};
use tally_engine::dataplane::slab::{Slab, SlabConfig};

/// One thread's endpoint, its slab (registered once) and its peers.
pub(super) struct Node {
    // Declared (and so dropped) before the slab it has registered.
    pub(super) ep: Endpoint,
    pub(super) slab: Slab,
    pub(super) mh: MemoryHandle,
    pub(super) peers: Vec<PeerAddr>,
    pub(super) busy: bool,
    pub(super) spin: u32,
    pub(super) idle: u32,
    pub(super) last_progress: Instant,
}

impl Node {
    pub(super) fn open(plan: &FanPlan, label: &str, slot_size: usize, slots: usize, contexts: usize) -> Result<Node, String> {
        let node = if plan.provider.starts_with("tcp") { Some("127.0.0.1") } else { None };
        let cfg = EndpointConfig {
            hints: Hints::new(&plan.provider).with_node(node),
            cq_size: 0,
            contexts: contexts as u32,
            wait_object: !plan.busy,
        };
        let mut ep = Endpoint::open(&cfg).map_err(|e| format!("{}: {e}", plan.provider))?;
        let mut scfg = SlabConfig::new(label, slot_size.max(64), slots);
        scfg.policy = plan.policy;
        scfg.page_aligned_slots = true;
        let slab = Slab::new(&scfg).map_err(|e| e.to_string())?;
        // SAFETY: the slab outlives the registration: `Node` drops `ep`
        // (which closes it) before `slab`, and `close` leaks the slab if
        // the provider may still hold some of it.
        let mh = unsafe { ep.register(slab.as_ptr(), slab.len()) }.map_err(|e| e.to_string())?;
        Ok(Node { ep, slab, mh, peers: Vec::new(), busy: plan.busy, spin: plan.spin, idle: 0, last_progress: Instant::now() })
    }

    /// Publishes this endpoint's name, waits for everyone's, and inserts
    /// the peers in `range` (of the shared name table).
    pub(super) fn meet(&mut self, shared: &Shared, me: usize, range: std::ops::Range<usize>) -> Result<(), String> {
        shared.names.lock().unwrap_or_else(|e| e.into_inner())[me] = Some(self.ep.name().map_err(|e| e.to_string())?);
        shared.gate.wait()?;
        let names: Vec<EndpointName> = shared.names.lock().unwrap_or_else(|e| e.into_inner())[range]
            .iter()
            .map(|n| n.clone().ok_or("a peer published no name"))
            .collect::<Result<_, _>>()?;
        for n in &names {
            self.peers.push(self.ep.insert_peer(n).map_err(|e| e.to_string())?);
        }
        shared.gate.wait()
    }

    /// Reads completions into `out`. After an empty poll an adaptive poller
    /// spins `spin` polls, then sleeps on the CQ, as an lcore does; every
    /// `CHECK_EVERY` empty polls it looks for a failed peer and a stall.
    /// `what` describes the caller's state (given the operations in flight) for a stall's error.
    pub(super) fn poll(&mut self, out: &mut [Completion], shared: &Shared, what: impl Fn(u32) -> String) -> Result<usize, String> {
        match self.ep.poll(out) {
            Ok(0) => {
                self.idle = self.idle.saturating_add(1);
                if !self.busy && self.idle > self.spin {
                    self.ep.wait(1).map_err(|e| e.to_string())?;
                }
                if self.idle.is_multiple_of(CHECK_EVERY) || (!self.busy && self.idle > self.spin) {
                    if shared.gate.failed() {
                        return Err(ABORTED.into());
                    }
                    if self.last_progress.elapsed() > STALL {
                        return Err(format!("no completion for {} s: {}", STALL.as_secs(), what(self.ep.in_flight())));
                    }
                }
                Ok(0)
            }
            Ok(n) => {
                self.idle = 0;
                self.last_progress = Instant::now();
                Ok(n)
            }
            Err(PollError::Completion(e)) => Err(e.to_string()),
            Err(PollError::Fabric(e)) => Err(e.to_string()),
        }
    }

    /// Closes the endpoint. A failed thread's endpoint may keep operations
    /// the provider never returned; `Endpoint`'s drop then leaves it open,
    /// and the slab must stay mapped with it.
    pub(super) fn close(self) {
        let Node { ep, slab, .. } = self;
        let leak = ep.in_flight() > 0;
        drop(ep);
        if leak {
            std::mem::forget(slab);
        }
    }
}

/// Whether a post went out (`false`: the provider said try again).
pub(super) fn posted(r: Result<(), PostError>) -> Result<bool, String> {
    match r {
        Ok(()) => Ok(true),
        Err(PostError::Again) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}
