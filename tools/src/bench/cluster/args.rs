//! The flags of `tally bench cluster`, and the set `tally demo` runs it with.
use crate::cli_args::{DtypeArg, IprouteArg, JsonArg, LoopArgs, ModeArg, PlotArg, PollArg, WindowArg};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Server hosts and worker hosts (N + N namespaces).
    #[arg(long, default_value_t = 4)]
    pub hosts: u32,
    /// libfabric provider between the hosts: tcp (tcp;ofi_rxm) or tcp-rdm
    /// (the tcp provider's own RDM endpoint, libfabric 1.18 and later).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "tcp-rdm"])]
    pub provider: String,
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
    /// Time each size for at least about this long (ms) at the link's agg
    /// bound: it sets --min-bytes per rate (the larger of the two wins), so
    /// that small sizes at fast links are not timed over a few ms, where one
    /// hiccup moves the figure. 0: --iters alone.
    #[arg(long, default_value_t = 500)]
    pub min_time: u64,
    #[command(flatten)]
    pub dtype: DtypeArg,
    /// Chunk size (agg piece and ring chunk; agg-plugin hands the plugin NCCL's
    /// iallreduce pieces, which its client cuts as under NCCL), or auto
    /// (32 KiB up to 8 Gbit/s, then 16 KiB per Gbit/s: `auto_chunk`).
    #[arg(long, default_value = "auto")]
    pub chunk: String,
    #[command(flatten)]
    pub window: WindowArg,
    /// agg: all-reduces in flight at once (1 to 8), each into a result buffer of its own,
    /// as a training step overlaps its buckets' all-reduces; 1: one after another.
    #[arg(long, default_value_t = 1)]
    pub agg_in_flight: usize,
    /// Sends in flight per server per worker (pacing for TCP-like links; 0: window-bound).
    /// Default: 1 for agg; agg-plugin keeps the plugin's own (TALLY_SEND_CREDITS), as under NCCL.
    #[arg(long)]
    pub send_credits: Option<u32>,
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
    /// TCP autocorking in the emulated hosts (net.ipv4.tcp_autocorking):
    /// off by default. Over veth it holds the tail segment of a message
    /// larger than a GSO packet (62636 bytes at MTU 9000) for the send
    /// completion of the rest, and on a host of several cores that tail was
    /// seen to wait for TCP's tail loss probe, about 200 ms (`tcp_loss`).
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub tcp_autocork: OnOff,
    /// Receive packet steering on every veth of the emulated network (on:
    /// every CPU in the mask). With it a flow's packets are queued, by
    /// their hash, on one CPU's backlog, as a NIC's RSS keeps a flow on one
    /// queue; without it a veth queues each packet on the backlog of the
    /// CPU that sent it, and a flow whose packets leave from two CPUs can
    /// arrive out of order (which TCP answers with spurious retransmissions).
    /// Off by default: on 64 cores (the device), where busy pollers hold
    /// every CPU, it slowed CollNet to a fraction (the steered receive work
    /// on their CPUs is the guess at why).
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub rps: OnOff,
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
    /// TALLY_PROVIDER, TALLY_FABRIC_ADDR. Where the placement gives the
    /// workers cores of their own, the commands run on those (as tally's own
    /// workers do), off the servers' lcores. Fails if any worker fails.
    #[arg(long, value_name = "CMD")]
    pub workers_run: Option<String>,
}

impl ClusterArgs {
    /// agg's send credits: `--send-credits`, else 1.
    pub fn agg_send_credits(&self) -> u32 {
        self.send_credits.unwrap_or(1)
    }

    /// The defaults `tally demo` uses.
    pub fn demo(rate: Option<f64>) -> ClusterArgs {
        ClusterArgs {
            hosts: 4,
            provider: "tcp".into(),
            rates: rate.into_iter().collect(),
            sizes: ["1M", "4M", "16M"].iter().map(|s| s.to_string()).collect(),
            mode: ModeArg::default(),
            loops: LoopArgs::default(),
            min_time: 500,
            dtype: DtypeArg::default(),
            chunk: "auto".into(),
            window: WindowArg::default(),
            agg_in_flight: 1,
            send_credits: None,
            server_lcores: None,
            poll: PollArg::default(),
            mtu: 9000,
            tbf_burst: "auto".into(),
            tbf_latency: "50ms".into(),
            tcp_autocork: OnOff::Off,
            rps: OnOff::Off,
            iproute: IprouteArg { iproute: std::env::var_os("TALLY_IPROUTE").map(PathBuf::from) },
            timeout: 300,
            json: JsonArg::default(),
            plot: PlotArg::default(),
            log: None,
            workers_run: None,
        }
    }
}

/// A setting of the emulated hosts that is on or off (`--tcp-autocork`, `--rps`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    /// As a boolean sysctl takes it.
    pub fn sysctl(self) -> &'static str {
        match self {
            OnOff::On => "1",
            OnOff::Off => "0",
        }
    }

    /// As the table's header says it.
    pub fn text(self) -> &'static str {
        match self {
            OnOff::On => "on",
            OnOff::Off => "off",
        }
    }
}

/// The rps_cpus bitmap of CPUs 0..n: hex, in comma-separated groups of 32
/// CPUs, the highest first (as /sys/class/net/*/queues/rx-*/rps_cpus reads).
pub fn cpu_mask(n: usize) -> String {
    let n = n.max(1);
    let words = n.div_ceil(32);
    (0..words)
        .rev()
        .map(|w| {
            let bits = (n - w * 32).min(32);
            let v: u32 = if bits == 32 { u32::MAX } else { (1u32 << bits) - 1 };
            if w == words - 1 {
                format!("{v:x}")
            } else {
                format!("{v:08x}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The loop arguments of the workers at `rate` Gbit/s: `--min-bytes` raised
/// to what the agg bound (`rate` / 8 GB/s per worker) moves in `--min-time`.
pub fn loops_at(args: &ClusterArgs, rate: f64) -> LoopArgs {
    let by_time = (rate / 8.0 * 1e9 * args.min_time as f64 / 1000.0) as u64;
    LoopArgs { min_bytes: args.loops.min_bytes.max(by_time), ..args.loops.clone() }
}

#[cfg(test)]
mod tests {
    use super::cpu_mask;

    #[test]
    fn cpu_masks_are_grouped_by_32() {
        assert_eq!(cpu_mask(2), "3");
        assert_eq!(cpu_mask(16), "ffff");
        assert_eq!(cpu_mask(32), "ffffffff");
        assert_eq!(cpu_mask(33), "1,ffffffff");
        assert_eq!(cpu_mask(64), "ffffffff,ffffffff");
        assert_eq!(cpu_mask(0), "1");
    }
}
