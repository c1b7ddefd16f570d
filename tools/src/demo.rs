//! `tally demo`: the main job on an embedded default.
//!
//! One reduction server in this process and 4 ranks as child processes on
//! this machine, over shm (tcp;ofi_rxm where shm is unavailable), adaptive
//! polling: agg and ring all-reduce at sizes from 4 KiB to 64 MiB, every
//! element verified, then the point-to-point baseline measured in the same
//! run and the server's per-lcore counters. Exits non-zero if any element
//! was wrong.
use crate::bench_allreduce::{self, AllreduceArgs};
use crate::bench_p2p::{self, P2pArgs};
use clap::Args;
use tally_engine::units::format_size;

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Ranks (worker processes).
    #[arg(long, default_value_t = 4)]
    pub ranks: u32,
    /// Provider: shm (default where available) or tcp.
    #[arg(long)]
    pub provider: Option<String>,
    /// Print the all-reduce results as JSON (same form as bench allreduce --json).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &DemoArgs) -> Result<(), String> {
    let provider = match &args.provider {
        Some(p) => p.clone(),
        None if tally_engine::fabric::provider_available("shm") => "shm".into(),
        None => "tcp".into(),
    };
    let ar = AllreduceArgs {
        mode: vec!["agg".into(), "ring".into()],
        ranks: args.ranks,
        provider: Some(provider.clone()),
        sizes: ["4K", "64K", "1M", "16M", "64M"].iter().map(|s| s.to_string()).collect(),
        dtype: "f32".into(),
        op: "sum".into(),
        iters: 20,
        warmup: 3,
        servers: vec![],
        lcores: "0-1".into(),
        hugepages: "prefer".into(),
        rank_cores: None,
        chunk: "1M".into(),
        window: 4,
        poll: "adaptive".into(),
        send_credits: 0,
        timeout: 60,
        fabric_addr: None,
        json: args.json,
        rank: None,
        bootstrap: None,
        job_id: 0,
    };
    if !args.json {
        println!("== tally demo: one reduction server (2 lcores) + {} ranks on this machine, provider {provider} ==\n", args.ranks);
    }
    let out = bench_allreduce::launch(&ar)?;
    if args.json {
        println!("{}", serde_json::json!({"provider": out.provider, "ranks": args.ranks, "results": out.rows}));
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
            provider: Some(provider),
            sizes: ["8", "4K", "64K", "1M", "16M"].iter().map(|s| s.to_string()).collect(),
            iters: 1000,
            warmup: 100,
            window: 16,
            cores: None,
            poll: "busy".into(),
            hugepages: "prefer".into(),
            json: false,
        };
        bench_p2p::run(&p2p)?;
    }
    let wrong: u64 = out.rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        return Err(format!("{wrong} wrong elements"));
    }
    if !args.json {
        println!("\nall {} all-reduce results verified element by element: 0 wrong", out.rows.len());
    }
    Ok(())
}
