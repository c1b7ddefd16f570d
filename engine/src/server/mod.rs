//! The reduction server: lcores serving shards, and the control plane that
//! admits jobs.
//!
//! [`Server::start`] pins one lcore per configured core. Each builds, on its
//! own thread, its endpoint, its slab (registered once) and a
//! [`shard::ShardWorker`], then runs the poll loop in [`crate::dataplane::lcore`].
//! The control plane ([`control`]) listens on TCP, validates handshakes,
//! gathers a job's ranks, carves the job a region in every lcore's slab
//! (with a piece size that fits its share: [`budget`]) and hands it to the
//! lcores; after that it only hears back when a job becomes ready, fails or
//! ends. It never touches the dataplane's memory.
//!
//! [`Server::drain`] asks the control plane to drain (see [`control`]): no new
//! jobs, running jobs move to their other servers at an operation boundary
//! they agree on, and [`Server::drained`] turns true once no job is left
//! (or the drain timeout ended the rest); `tally server` then exits.
//!
//! With `metrics` configured, a third kind of thread serves the lcores'
//! counters and the per-job counter blocks ([`crate::dataplane::metrics`]) over HTTP in
//! the Prometheus text format, and `/healthz` and `/readyz` from the
//! control loop's [`ServerHealth`]; it only reads. Under systemd's watchdog
//! (`WATCHDOG_USEC`) the control loop feeds it.
use crate::control::{self, alloc::REGION_ALIGN};
use crate::dataplane::shard::{self, Command, Event};

use crate::dataplane::fabric::{select_provider, EndpointConfig, EndpointName, Hints, NameShape};
use crate::dataplane::lcore::{self, LcoreSet, PollMode, Snapshot};
use crate::dataplane::metrics::{ControlCounters, JobInfo, MetricsServer, MetricsTable, ServerHealth, ServerPhase};
use crate::dataplane::slab::{HugepagePolicy, Slab, SlabConfig};
use crate::host::config::ServerConfig;
use crate::host::cpuset::{CoreList, CpusetError};
use crate::reduce::Kernels;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

pub mod error;
use error::{LcoreSetupError, StartError};

/// A running server.
pub struct Server {
    lcores: Option<LcoreSet>,
    control: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    local_addr: SocketAddr,
    provider: String,
    names: Vec<EndpointName>,
    jobs: Arc<Mutex<Vec<JobInfo>>>,
    metrics: Option<MetricsServer>,
    drain_requested: Arc<AtomicBool>,
    drained: Arc<AtomicBool>,
    health: Arc<ServerHealth>,
}

