//! The control plane: handshakes, job admission, job teardown.
//!
//! One thread owns all control state and every control connection: an
//! epoll loop ([`conn`]) reads each client's Hello (with a deadline, under
//! the admission limits of [`admission`]), checks it, and hands the job
//! logic here a join; afterwards it parses the rank's few messages (Bye,
//! Boundary, Lost) into events and writes the answers from per-connection
//! out-buffers. The thread count does not grow with connections: a server
//! runs its lcores, this thread and a constant few more. Lcores report
//! through a channel and wake the loop. A job is admitted once all its ranks
//! joined with matching parameters: it gets an index (its slot in every
//! lcore's job table), a tag (the next of a rolling 16-bit count not in use:
//! a tag comes back only after 65535 other jobs, so a late message of an old
//! job, left in a provider's queue of unexpected messages, does not match a
//! new job's receive; see `next_tag`) and a region in each lcore's slab.
//! Then the lcores post its receives and the ranks get their Accept.
//!
//! A job ends when one of its ranks closes its connection, when an lcore
//! reports it failed (a bad chunk, a straggler past the op timeout), when it
//! does not gather all its ranks in time, or when it moves no bytes for the
//! idle timeout (read from the lcores' per-job counters once a second, so
//! the data path pays nothing for it). Its
//! regions return to the pool only after every lcore drained it (canceled
//! everything in flight), so no late completion can write into a region
//! that a new job already owns.
//!
//! Draining ([`crate::server::Server::drain`], `tally server` on SIGTERM):
//! the server admits no new jobs (a joining rank gets a reject saying it
//! drains) and sends every rank of every running job a `Drain`. Each rank
//! answers with a `Boundary`: the index of its first all-reduce of the job
//! not yet cut into chunks. The server alone decides the switch point, K,
//! the largest boundary (every rank has cut at most K operations over the
//! old set of servers; every rank can still cut operation K and later over
//! the new set), and sends it to every rank in a `SwitchAt`. Operations
//! before K keep this server; from K on the ranks use only their other
//! servers. Each rank says Bye here once its operations before K are done,
//! and when every rank did the job ends as any finished job does: its ranks
//! see no error. A rank with no other server answers `Boundary::STAY`, and
//! the job then stays until it ends. When no job is left, or at the drain
//! timeout (which ends the jobs still here with a reject saying so), the
//! control plane reports the drain done and the process exits.
pub mod alloc;
pub mod budget;

use crate::dataplane::fabric::EndpointName;
use crate::dataplane::metrics::{ControlCounters, MetricsTable, ServerHealth, ServerPhase};
use crate::dataplane::shard::{slot_strides, Command, Event, JobOnShard, SplitOn};
use crate::dataplane::split::SplitShared;
use crate::host::config::ServerConfig;
use crate::wire::{self, Accept, Boundary, Drain, Header, JobSpec, Kind, Limits, NameRecord, Reject, RejectCode, SwitchAt, TOKEN_BYTES};
use alloc::{RangeAlloc, REGION_ALIGN};
use bytemuck::Zeroable;
use conn::{ConnEvent, Connections, Joining, Rules};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod admission;
pub mod conn;

pub use crate::dataplane::metrics::JobInfo;

/// A rank's control connection, as the job logic knows it.
struct Conn {
    id: u64,
    rank: u32,
    peer: SocketAddr,
    /// The rank asked for heartbeats (`Hello::ALIVE`).
    heartbeats: bool,
}

struct Pending {
    spec: JobSpec,
    rejoin: bool,
    conns: Vec<Option<Conn>>,
    names: Vec<Option<EndpointName>>,
    joined: u32,
    first_join: Instant,
    deadline: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting,
    Running,
    Ending,
}

struct Active {
    job_id: u64,
    spec: JobSpec,
    tag: u16,
    conns: Vec<Conn>,
    /// (offset, length) of the job's region on lcores 0..shards.
    regions: Vec<(usize, usize)>,
    ready: u32,
    ended: u32,
    /// Lcores that gave up draining with operations in flight.
    stuck_lcores: Vec<usize>,
    /// Ranks that said bye (finished cleanly).
    done: Vec<bool>,
    phase: Phase,
    /// Bytes the lcores had received for the job at the last idle check, and when they last changed.
    seen_bytes: u64,
    last_traffic: Instant,
    /// Set once the job was told that this server drains.
    drain: Option<JobDrain>,
    /// Set while ranks report losing other servers (this server leads).
    recovery: Option<JobRecovery>,
    /// Admitted as a rejoin: the ranks run the job already, elsewhere.
    rejoin: bool,
    /// When its first rank joined (for the join-to-running time).
    first_join: Instant,
    /// Its heartbeats are withheld (an lcore stopped polling); logged once.
    withheld: bool,
}

/// A running job's recovery from losing other servers, led by this server:
/// it collects one report per rank for the same set of lost servers, then
/// hands every rank all of them. It decides nothing but the switch point;
/// the ranks derive the rest identically from the reports.
struct JobRecovery {
    /// Union of the lost servers ranks reported (bits of the job's server list).
    dead: u64,
    /// Per rank: (boundary, report) for `dead`, once it reported that set.
    reports: Vec<Option<(u64, Vec<u8>)>>,
}

/// A running job's side of a drain.
struct JobDrain {
    /// Per rank: its Boundary, once it answered.
    boundaries: Vec<Option<u64>>,
    /// The operation from which the ranks leave this server, once decided
    /// (`Boundary::STAY`: they stay until the job ends).
    switch_at: Option<u64>,
    /// The same agreement for a rejoined job: the operation from which the
    /// ranks use this server again.
    rejoin: bool,
}

/// The server's own drain.
struct Draining {
    since: Instant,
    /// The drain timeout passed and the jobs still here were ended.
    timed_out: bool,
}

struct Quarantine {
    job_id: u64,
    tag: u16,
    /// (lcore, offset, length) of regions still held.
    regions: Vec<(usize, usize, usize)>,
}

