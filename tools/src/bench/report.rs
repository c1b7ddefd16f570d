//! The all-reduce result row, as every all-reduce benchmark reports it.
//!
//! A rank 0 of `tally bench allreduce` prints each result as one line,
//! `RESULT <Row as JSON>`; its launcher, `tally bench cluster` and `tally
//! demo` read those lines back, print them with [`format_row`] under
//! [`table_header`], plot them ([`crate::bench::plot`]) and pass them on in
//! their own JSON. The row is the contract between those processes, so it
//! lives apart from any one of them.
use serde::{Deserialize, Serialize};
use tally_engine::host::units::format_size;

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Row {
    pub mode: String,
    pub bytes: usize,
    pub count: usize,
    pub dtype: String,
    pub op: String,
    /// Per-operation time: the back-to-back loop's mean, or with `--sync` the median.
    pub time_us: f64,
    /// "back-to-back", "back-to-back, K in flight" (agg, `--agg-in-flight`) or "sync".
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
    /// more than [`GATHER_STAMPS`](crate::bench::allreduce::timing::GATHER_STAMPS) timestamps in all, and `--sync`).
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

/// The column line above [`format_row`]'s rows.
pub fn table_header() -> String {
    format!(
        "{:>10} {:>10} {:>12} {:>6} {:>6} {:>11} {:>9} {:>9} {:>9} {:>11} {:>11} {:>7}",
        "mode", "size", "count", "type", "redop", "time(us)", "p50(us)", "p99(us)", "max(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"
    )
}

/// One row of the table under [`table_header`].
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

/// The method line every table carries (measuring.md).
/// What `--agg-in-flight K` adds to the method line (nothing for 1).
pub fn in_flight_note(k: usize) -> String {
    if k > 1 {
        format!("; agg: {k} all-reduces in flight, each into a result buffer of its own (--agg-in-flight), every buffer checked")
    } else {
        String::new()
    }
}

pub fn method_line(loops: &crate::cli_args::LoopArgs, sync: bool) -> String {
    let warmup = loops.warmup;
    let iters = match loops.min_bytes {
        0 => loops.iters.to_string(),
        m => format!(
            "{} (or as many as move {} per size, at most {}: the rows' iters)",
            loops.iters,
            tally_engine::host::units::format_size(m),
            crate::cli_args::MAX_LOOP_ITERS
        ),
    };
    if sync {
        format!(
            "time: median of {iters} all-reduces after {warmup} warm-up (agg: at least one per stream), each started after a barrier (--sync); \
             algbw = size/time; busbw = algbw x 2(n-1)/n; every element checked"
        )
    } else {
        format!(
            "time: {iters} back-to-back all-reduces after {warmup} warm-up (agg: at least one per stream) and one barrier: time = loop time / iterations, \
             p50/p99/max of per-operation times (an operation ends when the last rank has its result); algbw = size/time; \
             busbw = algbw x 2(n-1)/n; every element checked"
        )
    }
}

/// Set to 1 (`tally bench cluster` does, on worker 0) to have rank 0 print
/// `LOOP <mode> <bytes>` just before each timed loop, so that the caller can
/// sample other processes' CPU time over the same interval.
pub const LOOP_LINES_ENV: &str = "TALLY_BENCH_LOOP_LINES";
