//! The client side of agg all-reduce: what a GPU worker (or the NCCL plugin)
//! runs to use tally servers.
//!
//! A [`Client`] connects to one or more servers for one job. An all-reduce
//! of `count` elements is cut into chunks of at most `chunk_elems` elements;
//! chunk `c` goes to stream `(first + c) mod S`, where the S streams are every
//! (server, lcore) pair the job uses, so each lcore gets its shard straight
//! from the client (no dispatcher on the server). They are in server-major
//! order (server 0's lcores, then server 1's), or with
//! [`ClientConfig::interleave`] lcore-major (lcore 0 of every server, then
//! lcore 1), where an all-reduce of fewer chunks than streams reaches every
//! server and rail rather than the first server's lcores. `first`, the stream of
//! chunk 0, is the stream after the previous all-reduce's last chunk: small
//! all-reduces (one chunk) rotate over every lcore of every server instead
//! of all landing on the first, so one lcore's sends and reposts for
//! operation k overlap with another lcore taking operation k+1. An
//! all-reduce smaller than S full
//! chunks is cut into smaller ones ([`op_chunk_bytes`]) so that it still
//! spreads over every server's link instead of queueing on the first few. Each stream keeps up to `window`
//! chunks in flight; a chunk is: post the receive for its result straight
//! into the output buffer, send the input piece, done when both complete.
//! All ranks cut identically, so chunk `c` of every rank meets in the same
//! server slot with the same sequence number.
//!
//! The job fixes one data type and op on the server. A client may use
//! several: the first all-reduce with a new (dtype, op) joins a sibling job
//! (its id derived from the job id, dtype and op). Like every collective,
//! that requires all ranks to issue the same calls in the same order.
//!
//! The parts, as a tree (each file imports only files below it; a type's
//! methods live in its own file, and `tools/tests/house_rules.rs` keeps
//! both):
//!
//! - this file: [`Client`], the API, and what hands one part's outcome to
//!   the next (`check_controls`, `recover`, `on_switch`, `plan`);
//! - `progress/`: the per-chunk path ([`Client::test`]'s work), one file
//!   per mode (inject, direct, staged, relay, pacing); `control.rs`: the
//!   control connections and drains; `failover/`: lost servers, recoveries,
//!   redo flights, rejoins, the staging areas; `join.rs`: joining a sub-job;
//! - `state.rs`: `Core` (what the parts share and are lent for each call)
//!   and the sub-jobs, streams, flights and operations; `handshake.rs`,
//!   `greet.rs`, `join_wait.rs`: a control connection's steps;
//! - `stage.rs`, `rails/`, `config.rs`, `liveness.rs`, `watchdog.rs`, `tcp_floor.rs`,
//!   `piece_times.rs`, `servers.rs`, `error.rs`: the leaves.
//!
//! Operations are asynchronous underneath ([`Client::start`] and
//! [`Client::test`], the form the NCCL plugin uses); [`Client::allreduce`]
//! is the blocking convenience.
use crate::dataplane::fabric::{select_provider, Endpoint, EndpointConfig, EndpointName, Hints, MemoryHandle};
use crate::reduce::{DataType, ReduceOp};
use crate::wire::{self, Kind};
use control::Control;
use failover::{Failover, Verdict};
use progress::{Progress, IDLE_CHECK_EVERY};
use rails::Rails;
use state::{Core, Flight, Op};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;
use sweep::Sweep;

mod config;
mod control;
mod error;
pub mod failover;
mod greet;
mod handshake;
mod join;
mod join_wait;
pub mod liveness;
pub mod piece_times;
mod progress;
pub mod rails;
pub mod servers;
mod stage;
mod state;
mod sweep;
pub mod tcp_floor;
pub mod watchdog;
pub use config::{
    auto_window, caller_rail_from_env, link_gbits_from_env, send_credits_from_env, ClientConfig, DEFAULT_LIVENESS_MS, MAX_MIN_PIECE,
    MIN_SPREAD_PIECE,
};
pub use error::ClientError;
pub use join::MAX_SUBJOBS;
pub use state::op_chunk_bytes;

