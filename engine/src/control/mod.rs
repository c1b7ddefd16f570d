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
//!
//! Files: this one holds the state and the loop (`ControlPlane::run`,
//! `handle`, `publish`); `join.rs` admits jobs, `jobs.rs` follows them to
//! their end, `drain.rs` drains, `failover.rs` is the servers' part of a
//! failover (lost reports, rejoins, fencing), `liveness.rs` watches the
//! lcores and sends heartbeats; `conn/` the connections, `admission.rs`
//! the limits on them, `budget.rs` and `alloc.rs` the slab; `token.rs` the
//! shared job token; `error.rs` why the control plane could not be set up.
//!
//! # A server: threads, the control loop, admission
//!
//! `Server::start` (engine/src/server/mod.rs) launches one lcore per configured core
//! (`lcore::launch`). On its own thread, after pinning, each lcore opens its own libfabric endpoint
//! (own fabric, domain, AV, CQ, `FI_THREAD_DOMAIN`, manual progress), maps its slab (hugetlb 1G/2M,
//! else THP, else 4K pages: `engine/src/dataplane/slab/mod.rs`) touching it there so pages are
//! NUMA-local, registers it once, and becomes a `ShardWorker` that nothing else references.
//!
//! **The control plane is one thread**: every control connection, from its accept to its close, is a
//! non-blocking socket on one mio (epoll) poll. The module doc of `engine/src/control/conn/mod.rs` is
//! the long version (handshakes, a joined rank's few messages, per-connection out-buffers for answers
//! up to a `Recover` of megabytes to a thousand ranks), with why mio and not a tokio runtime: nothing
//! here awaits anything but sockets and deadlines. A peer that leaves 64 MiB unread is closed.
//! Deadlines are timers of that loop: handshake deadlines are a FIFO (one timeout for all, so it is
//! sorted), and a job's join deadline and the 20 ms tick (idle check, lcore watchdog, drain request,
//! stop) bound each `epoll_wait`. A server's threads are its lcores, this thread, the metrics
//! endpoint's and the main thread, whatever the number of connections; at start it raises its
//! open-files limit to the hard limit and warns when that is short of what the ranks it may admit can
//! hold (`engine/src/host/limits.rs`).
//!
//! **Admission** (`control/admission.rs`, whose module doc has the two bounds on unauthenticated
//! handshakes and why they let a rank with a valid token through a storm):
//! `max_handshakes_per_source` defaults to 256 (`--max-handshakes-per-source`), `max_handshakes` to
//! 16,384 (`--max-handshakes`). A client told `busy` joins again after a jittered backoff (50 ms
//! doubling to 2 s) until its join deadline (`ClientConfig::join_timeout`, `TALLY_JOIN_TIMEOUT_S`,
//! default 120 s), then fails saying how long it tried. Refused and expired connections are
//! summarized in one log line a second. A refused connection is not closed at once: its Hello may
//! already sit unread in the server's socket, and closing with unread bytes sends a reset that can
//! reach the client before the reject does; the reject is followed by a FIN and the socket lingers
//! (up to 1 s, at most 4096 at once) until the client closes. Storms measured: [measurements, "Many
//! ranks"](docs/measurements.md#many-ranks). An lcore checks its commands every 32nd empty poll, not
//! every one: with the housekeeping clock read, that cost a busy lcore 9% of its turns
//! ([measurements](docs/measurements.md#a-server)).
pub mod alloc;
pub mod backoff_gate;
pub mod budget;

