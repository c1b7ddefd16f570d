//! `tally demo`: the main job on an embedded default, in two parts.
//!
//! Part 1, the case tally is for: an emulated cluster of 4 reduction
//! servers and 4 workers, each in its own network namespace behind a link
//! shaped to a rate this machine's cores carry (`cluster`). Link-bound, agg
//! moves each worker's buffer once each way where a ring moves 2(n-1)/n of
//! it, so agg approaches 2(n-1)/n times the ring. It needs root and
//! iproute2; where it cannot run, the demo says why and goes on.
//!
//! Part 2, loopback: one reduction server in this process and 4 ranks as
//! child processes over shm (tcp;ofi_rxm where shm is unavailable), agg and
//! ring from 4 KiB to 64 MiB, then the server's per-lcore counters and the
//! point-to-point baseline measured in the same run.
//!
//! Every element of every result is checked; the demo exits non-zero if any
//! was wrong. Log lines of the servers and ranks go to a log file in the
//! output folder (warnings and errors still reach the terminal), with the
//! plots of both parts; the demo names them at the end.
use crate::bench::allreduce::{launch, plan::AllreduceArgs};
use crate::bench::cluster::args::ClusterArgs;
use crate::bench::cluster::table::{write_plot, ClusterOutcome};
use crate::bench::cluster::{self, netns, shaping};
use crate::bench::p2p::{self, args::P2pArgs};
use crate::bench::plot;
use crate::cli_args::{CoresArg, DtypeArg, HugepagesArg, IprouteArg, JsonArg, LoopArgs, ModeArg, PlotArg, PollArg, ProviderArg, WindowArg};
use crate::logfile;
use clap::Args;
use std::path::PathBuf;
use tally_engine::host::units::format_size;

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Ranks (worker processes) of the loopback part.
    #[arg(long, default_value_t = 4)]
    pub ranks: u32,
    #[command(flatten)]
    pub provider: ProviderArg,
    /// The emulated-cluster part: auto (run it where it can run), on (fail if it cannot), off.
    #[arg(long, default_value = "auto")]
    pub cluster: String,
    /// Link rate of the emulated cluster in Gbit/s (default: what this machine's cores carry).
    #[arg(long)]
    pub rate: Option<f64>,
    #[command(flatten)]
    pub iproute: IprouteArg,
    /// Folder for the log file and the plots.
    #[arg(long, default_value = "/tmp/tally-demo")]
    pub out: PathBuf,
    // The JSON object holds the loopback rows as `bench allreduce --json`, plus "cluster".
    #[command(flatten)]
    pub json: JsonArg,
}

