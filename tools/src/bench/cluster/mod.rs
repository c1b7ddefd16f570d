//! `tally bench cluster`: an emulated cluster on one machine.
//!
//! N server hosts and N worker hosts, each a network namespace with one veth
//! link to a bridge, shaped with tc tbf to rate R in both directions (egress
//! on both ends of each veth). Addresses from 198.18.0.0/15 (the range set
//! aside for benchmarking), provider tcp;ofi_rxm, adaptive polling. Workers
//! run agg (through the servers) and ring all-reduce; the table gives
//! algbw, busbw, the link-rate bound, the fraction of it reached and
//! agg/ring. This is where reduction servers win: each worker sends and
//! receives its buffer once, where a ring moves 2(n-1)/n of it each way.
//!
//! Each row also gives the CPU time that the timed loop cost, per GB
//! all-reduced, workers and servers apart (what sizes reduction servers in
//! cores per 100 Gbit/s): worker 0 reports its own process's (`cpu_s`), and
//! announces each loop (`LOOP <mode> <bytes>`) so that this process reads
//! the servers' from /proc over the same interval.
//!
//! Everything it makes (namespaces, links, processes) is removed when it
//! ends, and namespaces left by a run that was killed are swept at the next
//! start. Every step is bounded in time.
//!
//! With `--workers-run CMD` the same testbed runs a command of the caller's
//! in every worker namespace instead of tally's own benchmark (one process
//! per worker, `sh -c CMD`), with the environment a multi-node job there
//! needs: `TALLY_CLUSTER_RANK`, `TALLY_CLUSTER_WORLD`, `TALLY_CLUSTER_MASTER`
//! (worker 0's address), `TALLY_CLUSTER_IFNAME` (the link's interface),
//! `TALLY_SERVERS`, `TALLY_PROVIDER=tcp` and `TALLY_FABRIC_ADDR` (the worker's
//! address), so that, e.g., PyTorch + NCCL ranks reach each other and the
//! servers only through shaped links (tests/nccl/cluster_proof.sh).
//!
//! `ip` and `tc` come from PATH, or from a folder holding Debian's iproute2
//! unpacked with `dpkg -x` (`--iproute DIR`, `TALLY_IPROUTE`): hosts without
//! iproute2 (the GPU device image) run it that way, with the folder's
//! libraries on LD_LIBRARY_PATH for `ip` and `tc` only.
use crate::bench::plot;
use crate::bench::report::{format_row, method_line, Row, LOOP_LINES_ENV};
use crate::cli_args::{DtypeArg, IprouteArg, JsonArg, LoopArgs, ModeArg, PlotArg, PollArg, WindowArg};
use crate::logfile;
use crate::progress::Progress;
use clap::Args;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tally_engine::host::units::format_size;

#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Server hosts and worker hosts (N + N namespaces).
    #[arg(long, default_value_t = 4)]
    pub hosts: u32,
    /// Link rates in Gbit/s, comma-separated (default: one rate this machine's
    /// cores carry, see `default_rate`).
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<f64>,
    /// Sizes per rank (K/M/G), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16M,64M")]
    pub sizes: Vec<String>,
    #[command(flatten)]
    pub mode: ModeArg,
    #[command(flatten)]
    pub loops: LoopArgs,
    #[command(flatten)]
    pub dtype: DtypeArg,
    /// Chunk size (agg piece and ring chunk; agg-plugin hands the plugin 512 KiB
    /// iallreduce pieces, as NCCL does), or auto
    /// (32 KiB up to 8 Gbit/s, then 16 KiB per Gbit/s: `auto_chunk`).
    #[arg(long, default_value = "auto")]
    pub chunk: String,
    #[command(flatten)]
    pub window: WindowArg,
    /// agg: sends in flight per server per worker (pacing for TCP-like links; 0: window-bound).
    #[arg(long, default_value_t = 1)]
    pub send_credits: u32,
    /// Lcores per server (default: 2 where the host has 4 cores per host pair, else 1 where
    /// it has 2, else every server's 2 lcores on cores 0-1).
    #[arg(long)]
    pub server_lcores: Option<u32>,
    #[command(flatten)]
    pub poll: PollArg,
    /// Link MTU (jumbo frames, as EFA-class fabrics have).
    #[arg(long, default_value_t = 9000)]
    pub mtu: u32,
    /// tbf bucket size (tc's units, e.g. 512kb), or auto: the bytes of 2 ms at
    /// the link rate, at least 64 KiB. A bucket that holds a large part of an
    /// all-reduce lets it pass at veth speed and inflates the figure.
    #[arg(long, default_value = "auto")]
    pub tbf_burst: String,
    /// tbf queue latency; a short queue keeps rxm's rendezvous handshakes from
    /// waiting behind a backlog of bulk data.
    #[arg(long, default_value = "50ms")]
    pub tbf_latency: String,
    #[command(flatten)]
    pub iproute: IprouteArg,
    /// Seconds the whole run may take per rate before it is stopped.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    #[command(flatten)]
    pub json: JsonArg,
    #[command(flatten)]
    pub plot: PlotArg,
    /// Send server and worker log lines to this file (warnings and errors still reach the terminal).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Run this shell command in every worker namespace (one process each)
    /// instead of tally's benchmark, once per rate; worker 0's stdout is
    /// passed through. Its environment: TALLY_CLUSTER_RANK, _WORLD, _MASTER
    /// (worker 0's address), _IFNAME, _RATE_GBIT, and TALLY_SERVERS,
    /// TALLY_PROVIDER, TALLY_FABRIC_ADDR. Fails if any worker fails.
    #[arg(long, value_name = "CMD")]
    pub workers_run: Option<String>,
}

