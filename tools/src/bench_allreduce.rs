//! `tally bench allreduce`: agg (reduction servers) against ring, as
//! nccl-tests measures them.
//!
//! The launcher (what a user runs) hosts a reduction server in-process when
//! none is given, and runs every rank as a child process of itself (`--rank
//! i`): separate processes, as real workers are (shm endpoints of one process
//! must not talk to each other's closing regions). Above [`PROCESS_RANKS`]
//! ranks (or with `--ranks-per-process K`), ranks run as threads instead, K
//! per child process (`--rank i --ranks-per-process K`: ranks i..i+K), each
//! thread with its own `Client` and so its own fabric endpoint, as a rank of
//! its own: up to [`wire::MAX_RANKS`] ranks on one machine. Only agg runs
//! that way (ring ranks talk to each other, and the plugin is one per
//! process). Ranks meet through a TCP bootstrap (one connection per rank to
//! rank 0). For each mode and size, after `warmup` all-reduces and one
//! barrier, every rank runs `iters` all-reduces back to back, as nccl-tests
//! and users time them; every rank timestamps each completion, and rank 0 reports the
//! loop's mean (wall time / iterations: the `time_us` of nccl-tests) and the
//! p50, p99 and max of the per-operation times, an operation ending when the
//! last rank has its result (every rank's timestamps are gathered: one host,
//! one clock; rank 0's own intervals above [`GATHER_STAMPS`] of them). `--sync` instead starts every
//! all-reduce after a barrier and reports the median (it adds the barrier's
//! release skew to small sizes). Every rank then checks every element of its last result against the
//! reference it computes itself (inputs are small integers, so every
//! partial sum is exact in every type and the check is exact whatever the
//! association order), and the wrong counts are summed over ranks.
//! Rank 0 also reports its process's CPU time over the timed loop (`cpu_s`),
//! and with `TALLY_BENCH_LOOP_LINES=1` announces each loop on stdout
//! (`LOOP <mode> <bytes>`), so that `tally bench cluster` can sample the
//! servers' CPU time over the same interval.
use crate::cli_args::{CoresArg, DtypeArg, HugepagesArg, JsonArg, LoopArgs, ModeArg, PlotArg, PollArg, PollMode, ProviderArg, WindowArg};
use crate::collnet_driver;
use crate::logfile;
use crate::plot;
use crate::progress::Progress;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tally_engine::client::{Client, ClientConfig};
use tally_engine::host::config::ServerFile;
use tally_engine::host::limits;
use tally_engine::host::units::{format_size, parse_size};
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::ring::bootstrap::Bootstrap;
use tally_engine::ring::{Ring, RingConfig};
use tally_engine::server::Server;
use tally_engine::wire;

/// Up to this many ranks, every rank is a process of its own by default (as
/// before ranks could be threads, so those figures are unchanged); above it,
/// ranks are threads, this many per process.
pub const PROCESS_RANKS: u32 = 64;

