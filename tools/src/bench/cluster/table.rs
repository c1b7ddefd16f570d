//! What a cluster run reports: a row per rate, loss level, mode and size with its link
//! bound, the fraction reached, agg/ring and the CPU cost per GB; the table,
//! its header lines, the ranks' CPU lines under it and the plot.
use super::args::{loops_at, ClusterArgs};
use super::host_cpu::{HostLoad, RateLoad};
use super::loop_cpu::{OverLoop, RankCpu};
use super::loss::LossLevel;
use super::placement::worker_rails;
use super::shaping::{auto_chunk, tbf_auto_burst};
use super::tcp_loss::LinkLoss;
use crate::bench::plot;
use crate::bench::report::{method_line, Row};
use serde::Serialize;
use std::path::Path;
use tally_engine::host::units::format_size;

/// One result row with its link rate and bound.
#[derive(Serialize, Debug, Clone)]
pub struct ClusterRow {
    pub link_gbit: f64,
    #[serde(rename = "bound_GBps")]
    pub bound_gbps: f64,
    /// algbw / bound.
    pub fraction: f64,
    /// Worker 0's process CPU seconds (user + system, every thread) over
    /// the timed loop (the row's `cpu_s`, its own getrusage: the loop
    /// alone); None where the worker reported none. Every rank's, read
    /// from /proc: `rank_cpu_s`.
    pub worker_cpu_s: Option<f64>,
    /// Every server's CPU seconds together over the same loop (from its
    /// `LOOP` line to its result, `/proc/<pid>/stat`); None where a server
    /// could not be read (no /proc, or it exited). With busy polling every
    /// lcore's whole time; for the ring, servers idling.
    pub server_cpu_s: Option<f64>,
    /// worker_cpu_s per GB this worker all-reduced (bytes x iters).
    pub worker_cpu_s_per_gb: Option<f64>,
    /// server_cpu_s per GB of input the servers together received
    /// (hosts x bytes x iters); None for the ring, which sends them nothing.
    pub server_cpu_s_per_gb: Option<f64>,
    /// Softirq seconds on the workers' cores over the loop per GB the
    /// workers together all-reduced (hosts x bytes x iters), and on the
    /// servers' cores per GB of their input (None for the ring): the
    /// kernel's network path there and, at a full link, its shaper. Where
    /// the kernel counts time by ticks, what landed while a rank or an
    /// lcore ran is inside its wkr or srv. Absent where the placement
    /// shares cores between them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_cores_softirq_s_per_gb: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cores_softirq_s_per_gb: Option<f64>,
    /// Every rank process's CPU over the loop and between loops (`loop_cpu`).
    #[serde(flatten)]
    pub ranks: RankCpu,
    /// Over the same loop, in every host's namespace: TCP segments
    /// retransmitted and retransmission timeouts (`tcp_loss`); None where
    /// a namespace could not be read.
    pub tcp_retrans: Option<u64>,
    pub tcp_timeouts: Option<u64>,
    /// Over the same loop: TCP's tail loss probes (`tcp_loss`).
    pub tcp_loss_probes: Option<u64>,
    /// Packets the hosts' interfaces dropped over the loop (the switch's
    /// are in the rate's line only), and segments their sockets dropped.
    pub dev_drops: Option<u64>,
    pub sock_drops: Option<u64>,
    /// The machine's CPU over the same loop (`host_cpu`): every emulated
    /// host shares it.
    pub host_cpu: Option<HostLoad>,
    /// The `--loss` level the row ran at: the percent, and `every` link or
    /// the host whose link (`loss`); absent without `--loss`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_pct: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_link: Option<String>,
    #[serde(flatten)]
    pub row: Row,
}