impl ClusterArgs {
    /// The defaults `tally demo` uses.
    pub fn demo(rate: Option<f64>) -> ClusterArgs {
        ClusterArgs {
            hosts: 4,
            rates: rate.into_iter().collect(),
            sizes: ["1M", "4M", "16M"].iter().map(|s| s.to_string()).collect(),
            mode: ModeArg::default(),
            loops: LoopArgs::default(),
            dtype: DtypeArg::default(),
            chunk: "auto".into(),
            window: WindowArg::default(),
            send_credits: 1,
            server_lcores: None,
            poll: PollArg::default(),
            mtu: 9000,
            tbf_burst: "auto".into(),
            tbf_latency: "50ms".into(),
            iproute: IprouteArg { iproute: std::env::var_os("TALLY_IPROUTE").map(PathBuf::from) },
            timeout: 300,
            json: JsonArg::default(),
            plot: PlotArg::default(),
            log: None,
            workers_run: None,
        }
    }
}

/// One result row with its link rate and bound.
#[derive(Serialize, Debug, Clone)]
pub struct ClusterRow {
    pub link_gbit: f64,
    #[serde(rename = "bound_GBps")]
    pub bound_gbps: f64,
    /// algbw / bound.
    pub fraction: f64,
    /// Worker 0's process CPU seconds (user + system, every thread) over
    /// the timed loop (the row's `cpu_s`); None where the worker reported none.
    pub worker_cpu_s: Option<f64>,
    /// Every server's CPU seconds together over the same loop (from its
    /// `LOOP` line to its result, /proc/<pid>/stat); None where a server
    /// could not be read (no /proc, or it exited). With busy polling every
    /// lcore's whole time; for the ring, servers idling.
    pub server_cpu_s: Option<f64>,
    /// worker_cpu_s per GB this worker all-reduced (bytes x iters).
    pub worker_cpu_s_per_gb: Option<f64>,
    /// server_cpu_s per GB of input the servers together received
    /// (hosts x bytes x iters); None for the ring, which sends them nothing.
    pub server_cpu_s_per_gb: Option<f64>,
    #[serde(flatten)]
    pub row: Row,
}

impl ClusterRow {
    /// A worker's row at link `rate` (Gbit/s) among `hosts` workers, with
    /// the servers' CPU seconds over its loop.
    fn new(rate: f64, hosts: u32, row: Row, server_cpu_s: Option<f64>) -> ClusterRow {
        let link = rate / 8.0;
        let n = hosts as f64;
        let bound_gbps = if row.mode == "ring" { link * n / (2.0 * (n - 1.0)) } else { link };
        // GB this worker all-reduced in the loop; none in rows without iters.
        let gb = (row.bytes * row.iters) as f64 / 1e9;
        let per_gb = |s: f64, gb: f64| (gb > 0.0).then(|| s / gb);
        let worker_cpu_s = (row.cpu_s > 0.0).then_some(row.cpu_s);
        let served = if row.mode == "ring" { 0.0 } else { n * gb };
        ClusterRow {
            link_gbit: rate,
            bound_gbps,
            fraction: row.algbw_gbps / bound_gbps,
            worker_cpu_s,
            server_cpu_s,
            worker_cpu_s_per_gb: worker_cpu_s.and_then(|s| per_gb(s, gb)),
            server_cpu_s_per_gb: server_cpu_s.and_then(|s| per_gb(s, served)),
            row,
        }
    }
}

#[derive(Serialize, Debug, Clone)]
pub struct ClusterOutcome {
    pub hosts: u32,
    pub placement: String,
    pub rows: Vec<ClusterRow>,
}

impl ClusterOutcome {
    pub fn wrong(&self) -> u64 {
        self.rows.iter().map(|r| r.row.wrong).sum()
    }

    /// agg algbw / ring algbw at the same rate and size.
    pub fn agg_over_ring(&self, r: &ClusterRow) -> Option<f64> {
        let ring = self.rows.iter().find(|x| x.row.mode == "ring" && x.row.bytes == r.row.bytes && x.link_gbit == r.link_gbit)?;
        (r.row.mode != "ring").then(|| r.row.algbw_gbps / ring.row.algbw_gbps)
    }
}

/// The rate (Gbit/s) used when none is given: the highest that this
/// machine's cores carry with both agg and ring link-bound (tcp;ofi_rxm
/// copies, adaptive pollers and the bridge all on them), 2 Gbit/s per core
/// per host, rounded down to a power of two. Measured, 4 + 4 hosts, 16 and
/// 64 MiB: 2 cores: agg 0.98-0.99 and ring 0.99 of their bounds at
/// 1 Gbit/s, agg 0.93 at 2, agg 0.47-0.53 at 4 (the ring still 0.99: the
/// servers' lcores ran out of CPU); 16 cores: both 0.99 at 8 Gbit/s with
/// 4 + 4 hosts and at 4 with 8 + 8, both CPU-bound at 16.
///
/// At most [`MAX_DEFAULT_RATE`], the highest rate measured with both at the
/// link: on 64 cores (device, 4 + 4 hosts, rails) agg reached 0.97-1.00 at
/// 16 Gbit/s, while at 32 it reached 0.6-0.96 with failover's staging and the
/// ring 0.3-0.5 (why is not shown).
pub fn default_rate(hosts: u32, cores: usize) -> f64 {
    let r = 2.0 * cores as f64 / hosts as f64;
    2f64.powi(r.log2().floor() as i32).clamp(0.0625, MAX_DEFAULT_RATE)
}

/// The highest rate [`default_rate`] picks (Gbit/s).
pub const MAX_DEFAULT_RATE: f64 = 16.0;

