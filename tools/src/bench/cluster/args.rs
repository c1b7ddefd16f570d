//! The flags of `tally bench cluster`, and the set `tally demo` runs it with.
use super::loss::{parse_loss, LossLevel};
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
    /// cores can carry: 2 x cores / hosts rounded down to a power of two, 1/16 to 16).
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
    /// (32 KiB up to 4 Gbit/s, 128 KiB up to 16, then 16 KiB per Gbit/s).
    #[arg(long, default_value = "auto")]
    pub chunk: String,
    #[command(flatten)]
    pub window: WindowArg,
    /// agg: all-reduces in flight at once (1 to 8), each into a result buffer of its own,
    /// as a training step overlaps its buckets' all-reduces; 1: one after another.
    #[arg(long, default_value_t = 1)]
    pub agg_in_flight: usize,
    /// Sends in flight per server per worker (pacing for TCP-like links; 0: window-bound).
    /// Default: the client library's own for both modes (TALLY_SEND_CREDITS, else 0), as a
    /// user's ranks and NCCL's would run.
    #[arg(long)]
    pub send_credits: Option<u32>,
    /// Lcores per server (default: 1 where no link is above 8 Gbit/s and the host has 2
    /// cores per host pair; else 4 where it has 16, or 8 and a link above 16 Gbit/s; else 2
    /// where it has 4, else 1 where it has 2, else every server's 2 lcores on cores 0-1).
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
    /// The emulated hosts' TCP retransmission timeout floor, in ms (the
    /// `rto_min` of their routes), or `kernel` for the kernel's 200 ms. The
    /// same floor bounds the wait of a tail loss probe with one segment in
    /// flight, so each lost or late tail segment costs about this long.
    #[arg(long, value_parser = parse_rto_min, default_value = "kernel")]
    pub tcp_rto_min: RtoMin,
    /// The emulated hosts' initial TCP receive buffer (the middle value of
    /// net.ipv4.tcp_rmem, e.g. 4M; the most it may grow to is raised to
    /// match), or `kernel` for the kernel's (128 KiB, growing to 6 MiB). A
    /// receiver whose buffer fills closes its window (the loss line counts
    /// how often); 8M closed none where the kernel's closed hundreds. The
    /// 200 ms waits seen under real NCCL were not closed windows but BBR's
    /// pacing (`--tcp-cc`).
    #[arg(long, value_parser = parse_rcvbuf, default_value = "kernel")]
    pub tcp_rcvbuf: RcvBuf,
    /// The emulated hosts' TCP congestion control (their routes' `congctl`):
    /// cubic, Linux's own default, unless named (bbr, reno, any this kernel
    /// offers), or `kernel` for this machine's net.ipv4.tcp_congestion_control
    /// (new namespaces inherit it). Not the machine's by default: a machine
    /// set to bbr (BBR v1, which then paces every socket itself) made the
    /// figures BBR's. On the device's emulated links its sockets were seen
    /// holding a megabyte unsent for 100-240 ms, window open and nothing in
    /// flight, waiting on their pacing, and real NCCL's slowest all-reduces
    /// took 2-4 times the median (docs/measurements.md).
    #[arg(long, value_parser = parse_tcp_cc, default_value = "cubic")]
    pub tcp_cc: TcpCc,
    /// Connections per worker-server pair in `--mode tcp`, the bytes split
    /// evenly over them: one stream tops out below a fast link on one
    /// machine (0.48-0.52 of 32 Gbit/s on nvidia-h200-x2), while agg runs
    /// several per pair (an lcore's, per rail), so the kernel's own
    /// ceiling needs as many.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub tcp_streams: u32,
    /// Where `--mode tcp` runs each server host's end: on the workers'
    /// cores with the workers' ends (the default), or on that server's own
    /// cores, beside its lcores (idle under adaptive polling), as the
    /// servers' own TCP work runs under agg: the kernel's ceiling on the
    /// cores a server has.
    #[arg(long, value_enum, default_value_t = TcpEnds::Workers)]
    pub tcp_server_ends: TcpEnds,
    /// Which servers a worker's streams go to in `--mode tcp`: its own
    /// (worker i to server i, the default), or every server, a worker's
    /// bytes split over them and a server's over every worker, as agg's
    /// ranks and servers exchange theirs (`--tcp-streams` connections to
    /// each): the kernel's cost over as many connections as agg opens.
    #[arg(long, value_enum, default_value_t = TcpPeers::Own)]
    pub tcp_peers: TcpPeers,
    /// Receive packet steering on every veth of the emulated network: off,
    /// on (every CPU in the mask) or workers (the workers' cores, off the
    /// servers' busy-polling lcores; every CPU where they share). With it a
    /// flow's packets are queued, by their hash, on one CPU's backlog, as a
    /// NIC's RSS keeps a flow on one queue; without it a veth queues each
    /// packet on the backlog of the CPU that sent it, and a flow whose packets
    /// leave from several CPUs (a host's rails and lcores share its one
    /// shaped link) arrives out of order, which TCP answers with spurious
    /// retransmissions. auto (the default): off, but `workers` with
    /// `--loss` where the workers have cores of their own (where every host
    /// shares a few cores nothing reorders, and steering costs CPU: 0
    /// reorderings on the 2-core machine at 1 Gbit/s). Off: on 64 cores (the device) `workers` ended the
    /// reordering (12,000-17,000 retransmissions per CollNet run to 4-540)
    /// without making CollNet faster, and `on` slowed it to a fraction.
    /// `workers` with `--loss`: reordering on top of loss is what the
    /// emulation adds, not what a wire does, and it took most of what agg
    /// lost at 0.1% (docs/measurements.md, "The TCP floor by default").
    #[arg(long, value_enum, default_value_t = Rps::Auto)]
    pub rps: Rps,
    /// Loss levels, comma-separated: a percent of packets dropped on every
    /// link (`0,0.1,1`), or on one host's link (`s1:1`, `w0:0.5`; hosts are
    /// s<i> and w<i>). For each rate each level runs every mode and size.
    /// Dropped at random at each receiving host (nftables, else iptables'
    /// statistic match); every veth's gso_max_size is then the MTU, for
    /// every row, loss 0 too, so that a packet is one frame as on a wire.
    #[arg(long, value_delimiter = ',', value_parser = parse_loss, allow_hyphen_values = true)]
    pub loss: Vec<LossLevel>,
    #[command(flatten)]
    pub iproute: IprouteArg,
    /// Seconds the whole run may take per rate (and loss level) before it is stopped.
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
    /// Whether the ranks and lcores busy-poll (`--poll busy`; `auto` is
    /// adaptive in the emulated cluster, `placement::auto_poll`).
    pub fn busy_polling(&self) -> bool {
        self.poll.poll == crate::cli_args::PollMode::Busy
    }

    /// agg's send credits: `--send-credits`, else the library's
    /// (TALLY_SEND_CREDITS, else 0). Until 2026-11-30 this was 1, which
    /// no user's client ran: on 8 + 8 hosts at 16 Gbit/s it held each
    /// server's next piece until the last one's send completed, and with
    /// the caller's rail that wait lost a fifth of the link
    /// (docs/measurements.md, "The caller's rail for every client").
    pub fn agg_send_credits(&self) -> u32 {
        self.send_credits.unwrap_or_else(tally_engine::client::send_credits_from_env)
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
            tcp_rto_min: RtoMin::Kernel,
            tcp_rcvbuf: RcvBuf::Kernel,
            tcp_cc: TcpCc::Named("cubic".into()),
            tcp_streams: 1,
            tcp_server_ends: TcpEnds::Workers,
            tcp_peers: TcpPeers::Own,
            rps: Rps::Off,
            loss: Vec::new(),
            iproute: IprouteArg { iproute: std::env::var_os("TALLY_IPROUTE").map(PathBuf::from) },
            timeout: 300,
            json: JsonArg::default(),
            plot: PlotArg::default(),
            log: None,
            workers_run: None,
        }
    }
}