pub struct ControlPlane {
    limits: Limits,
    join_timeout: Duration,
    /// The first `latency_lcores` lcores take only operations of at most
    /// 2^latency_max_log2 bytes (told to clients in the Accept).
    latency_lcores: u8,
    latency_max_log2: u8,
    /// Receive buffers per slot for jobs staged to fit (0: never staged).
    stage_buffers: u32,
    names: Vec<EndpointName>,
    lcores: Vec<Sender<Command>>,
    /// Every control connection (the epoll loop).
    net: Connections,
    counters: Arc<ControlCounters>,
    /// Something published changed since the last publish.
    dirty: bool,
    pending: HashMap<u64, Pending>,
    active: Vec<Option<Active>>,
    /// The last tag handed out (see [`ControlPlane::next_tag`]).
    last_tag: u16,
    /// Job slots not reused while a job that ended with operations stuck in
    /// flight holds them: per slot, the job's tag and its regions on the
    /// lcores that still have operations out. Released lcore by lcore.
    quarantined: Vec<Option<Quarantine>>,
    allocs: Vec<RangeAlloc>,
    conn_job: HashMap<u64, u64>,
    published: Arc<Mutex<Vec<JobInfo>>>,
    /// The lcores' per-job counters, read (never written) for the idle check.
    metrics: MetricsTable,
    /// None: jobs may idle forever.
    idle_timeout: Option<Duration>,
    next_idle_check: Instant,
    /// Per lcore: its counters (read only), the poll count last seen, when
    /// it last moved, and whether the lcore is reported stuck.
    watchdog: Vec<Watch>,
    /// When the watchdog last looked: a longer gap than [`LCORE_QUIET_AFTER`]
    /// means the whole process was frozen (SIGSTOP, a stalled VM), lcores
    /// and this thread alike, and says nothing about the lcores.
    watched_at: Instant,
    drain_timeout: Duration,
    /// Set by `Server::drain`; read once per loop turn.
    drain_requested: Arc<AtomicBool>,
    /// Set here once draining finished (no job left, or the timeout).
    drained: Arc<AtomicBool>,
    draining: Option<Draining>,
    /// Between heartbeats (None: none are sent).
    heartbeat: Option<Duration>,
    next_beat: Instant,
    /// Jobs whose join failed because a rank left during it, or that failed
    /// because a rank disconnected: until when a later join of the same job
    /// is told so at once, instead of waiting out the join timeout for ranks
    /// that moved on (see [`Tombstone`]).
    failed_joins: HashMap<u64, Tombstone>,
    /// Alive and ready, for `/healthz` and `/readyz`: this loop stamps every
    /// turn and moves the phase (serving, draining, stopping).
    health: Arc<ServerHealth>,
    /// systemd's watchdog, fed from this loop (None: not asked for).
    systemd_watchdog: Option<WatchdogFeed>,
}

/// `WATCHDOG=1` to the service manager every `every` (half its period),
/// sent from the control loop itself: a loop that stops turning stops
/// feeding it, and systemd restarts the server.
struct WatchdogFeed {
    every: Duration,
    next: Instant,
    /// A failed send was logged (once: the next ones go to debug).
    warned: bool,
}

/// Why joins of a job id are refused at once, and until when.
struct Tombstone {
    until: Instant,
    why: String,
    /// Rejoins too (a join that failed while joining); else only fresh
    /// joins: the ranks of a job that failed here because its connections
    /// closed (they declared this server lost) take it back with a rejoin.
    rejoins: bool,
}

/// How long joins of a job that failed here because a rank disconnected are
/// refused: a rank whose join connection broke (a link blip) after the job
/// started here joins again, into a job the others already left.
const FAILED_JOB_REFUSED_FOR: Duration = Duration::from_secs(10);

struct Watch {
    stats: Arc<crate::dataplane::lcore::LcoreStats>,
    polls: u64,
    moved: Instant,
    stuck: bool,
}

/// An lcore whose poll count has not moved for this long is stuck (inside a
/// provider call: e.g. shm spinning on the lock of a peer process that died
/// holding it). Every lcore polls at least every few milliseconds, idle or not.
pub const LCORE_STUCK_AFTER: Duration = Duration::from_secs(5);

/// An lcore whose poll count has not moved for this long proves nothing:
/// its jobs' heartbeats are withheld (their ranks fail over after their
/// liveness time) well before [`LCORE_STUCK_AFTER`] ends the jobs here.
pub const LCORE_QUIET_AFTER: Duration = Duration::from_secs(1);

/// The longest the loop sleeps: how soon it sees a drain request, a stop,
/// and the timers that are not handshake deadlines.
const TICK: Duration = Duration::from_millis(20);

/// Reads the shared token: token_file if configured, else TALLY_TOKEN.
fn load_token(cfg: &ServerConfig) -> Result<Option<[u8; TOKEN_BYTES]>, String> {
    let text = match &cfg.token_file {
        Some(f) => Some(std::fs::read_to_string(f).map_err(|e| format!("token_file {f}: {e}"))?),
        None => std::env::var("TALLY_TOKEN").ok().filter(|t| !t.is_empty()),
    };
    match text {
        None => Ok(None),
        Some(t) => wire::token_bytes(&t).map(Some).ok_or_else(|| format!("the token is longer than {TOKEN_BYTES} bytes")),
    }
}

/// Binds the control port, with a backlog deep enough for a thousand ranks
/// connecting in the same millisecond (std's is 128; past the backlog a
/// connection waits out a SYN retransmit, a second or more).
pub fn listen(addr: &str) -> Result<std::net::TcpListener, String> {
    use std::net::ToSocketAddrs;
    let at = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("cannot listen on {addr}: no address"))?;
    let bind = || -> std::io::Result<std::net::TcpListener> {
        let s = socket2::Socket::new(socket2::Domain::for_address(at), socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
        s.set_reuse_address(true)?;
        s.bind(&at.into())?;
        s.listen(LISTEN_BACKLOG)?;
        Ok(s.into())
    };
    bind().map_err(|e| format!("cannot listen on {addr}: {e}"))
}

/// The kernel caps it at net.core.somaxconn (4096 on current kernels).
const LISTEN_BACKLOG: i32 = 4096;

/// What a handshake is checked against, from the configuration.
pub fn rules(cfg: &ServerConfig) -> Result<Rules, String> {
    let token = load_token(cfg)?;
    if token.is_none() {
        log::warn!("no token configured (TALLY_TOKEN or token_file): any client that can reach this server may join jobs");
    }
    let n = cfg.lcores.len() as u32;
    Ok(Rules {
        limits: Limits { max_ranks: cfg.max_ranks, max_window: cfg.max_window, max_chunk_bytes: cfg.max_chunk, lcores: n },
        token,
        handshake_timeout: Duration::from_secs(cfg.handshake_timeout_s.max(1)),
        max_handshakes: cfg.max_handshakes as usize,
        max_handshakes_per_source: cfg.max_handshakes_per_source,
    })
}

impl ControlPlane {
    pub fn new(
        cfg: &ServerConfig,
        names: Vec<EndpointName>,
        lcores: Vec<Sender<Command>>,
        net: Connections,
        counters: Arc<ControlCounters>,
        published: Arc<Mutex<Vec<JobInfo>>>,
        metrics: MetricsTable,
    ) -> Result<ControlPlane, String> {
        let n = cfg.lcores.len();
        let allocs: Vec<RangeAlloc> = (0..n).map(|_| RangeAlloc::new(cfg.slab_size as usize, REGION_ALIGN)).collect();
        // The slab gauges hold from the start (`publish` keeps them current).
        for (l, a) in allocs.iter().enumerate() {
            metrics.gauges(l).slab_bytes.store(a.total() as u64, Ordering::Relaxed);
        }
        Ok(ControlPlane {
            limits: Limits { max_ranks: cfg.max_ranks, max_window: cfg.max_window, max_chunk_bytes: cfg.max_chunk, lcores: n as u32 },
            join_timeout: Duration::from_secs(cfg.join_timeout_s.max(1)),
            latency_lcores: cfg.latency_lcores.min(255) as u8,
            // The server sets it to 0 over shm (server::Server::start).
            stage_buffers: cfg.stage_buffers,
            latency_max_log2: cfg.latency_max.max(1).trailing_zeros() as u8,
            names,
            lcores,
            net,
            counters,
            dirty: true,
            pending: HashMap::new(),
            active: (0..cfg.max_jobs).map(|_| None).collect(),
            last_tag: 0,
            quarantined: (0..cfg.max_jobs).map(|_| None).collect(),
            allocs,
            conn_job: HashMap::new(),
            published,
            metrics,
            idle_timeout: (cfg.idle_timeout_s > 0).then(|| Duration::from_secs(cfg.idle_timeout_s)),
            next_idle_check: Instant::now(),
            watchdog: Vec::new(),
            watched_at: Instant::now(),
            drain_timeout: Duration::from_secs(cfg.drain_timeout_s),
            drain_requested: Arc::new(AtomicBool::new(false)),
            drained: Arc::new(AtomicBool::new(false)),
            draining: None,
            heartbeat: (cfg.heartbeat_ms > 0).then(|| Duration::from_millis(cfg.heartbeat_ms)),
            next_beat: Instant::now(),
            failed_joins: HashMap::new(),
            health: Arc::new(ServerHealth::new()),
            systemd_watchdog: None,
        })
    }