impl ClusterRow {
    /// A worker's row at link `rate` (Gbit/s) among `hosts` workers, with
    /// what its loop cost (`over`).
    pub(super) fn new(rate: f64, hosts: u32, row: Row, over: &OverLoop) -> ClusterRow {
        let link = rate / 8.0;
        let n = hosts as f64;
        let bound_gbps = if row.mode == "ring" { link * n / (2.0 * (n - 1.0)) } else { link };
        // GB this worker all-reduced in the loop; none in rows without iters.
        let gb = row_gb(&row);
        let per_gb = |s: f64, gb: f64| (gb > 0.0).then(|| s / gb);
        let worker_cpu_s = (row.cpu_s > 0.0).then_some(row.cpu_s);
        let served = if row.mode == "ring" { 0.0 } else { n * gb };
        let loss = over.loss;
        ClusterRow {
            link_gbit: rate,
            bound_gbps,
            fraction: row.algbw_gbps / bound_gbps,
            worker_cpu_s,
            server_cpu_s: over.server_cpu_s,
            worker_cpu_s_per_gb: worker_cpu_s.and_then(|s| per_gb(s, gb)),
            server_cpu_s_per_gb: over.server_cpu_s.and_then(|s| per_gb(s, served)),
            worker_cores_softirq_s_per_gb: over.host.and_then(|h| per_gb(h.workers_softirq_s?, n * gb)),
            server_cores_softirq_s_per_gb: over.host.and_then(|h| per_gb(h.servers_softirq_s?, served)),
            ranks: RankCpu::new(over.ranks.as_ref(), over.between.as_ref(), gb),
            tcp_retrans: loss.map(|l| l.retrans),
            tcp_timeouts: loss.map(|l| l.timeouts),
            tcp_loss_probes: loss.map(|l| l.loss_probes),
            dev_drops: loss.map(|l| l.dev_drops),
            sock_drops: loss.map(|l| l.sock_drops),
            host_cpu: over.host,
            loss_pct: None,
            loss_link: None,
            row,
        }
    }

    /// Says the row ran at `level` (None: without `--loss`).
    pub(super) fn set_loss(&mut self, level: Option<&LossLevel>) {
        self.loss_pct = level.map(|l| l.percent);
        self.loss_link = level.map(LossLevel::link);
    }

    /// The loss column: as `--loss` said it (`0.1`, `s1:1`).
    fn loss_label(&self) -> String {
        match (&self.loss_link, self.loss_pct) {
            (Some(l), Some(p)) if l != "every" => format!("{l}:{p}"),
            (_, Some(p)) => p.to_string(),
            _ => "-".into(),
        }
    }
}

/// GB a rank all-reduced in the row's loop (size x iters).
fn row_gb(row: &Row) -> f64 {
    (row.bytes * row.iters) as f64 / 1e9
}

#[derive(Serialize, Debug, Clone)]
pub struct ClusterOutcome {
    pub hosts: u32,
    pub placement: String,
    pub rows: Vec<ClusterRow>,
    /// Per rate (and `--loss` level): what TCP, tbf and the loss rules saw
    /// over its loops (`tcp_loss`).
    pub links: Vec<LinkLoss>,
    /// Per rate: the machine's CPU over all its loops (`host_cpu`).
    pub host_cpu: Vec<RateLoad>,
}

impl ClusterOutcome {
    pub fn wrong(&self) -> u64 {
        self.rows.iter().map(|r| r.row.wrong).sum()
    }

    /// agg algbw / ring algbw at the same rate, loss and size (agg and agg-plugin rows).
    pub fn agg_over_ring(&self, r: &ClusterRow) -> Option<f64> {
        let ring = self.rows.iter().find(|x| {
            x.row.mode == "ring" && x.row.bytes == r.row.bytes && x.link_gbit == r.link_gbit && x.loss_label() == r.loss_label()
        })?;
        r.row.mode.starts_with("agg").then(|| r.row.algbw_gbps / ring.row.algbw_gbps)
    }
}

