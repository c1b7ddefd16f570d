//! A rail thread's loop: the steady state of one rail (the client opened
//! its endpoint; [`RailLoop::run`] ends it). Per turn: take the commands the
//! client queued (data operations in order behind any that met EAGAIN;
//! control commands at once), post what waits, read the completion queue,
//! copy staged results out where asked (`Cmd::RecvCopy`; or hand them to
//! the copier, see `copier`, and take them back) and hand the completions
//! back. Nothing here allocates, locks or logs per operation.
//!
//! # Rails: why, lanes, the copy of staged results, how many
//!
//! Over tcp the kernel copies every byte a worker moves (rxm copies an eager message once more) on
//! the thread that drives the endpoint's progress, and one thread's endpoint tops out near 2-2.7 GB/s
//! each way: short of a 16 Gbit/s link (2 GB/s each way), let alone 32 ([measurements,
//! "Rails"](docs/measurements.md#rails)). So a client of several servers runs *rails*: one endpoint
//! per rail, each its own fabric and domain and its own thread, while the client's logic stays on the
//! caller's thread (`Rails` has the endpoint's calls, `send`, `recv`, `poll`, `wait`, `cancel`,
//! `insert_peer`, with a rail index). The module doc of `engine/src/client/rails.rs` is the long
//! version (with *lanes*: where rails outnumber servers, lcore `k` of a server talks to its lane
//! `k mod lanes`), `rails/rail_loop.rs` the thread's loop, and `engine/src/wire/join.rs` how a Hello
//! names the lanes. Besides: each stream keeps its rail (`Stream::rail`); every Hello a server
//! receives names the rank's lanes (redo and rejoin Hellos too), and lcore `k` of the job inserts
//! name `k mod lanes` (`control/join.rs`, `admit`); refused by a server from before lanes, the
//! client's error says to upgrade it or lower `TALLY_RAILS`.
//!
//! With failover on, the rail that received a staged result copies it into the caller's buffer
//! before handing the completion back (`Rails::recv` with `copy_to`), with streaming stores
//! (`rails/stream_copy.rs`; `TALLY_STAGE_COPY=plain` for ordinary ones). With `TALLY_COPIER=1` the
//! *copier* does it instead: one more thread per client (`rails/copier.rs`) to which the rail hands
//! the result, and which hands the completion back to that rail, so that only rails talk to the
//! client and a cancel is answered only once the rail's jobs are back. On the plugin's path, where
//! nearly every piece is staged, the copy on the rail's own thread (2.2-2.9 µs per 32 KiB piece, as they were) looked
//! like the whole of what failover cost the rails, busy in 74-91% of their turns at 32 Gbit/s; the
//! copier took that gap away on one host and cost real NCCL 10% at 16 MiB on another, so it is off
//! by default ([The copier](docs/measurements.md#the-copier-2026-11-27-a-fifth-session)).
//! `TALLY_RAIL_CORES` pins it to the core after the rails'. In place (the output is the
//! input) the caller's thread still copies, once it has seen the result, since a recovery may send
//! the input again. The staging blocks are touched at the join (`client/stage.rs`, `prefault`).
//! What the copy costs, and what was tried against it: [measurements](docs/measurements.md#rails).
//!
//! `ClientConfig::rails` (`TALLY_RAILS`): 0, the default, is `rails::auto_rails`: over tcp, for jobs
//! of two or more servers on hosts of 8 or more cores (as the thread that connects sees them), as
//! few rails as carry the rank's link where `ClientConfig::link_gbits` (`TALLY_LINK_GBITS`) gives
//! it (`rails::auto_rails`: `RAIL_GBITS` each, 1 at 8 Gbit/s, 2 at 16 and 4 at
//! 32; the plugin's `plugin_rail_gbits`: with the caller's rail, its default, 2 at 8 and 16 and 4 at 32, else 2 at 8 and 4 from 16), else one rail per server but at least 4
//! (`AUTO_MIN_RAILS`: two servers get two lanes each) and at most 8; else 1, which is no thread: the caller's thread drives one endpoint (EFA, whose registrations
//! belong to one domain; one server; small hosts; the 2-core CI). A job on one server gets one rail
//! unless `TALLY_RAILS` asks for more, which keeps its small operations on the caller's thread. shm's
//! one endpoint is the caller's too: its calls can spin for ever on a lock a dead peer held (once a
//! rank spun 45 minutes, once a CI run hung), and the watchdog then ends the process naming the call
//! ("Failure detection"); `TALLY_SHM_RAIL=1` puts it on a rail thread instead (`rails::wants_rail_threads`),
//! which turns that into the all-reduce's error at the cost of a thread hop each way on every
//! operation (4 KiB agg, 2 ranks, busy, 16-core device: p50 5.37 us = 1.24 round trips on the
//! caller's thread, 7.34 us = 1.55 on a rail thread). With rails no message goes by inject (a queued send may be posted after the
//! caller's buffer changed). Each rail costs a thread and an rxm endpoint (rxm's pools: 50-85 MB);
//! `TALLY_RAIL_CORES` pins them (and the copier), and `tally bench allreduce --cores` gives each rank a
//! block of cores, its own, its rails', then its copier's (if it runs one) where every rank's block fits.
//!
//! Rails took 4 hosts from 0.63-0.64 of the link bound to 0.99 at 16 Gbit/s. NCCL's two channels per
//! node held 16 MiB back at 32 Gbit/s, so the plugin sets `NCCL_MIN_NCHANNELS=4` when CollNet servers
//! are configured and the user set nothing (`device::COLLNET_NCCL_DEFAULTS`,
//! `ffi-plugin/src/device.rs`). The runs (32 Gbit/s, lanes, real NCCL), the CPU per GB, and why
//! libfabric 1.17 stays what `make deps`, the image and the tarballs use: [measurements,
//! "Rails"](docs/measurements.md#rails).
use super::idle::{EmptyTurns, QUIET_SLEEP_MS};
use super::queue::{Cmd, CopyJob, Event, Reply, Shared, LANE, RING};
use crate::dataplane::fabric::call_watch::Call;
use crate::dataplane::fabric::{Completion, CompletionError, Endpoint, FabricError, PendingSends, PollError, PostError};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One rail thread's state.
pub(super) struct RailLoop {
    ep: Endpoint,
    sh: Arc<Shared>,
    spin_polls: u32,
    sleep_ms: u32,
    /// Data operations taken from the ring and not posted yet (EAGAIN), in order.
    waiting: VecDeque<Cmd>,
    /// Events the full ring did not take yet, in order.
    unsent: VecDeque<Event>,
    batch: [Completion; 32],
    /// Per context id: where a [`Cmd::RecvCopy`] in flight copies its bytes
    /// from and to (null: a plain operation).
    copies: Box<[(*mut u8, *mut u8)]>,
    /// Copy with streaming stores (`stream_copy`).
    stream_copy: bool,
    /// Jobs handed to the copier and not back yet (at most [`LANE`]).
    out: usize,
    /// Time each copy out and each turn (`TALLY_PIECE_TIMES`), into
    /// `Shared::copies`/`copy_ns` and `Shared::turn_ns`/`busy_ns`.
    timed: bool,
    copied: u64,
    copied_ns: u64,
    turn_ns: u64,
    busy_ns: u64,
    /// Context ids from here on are the client's sweep's: their
    /// completions go to `Shared::sweep`.
    sweep_base: u32,
    /// Fault injection: when this rail's thread blocks for good as inside a
    /// provider call (`TALLY_FAULT_RAIL_STALL=RAIL@SECONDS`). None in real use.
    stall_at: Option<Instant>,
}