#[derive(Args, Debug, Clone)]
pub struct AllreduceArgs {
    #[command(flatten)]
    pub mode: ModeArg,
    /// Ranks on this machine (up to 1024): processes up to 64, else threads (--ranks-per-process).
    #[arg(long, default_value_t = 4)]
    pub ranks: u32,
    /// Run ranks as threads, this many per process, each with its own client and
    /// endpoint (agg only). Default: 1 (a process per rank) up to 64 ranks, else 64.
    #[arg(long)]
    pub ranks_per_process: Option<u32>,
    /// agg: longest sleep (ms) of an adaptive rank waiting on its completion queue before it
    /// polls again (traffic wakes it sooner). Default: 1 with a process per rank, 20 with threads.
    #[arg(long)]
    pub sleep_ms: Option<u32>,
    #[command(flatten)]
    pub provider: ProviderArg,
    /// Sizes per rank in bytes (K/M/G), comma-separated. Default 4K to 256M in steps of 4x.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<String>,
    #[command(flatten)]
    pub dtype: DtypeArg,
    /// Reduction: sum, prod, max, min or avg.
    #[arg(long, default_value = "sum")]
    pub op: String,
    #[command(flatten)]
    pub loops: LoopArgs,
    /// Time each all-reduce alone, started after a barrier, and report the median
    /// (the method before back-to-back loops; adds the barrier's release skew).
    #[arg(long)]
    pub sync: bool,
    /// Use these servers (host:port, comma-separated) instead of starting one. With
    /// them, --poll auto is adaptive: their lcores may share this machine's cores.
    #[arg(long, value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Cores of the lcores of the server this command hosts (without --servers), DPDK syntax.
    #[arg(long, default_value = "0-1")]
    pub lcores: String,
    #[command(flatten)]
    pub hugepages: HugepagesArg,
    #[command(flatten)]
    pub cores: CoresArg,
    /// agg: endpoints per rank, each on its own thread, one per server up
    /// to this many (0: auto, one per server over tcp on 8+ cores; 1: no
    /// rail threads). TALLY_RAILS sets the default.
    #[arg(long)]
    pub rails: Option<usize>,
    /// Bytes per chunk piece (agg) and per ring chunk.
    #[arg(long, default_value = "256K")]
    pub chunk: String,
    #[command(flatten)]
    pub window: WindowArg,
    /// agg: sends in flight per server (0: as many as the window allows).
    /// Pacing lets results flow back while later chunks upload (see engine::client).
    #[arg(long, default_value_t = 0)]
    pub send_credits: u32,
    /// Seconds an all-reduce may make no progress before a rank gives up with an error.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    #[command(flatten)]
    pub poll: PollArg,
    /// Local fabric address of this host (tcp across hosts).
    #[arg(long)]
    pub fabric_addr: Option<String>,
    #[command(flatten)]
    pub json: JsonArg,
    /// agg-plugin: the NCCL plugin library (default: libnccl-net-tally.so next to this binary).
    #[arg(long)]
    pub plugin: Option<std::path::PathBuf>,
    /// agg-plugin: bytes per iallreduce (NCCL hands CollNet an all-reduce in steps of its
    /// buffer; 512 KiB is one step of the default 4 MiB).
    #[arg(long, default_value = "512K")]
    pub plugin_piece: String,
    /// agg-plugin: iallreduces in flight (NCCL keeps up to NCCL_STEPS = 8 steps of a
    /// channel outstanding).
    #[arg(long, default_value_t = 8)]
    pub plugin_in_flight: usize,
    #[command(flatten)]
    pub plot: PlotArg,
    /// Run as this rank (set by the launcher, or for multi-host runs by hand); with
    /// --ranks-per-process K, as ranks R..R+K, one thread each.
    #[arg(long, hide = true)]
    pub rank: Option<u32>,
    /// Rank 0's bootstrap address (with --rank).
    #[arg(long, hide = true)]
    pub bootstrap: Option<String>,
    /// The job id the ranks share (set by the launcher).
    #[arg(long, hide = true, default_value_t = 0)]
    pub job_id: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Row {
    pub mode: String,
    pub bytes: usize,
    pub count: usize,
    pub dtype: String,
    pub op: String,
    /// Per-operation time: the back-to-back loop's mean, or with `--sync` the median.
    pub time_us: f64,
    /// "back-to-back" or "sync".
    #[serde(default)]
    pub method: String,
    #[serde(default)]
    pub iters: usize,
    #[serde(default)]
    pub mean_us: f64,
    #[serde(default)]
    pub p50_us: f64,
    #[serde(default)]
    pub p99_us: f64,
    #[serde(default)]
    pub max_us: f64,
    /// Whose timestamps p50, p99 and max come from: "every rank" (an
    /// operation is complete when the last rank has its result: the time of
    /// operation k is the last completion of k minus the last of k - 1, the
    /// ranks sharing one clock), or "rank 0" (its own intervals only: runs of
    /// more than [`GATHER_STAMPS`] timestamps in all, and `--sync`).
    #[serde(default)]
    pub per_op: String,
    /// Rank 0's own intervals' median, whatever `per_op` says. With two
    /// ranks taking turns to finish first (as relayed all-reduces do), one
    /// rank's intervals alternate short and long around the mean, and their
    /// median says little.
    #[serde(default)]
    pub rank0_p50_us: f64,
    #[serde(rename = "algbw_GBps")]
    pub algbw_gbps: f64,
    #[serde(rename = "busbw_GBps")]
    pub busbw_gbps: f64,
    pub wrong: u64,
    /// Rank 0's process CPU seconds (user + system, every thread: the
    /// client's rail threads too) over the timed loop, from
    /// getrusage(RUSAGE_SELF): what a worker spends on the all-reduces. With
    /// ranks as threads (--ranks-per-process), every rank thread of rank 0's
    /// process counts. 0 in rows of older versions.
    #[serde(default)]
    pub cpu_s: f64,
}

#[derive(Serialize)]
struct Report<'a> {
    provider: &'a str,
    ranks: u32,
    results: &'a [Row],
}

fn default_sizes() -> Vec<usize> {
    (0..9).map(|k| 4096usize << (2 * k)).collect()
}

pub struct Plan {
    pub provider: String,
    pub sizes: Vec<usize>,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub chunk: usize,
}

fn plan(args: &AllreduceArgs) -> Result<Plan, String> {
    let provider = tally_engine::dataplane::fabric::select_provider(
        args.provider.provider.as_deref(),
        args.servers.iter().all(|s| s.starts_with("127.")),
    );
    let sizes = if args.sizes.is_empty() {
        default_sizes()
    } else {
        args.sizes.iter().map(|s| parse_size(s).map(|v| v as usize).map_err(|e| e.to_string())).collect::<Result<_, _>>()?
    };
    let dtype = DataType::parse(&args.dtype.dtype).ok_or_else(|| format!("--dtype: unknown type {:?}", args.dtype.dtype))?;
    let op = ReduceOp::parse(&args.op).ok_or_else(|| format!("--op: unknown op {:?}", args.op))?;
    let chunk = parse_size(&args.chunk).map_err(|e| format!("--chunk: {e}"))? as usize;
    for m in &args.mode.mode {
        if m != "agg" && m != "ring" && m != "agg-plugin" {
            return Err(format!("--mode: expected agg, agg-plugin or ring, got {m:?}"));
        }
    }
    if args.ranks == 0 || args.ranks > wire::MAX_RANKS {
        return Err(format!("--ranks: between 1 and {}", wire::MAX_RANKS));
    }
    if ranks_per_process(args) > 1 && args.mode.mode.iter().any(|m| m != "agg") {
        return Err(format!(
            "--mode {}: with {} ranks, ranks run as threads ({} per process), and only agg runs that way \
             (ring ranks talk to each other, the plugin is one per process): use --mode agg, or --ranks-per-process 1",
            args.mode.mode.join(","),
            args.ranks,
            ranks_per_process(args)
        ));
    }
    Ok(Plan { provider, sizes, dtype, op, chunk })
}

/// Ranks per process: as given, else one up to [`PROCESS_RANKS`] ranks and
/// that many above (a rank started by hand with `--rank` runs one).
fn ranks_per_process(args: &AllreduceArgs) -> u32 {
    match args.ranks_per_process {
        Some(k) => k.clamp(1, args.ranks.max(1)),
        None if args.rank.is_some() || args.ranks <= PROCESS_RANKS => 1,
        None => PROCESS_RANKS,
    }
}