    /// Publishes liveness and phase to `health`; with `watchdog_period`
    /// (systemd's `WATCHDOG_USEC`), feeds the watchdog every half of it.
    pub fn with_health(mut self, health: Arc<ServerHealth>, watchdog_period: Option<Duration>) -> ControlPlane {
        self.health = health;
        self.systemd_watchdog = watchdog_period.map(|p| WatchdogFeed { every: p / 2, next: Instant::now(), warned: false });
        self
    }

    /// Sends `WATCHDOG=1` when it is due (see [`WatchdogFeed`]).
    fn feed_watchdog(&mut self, now: Instant) {
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

    /// The flag that asks for a drain, and the one that says it is done.
    pub fn with_drain(mut self, requested: Arc<AtomicBool>, drained: Arc<AtomicBool>) -> ControlPlane {
        self.drain_requested = requested;
        self.drained = drained;
        self
    }

    /// Watches the lcores' poll counters (see [`LCORE_STUCK_AFTER`]).
    pub fn with_watchdog(mut self, stats: Vec<Arc<crate::dataplane::lcore::LcoreStats>>) -> ControlPlane {
        let now = Instant::now();
        self.watchdog = stats.into_iter().map(|stats| Watch { polls: stats.snapshot().polls, stats, moved: now, stuck: false }).collect();
        self
    }

    /// Fails the jobs of an lcore that stopped polling, and refuses jobs that
    /// would need it, instead of letting their ranks wait for their timeouts.
    fn check_lcores(&mut self, now: Instant) {
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
            } else if !w.stuck && now.duration_since(w.moved) >= LCORE_STUCK_AFTER {
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
    fn stuck_lcore(&self, shards: u32) -> Option<usize> {
        self.watchdog.iter().take(shards as usize).position(|w| w.stuck)
    }

    /// The control thread's loop, until `stop`: set-up is done (the listener
    /// and every lcore are up); each turn waits in epoll for connections or
    /// an lcore's wake-up, at most until the next deadline, then runs the
    /// timers. Tear-down is [`ControlPlane::shut_down`].
    pub fn run(mut self, events: Receiver<Event>, stop: Arc<AtomicBool>) {
        let mut happened = Vec::new();
        self.health.advance(ServerPhase::Serving);
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let next = self.pending.values().map(|p| p.deadline).min().map_or(TICK, |d| d.saturating_duration_since(now).min(TICK));
            self.net.turn(next, &mut happened);
            for ev in happened.drain(..) {
                self.on_conn(ev);
            }
            while let Ok(ev) = events.try_recv() {
                self.handle(ev);
            }
            let now = Instant::now();
            self.health.control_turned(now);
            self.feed_watchdog(now);
            self.expire_pending(now);
            self.expire_idle();
            self.check_lcores(now);
            self.beat(now);
            self.check_drain(now);
            if std::mem::take(&mut self.dirty) {
                self.publish();
            }
        }
        self.health.advance(ServerPhase::Stopping);
        self.shut_down(&events);
    }

    fn on_conn(&mut self, ev: ConnEvent) {
        match ev {
            ConnEvent::Join(j) => self.join(*j),
            ConnEvent::Bye { conn } => self.bye(conn),
            ConnEvent::Boundary { conn, next_op } => self.boundary(conn, next_op),
            ConnEvent::Lost { conn, dead, boundary, report } => self.lost(conn, dead, boundary, report),
            ConnEvent::Closed { conn } => self.closed(conn),
        }
        self.dirty = true;
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::JobReady { lcore, tag } => self.ready(lcore, tag),
            Event::JobFailed { lcore, tag, reason } => self.failed(lcore, tag, &reason),
            Event::JobEnded { lcore, tag, stuck } => self.ended(lcore, tag, stuck),
            Event::LcoreError { lcore, reason } => log::warn!("lcore {lcore}: {reason}"),
            Event::JobReleased { lcore, tag } => self.released(lcore, tag),
            Event::RankGone { tag, rank } => {
                if let Some((i, _)) = self.find(tag) {
                    self.rank_gone(i, rank);
                }
            }
        }
        self.dirty = true;
    }

    fn join(&mut self, j: Joining) {
        let Joining { rejoin, heartbeats, conn, peer, spec, rank, name } = j;
        let c = Conn { id: conn, rank, peer, heartbeats };
        if self.draining.is_some() {
            log::info!("{peer}: rank {rank} of job {:#x} refused: the server is draining", spec.job_id);
            refuse(&mut self.net, &c, RejectCode::Draining, "", "the server is draining (shutting down): it admits no new jobs");
            return;
        }
        if let Some(i) = self.active.iter().position(|a| a.as_ref().is_some_and(|a| a.job_id == spec.job_id && a.phase != Phase::Ending)) {
            if !rejoin {
                refuse(&mut self.net, &c, RejectCode::JobMismatch, "job_id", "a job with this id is already running");
                return;
            }
            self.fence(i, rank, peer);
        }
        if let Some(t) = self.failed_joins.get(&spec.job_id) {
            if t.until <= Instant::now() {
                self.failed_joins.remove(&spec.job_id);
            } else if t.rejoins || !rejoin {
                let why = t.why.clone();
                log::info!("{peer}: rank {rank} of job {:#x} refused: {why}", spec.job_id);
                refuse(&mut self.net, &c, RejectCode::JobFailed, "", &why);
                return;
            }
        }
        // Ranks waiting for their job to gather hold a connection each: bounded
        // by what the server could ever run at once.
        let waiting: u32 = self.pending.values().map(|p| p.joined).sum();
        if waiting >= self.limits.max_ranks * self.active.len() as u32 {
            log::warn!("{peer}: refused: {waiting} ranks already waiting for their jobs to gather");
            refuse(&mut self.net, &c, RejectCode::Busy, "", "too many ranks waiting for their jobs to gather; try again later");
            return;
        }
        let nranks = spec.nranks as usize;
        let p = self.pending.entry(spec.job_id).or_insert_with(|| Pending {
            spec,
            rejoin,
            conns: (0..nranks).map(|_| None).collect(),
            names: vec![None; nranks],
            joined: 0,
            first_join: Instant::now(),
            deadline: Instant::now() + self.join_timeout,
        });
        if p.spec != spec || p.rejoin != rejoin {
            let field = if p.rejoin != rejoin { "flags" } else { mismatch_field(&p.spec, &spec) };
            log::warn!("{peer}: rank {rank} of job {:#x} disagrees with the other ranks on {field}", spec.job_id);
            refuse(&mut self.net, &c, RejectCode::JobMismatch, field, "differs from what other ranks of this job sent");
            return;
        }
        if p.conns[rank as usize].is_some() {
            if p.names[rank as usize].as_ref() != Some(&name) {
                log::warn!("{peer}: rank {rank} of job {:#x} joined twice", spec.job_id);
                refuse(&mut self.net, &c, RejectCode::DuplicateRank, "rank", "this rank already joined the job");
                return;
            }
            // The same rank (the same endpoint) again: its first connection
            // broke while it waited (its keepalive gave up on a link that was
            // down a while), and it joined again. Take the new connection.
            let old = p.conns[rank as usize].take().expect("checked");
            p.joined -= 1;
            log::info!("job {:#x}: rank {rank} joined again from {peer}; its first connection is dropped", spec.job_id);
            self.conn_job.remove(&old.id);
            self.net.close(old.id);
        }
        p.conns[rank as usize] = Some(c);
        p.names[rank as usize] = Some(name);
        p.joined += 1;
        self.conn_job.insert(conn, spec.job_id);
        log::debug!("job {:#x}: rank {rank} joined from {peer} ({}/{})", spec.job_id, p.joined, spec.nranks);
        if p.joined == spec.nranks {
            let p = self.pending.remove(&spec.job_id).unwrap();
            self.admit(p);
        }
    }