/// Operations queued per client.
pub const MAX_OPS: usize = 64;

/// Stream places a sub-job's context table holds per server: one per lcore
/// of the server, and one more per lcore each time the server is taken
/// back as the same process (frozen or cut off: it keeps its lost places,
/// `failover::rejoin::take_back`). The places are shared by the job's
/// servers: at 256, 4 servers of 2 lcores are taken back about 500 times
/// in all before one is left out with a warning (at 64, about 120). The
/// table is zeroed memory, resident only where used: 4 servers at window
/// 4 reserve 4.5 MiB of address space per endpoint (8 sub-jobs x 2
/// contexts a slot x 72 bytes).
const STREAM_PLACES_PER_SERVER: u32 = 256;

/// An all-reduce handle from [`Client::start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request(u64);

pub struct Client {
    /// What the parts share: the settings, the endpoints, the sub-jobs, the
    /// operations in progress and the context ids they post under. First:
    /// the endpoints close their registrations before the staging areas
    /// (in `failover`) drop.
    core: Core,
    /// The per-chunk path's own state.
    progress: Progress,
    /// Every sub-job's failover: its staging area, lost servers, recovery,
    /// rejoins.
    failover: Failover,
    next_op: u64,
    registrations: Vec<(usize, usize, MemoryHandle)>,
    /// Reports a provider call that does not return (None: off).
    watchdog: Option<watchdog::Watchdog>,
    /// An operation failed or was aborted: this rank did not finish
    /// cleanly, so it must not say Bye (the servers then fail the job for
    /// the other ranks at once instead of counting this one as done).
    failed: bool,
    /// `ClientConfig::fault_late_news`: a later sub-job's verdict was heard.
    late_news_heard: bool,
}

// SAFETY: the raw buffer pointers in queued operations belong to the caller,
// who promised (in `start`) they stay valid until the operation completes;
// the endpoint is used only through &mut self.
unsafe impl Send for Client {}