pub fn run(args: &DemoArgs) -> Result<(), String> {
    if !matches!(args.cluster.as_str(), "auto" | "on" | "off") {
        return Err(format!("--cluster: expected auto, on or off, got {:?}", args.cluster));
    }
    // The demo's servers and ranks share a fresh token, as a deployment would
    // (and its servers then print no open-door warning). Before any thread.
    cluster::ensure_job_token();
    std::fs::create_dir_all(&args.out).map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let log_path = args.out.join("demo.log");
    logfile::redirect_to(&log_path)?;
    let mut plots = Vec::new();

    // Part 1: the emulated cluster.
    let skipped = match args.cluster.as_str() {
        "off" => Some("--cluster off".to_string()),
        _ => netns::unavailable(args.iproute.iproute.as_deref()),
    };
    if let (Some(why), "on") = (&skipped, args.cluster.as_str()) {
        return Err(format!("the emulated cluster cannot run here: {why}"));
    }
    let mut cl: Option<ClusterOutcome> = None;
    if skipped.is_none() {
        let mut ca = ClusterArgs::demo(args.rate);
        ca.json = args.json.clone();
        ca.iproute = args.iproute.clone();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let rate = args.rate.unwrap_or_else(|| shaping::default_rate(ca.hosts, cores));
        ca.rates = vec![rate];
        if !args.json.json {
            println!("== Part 1: the case tally is for: {h} reduction servers + {h} workers on {rate} Gbit/s links ==", h = ca.hosts);
            println!("Each host is a network namespace behind a link shaped to {rate} Gbit/s each way. Through the servers every worker");
            println!(
                "sends and receives its buffer once; a ring moves 2(n-1)/n = {:.2} times that over each link. Link-bound, agg",
                2.0 * (ca.hosts as f64 - 1.0) / ca.hosts as f64
            );
            println!("should approach that factor over the ring.\n");
        }
        let out = cluster::launch(&ca)?;
        let svg = args.out.join("cluster.svg");
        write_plot(&out, &svg)?;
        plots.push(svg);
        if !args.json.json {
            if let Some(big) = out.rows.iter().filter(|r| r.row.mode == "agg").max_by_key(|r| r.row.bytes) {
                println!(
                    "\nAt {}: agg reaches {:.2} of its link bound and {:.2}x the ring (ideal {:.2}).",
                    format_size(big.row.bytes as u64),
                    big.fraction,
                    out.agg_over_ring(big).unwrap_or(0.0),
                    2.0 * (ca.hosts as f64 - 1.0) / ca.hosts as f64
                );
            }
            println!();
        }
        cl = Some(out);
    } else if !args.json.json {
        println!("== Part 1 (emulated cluster) skipped: {} ==\n", skipped.as_deref().unwrap_or(""));
    }

    // Part 2: loopback.
    // As `tally bench allreduce` chooses for ranks on this machine.
    let provider = tally_engine::dataplane::fabric::select_provider(args.provider.provider.as_deref(), true);
    let ar = AllreduceArgs {
        mode: ModeArg::default(),
        ranks: args.ranks,
        ranks_per_process: None,
        sleep_ms: None,
        provider: ProviderArg { provider: Some(provider.clone()) },
        sizes: ["4K", "64K", "1M", "16M", "64M"].iter().map(|s| s.to_string()).collect(),
        dtype: DtypeArg::default(),
        op: "sum".into(),
        loops: LoopArgs::default(),
        servers: vec![],
        lcores: "0-1".into(),
        hugepages: HugepagesArg::default(),
        cores: CoresArg::default(),
        rails: None,
        chunk: "1M".into(),
        window: WindowArg::default(),
        // auto, as everywhere: on 2 cores 4 ranks and 2 lcores poll adaptively.
        poll: PollArg::default(),
        send_credits: 0,
        timeout: 60,
        fabric_addr: None,
        json: args.json.clone(),
        sync: false,
        agg_in_flight: 1,
        plot: PlotArg::default(),
        plugin: None,
        plugin_piece: "auto".into(),
        plugin_in_flight: 8,
        plugin_chunk: "auto".into(),
        launched: false,
        rank: None,
        bootstrap: None,
        job_id: 0,
        job_secret: None,
    };
    if !args.json.json {
        println!("== Part 2: loopback: one reduction server (2 lcores) + {} ranks on this machine, provider {provider} ==", args.ranks);
        println!("No link in the way: memory copies and CPU time set the pace. Through a server every byte is copied in, reduced");
        println!("and copied back; a ring's bytes take one copy per hop, and here the server's lcores and the ranks share this");
        println!("machine's cores. So the ring is expected to win on loopback: this part checks results and overheads.\n");
    }
    let out = launch::launch(&ar)?;
    let svg = args.out.join("loopback.svg");
    let title = format!("loopback: {} ranks + 1 server (2 lcores), {}, f32 sum", args.ranks, out.provider);
    plot::busbw_svg(&svg, &title, &plot::series_by_mode(&out.rows, ""), &[])?;
    plots.push(svg);
    let cluster_wrong = cl.as_ref().map_or(0, |c| c.wrong());
    if args.json.json {
        println!(
            "{}",
            serde_json::json!({
                "provider": out.provider, "ranks": args.ranks, "results": out.rows,
                "cluster": cl, "cluster_skipped": skipped,
                "log": log_path, "plots": plots,
            })
        );
    } else {
        println!("\n== agg vs ring ==");
        println!("{:>10} {:>14} {:>14} {:>9}", "size", "agg busbw", "ring busbw", "agg/ring");
        for a in out.rows.iter().filter(|r| r.mode == "agg") {
            if let Some(r) = out.rows.iter().find(|r| r.mode == "ring" && r.bytes == a.bytes) {
                println!(
                    "{:>10} {:>9.3} GB/s {:>9.3} GB/s {:>9.2}",
                    format_size(a.bytes as u64),
                    a.busbw_gbps,
                    r.busbw_gbps,
                    a.busbw_gbps / r.busbw_gbps
                );
            }
        }
        println!("\n== server lcore counters ==");
        println!("{:>6} {:>12} {:>12} {:>14} {:>14} {:>7}", "lcore", "polls", "completions", "bytes in", "bytes out", "errors");
        for (i, s) in out.lcore_stats.iter().enumerate() {
            println!(
                "{:>6} {:>12} {:>12} {:>14} {:>14} {:>7}",
                i,
                s.polls,
                s.completions,
                format_size(s.bytes_in),
                format_size(s.bytes_out),
                s.errors
            );
        }
        println!("\n== point-to-point baseline (same provider, tally's fabric layer) ==");
        let p2p = P2pArgs {
            provider: ProviderArg { provider: Some(provider) },
            sizes: ["8", "4K", "64K", "1M", "16M"].iter().map(|s| s.to_string()).collect(),
            iters: Some(1000),
            warmup: Some(100),
            window: Some(16),
            cores: CoresArg::default(),
            // auto: busy where the two ends get a core each.
            poll: PollArg::default(),
            hugepages: HugepagesArg::default(),
            json: JsonArg::default(),
            hubs: 0,
            leaves: 0,
            chunk: None,
        };
        p2p::run(&p2p)?;
    }
    let wrong: u64 = out.rows.iter().map(|r| r.wrong).sum::<u64>() + cluster_wrong;
    let results = out.rows.len() + cl.as_ref().map_or(0, |c| c.rows.len());
    if !args.json.json {
        println!("\nserver and rank log lines: {}", log_path.display());
        println!("plots: {}", plots.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "));
    }
    if wrong > 0 {
        return Err(format!("{wrong} wrong elements in {results} all-reduce results"));
    }
    if !args.json.json {
        println!("all {results} all-reduce results verified element by element: 0 wrong");
    }
    Ok(())
}