    fn admit(&mut self, p: Pending) {
        let spec = p.spec;
        let mut conns: Vec<Conn> = p.conns.into_iter().map(|c| c.expect("all joined")).collect();
        let names: Vec<EndpointName> = p.names.into_iter().map(|n| n.expect("all joined")).collect();
        let Some(index) = (0..self.active.len()).find(|&i| self.active[i].is_none() && self.quarantined[i].is_none()) else {
            log::warn!("job {:#x} refused: already serving {} jobs", spec.job_id, self.active.len());
            self.refuse_all(
                &mut conns,
                RejectCode::TooManyJobs,
                "",
                &format!("the server already runs its limit of {} jobs", self.active.len()),
            );
            return;
        };
        if let Some(l) = self.stuck_lcore(spec.shards) {
            let msg = format!("lcore {l} of the server is stuck inside the fabric provider; restart the server");
            log::warn!("job {:#x} refused: {msg}", spec.job_id);
            self.refuse_all(&mut conns, RejectCode::Internal, "", &msg);
            return;
        }
        // The piece may be smaller than asked, so that the region fits (budget.rs).
        let asked = spec.chunk_elems;
        let grant = match budget::grant(&spec, &self.allocs, REGION_ALIGN, self.stage_buffers) {
            Ok(g) => g,
            Err(e) => {
                log::warn!("job {:#x} refused: {e}", spec.job_id);
                self.refuse_all(&mut conns, RejectCode::NoCapacity, "", &e.to_string());
                return;
            }
        };
        let spec = JobSpec { chunk_elems: grant.chunk_elems, ..spec };
        // Per lcore: the piece and region. A latency lcore (when the job
        // has bulk lcores too, as the Accept will say) only ever gets
        // operations of at most latency_max bytes, so its pieces, and its
        // region, need be no larger.
        let split = spec.shards > self.latency_lcores as u32;
        let latency_elems = ((1usize << self.latency_max_log2) / spec.dtype.size()) as u32;
        let tag = self.next_tag();
        let shape = |l: usize| -> (JobSpec, usize, usize) {
            if split && l < self.latency_lcores as usize && latency_elems < spec.chunk_elems {
                let s = JobSpec { chunk_elems: latency_elems, ..spec };
                let stride = s.piece_bytes().next_multiple_of(budget::PIECE_ALIGN);
                (s, stride, spec.window as usize * slot_strides(spec.dtype, spec.nranks, grant.stage) * stride)
            } else {
                (spec, grant.stride, grant.len)
            }
        };
        // A split job (small pieces split by rank over the lcores that take
        // small operations, see `dataplane::split`): its split slots follow
        // its window's, and each split lcore's area follows its region.
        let groups = wire::split_lcores(spec.nranks, self.small_lcores(spec.shards));
        let split_shared = (spec.split && groups >= 2).then(|| Arc::new(SplitShared::new(spec.nranks, groups, spec.window)));
        if split_shared.is_some() && 2 * spec.window * spec.nranks > self.limits.max_window * self.limits.max_ranks {
            let msg = format!(
                "a split job of {} ranks at window {} needs twice the operation contexts this server has per job (max_window x max_ranks); set TALLY_SPLIT=0 on the ranks",
                spec.nranks, spec.window
            );
            log::warn!("job {:#x} refused: {msg}", spec.job_id);
            self.refuse_all(&mut conns, RejectCode::NoCapacity, "", &msg);
            return;
        }
        let area = |l: usize| split_shared.as_ref().filter(|_| l < groups as usize).map_or(0, |sh| sh.area_len(l as u32));
        let mut regions = Vec::new();
        for l in 0..spec.shards as usize {
            let (_, stride, len) = shape(l);
            match self.allocs[l].alloc(len + area(l)) {
                Some(off) => regions.push((off, len + area(l))),
                None => {
                    let (largest, total) = (self.allocs[l].largest_free(), self.allocs[l].total());
                    for (k, (off, len)) in regions.iter().enumerate() {
                        self.allocs[k].release(*off, *len);
                    }
                    let msg = format!(
                        "the job needs {} per lcore (window {} x {} ranks x {} piece); lcore {l} has {} free of {}",
                        crate::host::units::format_size(len as u64),
                        spec.window,
                        spec.nranks,
                        crate::host::units::format_size(stride as u64),
                        crate::host::units::format_size(largest as u64),
                        crate::host::units::format_size(total as u64)
                    );
                    log::warn!("job {:#x} refused: {msg}", spec.job_id);
                    self.refuse_all(&mut conns, RejectCode::NoCapacity, "", &msg);
                    return;
                }
            }
        }
        for (l, (off, _)) in regions.iter().enumerate() {
            let (spec, stride, len) = shape(l);
            let split = split_shared.as_ref().filter(|_| l < groups as usize).map(|sh| SplitOn {
                shared: sh.clone(),
                position: l as u32,
                base: *off + len,
            });
            let on =
                JobOnShard { index: index as u16, tag, spec, base: *off, stride, stage: grant.stage, client_names: names.clone(), split };
            let _ = self.lcores[l].send(Command::AddJob(Box::new(on)));
        }
        log::info!(
            "job {:#x}: {} ranks, {} {}, {} elements per piece{}, window {}, {} shards{}: starting (tag {tag:#06x})",
            spec.job_id,
            spec.nranks,
            spec.dtype,
            spec.op,
            spec.chunk_elems,
            match (asked == spec.chunk_elems, grant.stage) {
                (true, 0) => String::new(),
                (true, b) => format!(" (received {b} ranks at a time: a piece per rank would not fit the job's slab budget)"),
                (false, _) => format!(" (asked {asked}: the region fits the job's slab budget)"),
            },
            spec.window,
            spec.shards,
            match (spec.relay, &split_shared) {
                (true, _) => format!(", relay (pieces of at most {} bytes go on to the other rank)", wire::RELAY_MAX),
                (false, Some(_)) => format!(", split (pieces of at most {} bytes by rank over {groups} lcores)", wire::SPLIT_MAX),
                (false, None) => String::new(),
            }
        );
        self.active[index] = Some(Active {
            job_id: spec.job_id,
            spec,
            tag,
            conns,
            regions,
            ready: 0,
            ended: 0,
            stuck_lcores: Vec::new(),
            done: vec![false; spec.nranks as usize],
            phase: Phase::Starting,
            seen_bytes: 0,
            last_traffic: Instant::now(),
            drain: None,
            recovery: None,
            rejoin: p.rejoin,
            first_join: p.first_join,
            withheld: false,
        });
    }