/// busbw against size for every mode and rate, with each bound in busbw terms.
pub fn write_plot(out: &ClusterOutcome, path: &Path) -> Result<(), String> {
    let n = out.hosts as f64;
    let mut rates: Vec<f64> = out.rows.iter().map(|r| r.link_gbit).collect();
    rates.dedup();
    let mut losses: Vec<String> = out.rows.iter().map(ClusterRow::loss_label).collect();
    losses.dedup();
    let (mut series, mut bounds) = (Vec::new(), Vec::new());
    for &rate in &rates {
        let suffix = if rates.len() > 1 { format!(" {rate} Gbit/s") } else { String::new() };
        for loss in &losses {
            let rows: Vec<Row> =
                out.rows.iter().filter(|r| r.link_gbit == rate && &r.loss_label() == loss).map(|r| r.row.clone()).collect();
            let lossy = if losses.len() > 1 { format!(" loss {loss}%") } else { String::new() };
            series.extend(plot::series_by_mode(&rows, &format!("{suffix}{lossy}")));
        }
        let link = rate / 8.0;
        bounds.push(plot::Bound { label: format!("agg bound{suffix}: R x 2(n-1)/n"), busbw_gbps: link * 2.0 * (n - 1.0) / n });
        bounds.push(plot::Bound { label: format!("ring bound{suffix}: R"), busbw_gbps: link });
    }
    let title =
        format!("emulated cluster: {} servers + {} workers, links {} Gbit/s, tcp;ofi_rxm", out.hosts, out.hosts, rates_text(&rates));
    plot::busbw_svg(path, &title, &series, &bounds)
}

/// What `--provider` means, as the header says it.
pub fn provider_text(provider: &str) -> &'static str {
    match provider {
        "tcp-rdm" => "tcp (its own RDM endpoint, without ofi_rxm)",
        _ => "tcp;ofi_rxm",
    }
}

