//! Rails: the fabric endpoints a client moves its bytes through, and the
//! threads that drive them.
//!
//! Over tcp every byte a worker sends or receives is copied by the kernel
//! (and, for eager messages, once more by rxm), on the thread that drives the
//! endpoint's progress. With one endpoint that is the caller's thread, and it
//! tops out near 4-5 GB/s of traffic in and out together: a worker on a 16
//! Gbit/s link needs 2 GB/s each way, at 32 Gbit/s 4. So a client can run
//! *rails*: one endpoint per rail, each on its own thread. With no more rails
//! than servers, server `si`'s streams go on rail `si mod R`, and its Hello
//! names that rail. With more (R > S servers), server `si` gets the rails
//! `si, si + S, si + 2S, ...` below R as its *lanes*: its Hello names them
//! all (`wire::HelloMessage`), and its lcore `k` talks to lane `k mod
//! lanes` ([`Rails::rail_for`]), so that one server's lcores spread over
//! several rails. Why: a rail carrying 2 GB/s each way is at one endpoint's
//! ceiling, and failover's copy of the results it receives (see
//! [`Rails::recv`]) then shows on the link (docs/measurements.md, Rails).
//!
//! A rail thread owns its endpoint (`FI_THREAD_DOMAIN`: nothing else touches
//! it) and runs one loop: take the operations the client queued ([`Cmd`]),
//! post them (an `EAGAIN` keeps them, in order, for its next turn), read its
//! completion queue and queue the completions back ([`Event`]). Both queues
//! are bounded lock-free rings allocated at start; nothing on this path
//! allocates, locks or logs. A rail with nothing to do spins `spin_polls`
//! turns, then sleeps on its CQ's descriptor and on an eventfd the client
//! writes only when it queued work for a sleeping rail; the client sleeps
//! the same way on an eventfd the rails write when it sleeps.
//!
//! With one rail ([`Rails::direct`]) there is no thread: the caller's thread
//! drives the one endpoint, exactly as a client without rails did. That is
//! the default wherever a second thread cannot help (one server, a host of
//! few cores) and for providers that want buffers registered (EFA): a
//! registration belongs to one domain, and every rail is its own domain.
//!
//! With the *caller's rail* (`ClientConfig::caller_rail`, the default;
//! TALLY_CALLER_RAIL=0 turns it off) the caller's thread drives rail 0's
//! endpoint itself, as with one rail, and only rails 1.. get a thread: its polls
//! read that CQ before the others' rings, its waits sleep on that CQ's
//! descriptor and the bell together, and it copies the staged results
//! received there ([`Rails::copies_results`] is per rail). Why: with every
//! rail a thread, a caller that sleeps between completions is woken for
//! nearly every piece (nvidia-h200-x2, 4 + 4 hosts at 16 Gbit/s, two rails:
//! the ranks' own threads switched out about 16,000 times a second each),
//! and each rail's empty turns and sleeps come on top; the caller's own
//! endpoint turns those waits into work. On that host agg's workers spent
//! 10-20% less CPU per GB at 16 Gbit/s (0.75-0.91 s/GB against 0.84-1.04)
//! and reached more of 32 (0.87-0.98 against 0.78-0.99); the plugin reached
//! 0.70-0.99 of 32 Gbit/s against 0.56-0.79, and real NCCL held CollNet at
//! 0.99 with about one core of the machine fewer busy. The library's client
//! first kept a thread for every rail, because agg lost a fifth of the link
//! with it on 8 + 8 hosts (0.70 against 0.85); that loss was `tally bench
//! cluster`'s one send credit per server, which no client ran by default
//! (its `send_credits` is 0): each server's next piece waited for the last
//! one's send to complete, and through the caller's loop that wait was long
//! (the slowest pieces' round trips 8.3-8.8 ms on rail 1 against 4.6-5.0 on
//! rail 0, neither thread past 72% of a core). With the client's own credits
//! the caller's rail held 8 + 8 (0.90-0.98) and brought the workers' CPU on
//! 4 + 4 hosts at 16 Gbit/s to about the ring's (run by run 0.90-1.14 of it,
//! against 0.98-1.28 with a thread a rail, at the same rate), so it is every
//! client's default. A caller that
//! starts an all-reduce and then does other work moves rail 0 only when it
//! tests or waits, as a one-rail client always did; TALLY_CALLER_RAIL=0
//! keeps every rail moving on its own thread
//! ([measurements](docs/measurements.md), "The caller's rail", "The
//! caller's rail for every client").
//!
//! shm's calls take spinlocks in memory shared with other processes, and a
//! peer killed while holding one leaves the caller spinning inside the call
//! for ever (libfabric 1.17 to today's; a rank once spun for 45 minutes).
//! Its one endpoint is driven by the caller's thread all the same: on a rail
//! thread every small all-reduce paid the hop there and back (4 KiB agg p50
//! 7.0-7.5 us against 4.3-4.9, 2 ranks, nvidia-h200-x2; 1.7 round trips on
//! a 16-core host). A stuck call then ends the process, with the client's
//! watchdog naming the call (`watchdog::OnStuck::Exit`): the rank exits
//! instead of hanging. With `TALLY_SHM_RAIL=1` ([`wants_rail_threads`]) the
//! endpoint runs on a rail thread instead: a stuck call then costs that
//! thread, the watchdog turns it into an error naming the call, and the
//! client *abandons* the rail ([`Rails::abandon`]): nothing waits on it
//! again, no buffer is handed to it, and should the call ever return, the
//! rail makes no other provider call (with manual progress, no byte moves
//! into a buffer the caller took back) and leaves its endpoint unclosed.
//!
//! With failover on and `ClientConfig::copier` (`TALLY_COPIER=1`; off by
//! default, `copier.rs` says why), a client with rails also runs the
//! *copier*: one thread that copies staged results into the caller's
//! buffers for every rail, so that the copy is off the rails' path; a rail
//! hands it each result as it completes and takes the completion back.
//!
//! Control operations (adding a peer, canceling everything) go to the rail
//! thread as commands too, and the client waits for their answer: they
//! happen at joins, recoveries and stops, never per chunk.
use crate::dataplane::fabric::call_watch::CallWatch;
use crate::dataplane::fabric::{
    Completion, CompletionError, Endpoint, EndpointName, FabricError, MemoryHandle, PeerAddr, PendingSends, PollError, PostError,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod copier;
mod count;
mod idle;
mod queue;
mod rail_loop;
pub(super) mod stream_copy;
mod threads;
use count::lanes;
pub use count::{
    auto_rails, calls_may_spin_forever, plugin_rail_gbits, resolve_rails, shm_rail, wants_rail_threads, AUTO_MIN_RAILS, MAX_RAILS,
    NCCL_RAIL_GBITS, RAIL_GBITS,
};
use queue::{ask, queue, Bell, Cmd, Event, Reply, Shared};
pub use threads::RailThreads;
use threads::{Rail, Threads};

enum Mode {
    /// One endpoint, driven by the caller's thread.
    Direct(Endpoint),
    /// One endpoint per rail, each driven by its own thread (the first by
    /// the caller's thread where `own` holds it: the caller's rail), and
    /// maybe the copier's thread.
    Threaded { own: Option<Endpoint>, rails: Threads, owner: Arc<Bell>, held: Option<Event>, next: usize },
}

/// Who drives rail `r` in threaded mode: the caller (its own endpoint) or a
/// rail thread (through its rings).
enum Driver<'a> {
    Own(&'a mut Endpoint),
    Thread(&'a Shared),
}

/// Rail `r`'s driver: with the caller's rail, rail 0 is the caller's own
/// and rail `r` the thread `r - 1`.
#[inline]
fn driver<'a>(own: &'a mut Option<Endpoint>, rails: &'a [Rail], r: usize) -> Driver<'a> {
    match own {
        Some(ep) if r == 0 => Driver::Own(ep),
        Some(_) => Driver::Thread(&rails[r - 1].shared),
        None => Driver::Thread(&rails[r].shared),
    }
}

/// The client's endpoints: one driven by the caller, or one per rail thread.
pub struct Rails {
    mode: Mode,
    /// The servers the rails serve (see [`lanes`]).
    servers: usize,
    names: Vec<EndpointName>,
    provider: String,
    needs_local_mr: bool,
    in_order_sends: bool,
    inject_size: usize,
    /// Per endpoint: which provider call its driver is inside (for the
    /// client's watchdog, `client::watchdog`).
    watches: Vec<Arc<CallWatch>>,
    /// Fault injection for one endpoint on the caller's thread: when its
    /// next send blocks for good, as inside `fi_tsend`
    /// (`TALLY_FAULT_RAIL_STALL=0@SECONDS`). None in real use.
    caller_stall: Option<std::time::Instant>,
}

impl Rails {
    /// One endpoint on the caller's thread.
    pub fn direct(ep: Endpoint) -> Result<Rails, FabricError> {
        let name = ep.name()?;
        Ok(Rails {
            servers: 1,
            names: vec![name],
            provider: ep.provider().to_string(),
            needs_local_mr: ep.needs_local_mr(),
            in_order_sends: ep.in_order_sends(),
            inject_size: ep.inject_size(),
            watches: vec![ep.call_watch()],
            caller_stall: crate::host::fault::stall_at("TALLY_FAULT_RAIL_STALL", 0),
            mode: Mode::Direct(ep),
        })
    }

    /// Fault injection: blocks the caller's thread for good with the
    /// endpoint's watch showing a send in progress, as a send spinning on a
    /// dead peer's lock would, once `caller_stall` is due.
    #[cold]
    fn stall_caller(ep: &Endpoint) -> ! {
        log::warn!("fault injection (TALLY_FAULT_RAIL_STALL): the caller's thread blocks for good, as inside fi_tsend");
        ep.call_watch().enter(crate::dataplane::fabric::call_watch::Call::Send);
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }

    /// One endpoint per rail, a thread each but the caller's rail, as
    /// `threads` says ([`RailThreads`]). Needs providers that want no local
    /// registrations.
    pub fn threaded(eps: Vec<Endpoint>, threads: &RailThreads) -> Result<Rails, FabricError> {
        let provider = eps.first().map_or_else(String::new, |e| e.provider().to_string());
        let in_order_sends = eps.iter().any(|e| e.in_order_sends());
        let watches = eps.iter().map(|e| e.call_watch()).collect();
        let s = threads::start(eps, threads)?;
        Ok(Rails {
            servers: 1,
            names: s.names,
            provider,
            needs_local_mr: false,
            in_order_sends,
            // Inject copies at the call; a queued send may be posted later.
            inject_size: 0,
            watches,
            caller_stall: s.own.as_ref().and_then(|_| crate::host::fault::stall_at("TALLY_FAULT_RAIL_STALL", 0)),
            mode: Mode::Threaded { own: s.own, rails: s.threads, owner: s.owner, held: None, next: 0 },
        })
    }

    /// Staged results the rail threads and the copier copied out, and the
    /// ns those copies took (zero unless they were asked to time them).
    pub fn copy_times(&self) -> (u64, u64) {
        match &self.mode {
            Mode::Direct(_) => (0, 0),
            Mode::Threaded { rails, .. } => {
                let own =
                    rails.copier.as_ref().map_or((0, 0), |(c, _)| (c.copies.load(Ordering::Relaxed), c.copy_ns.load(Ordering::Relaxed)));
                rails
                    .iter()
                    .fold(own, |(n, ns), r| (n + r.shared.copies.load(Ordering::Relaxed), ns + r.shared.copy_ns.load(Ordering::Relaxed)))
            }
        }
    }

    /// Whether a copier thread copies the staged results out (see `copier`).
    pub fn has_copier(&self) -> bool {
        matches!(&self.mode, Mode::Threaded { rails, .. } if rails.copier.is_some())
    }

    /// Staged results the copier copied out (counted only where timed, as
    /// [`Rails::copy_times`]); None without a copier.
    pub fn copier_copies(&self) -> Option<u64> {
        match &self.mode {
            Mode::Threaded { rails, .. } => rails.copier.as_ref().map(|(c, _)| c.copies.load(Ordering::Relaxed)),
            Mode::Direct(_) => None,
        }
    }

    /// The share of their turns' time (spinning included, sleep not) that
    /// the rail threads spent in turns that moved something: the mean over
    /// the rails and the busiest rail's (None with one endpoint, or where
    /// the rails were not asked to time their turns). A rail near 1 had no
    /// spare turn: whatever it does per piece is then on every piece's path.
    pub fn busy_shares(&self) -> Option<(f64, f64)> {
        let Mode::Threaded { rails, .. } = &self.mode else { return None };
        let (n, sum, max) = rails
            .iter()
            .filter_map(|r| {
                let (turn, busy) = (r.shared.turn_ns.load(Ordering::Relaxed), r.shared.busy_ns.load(Ordering::Relaxed));
                (turn > 0).then(|| busy as f64 / turn as f64)
            })
            .fold((0usize, 0.0, 0.0f64), |(n, sum, max), share| (n + 1, sum + share, max.max(share)));
        (n > 0).then(|| (sum / n as f64, max))
    }

    /// Per endpoint, which provider call its driver is inside.
    pub fn call_watches(&self) -> &[Arc<CallWatch>] {
        &self.watches
    }

    /// Whether the caller's thread drives rail 0 itself beside rail threads
    /// (the caller's rail).
    pub fn callers_rail(&self) -> bool {
        matches!(self.mode, Mode::Threaded { own: Some(_), .. })
    }

    /// Whether rail threads drive the endpoints (else the caller's thread does).
    pub fn has_threads(&self) -> bool {
        matches!(self.mode, Mode::Threaded { .. })
    }

    /// Gives rail `r` up: its thread is stuck inside a provider call (the
    /// watchdog's report). From now on operations for it fail at once, the
    /// cancels skip it, and dropping the rails leaves its thread behind
    /// rather than wait for it (see the module's doc).
    /// The caller's rail has no thread to give up: a call stuck there holds
    /// the caller itself, and the watchdog's report is all there is.
    pub fn abandon(&mut self, r: usize) {
        if let Mode::Threaded { own, rails, .. } = &mut self.mode {
            if let Driver::Thread(rail) = driver(own, rails, r) {
                if !rail.abandoned.swap(true, Ordering::SeqCst) {
                    log::error!("rail {r} is abandoned: its thread is stuck inside a provider call");
                }
                rail.stop.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Number of rails.
    pub fn count(&self) -> usize {
        self.names.len()
    }

    /// Spreads the rails over `servers` servers (see [`lanes`]).
    pub fn serve(mut self, servers: usize) -> Rails {
        self.servers = servers.max(1);
        self
    }

    /// The rails that carry server `si`'s streams (its lanes, in order).
    pub fn lanes(&self, si: usize) -> impl Iterator<Item = usize> {
        lanes(self.names.len(), self.servers, si)
    }

    /// The rail that carries the stream to lcore `k` of server `si`: its
    /// lane `k mod lanes`, as the server's lcore `k` uses the name of.
    pub fn rail_for(&self, si: usize, k: usize) -> usize {
        let n = self.lanes(si).count();
        self.lanes(si).nth(k % n).expect("a server has at least one lane")
    }

    /// The address of rail `r` (what the Hello to its servers names).
    pub fn name(&self, r: usize) -> &EndpointName {
        &self.names[r]
    }

    pub fn provider(&self) -> &str {
        &self.provider
    }

    pub fn needs_local_mr(&self) -> bool {
        self.needs_local_mr
    }

    pub fn in_order_sends(&self) -> bool {
        self.in_order_sends
    }

    pub fn inject_size(&self) -> usize {
        self.inject_size
    }

    /// Adds a peer to rail `r`'s address vector.
    pub fn insert_peer(&mut self, r: usize, name: &EndpointName) -> Result<PeerAddr, FabricError> {
        match &mut self.mode {
            Mode::Direct(ep) => ep.insert_peer(name),
            Mode::Threaded { own, rails, .. } => match driver(own, rails, r) {
                Driver::Own(ep) => ep.insert_peer(name),
                Driver::Thread(sh) => match ask(sh, Cmd::InsertPeer(Box::new(name.clone())))? {
                    Reply::Peer(r) => r,
                    _ => Err(FabricError { call: "rail: fi_av_insert", code: libc::EPROTO }),
                },
            },
        }
    }

    /// Registers memory (direct mode only: rails are chosen only where the
    /// provider wants no registration).
    ///
    /// # Safety
    /// As [`Endpoint::register`].
    pub unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<MemoryHandle, FabricError> {
        match &mut self.mode {
            // SAFETY: the caller's promise, passed on.
            Mode::Direct(ep) => unsafe { ep.register(addr, len) },
            Mode::Threaded { .. } => {
                Err(FabricError { call: "fi_mr_reg (rails need a provider without local registration)", code: libc::ENOTSUP })
            }
        }
    }

    pub fn deregister(&mut self, mh: MemoryHandle) -> Result<(), FabricError> {
        match &mut self.mode {
            Mode::Direct(ep) => ep.deregister(mh),
            Mode::Threaded { .. } => Ok(()),
        }
    }

    /// Posts a tagged send on rail `r`.
    ///
    /// # Safety
    /// As [`Endpoint::send`].
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn send(
        &mut self,
        r: usize,
        buf: *const u8,
        len: usize,
        mh: Option<MemoryHandle>,
        dest: PeerAddr,
        tag: u64,
        ctx: u32,
    ) -> Result<(), PostError> {
        match &mut self.mode {
            Mode::Direct(ep) if self.caller_stall.is_some_and(|t| std::time::Instant::now() >= t) => Self::stall_caller(ep),
            // SAFETY: the caller's promise, passed on.
            Mode::Direct(ep) => unsafe { ep.send(buf, len, mh, dest, tag, ctx) },
            Mode::Threaded { own, rails, .. } => match driver(own, rails, r) {
                Driver::Own(ep) if self.caller_stall.is_some_and(|t| std::time::Instant::now() >= t) => Self::stall_caller(ep),
                // SAFETY: the caller's promise, passed on.
                Driver::Own(ep) => unsafe { ep.send(buf, len, mh, dest, tag, ctx) },
                Driver::Thread(sh) => queue(sh, Cmd::Send { buf, len, dest, tag, ctx }),
            },
        }
    }

    /// Whether a [`Rails::recv`] on rail `r` with `copy_to` copies the result
    /// itself (a rail thread) or leaves the copy to the caller (an endpoint
    /// the caller's thread drives: one rail, or the caller's rail).
    pub fn copies_results(&self, r: usize) -> bool {
        match &self.mode {
            Mode::Direct(_) => false,
            Mode::Threaded { own, .. } => own.is_none() || r > 0,
        }
    }

    /// Posts a tagged receive on rail `r`. With `copy_to`, a rail thread
    /// copies the bytes received there once the receive completes, before it
    /// hands the completion back (failover's staged results, see
    /// [`Cmd::RecvCopy`]); with one endpoint on the caller's thread it is a
    /// plain receive and the caller copies ([`Rails::copies_results`]).
    ///
    /// # Safety
    /// As [`Endpoint::recv`]; and `copy_to` must hold `len` bytes, written
    /// by no one else, until the completion is handed back.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn recv(
        &mut self,
        r: usize,
        buf: *mut u8,
        len: usize,
        mh: Option<MemoryHandle>,
        src: Option<PeerAddr>,
        (tag, ignore): (u64, u64),
        ctx: u32,
        copy_to: Option<*mut u8>,
    ) -> Result<(), PostError> {
        match &mut self.mode {
            // SAFETY: the caller's promise, passed on.
            Mode::Direct(ep) => unsafe { ep.recv(buf, len, mh, src, tag, ignore, ctx) },
            Mode::Threaded { own, rails, .. } => match (driver(own, rails, r), copy_to) {
                // SAFETY: the caller's promise, passed on.
                (Driver::Own(ep), _) => unsafe { ep.recv(buf, len, mh, src, tag, ignore, ctx) },
                (Driver::Thread(sh), None) => queue(sh, Cmd::Recv { buf, len, src, tag, ignore, ctx }),
                (Driver::Thread(sh), Some(to)) => queue(sh, Cmd::RecvCopy { buf, len, src, tag, ctx, to }),
            },
        }
    }

    /// Whether the rails' endpoints can look at and discard their
    /// unexpected messages (`client::sweep`).
    pub fn can_sweep(&self) -> bool {
        crate::dataplane::fabric::provider_can_sweep(&self.provider)
    }

    /// Asks rail `r` for its oldest unexpected message's tag, as a
    /// completion of `ctx` (`Endpoint::peek_unexpected`).
    pub fn peek_unexpected(&mut self, r: usize, ctx: u32) -> Result<(), PostError> {
        match &mut self.mode {
            Mode::Direct(ep) => ep.peek_unexpected(ctx),
            Mode::Threaded { own, rails, .. } => match driver(own, rails, r) {
                Driver::Own(ep) => ep.peek_unexpected(ctx),
                Driver::Thread(sh) => queue(sh, Cmd::Peek { ctx }),
            },
        }
    }

    /// Discards rail `r`'s oldest unexpected message of `tag`, as a
    /// completion of `ctx` (`Endpoint::discard_unexpected`).
    pub fn discard_unexpected(&mut self, r: usize, tag: u64, ctx: u32) -> Result<(), PostError> {
        match &mut self.mode {
            Mode::Direct(ep) => ep.discard_unexpected(tag, ctx),
            Mode::Threaded { own, rails, .. } => match driver(own, rails, r) {
                Driver::Own(ep) => ep.discard_unexpected(tag, ctx),
                Driver::Thread(sh) => queue(sh, Cmd::Discard { tag, ctx }),
            },
        }
    }

    /// The next completion of the sweep's peeks and discards on rail `r`
    /// (rail threads hold them apart, see `Shared::sweep`); None for an
    /// endpoint on the caller's thread, whose [`Rails::poll`] returns them.
    pub fn take_sweep_event(&mut self, r: usize) -> Option<Result<Completion, Box<CompletionError>>> {
        match &mut self.mode {
            Mode::Direct(_) => None,
            Mode::Threaded { own, rails, .. } => match rails.get(if own.is_some() { r.checked_sub(1)? } else { r })?.shared.sweep.pop()? {
                Event::Done(c) => Some(Ok(c)),
                Event::Failed(e) => Some(Err(e)),
                Event::Broken(e) => Some(Err(Box::new(CompletionError::refused(u32::MAX, e.code, &e.to_string())))),
            },
        }
    }

    /// Sends a small message by inject (direct mode only: [`Rails::inject_size`] is 0 otherwise).
    ///
    /// # Safety
    /// As [`Endpoint::inject`].
    #[inline]
    pub unsafe fn inject(&mut self, buf: *const u8, len: usize, dest: PeerAddr, tag: u64) -> Result<(), PostError> {
        match &mut self.mode {
            Mode::Direct(ep) if self.caller_stall.is_some_and(|t| std::time::Instant::now() >= t) => Self::stall_caller(ep),
            // SAFETY: the caller's promise, passed on.
            Mode::Direct(ep) => unsafe { ep.inject(buf, len, dest, tag) },
            Mode::Threaded { .. } => Err(PostError::Fabric(FabricError { call: "fi_tinject (not on rails)", code: libc::ENOTSUP })),
        }
    }

    /// Completions so far, from every rail.
    // As Endpoint::poll, the error carries its text in place.
    #[allow(clippy::result_large_err)]
    #[inline]
    pub fn poll(&mut self, out: &mut [Completion]) -> Result<usize, PollError> {
        let (own, rails, held, next) = match &mut self.mode {
            Mode::Direct(ep) => return ep.poll(out),
            Mode::Threaded { own, rails, held, next, .. } => (own, rails, held, next),
        };
        let mut n = 0;
        if let Some(e) = held.take() {
            match e {
                Event::Done(c) => {
                    out[0] = c;
                    n = 1;
                }
                Event::Failed(e) => return Err(PollError::Completion(*e)),
                Event::Broken(e) => return Err(PollError::Fabric(e)),
            }
        }
        // The caller's rail first: polling it is what moves its bytes (its
        // sweep's completions come with the rest, told by their contexts).
        if let Some(ep) = own {
            match ep.poll(&mut out[n..]) {
                Ok(k) => n += k,
                Err(e) if n == 0 => return Err(e),
                Err(PollError::Completion(e)) => {
                    *held = Some(Event::Failed(Box::new(e)));
                    return Ok(n);
                }
                Err(PollError::Fabric(e)) => {
                    *held = Some(Event::Broken(e));
                    return Ok(n);
                }
            }
        }
        // Round robin over the rails, so that none is starved by a busy one.
        let start = *next;
        *next = (start + 1) % rails.len();
        for k in 0..rails.len() {
            let sh = &rails[(start + k) % rails.len()].shared;
            while n < out.len() {
                match sh.events.pop() {
                    Some(Event::Done(c)) => {
                        out[n] = c;
                        n += 1;
                    }
                    Some(e) if n > 0 => {
                        // Hand back what came first; the error is next.
                        *held = Some(e);
                        return Ok(n);
                    }
                    Some(Event::Failed(e)) => return Err(PollError::Completion(*e)),
                    Some(Event::Broken(e)) => return Err(PollError::Fabric(e)),
                    None => break,
                }
            }
        }
        if n == 0 {
            // Nothing else came: the sweep's completions, which the
            // client tells by their context ids (`client::sweep`).
            for r in rails.iter() {
                while n < out.len() {
                    match r.shared.sweep.pop() {
                        Some(Event::Done(c)) => {
                            out[n] = c;
                            n += 1;
                        }
                        Some(Event::Failed(e)) if n > 0 => {
                            *held = Some(Event::Failed(e));
                            return Ok(n);
                        }
                        Some(Event::Failed(e)) => return Err(PollError::Completion(*e)),
                        Some(Event::Broken(_)) => {}
                        None => break,
                    }
                }
            }
        }
        Ok(n)
    }

    /// Sleeps until a completion may be ready or `timeout_ms` passes.
    pub fn wait(&mut self, timeout_ms: i32) -> Result<(), FabricError> {
        match &mut self.mode {
            Mode::Direct(ep) => ep.wait(timeout_ms),
            Mode::Threaded { own, rails, owner, held, .. } => {
                owner.sleeping.store(true, Ordering::SeqCst);
                let mut slept = Ok(());
                // Checked after the flag is up: a rail that queued before it
                // saw the flag down, one that queues after it rings.
                if held.is_none() && rails.iter().all(|r| r.shared.events.is_empty()) {
                    match own {
                        // The caller's rail: its CQ's traffic or the bell.
                        Some(ep) => slept = ep.wait_also(Some(owner.fd), timeout_ms),
                        None => {
                            let mut pfd = libc::pollfd { fd: owner.fd, events: libc::POLLIN, revents: 0 };
                            // SAFETY: one valid pollfd on our eventfd.
                            unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
                        }
                    }
                }
                owner.sleeping.store(false, Ordering::SeqCst);
                owner.drain();
                slept
            }
        }
    }

    /// Asks the provider to cancel one operation on rail `r`. On a rail
    /// thread, returns once the rail took the request: from then on it
    /// copies nothing for that operation (the caller may be about to hand
    /// the operation's buffer back).
    pub fn cancel(&mut self, r: usize, ctx: u32) {
        match &mut self.mode {
            Mode::Direct(ep) => ep.cancel(ctx),
            Mode::Threaded { own, rails, .. } => match driver(own, rails, r) {
                Driver::Own(ep) => ep.cancel(ctx),
                Driver::Thread(sh) if sh.abandoned.load(Ordering::Relaxed) => {}
                Driver::Thread(sh) => {
                    if let Err(e) = ask(sh, Cmd::Cancel(ctx)) {
                        log::warn!("rail {r}: {e}");
                    }
                }
            },
        }
    }

    /// Cancels every operation on every rail and drains their completions
    /// (bounded), so that no buffer is the provider's any more.
    pub fn cancel_all(&mut self) {
        match &mut self.mode {
            Mode::Direct(ep) => ep.cancel_all(),
            Mode::Threaded { own, rails, held, .. } => {
                if let Some(ep) = own {
                    ep.cancel_all();
                }
                for r in rails.iter().filter(|r| !r.shared.abandoned.load(Ordering::Relaxed)) {
                    if let Err(e) = ask(&r.shared, Cmd::CancelAll) {
                        log::warn!("rail: {e}");
                    }
                }
                *held = None;
                for r in rails.iter() {
                    while r.shared.events.pop().is_some() {}
                }
            }
        }
    }

    /// `Endpoint::settle` on rail `r`: how many of the operations `ctxs`
    /// last named may still complete (on a rail thread, plus one while
    /// completions are still on their way here, one of which may name them;
    /// an abandoned rail never settles). With [`PendingSends::Ignore`] only
    /// the receives the provider still holds count: the caller wants their
    /// buffers back, not the contexts, and a completion on its way writes
    /// nothing more (on a busy rail some always are: counting them, a lost
    /// stream's slots at 16 Gbit/s were never handed over). Rare: when a
    /// server is taken back, never per chunk.
    pub fn settle(&mut self, r: usize, ctxs: std::ops::Range<u32>, sends: PendingSends) -> u32 {
        let on_the_way = |held: bool| u32::from(held && sends != PendingSends::Ignore);
        match &mut self.mode {
            Mode::Direct(ep) => ep.settle(ctxs, sends),
            Mode::Threaded { own, rails, held, .. } => {
                let held = held.is_some();
                match driver(own, rails, r) {
                    Driver::Own(ep) => ep.settle(ctxs, sends) + on_the_way(held),
                    Driver::Thread(sh) if sh.abandoned.load(Ordering::Relaxed) => u32::MAX,
                    Driver::Thread(sh) => match ask(sh, Cmd::Settle(ctxs, sends)) {
                        Ok(Reply::Count(n)) => n + on_the_way(held),
                        Ok(_) => u32::MAX,
                        Err(e) => {
                            log::warn!("rail {r}: {e}");
                            u32::MAX
                        }
                    },
                }
            }
        }
    }
}