    /// How many lcores take a job's small operations, as the ranks read it
    /// from the Accept: its latency lcores where it has them, else all.
    fn small_lcores(&self, shards: u32) -> u32 {
        let a = Accept {
            latency_lcores: accept_latency_lcores(self.latency_lcores, shards),
            latency_max_log2: self.latency_max_log2,
            lcores: shards,
            ..Accept::zeroed()
        };
        a.latency_split().map_or(shards, |(l, _)| l as u32)
    }

    /// The active job that control connection `conn` belongs to. (By
    /// connection, not job id: a fenced job and its rejoin share the id.)
    fn active_of(&self, conn: u64) -> Option<usize> {
        self.active.iter().position(|a| a.as_ref().is_some_and(|a| a.conns.iter().any(|c| c.id == conn)))
    }

    /// A rank rejoins job `i`, which still runs here: its ranks declared
    /// this server lost (it was frozen, hung or cut off while they moved
    /// on), so what runs here is stale. End it (its results carry its tag,
    /// which no rank receives on any more; its regions come back once its
    /// lcores let go), so that the rejoin is admitted as for a restarted server.
    fn fence(&mut self, i: usize, rank: u32, peer: SocketAddr) {
        let Some(a) = self.active[i].as_ref() else { return };
        log::warn!(
            "job {:#x}: rank {rank} rejoins it from {peer} while it still runs here: its ranks declared this server lost \
             (it was frozen, hung or cut off); fencing the stale job and taking the job back",
            a.job_id
        );
        self.counters.jobs_fenced.fetch_add(1, Ordering::Relaxed);
        self.end(i, RejectCode::JobFailed, "fenced: the job's ranks declared this server lost and are taking it back");
    }

