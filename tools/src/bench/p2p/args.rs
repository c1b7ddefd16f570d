//! The flags of `tally bench p2p`, both modes (two ends, fan), and how
//! both read `--poll` and `--hugepages`.
use crate::cli_args::{CoresArg, HugepagesArg, JsonArg, PollArg, ProviderArg};
use clap::Args;
use tally_engine::dataplane::slab::HugepagePolicy;

#[derive(Args, Debug, Clone)]
pub struct P2pArgs {
    #[command(flatten)]
    pub provider: ProviderArg,
    /// Message sizes, comma-separated (K/M/G suffixes). Default: 8 B to 16 MiB in steps of 4x.
    /// Fan mode: bytes per leaf. Default: 256 KiB to 64 MiB in steps of 4x.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<String>,
    /// Ping-pong round trips per size (after warm-up) [default: 1000]. Fan
    /// mode: timed repetitions per size [default: 10].
    #[arg(long)]
    pub iters: Option<usize>,
    /// Warm-up round trips per size [default: 100]. Fan mode: untimed (but
    /// checked) repetitions per size [default: 2].
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Messages in flight when streaming (capped at 256 MiB in flight) [default: 16].
    /// Deeper windows make tcp;ofi_rxm's rendezvous path back off (2 GB/s at 64
    /// vs 9-10 GB/s at 4-16 for 512 KiB here). Fan mode: pieces in flight per
    /// (leaf, hub) pair [default: 4, as `tally bench allreduce`].
    #[arg(long)]
    pub window: Option<usize>,
    #[command(flatten)]
    pub cores: CoresArg,
    /// Fan mode: hub endpoints (a server's lcores), each a thread on its own
    /// core. 0 (with --leaves 0): the two-end mode.
    #[arg(long, default_value_t = 0)]
    pub hubs: usize,
    /// Fan mode: leaf endpoints (ranks), each a thread on its own core; --sizes
    /// is then the bytes each leaf sends (an all-reduce's size).
    #[arg(long, default_value_t = 0)]
    pub leaves: usize,
    /// Fan mode: bytes per piece [default: 256K, as `tally bench allreduce --chunk`],
    /// cut smaller as the client cuts small all-reduces.
    #[arg(long)]
    pub chunk: Option<String>,
    #[command(flatten)]
    pub poll: PollArg,
    #[command(flatten)]
    pub hugepages: HugepagesArg,
    #[command(flatten)]
    pub json: JsonArg,
}

/// `--poll` for `pollers` threads on `cores` cores (true: busy) and
/// `--hugepages`, as both modes read them.
pub fn poll_and_policy(args: &P2pArgs, pollers: usize, cores: usize) -> Result<(bool, HugepagePolicy), String> {
    let busy = args.poll.poll.resolve(pollers, cores).is_busy();
    let policy: HugepagePolicy = args.hugepages.hugepages.parse().map_err(|e| format!("--hugepages: {e}"))?;
    Ok((busy, policy))
}