fn rates_text(rates: &[f64]) -> String {
    rates.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

/// The header lines of a rate's (and loss level's) table; `loss`: the
/// line that says the level, under `--loss`.
pub fn print_header(args: &ClusterArgs, rate: f64, placement: &str, worker_cores: Option<&str>, loss: Option<&str>) {
    let burst = if args.tbf_burst == "auto" { format_size(tbf_auto_burst(rate)) } else { args.tbf_burst.clone() };
    println!(
        "# emulated cluster, links {rate} Gbit/s: {} servers + {} workers (network namespaces, tbf both ends, burst {burst}, MTU {}, TCP autocorking {}, RTO floor {}, receive buffers {}, congestion control {}, RPS {}), {}",
        args.hosts,
        args.hosts,
        args.mtu,
        args.tcp_autocork.text(),
        args.tcp_rto_min.text(),
        args.tcp_rcvbuf.text(),
        args.tcp_cc.text(),
        args.rps.resolved(!args.loss.is_empty() && worker_cores.is_some()).text(),
        provider_text(&args.provider)
    );
    println!("# placement: {placement}");
    if args.mode.mode.iter().any(|m| m == "tcp") {
        println!(
            "# tcp rows: {}, {} connection{} per worker-server pair, the server hosts' ends on {}",
            match args.tcp_peers {
                super::args::TcpPeers::Own => "worker i with server i",
                super::args::TcpPeers::All => "every worker with every server",
            },
            args.tcp_streams,
            if args.tcp_streams == 1 { "" } else { "s" },
            if args.tcp_server_ends == super::args::TcpEnds::Servers { "each server's own cores" } else { "the workers' cores" }
        );
    }
    if let Some(l) = loss {
        println!("{l}");
    }
    println!(
        "# chunk {}, window {}, send credits {}, rails per worker {}; {}{}",
        if args.chunk == "auto" { format!("{} (auto)", format_size(auto_chunk(rate))) } else { args.chunk.clone() },
        args.window.text(if args.chunk == "auto" {
            auto_chunk(rate)
        } else {
            tally_engine::host::units::parse_size(&args.chunk).unwrap_or(0)
        } as usize),
        args.send_credits
            .map_or_else(|| format!("{} (the library's; agg-plugin: the plugin's)", args.agg_send_credits()), |c| c.to_string()),
        {
            let r = worker_rails(args.hosts, worker_cores, rate, args.busy_polling());
            if r.agg == r.plugin {
                format!("{} ({})", r.agg, r.why)
            } else {
                format!("{} for agg, {} for agg-plugin ({}: the links' rate, TALLY_LINK_GBITS)", r.agg, r.plugin, r.why)
            }
        },
        method_line(&loops_at(args, rate), false),
        crate::bench::report::in_flight_note(args.agg_in_flight)
    );
    println!(
        "# bounds: agg <= R (servers together have the workers' bandwidth), ring <= R x n/(2(n-1)); ideal agg/ring = 2(n-1)/n = {:.2}",
        2.0 * (args.hosts as f64 - 1.0) / args.hosts as f64
    );
}

/// The table's column names; `loss`: with the loss column (`--loss`).
pub fn format_cluster_header(loss: bool) -> String {
    let head = format!(
        "{:>7} {:>10} {:>9} {:>10} {:>11} {:>11} {:>11} {:>9} {:>9} {:>12} {:>12} {:>11} {:>7}",
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
        "host busy,wt",
        "#wrong"
    );
    with_loss_column(loss.then_some("loss%"), head)
}

/// `line` with the loss column before it, where there is one.
fn with_loss_column(loss: Option<&str>, line: String) -> String {
    match loss {
        Some(l) => format!("{l:>6} {line}"),
        None => line,
    }
}

pub fn format_cluster_row(out: &ClusterOutcome, r: &ClusterRow) -> String {
    let ratio = out.agg_over_ring(r).map(|x| format!("{x:.2}")).unwrap_or_default();
    let cpu = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
    let host = r.host_cpu.map_or_else(
        || "-".to_string(),
        |h| format!("{:.1},{}", h.busy_cores, h.cpu_wait.map_or_else(|| "-".into(), |w| format!("{:.0}%", w * 100.0))),
    );
    let line = format!(
        "{:>7} {:>10} {:>9} {:>10.1} {:>11.4} {:>11.4} {:>11.4} {:>9.2} {:>9} {:>12} {:>12} {:>12} {:>7}",
        r.link_gbit,
        r.row.mode,
        format_size(r.row.bytes as u64),
        r.row.time_us / 1e3,
        r.row.algbw_gbps,
        r.row.busbw_gbps,
        r.bound_gbps,
        r.fraction,
        ratio,
        cpu(r.ranks.rank_cpu_s_per_gb_median),
        cpu(r.server_cpu_s_per_gb),
        host,
        r.row.wrong
    );
    with_loss_column(r.loss_pct.is_some().then(|| r.loss_label()).as_deref(), line)
}

/// The lines under the table that say what the CPU columns are.
pub fn cpu_note() -> &'static str {
    "# wkr/srv cpu s/GB: CPU seconds (user + system, every thread, /proc/<pid>/stat) over the timed loop per GB all-reduced:\n\
     #   wkr = the median over the rank processes, each per GB of its buffer (size x iters; each rank's below); srv = every\n\
     #   server together, per GB of input they received (hosts x size x iters; \"-\" for ring, which does not use them).\n\
     #   tcp rows: plain TCP streams, worker i <-> server i (--tcp-peers all: every pair, the bytes split), each end sending\n\
     #   and receiving the buffer's bytes per iteration (the bytes agg moves per link): wkr and srv are the stream\n\
     #   processes', receive plus send, the kernel's own cost.\n\
     #   Cores per 100 Gbit/s = cpu s/GB x 12.5. With busy polling (placement line) srv is every lcore's whole time, as a\n\
     #   busy poller spins; --poll adaptive gives the work itself. At a full link wkr and srv can also hold the shaper's\n\
     #   work: tbf runs its queue again from softirqs on the sending cores, which a kernel that counts time by ticks charges\n\
     #   to the thread they interrupt (the host line's softirq, and each side's below where they have cores apart;\n\
     #   docs/profiling.md).\n\
     #   host busy,wt: the machine's cores busy over the loop, and the share of its time some task waited for a CPU\n\
     #   (/proc/pressure/cpu): every emulated host shares this machine."
}