/// Busy pollers that share a core take turns by the scheduler's timeslice
/// (and starve the rest of the machine): refuse more of them than cores.
fn check_busy(args: &AllreduceArgs, pollers: usize, what: &str) -> Result<(), String> {
    if !args.poll.poll.is_busy() {
        return Ok(());
    }
    let cores = tally_engine::host::cpuset::allowed().map_err(|e| e.to_string())?.len();
    if pollers > cores {
        return Err(format!(
            "--poll busy: {what} make {pollers} busy pollers on {cores} cores; use --poll adaptive (pollers then sleep when idle)"
        ));
    }
    Ok(())
}

/// `--poll` for `pollers` busy-capable threads on this process's allowed
/// cores. Servers given by `--servers` have pollers this process cannot
/// count (on loopback, or in network namespaces of this machine, as tests
/// and `tally bench cluster` run them), so with them `auto` is adaptive.
fn resolve_poll(args: &AllreduceArgs, pollers: usize) -> Result<PollMode, String> {
    if args.poll.poll == PollMode::Auto && !args.servers.is_empty() {
        return Ok(PollMode::Adaptive);
    }
    let cores = tally_engine::host::cpuset::allowed().map_err(|e| e.to_string())?.len();
    Ok(args.poll.poll.resolve(pollers, cores))
}

/// How long an adaptive rank sleeps on its CQ at most, unless `--sleep-ms`.
/// A sleeping rank wakes on traffic (tcp: the CQ's descriptor), so this only
/// paces the wake-ups of ranks with nothing to do: at 1 ms, 128 rank threads
/// on 2 cores woke 128,000 times a second, a few system calls each, and the
/// server's lcores got what was left: a 4 KiB all-reduce took 31 ms, 4.6 ms
/// at 20 ms (and 4.5 at 100).
const THREAD_SLEEP_MS: u32 = 20;

/// libfabric settings for a process of many rank threads over tcp;ofi_rxm,
/// unless the environment sets them. rxm gives every endpoint two pools of
/// 512 bounce buffers of the eager limit (32 KiB here) and, per connection,
/// 128 posted receives: about 70 MB resident per endpoint, 4.5 GB for 64
/// rank threads. With 1 KiB bounce buffers (tcp places eager messages
/// straight into posted receives, and a client posts its receive before its
/// send) and 16 per connection a rank thread holds about 5 MB (measured:
/// 337 MB for 64, all-reduces of 64 KiB; with 4 KiB buffers 12 MB each, same
/// speed). Only local memory: the eager limit, which peers must agree on,
/// is left alone. From libfabric 1.18 on, rxm's buffer size *is* its eager
/// limit (rank threads at 1 KiB against a server at 16 KiB hung at the first
/// all-reduce, 1.22 here), so there only the queue sizes are lowered
/// ([`thread_rxm_env`]).
const THREAD_RXM_ENV: &[(&str, &str)] =
    &[("FI_OFI_RXM_BUFFER_SIZE", "1024"), ("FI_OFI_RXM_MSG_RX_SIZE", "16"), ("FI_OFI_RXM_MSG_TX_SIZE", "16")];

/// [`THREAD_RXM_ENV`] as this process's libfabric takes it.
fn thread_rxm_env() -> &'static [(&'static str, &'static str)] {
    if tally_engine::dataplane::fabric::library_version() >= (1, 18) {
        &THREAD_RXM_ENV[1..]
    } else {
        THREAD_RXM_ENV
    }
}

/// Descriptors a rank needs at most: its endpoint (tcp;ofi_rxm: a listening
/// socket, an epoll set, wait fds, a connection per server lcore), its
/// control and bootstrap connections. Measured: about 15 per rank thread
/// over tcp to one server of 2 lcores; this leaves room for more lcores.
const FDS_PER_RANK: u64 = 24;

/// Raises this process's soft descriptor limit to `need` when it is lower
/// (up to the hard limit; the default soft limit is often 1024): a process
/// of many rank threads, or rank 0 with its bootstrap connection to every
/// rank, needs more.
fn ensure_fds(need: u64) -> Result<(), String> {
    let before = limits::open_files().map_err(|e| format!("getrlimit(RLIMIT_NOFILE): {e}"))?;
    let now = limits::raise_open_files(need).map_err(|e| format!("setrlimit(RLIMIT_NOFILE, {need}): {e}"))?;
    if now.soft < need {
        return Err(format!(
            "this needs about {need} file descriptors, above the hard limit of {} (ulimit -Hn): raise it, or use fewer ranks",
            now.hard
        ));
    }
    if now.soft > before.soft {
        log::info!("raised the open file limit from {} to {} (ranks' endpoints and connections)", before.soft, now.soft);
    }
    Ok(())
}

/// What the launcher hands back to callers such as `tally demo`.
pub struct Outcome {
    pub provider: String,
    pub rows: Vec<Row>,
    pub lcore_stats: Vec<tally_engine::dataplane::lcore::Snapshot>,
}

pub fn run(args: &AllreduceArgs) -> Result<(), String> {
    if args.rank.is_some() {
        return run_rank(args);
    }
    let out = launch(args)?;
    if let Some(path) = &args.plot.plot {
        let title = format!("all-reduce busbw, {} ranks, {} ({} {})", args.ranks, out.provider, args.dtype.dtype, args.op);
        plot::busbw_svg(path, &title, &plot::series_by_mode(&out.rows, ""), &[])?;
        if !args.json.json {
            println!("# plot: {}", path.display());
        }
    }
    if args.json.json {
        println!("{}", serde_json::to_string(&Report { provider: &out.provider, ranks: args.ranks, results: &out.rows }).unwrap());
    }
    let wrong: u64 = out.rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        return Err(format!("{wrong} wrong elements"));
    }
    Ok(())
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

