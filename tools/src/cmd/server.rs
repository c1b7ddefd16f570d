//! `tally server`: run a reduction server until SIGINT or SIGTERM.
//!
//! The first signal drains the server (see `tally_engine::control`):
//! it admits no new jobs, its running jobs move to their other servers at
//! an operation boundary and leave without an error, and the process exits
//! (status 0) when none is left or after `drain_timeout_s`. A second signal
//! stops at once, ending the jobs still there.
//!
//! Under systemd (`Type=notify`, `$NOTIFY_SOCKET` set) it says `READY=1`
//! once it serves (the line "tally server ready on ..." is printed at the
//! same point), `STOPPING=1` at the first signal, and `STATUS=` lines on
//! the way; the watchdog's `WATCHDOG=1` comes from the control loop itself
//! (`tally_engine::control`). Without `$NOTIFY_SOCKET` none of it is sent.
use clap::Args;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tally_engine::host::config::{ServerConfig, ServerFile};
use tally_engine::host::sd_notify;
use tally_engine::server::Server;

#[derive(Args, Debug, Clone, Default)]
pub struct ServerArgs {
    /// Control-plane address, ADDR:PORT (default 127.0.0.1:7400).
    #[arg(long)]
    pub listen: Option<String>,
    /// Cores for the lcores, DPDK syntax, e.g. 2-9,12 (default 0-1).
    #[arg(long)]
    pub lcores: Option<String>,
    /// libfabric provider: efa, shm, tcp or tcp-rdm (default: TALLY_PROVIDER, else efa if present, else shm on loopback, else tcp).
    #[arg(long)]
    pub provider: Option<String>,
    /// busy or adaptive polling (default adaptive; production: busy on isolated cores).
    #[arg(long)]
    pub poll: Option<String>,
    /// Hugepage policy for slabs: require, prefer or off (default prefer).
    #[arg(long)]
    pub hugepages: Option<String>,
    /// Slab size per lcore, e.g. 1G (default 256M).
    #[arg(long)]
    pub slab_size: Option<String>,
    /// Serve Prometheus metrics on ADDR:PORT at /metrics (port 0: any free port).
    #[arg(long)]
    pub metrics: Option<String>,
    /// Seconds an all-reduce may wait for a straggling rank before its job fails (default 30).
    #[arg(long, value_name = "SECONDS")]
    pub op_timeout: Option<u64>,
    /// Milliseconds between heartbeats to the ranks (default 250; 0: none). A
    /// rank that hears none for its liveness time (TALLY_LIVENESS_MS, default
    /// 2000) fails over, as it does when the server dies.
    #[arg(long, value_name = "MS")]
    pub heartbeat_ms: Option<u64>,
    /// Seconds a job may go without traffic before it is ended (default 3600; 0: never).
    #[arg(long, value_name = "SECONDS")]
    pub idle_timeout: Option<u64>,
    /// Seconds a draining server (first SIGTERM or SIGINT) waits for its jobs to move
    /// to other servers or end before it ends them and exits (default 60).
    #[arg(long, value_name = "SECONDS")]
    pub drain_timeout: Option<u64>,
    /// Seconds a client may take to finish its handshake (default 10).
    #[arg(long, value_name = "SECONDS")]
    pub handshake_timeout: Option<u64>,
    /// Seconds all ranks of a job have to join, from the first (default 120).
    #[arg(long, value_name = "SECONDS")]
    pub join_timeout: Option<u64>,
    /// Most jobs served at once (default 16). With --max-ranks, it bounds the
    /// descriptors the server may need, checked against the open-files limit.
    #[arg(long, value_name = "N")]
    pub max_jobs: Option<u32>,
    /// Most ranks in one job (default and ceiling 1024).
    #[arg(long, value_name = "N")]
    pub max_ranks: Option<u32>,
    /// Most connections in their handshake at once (default 16384; when full, the
    /// oldest of the address holding the most is evicted).
    #[arg(long, value_name = "N")]
    pub max_handshakes: Option<u32>,
    /// Most connections in their handshake at once from one address (default 256).
    #[arg(long, value_name = "N")]
    pub max_handshakes_per_source: Option<u32>,
    /// Lcores (the first N of --lcores) kept for small operations, so that a
    /// latency-critical all-reduce never waits behind a bulk job's pieces (default 0).
    #[arg(long, value_name = "N")]
    pub latency_lcores: Option<u32>,
    /// Largest operation the latency lcores take, a power of two (default 64K).
    #[arg(long, value_name = "SIZE")]
    pub latency_max: Option<String>,
    /// Receive buffers per slot for a job whose ranks' pieces would not all
    /// fit its slab budget: it keeps its piece and is received this many
    /// ranks at a time (default 64; 0: such a job gets smaller pieces).
    #[arg(long, value_name = "N")]
    pub stage_buffers: Option<u32>,
    /// TOML configuration file; flags given here override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Validate the configuration and exit without starting.
    #[arg(long)]
    pub check: bool,
}