/// Runs the emulated cluster and prints its table (unless `--json`).
pub fn run(args: &ClusterArgs) -> Result<(), String> {
    if let Some(path) = &args.log {
        logfile::redirect_to(path)?;
    }
    let out = launch(args)?;
    if let Some(path) = &args.plot.plot {
        write_plot(&out, path)?;
        if !args.json.json {
            println!("# plot: {}", path.display());
        }
    }
    if args.json.json {
        println!("{}", serde_json::to_string(&out).map_err(|e| e.to_string())?);
    }
    if let Some(path) = &args.log {
        if !args.json.json {
            println!("# server and worker logs: {}", path.display());
        }
    }
    match out.wrong() {
        0 => Ok(()),
        w => Err(format!("{w} wrong elements")),
    }
}

/// busbw against size for every mode and rate, with each bound in busbw terms.
pub fn write_plot(out: &ClusterOutcome, path: &Path) -> Result<(), String> {
    let n = out.hosts as f64;
    let mut rates: Vec<f64> = out.rows.iter().map(|r| r.link_gbit).collect();
    rates.dedup();
    let (mut series, mut bounds) = (Vec::new(), Vec::new());
    for &rate in &rates {
        let rows: Vec<Row> = out.rows.iter().filter(|r| r.link_gbit == rate).map(|r| r.row.clone()).collect();
        let suffix = if rates.len() > 1 { format!(" {rate} Gbit/s") } else { String::new() };
        series.extend(plot::series_by_mode(&rows, &suffix));
        let link = rate / 8.0;
        bounds.push(plot::Bound { label: format!("agg bound{suffix}: R x 2(n-1)/n"), busbw_gbps: link * 2.0 * (n - 1.0) / n });
        bounds.push(plot::Bound { label: format!("ring bound{suffix}: R"), busbw_gbps: link });
    }
    let title =
        format!("emulated cluster: {} servers + {} workers, links {} Gbit/s, tcp;ofi_rxm", out.hosts, out.hosts, rates_text(&rates));
    plot::busbw_svg(path, &title, &series, &bounds)
}

fn rates_text(rates: &[f64]) -> String {
    rates.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

pub fn print_header(args: &ClusterArgs, rate: f64, placement: &str, worker_cores: Option<&str>) {
    let burst = if args.tbf_burst == "auto" { format_size(tbf_auto_burst(rate)) } else { args.tbf_burst.clone() };
    println!(
        "# emulated cluster, links {rate} Gbit/s: {} servers + {} workers (network namespaces, tbf both ends, burst {burst}, MTU {}), tcp;ofi_rxm",
        args.hosts, args.hosts, args.mtu
    );
    println!("# placement: {placement}");
    println!(
        "# chunk {}, window {}, send credits {}, rails per worker {}; {}",
        if args.chunk == "auto" { format!("{} (auto)", format_size(auto_chunk(rate))) } else { args.chunk.clone() },
        args.window.window,
        args.send_credits,
        {
            let (n, why) = worker_rails(args.hosts, worker_cores);
            format!("{n} ({why})")
        },
        method_line(args.loops.iters, args.loops.warmup, false)
    );
    println!(
        "# bounds: agg <= R (servers together have the workers' bandwidth), ring <= R x n/(2(n-1)); ideal agg/ring = 2(n-1)/n = {:.2}",
        2.0 * (args.hosts as f64 - 1.0) / args.hosts as f64
    );
}

/// The rails each worker runs, and why: TALLY_RAILS, else auto (one per
/// server over tcp on 8+ cores), but no more than fit the worker's block of
/// the workers' cores with its own thread: every worker sees the whole host,
/// and blocks that wrap put two busy pollers on one core (on 16 cores, 3
/// workers of 1 + 3 threads on cores 6-15 stalled operations for 1.3 s).
fn worker_rails(hosts: u32, worker_cores: Option<&str>) -> (usize, &'static str) {
    let asked = std::env::var("TALLY_RAILS").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(0);
    let n = tally_engine::client::rails::resolve_rails(asked, "tcp", hosts as usize);
    if asked != 0 {
        return (n, "TALLY_RAILS");
    }
    let block = worker_cores.and_then(|w| tally_engine::host::cpuset::CoreList::parse(w).ok()).map(|l| l.len() / hosts.max(1) as usize);
    match block {
        Some(b) if n > 1 && b < n + 1 => ((b.saturating_sub(1)).max(1), "auto, fit to each worker's cores"),
        _ => (n, "auto"),
    }
}

pub fn format_cluster_header() -> String {
    format!(
        "{:>7} {:>10} {:>9} {:>10} {:>11} {:>11} {:>11} {:>9} {:>9} {:>12} {:>12} {:>7}",
        "Gbit/s",
        "mode",
        "size",
        "time(ms)",
        "algbw GB/s",
        "busbw GB/s",
        "bound GB/s",
        "fraction",
        "agg/ring",
        "wkr cpu s/GB",
        "srv cpu s/GB",
        "#wrong"
    )
}

pub fn format_cluster_row(out: &ClusterOutcome, r: &ClusterRow) -> String {
    let ratio = out.agg_over_ring(r).map(|x| format!("{x:.2}")).unwrap_or_default();
    let cpu = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
    format!(
        "{:>7} {:>10} {:>9} {:>10.1} {:>11.4} {:>11.4} {:>11.4} {:>9.2} {:>9} {:>12} {:>12} {:>7}",
        r.link_gbit,
        r.row.mode,
        format_size(r.row.bytes as u64),
        r.row.time_us / 1e3,
        r.row.algbw_gbps,
        r.row.busbw_gbps,
        r.bound_gbps,
        r.fraction,
        ratio,
        cpu(r.worker_cpu_s_per_gb),
        cpu(r.server_cpu_s_per_gb),
        r.row.wrong
    )
}

/// The lines under the table that say what the CPU columns are.
pub fn cpu_note() -> &'static str {
    "# wkr/srv cpu s/GB: CPU seconds (user + system, every thread) over the timed loop per GB all-reduced: wkr = worker 0's\n\
     #   process, per GB of its buffer (size x iters); srv = every server together, per GB of input they received\n\
     #   (hosts x size x iters; \"-\" for ring, which does not use them). Cores per 100 Gbit/s = cpu s/GB x 12.5.\n\
     #   With busy polling (placement line) srv is every lcore's whole time, as a busy poller spins; --poll adaptive\n\
     #   gives the work itself."
}