impl RailLoop {
    pub(super) fn new(
        rail: usize,
        ep: Endpoint,
        sh: Arc<Shared>,
        (spin_polls, sleep_ms): (u32, u32),
        contexts: usize,
        sweep_base: u32,
        timed: bool,
    ) -> RailLoop {
        RailLoop {
            sweep_base,
            stall_at: crate::host::fault::stall_at("TALLY_FAULT_RAIL_STALL", rail),
            copies: vec![(std::ptr::null_mut(), std::ptr::null_mut()); contexts].into_boxed_slice(),
            stream_copy: super::stream_copy::wanted(),
            out: 0,
            timed,
            copied: 0,
            copied_ns: 0,
            turn_ns: 0,
            busy_ns: 0,
            ep,
            sh,
            spin_polls,
            sleep_ms,
            waiting: VecDeque::with_capacity(RING),
            unsent: VecDeque::with_capacity(RING),
            batch: [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 32],
        }
    }

    /// Set-up is done by the client (the endpoint is open); this is the
    /// steady state, then the tear-down.
    pub(super) fn run(mut self) {
        let mut idle = EmptyTurns::new(self.spin_polls);
        while !self.sh.stop.load(Ordering::Relaxed) {
            if self.stall_at.is_some_and(|t| Instant::now() >= t) {
                self.stall();
            }
            let worked = if self.timed { self.timed_turn() } else { self.turn() };
            if idle.sleep_after(worked) {
                self.sleep(idle.quiet());
            }
        }
        if self.abandoned() {
            // Given up while stuck in a call that has now returned: no other
            // provider call (manual progress: no byte moves into a buffer the
            // client's caller took back), and no fi_close, which may block
            // the same way. The endpoint stays open until the process ends.
            log::warn!("an abandoned rail's provider call returned; its endpoint is left open");
            std::mem::forget(self.ep);
            return;
        }
        self.ep.cancel_all();
    }