impl Client {
    /// Opens the fabric endpoint. Jobs are joined on first use (or with [`Client::join`]).
    pub fn connect(mut cfg: ClientConfig) -> Result<Client, ClientError> {
        if cfg.window == 0 {
            cfg.window = config::auto_window(cfg.chunk_bytes);
        }
        cfg.check()?;
        // Resolved here, not in `check`: two spellings of one server are
        // found only by resolving them (IP literals resolve without DNS).
        servers::check_resolved(&cfg.servers).map_err(|e| ClientError::Config(e.to_string()))?;
        let token = wire::token_bytes(&cfg.token).ok_or_else(|| ClientError::Config("token longer than 32 bytes".into()))?;
        let local = cfg.servers.iter().all(|s| s.starts_with("127.") || s.starts_with("localhost:") || s.starts_with("[::1]"));
        let provider = select_provider(cfg.provider.as_deref(), local);
        let node = match (&cfg.fabric_addr, provider.starts_with("tcp")) {
            (Some(a), _) => Some(a.clone()),
            (None, true) if local => Some("127.0.0.1".to_string()),
            _ => None,
        };
        let per_sub = cfg.servers.len() as u32 * STREAM_PLACES_PER_SERVER * cfg.window.max(1) * 2;
        let ecfg = EndpointConfig {
            hints: Hints::new(&provider).with_node(node.as_deref()),
            cq_size: 0,
            contexts: per_sub * join::MAX_SUBJOBS as u32 + sweep::SWEEP_CONTEXTS,
            wait_object: true,
        };
        let want = rails::resolve_rails(cfg.rails, &provider, cfg.servers.len(), cfg.link_gbits, cfg.rail_gbits);
        let open = || Endpoint::open(&ecfg).map_err(|e| ClientError::Fabric(format!("{provider}: {e}")));
        let first = open()?;
        let rails = if !rails::wants_rail_threads(&provider, want) || first.needs_local_mr() {
            Rails::direct(first)
        } else {
            let mut eps = vec![first];
            for _ in 1..want {
                eps.push(open()?);
            }
            let copier = cfg.runs_copier(eps.len());
            let sweep_base = per_sub * join::MAX_SUBJOBS as u32;
            let threads = rails::RailThreads {
                spin_polls: cfg.rail_spin_polls,
                sleep_ms: cfg.sleep_ms,
                cores: &cfg.rail_cores,
                contexts: ecfg.contexts as usize,
                sweep_base,
                timed: cfg.piece_times,
                copier,
                caller_rail: cfg.caller_rail,
            };
            Rails::threaded(eps, &threads)
        }
        .map_err(|e| ClientError::Fabric(e.to_string()))?
        .serve(cfg.servers.len());
        if rails.count() > 1 {
            let how = if rails.count() <= cfg.servers.len() {
                format!("server i on rail i mod {}", rails.count())
            } else {
                format!("server i's lcores spread over rails i, i + {0}, ... (lcore k on its lane k mod lanes)", cfg.servers.len())
            };
            let copier = if rails.has_copier() { ", and a copier thread for staged results" } else { "" };
            let each = if rails.callers_rail() {
                "an endpoint each, rail 0 driven by the caller's thread, the others by a thread each"
            } else {
                "an endpoint and a thread each"
            };
            log::info!("rank {}: {} rails ({each}){copier}, {how}", cfg.rank, rails.count());
        }
        crate::dataplane::lcore::precise_naps();
        let tcp_peers = Arc::new(tcp_floor::TcpPeers::default());
        let watchdog = watchdog::Watchdog::start(
            format!("rank {}", cfg.rank),
            rails.provider(),
            rails.call_watches().to_vec(),
            match (rails.has_threads(), rails::calls_may_spin_forever(rails.provider())) {
                (true, _) => watchdog::OnStuck::Report,
                (false, true) => watchdog::OnStuck::Exit,
                (false, false) => watchdog::OnStuck::Log,
            },
            cfg.provider_watchdog,
            tcp_floor::rto_floor_chore(rails.provider(), cfg.tcp_rto_min_ms, &tcp_peers),
        );
        tcp_peers.poke_with(watchdog.as_ref().and_then(|w| w.poke()));
        let redo_base = per_sub - failover::REDO_CONTEXTS_PER_SERVER * cfg.servers.len() as u32;
        let can_sweep = rails.can_sweep();
        Ok(Client {
            failover: Failover::new(cfg.servers.len(), tcp_peers),
            core: Core {
                token,
                rails,
                subs: Vec::new(),
                ops: VecDeque::with_capacity(MAX_OPS),
                retry: Vec::with_capacity((per_sub as usize) * join::MAX_SUBJOBS),
                per_sub,
                redo_base,
                cfg,
            },
            progress: Progress::new(MAX_OPS, Sweep::new(can_sweep, per_sub * join::MAX_SUBJOBS as u32)),
            watchdog,
            next_op: 1,
            registrations: Vec::new(),
            failed: false,
            late_news_heard: false,
        })
    }

    pub fn provider(&self) -> &str {
        self.core.rails.provider()
    }

    /// The settings this client runs with (its window resolved from auto).
    pub fn config(&self) -> &ClientConfig {
        &self.core.cfg
    }

    /// The sampled pieces' round trips and the copies of staged results so
    /// far, where `ClientConfig::piece_times` is on (else None).
    pub fn piece_times(&self) -> Option<piece_times::PieceReport> {
        let rails = &self.core.rails;
        self.core.cfg.piece_times.then(|| self.progress.times.report(rails.copy_times(), rails.copier_copies(), rails.busy_shares()))
    }

    /// [`Client::piece_times`], for a caller that logs it itself (the NCCL
    /// plugin, with its rank, through NCCL's logger): the client then does
    /// not log it when it closes.
    pub fn take_piece_times(&mut self) -> Option<piece_times::PieceReport> {
        let r = self.piece_times();
        self.core.cfg.piece_times = false;
        r
    }

