//! Flags that mean the same thing in several `tally` commands, defined once.
//!
//! `tally bench p2p`, `bench allreduce`, `bench cluster` and `demo` grew
//! their flags apart: the same `--poll` had three defaults, cores had three
//! names, and some flags had no help text. Each flag here is one clap
//! struct that a command flattens in (`#[command(flatten)]`), so its name,
//! default and help text are the same wherever it appears. Names, one per
//! meaning:
//!
//! - `--lcores`: the cores of a reduction server's lcores (as `tally server`);
//! - `--cores`: the cores a benchmark pins its own threads to (ranks,
//!   endpoints), beside any server's lcores; `--rank-cores` is its old name
//!   in `bench allreduce`, kept as a hidden alias;
//! - `--poll`: [`PollMode`], whose default `auto` is one rule everywhere.
use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// How a command's pollers (server lcores, ranks, endpoints) wait for
/// completions. (Its values' help is `--poll`'s own text, so plain comments here.)
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PollMode {
    // Busy when every poller gets a core of its own, else adaptive.
    #[default]
    Auto,
    // Spin on the completion queue without pause (a core per poller).
    Busy,
    // Spin a while, then sleep until traffic arrives (pollers may share cores).
    Adaptive,
}

impl PollMode {
    /// The mode in force for `pollers` threads on `cores` cores: `auto` is
    /// busy only when no two busy pollers would share a core (they would take
    /// turns by the scheduler's timeslice, and starve the rest of the machine).
    pub fn resolve(self, pollers: usize, cores: usize) -> PollMode {
        match self {
            PollMode::Auto if pollers <= cores => PollMode::Busy,
            PollMode::Auto => PollMode::Adaptive,
            other => other,
        }
    }

    pub fn is_busy(self) -> bool {
        self == PollMode::Busy
    }

    /// The word the server's configuration and the command line take.
    pub fn as_str(self) -> &'static str {
        match self {
            PollMode::Auto => "auto",
            PollMode::Busy => "busy",
            PollMode::Adaptive => "adaptive",
        }
    }
}

impl std::fmt::Display for PollMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `--poll`.
#[derive(Args, Debug, Clone, Default)]
pub struct PollArg {
    /// Polling of the server lcores, ranks and endpoints this command starts:
    /// auto (busy when every poller gets a core of its own, else adaptive;
    /// `bench cluster`: adaptive, its hosts share this machine's cores),
    /// busy (each spins on its own core) or adaptive (spin, then sleep until traffic).
    #[arg(long, value_enum, default_value_t = PollMode::Auto)]
    pub poll: PollMode,
}

/// `--provider`.
#[derive(Args, Debug, Clone, Default)]
pub struct ProviderArg {
    /// libfabric provider: efa, shm, tcp (tcp;ofi_rxm) or tcp-rdm (libfabric 1.18+: tcp's own RDM endpoint). Default: TALLY_PROVIDER,
    /// else efa if present, else shm when every peer is on this machine, else tcp.
    #[arg(long)]
    pub provider: Option<String>,
}

/// `--hugepages`.
#[derive(Args, Debug, Clone)]
pub struct HugepagesArg {
    /// Hugepage policy for the registered buffers (a hosted server's slabs
    /// too): require, prefer (fall back to normal pages) or off.
    #[arg(long, default_value = "prefer")]
    pub hugepages: String,
}

impl Default for HugepagesArg {
    fn default() -> Self {
        HugepagesArg { hugepages: "prefer".into() }
    }
}