    /// One turn: whether it moved anything.
    #[inline(always)]
    fn turn(&mut self) -> bool {
        self.take_commands() | self.post_waiting() | self.reap() | self.take_copied()
    }

    /// [`RailLoop::turn`], timed: two reads of the monotonic clock (the
    /// vDSO), against a turn of at least one poll of the provider.
    fn timed_turn(&mut self) -> bool {
        let began = Instant::now();
        let worked = self.turn();
        let ns = began.elapsed().as_nanos() as u64;
        self.turn_ns += ns;
        if worked {
            self.busy_ns += ns;
        }
        // Plain stores of this thread's own totals: the client only reads them.
        self.sh.turn_ns.store(self.turn_ns, Ordering::Relaxed);
        self.sh.busy_ns.store(self.busy_ns, Ordering::Relaxed);
        worked
    }

    /// Whether the client gave this rail up (it was stuck in a provider call).
    #[inline]
    fn abandoned(&self) -> bool {
        self.sh.abandoned.load(Ordering::Relaxed)
    }

    /// Fault injection: blocks for good with the endpoint's watch showing a
    /// send in progress, as a thread spinning inside `fi_tsend` on a lock
    /// that a dead peer held would.
    fn stall(&self) -> ! {
        log::warn!("fault injection (TALLY_FAULT_RAIL_STALL): a rail thread blocks for good, as inside fi_tsend");
        self.ep.call_watch().enter(Call::Send);
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    /// Runs control commands at once and moves data operations behind the waiting ones.
    fn take_commands(&mut self) -> bool {
        let mut any = false;
        while let Some(c) = self.sh.cmds.pop() {
            any = true;
            match c {
                Cmd::Cancel(ctx) => {
                    // Its result may be with the copier: back first.
                    self.wait_copier(false);
                    let before = self.waiting.len();
                    self.waiting.retain(
                        |w| !matches!(w, Cmd::Send { ctx: c, .. } | Cmd::Recv { ctx: c, .. } | Cmd::RecvCopy { ctx: c, .. } if *c == ctx),
                    );
                    if self.waiting.len() == before {
                        self.ep.cancel(ctx);
                    }
                    if let Some(c) = self.copies.get_mut(ctx as usize) {
                        *c = (std::ptr::null_mut(), std::ptr::null_mut());
                    }
                    let _ = self.sh.replies.push(Reply::Done);
                }
                Cmd::CancelAll => {
                    self.wait_copier(true);
                    self.waiting.clear();
                    self.copies.iter_mut().for_each(|c| *c = (std::ptr::null_mut(), std::ptr::null_mut()));
                    self.ep.cancel_all();
                    self.unsent.clear();
                    let _ = self.sh.replies.push(Reply::Done);
                }
                Cmd::InsertPeer(name) => {
                    let _ = self.sh.replies.push(Reply::Peer(self.ep.insert_peer(&name)));
                }
                Cmd::Settle(range, sends) => {
                    self.wait_copier(false);
                    let queued = |w: &Cmd| matches!(w, Cmd::Send { ctx, .. } | Cmd::Recv { ctx, .. } | Cmd::RecvCopy { ctx, .. } if range.contains(ctx));
                    self.waiting.retain(|w| !queued(w));
                    for c in range.clone() {
                        if let Some(c) = self.copies.get_mut(c as usize) {
                            *c = (std::ptr::null_mut(), std::ptr::null_mut());
                        }
                    }
                    let left = self.ep.settle(range, sends);
                    // Receives only: a completion on its way writes nothing more.
                    let on_the_way = u32::from(sends != PendingSends::Ignore && (!self.unsent.is_empty() || !self.sh.events.is_empty()));
                    let _ = self.sh.replies.push(Reply::Count(left + on_the_way));
                }
                data => {
                    self.waiting.push_back(data);
                    // Post as they come: the provider starts moving bytes
                    // while later commands are still being taken.
                    if self.waiting.len() == 1 {
                        self.post_waiting();
                    }
                }
            }
        }
        any
    }

    /// Posts waiting operations in order until the provider says EAGAIN.
    fn post_waiting(&mut self) -> bool {
        let mut any = false;
        while let Some(c) = self.waiting.front() {
            if self.abandoned() {
                break;
            }
            // SAFETY: the pointers come from the client, whose caller keeps
            // them valid until the operation's completion (Client::start).
            let r = unsafe {
                match *c {
                    Cmd::Send { buf, len, dest, tag, ctx } => self.ep.send(buf, len, None, dest, tag, ctx),
                    Cmd::Recv { buf, len, src, tag, ignore, ctx } => self.ep.recv(buf, len, None, src, tag, ignore, ctx),
                    Cmd::RecvCopy { buf, len, src, tag, ctx, to } => match self.copies.get_mut(ctx as usize) {
                        Some(c) => {
                            let r = self.ep.recv(buf, len, None, src, tag, 0, ctx);
                            if r.is_ok() {
                                *c = (buf, to);
                            }
                            r
                        }
                        None => Err(PostError::BadContext(ctx)),
                    },
                    Cmd::Peek { ctx } => self.ep.peek_unexpected(ctx),
                    Cmd::Discard { tag, ctx } => self.ep.discard_unexpected(tag, ctx),
                    _ => Ok(()),
                }
            };
            match r {
                Ok(()) => {
                    self.waiting.pop_front();
                    any = true;
                }
                Err(PostError::Again) => break,
                Err(e) if matches!(c, Cmd::Peek { .. } | Cmd::Discard { .. }) => {
                    // The client's sweep hears of it as the look's failure
                    // (and stops sweeping); nothing else is broken.
                    let (Cmd::Peek { ctx } | Cmd::Discard { ctx, .. }) = *c else { unreachable!() };
                    self.waiting.pop_front();
                    let _ = self.sh.sweep.push(Event::Failed(Box::new(CompletionError::refused(ctx, libc::EIO, &e.to_string()))));
                    any = true;
                }
                Err(e) => {
                    self.waiting.pop_front();
                    let fe = match e {
                        PostError::Fabric(f) => f,
                        _ => FabricError { call: "rail: posting an operation", code: libc::EINVAL },
                    };
                    self.push(Event::Broken(fe));
                    any = true;
                }
            }
        }
        any
    }

    /// Reads the CQ and hands completions to the client.
    fn reap(&mut self) -> bool {
        let mut any = self.flush();
        if self.abandoned() {
            return any;
        }
        match self.ep.poll(&mut self.batch) {
            Ok(0) => {}
            Ok(n) => {
                for i in 0..n {
                    let c = self.batch[i];
                    if c.context >= self.sweep_base {
                        // The client takes it at its next control check
                        // (its look stays out until then if the ring is full).
                        let _ = self.sh.sweep.push(Event::Done(c));
                        continue;
                    }
                    if c.is_recv && self.hand_to_copier(c) {
                        continue;
                    }
                    if c.is_recv {
                        self.land(c.context, c.len);
                    }
                    self.push(Event::Done(c));
                }
                any = true;
            }
            Err(PollError::Completion(e)) if e.context.is_some_and(|ctx| ctx >= self.sweep_base) => {
                let _ = self.sh.sweep.push(Event::Failed(Box::new(e)));
                any = true;
            }
            Err(PollError::Completion(e)) => {
                if let Some(c) = e.context.and_then(|ctx| self.copies.get_mut(ctx as usize)) {
                    *c = (std::ptr::null_mut(), std::ptr::null_mut());
                }
                self.push(Event::Failed(Box::new(e)));
                any = true;
            }
            Err(PollError::Fabric(e)) => {
                self.push(Event::Broken(e));
                any = true;
            }
        }
        if any {
            self.sh.owner.ring();
        }
        any
    }

    /// Copies a completed [`Cmd::RecvCopy`]'s bytes to where they go.
    #[inline]
    fn land(&mut self, ctx: u32, len: usize) {
        let Some(c) = self.copies.get_mut(ctx as usize) else { return };
        let (from, to) = std::mem::replace(c, (std::ptr::null_mut(), std::ptr::null_mut()));
        if !from.is_null() {
            let began = self.timed.then(Instant::now);
            // SAFETY: the receive into `from` completed with `len` bytes (at
            // most what was posted); `to` holds as many and is written by no
            // one else until this completion is handed back (Rails::recv's
            // contract); the two are distinct buffers (a staging slot and
            // the caller's).
            unsafe { super::stream_copy::copy(from, to, len, self.stream_copy) };
            if let Some(t) = began {
                // Plain stores of this thread's own totals: the client only reads them.
                self.copied += 1;
                self.copied_ns += t.elapsed().as_nanos() as u64;
                self.sh.copies.store(self.copied, Ordering::Relaxed);
                self.sh.copy_ns.store(self.copied_ns, Ordering::Relaxed);
            }
        }
    }

    /// Hands a completed [`Cmd::RecvCopy`] to the copier, if there is one
    /// with room: its completion comes back through [`RailLoop::take_copied`].
    #[inline]
    fn hand_to_copier(&mut self, c: Completion) -> bool {
        let Some(lane) = &self.sh.copy else { return false };
        let Some(slot) = self.copies.get_mut(c.context as usize) else { return false };
        if slot.0.is_null() || self.out >= LANE {
            return false;
        }
        let (from, to) = *slot;
        if lane.jobs.push(CopyJob { from, to, len: c.len, done: c }).is_err() {
            return false;
        }
        *slot = (std::ptr::null_mut(), std::ptr::null_mut());
        self.out += 1;
        lane.copier.bell.ring();
        true
    }

    /// Queues to the client the completions whose copies the copier made.
    #[inline]
    fn take_copied(&mut self) -> bool {
        let mut any = false;
        while let Some(c) = self.copied_back() {
            self.out -= 1;
            self.push(Event::Done(c));
            any = true;
        }
        if any {
            self.sh.owner.ring();
        }
        any
    }

    /// Waits until every job handed to the copier came back (a cancel must
    /// not return while a copy into the caller's buffer may still run), and
    /// queues their completions, or drops them with `discard` (`CancelAll`
    /// drops every completion not yet handed back).
    fn wait_copier(&mut self, discard: bool) {
        while self.out > 0 {
            match self.copied_back() {
                Some(c) => {
                    self.out -= 1;
                    if !discard {
                        self.push(Event::Done(c));
                    }
                }
                None => std::hint::spin_loop(),
            }
        }
    }

    /// One completion back from the copier, if any.
    #[inline]
    fn copied_back(&self) -> Option<Completion> {
        self.sh.copy.as_ref().and_then(|l| l.done.pop())
    }

    fn push(&mut self, e: Event) {
        if !self.unsent.is_empty() {
            self.unsent.push_back(e);
        } else if let Err(e) = self.sh.events.push(e) {
            self.unsent.push_back(e);
        }
    }

    fn flush(&mut self) -> bool {
        let mut any = false;
        while let Some(e) = self.unsent.pop_front() {
            if let Err(e) = self.sh.events.push(e) {
                self.unsent.push_front(e);
                break;
            }
            any = true;
        }
        any
    }

    /// Sleeps on the endpoint and the client's bell; a quiet rail (see
    /// `EmptyTurns`) with nothing in flight on the bell alone, longer.
    fn sleep(&mut self, quiet: bool) {
        let bell = &self.sh.bell;
        bell.sleeping.store(true, Ordering::SeqCst);
        let copied = self.sh.copy.as_ref().is_some_and(|l| !l.done.is_empty());
        if self.sh.cmds.is_empty() && self.waiting.is_empty() && self.unsent.is_empty() && !copied && !self.sh.stop.load(Ordering::SeqCst) {
            if quiet && self.ep.in_flight() == 0 {
                // Nothing can complete (no receive or send is posted, and a
                // message that comes waits for one either way): only a
                // command ends the sleep. Not the endpoint's nap, where it
                // has no descriptor (shm, efa): a quiet rail napping 50 us
                // at a time took 7% of a core.
                bell.wait(QUIET_SLEEP_MS.max(self.sleep_ms));
            } else {
                let _ = self.ep.wait_also(Some(bell.fd), self.sleep_ms.min(i32::MAX as u32) as i32);
            }
        }
        bell.sleeping.store(false, Ordering::SeqCst);
        bell.drain();
    }
}