/// Why the emulated cluster cannot run here, if it cannot.
pub fn unavailable(iproute: Option<&Path>) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("it needs root (network namespaces, tc)".into());
    }
    let tools = match Iproute::find(iproute) {
        Ok(t) => t,
        Err(e) => return Some(e),
    };
    let probe = format!("tlyprobe{}", std::process::id());
    match tools.ip(&["netns", "add", &probe]) {
        Ok(()) => {
            let _ = tools.ip(&["netns", "del", &probe]);
            None
        }
        Err(e) => Some(format!("network namespaces are not available: {e}")),
    }
}

/// `ip` and `tc`, from PATH or an unpacked iproute2 folder.
struct Iproute {
    ip: PathBuf,
    tc: PathBuf,
    lib: Option<String>,
}

impl Iproute {
    fn find(dir: Option<&Path>) -> Result<Iproute, String> {
        if let Some(d) = dir {
            let pick = |name: &str| ["sbin", "bin", "usr/sbin", "usr/bin"].iter().map(|s| d.join(s).join(name)).find(|p| p.is_file());
            let (Some(ip), Some(tc)) = (pick("ip"), pick("tc")) else {
                return Err(format!("{} holds no ip and tc (unpack Debian's iproute2 there with dpkg -x)", d.display()));
            };
            let lib = [
                "lib/x86_64-linux-gnu",
                "usr/lib/x86_64-linux-gnu",
                "lib/aarch64-linux-gnu",
                "usr/lib/aarch64-linux-gnu",
                "lib",
                "usr/lib",
            ]
            .iter()
            .map(|s| d.join(s))
            .filter(|p| p.is_dir())
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
            return Ok(Iproute { ip, tc, lib: Some(lib) });
        }
        let which = |name: &str| {
            std::env::var_os("PATH")
                .into_iter()
                .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .chain(["/usr/sbin", "/sbin"].iter().map(PathBuf::from))
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        };
        match (which("ip"), which("tc")) {
            (Some(ip), Some(tc)) => Ok(Iproute { ip, tc, lib: None }),
            _ => Err("iproute2 (ip, tc) is not installed (make deps installs it; or --iproute DIR with Debian's iproute2 unpacked)".into()),
        }
    }

    fn command(&self, prog: &Path) -> Command {
        let mut c = Command::new(prog);
        if let Some(lib) = &self.lib {
            c.env("LD_LIBRARY_PATH", lib);
        }
        c
    }