pub fn print_header(p: &Plan, args: &AllreduceArgs) {
    let per = ranks_per_process(args);
    let threads = if per > 1 { format!(" (threads: {per} per process, {} processes)", args.ranks.div_ceil(per)) } else { String::new() };
    println!(
        "# tally bench allreduce: {} ranks{threads}, provider {}, {} {}, chunk {}, window {}, {} polling",
        args.ranks,
        p.provider,
        p.dtype,
        p.op,
        format_size(p.chunk as u64),
        args.window.window,
        args.poll.poll
    );
    println!("# {}", method_line(args.loops.iters, args.loops.warmup, args.sync));
    println!(
        "{:>10} {:>10} {:>12} {:>6} {:>6} {:>11} {:>9} {:>9} {:>9} {:>11} {:>11} {:>7}",
        "mode", "size", "count", "type", "redop", "time(us)", "p50(us)", "p99(us)", "max(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"
    );
}

/// The method line every table carries (measuring.md).
pub fn method_line(iters: usize, warmup: usize, sync: bool) -> String {
    if sync {
        format!(
            "time: median of {iters} all-reduces after {warmup} warm-up (agg: at least one per stream), each started after a barrier (--sync); \
             algbw = size/time; busbw = algbw x 2(n-1)/n; every element checked"
        )
    } else {
        format!(
            "time: {iters} back-to-back all-reduces after {warmup} warm-up (agg: at least one per stream) and one barrier: time = loop time / {iters}, \
             p50/p99/max of per-operation times (an operation ends when the last rank has its result); algbw = size/time; \
             busbw = algbw x 2(n-1)/n; every element checked"
        )
    }
}

pub fn format_row(r: &Row) -> String {
    format!(
        "{:>10} {:>10} {:>12} {:>6} {:>6} {:>11.1} {:>9.1} {:>9.1} {:>9.1} {:>11.3} {:>11.3} {:>7}",
        r.mode,
        format_size(r.bytes as u64),
        r.count,
        r.dtype,
        r.op,
        r.time_us,
        r.p50_us,
        r.p99_us,
        r.max_us,
        r.algbw_gbps,
        r.busbw_gbps,
        r.wrong
    )
}

/// Runs the whole benchmark from this process; prints the table unless --json.
pub fn launch(args: &AllreduceArgs) -> Result<Outcome, String> {
    let p = plan(args)?;
    let mut server = None;
    let mut servers = args.servers.clone();
    let hosting = servers.is_empty() && args.mode.mode.iter().any(|m| m.starts_with("agg"));
    let lcores = if hosting { tally_engine::host::cpuset::CoreList::parse(&args.lcores).map_or(0, |l| l.len()) } else { 0 };
    // `--poll auto` becomes busy or adaptive here, for the hosted server and every rank.
    let mut resolved = args.clone();
    resolved.poll.poll = resolve_poll(args, args.ranks as usize + lcores)?;
    let args = &resolved;
    check_busy(args, args.ranks as usize + lcores, &format!("{} ranks and {lcores} server lcores", args.ranks))?;
    // A hosted server has a control connection and a connection per lcore to every rank.
    ensure_fds(args.ranks as u64 * (lcores as u64 + 1) + 256)?;
    if hosting {
        let text = format!(
            "listen = \"127.0.0.1:0\"\nlcores = \"{}\"\nhugepages = \"{}\"\nprovider = \"{}\"\npoll = \"{}\"\nmax_chunk = \"{}\"\n",
            args.lcores,
            args.hugepages.hugepages,
            p.provider,
            args.poll.poll.as_str(),
            format_size_toml(p.chunk.max(4096))
        );
        let cfg = ServerFile::parse(&text).and_then(|f| f.resolve()).map_err(|e| e.to_string())?;
        let s = Server::start(&cfg).map_err(|e| e.to_string())?;
        servers.push(s.local_addr().to_string());
        server = Some(s);
    }
    if !args.json.json {
        print_header(&p, args);
    }
    let boot = format!("127.0.0.1:{}", free_port()?);
    // Unique among concurrent launches: wall-clock nanoseconds mixed with the pid.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let job_id = (nanos ^ (std::process::id() as u64).rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    let per = ranks_per_process(args);
    for rank in (0..args.ranks).step_by(per as usize) {
        let mut c = Command::new(&exe);
        c.args(["bench", "allreduce", "--rank", &rank.to_string(), "--bootstrap", &boot, "--job-id", &job_id.to_string()]);
        c.args(["--ranks-per-process", &per.to_string()]);
        if let Some(ms) = args.sleep_ms {
            c.args(["--sleep-ms", &ms.to_string()]);
        }
        if per > 1 && p.provider.starts_with("tcp") {
            for (var, value) in thread_rxm_env() {
                if std::env::var_os(var).is_none() {
                    c.env(var, value);
                }
            }
        }
        c.args(["--ranks", &args.ranks.to_string(), "--provider", &p.provider, "--dtype", &args.dtype.dtype, "--op", &args.op]);
        c.args(["--iters", &args.loops.iters.to_string(), "--warmup", &args.loops.warmup.to_string(), "--chunk", &args.chunk]);
        c.args(["--window", &args.window.window.to_string(), "--poll", args.poll.poll.as_str(), "--mode", &args.mode.mode.join(",")]);
        c.args(["--send-credits", &args.send_credits.to_string(), "--timeout", &args.timeout.to_string()]);
        if args.sync {
            c.arg("--sync");
        }
        if let Some(pl) = &args.plugin {
            c.arg("--plugin").arg(pl);
        }
        c.args(["--plugin-piece", &args.plugin_piece, "--plugin-in-flight", &args.plugin_in_flight.to_string()]);
        if let Some(rc) = &args.cores.cores {
            c.args(["--cores", rc]);
        }
        c.args(["--sizes", &p.sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",")]);
        if !servers.is_empty() {
            c.args(["--servers", &servers.join(",")]);
        }
        if let Some(a) = &args.fabric_addr {
            c.args(["--fabric-addr", a]);
        }
        c.stdout(if rank == 0 { Stdio::piped() } else { Stdio::null() });
        let redirected = logfile::redirected();
        if redirected {
            c.stderr(Stdio::piped());
        }
        let mut child = c.spawn().map_err(|e| format!("cannot start rank {rank}: {e}"))?;
        if let Some(err) = child.stderr.take() {
            logfile::forward(err, ranks_label(rank, per, args.ranks));
        }
        children.push(child);
    }
    let steps: Vec<String> =
        args.mode.mode.iter().flat_map(|m| p.sizes.iter().map(move |&b| format!("{m} {}", format_size(b as u64)))).collect();
    let mut progress = Progress::new(steps.len(), args.json.json);
    progress.working_on(steps.first().cloned().unwrap_or_default());
    let mut rows = Vec::new();
    if let Some(out) = children[0].stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(j) = line.strip_prefix("RESULT ") {
                let r: Row = serde_json::from_str(j).map_err(|e| e.to_string())?;
                if !args.json.json {
                    progress.println(&format_row(&r));
                }
                rows.push(r);
                progress.step();
                if let Some(next) = steps.get(rows.len()) {
                    progress.working_on(next.clone());
                }
            }
        }
    }
    progress.finish();
    let mut failed = Vec::new();
    for (k, mut c) in children.into_iter().enumerate() {
        let st = c.wait().map_err(|e| e.to_string())?;
        if !st.success() {
            let label = ranks_label(k as u32 * per, per, args.ranks);
            failed.push(format!("{} exited with {st}", label.trim_matches(['[', ']'])));
        }
    }
    let lcore_stats = server.as_ref().map(|s| s.stats()).unwrap_or_default();
    if let Some(s) = server {
        s.stop();
    }
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    let expected = p.sizes.len() * args.mode.mode.len();
    if rows.len() != expected {
        return Err(format!("rank 0 reported {} of {expected} results", rows.len()));
    }
    Ok(Outcome { provider: p.provider, rows, lcore_stats })
}