    /// Sends every rank that asked for them a heartbeat, every `heartbeat`,
    /// for each running job whose lcores all polled within
    /// [`LCORE_QUIET_AFTER`]. The control thread sends them, so a frozen
    /// process sends none; the lcores' poll counters gate them, so a stuck
    /// lcore withholds its jobs'. (Not per chunk: a few bytes per rank a tick.)
    fn beat(&mut self, now: Instant) {
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

    fn find(&mut self, tag: u16) -> Option<(usize, &mut Active)> {
        let i = self.active.iter().position(|a| a.as_ref().is_some_and(|a| a.tag == tag))?;
        self.active[i].as_mut().map(|a| (i, a))
    }

    /// The tag of a new job: the next value of a rolling 16-bit count that
    /// no running or quarantined job holds (never 0). A tag names a job on
    /// the wire (the high bits of every data message), and a job's late
    /// messages can outlive it in a provider's queue of unexpected messages
    /// (a rank's sends that arrived after the job ended here, as under a
    /// link cut or a fenced job). With tcp;ofi_rxm 1.17, a new receive that
    /// matched such a message from a rank whose connection is gone crashed
    /// the server inside fi_trecv (seen in scripts/soak.sh with link cuts:
    /// a tag of a 4-bit generation per job slot came back every 16 jobs,
    /// and address-vector entries are reused). Rolling over 16 bits makes a
    /// tag come back only after 65535 other jobs.
    fn next_tag(&mut self) -> u16 {
        loop {
            self.last_tag = self.last_tag.wrapping_add(1);
            let t = self.last_tag;
            let taken = |t: u16| self.active.iter().flatten().any(|a| a.tag == t) || self.quarantined.iter().flatten().any(|q| q.tag == t);
            if t != 0 && !taken(t) {
                return t;
            }
        }
    }

    fn ready(&mut self, _lcore: usize, tag: u16) {
        let names = self.names.clone();
        let Some((i, _)) = self.find(tag) else { return };
        let a = self.active[i].as_mut().expect("found");
        a.ready += 1;
        if a.phase != Phase::Starting || a.ready < a.spec.shards {
            return;
        }
        a.phase = Phase::Running;
        let mut msg = Vec::new();
        let acc = Accept {
            header: Header::new(Kind::Accept),
            job_tag: tag,
            latency_lcores: accept_latency_lcores(self.latency_lcores, a.spec.shards),
            latency_max_log2: self.latency_max_log2,
            lcores: a.spec.shards,
            server_lcores: names.len() as u32,
            piece_elems: a.spec.chunk_elems,
        };
        msg.extend_from_slice(bytemuck::bytes_of(&acc));
        for n in names.iter().take(a.spec.shards as usize) {
            let rec = NameRecord::new(n.as_bytes()).unwrap_or_else(NameRecord::zeroed);
            msg.extend_from_slice(bytemuck::bytes_of(&rec));
        }
        for c in &a.conns {
            if let Err(e) = self.net.send(c.id, &msg) {
                log::warn!("job {:#x}: cannot send the accept to rank {} at {}: {e}", a.job_id, c.rank, c.peer);
            }
        }
        let took = a.first_join.elapsed();
        self.counters.record_join_to_running(took.as_nanos() as u64);
        log::info!("job {:#x}: running, {:.1?} after its first rank joined", a.job_id, took);
        if a.rejoin {
            // The ranks run it already: agree on the operation from which
            // they use this server again, as a drain does in reverse.
            self.tell_rejoin(i);
            return;
        }
        if self.draining.is_some() {
            // Admitted just before the drain began: it moves like the others.
            self.tell_drain(i);
        }
    }

    fn end(&mut self, index: usize, code: RejectCode, why: &str) {
        let Some(a) = self.active[index].as_mut() else { return };
        if a.phase == Phase::Ending {
            return;
        }
        a.phase = Phase::Ending;
        self.dirty = true;
        let r = Reject::new(code, "", why);
        for c in &a.conns {
            let _ = self.net.send(c.id, bytemuck::bytes_of(&r));
            self.net.close(c.id);
        }
        for l in 0..a.spec.shards as usize {
            let _ = self.lcores[l].send(Command::EndJob { index: index as u16 });
        }
    }

    fn failed(&mut self, lcore: usize, tag: u16, reason: &str) {
        let Some((i, a)) = self.find(tag) else { return };
        log::warn!("job {:#x} failed on lcore {lcore}: {reason}", a.job_id);
        self.end(i, RejectCode::JobFailed, &format!("lcore {lcore}: {reason}"));
    }

    fn ended(&mut self, lcore: usize, tag: u16, stuck: u32) {
        let Some((i, a)) = self.find(tag) else { return };
        a.ended += 1;
        if stuck > 0 {
            a.stuck_lcores.push(lcore);
        }
        if a.phase != Phase::Ending {
            // An lcore gave the job up on its own (e.g. a client unreachable).
            a.phase = Phase::Ending;
        }
        if a.ended < a.spec.shards {
            return;
        }
        let a = self.active[i].take().unwrap();
        for (l, (off, len)) in a.regions.iter().enumerate() {
            if !a.stuck_lcores.contains(&l) {
                self.allocs[l].release(*off, *len);
            }
        }
        for c in &a.conns {
            self.conn_job.remove(&c.id);
        }
        if a.stuck_lcores.is_empty() {
            log::info!("job {:#x} ended; its slab regions are free", a.job_id);
        } else {
            let regions = a.stuck_lcores.iter().map(|&l| (l, a.regions[l].0, a.regions[l].1)).collect();
            self.quarantined[i] = Some(Quarantine { job_id: a.job_id, tag: a.tag, regions });
            let left = self.quarantined.iter().filter(|q| q.is_none()).count();
            log::warn!(
                "job {:#x} ended with operations to vanished ranks still in flight on lcores {:?}; their slab regions and job slot {i} stay quarantined until the provider returns them ({left} of {} job slots left)",
                a.job_id,
                a.stuck_lcores,
                self.quarantined.len()
            );
        }
    }

    fn released(&mut self, lcore: usize, tag: u16) {
        let Some(i) = self.quarantined.iter().position(|q| q.as_ref().is_some_and(|q| q.tag == tag)) else { return };
        let Some(q) = self.quarantined[i].as_mut() else { return };
        if let Some(k) = q.regions.iter().position(|r| r.0 == lcore) {
            let (l, off, len) = q.regions.swap_remove(k);
            self.allocs[l].release(off, len);
        }
        if q.regions.is_empty() {
            log::info!("job {:#x}: the provider returned its last stuck operations; job slot {i} is back in service", q.job_id);
            self.quarantined[i] = None;
        }
    }

    /// Tells every lcore of job `i` that `rank` is gone: what they still
    /// have queued to it will never be taken (see `ShardWorker`).
    fn rank_gone(&self, i: usize, rank: u32) {
        let Some(a) = self.active[i].as_ref() else { return };
        for l in 0..a.spec.shards as usize {
            let _ = self.lcores[l].send(Command::RankGone { index: i as u16, rank });
        }
    }

    fn bye(&mut self, conn: u64) {
        let Some(&job_id) = self.conn_job.get(&conn) else { return };
        let Some(i) = self.active_of(conn) else { return };
        let a = self.active[i].as_mut().unwrap();
        if let Some(c) = a.conns.iter().find(|c| c.id == conn) {
            a.done[c.rank as usize] = true;
        }
        if a.done.iter().all(|&d| d) && a.phase != Phase::Ending {
            if a.drain.as_ref().is_some_and(|d| !d.rejoin) {
                log::info!("job {job_id:#x}: every rank left this draining server; ending the job here");
            } else {
                log::info!("job {job_id:#x}: every rank finished; ending the job");
            }
            a.phase = Phase::Ending;
            for l in 0..a.spec.shards as usize {
                let _ = self.lcores[l].send(Command::EndJob { index: i as u16 });
            }
            return;
        }
        // The others must not start another all-reduce: the lcores fail the
        // job at once if they do, rather than at the op timeout. (Every round
        // this rank took part in was complete before it could say Bye.)
        if a.phase == Phase::Running {
            let rank = a.conns.iter().find(|c| c.id == conn).map(|c| c.rank);
            for (l, rank) in (0..a.spec.shards as usize).zip(std::iter::repeat(rank).flatten()) {
                let _ = self.lcores[l].send(Command::RankFinished { index: i as u16, rank });
            }
        }
        // A rank that finished counts as answered: it cuts no more operations.
        self.decide_switch(i);
    }

    /// Starts draining when asked; ends it when no job is left, or ends the
    /// jobs still here at the drain timeout.
    fn check_drain(&mut self, now: Instant) {
        if self.draining.is_none() {
            if !self.drain_requested.load(Ordering::Relaxed) {
                return;
            }
            self.start_drain(now);
        }
        let Some(d) = self.draining.as_mut() else { return };
        if self.drained.load(Ordering::Relaxed) {
            return;
        }
        let left = self.active.iter().flatten().count();
        if left == 0 && self.pending.is_empty() {
            log::info!("drained: no job left after {:.1?}", now.duration_since(d.since));
            self.drained.store(true, Ordering::Relaxed);
            return;
        }
        let waited = now.duration_since(d.since);
        if !d.timed_out && waited >= self.drain_timeout {
            d.timed_out = true;
            let msg = format!("the server drained for drain_timeout_s={} and ends the jobs still on it", self.drain_timeout.as_secs());
            log::warn!("drain timeout: ending {left} jobs still here");
            for i in 0..self.active.len() {
                if let Some(a) = self.active[i].as_ref() {
                    log::warn!("job {:#x}: {msg}", a.job_id);
                }
                self.end(i, RejectCode::Draining, &msg);
            }
        } else if d.timed_out && waited >= self.drain_timeout + Duration::from_secs(3) {
            // Lcores that cannot drain those jobs: stop anyway (the shutdown
            // path bounds the wait for them once more).
            log::warn!("drain: {left} jobs still ending 3 s after the drain timeout; stopping anyway");
            self.drained.store(true, Ordering::Relaxed);
        }
    }

    fn start_drain(&mut self, now: Instant) {
        self.dirty = true;
        self.health.advance(ServerPhase::Draining);
        let running: Vec<usize> =
            (0..self.active.len()).filter(|&i| self.active[i].as_ref().is_some_and(|a| a.phase == Phase::Running)).collect();
        let ranks: u32 = running.iter().filter_map(|&i| self.active[i].as_ref()).map(|a| a.spec.nranks).sum();
        log::info!(
            "draining: {} running jobs ({ranks} ranks) move to their other servers; admitting no new jobs; exit when no job is left or after drain_timeout_s={}",
            running.len(),
            self.drain_timeout.as_secs()
        );
        self.draining = Some(Draining { since: now, timed_out: false });
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            let mut p = self.pending.remove(&id).unwrap();
            log::info!("job {id:#x} refused: the server is draining ({} of {} ranks had joined)", p.joined, p.spec.nranks);
            for c in p.conns.iter_mut().flatten() {
                self.conn_job.remove(&c.id);
                refuse(&mut self.net, c, RejectCode::Draining, "", "the server is draining (shutting down): it admits no new jobs");
            }
        }
        for i in running {
            self.tell_drain(i);
        }
    }

    /// Sends every rank of job `i` that has not finished a Drain.
    fn tell_drain(&mut self, i: usize) {
        let timeout_s = self.drain_timeout.as_secs().min(u32::MAX as u64) as u32;
        let Some(a) = self.active[i].as_mut() else { return };
        // A rejoined job drains like any other once it is back in use.
        let rejoined = a.drain.as_ref().is_some_and(|d| d.rejoin && d.switch_at.is_some());
        if (a.drain.is_some() && !rejoined) || a.phase != Phase::Running {
            return;
        }
        a.drain = Some(JobDrain { boundaries: vec![None; a.spec.nranks as usize], switch_at: None, rejoin: false });
        let msg = Drain::new(timeout_s);
        for c in &a.conns {
            if a.done[c.rank as usize] {
                continue;
            }
            if let Err(e) = self.net.send(c.id, bytemuck::bytes_of(&msg)) {
                log::warn!("job {:#x}: cannot tell rank {} at {} that the server drains: {e}", a.job_id, c.rank, c.peer);
            }
        }
        self.decide_switch(i);
    }