    /// The fabric names of this rank's endpoints, one per rail: what its
    /// Hello gives the servers, and what any peer that reaches the rank
    /// sends to.
    pub fn endpoint_names(&self) -> Vec<EndpointName> {
        (0..self.core.rails.count()).map(|r| self.core.rails.name(r).clone()).collect()
    }

    /// Streams (server, lcore pairs) of the first joined sub-job.
    pub fn streams(&self) -> usize {
        self.core.subs.first().map_or(0, |s| s.streams.len())
    }

    /// Whether the first sub-job survives the loss of a server (several
    /// servers, failover on, a provider that completes sends per peer).
    pub fn can_fail_over(&self) -> bool {
        !self.core.subs.is_empty() && self.failover.on(0)
    }

    /// Failover counters of the first sub-job.
    pub fn failover_stats(&self) -> failover::FailoverStats {
        let first = (!self.core.subs.is_empty()).then_some(0);
        failover::FailoverStats {
            streams: first.map_or(0, |_| self.core.subs[0].streams.len() as u32),
            staging_bytes: first.and_then(|s| self.failover.staging(s)).map_or(0, |g| g.bytes() as u64),
            staged: self.progress.staged,
            late_receives: self.progress.late_receives,
            discarded: self.progress.sweep.discarded,
            ..self.failover.stats()
        }
    }

    /// Joins the job for (dtype, op) on every server, if not joined yet.
    /// Blocks until every rank joined (or the timeout). Collective.
    pub fn join(&mut self, dtype: DataType, op: ReduceOp) -> Result<usize, ClientError> {
        join::join_sub_job(&mut self.core, &mut self.failover, dtype, op)
    }