impl ServerArgs {
    pub fn resolve(&self) -> Result<ServerConfig, String> {
        let file = match &self.config {
            Some(p) => ServerFile::load(p).map_err(|e| e.to_string())?,
            None => ServerFile::default(),
        };
        let flags = ServerFile {
            listen: self.listen.clone(),
            lcores: self.lcores.clone(),
            provider: self.provider.clone(),
            poll: self.poll.clone(),
            hugepages: self.hugepages.clone(),
            slab_size: self.slab_size.clone(),
            metrics: self.metrics.clone(),
            op_timeout_s: self.op_timeout,
            heartbeat_ms: self.heartbeat_ms,
            idle_timeout_s: self.idle_timeout,
            handshake_timeout_s: self.handshake_timeout,
            join_timeout_s: self.join_timeout,
            max_jobs: self.max_jobs,
            max_ranks: self.max_ranks,
            max_handshakes: self.max_handshakes,
            max_handshakes_per_source: self.max_handshakes_per_source,
            drain_timeout_s: self.drain_timeout,
            latency_lcores: self.latency_lcores,
            latency_max: self.latency_max.clone(),
            stage_buffers: self.stage_buffers,
            ..Default::default()
        };
        file.overlay(flags).resolve().map_err(|e| e.to_string())
    }
}

/// SIGINT and SIGTERM received so far: 1 drains, 2 stops at once.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALS.fetch_add(1, Ordering::Relaxed);
}

pub fn run(args: &ServerArgs) -> Result<(), String> {
    let cfg = args.resolve()?;
    if args.check {
        return crate::cmd::server_check::run(&cfg);
    }
    // SAFETY: the handler only adds to a lock-free atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let server = Server::start(&cfg).map_err(|e| e.to_string())?;
    println!("tally server ready on {} ({} lcores, provider {})", server.local_addr(), server.lcore_count(), server.provider());
    // On its own line after the ready line (whose format tests and scripts parse).
    if let Some(m) = server.metrics_addr() {
        println!("metrics on {m}");
    }
    notify(&format!(
        "READY=1\nSTATUS=serving on {} ({} lcores, provider {})\n",
        server.local_addr(),
        server.lcore_count(),
        server.provider()
    ));
    if cfg.latency_lcores > 0 {
        log::info!(
            "latency lcores: the first {} take operations of at most {}; the other {} take the larger ones",
            cfg.latency_lcores,
            tally_engine::host::units::format_size(cfg.latency_max),
            cfg.lcores.len() - cfg.latency_lcores as usize
        );
    }
    let mut draining = false;
    // Jobs left on a draining server, as last told the service manager.
    let mut told_left = None;
    loop {
        let signals = SIGNALS.load(Ordering::Relaxed);
        if signals >= 2 {
            log::info!("second signal: stopping at once");
            break;
        }
        if signals == 1 && !draining {
            log::info!("signal: draining (a second SIGTERM or SIGINT stops at once)");
            notify("STOPPING=1\nSTATUS=draining: admitting no new jobs\n");
            server.drain();
            draining = true;
        }
        if draining {
            if server.drained() {
                break;
            }
            let left = server.jobs().len();
            if told_left != Some(left) {
                notify(&format!("STATUS=draining: {left} jobs left\n"));
                told_left = Some(left);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    notify("STOPPING=1\nSTATUS=stopping: ending jobs, draining lcores\n");
    log::info!("stopping: ending jobs, draining lcores");
    let stats = server.stats();
    server.stop();
    for (i, s) in stats.iter().enumerate() {
        log::info!("lcore {i}: {} completions, {} B in, {} B out, {} errors", s.completions, s.bytes_in, s.bytes_out, s.errors);
    }
    log::info!("stopped");
    Ok(())
}

/// Tells the service manager `state`, if there is one; a failure is a
/// warning (the server serves all the same).
fn notify(state: &str) {
    if let Err(e) = sd_notify::notify(state) {
        log::warn!("cannot notify the service manager ({}): {e}", state.lines().next().unwrap_or(""));
    }
}