/// Most completion timestamps (ranks x iterations) gathered to time
/// operations by their last rank: 8 MiB of them.
pub const GATHER_STAMPS: usize = 1 << 20;

/// This host's monotonic clock in nanoseconds: the same clock in every
/// process of the host (Instant's, which cannot be compared across processes).
fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Per-operation times (seconds) of a back-to-back loop from every rank's
/// timestamps (`parts[r]`: the loop's start, then each completion, as
/// little-endian u64 nanoseconds): operation k took the last rank's
/// completion of k minus the last rank's of k - 1 (of the start for k = 0).
fn last_rank_times(parts: &[Vec<u8>], iters: usize) -> Result<Vec<f64>, String> {
    let mut last = vec![0u64; iters + 1];
    for (r, part) in parts.iter().enumerate() {
        if part.len() != 8 * (iters + 1) {
            return Err(format!("rank {r} sent {} bytes of timestamps, not {}", part.len(), 8 * (iters + 1)));
        }
        for (l, b) in last.iter_mut().zip(part.chunks_exact(8)) {
            *l = (*l).max(u64::from_le_bytes(b.try_into().expect("8 bytes")));
        }
    }
    Ok(last.windows(2).map(|w| w[1].saturating_sub(w[0]) as f64 / 1e9).collect())
}

/// Order statistics of per-operation times (seconds), nearest-rank.
#[derive(Clone, Copy)]
struct OpTimes {
    p50: f64,
    p99: f64,
    max: f64,
}