    fn run(&self, prog: &Path, args: &[&str]) -> Result<(), String> {
        let out = self.command(prog).args(args).stdin(Stdio::null()).output().map_err(|e| format!("{}: {e}", prog.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{} {}: {}", prog.display(), args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    }

    fn ip(&self, args: &[&str]) -> Result<(), String> {
        self.run(&self.ip, args)
    }

    fn tc_in(&self, ns: &str, args: &[&str]) -> Result<(), String> {
        let tc = self.tc.display().to_string();
        let mut all = vec!["netns", "exec", ns, &tc];
        all.extend_from_slice(args);
        self.ip(&all)
    }

    /// A command run inside namespace `ns` with the caller's LD_LIBRARY_PATH
    /// (not the one `ip` got for iproute2's libraries). Dropping it, as
    /// this once did, made servers and workers on the device load the host's
    /// own libfabric (1.20) instead of the one carried for them.
    fn exec_in(&self, ns: &str, prog: &Path) -> Command {
        let mut c = self.command(&self.ip);
        c.args(["netns", "exec", ns]);
        if self.lib.is_some() {
            match std::env::var_os("LD_LIBRARY_PATH") {
                Some(orig) => {
                    let mut kv = std::ffi::OsString::from("LD_LIBRARY_PATH=");
                    kv.push(orig);
                    c.arg("env").arg(kv);
                }
                None => {
                    c.args(["env", "-u", "LD_LIBRARY_PATH"]);
                }
            }
        }
        c.arg(prog);
        c
    }

    fn namespaces(&self) -> Vec<String> {
        let out = self.command(&self.ip).args(["netns", "list"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| l.split_whitespace().next().map(str::to_string)).collect())
            .unwrap_or_default()
    }
}

/// The namespaces and processes of one run; removed on drop.
struct Testbed {
    tools: Iproute,
    prefix: String,
    children: Vec<Child>,
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
        for ns in self.tools.namespaces() {
            if ns.starts_with(&self.prefix) {
                let _ = self.tools.ip(&["netns", "del", &ns]);
            }
        }
    }
}

/// Gives the servers and ranks this process starts a shared fresh token
/// (TALLY_TOKEN, which they inherit) unless one is set, as a deployment
/// would have. Call before any thread starts.
pub fn ensure_job_token() {
    if std::env::var_os("TALLY_TOKEN").is_none() {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let token = format!("{:x}", (nanos ^ u128::from(std::process::id()) << 64) as u64);
        // Order matters: set_var races with threads that read the
        // environment, and none run yet (see the callers).
        std::env::set_var("TALLY_TOKEN", token);
    }
}

/// Removes namespaces of earlier runs whose process is gone (`tly<pid>x...`).
fn sweep_stale(tools: &Iproute) {
    for ns in tools.namespaces() {
        let Some(pid) = ns.strip_prefix("tly").and_then(|r| r.split('x').next()).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            log::info!("removing network namespace {ns} of a run that is gone");
            let _ = tools.ip(&["netns", "del", &ns]);
        }
    }
}

/// Server i at 198.18.0.(10+i), worker i at 198.18.1.(10+i), all in one /16.
fn addr(kind: char, i: u32) -> String {
    format!("198.18.{}.{}", if kind == 's' { 0 } else { 1 }, 10 + i)
}

/// Where servers' lcores and workers go: (lcores per server, placement text,
/// server i's core list, worker cores list or None).
fn place(hosts: u32, cores: usize, want: Option<u32>) -> (Vec<String>, Option<String>, String) {
    let h = hosts as usize;
    let per = match want {
        Some(w) => w as usize,
        // 64 cores for 4 + 4 hosts: 4 lcores a server, so that at 32 Gbit/s
        // (4 GB/s each way per server) no lcore's endpoint carries more
        // than 1 GB/s each way, and 12 cores a worker for its rails.
        None if cores >= 16 * h => 4,
        None if cores >= 4 * h => 2,
        None if cores >= 2 * h => 1,
        None => 0,
    };
    if per == 0 || cores < per * h + 1 {
        let n = cores.clamp(1, 2);
        let list = if n == 1 { "0".to_string() } else { "0-1".to_string() };
        let lists = vec![list.clone(); h];
        return (
            lists,
            None,
            format!(
                "shared: {} cores for {h} servers + {h} workers, every server's lcores on cores {list}, workers placed by the scheduler",
                cores
            ),
        );
    }
    let lists: Vec<String> = (0..h).map(|i| if per == 1 { format!("{i}") } else { format!("{}-{}", per * i, per * i + per - 1) }).collect();
    let first_worker = per * h;
    let workers = if cores > first_worker { Some(format!("{first_worker}-{}", cores - 1)) } else { None };
    let text = format!(
        "server i on {per} core{} of its own (cores 0-{}), {} lcore{} each; workers pinned to cores {}",
        if per == 1 { "" } else { "s" },
        first_worker - 1,
        per,
        if per == 1 { "" } else { "s" },
        workers.as_deref().unwrap_or("(none left: scheduler)")
    );
    (lists, workers, text)
}

pub fn launch(args: &ClusterArgs) -> Result<ClusterOutcome, String> {
    if args.hosts < 2 || args.hosts > 64 {
        return Err("--hosts: between 2 and 64".into());
    }
    if let Some(m) = args.mode.mode.iter().find(|m| !matches!(m.as_str(), "agg" | "agg-plugin" | "ring")) {
        return Err(format!("--mode: expected agg, agg-plugin or ring, got {m:?}"));
    }
    if let Some(why) = unavailable(args.iproute.iproute.as_deref()) {
        return Err(format!("the emulated cluster cannot run here: {why}"));
    }
    let tools = Iproute::find(args.iproute.iproute.as_deref())?;
    ensure_job_token();
    sweep_stale(&tools);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rates = if args.rates.is_empty() { vec![default_rate(args.hosts, cores)] } else { args.rates.clone() };
    if let Some(r) = rates.iter().find(|r| !(**r > 0.0 && **r <= 400.0)) {
        return Err(format!("--rates: {r} Gbit/s is not a link rate"));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let prefix = format!("tly{}x", std::process::id());
    let mut bed = Testbed { tools, prefix: prefix.clone(), children: Vec::new() };
    let hosts: Vec<(char, u32)> = (0..args.hosts).flat_map(|i| [('s', i), ('w', i)]).collect();
    let ns = |k: char, i: u32| format!("{prefix}{k}{i}");
    let sw = format!("{prefix}sw");
    build_network(&bed.tools, &sw, &hosts, &ns, args.mtu)?;

    let (server_lcores, worker_cores, placement) = place(args.hosts, cores, args.server_lcores);
    // `place` gives server lcores cores of their own where it leaves any to
    // the workers, so auto is busy exactly when every worker has one too.
    let worker_core_count = worker_cores.as_ref().and_then(|w| tally_engine::host::cpuset::CoreList::parse(w).ok()).map_or(0, |l| l.len());
    let poll = args.poll.poll.resolve(args.hosts as usize, worker_core_count).as_str();
    let placement = format!("{placement}; {poll} polling");
    let log_level = if logfile::redirected() { "info" } else { "warn" };
    let mut servers = Vec::new();
    // The servers' own pids: `ip netns exec` (and `env`) exec the command, keeping the pid.
    let mut server_pids = Vec::new();
    let mut ready = Vec::new();
    for i in 0..args.hosts {
        let a = format!("{}:7400", addr('s', i));
        let mut c = bed.tools.exec_in(&ns('s', i), &exe);
        c.args(["server", "--listen", &a, "--lcores", &server_lcores[i as usize], "--provider", "tcp", "--poll", poll]);
        c.args(["--slab-size", "128M"]).env("TALLY_LOG", log_level).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("cannot start server {i}: {e}"))?;
        let (tx, rx) = mpsc::channel();
        logfile::forward_stdout(child.stdout.take().expect("piped"), format!("[server {i}]"), tx);
        logfile::forward(child.stderr.take().expect("piped"), format!("[server {i}]"));
        server_pids.push(child.id());
        bed.children.push(child);
        ready.push(rx);
        servers.push(a);
    }
    for (i, rx) in ready.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.starts_with("tally server ready") => break,
                Ok(_) => continue,
                Err(_) => return Err(format!("server {i} did not start within 15 s (see its log lines above or in the log file)")),
            }
        }
    }

    let steps = rates.len() * args.mode.mode.len() * args.sizes.len();
    let mut progress = Progress::new(steps, args.json.json);
    let mut out = ClusterOutcome { hosts: args.hosts, placement: placement.clone(), rows: Vec::new() };
    if let Some(cmd) = &args.workers_run {
        for &rate in &rates {
            shape(&bed.tools, &hosts, &ns, &sw, rate, args)?;
            if !args.json.json {
                println!(
                    "# emulated cluster, links {rate} Gbit/s: {} servers + {} workers; placement: {placement}; running in each worker: {cmd}",
                    args.hosts, args.hosts
                );
            }
            run_command(&mut bed, args, rate, cmd, &servers, &ns)?;
        }
        drop(bed);
        return Ok(out);
    }
    for &rate in &rates {
        shape(&bed.tools, &hosts, &ns, &sw, rate, args)?;
        let first = out.rows.len();
        let running = Servers { addrs: &servers, pids: &server_pids };
        run_rate(&mut bed, args, rate, &running, worker_cores.as_deref(), poll, &exe, &ns, &mut progress, &mut out)?;
        progress.finish();
        if !args.json.json {
            print_header(args, rate, &placement, worker_cores.as_deref());
            println!("{}", format_cluster_header());
            for r in &out.rows[first..] {
                println!("{}", format_cluster_row(&out, r));
            }
            println!("{}", cpu_note());
        }
    }
    drop(bed);
    Ok(out)
}