/// `--json`.
#[derive(Args, Debug, Clone, Default)]
pub struct JsonArg {
    /// Print the results as one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `--cores` (bench p2p, bench allreduce).
#[derive(Args, Debug, Clone, Default)]
pub struct CoresArg {
    /// Cores this benchmark pins its own threads to, DPDK syntax (e.g. 2-9,12),
    /// taken in order and wrapping; a hosted server's lcores are --lcores.
    /// bench p2p: the two ends, or the hubs then the leaves (default: the
    /// allowed cores). bench allreduce: each rank an equal share of the list,
    /// in rank order, its own thread on the share's first core and its rails
    /// on the next ones (default: the scheduler places ranks).
    #[arg(long, alias = "rank-cores", value_name = "CORES")]
    pub cores: Option<String>,
}

/// `--mode` (bench allreduce, bench cluster).
#[derive(Args, Debug, Clone)]
pub struct ModeArg {
    /// What to time, comma-separated: agg (through reduction servers, tally's
    /// client), agg-plugin (through libnccl-net-tally.so's ncclCollNet, as NCCL
    /// drives it), ring (ranks to each other, no server); bench cluster also
    /// takes tcp (plain TCP streams moving agg's bytes per link: the kernel's
    /// own cost, after the others).
    #[arg(long, value_delimiter = ',', default_value = "agg,ring")]
    pub mode: Vec<String>,
}

impl Default for ModeArg {
    fn default() -> Self {
        ModeArg { mode: vec!["agg".into(), "ring".into()] }
    }
}

/// `--iters`, `--min-bytes` and `--warmup` of the all-reduce benchmarks
/// (bench allreduce, bench cluster).
#[derive(Args, Debug, Clone)]
pub struct LoopArgs {
    /// Timed all-reduces per size: a back-to-back loop (mean, p50, p99 and max per operation).
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// More timed all-reduces at small sizes: each size runs until it has
    /// moved at least this many bytes per rank (K/M/G), but at most 2000
    /// all-reduces and never fewer than --iters. bench cluster sets it from --min-time.
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    pub min_bytes: u64,
    /// Untimed all-reduces per size before the timed loop (agg: at least one per stream).
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
}

impl Default for LoopArgs {
    fn default() -> Self {
        LoopArgs { iters: 20, min_bytes: 0, warmup: 3 }
    }
}

/// The most timed all-reduces `--min-bytes` asks of one size.
pub const MAX_LOOP_ITERS: usize = 2000;

impl LoopArgs {
    /// Timed all-reduces of `bytes` each: `--iters`, or as many as move
    /// `--min-bytes` (at most [`MAX_LOOP_ITERS`]). Every rank derives it
    /// from the same arguments, so every rank runs the same loop.
    pub fn iters_for(&self, bytes: usize) -> usize {
        let fill = (self.min_bytes as usize).div_ceil(bytes.max(1)).min(MAX_LOOP_ITERS);
        self.iters.max(fill).max(1)
    }
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    tally_engine::host::units::parse_size(s).map_err(|e| e.to_string())
}

/// `--dtype` (bench allreduce, bench cluster).
#[derive(Args, Debug, Clone)]
pub struct DtypeArg {
    /// Element type: f32, f64, f16, bf16, i8, u8, i32, u32, i64 or u64.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

impl Default for DtypeArg {
    fn default() -> Self {
        DtypeArg { dtype: "f32".into() }
    }
}

/// `--window` (bench allreduce, bench cluster).
#[derive(Args, Debug, Clone, Default)]
pub struct WindowArg {
    /// Chunks in flight per server lcore (agg) or per direction (ring).
    /// 0: auto (the client library's: 4, or 2 where chunks of 512 KiB and up
    /// would put more than 1 MiB in flight per server lcore; the ring: 4).
    #[arg(long, default_value_t = 0)]
    pub window: u32,
}

/// The ring's window where `--window` is left to auto.
pub const RING_AUTO_WINDOW: u32 = 4;

impl WindowArg {
    /// The agg client's window for chunks of `chunk` bytes.
    pub fn agg(&self, chunk: usize) -> u32 {
        if self.window == 0 {
            tally_engine::client::auto_window(chunk)
        } else {
            self.window
        }
    }

    /// The ring's window.
    pub fn ring(&self) -> u32 {
        if self.window == 0 {
            RING_AUTO_WINDOW
        } else {
            self.window
        }
    }

    /// For a header line: "4", or "auto (agg 2, ring 4)".
    pub fn text(&self, chunk: usize) -> String {
        match self.window {
            0 => format!("auto (agg {}, ring {})", self.agg(chunk), self.ring()),
            w => w.to_string(),
        }
    }
}

/// `--plot` (bench allreduce, bench cluster).
#[derive(Args, Debug, Clone, Default)]
pub struct PlotArg {
    /// Write bus bandwidth against size (a line per mode) to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// `--iproute` (bench cluster, demo).
#[derive(Args, Debug, Clone, Default)]
pub struct IprouteArg {
    /// Folder with Debian's iproute2 unpacked (`dpkg -x`), for hosts without `ip` and `tc`.
    #[arg(long, env = "TALLY_IPROUTE")]
    pub iproute: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_busy_only_with_a_core_per_poller() {
        assert_eq!(PollMode::Auto.resolve(2, 2), PollMode::Busy);
        assert_eq!(PollMode::Auto.resolve(6, 2), PollMode::Adaptive);
        assert_eq!(PollMode::Auto.resolve(6, 16), PollMode::Busy);
        // Asked for, a mode is kept: commands refuse busy pollers past their cores themselves.
        assert_eq!(PollMode::Busy.resolve(6, 2), PollMode::Busy);
        assert_eq!(PollMode::Adaptive.resolve(1, 16), PollMode::Adaptive);
    }

    #[test]
    fn min_bytes_raises_the_iterations_of_small_sizes_only() {
        let l = LoopArgs { iters: 20, min_bytes: 2 << 30, warmup: 3 };
        assert_eq!(l.iters_for(64 << 20), 32);
        assert_eq!(l.iters_for(1 << 30), 20);
        assert_eq!(l.iters_for(4096), MAX_LOOP_ITERS);
        assert_eq!(MAX_LOOP_ITERS, 2000, "--min-bytes's help text says 2000");
        assert_eq!(LoopArgs::default().iters_for(1), 20);
        assert_eq!(LoopArgs { iters: 0, ..LoopArgs::default() }.iters_for(1 << 20), 1);
    }
}