impl OpTimes {
    fn of(times: &mut [f64]) -> OpTimes {
        times.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| times[((q * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
        OpTimes { p50: at(0.5), p99: at(0.99), max: times[times.len() - 1] }
    }
}

fn format_size_toml(b: usize) -> String {
    format!("{b}")
}

/// Puts this thread, and the threads it starts afterwards, in SCHED_IDLE
/// (no privilege needed to lower one's own priority).
fn idle_priority() -> Result<(), String> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; one sched_param we own.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(format!("sched_setscheduler(SCHED_IDLE): {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// "[rank 3]", or "[ranks 64-127]" for a process of rank threads.
fn ranks_label(first: u32, per: u32, nranks: u32) -> String {
    let last = (first + per).min(nranks) - 1;
    if last == first {
        format!("[rank {first}]")
    } else {
        format!("[ranks {first}-{last}]")
    }
}

/// This process's ranks: one, or `--ranks-per-process` threads from `--rank`.
fn run_rank(args: &AllreduceArgs) -> Result<(), String> {
    let first = args.rank.unwrap();
    let per = ranks_per_process(args);
    let last = (first + per).min(args.ranks);
    if first >= args.ranks {
        return Err(format!("--rank {first}: there are {} ranks", args.ranks));
    }
    // A rank started by hand may leave `--poll auto`; the launcher passes busy or adaptive.
    let mut resolved = args.clone();
    resolved.poll.poll = resolve_poll(args, (last - first) as usize)?;
    let args = &resolved;
    check_busy(args, (last - first) as usize, &format!("{} rank threads", last - first))?;
    // Rank 0 also holds a bootstrap connection to every other rank.
    let star = if first == 0 { args.ranks as u64 } else { 0 };
    ensure_fds((last - first) as u64 * FDS_PER_RANK + star + 64)?;
    if last - first == 1 {
        return run_one(args, first);
    }
    // The rank threads stand in for other hosts: they must not take the
    // server's cores. At normal priority 1024 of them, spinning while their
    // connections to an lcore were set up, left that lcore 1.5% of a core:
    // it did not poll for 5 s and the watchdog failed the job. In SCHED_IDLE
    // they run only when the server's lcores (and anything else) wait.
    idle_priority()?;
    let threads: Vec<_> = (first..last)
        .map(|rank| {
            let args = args.clone();
            std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn(move || run_one(&args, rank).map_err(|e| format!("rank {rank}: {e}")))
                .map_err(|e| format!("cannot start the thread of rank {rank}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let errors: Vec<String> = threads
        .into_iter()
        .filter_map(|t| match t.join() {
            Ok(r) => r.err(),
            Err(_) => Some("a rank thread panicked".into()),
        })
        .collect();
    match errors.len() {
        0 => Ok(()),
        n => {
            // One rank's error is the cause, the others mostly its echo (the
            // server failed the job for every rank): show one that is not an echo.
            let cause = errors.iter().find(|e| !e.contains("job failed")).unwrap_or(&errors[0]);
            Err(format!("{n} of {} ranks failed; {}: {cause}", last - first, if n > 1 { "cause" } else { "error" }))
        }
    }
}

/// The rails an agg rank runs: --rails, else TALLY_RAILS, else auto.
fn rails_of(args: &AllreduceArgs, provider: &str) -> usize {
    let asked = args.rails.unwrap_or_else(|| ClientConfig::new(Vec::new(), 0, 0, 1).rails);
    tally_engine::client::rails::resolve_rails(asked, provider, args.servers.len())
}

/// Warm-up all-reduces of `bytes` for an agg job of `streams` streams:
/// `asked`, but at least enough to reach every stream once when an
/// operation is too small to spread over all of them (`min_piece` apiece).
/// rxm connects to a peer on its first message, so without this the first
/// timed operations of a small size paid a connection set-up each (4 KiB
/// over 16 streams, 10 timed: a p50 of 13-29 ms on the device, against 60 us
/// once connected). `--warmup 0` stays 0.
pub fn warmup_ops(asked: usize, streams: usize, bytes: usize, min_piece: usize) -> usize {
    if asked == 0 || streams == 0 {
        return asked;
    }
    let spread = bytes.div_ceil(min_piece.max(1)).clamp(1, streams);
    asked.max(streams.div_ceil(spread))
}

/// One rank: join, then for every mode and size time and check.
fn run_one(args: &AllreduceArgs, rank: u32) -> Result<(), String> {
    let p = plan(args)?;
    let rails = rails_of(args, &p.provider);
    let mut rail_cores = Vec::new();
    if let Some(rc) = &args.cores.cores {
        let cores = tally_engine::host::cpuset::CoreList::parse(rc).map_err(|e| format!("--cores: {e}"))?;
        let cores = cores.as_slice();
        // A block per rank: its own core, then its rails' (wrapping).
        let block = if rails > 1 { 1 + rails } else { 1 };
        let at = |k: usize| cores[(rank as usize * block + k) % cores.len()];
        rail_cores = (1..block).map(at).collect();
        let core = at(0);
        tally_engine::host::cpuset::pin_current_thread(core).map_err(|e| format!("rank {rank}: cannot pin to core {core}: {e}"))?;
    }
    let n = args.ranks;
    let addr = args.bootstrap.as_deref().ok_or("--rank needs --bootstrap")?;
    // Barriers wait for the slowest rank's all-reduce, so they are bounded
    // by the same --timeout (plus start-up slack), never longer.
    let boot_timeout = Duration::from_secs(args.timeout.max(1) + 30);
    let mut boot = Bootstrap::new(addr, rank, n, boot_timeout).map_err(|e| e.to_string())?;
    let max = *p.sizes.iter().max().unwrap_or(&0);
    let dsize = p.dtype.size();
    let max_count = max / dsize;
    let mut send = vec![0u8; max_count * dsize];
    fill(p.dtype, p.op, rank, &mut send);
    let mut recv = vec![0u8; max_count * dsize];
    let busy = args.poll.poll.is_busy();
    let loop_lines = rank == 0 && loop_lines_wanted();
    for mode in &args.mode.mode {
        let mut agg = None;
        let mut min_piece = dsize;
        let mut ring = None;
        let mut plugin = None;
        if mode == "agg-plugin" {
            let lib = args.plugin.clone().unwrap_or_else(collnet_driver::default_library);
            // The plugin's client reads its rails from the environment; this
            // thread may be pinned to one core already, which auto would see.
            // Set before the plugin's first client, as NCCL's user would.
            std::env::set_var("TALLY_RAILS", rails.to_string());
            if !rail_cores.is_empty() {
                std::env::set_var("TALLY_RAIL_CORES", rail_cores.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","));
            }
            let d = collnet_driver::CollNetDriver::open(
                &lib,
                &args.servers,
                &p.provider,
                args.fabric_addr.as_deref(),
                &mut boot,
                args.job_id ^ 0x706c_7567,
                parse_size(&args.plugin_piece).map_err(|e| format!("--plugin-piece: {e}"))? as usize,
                args.plugin_in_flight,
                p.chunk,
                Duration::from_secs(args.timeout.max(1)),
            )?;
            plugin = Some(d);
        } else if mode == "agg" {
            let mut cfg = ClientConfig::new(args.servers.clone(), args.job_id, rank, n);
            cfg.provider = Some(p.provider.clone());
            cfg.chunk_bytes = p.chunk;
            cfg.window = args.window.window;
            cfg.fabric_addr = args.fabric_addr.clone();
            cfg.timeout = Duration::from_secs(args.timeout.max(1));
            cfg.send_credits = args.send_credits;
            cfg.rails = rails;
            cfg.rail_cores = rail_cores.clone();
            cfg.spin_polls = if busy { u32::MAX } else { tally_engine::dataplane::lcore::adaptive_spin() };
            cfg.sleep_ms = args.sleep_ms.unwrap_or(if ranks_per_process(args) > 1 { THREAD_SLEEP_MS } else { cfg.sleep_ms });
            min_piece = cfg.min_piece.max(dsize);
            let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
            c.join(p.dtype, p.op).map_err(|e| e.to_string())?;
            agg = Some(c);
        } else {
            let mut cfg = RingConfig::new(&p.provider);
            cfg.chunk_bytes = p.chunk;
            cfg.window = args.window.window as usize;
            cfg.poll_busy = busy;
            cfg.node = args.fabric_addr.clone().or_else(|| p.provider.starts_with("tcp").then(|| "127.0.0.1".to_string()));
            ring = Some(Ring::new(&cfg, &mut boot).map_err(|e| e.to_string())?);
        }
        for &size in &p.sizes {
            let count = size / dsize;
            let bytes = count * dsize;
            let warm = match &agg {
                Some(c) => warmup_ops(args.loops.warmup, c.streams(), bytes, min_piece),
                None => args.loops.warmup,
            };
            let mut one = |recv: &mut [u8]| -> Result<(), String> {
                match (&mut agg, &mut ring, &mut plugin) {
                    (Some(c), _, _) => c.allreduce(&send[..bytes], recv, p.dtype, p.op).map_err(|e| e.to_string()),
                    (_, Some(r), _) => r.allreduce(&send[..bytes], recv, p.dtype, p.op).map_err(|e| e.to_string()),
                    (_, _, Some(d)) => d.allreduce(&send[..bytes], recv, p.dtype, p.op),
                    _ => unreachable!("one mode is set"),
                }
            };
            for _ in 0..warm {
                one(&mut recv[..bytes])?;
            }
            let iters = args.loops.iters.max(1);
            let mut times = Vec::with_capacity(iters);
            let mut stamps: Vec<u8> = Vec::with_capacity(8 * (iters + 1));
            let mean;
            // The process's CPU time over the timed loop only (with --sync
            // its barriers too), read after any LOOP line is out.
            let cpu0;
            if args.sync {
                announce_loop(loop_lines, mode, bytes);
                cpu0 = process_cpu_s();
                for _ in 0..iters {
                    boot.barrier().map_err(|e| e.to_string())?;
                    let t0 = Instant::now();
                    one(&mut recv[..bytes])?;
                    times.push(t0.elapsed().as_secs_f64());
                }
                mean = times.iter().sum::<f64>() / iters as f64;
            } else {
                // Back to back: the barrier only before the loop; each
                // operation's time runs from the previous one's completion.
                boot.barrier().map_err(|e| e.to_string())?;
                announce_loop(loop_lines, mode, bytes);
                cpu0 = process_cpu_s();
                let t0 = Instant::now();
                let mut prev = t0;
                stamps.extend_from_slice(&mono_ns().to_le_bytes());
                for _ in 0..iters {
                    one(&mut recv[..bytes])?;
                    let now = Instant::now();
                    stamps.extend_from_slice(&mono_ns().to_le_bytes());
                    times.push((now - prev).as_secs_f64());
                    prev = now;
                }
                mean = (prev - t0).as_secs_f64() / iters as f64;
            }
            let cpu_s = process_cpu_s() - cpu0;
            let rank0 = OpTimes::of(&mut times);
            // Every rank takes the same branch (same arguments).
            let gathered = !args.sync && n as usize * (iters + 1) <= GATHER_STAMPS;
            let stats = match gathered {
                true => {
                    let parts = boot.allgather(&stamps).map_err(|e| e.to_string())?;
                    OpTimes::of(&mut last_rank_times(&parts, iters)?)
                }
                false => rank0,
            };
            let t = if args.sync { stats.p50 } else { mean };
            let wrong = check(p.dtype, p.op, n, &recv[..bytes]);
            let total_wrong = boot.reduce_sum_u64(wrong).map_err(|e| e.to_string())?;
            if rank == 0 {
                let algbw = bytes as f64 / t / 1e9;
                let row = Row {
                    mode: mode.clone(),
                    bytes,
                    count,
                    dtype: p.dtype.name().into(),
                    op: p.op.name().into(),
                    time_us: t * 1e6,
                    method: if args.sync { "sync" } else { "back-to-back" }.into(),
                    iters,
                    mean_us: mean * 1e6,
                    p50_us: stats.p50 * 1e6,
                    p99_us: stats.p99 * 1e6,
                    max_us: stats.max * 1e6,
                    per_op: if gathered { "every rank" } else { "rank 0" }.into(),
                    rank0_p50_us: rank0.p50 * 1e6,
                    algbw_gbps: algbw,
                    busbw_gbps: algbw * 2.0 * (n as f64 - 1.0) / n as f64,
                    wrong: total_wrong,
                    cpu_s,
                };
                println!("RESULT {}", serde_json::to_string(&row).unwrap());
            }
        }
        boot.barrier().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Set to 1 (`tally bench cluster` does, on worker 0) to have rank 0 print
/// `LOOP <mode> <bytes>` just before each timed loop, so that the caller can
/// sample other processes' CPU time over the same interval.
pub const LOOP_LINES_ENV: &str = "TALLY_BENCH_LOOP_LINES";

/// Whether [`LOOP_LINES_ENV`] asks for `LOOP` lines; read once per rank,
/// so that the usual output is unchanged without it.
fn loop_lines_wanted() -> bool {
    std::env::var_os(LOOP_LINES_ENV).is_some_and(|v| v == "1")
}

/// Prints `LOOP <mode> <bytes>` (stdout is line-buffered: it leaves now)
/// when `enabled`; called after the barrier, before the loop's clocks start.
fn announce_loop(enabled: bool, mode: &str, bytes: usize) {
    if enabled {
        println!("LOOP {mode} {bytes}");
    }
}

/// This process's CPU seconds so far, user + system, every thread (its
/// client's rail threads included), by getrusage(RUSAGE_SELF); 0 if that
/// fails (it cannot with these arguments). Read only outside timed loops.
fn process_cpu_s() -> f64 {
    // SAFETY: rusage is plain data; getrusage writes one into the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a valid pointer to an rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// Rank r's input element i: a small integer (|v| <= 2), so every partial
/// sum is exact in f32 and f64; 16-bit types accumulate in f32 and round once,
/// as the reference does (bf16 holds the sums of up to 64 ranks exactly, and
/// rounds larger ones the same way on both sides).
fn value(op: ReduceOp, rank: u32, i: usize) -> i64 {
    match op {
        // Products stay within ±2^6: at most one 2 per element across ranks.
        ReduceOp::Prod => {
            let sign = if (i + rank as usize).is_multiple_of(5) { -1 } else { 1 };
            if (i % 7) as u32 == rank % 7 && rank < 7 {
                2 * sign
            } else {
                sign
            }
        }
        _ => ((i.wrapping_mul(7) + rank as usize * 13) % 5) as i64 - 2,
    }
}

fn put(dtype: DataType, out: &mut [u8], v: f64) {
    match dtype {
        DataType::Float32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::Float64 => out.copy_from_slice(&v.to_le_bytes()),
        DataType::Float16 => out.copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
        DataType::Bfloat16 => out.copy_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
        _ => out.copy_from_slice(&(v as i64).to_le_bytes()[..dtype.size()]),
    }
}

fn fill(dtype: DataType, op: ReduceOp, rank: u32, buf: &mut [u8]) {
    let unsigned = matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
    for (i, e) in buf.chunks_exact_mut(dtype.size()).enumerate() {
        let mut v = value(op, rank, i);
        if unsigned {
            v = v.abs();
        }
        put(dtype, e, v as f64);
    }
}

/// [`value`] repeats every `PERIOD` elements (it depends on i mod 5 and,
/// for products, i mod 7), so the reference of element i is that of i mod
/// PERIOD: computed once per check over every rank, then each element is
/// compared. (Over n ranks per element, 512 rank threads checking 64 KiB
/// each would take 4 billion steps.)
const PERIOD: usize = 35;

/// Counts elements of `out` that differ from the exact reference.
fn check(dtype: DataType, op: ReduceOp, n: u32, out: &[u8]) -> u64 {
    let size = dtype.size();
    let mut want = vec![0u8; PERIOD * size];
    for (i, w) in want.chunks_exact_mut(size).enumerate() {
        reference(dtype, op, n, i, w);
    }
    out.chunks_exact(size).enumerate().filter(|(i, got)| *got != &want[(i % PERIOD) * size..][..size]).count() as u64
}

/// The exact result of element `i` over `n` ranks, in `dtype`, into `want`.
fn reference(dtype: DataType, op: ReduceOp, n: u32, i: usize, want: &mut [u8]) {
    let unsigned = matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
    let vals = (0..n).map(|r| {
        let v = value(op, r, i);
        if unsigned {
            v.abs()
        } else {
            v
        }
    });
    let exact: i64 = match op {
        ReduceOp::Sum | ReduceOp::Avg => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Max => vals.max().unwrap(),
        ReduceOp::Min => vals.min().unwrap(),
    };
    match (op, dtype) {
        // Averages divide once, in the type the kernels divide in.
        (ReduceOp::Avg, DataType::Float64) => put(dtype, want, exact as f64 / n as f64),
        (ReduceOp::Avg, DataType::Float32 | DataType::Float16 | DataType::Bfloat16) => put(dtype, want, (exact as f32 / n as f32) as f64),
        (ReduceOp::Avg, _) => put(dtype, want, (exact / n as i64) as f64),
        _ => put(dtype, want, exact as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_sizes_warm_up_every_stream() {
        // 4 KiB pieces: a 4 KiB all-reduce reaches one of 16 streams, 16 KiB four.
        assert_eq!(warmup_ops(3, 16, 4096, 4096), 16);
        assert_eq!(warmup_ops(3, 16, 16384, 4096), 4);
        // Large ones reach every stream each: the warm-up asked for.
        assert_eq!(warmup_ops(3, 16, 64 << 20, 4096), 3);
        // None asked, none done; a job without streams (ring) as asked.
        assert_eq!(warmup_ops(0, 16, 4096, 4096), 0);
        assert_eq!(warmup_ops(2, 0, 4096, 4096), 2);
    }

    #[test]
    fn inputs_repeat_every_period() {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg] {
            for rank in [0, 1, 6, 7, 63, 1023] {
                for i in 0..3 * PERIOD {
                    assert_eq!(value(op, rank, i), value(op, rank, i % PERIOD), "{op:?} rank {rank} element {i}");
                }
            }
        }
    }

    #[test]
    fn an_operation_ends_with_its_last_rank() {
        let stamps = |v: &[u64]| v.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>();
        // Two ranks taking turns to finish first: each one's own intervals
        // alternate 2 and 8 us, the operations themselves take 5 each.
        let a = stamps(&[0, 2_000, 10_000, 12_000, 20_000]);
        let b = stamps(&[1_000, 5_000, 7_000, 15_000, 17_000]);
        let t = last_rank_times(&[a.clone(), b], 4).unwrap();
        assert_eq!(t, [4e-6, 5e-6, 5e-6, 5e-6]);
        assert!(last_rank_times(&[a, vec![0; 8]], 4).unwrap_err().contains("rank 1"));
    }

    #[test]
    fn the_check_finds_each_wrong_element() {
        let (n, count) = (5u32, 1000usize);
        let mut out = vec![0u8; count * 4];
        for (i, e) in out.chunks_exact_mut(4).enumerate() {
            reference(DataType::Float32, ReduceOp::Sum, n, i, e);
        }
        assert_eq!(check(DataType::Float32, ReduceOp::Sum, n, &out), 0);
        out[4 * 777] ^= 1;
        out[4 * 3 + 2] ^= 4;
        assert_eq!(check(DataType::Float32, ReduceOp::Sum, n, &out), 2);
    }
}