/// The lines under a rate's table giving every rank's CPU, a row each:
/// min/median/max over ranks, over the loop and over the gap before it.
pub fn rank_cpu_lines(rows: &[ClusterRow]) -> Vec<String> {
    let mut lines = vec![
        "# each rank process's CPU, min/median/max over ranks: over the loop (% of a core, s/GB); between loops, from the".to_string(),
        "#   previous loop's result to this loop's start (the check, set-up, warm-up and barriers: not idle time), % of a core:"
            .to_string(),
    ];
    lines.extend(rows.iter().map(|r| format!("#   {} {}: {}", r.row.mode, format_size(r.row.bytes as u64), r.ranks.text(row_gb(&r.row)))));
    lines.extend(softirq_lines(rows));
    lines
}

/// Where the workers and the servers have cores apart: the softirq time on
/// each set per GB, a row each; nothing where no row has it.
fn softirq_lines(rows: &[ClusterRow]) -> Vec<String> {
    if rows.iter().all(|r| r.worker_cores_softirq_s_per_gb.is_none()) {
        return Vec::new();
    }
    let fig = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.3}"));
    let mut lines = vec![
        "# softirqs on the workers' cores and on the servers' over the loop, s/GB as wkr and srv count GB (the kernel's network"
            .to_string(),
        "#   path and, at a full link, the shaper's queue; mostly inside wkr and srv where the kernel counts time by ticks):".to_string(),
    ];
    lines.extend(rows.iter().map(|r| {
        format!(
            "#   {} {}: workers' cores {}, servers' {}",
            r.row.mode,
            format_size(r.row.bytes as u64),
            fig(r.worker_cores_softirq_s_per_gb),
            fig(r.server_cores_softirq_s_per_gb)
        )
    }));
    lines
}