    /// A rejoined job: ask every rank where it can take this server back.
    fn tell_rejoin(&mut self, i: usize) {
        let Some(a) = self.active[i].as_mut() else { return };
        a.drain = Some(JobDrain { boundaries: vec![None; a.spec.nranks as usize], switch_at: None, rejoin: true });
        let msg = Header::new(Kind::Rejoin);
        for c in &a.conns {
            if let Err(e) = self.net.send(c.id, bytemuck::bytes_of(&msg)) {
                log::warn!("job {:#x}: cannot ask rank {} at {} where it rejoins: {e}", a.job_id, c.rank, c.peer);
            }
        }
    }

    fn boundary(&mut self, conn: u64, next_op: u64) {
        let Some(&job_id) = self.conn_job.get(&conn) else { return };
        let Some(i) = self.active_of(conn) else { return };
        let a = self.active[i].as_mut().unwrap();
        let Some(rank) = a.conns.iter().find(|c| c.id == conn).map(|c| c.rank as usize) else { return };
        let Some(d) = a.drain.as_mut() else {
            log::warn!("job {job_id:#x}: rank {rank} sent a boundary, but the server does not drain; ignored");
            return;
        };
        if d.switch_at.is_some() || d.boundaries[rank].is_some() {
            log::warn!("job {job_id:#x}: rank {rank} sent a second boundary; ignored");
            return;
        }
        d.boundaries[rank] = Some(next_op);
        if next_op == Boundary::STAY {
            log::debug!("job {job_id:#x}: rank {rank} has no other server");
        } else {
            log::debug!("job {job_id:#x}: rank {rank} can move from operation {next_op}");
        }
        self.decide_switch(i);
    }

    /// Once every rank answered (or finished), picks the switch operation
    /// and tells every rank still here.
    fn decide_switch(&mut self, i: usize) {
        let Some(a) = self.active[i].as_mut() else { return };
        if a.phase != Phase::Running {
            return;
        }
        let Some(d) = a.drain.as_mut() else { return };
        if d.switch_at.is_some() {
            return;
        }
        let mut k = 0u64;
        for (r, b) in d.boundaries.iter().enumerate() {
            match b {
                Some(b) => k = k.max(*b), // STAY is u64::MAX: it wins
                None if a.done[r] => {}
                None => return,
            }
        }
        d.switch_at = Some(k);
        if d.rejoin {
            log::info!("job {:#x}: rejoined: every rank uses this server again from operation {k}", a.job_id);
        } else if k == Boundary::STAY {
            log::info!(
                "job {:#x}: a rank has no other server to move to; the job stays here until it ends (at most drain_timeout_s={})",
                a.job_id,
                self.drain_timeout.as_secs()
            );
        } else {
            log::info!("job {:#x}: every rank moves off this server from operation {k}", a.job_id);
        }
        let msg = SwitchAt::new(k);
        for c in &a.conns {
            if a.done[c.rank as usize] {
                continue;
            }
            if let Err(e) = self.net.send(c.id, bytemuck::bytes_of(&msg)) {
                log::warn!("job {:#x}: cannot send the switch to rank {} at {}: {e}", a.job_id, c.rank, c.peer);
            }
        }
    }

    /// A rank lost other servers of job `conn`'s job and takes this server
    /// as the recovery's leader.
    fn lost(&mut self, conn: u64, dead: u64, boundary: u64, report: Vec<u8>) {
        let Some(&job_id) = self.conn_job.get(&conn) else { return };
        let Some(i) = self.active_of(conn) else { return };
        let a = self.active[i].as_mut().unwrap();
        let Some(rank) = a.conns.iter().find(|c| c.id == conn).map(|c| c.rank as usize) else { return };
        if a.phase != Phase::Running {
            return;
        }
        let nranks = a.spec.nranks as usize;
        let r = a.recovery.get_or_insert_with(|| JobRecovery { dead: 0, reports: vec![None; nranks] });
        if dead & !r.dead != 0 {
            // News: a new round. Every rank hears the whole set and reports it.
            r.dead |= dead;
            r.reports.iter_mut().for_each(|x| *x = None);
            log::warn!("job {job_id:#x}: rank {rank} lost servers {:#x}; the job recovers on the others (led here)", r.dead);
            let msg = wire::Failover::new(r.dead);
            for c in &a.conns {
                if !a.done[c.rank as usize] {
                    if let Err(e) = self.net.send(c.id, bytemuck::bytes_of(&msg)) {
                        log::warn!("job {job_id:#x}: cannot tell rank {} at {} of the failover: {e}", c.rank, c.peer);
                    }
                }
            }
        }
        if dead != r.dead {
            return; // an older view; the rank reports again after the Failover
        }
        r.reports[rank] = Some((boundary, report));
        let mut k = 0u64;
        let mut len = None;
        for (rk, x) in r.reports.iter().enumerate() {
            match x {
                Some((b, rep)) => {
                    k = k.max(*b);
                    if *len.get_or_insert(rep.len()) != rep.len() {
                        let msg = format!("ranks sent recovery reports of different lengths ({} and {})", len.unwrap(), rep.len());
                        log::warn!("job {job_id:#x}: {msg}");
                        self.end(i, RejectCode::JobFailed, &msg);
                        return;
                    }
                }
                None if a.done[rk] => {
                    // It finished and left: it cannot take part in a redo.
                    let msg = format!("rank {rk} had finished and left when the job lost servers {:#x}", r.dead);
                    log::warn!("job {job_id:#x}: {msg}");
                    self.end(i, RejectCode::JobFailed, &msg);
                    return;
                }
                None => return,
            }
        }
        let len = len.unwrap_or(0);
        let mut msg = Vec::with_capacity(32 + nranks * len);
        msg.extend_from_slice(bytemuck::bytes_of(&wire::Recover::new(r.dead, k, nranks as u32, len as u32)));
        for (_, rep) in r.reports.iter().flatten() {
            msg.extend_from_slice(rep);
        }
        log::info!("job {job_id:#x}: every rank reported losing servers {:#x}; switching at operation {k}", r.dead);
        r.reports.iter_mut().for_each(|x| *x = None);
        for c in &a.conns {
            if let Err(e) = self.net.send(c.id, &msg) {
                log::warn!("job {job_id:#x}: cannot send the recovery to rank {} at {}: {e}", c.rank, c.peer);
            }
        }
    }