/// Where `--mode tcp` runs the server hosts' stream ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TcpEnds {
    /// On the workers' cores, with the workers' ends.
    Workers,
    /// Each on its own server's cores.
    Servers,
}

/// Which servers `--mode tcp`'s worker ends exchange bytes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TcpPeers {
    /// Worker i with server i.
    Own,
    /// Every worker with every server.
    All,
}

/// A setting of the emulated hosts that is on or off (`--tcp-autocork`).
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

/// `--rps`: which CPUs the veths steer received packets to.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rps {
    Auto,
    Off,
    On,
    Workers,
}

impl Rps {
    /// What `auto` is: `lossy` for a run with `--loss` whose workers have
    /// cores of their own.
    pub fn resolved(self, lossy: bool) -> Rps {
        match (self, lossy) {
            (Rps::Auto, true) => Rps::Workers,
            (Rps::Auto, false) => Rps::Off,
            (r, _) => r,
        }
    }

    /// As the table's header says it (resolved).
    pub fn text(self) -> &'static str {
        match self {
            Rps::Auto | Rps::Off => "off",
            Rps::On => "on every CPU",
            Rps::Workers => "on the workers' cores",
        }
    }
}

/// `--tcp-rto-min`: the kernel's floor, or one in whole milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RtoMin {
    Kernel,
    Ms(u32),
}