fn build_network(tools: &Iproute, sw: &str, hosts: &[(char, u32)], ns: &dyn Fn(char, u32) -> String, mtu: u32) -> Result<(), String> {
    let mtu = mtu.to_string();
    tools.ip(&["netns", "add", sw])?;
    tools.ip(&["-n", sw, "link", "add", "br0", "type", "bridge"])?;
    tools.ip(&["-n", sw, "link", "set", "br0", "mtu", &mtu, "up"])?;
    tools.ip(&["-n", sw, "link", "set", "lo", "up"])?;
    for &(k, i) in hosts {
        let name = ns(k, i);
        // The switch-side end carries the host's namespace name (<= 15 chars).
        let port = format!("{k}{i}p{}", std::process::id() % 100_000);
        tools.ip(&["netns", "add", &name])?;
        tools.ip(&["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &name])?;
        tools.ip(&["link", "set", &port, "netns", sw])?;
        tools.ip(&["-n", sw, "link", "set", &port, "master", "br0", "mtu", &mtu, "up"])?;
        tools.ip(&["-n", &name, "link", "set", "eth0", "mtu", &mtu])?;
        tools.ip(&["-n", &name, "addr", "add", &format!("{}/16", addr(k, i)), "dev", "eth0"])?;
        tools.ip(&["-n", &name, "link", "set", "eth0", "up"])?;
        tools.ip(&["-n", &name, "link", "set", "lo", "up"])?;
    }
    Ok(())
}

/// tbf at `rate` on both ends of every host's link.
fn shape(
    tools: &Iproute,
    hosts: &[(char, u32)],
    ns: &dyn Fn(char, u32) -> String,
    sw: &str,
    rate: f64,
    args: &ClusterArgs,
) -> Result<(), String> {
    let mbit = format!("{}mbit", (rate * 1000.0).round() as u64);
    let burst = if args.tbf_burst == "auto" { format!("{}b", tbf_auto_burst(rate)) } else { args.tbf_burst.clone() };
    let tbf = ["root", "tbf", "rate", &mbit, "burst", &burst, "latency", &args.tbf_latency];
    for &(k, i) in hosts {
        let mut a = vec!["qdisc", "replace", "dev", "eth0"];
        a.extend_from_slice(&tbf);
        tools.tc_in(&ns(k, i), &a)?;
        let port = format!("{k}{i}p{}", std::process::id() % 100_000);
        let mut a = vec!["qdisc", "replace", "dev", &port];
        a.extend_from_slice(&tbf);
        tools.tc_in(sw, &a)?;
    }
    Ok(())
}

/// `--chunk auto`: 32 KiB up to 8 Gbit/s (the rxm eager limit tally sets,
/// fabric::defaults), then 16 KiB per Gbit/s (256 KiB at 16), at most 1 MiB.
/// Measured on 16 cores, 4 + 4 and 8 + 8 hosts, agg fraction of the link
/// bound by chunk (eager): 32K gave 0.99 at 2 and 4 Gbit/s and 0.90-1.00 at
/// 8, but 0.50 at 16, where 256K gave 0.85-0.92 (per-piece CPU cost). Small
/// pieces keep each operation's fill and drain and the skew between workers
/// short.
pub fn auto_chunk(rate_gbit: f64) -> u64 {
    if rate_gbit <= 8.0 {
        return 32 << 10;
    }
    let want = rate_gbit * 16.0 * 1024.0;
    (2f64.powi(want.log2().round() as i32) as u64).clamp(32 << 10, 1 << 20)
}

fn chunk_for(args: &ClusterArgs, rate: f64) -> String {
    if args.chunk == "auto" {
        auto_chunk(rate).to_string()
    } else {
        args.chunk.clone()
    }
}

/// tbf's bucket in bytes for `--tbf-burst auto`: 2 ms at the link rate, at least 64 KiB.
pub fn tbf_auto_burst(rate_gbit: f64) -> u64 {
    ((rate_gbit * 1e9 / 8.0 * 0.002) as u64).max(64 << 10)
}

/// The running servers: their addresses and their processes' pids.
struct Servers<'a> {
    addrs: &'a [String],
    pids: &'a [u32],
}

#[allow(clippy::too_many_arguments)]
fn run_rate(
    bed: &mut Testbed,
    args: &ClusterArgs,
    rate: f64,
    servers: &Servers,
    worker_cores: Option<&str>,
    poll: &str,
    exe: &Path,
    ns: &dyn Fn(char, u32) -> String,
    progress: &mut Progress,
    out: &mut ClusterOutcome,
) -> Result<(), String> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let job = (nanos ^ u64::from(std::process::id()).rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let boot = format!("{}:{}", addr('w', 0), 29000 + nanos % 1000);
    let log_level = if logfile::redirected() { "info" } else { "warn" };
    let first_child = bed.children.len();
    let mut results = None;
    for i in 0..args.hosts {
        let mut c = bed.tools.exec_in(&ns('w', i), exe);
        c.args(["bench", "allreduce", "--rank", &i.to_string(), "--ranks", &args.hosts.to_string(), "--bootstrap", &boot]);
        c.args(["--job-id", &job.to_string(), "--servers", &servers.addrs.join(","), "--provider", "tcp", "--fabric-addr", &addr('w', i)]);
        c.args(["--mode", &args.mode.mode.join(","), "--sizes", &args.sizes.join(","), "--iters", &args.loops.iters.to_string()]);
        c.args([
            "--warmup",
            &args.loops.warmup.to_string(),
            "--dtype",
            &args.dtype.dtype,
            "--chunk",
            &chunk_for(args, rate),
            "--window",
            &args.window.window.to_string(),
        ]);
        c.args(["--send-credits", &args.send_credits.to_string(), "--timeout", &args.timeout.min(120).to_string()]);
        if let Some(wc) = worker_cores {
            c.args(["--cores", wc]);
        }
        c.args(["--rails", &worker_rails(args.hosts, worker_cores).0.to_string()]);
        c.args(["--poll", poll]);
        // agg-plugin: the plugin's own client reads its pacing from the environment.
        c.env("TALLY_SEND_CREDITS", args.send_credits.to_string());
        c.env("TALLY_LOG", log_level).stdin(Stdio::null()).stderr(Stdio::piped());
        c.stdout(if i == 0 { Stdio::piped() } else { Stdio::null() });
        if i == 0 {
            // LOOP lines: the servers' CPU time is read over each timed loop.
            c.env(LOOP_LINES_ENV, "1");
        }
        let mut child = c.spawn().map_err(|e| format!("cannot start worker {i}: {e}"))?;
        logfile::forward(child.stderr.take().expect("piped"), format!("[worker {i}]"));
        if let Some(o) = child.stdout.take() {
            results = Some(o);
        }
        bed.children.push(child);
    }
    let steps: Vec<String> = args.mode.mode.iter().flat_map(|m| args.sizes.iter().map(move |s| format!("{rate} Gbit/s {m} {s}"))).collect();
    progress.working_on(steps[0].clone());
    // Rank 0's RESULT lines arrive on a thread so that the wait is bounded.
    let (tx, rx) = mpsc::channel();
    let reader = results.expect("worker 0 stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut got = 0;
    // The loop worker 0 announced last, with the servers' CPU ticks then.
    let mut started: Option<(String, Option<u64>)> = None;
    while got < steps.len() {
        let line = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => l,
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(format!("link rate {rate} Gbit/s: no result within {} s", args.timeout)),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if let Some(step) = line.strip_prefix("LOOP ") {
            started = Some((step.to_string(), servers_cpu_ticks(servers.pids)));
            continue;
        }
        let Some(j) = line.strip_prefix("RESULT ") else { continue };
        let row: Row = serde_json::from_str(j).map_err(|e| e.to_string())?;
        let server_cpu_s = server_cpu_over(started.take(), &row, servers.pids);
        log::debug!("cluster {rate} Gbit/s: {}", format_row(&row));
        out.rows.push(ClusterRow::new(rate, args.hosts, row, server_cpu_s));
        got += 1;
        progress.step();
        if let Some(s) = steps.get(got) {
            progress.working_on(s.clone());
        }
    }
    let mut failed = Vec::new();
    for (i, c) in bed.children[first_child..].iter_mut().enumerate() {
        let st = wait_until(c, deadline);
        if !matches!(st, Some(s) if s.success()) {
            failed.push(format!("worker {i} {}", st.map_or("did not finish in time".into(), |s| format!("exited with {s}"))));
        }
    }
    if !failed.is_empty() || got < steps.len() {
        return Err(format!("link rate {rate} Gbit/s: {} ({got} of {} results)", failed.join("; "), steps.len()));
    }
    Ok(())
}

/// `--workers-run`: the caller's command in every worker namespace, with the
/// job's environment; bounded by `--timeout`.
fn run_command(
    bed: &mut Testbed,
    args: &ClusterArgs,
    rate: f64,
    cmd: &str,
    servers: &[String],
    ns: &dyn Fn(char, u32) -> String,
) -> Result<(), String> {
    let first_child = bed.children.len();
    for i in 0..args.hosts {
        let mut c = bed.tools.exec_in(&ns('w', i), Path::new("/bin/sh"));
        c.args(["-c", cmd]);
        c.env("TALLY_CLUSTER_RANK", i.to_string())
            .env("TALLY_CLUSTER_WORLD", args.hosts.to_string())
            .env("TALLY_CLUSTER_MASTER", addr('w', 0))
            .env("TALLY_CLUSTER_IFNAME", "eth0")
            .env("TALLY_CLUSTER_RATE_GBIT", rate.to_string())
            .env("TALLY_SERVERS", servers.join(","))
            .env("TALLY_PROVIDER", "tcp")
            .env("TALLY_FABRIC_ADDR", addr('w', i))
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        c.stdout(if i == 0 { Stdio::inherit() } else { Stdio::piped() });
        let mut child = c.spawn().map_err(|e| format!("cannot start worker {i}: {e}"))?;
        logfile::forward(child.stderr.take().expect("piped"), format!("[worker {i}]"));
        if let Some(o) = child.stdout.take() {
            logfile::forward(o, format!("[worker {i}]"));
        }
        bed.children.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut failed = Vec::new();
    for (i, c) in bed.children[first_child..].iter_mut().enumerate() {
        let st = wait_until(c, deadline);
        if !matches!(st, Some(s) if s.success()) {
            failed.push(format!("worker {i} {}", st.map_or("did not finish in time".into(), |s| format!("exited with {s}"))));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("link rate {rate} Gbit/s: {}", failed.join("; ")))
    }
}

/// The servers' CPU seconds between worker 0's `LOOP` line (`started`: the
/// step it named and the servers' ticks then) and `row`, its result: None
/// if that loop was not announced or a server could not be read either time.
/// Resolution: one clock tick (10 ms at the usual 100 Hz) per server.
fn server_cpu_over(started: Option<(String, Option<u64>)>, row: &Row, pids: &[u32]) -> Option<f64> {
    let (step, Some(before)) = started? else { return None };
    if step != format!("{} {}", row.mode, row.bytes) {
        return None;
    }
    let spent = servers_cpu_ticks(pids)?.checked_sub(before)?;
    Some(spent as f64 * clock_tick_s()?)
}

/// Every server's user + system clock ticks so far, summed; None if any
/// cannot be read.
fn servers_cpu_ticks(pids: &[u32]) -> Option<u64> {
    pids.iter().map(|&pid| process_cpu_ticks(pid)).sum()
}

/// Seconds per clock tick, the unit of /proc/<pid>/stat's times.
fn clock_tick_s() -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| 1.0 / hz as f64)
}

/// User + system clock ticks of process `pid` (every thread, the tgid's
/// stat); None if /proc has no such process or it has exited (a zombie).
fn process_cpu_ticks(pid: u32) -> Option<u64> {
    stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// utime + stime (fields 14 and 15 of proc(5)) of a /proc/<pid>/stat line,
/// counted after the last ')' since the command name (field 2) may hold
/// spaces and parentheses; None if malformed or the process is a zombie
/// or dead (state Z or X: its times are no longer its own).
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), so field k is fields[k - 3].
    if matches!(*fields.first()?, "Z" | "X" | "x") {
        return None;
    }
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

fn wait_until(c: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        match c.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rate_scales_with_cores_per_host_pair() {
        assert_eq!(default_rate(4, 2), 1.0);
        assert_eq!(default_rate(4, 16), 8.0);
        assert_eq!(default_rate(8, 16), 4.0);
        assert_eq!(default_rate(4, 3), 1.0);
        assert_eq!(default_rate(64, 1), 0.0625);
        // 64 cores would say 32: capped at the highest rate measured link-bound.
        assert_eq!(default_rate(4, 64), MAX_DEFAULT_RATE);
    }

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let stat = "4242 (tally (x) y) S 1 4242 4242 0 -1 4194560 1200 0 3 0 250 31 0 0 20 0 5 0 100 1000000 500 18446744073709551615";
        assert_eq!(stat_cpu_ticks(stat), Some(281));
        assert_eq!(stat_cpu_ticks(&stat.replace(") S ", ") Z ")), None, "a zombie's times are not counted");
        assert_eq!(stat_cpu_ticks("4242 (tally) S 1 2"), None, "too short");
        assert_eq!(stat_cpu_ticks("4242 tally S"), None, "no command name");
        // This process, read as the servers are: present and counting.
        assert!(process_cpu_ticks(std::process::id()).is_some());
        assert_eq!(process_cpu_ticks(u32::MAX), None);
    }

    #[test]
    fn cpu_per_gb_counts_what_each_side_moved() {
        let row = |mode: &str, cpu_s: f64| {
            let mut r: Row = serde_json::from_str(&format!(
                r#"{{"mode":"{mode}","bytes":16000000,"count":4000000,"dtype":"f32","op":"sum","time_us":1.0,
                    "algbw_GBps":1.0,"busbw_GBps":1.5,"wrong":0}}"#
            ))
            .expect("a row without cpu_s or iters (older versions) parses");
            assert_eq!(r.cpu_s, 0.0);
            r.iters = 20;
            r.cpu_s = cpu_s;
            r
        };
        // 16 MB x 20 = 0.32 GB per worker; 4 hosts: 1.28 GB into the servers.
        let r = ClusterRow::new(1.0, 4, row("agg", 0.64), Some(1.28));
        assert!((r.worker_cpu_s_per_gb.unwrap() - 2.0).abs() < 1e-9, "{r:?}");
        assert!((r.server_cpu_s_per_gb.unwrap() - 1.0).abs() < 1e-9, "{r:?}");
        let r = ClusterRow::new(1.0, 4, row("ring", 0.32), Some(0.0));
        assert!((r.worker_cpu_s_per_gb.unwrap() - 1.0).abs() < 1e-9 && r.server_cpu_s_per_gb.is_none(), "{r:?}");
        let r = ClusterRow::new(1.0, 4, row("agg", 0.0), None);
        assert!(r.worker_cpu_s.is_none() && r.worker_cpu_s_per_gb.is_none() && r.server_cpu_s_per_gb.is_none(), "{r:?}");
    }

    #[test]
    fn auto_chunk_follows_the_link_rate() {
        assert_eq!(auto_chunk(0.25), 32 << 10);
        assert_eq!(auto_chunk(8.0), 32 << 10);
        assert_eq!(auto_chunk(16.0), 256 << 10);
        assert_eq!(auto_chunk(32.0), 512 << 10);
        assert_eq!(auto_chunk(200.0), 1 << 20);
    }

    #[test]
    fn placement_gives_servers_cores_of_their_own_when_it_can() {
        let (l, w, _) = place(4, 16, None);
        assert_eq!(l, ["0-1", "2-3", "4-5", "6-7"]);
        assert_eq!(w.as_deref(), Some("8-15"));
        let (l, w, _) = place(8, 16, None);
        assert_eq!(l[7], "7");
        assert_eq!(w.as_deref(), Some("8-15"));
        let (l, w, t) = place(4, 2, None);
        assert!(l.iter().all(|x| x == "0-1") && w.is_none() && t.starts_with("shared"), "{t}");
    }
}
