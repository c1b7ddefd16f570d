//! `tally bench allreduce`: agg (reduction servers) against ring, as
//! nccl-tests measures them.
//!
//! The launcher (what a user runs) hosts a reduction server in-process when
//! none is given, and runs every rank as a child process of itself (`--rank
//! i`): separate processes, as real workers are (shm endpoints of one process
//! must not talk to each other's closing regions). Above [`PROCESS_RANKS`](plan::PROCESS_RANKS)
//! ranks (or with `--ranks-per-process K`), ranks run as threads instead, K
//! per child process (`--rank i --ranks-per-process K`: ranks i..i+K), each
//! thread with its own `Client` and so its own fabric endpoint, as a rank of
//! its own: up to [`wire::MAX_RANKS`](tally_engine::wire::MAX_RANKS) ranks on one machine. Only agg runs
//! that way (ring ranks talk to each other, and the plugin is one per
//! process). Ranks meet through a TCP bootstrap (one connection per rank to
//! rank 0). For each mode and size, after `warmup` all-reduces and one
//! barrier, every rank runs `iters` all-reduces back to back, as nccl-tests
//! and users time them; every rank timestamps each completion, and rank 0 reports the
//! loop's mean (wall time / iterations: the `time_us` of nccl-tests) and the
//! p50, p99 and max of the per-operation times, an operation ending when the
//! last rank has its result (every rank's timestamps are gathered: one host,
//! one clock; rank 0's own intervals above [`GATHER_STAMPS`](timing::GATHER_STAMPS) of them). `--sync` instead starts every
//! all-reduce after a barrier and reports the median (it adds the barrier's
//! release skew to small sizes). Every rank then checks every element of its last result against the
//! reference it computes itself (inputs are small integers, so every
//! partial sum is exact in every type and the check is exact whatever the
//! association order), and the wrong counts are summed over ranks.
//! Rank 0 also reports its process's CPU time over the timed loop (`cpu_s`),
//! and with `TALLY_BENCH_LOOP_LINES=1` announces each loop on stdout
//! (`LOOP <mode> <bytes>`), so that `tally bench cluster` can sample the
//! servers' CPU time over the same interval.
//!
//! [`plan`]: the flags and what they resolve to; [`launch`]: the launcher;
//! [`rank`]: a rank process; [`launched`]: a rank another launcher (srun,
//! torchrun) started (`--launched`); [`overlap`]: agg with several all-reduces in
//! flight (`--agg-in-flight`); [`timing`] and [`verify`]: what a rank
//! measures and checks.
pub mod launch;
pub mod launched;
pub mod overlap;
pub mod pinning;
pub mod plan;
pub mod rank;
pub mod rank_watch;
pub mod timing;
pub mod verify;

use crate::bench::plot;
use crate::bench::report::Row;
use plan::AllreduceArgs;
use serde::Serialize;

#[derive(Serialize)]
struct Report<'a> {
    provider: &'a str,
    ranks: u32,
    results: &'a [Row],
}

/// `tally bench allreduce`: a rank process with `--rank`, else the
/// launcher, then its plot and JSON.
pub fn run(args: &AllreduceArgs) -> Result<(), String> {
    if args.launched {
        return rank::run_rank(&launched::resolve(args)?);
    }
    if args.rank.is_some() {
        return rank::run_rank(args);
    }
    let out = launch::launch(args)?;
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