    /// Starts an all-reduce of `count` elements from `send` into `recv`
    /// (which may be the same buffer).
    ///
    /// # Safety
    /// Both buffers must hold `count` elements of `dtype` and stay valid,
    /// and `recv` unread and unwritten by anyone else, until [`Client::test`]
    /// reports the request done (or the client is dropped).
    pub unsafe fn start(
        &mut self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Request, ClientError> {
        if self.core.ops.len() >= MAX_OPS {
            return Err(ClientError::BadArgument(format!("more than {MAX_OPS} all-reduces in flight")));
        }
        if count > 0 && (send.is_null() || recv.is_null()) {
            return Err(ClientError::BadArgument("null buffer".into()));
        }
        let bytes = count.checked_mul(dtype.size()).ok_or_else(|| ClientError::BadArgument("count overflows".into()))?;
        let sub = self.join(dtype, op)?;
        let (mh_send, mh_recv) = if self.core.rails.needs_local_mr() && bytes > 0 {
            (Some(self.registration(send as *mut u8, bytes)?), Some(self.registration(recv, bytes)?))
        } else {
            (None, None)
        };
        let id = self.next_op;
        self.next_op += 1;
        // Every operation counts, empty ones too: every rank numbers them alike.
        let index = self.core.subs[sub].started;
        self.core.subs[sub].started += 1;
        if self.core.cfg.piece_times {
            self.progress.times.record_start(index);
        }
        if bytes == 0 {
            // Nothing to move: complete at once (never queued, so `test`
            // finds it done).
            return self.after_start(sub, id);
        }
        let next = self.progress.spare_next();
        self.core.ops.push_back(Op {
            id,
            sub,
            index,
            planned: false,
            gen: 0,
            send,
            recv,
            bytes,
            chunk_bytes: 0,
            chunks: 0,
            first: 0,
            next,
            posted: 0,
            done: 0,
            mh_send,
            mh_recv,
            started: Instant::now(),
        });
        self.progress.last_progress = Instant::now();
        if !self.holding(sub) {
            let oi = self.core.ops.len() - 1;
            if let Err(e) = self.plan(oi) {
                self.failed = true;
                return Err(e);
            }
        }
        if let Err(e) = self.pump() {
            self.failed = true;
            return Err(e);
        }
        self.after_start(sub, id)
    }

    fn after_start(&mut self, sub: usize, id: u64) -> Result<Request, ClientError> {
        if self.core.subs[sub].retiring {
            if let Err(e) = control::retire(&mut self.core, sub) {
                self.failed = true;
                return Err(e);
            }
        }
        Ok(Request(id))
    }

    /// Operations of sub-job `sub` wait uncut: a drain's switch, a
    /// recovery's agreement or a rejoin's switch is being agreed.
    fn holding(&self, sub: usize) -> bool {
        self.failover.holding(sub) || self.core.subs[sub].awaiting_switch()
    }

    /// Cuts operation `oi` over its stream set (`Core::cut`); where a
    /// recovery redoes work of the old set, its chunks on the lost streams
    /// go to the recovery instead.
    fn plan(&mut self, oi: usize) -> Result<(), ClientError> {
        self.core.cut(oi)?;
        self.progress.pump_due = true;
        let (sub, index) = (self.core.ops[oi].sub, self.core.ops[oi].index);
        if self.failover.redoes(sub, index) {
            // Cut over the old set, which still has the lost servers: their
            // chunks go to the recovery instead.
            self.failover.redo_cut(&mut self.core, oi)?;
        }
        Ok(())
    }

    /// Cuts the operations of sub-job `sub` held uncut, unless it still holds them.
    fn plan_held(&mut self, sub: usize) -> Result<(), ClientError> {
        if !self.holding(sub) {
            for oi in 0..self.core.ops.len() {
                if self.core.ops[oi].sub == sub && !self.core.ops[oi].planned {
                    self.plan(oi)?;
                }
            }
        }
        Ok(())
    }

    /// Registration cache for providers that want local buffers registered (EFA).
    fn registration(&mut self, p: *mut u8, len: usize) -> Result<MemoryHandle, ClientError> {
        let a = p as usize;
        if let Some(&(_, _, mh)) = self.registrations.iter().find(|(s, l, _)| *s <= a && a + len <= s + l) {
            return Ok(mh);
        }
        // SAFETY: the caller of `start` keeps the buffer valid while the
        // operation runs; the registration is dropped with the endpoint, and
        // a later buffer at the same address is re-registered only if it is
        // larger (cache entries cover the exact ranges registered).
        let mh = unsafe { self.core.rails.register(p, len) }.map_err(|e| ClientError::Fabric(e.to_string()))?;
        if self.registrations.len() >= 64 {
            let (_, _, old) = self.registrations.remove(0);
            let _ = self.core.rails.deregister(old);
        }
        self.registrations.push((a, len, mh));
        Ok(mh)
    }

    /// Drives every queued all-reduce; true once `req` is complete.
    pub fn test(&mut self, req: Request) -> Result<bool, ClientError> {
        let r = self.drive(req);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn drive(&mut self, req: Request) -> Result<bool, ClientError> {
        self.pump()?;
        self.poll()?;
        self.pump()?;
        let done = !self.core.ops.iter().any(|o| o.id == req.0);
        // The clock is read only on the empty polls that also check the
        // control connections (see `poll`), not on every call.
        if !done
            && self.progress.idle_polls.is_multiple_of(IDLE_CHECK_EVERY)
            && self.progress.last_progress.elapsed() > self.core.cfg.timeout
        {
            return Err(ClientError::Timeout(format!("all-reduce made no progress for {:?}", self.core.cfg.timeout)));
        }
        Ok(done)
    }

    /// Posts chunks while streams have room (`Progress::pump`).
    #[inline]
    fn pump(&mut self) -> Result<(), ClientError> {
        self.progress.pump(&mut self.core, &mut self.failover)
    }

    /// Takes the completions that came (`Progress::poll`), and looks at the
    /// control connections when that is due.
    #[inline]
    fn poll(&mut self) -> Result<(), ClientError> {
        if self.progress.poll(&mut self.core, &mut self.failover)? {
            return self.check_controls();
        }
        Ok(())
    }

    /// A server that ended the job, or drains, says so on the control
    /// connection (`control::read`), and each message goes to its
    /// handler; a rail stuck in a provider call is an error here.
    fn check_controls(&mut self) -> Result<(), ClientError> {
        self.progress.sweep.tick(&mut self.core, &self.failover);
        if let Some(w) = self.watchdog.as_ref() {
            if let Some(report) = w.stuck() {
                let stuck = w.stuck_rails();
                let rails = &mut self.core.rails;
                (0..rails.count()).filter(|r| stuck & (1 << r) != 0).for_each(|r| rails.abandon(r));
                return Err(ClientError::Fabric(report));
            }
        }
        for sub in 0..self.core.subs.len() {
            if self.failover.poll_rejoins(&mut self.core, sub)? {
                self.progress.pump_due = true;
            }
            if sub == 0 && self.core.cfg.fault_late_news && !self.late_news_heard {
                continue;
            }
            for si in 0..self.core.subs[sub].controls.len() {
                while let Some(msg) = control::read(&mut self.core, sub, si, self.failover.on(sub))? {
                    let now = Instant::now();
                    let live = &mut self.core.subs[sub].live;
                    match &msg {
                        Control::Alive => live.alive(si, now),
                        Control::Gone(_) => {}
                        _ => live.heard(si, now),
                    }
                    match msg {
                        Control::Alive => {}
                        Control::Drain => control::on_drain(&mut self.core, sub, si)?,
                        Control::SwitchAt(k) => self.on_switch(sub, si, k)?,
                        Control::Gone(why) => self.failover.lose(&mut self.core, sub, 1u64 << si, &why)?,
                        Control::Failover(dead) => self.failover.lose(&mut self.core, sub, dead, "the recovery's leader says so")?,
                        Control::Recover { dead, switch_op, reports } => {
                            self.failover.hear_verdict(sub, (dead, switch_op, reports));
                            self.lose_before(sub, dead)?;
                            self.late_news_heard |= sub > 0;
                        }
                    }
                }
                // Liveness, only for jobs that can fail over (see [`liveness`]).
                if self.failover.on(sub) && !self.failover.has_lost(sub, si) {
                    if let Some(why) = control::silence(&mut self.core, sub, si) {
                        self.failover.lose(&mut self.core, sub, 1u64 << si, &why)?;
                    }
                }
            }
        }
        // Recoveries join redo jobs, a blocking collective: every rank takes
        // its sub-jobs' verdicts in sub-job order, or two ranks could each
        // wait in a different sub-job's join for the other.
        for sub in 0..self.core.subs.len() {
            if let Some(verdict) = self.failover.take_verdict(sub) {
                self.recover(sub, verdict)?;
            } else if self.failover.recovering(sub) {
                break;
            }
        }
        Ok(())
    }

    /// A verdict of sub-job `sub` lost the servers in `dead`: every earlier
    /// sub-job that can fail over and still counts on one of them loses it
    /// too, before this rank takes the verdict (why: `failover`'s module
    /// doc, step 2). A server that ended only the later job costs the
    /// earlier one a recovery it did not need, never a wrong result.
    fn lose_before(&mut self, sub: usize, dead: u64) -> Result<(), ClientError> {
        let job = self.core.subs[sub].job_id;
        for earlier in 0..sub {
            let unseen = dead & !self.failover.lost(earlier);
            if unseen != 0 && self.failover.on(earlier) {
                self.failover.lose(&mut self.core, earlier, unseen, &format!("lost in job {job:#x}'s recovery"))?;
            }
        }
        Ok(())
    }

    /// The draining server `si` named the switch operation `k`
    /// (`control::on_switch`): operations held for it are cut, the server
    /// retired if this rank is past `k`, and the chunks posted.
    fn on_switch(&mut self, sub: usize, si: usize, k: u64) -> Result<(), ClientError> {
        control::on_switch(&mut self.core, sub, si, k)?;
        self.plan_held(sub)?;
        control::retire(&mut self.core, sub)?;
        self.progress.pump_due = true;
        self.pump()
    }

    /// The leader's verdict for sub-job `sub` (`Failover::recover`): once
    /// the recovery started, the operations it completed are handed back,
    /// the ones held are cut, and the chunks posted.
    fn recover(&mut self, sub: usize, verdict: Verdict) -> Result<(), ClientError> {
        if !self.failover.recover(&mut self.core, sub, verdict)? {
            return Ok(());
        }
        self.progress.finish_done_ops(&mut self.core)?;
        self.plan_held(sub)?;
        self.progress.pump_due = true;
        self.pump()
    }

    /// Blocking all-reduce from `send` into `recv` (same length, whole elements).
    pub fn allreduce(&mut self, send: &[u8], recv: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<(), ClientError> {
        if send.len() != recv.len() || !send.len().is_multiple_of(dtype.size()) {
            return Err(ClientError::BadArgument(format!("buffers of {} and {} bytes for {dtype}", send.len(), recv.len())));
        }
        // SAFETY: both slices outlive this call, which returns only once the
        // request completed, failed (the endpoint is then unusable for the
        // request's buffers: see below) or timed out.
        let req = unsafe { self.start(send.as_ptr(), recv.as_mut_ptr(), send.len() / dtype.size(), dtype, op)? };
        self.wait(req)
    }

    /// Blocking in-place all-reduce.
    pub fn allreduce_in_place(&mut self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<(), ClientError> {
        if !buf.len().is_multiple_of(dtype.size()) {
            return Err(ClientError::BadArgument(format!("{} bytes is not whole {dtype} elements", buf.len())));
        }
        let p = buf.as_mut_ptr();
        // SAFETY: as in `allreduce`; in place is allowed by `start`.
        let req = unsafe { self.start(p, p, buf.len() / dtype.size(), dtype, op)? };
        self.wait(req)
    }

    /// Blocks until `req` completes, driving every queued all-reduce (a
    /// caller keeping several in flight waits for the oldest), spinning
    /// `spin_polls` idle polls and then sleeping on the endpoints. On a
    /// failure it cancels every operation before it returns, so that no
    /// receive still targets a caller's buffer.
    pub fn wait(&mut self, req: Request) -> Result<(), ClientError> {
        let mut empty = 0u32;
        loop {
            let before = self.progress.last_progress;
            match self.test(req) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    // The request's buffers may still be targets of posted
                    // receives: cancel everything before returning them.
                    self.abort();
                    return Err(e);
                }
            }
            if self.progress.last_progress == before {
                empty += 1;
                if empty >= self.core.cfg.spin_polls {
                    let _ = self.core.rails.wait(self.core.cfg.sleep_ms.min(i32::MAX as u32) as i32);
                    empty = 0;
                }
            } else {
                empty = 0;
            }
        }
    }

    /// Cancels every operation and forgets every queued all-reduce. The
    /// rank no longer counts as finishing cleanly.
    pub fn abort(&mut self) {
        self.failed = true;
        let c = &mut self.core;
        c.rails.cancel_all();
        c.ops.clear();
        c.retry.clear();
        for s in &mut c.subs {
            for st in &mut s.streams {
                st.head_seq = st.next_seq;
                st.head_slot = st.next_slot;
            }
            s.flights.iter_mut().for_each(|f| *f = Flight::default());
            for p in &mut s.pacing {
                p.in_flight = 0;
                p.waiting.clear();
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Nothing queued: this rank is done, say so (the job ends when every
        // rank said bye). Otherwise just close: the servers fail the job and
        // the other ranks hear of it at once. Canceling first means no
        // receive still targets a caller's buffer.
        let clean = self.core.ops.is_empty() && !self.failed;
        if let Some(r) = self.piece_times() {
            log::info!("rank {}: {r}", self.core.cfg.rank);
        }
        self.core.rails.cancel_all();
        if clean {
            let bye = wire::Header::new(Kind::Bye);
            for s in &mut self.core.subs {
                for c in s.controls.iter_mut().flatten() {
                    let _ = c.set_nonblocking(false);
                    let _ = c.write_all(bytemuck::bytes_of(&bye));
                }
            }
        }
    }
}