#[cfg(test)]
mod tests {
    use super::super::loop_cpu::Stretch;
    use super::super::tcp_loss::NetLoss;
    use super::*;

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
        let loss = NetLoss { retrans: 3, timeouts: 1, dev_drops: 2, sock_drops: 4, loss_probes: 5, ..NetLoss::default() };
        let ranks = Stretch { wall_s: 1.0, cpu_s: vec![0.64, 0.32, 0.96, 0.64] };
        let over = OverLoop { server_cpu_s: Some(1.28), ranks: Some(ranks), loss: Some(loss), ..OverLoop::default() };
        let r = ClusterRow::new(1.0, 4, row("agg", 0.64), &over);
        assert_eq!((r.tcp_retrans, r.tcp_timeouts, r.dev_drops, r.sock_drops), (Some(3), Some(1), Some(2), Some(4)));
        assert_eq!(r.tcp_loss_probes, Some(5));
        assert!((r.worker_cpu_s_per_gb.unwrap() - 2.0).abs() < 1e-9, "{r:?}");
        assert!((r.server_cpu_s_per_gb.unwrap() - 1.0).abs() < 1e-9, "{r:?}");
        assert!((r.ranks.rank_cpu_s_per_gb_median.unwrap() - 2.0).abs() < 1e-9, "{r:?}");
        assert!((r.ranks.rank_cpu_s_per_gb_max.unwrap() - 3.0).abs() < 1e-9, "{r:?}");
        let over = OverLoop { server_cpu_s: Some(0.0), ..OverLoop::default() };
        let r = ClusterRow::new(1.0, 4, row("ring", 0.32), &over);
        assert!((r.worker_cpu_s_per_gb.unwrap() - 1.0).abs() < 1e-9 && r.server_cpu_s_per_gb.is_none(), "{r:?}");
        let r = ClusterRow::new(1.0, 4, row("agg", 0.0), &OverLoop::default());
        assert!(
            r.tcp_timeouts.is_none() && r.worker_cpu_s.is_none() && r.worker_cpu_s_per_gb.is_none() && r.server_cpu_s_per_gb.is_none(),
            "{r:?}"
        );
        assert!(r.ranks.rank_cpu_s.is_none(), "{r:?}");
        // The kernel baseline's streams use the servers' hosts: per GB of their input, as agg.
        let over = OverLoop { server_cpu_s: Some(0.64), ..OverLoop::default() };
        let r = ClusterRow::new(1.0, 4, row("tcp", 0.16), &over);
        assert!((r.server_cpu_s_per_gb.unwrap() - 0.5).abs() < 1e-9, "{r:?}");
        // agg/ring for agg rows only.
        let out = ClusterOutcome {
            hosts: 4,
            placement: String::new(),
            rows: vec![ClusterRow::new(1.0, 4, row("ring", 0.1), &over), r.clone()],
            links: Vec::new(),
            host_cpu: Vec::new(),
        };
        assert_eq!(out.agg_over_ring(&r), None);
        assert_eq!(out.agg_over_ring(&ClusterRow::new(1.0, 4, row("agg", 0.1), &over)), Some(1.0));
    }

    #[test]
    fn softirq_on_each_side_is_per_gb_as_wkr_and_srv_and_said_only_where_read() {
        let mut row: Row = serde_json::from_str(
            r#"{"mode":"agg","bytes":16000000,"count":4000000,"dtype":"f32","op":"sum","time_us":1.0,"algbw_GBps":1.0,"busbw_GBps":1.5,"wrong":0}"#,
        )
        .expect("a row");
        row.iters = 20;
        // 0.32 GB per worker, 4 hosts: 1.28 GB all-reduced and 1.28 GB into the servers.
        let host = HostLoad {
            busy_cores: 8.0,
            softirq_cores: 2.0,
            cores: 16,
            cpu_wait: None,
            workers_softirq_s: Some(0.32),
            servers_softirq_s: Some(0.128),
        };
        let over = OverLoop { host: Some(host), ..OverLoop::default() };
        let r = ClusterRow::new(16.0, 4, row.clone(), &over);
        let near = |x: Option<f64>, want: f64| x.is_some_and(|x| (x - want).abs() < 1e-9);
        assert!(near(r.worker_cores_softirq_s_per_gb, 0.25) && near(r.server_cores_softirq_s_per_gb, 0.1), "{r:?}");
        assert_eq!(softirq_lines(std::slice::from_ref(&r))[2], "#   agg 15.26 MiB: workers' cores 0.250, servers' 0.100");
        let json = serde_json::to_value(&r).expect("json");
        assert!(json["worker_cores_softirq_s_per_gb"].is_number() && json["host_cpu"]["workers_softirq_s"].is_number(), "{json}");
        // The ring uses no servers; a shared placement reads no sets.
        row.mode = "ring".into();
        let ring = ClusterRow::new(16.0, 4, row.clone(), &over);
        assert!(near(ring.worker_cores_softirq_s_per_gb, 0.25) && ring.server_cores_softirq_s_per_gb.is_none(), "{ring:?}");
        let shared = HostLoad { workers_softirq_s: None, servers_softirq_s: None, ..host };
        let r = ClusterRow::new(16.0, 4, row, &OverLoop { host: Some(shared), ..OverLoop::default() });
        assert!(r.worker_cores_softirq_s_per_gb.is_none() && softirq_lines(std::slice::from_ref(&r)).is_empty(), "{r:?}");
        let json = serde_json::to_value(&r).expect("json");
        assert!(json.get("worker_cores_softirq_s_per_gb").is_none() && json["host_cpu"].get("workers_softirq_s").is_none(), "{json}");
    }
}