impl RtoMin {
    /// As `ip route`'s `rto_min` takes it; None for the kernel's.
    pub fn route_arg(self) -> Option<String> {
        match self {
            RtoMin::Kernel => None,
            RtoMin::Ms(ms) => Some(format!("{ms}ms")),
        }
    }

    /// The floor in ms (the kernel's is 200).
    pub fn ms(self) -> u32 {
        match self {
            RtoMin::Kernel => 200,
            RtoMin::Ms(ms) => ms,
        }
    }

    /// As the table's header says it.
    pub fn text(self) -> String {
        match self {
            RtoMin::Kernel => "200 ms (the kernel's)".into(),
            RtoMin::Ms(ms) => format!("{ms} ms"),
        }
    }
}

/// `--tcp-rcvbuf`: the kernel's initial receive buffer, or one in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RcvBuf {
    Kernel,
    Bytes(u64),
}

impl RcvBuf {
    /// As net.ipv4.tcp_rmem takes it ("min default max", the most it may
    /// grow to at least the kernel's 6 MiB); None for the kernel's.
    pub fn tcp_rmem(self) -> Option<String> {
        match self {
            RcvBuf::Kernel => None,
            RcvBuf::Bytes(n) => Some(format!("4096 {n} {}", n.max(6 << 20))),
        }
    }

    /// As the headers say it.
    pub fn text(self) -> String {
        match self {
            RcvBuf::Kernel => "the kernel's".into(),
            RcvBuf::Bytes(n) => tally_engine::host::units::format_size(n),
        }
    }
}

/// `kernel`, or a size from 4 KiB to 1 GiB.
pub fn parse_rcvbuf(s: &str) -> Result<RcvBuf, String> {
    if s == "kernel" {
        return Ok(RcvBuf::Kernel);
    }
    match tally_engine::host::units::parse_size(s) {
        Ok(n) if (4096..=1 << 30).contains(&n) => Ok(RcvBuf::Bytes(n)),
        _ => Err(format!("{s:?} is not `kernel` or a size from 4K to 1G")),
    }
}

/// `--tcp-cc`: this machine's congestion control, or one by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TcpCc {
    Kernel,
    Named(String),
}

impl TcpCc {
    /// The name to set on each host's route; None for the machine's.
    pub fn name(&self) -> Option<&str> {
        match self {
            TcpCc::Kernel => None,
            TcpCc::Named(n) => Some(n),
        }
    }

    /// As the headers say it: the machine's named, where it is read.
    pub fn text(&self) -> String {
        match self {
            TcpCc::Named(n) => n.clone(),
            TcpCc::Kernel => match std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control") {
                Ok(n) => format!("{} (this machine's)", n.trim()),
                Err(_) => "this machine's".into(),
            },
        }
    }
}

/// `kernel`, or a congestion control's name as the kernel spells them
/// (lower case, digits and `_`, at most 15 characters); whether this kernel
/// offers it is checked where the hosts are made.
pub fn parse_tcp_cc(s: &str) -> Result<TcpCc, String> {
    if s == "kernel" {
        return Ok(TcpCc::Kernel);
    }
    let valid = (1..16).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(TcpCc::Named(s.into()))
    } else {
        Err(format!("{s:?} is not `kernel` or a congestion control's name (e.g. cubic, bbr, reno)"))
    }
}

/// `kernel`, or milliseconds from 1 to 200 (above the kernel's floor a
/// route's is not what users lower it for).
pub fn parse_rto_min(s: &str) -> Result<RtoMin, String> {
    if s == "kernel" {
        return Ok(RtoMin::Kernel);
    }
    let ms = s.strip_suffix("ms").unwrap_or(s);
    match ms.parse::<u32>() {
        Ok(n @ 1..=200) => Ok(RtoMin::Ms(n)),
        _ => Err(format!("{s:?} is not `kernel` or a whole number of ms from 1 to 200")),
    }
}