use crate::dataplane::fabric::EndpointName;
use crate::dataplane::metrics::{ControlCounters, JobInfo, MetricsTable, ServerHealth, ServerPhase};
use crate::dataplane::shard::{Command, Event};
use crate::host::config::ServerConfig;
use crate::wire::{JobSecret, JobSpec, Limits, RejectCode};
use alloc::{RangeAlloc, REGION_ALIGN};
use conn::{ConnEvent, Connections, Rules};
use error::SetupError;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod admission;
pub mod conn;
mod drain;
pub mod error;
mod failover;
mod join;
use join::refuse;
mod jobs;
mod liveness;
mod reserve;
pub mod round_budget;
pub mod token;

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
    /// Its first rank's secret: every other rank must bring the same.
    secret: JobSecret,
    rejoin: bool,
    conns: Vec<Option<Conn>>,
    /// Per rank, its endpoint names (see [`conn::Joining::names`]).
    names: Vec<Option<Vec<EndpointName>>>,
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
    /// What a rejoin must bring to fence it (`wire::auth`).
    secret: JobSecret,
    /// Its sequence key (`wire::JobTag`), told to its ranks in the Accept.
    key: u32,
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
    /// The recovery rounds it may still start here, and its lines logged.
    rounds: round_budget::RoundBudget,
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
    /// Union of the lost servers ranks reported in this round (bits of the
    /// job's server list); the round, and this, end with the `Recover`.
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
    /// What communicators' first jobs keep for their later jobs (`reserve`).
    rooms: Vec<reserve::Rooms>,
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
    /// How often a rejoin's backoff check looks at this server's own connections.
    backoff_gate: backoff_gate::BackoffGate,
    /// Alive and ready, for `/healthz` and `/readyz`: this loop stamps every
    /// turn and moves the phase (serving, draining, stopping).
    health: Arc<ServerHealth>,
    /// systemd's watchdog, fed from this loop (None: not asked for).
    systemd_watchdog: Option<WatchdogFeed>,
    /// The floor of the provider connections' TCP timers, set on new ones
    /// every [`RTO_SWEEP_EVERY`] (tcp only; `host::tcp_rto_min` says why).
    rto_floor: Option<crate::host::tcp_rto_min::RtoFloor>,
    next_rto_sweep: Instant,
    /// Until then the sweep runs every [`RTO_SWEEP_SOON`]: a job was just
    /// admitted (a join or a rejoin), and its ranks' first sends open the
    /// provider connections the floor is for.
    rto_settle_until: Instant,
}

/// How often the control loop looks for new provider connections to set
/// the floor of their TCP timers on (a walk of /proc/self/fd).
const RTO_SWEEP_EVERY: Duration = Duration::from_secs(1);

// The walks' pace after a job's admission, the ranks' own (`host::tcp_rto_min`).
use crate::host::tcp_rto_min::{RANK_SWEEP_SOON as RTO_SWEEP_SOON, SETTLE as RTO_SETTLE};

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
    /// The failed job's: joins with another secret are another job's.
    secret: JobSecret,
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
    /// The lcore's wait for a CPU (`host::cpu_wait`) when it last moved, read
    /// at most once a second: the watchdog holds it to time it could run.
    waited: Option<(Instant, Duration)>,
    stuck: bool,
}

/// An lcore whose poll count has not moved for this long is stuck (inside a
/// provider call: e.g. shm spinning on the lock of a peer process that died
/// holding it). Every lcore polls at least every few milliseconds, idle or not.
/// Time the lcore spent waiting for a CPU does not count (`host::cpu_wait`):
/// on a starved host its jobs wait instead of failing.
pub const LCORE_STUCK_AFTER: Duration = Duration::from_secs(5);

/// An lcore whose poll count has not moved for this long proves nothing:
/// its jobs' heartbeats are withheld (their ranks fail over after their
/// liveness time) well before [`LCORE_STUCK_AFTER`] ends the jobs here.
pub const LCORE_QUIET_AFTER: Duration = Duration::from_secs(1);

/// The longest the loop sleeps: how soon it sees a drain request, a stop,
/// and the timers that are not handshake deadlines.
const TICK: Duration = Duration::from_millis(20);