    fn closed(&mut self, conn: u64) {
        let Some(job_id) = self.conn_job.remove(&conn) else { return };
        if let Some(p) = self.pending.get_mut(&job_id) {
            let Some(slot) = p.conns.iter_mut().find(|c| c.as_ref().is_some_and(|c| c.id == conn)) else { return };
            let c = slot.take().unwrap();
            let mut p = self.pending.remove(&job_id).unwrap();
            // The rank is gone (its process died, or its client gave up): the
            // job cannot start. Tell the ranks already in now, and the ones
            // still coming when they come, rather than keep them all until
            // the join timeout.
            let msg = format!("rank {} left (its connection closed) while the job was joining; the join failed", c.rank);
            log::warn!("job {job_id:#x}: {msg} for the {} ranks in", p.joined - 1);
            self.counters.joins_failed.fetch_add(1, Ordering::Relaxed);
            for other in p.conns.iter_mut().flatten() {
                self.conn_job.remove(&other.id);
                refuse(&mut self.net, other, RejectCode::JobFailed, "", &msg);
            }
            let now = Instant::now();
            self.failed_joins.retain(|_, t| t.until > now);
            self.failed_joins.insert(job_id, Tombstone { until: now + self.join_timeout, why: msg, rejoins: true });
            return;
        }
        if let Some(i) = self.active_of(conn) {
            let a = self.active[i].as_ref().unwrap();
            let rank = a.conns.iter().find(|c| c.id == conn).map_or(u32::MAX, |c| c.rank);
            if a.done.get(rank as usize).copied().unwrap_or(false) {
                return; // it said bye first: a clean departure
            }
            if a.phase != Phase::Ending {
                log::warn!("job {job_id:#x}: rank {rank} disconnected without finishing; failing the job");
                // Closed by the rank's side (we had not shut it down): the
                // rank's process, or at least its client, is gone.
                self.rank_gone(i, rank);
                let now = Instant::now();
                self.failed_joins.retain(|_, t| t.until > now);
                let why = format!("the job failed on this server: its rank {rank} disconnected without finishing");
                self.failed_joins.insert(job_id, Tombstone { until: now + FAILED_JOB_REFUSED_FOR, why, rejoins: false });
            }
            self.end(i, RejectCode::JobFailed, &format!("rank {rank} disconnected without finishing"));
        }
    }

    fn expire_pending(&mut self, now: Instant) {
        let expired: Vec<u64> = self.pending.iter().filter(|(_, p)| p.deadline <= now).map(|(k, _)| *k).collect();
        for id in expired {
            let mut p = self.pending.remove(&id).unwrap();
            let msg = format!("only {} of {} ranks joined within {:?}", p.joined, p.spec.nranks, self.join_timeout);
            log::warn!("job {id:#x} refused: {msg}");
            for c in p.conns.iter_mut().flatten() {
                self.conn_job.remove(&c.id);
                refuse(&mut self.net, c, RejectCode::Timeout, "", &msg);
            }
            self.dirty = true;
        }
    }

    /// Ends running jobs that moved no bytes for the idle timeout.
    fn expire_idle(&mut self) {
        let Some(limit) = self.idle_timeout else { return };
        let now = Instant::now();
        if now < self.next_idle_check {
            return;
        }
        self.next_idle_check = now + Duration::from_secs(1).min(limit / 4);
        for i in 0..self.active.len() {
            let Some(a) = self.active[i].as_mut() else { continue };
            if a.phase != Phase::Running {
                continue;
            }
            let bytes: u64 = (0..a.spec.shards as usize).map(|l| self.metrics.job(l, i).bytes_in.load(Ordering::Relaxed)).sum();
            if bytes != a.seen_bytes {
                a.seen_bytes = bytes;
                a.last_traffic = now;
                continue;
            }
            if now.duration_since(a.last_traffic) < limit {
                continue;
            }
            let msg = format!("no traffic for {}s (idle_timeout_s); the job's slots are freed", limit.as_secs());
            log::warn!("job {:#x}: {msg}", a.job_id);
            self.end(i, RejectCode::Timeout, &msg);
        }
    }

    fn refuse_all(&mut self, conns: &mut [Conn], code: RejectCode, field: &str, msg: &str) {
        for c in conns {
            self.conn_job.remove(&c.id);
            refuse(&mut self.net, c, code, field, msg);
        }
    }

    fn publish(&mut self) {
        let mut v: Vec<JobInfo> = self
            .pending
            .values()
            .map(|p| JobInfo {
                job_id: p.spec.job_id,
                tag: None,
                index: None,
                nranks: p.spec.nranks,
                joined: p.joined,
                dtype: p.spec.dtype.name(),
                op: p.spec.op.name(),
                state: "joining",
            })
            .collect();
        v.extend(self.active.iter().enumerate().filter_map(|(i, a)| Some((i, a.as_ref()?))).map(|(i, a)| JobInfo {
            job_id: a.job_id,
            tag: Some(a.tag),
            index: Some(i as u16),
            nranks: a.spec.nranks,
            joined: a.spec.nranks,
            dtype: a.spec.dtype.name(),
            op: a.spec.op.name(),
            state: match a.phase {
                Phase::Starting => "starting",
                // Running on a draining server: moving off it, or staying to its end.
                Phase::Running if a.drain.is_some() => "draining",
                Phase::Running => "running",
                Phase::Ending => "ending",
            },
        }));
        *self.published.lock().unwrap() = v;
        for (l, a) in self.allocs.iter().enumerate() {
            let g = self.metrics.gauges(l);
            g.slab_used.store((a.total() - a.free_bytes()) as u64, Ordering::Relaxed);
            g.slab_bytes.store(a.total() as u64, Ordering::Relaxed);
        }
    }

    /// Stop: refuse the joining, end the running, wait (bounded) for the
    /// lcores to drain so their regions are quiet before they are unmapped.
    fn shut_down(&mut self, events: &Receiver<Event>) {
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            let mut p = self.pending.remove(&id).unwrap();
            for c in p.conns.iter_mut().flatten() {
                refuse(&mut self.net, c, RejectCode::Shutdown, "", "the server is shutting down");
            }
        }
        for i in 0..self.active.len() {
            self.end(i, RejectCode::Shutdown, "the server is shutting down");
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut happened = Vec::new();
        while self.active.iter().any(Option::is_some) && Instant::now() < deadline {
            // Turning the loop writes the rejects out; lcore events come on the channel.
            self.net.turn(Duration::from_millis(20), &mut happened);
            happened.clear();
            while let Ok(ev) = events.try_recv() {
                self.handle(ev);
            }
        }
        self.net.flush_all();
        self.publish();
    }
}

/// Refuses a rank's join: the reject, then the close (counted by reason).
fn refuse(net: &mut Connections, c: &Conn, code: RejectCode, field: &str, msg: &str) {
    net.refuse(c.id, code, field, msg);
}

/// The latency lcores a job on `shards` lcores is told of: none when it has
/// no bulk lcore (every one of its lcores then takes every operation).
fn accept_latency_lcores(latency_lcores: u8, shards: u32) -> u8 {
    if shards > latency_lcores as u32 {
        latency_lcores
    } else {
        0
    }
}

fn mismatch_field(a: &JobSpec, b: &JobSpec) -> &'static str {
    if a.nranks != b.nranks {
        "nranks"
    } else if a.dtype != b.dtype {
        "dtype"
    } else if a.op != b.op {
        "op"
    } else if a.chunk_elems != b.chunk_elems {
        "chunk_elems"
    } else if a.window != b.window {
        "window"
    } else if a.relay != b.relay || a.split != b.split {
        "flags"
    } else {
        "shards"
    }
}