/// The rps_cpus bitmap of CPUs 0..n: hex, in comma-separated groups of 32
/// CPUs, the highest first (as /sys/class/net/*/queues/rx-*/rps_cpus reads).
pub fn cpu_mask(n: usize) -> String {
    let all: Vec<usize> = (0..n.max(1)).collect();
    cores_mask(&all)
}

/// The rps_cpus bitmap of these CPUs (as [`cpu_mask`] writes it).
pub fn cores_mask(cores: &[usize]) -> String {
    let top = cores.iter().max().map_or(0, |&c| c);
    let words = top / 32 + 1;
    (0..words)
        .rev()
        .map(|w| {
            let v = cores.iter().filter(|&&c| c / 32 == w).fold(0u32, |v, &c| v | 1 << (c % 32));
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
    use super::{cores_mask, cpu_mask, parse_rcvbuf, parse_rto_min, parse_tcp_cc, RcvBuf, Rps, RtoMin, TcpCc};

    #[test]
    fn receive_steering_is_on_the_workers_cores_where_links_lose_packets_unless_asked() {
        assert_eq!(Rps::Auto.resolved(true), Rps::Workers);
        assert_eq!(Rps::Auto.resolved(false), Rps::Off);
        assert_eq!(Rps::Off.resolved(true), Rps::Off);
        assert_eq!(Rps::On.resolved(false), Rps::On);
    }

    #[test]
    fn cpu_masks_are_grouped_by_32() {
        assert_eq!(cpu_mask(2), "3");
        assert_eq!(cpu_mask(16), "ffff");
        assert_eq!(cpu_mask(32), "ffffffff");
        assert_eq!(cpu_mask(33), "1,ffffffff");
        assert_eq!(cpu_mask(64), "ffffffff,ffffffff");
        assert_eq!(cpu_mask(0), "1");
        assert_eq!(cores_mask(&[4, 5, 6, 7]), "f0");
        assert_eq!(cores_mask(&[16, 63]), "80000000,00010000");
    }

    #[test]
    fn rto_floors_are_kernel_or_whole_ms() {
        assert_eq!(parse_rto_min("kernel"), Ok(RtoMin::Kernel));
        assert_eq!(parse_rto_min("5"), Ok(RtoMin::Ms(5)));
        assert_eq!(parse_rto_min("10ms"), Ok(RtoMin::Ms(10)));
        assert!(parse_rto_min("0").is_err() && parse_rto_min("201").is_err() && parse_rto_min("1.5").is_err());
        assert_eq!(RtoMin::Ms(10).route_arg().as_deref(), Some("10ms"));
        assert_eq!(RtoMin::Kernel.route_arg(), None);
    }

    #[test]
    fn receive_buffers_become_tcp_rmem() {
        assert_eq!(parse_rcvbuf("kernel"), Ok(RcvBuf::Kernel));
        assert_eq!(RcvBuf::Kernel.tcp_rmem(), None);
        assert_eq!(parse_rcvbuf("4M").map(RcvBuf::tcp_rmem), Ok(Some("4096 4194304 6291456".into())));
        assert_eq!(parse_rcvbuf("16M").map(RcvBuf::tcp_rmem), Ok(Some("4096 16777216 16777216".into())));
        assert!(parse_rcvbuf("1").is_err() && parse_rcvbuf("lots").is_err() && parse_rcvbuf("2G").is_err());
    }

    #[test]
    fn congestion_controls_are_kernel_or_a_name() {
        assert_eq!(parse_tcp_cc("kernel"), Ok(TcpCc::Kernel));
        assert_eq!(TcpCc::Kernel.name(), None);
        assert_eq!(parse_tcp_cc("bbr").as_ref().map(|c| c.name()), Ok(Some("bbr")));
        assert_eq!(parse_tcp_cc("dctcp").map(|c| c.text()), Ok("dctcp".into()));
        // Not a name: it would reach a shell in the host's namespace.
        for bad in ["", "Cubic", "bbr; reboot", "a_name_too_long_", "cubic\n"] {
            assert!(parse_tcp_cc(bad).is_err(), "{bad:?}");
        }
        assert_eq!(super::ClusterArgs::demo(None).tcp_cc, TcpCc::Named("cubic".into()));
    }
}
