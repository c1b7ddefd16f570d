//! What a `tally bench allreduce` run is: its flags ([`AllreduceArgs`]),
//! the plan they resolve to (provider, sizes, type, op, chunk), how many
//! ranks share a process, and how its pollers poll.
use crate::cli_args::{CoresArg, DtypeArg, HugepagesArg, JsonArg, LoopArgs, ModeArg, PlotArg, PollArg, PollMode, ProviderArg, WindowArg};
use clap::Args;
use tally_engine::host::units::parse_size;
use tally_engine::reduce::{DataType, ReduceOp};
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
    /// agg: all-reduces in flight at once (1 to 8), each into a result buffer of its own,
    /// as a training step overlaps its buckets' all-reduces; 1: one after another.
    #[arg(long, default_value_t = 1)]
    pub agg_in_flight: usize,
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
    /// agg: endpoints per rank, each on its own thread; more than servers
    /// spread each server's lcores over several (0: auto, one per server
    /// but at least 4, over tcp on 8+ cores; 1: no rail threads).
    /// TALLY_RAILS sets the default.
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
    /// agg-plugin: bytes per iallreduce, or auto: what NCCL's CollNet hands the plugin for
    /// each size over its channels (NCCL_MIN_NCHANNELS, else the plugin's 4: 512 KiB at 16
    /// MiB, 1 MiB from 64 MiB).
    #[arg(long, default_value = "auto")]
    pub plugin_piece: String,
    /// agg-plugin: iallreduces in flight per group of up to 8 channels (NCCL keeps up to
    /// NCCL_STEPS = 8 steps of each group outstanding).
    #[arg(long, default_value_t = 8)]
    pub plugin_in_flight: usize,
    /// agg-plugin: the plugin's chunk (TALLY_CHUNK), or auto: the plugin's own default, as
    /// under NCCL (--chunk is agg's and the ring's).
    #[arg(long, default_value = "auto")]
    pub plugin_chunk: String,
    #[command(flatten)]
    pub plot: PlotArg,
    /// Run as one rank of a job a launcher started (srun, torchrun), agg only: the rank and
    /// rank count from RANK and WORLD_SIZE (else SLURM_PROCID and SLURM_NTASKS), rank 0
    /// listening for the others at MASTER_ADDR:MASTER_PORT (default 29500), the servers from
    /// --servers or TALLY_SERVERS, the token from TALLY_TOKEN; rank 0 draws the job's id and
    /// secret. Every element of every all-reduce (warm-up too) is checked; each rank prints
    /// one line (--json: an object) and exits 1 when any rank had a wrong element.
    #[arg(long)]
    pub launched: bool,
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
    /// The job's secret the ranks share, 64 hex digits (drawn by the
    /// launcher; `ClientConfig::job_secret`). Like every argument, other
    /// users of the host can read it in the process list: the bench's
    /// jobs are the host's own.
    #[arg(long, hide = true)]
    pub job_secret: Option<String>,
}

/// A job secret from its 64 hex digits.
pub fn parse_secret(hex: &str) -> Result<tally_engine::wire::JobSecret, String> {
    let b = hex.trim().as_bytes();
    if b.len() != 2 * tally_engine::wire::JOB_SECRET_BYTES {
        return Err(format!("--job-secret: {} hex digits, not 64", b.len()));
    }
    let digit = |c: u8| (c as char).to_digit(16).ok_or_else(|| format!("--job-secret: {:?} is not a hex digit", c as char));
    let mut s = [0u8; tally_engine::wire::JOB_SECRET_BYTES];
    for (i, pair) in b.chunks(2).enumerate() {
        s[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Ok(s)
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

pub(super) fn plan(args: &AllreduceArgs) -> Result<Plan, String> {
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
    if !(1..=super::overlap::MAX_IN_FLIGHT).contains(&args.agg_in_flight) {
        return Err(format!("--agg-in-flight: between 1 and {}", super::overlap::MAX_IN_FLIGHT));
    }
    if args.agg_in_flight > 1 && args.sync {
        return Err("--agg-in-flight: overlapping all-reduces are timed back to back, not with --sync".into());
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
pub(super) fn ranks_per_process(args: &AllreduceArgs) -> u32 {
    match args.ranks_per_process {
        Some(k) => k.clamp(1, args.ranks.max(1)),
        None if args.rank.is_some() || args.ranks <= PROCESS_RANKS => 1,
        None => PROCESS_RANKS,
    }
}

/// Busy pollers that share a core take turns by the scheduler's timeslice
/// (and starve the rest of the machine): refuse more of them than cores.
pub(super) fn check_busy(args: &AllreduceArgs, pollers: usize, what: &str) -> Result<(), String> {
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

/// The threads that poll for one rank: its own, and its rail threads where
/// the client runs them (several rails, or shm's one with TALLY_SHM_RAIL=1:
/// `wants_rail_threads`).
/// `auto` counts them all: a rank's rail spinning on a core another poller
/// has is as bad as two ranks on one.
pub(super) fn pollers_per_rank(args: &AllreduceArgs, provider: &str) -> usize {
    let rails = super::rank::rails_of(args, provider);
    1 + if tally_engine::client::rails::wants_rail_threads(provider, rails) { rails } else { 0 }
}

/// `--poll` for `pollers` busy-capable threads on this process's allowed
/// cores. Servers given by `--servers` have pollers this process cannot
/// count (on loopback, or in network namespaces of this machine, as tests
/// and `tally bench cluster` run them), so with them `auto` is adaptive.
pub(super) fn resolve_poll(args: &AllreduceArgs, pollers: usize) -> Result<PollMode, String> {
    if args.poll.poll == PollMode::Auto && !args.servers.is_empty() {
        return Ok(PollMode::Adaptive);
    }
    let cores = tally_engine::host::cpuset::allowed().map_err(|e| e.to_string())?.len();
    Ok(args.poll.poll.resolve(pollers, cores))
}