impl Server {
    /// Starts lcores and the control plane; returns once every lcore is
    /// serving and the listener is bound.
    pub fn start(cfg: &ServerConfig) -> Result<Server, StartError> {
        let listen_host = cfg.listen.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']'])).unwrap_or("");
        let loopback = matches!(listen_host, "127.0.0.1" | "localhost" | "::1");
        let provider = select_provider(cfg.provider.as_deref(), loopback);
        let node = match (&cfg.fabric_addr, provider.starts_with("tcp")) {
            (Some(a), _) => Some(a.clone()),
            (None, true) if !listen_host.is_empty() && listen_host != "0.0.0.0" => Some(listen_host.to_string()),
            _ => None,
        };
        let policy: HugepagePolicy = cfg.hugepages.parse().map_err(StartError::Hugepages)?;
        let mode = PollMode::parse(&cfg.poll).ok_or(StartError::Poll)?;
        let kernels = Kernels::detect().map_err(StartError::Kernels)?;
        let per_job = cfg.max_window * cfg.max_ranks * 2;
        // Two more past every job's: the sweep's (`dataplane::shard::sweep`).
        let contexts = per_job as u64 * cfg.max_jobs as u64 + 2;
        if contexts > 1 << 22 {
            return Err(StartError::TooManyContexts(contexts));
        }
        let listener = control::listen(&cfg.listen)?;
        let local_addr = listener.local_addr().map_err(StartError::Io)?;
        crate::host::limits::raise_for_server(cfg, &provider);
        // The control plane's epoll loop exists before the lcores, so that
        // their events can wake it.
        let counters = Arc::new(ControlCounters::default());
        let net = control::conn::Connections::new(listener, control::rules(cfg)?, counters.clone()).map_err(StartError::ControlLoop)?;
        let waker = net.waker();
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            let _ = waker.wake();
        });

        let (ev_tx, ev_rx) = mpsc::channel::<Event>();
        let ev_tx = shard::EventSender::new(ev_tx, wake);
        let mut cmd_txs = Vec::new();
        let mut cmd_rxs = Vec::new();
        for _ in 0..cfg.lcores.len() {
            let (t, r) = mpsc::channel::<Command>();
            cmd_txs.push(t);
            cmd_rxs.push(Some(r));
        }
        let cmd_rxs = Arc::new(Mutex::new(cmd_rxs));
        let slab_size = cfg.slab_size as usize;
        let (max_jobs, nics) = (cfg.max_jobs as usize, cfg.nics.clone());
        let op_timeout = std::time::Duration::from_secs(cfg.op_timeout_s);
        let setup_provider = provider.clone();
        let ev_for_lcores = Mutex::new(ev_tx.clone());
        // Every counter block, allocated here once: the data path only indexes it.
        let table = MetricsTable::new(cfg.lcores.len(), max_jobs);
        let table_for_lcores = table.clone();
        let table_for_control = table.clone();
        let (lcores, names) = lcore::launch(&cfg.lcores, mode, move |info| {
            let mut hints = Hints::new(&setup_provider).with_node(node.as_deref());
            if let Some(nic) = nics.get(info.id) {
                hints.domain = Some(nic.clone());
            }
            let ecfg = EndpointConfig { hints, cq_size: 0, contexts: contexts as u32, wait_object: mode.wants_wait_object() };
            let mut ep = crate::dataplane::fabric::Endpoint::open(&ecfg)
                .map_err(|source| LcoreSetupError::Endpoint { provider: setup_provider.clone(), source })?;
            let mut scfg = SlabConfig::new(format!("lcore {}", info.id), REGION_ALIGN, slab_size / REGION_ALIGN);
            scfg.policy = policy;
            scfg.page_aligned_slots = true;
            let slab = Slab::new(&scfg).map_err(LcoreSetupError::Slab)?;
            // SAFETY: the worker owns both; it declares `ep` before `slab`, so
            // the endpoint (and this registration) is closed before the slab
            // is unmapped.
            let mh = unsafe { ep.register(slab.as_ptr(), slab.len()) }.map_err(LcoreSetupError::Fabric)?;
            let name = ep.name().map_err(LcoreSetupError::Fabric)?;
            let commands = cmd_rxs.lock().unwrap()[info.id].take().ok_or(LcoreSetupError::StartedTwice)?;
            let events = ev_for_lcores.lock().unwrap().clone();
            log::info!(
                "lcore {} on core {}: provider {}, domain {}, {} polling, kernels {}",
                info.id,
                info.core,
                ep.provider(),
                ep.domain_name(),
                mode.name(),
                kernels.isa()
            );
            let w = shard::ShardWorker::new(shard::ShardSetup {
                lcore: info.id,
                ep,
                slab,
                mh,
                kernels,
                max_jobs,
                per_job,
                commands,
                events,
                metrics: table_for_lcores.clone(),
                op_timeout,
            });
            Ok::<_, LcoreSetupError>((w, name))
        })
        .map_err(StartError::Lcores)?;

        let stop = Arc::new(AtomicBool::new(false));
        let jobs: Arc<Mutex<Vec<JobInfo>>> = Arc::new(Mutex::new(Vec::new()));
        let health = Arc::new(ServerHealth::new());
        let metrics = match &cfg.metrics {
            None => None,
            Some(addr) => {
                let stats: Vec<_> = lcores.lcores().iter().map(|l| l.stats.clone()).collect();
                let jobs2 = jobs.clone();
                let counters = counters.clone();
                let health2 = health.clone();
                let m = MetricsServer::start(addr, health.clone(), move || {
                    let snaps: Vec<Snapshot> = stats.iter().map(|s| s.snapshot()).collect();
                    let infos = jobs2.lock().unwrap().clone();
                    crate::dataplane::metrics::render(&snaps, &table, &infos, &counters, &health2)
                })
                .map_err(StartError::Metrics)?;
                log::info!("metrics on http://{}/metrics", m.local_addr());
                Some(m)
            }
        };
        let (drain_requested, drained) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        drop(ev_tx); // the lcores hold theirs

        // Staged receives leave later ranks' pieces waiting unmatched at the
        // provider; shm 1.17 matches such messages with a stale tag mask
        // (ARCHITECTURE.md, "Provider facts"), and shm reaches 256 peers at
        // most anyway, so over shm every job gets a piece per rank.
        let plane_cfg = ServerConfig { stage_buffers: if provider.starts_with("shm") { 0 } else { cfg.stage_buffers }, ..cfg.clone() };
        // Ranks' endpoint names are held to the form of the lcores' own
        // before any reaches an address vector (`fabric::names`).
        let mut net = net;
        net.expect_names(NameShape::of(&provider, &names[0]));
        let plane = control::ControlPlane::new(&plane_cfg, names.clone(), cmd_txs, net, counters.clone(), jobs.clone(), table_for_control)
            .with_watchdog(lcores.lcores().iter().map(|l| l.stats.clone()).collect())
            .with_drain(drain_requested.clone(), drained.clone());
        let watchdog = crate::host::sd_notify::watchdog_period();
        if let Some(p) = watchdog {
            log::info!("systemd watchdog: the control loop sends WATCHDOG=1 every {:?} (WATCHDOG_USEC: {p:?})", p / 2);
        }
        let plane = plane.with_health(health.clone(), watchdog);
        let stop2 = stop.clone();
        let control =
            std::thread::Builder::new().name("tally-control".into()).spawn(move || plane.run(ev_rx, stop2)).map_err(StartError::Io)?;
        // Ready from here, as `tally server` says READY=1 from here: the
        // listener is bound and the lcores are up, so a request that comes
        // before the control loop's first turn waits in the backlog. (Set by
        // the loop's first turn instead, a probe right after "ready" could
        // read "starting" on a loaded host.)
        health.advance(ServerPhase::Serving);
        log::info!("tally server listening on {local_addr}: {} lcores on cores {}, provider {provider}", cfg.lcores.len(), cfg.lcores);
        Ok(Server {
            lcores: Some(lcores),
            control: Some(control),
            stop,
            local_addr,
            provider,
            names,
            jobs,
            metrics,
            drain_requested,
            drained,
            health,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where `/metrics` is served, when configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.local_addr())
    }

    pub fn provider(&self) -> &str {
        &self.provider
    }

    pub fn lcore_names(&self) -> &[EndpointName] {
        &self.names
    }

    pub fn lcore_count(&self) -> usize {
        self.names.len()
    }

    /// Per-lcore counters.
    pub fn stats(&self) -> Vec<Snapshot> {
        self.lcores.as_ref().map(|l| l.snapshot()).unwrap_or_default()
    }

    /// Jobs the control plane knows about (pending, running, draining).
    pub fn jobs(&self) -> Vec<JobInfo> {
        self.jobs.lock().unwrap().clone()
    }

    /// Starts draining: no new jobs; running jobs move to their other
    /// servers (or stay, when they have none) and leave; see [`Server::drained`].
    pub fn drain(&self) {
        self.drain_requested.store(true, Ordering::Relaxed);
    }

    /// True once a drain finished: no job left, or the drain timeout ended
    /// the rest. [`Server::stop`] then stops what is left.
    pub fn drained(&self) -> bool {
        self.drained.load(Ordering::Relaxed)
    }

    /// Stops accepting, ends every job, stops the lcores (which cancel what
    /// is in flight and close their endpoints) and joins every thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.health.advance(ServerPhase::Stopping);
        // The metrics thread stops first: it reads what the others tear down.
        self.metrics.take();
        if let Some(c) = self.control.take() {
            let _ = c.join();
        }
        if let Some(l) = self.lcores.take() {
            l.stop();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A core list from the configuration, for callers that build one in code.
pub fn cores(list: &str) -> Result<CoreList, CpusetError> {
    CoreList::parse(list)
}