/// Binds the control port, with a backlog deep enough for a thousand ranks
/// connecting in the same millisecond (std's is 128; past the backlog a
/// connection waits out a SYN retransmit, a second or more).
pub fn listen(addr: &str) -> Result<std::net::TcpListener, SetupError> {
    use std::net::ToSocketAddrs;
    let at = addr
        .to_socket_addrs()
        .map_err(|source| SetupError::Listen { addr: addr.to_string(), source })?
        .next()
        .ok_or_else(|| SetupError::NoAddress { addr: addr.to_string() })?;
    let bind = || -> std::io::Result<std::net::TcpListener> {
        let s = socket2::Socket::new(socket2::Domain::for_address(at), socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
        s.set_reuse_address(true)?;
        s.bind(&at.into())?;
        s.listen(LISTEN_BACKLOG)?;
        Ok(s.into())
    };
    bind().map_err(|source| SetupError::Listen { addr: addr.to_string(), source })
}

/// The kernel caps it at net.core.somaxconn (4096 on current kernels).
const LISTEN_BACKLOG: i32 = 4096;

/// What a handshake is checked against, from the configuration.
pub fn rules(cfg: &ServerConfig) -> Result<Rules, SetupError> {
    let token = token::load(cfg)?;
    if token.is_none() {
        log::warn!("no token configured (TALLY_TOKEN or token_file): any client that can reach this server may join jobs");
    }
    let n = cfg.lcores.len() as u32;
    Ok(Rules {
        limits: Limits { max_ranks: cfg.max_ranks, max_window: cfg.max_window, max_chunk_bytes: cfg.max_chunk, lcores: n },
        token,
        // The lcores' names are not known yet: `Connections::expect_names`.
        names: crate::dataplane::fabric::NameShape::Any,
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
    ) -> ControlPlane {
        let n = cfg.lcores.len();
        let allocs: Vec<RangeAlloc> = (0..n).map(|_| RangeAlloc::new(cfg.slab_size as usize, REGION_ALIGN)).collect();
        // The slab gauges hold from the start (`publish` keeps them current).
        for (l, a) in allocs.iter().enumerate() {
            metrics.gauges(l).slab_bytes.store(a.total() as u64, Ordering::Relaxed);
        }
        ControlPlane {
            limits: Limits { max_ranks: cfg.max_ranks, max_window: cfg.max_window, max_chunk_bytes: cfg.max_chunk, lcores: n as u32 },
            join_timeout: Duration::from_secs(cfg.join_timeout_s.max(1)),
            latency_lcores: cfg.latency_lcores.min(255) as u8,
            // The server sets it to 0 over shm (server::Server::start).
            stage_buffers: cfg.stage_buffers,
            latency_max_log2: cfg.latency_max.max(1).trailing_zeros() as u8,
            names,
            lcores,
            counters,
            dirty: true,
            pending: HashMap::new(),
            active: (0..cfg.max_jobs).map(|_| None).collect(),
            last_tag: 0,
            quarantined: (0..cfg.max_jobs).map(|_| None).collect(),
            allocs,
            rooms: Vec::new(),
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
            backoff_gate: backoff_gate::BackoffGate::default(),
            health: Arc::new(ServerHealth::new()),
            systemd_watchdog: None,
            rto_floor: crate::host::tcp_rto_min::RtoFloor::from_env(),
            next_rto_sweep: Instant::now(),
            rto_settle_until: Instant::now(),
            net,
        }
    }

    /// Publishes liveness and phase to `health`; with `watchdog_period`
    /// (systemd's `WATCHDOG_USEC`), feeds the watchdog every half of it.
    pub fn with_health(mut self, health: Arc<ServerHealth>, watchdog_period: Option<Duration>) -> ControlPlane {
        self.health = health;
        self.systemd_watchdog = watchdog_period.map(|p| WatchdogFeed { every: p / 2, next: Instant::now(), warned: false });
        self
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
        self.watchdog =
            stats.into_iter().map(|stats| Watch { polls: stats.snapshot().polls, stats, moved: now, waited: None, stuck: false }).collect();
        self
    }

    /// The control thread's loop, until `stop`: set-up is done (the listener
    /// and every lcore are up); each turn waits in epoll for connections or
    /// an lcore's wake-up, at most until the next deadline, then runs the
    /// timers. Tear-down is [`ControlPlane::shut_down`].
    pub fn run(mut self, events: Receiver<Event>, stop: Arc<AtomicBool>) {
        let mut happened = Vec::new();
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
            self.sweep_rto_floor(now);
            if std::mem::take(&mut self.dirty) {
                self.publish();
            }
        }
        self.health.advance(ServerPhase::Stopping);
        self.shut_down(&events);
    }

    /// Sets the TCP floor on the provider connections opened since the last
    /// sweep: every TCP connection of this process but the control port's.
    fn sweep_rto_floor(&mut self, now: Instant) {
        if now < self.next_rto_sweep || !self.net.names_are_socket_addresses() {
            return;
        }
        let Some(floor) = self.rto_floor.as_mut() else { return };
        self.next_rto_sweep = now + if now < self.rto_settle_until { RTO_SWEEP_SOON } else { RTO_SWEEP_EVERY };
        floor.sweep(None, self.net.listen_port());
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
