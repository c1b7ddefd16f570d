//! Server metrics: per-(lcore, job) counter blocks, round-latency
//! histograms, and their rendering in the Prometheus text format; served,
//! with the server's liveness and readiness ([`health`]), by the metrics
//! port's HTTP endpoint ([`http`]).
//!
//! The rule is the one of [`crate::dataplane::lcore::Counters`]: every counter has
//! exactly one writer (its lcore), which updates it with a plain
//! load + store ([`bump`]); any other thread may read it at any time and
//! sees a value at most one update old. Nothing on the data path allocates
//! or locks: the whole table is allocated once at server start, one
//! cache-padded [`JobCounters`] block per (lcore, job index), so an lcore
//! finds its job's block by indexing and two lcores never write the same
//! cache line.
//!
//! A block belongs to whichever job last occupied its index: the lcore
//! resets it and stamps the job id in when it processes the job's AddJob
//! (first thing, before anything there can fail, so that a job that fails
//! to start never shows or logs its predecessor's counters). The block
//! keeps its values after the job ended until the index is reused (the
//! job-end line's `RoundSummary` reads them then), but [`render`] writes
//! only the blocks of jobs the control plane still publishes: an ended
//! job's series leave `/metrics` with it, and the per-lcore totals keep
//! what it moved.
//!
//! The latency histogram has fixed log2 buckets (1 us, 2 us, 4 us, ... up to
//! about 8.4 s, then +Inf): recording is a leading-zeros count and one
//! store, and the rendering makes the buckets cumulative as Prometheus
//! requires.
//!
//! The exposition is written here by hand, a `writeln!` per sample: the
//! text format is a few stable lines, the counters live in this module's
//! own single-writer layout (which a metrics crate's registry would have to
//! copy into its own types on every scrape), and the tests below and
//! `tools/tests/metrics.rs` parse what it writes.
pub mod health;
pub mod http;

pub use health::{ServerHealth, ServerPhase};
pub use http::MetricsServer;

use crate::dataplane::lcore::{bump, Snapshot};
use crate::host::wall_clock::TimeOfDay;
use crate::wire::RejectCode;
use crossbeam_utils::CachePadded;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Finite histogram buckets: upper bounds 1 us x 2^i, i in 0..BUCKETS.
pub const BUCKETS: usize = 24;

/// What one lcore counts for one job.
#[derive(Default)]
pub struct JobCounters {
    /// 1 while a job has used this block since server start.
    pub in_use: AtomicU64,
    pub job_id: AtomicU64,
    /// Slot rounds reduced (every rank's piece in, result sent back).
    pub rounds: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Nanoseconds spent in the reduction kernel.
    pub reduce_ns: AtomicU64,
    /// Round latency (first piece in to results posted): per-bucket counts,
    /// not cumulative; the last one is the overflow (+Inf only).
    pub latency_buckets: [AtomicU64; BUCKETS + 1],
    pub latency_sum_ns: AtomicU64,
    /// How long rounds (past each slot's first, which waits for the ranks
    /// to start) waited for their last piece after the one before it,
    /// summed by that last piece's rank (ranks from `LATE_RANKS - 1`
    /// up share the last entry): a rank that is late again and again
    /// stands out from a network's random tail.
    pub last_wait_ns: [AtomicU64; LATE_RANKS],
    /// The longest such wait, the rank it waited for, and when it ended
    /// (`wall_clock::now_us`, to match it with the ranks' own lines).
    pub last_wait_max_ns: AtomicU64,
    pub last_wait_max_rank: AtomicU64,
    pub last_wait_max_at_us: AtomicU64,
}

/// Ranks that `JobCounters::last_wait_ns` tells apart.
pub const LATE_RANKS: usize = 8;

impl JobCounters {
    /// Zeroes the block for a new occupant. Only the owning lcore calls it.
    pub fn reset(&self, job_id: u64) {
        let z = |c: &AtomicU64| c.store(0, Ordering::Relaxed);
        z(&self.rounds);
        z(&self.bytes_in);
        z(&self.bytes_out);
        z(&self.reduce_ns);
        z(&self.latency_sum_ns);
        self.latency_buckets.iter().for_each(z);
        self.last_wait_ns.iter().for_each(z);
        z(&self.last_wait_max_ns);
        z(&self.last_wait_max_rank);
        z(&self.last_wait_max_at_us);
        self.job_id.store(job_id, Ordering::Relaxed);
        self.in_use.store(1, Ordering::Relaxed);
    }

    /// Counts one finished round that took `ns` nanoseconds.
    #[inline]
    pub fn record_round(&self, ns: u64) {
        bump(&self.rounds, 1);
        bump(&self.latency_sum_ns, ns);
        bump(&self.latency_buckets[bucket(ns)], 1);
    }

    /// A round's last piece, from `rank`, came `ns` after the one before it.
    #[inline]
    pub fn record_last_wait(&self, rank: usize, ns: u64) {
        bump(&self.last_wait_ns[rank.min(LATE_RANKS - 1)], ns);
        // Only the owning lcore writes the block, so load-then-store is exact.
        if ns > self.last_wait_max_ns.load(Ordering::Relaxed) {
            self.last_wait_max_ns.store(ns, Ordering::Relaxed);
            self.last_wait_max_rank.store(rank as u64, Ordering::Relaxed);
            self.last_wait_max_at_us.store(crate::host::wall_clock::now_us(), Ordering::Relaxed);
        }
    }
}

/// The bucket of a latency: the smallest i with ns <= 1000 x 2^i, or
/// BUCKETS (overflow).
#[inline]
pub fn bucket(ns: u64) -> usize {
    let us = ns.div_ceil(1000);
    if us <= 1 {
        return 0;
    }
    ((64 - (us - 1).leading_zeros()) as usize).min(BUCKETS)
}

/// Upper bound of finite bucket `i`, in seconds.
pub fn bucket_le_seconds(i: usize) -> f64 {
    1e-6 * (1u64 << i) as f64
}

/// A job's rounds over all its lcores, as its end is logged: how many, their
/// mean, and the upper bounds of the buckets that hold the median, the 99th
/// percentile and the slowest round. A round is timed from its first
/// piece's arrival to its results' posting, so a slow one is a rank whose
/// piece came late (or an lcore that was late to the slot).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundSummary {
    pub rounds: u64,
    pub mean_s: f64,
    pub p50_le_s: f64,
    pub p99_le_s: f64,
    pub max_le_s: f64,
    /// Waits for each round's last piece, summed by its rank (as
    /// `JobCounters::last_wait_ns`), in seconds.
    pub last_wait_s: [f64; LATE_RANKS],
    /// The longest wait for a last piece (seconds), its rank, and when it
    /// ended (Unix µs).
    pub last_wait_max: (f64, u64, u64),
}

impl RoundSummary {
    /// Sums the blocks' histograms; None where no round finished.
    pub fn of<'a>(blocks: impl Iterator<Item = &'a JobCounters>) -> Option<RoundSummary> {
        let mut counts = [0u64; BUCKETS + 1];
        let mut sum_ns = 0u64;
        let mut last_wait_ns = [0u64; LATE_RANKS];
        let mut last_wait_max = (0u64, 0u64, 0u64);
        for b in blocks {
            for (c, a) in counts.iter_mut().zip(&b.latency_buckets) {
                *c += a.load(Ordering::Relaxed);
            }
            sum_ns = sum_ns.saturating_add(b.latency_sum_ns.load(Ordering::Relaxed));
            for (w, a) in last_wait_ns.iter_mut().zip(&b.last_wait_ns) {
                *w = w.saturating_add(a.load(Ordering::Relaxed));
            }
            let max = b.last_wait_max_ns.load(Ordering::Relaxed);
            if max > last_wait_max.0 {
                last_wait_max = (max, b.last_wait_max_rank.load(Ordering::Relaxed), b.last_wait_max_at_us.load(Ordering::Relaxed));
            }
        }
        let rounds: u64 = counts.iter().sum();
        if rounds == 0 {
            return None;
        }
        // The overflow bucket has no upper bound: it reads as +Inf.
        let le = |i: usize| if i < BUCKETS { bucket_le_seconds(i) } else { f64::INFINITY };
        let at = |share: f64| {
            let want = ((rounds as f64 * share).ceil() as u64).max(1);
            let mut seen = 0;
            counts.iter().position(|&c| {
                seen += c;
                seen >= want
            })
        };
        let last = counts.iter().rposition(|&c| c > 0).unwrap_or(0);
        Some(RoundSummary {
            rounds,
            mean_s: sum_ns as f64 / rounds as f64 / 1e9,
            p50_le_s: le(at(0.5).unwrap_or(last)),
            p99_le_s: le(at(0.99).unwrap_or(last)),
            max_le_s: le(last),
            last_wait_s: last_wait_ns.map(|ns| ns as f64 / 1e9),
            last_wait_max: (last_wait_max.0 as f64 / 1e9, last_wait_max.1, last_wait_max.2),
        })
    }
}

impl core::fmt::Display for RoundSummary {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let ms = |s: f64| s * 1e3;
        write!(
            f,
            "{} rounds, first piece in to results posted: mean {:.2} ms, p50 <= {:.3} ms, p99 <= {:.3} ms, slowest <= {:.3} ms",
            self.rounds,
            ms(self.mean_s),
            ms(self.p50_le_s),
            ms(self.p99_le_s),
            ms(self.max_le_s)
        )?;
        let total: f64 = self.last_wait_s.iter().sum();
        if total > 0.0 {
            write!(f, "; waiting for each round's last piece after the one before it: {:.1} ms in all (by that piece's rank:", ms(total))?;
            let used = self.last_wait_s.iter().rposition(|&w| w > 0.0).unwrap_or(0);
            for (r, w) in self.last_wait_s.iter().enumerate().take(used + 1) {
                let sep = if r == 0 { " " } else { ", " };
                let more = if r == LATE_RANKS - 1 { "+" } else { "" };
                write!(f, "{sep}{r}{more}: {:.1}", ms(*w))?;
            }
            let (longest, rank, at) = self.last_wait_max;
            write!(f, "), longest {:.2} ms (rank {rank}, ended {})", ms(longest), TimeOfDay(at))?;
        }
        Ok(())
    }
}

/// Per-lcore gauges that `lcore::Counters` does not carry.
#[derive(Default)]
pub struct LcoreGauges {
    /// Operations in flight on the lcore's endpoint (its queue depth).
    pub in_flight: AtomicU64,
    /// Bytes of the lcore's slab held by job regions, and its size (written
    /// by the control plane, which carves the slabs).
    pub slab_used: AtomicU64,
    pub slab_bytes: AtomicU64,
}

/// Every counter block of a server, shared by the lcores (writers) and the
/// metrics thread (reader).
#[derive(Clone)]
pub struct MetricsTable {
    pub max_jobs: usize,
    pub lcores: usize,
    jobs: Arc<[CachePadded<JobCounters>]>,
    gauges: Arc<[CachePadded<LcoreGauges>]>,
}

impl MetricsTable {
    /// Allocates every block up front: lcores x max_jobs job blocks.
    pub fn new(lcores: usize, max_jobs: usize) -> MetricsTable {
        MetricsTable {
            max_jobs,
            lcores,
            jobs: (0..lcores * max_jobs).map(|_| CachePadded::new(JobCounters::default())).collect(),
            gauges: (0..lcores).map(|_| CachePadded::new(LcoreGauges::default())).collect(),
        }
    }

    /// Lcore `lcore`'s block for job index `index`.
    #[inline]
    pub fn job(&self, lcore: usize, index: usize) -> &JobCounters {
        &self.jobs[lcore * self.max_jobs + index]
    }

    #[inline]
    pub fn gauges(&self, lcore: usize) -> &LcoreGauges {
        &self.gauges[lcore]
    }
}

/// A job as the control plane publishes it (`Server::jobs`, `tally_jobs`):
/// plain data, so that nothing here depends on the control plane's types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    pub job_id: u64,
    pub tag: Option<u16>,
    /// Its slot in every lcore's job table (and metrics table), once admitted.
    pub index: Option<u16>,
    pub nranks: u32,
    pub joined: u32,
    pub dtype: &'static str,
    pub op: &'static str,
    pub state: &'static str,
}

/// Reject codes are small numbers (`wire::RejectCode`); one counter each.
const REASONS: usize = 16;

/// The control plane's counters: one writer (the control thread), any reader.
#[derive(Default)]
pub struct ControlCounters {
    /// Connections in their handshake now.
    pub handshakes: AtomicU64,
    /// Connections past their handshake (ranks of jobs joining or running) now.
    pub joined: AtomicU64,
    /// Connections accepted since start.
    pub accepted: AtomicU64,
    /// Handshakes closed at their deadline since start.
    pub handshake_timeouts: AtomicU64,
    /// Heartbeat rounds in which a job's heartbeats were withheld because
    /// one of its lcores had stopped polling.
    pub heartbeats_withheld: AtomicU64,
    /// Jobs ended here because their ranks had declared this server lost
    /// (a Hello flagged REJOIN for a job still running here).
    pub jobs_fenced: AtomicU64,
    /// Joins failed because a rank's connection closed before every rank was in.
    pub joins_failed: AtomicU64,
    /// Looks at this server's own TCP connections for a rejoin's backoff
    /// check, and the addresses they looked for (`control::backoff_gate`).
    pub backoff_looks: AtomicU64,
    pub backoff_look_addresses: AtomicU64,
    /// Connections whose BBR those looks started afresh (`host::tcp_renew`).
    pub cc_renewals: AtomicU64,
    /// Connections or joins refused, by reject code.
    refusals: [AtomicU64; REASONS],
    /// A job's first join to its running (every lcore ready, Accepts sent).
    pub join_to_running_buckets: [AtomicU64; BUCKETS + 1],
    pub join_to_running_sum_ns: AtomicU64,
}

impl ControlCounters {
    pub fn refused(&self, code: RejectCode) {
        if let Some(c) = self.refusals.get(code as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn refusals(&self, code: RejectCode) -> u64 {
        self.refusals.get(code as usize).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub fn record_join_to_running(&self, ns: u64) {
        self.join_to_running_buckets[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.join_to_running_sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// An lcore series: name, type, help, and how to read it from a snapshot.
type LcoreMetric = (&'static str, &'static str, &'static str, fn(&Snapshot) -> u64);
/// An lcore gauge series: name, help, and which gauge of the block.
type GaugeMetric = (&'static str, &'static str, fn(&LcoreGauges) -> &AtomicU64);
/// A per-job counter series: name, help, and its value from a block.
type JobMetric = (&'static str, &'static str, fn(&JobCounters) -> f64);

/// The target this binary was built for, as `arch-os-env`
/// (`x86_64-linux-gnu`, `aarch64-linux-musl`): from the compiler's
/// constants, so no build script has to pass it in.
pub fn build_target() -> String {
    let env = if cfg!(target_env = "gnu") {
        "gnu"
    } else if cfg!(target_env = "musl") {
        "musl"
    } else {
        "unknown"
    };
    format!("{}-{}-{env}", std::env::consts::ARCH, std::env::consts::OS)
}

/// Renders everything in the Prometheus text exposition format (0.0.4).
/// `lcores` are the lcores' counter snapshots in lcore order; `jobs` what
/// the control plane publishes; `health` the server's phase.
pub fn render(lcores: &[Snapshot], table: &MetricsTable, jobs: &[JobInfo], control: &ControlCounters, health: &ServerHealth) -> String {
    let mut o = String::with_capacity(4096);
    let _ = writeln!(
        o,
        "# HELP tally_build_info The running build (always 1).\n# TYPE tally_build_info gauge\ntally_build_info{{version=\"{}\",target=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        build_target()
    );
    let _ = writeln!(
        o,
        "# HELP tally_server_draining 1 once the server drains or stops (it admits no new jobs), else 0.\n# TYPE tally_server_draining gauge\ntally_server_draining {}",
        u8::from(health.draining())
    );
    let lcore_metrics: [LcoreMetric; 9] = [
        ("tally_lcore_polls_total", "counter", "Completion-queue polls.", |s| s.polls),
        ("tally_lcore_empty_polls_total", "counter", "Polls that found no completion.", |s| s.empty_polls),
        ("tally_lcore_completions_total", "counter", "Completions handled.", |s| s.completions),
        ("tally_lcore_bytes_in_total", "counter", "Bytes received from ranks.", |s| s.bytes_in),
        ("tally_lcore_bytes_out_total", "counter", "Bytes of results sent to ranks (counted on send completion).", |s| s.bytes_out),
        ("tally_lcore_cq_errors_total", "counter", "Completion-queue errors (cancellations excluded).", |s| s.errors),
        ("tally_lcore_sleeps_total", "counter", "Adaptive-mode sleeps after the spin budget ran out.", |s| s.sleeps),
        (
            "tally_lcore_foreign_pieces_total",
            "counter",
            "Pieces dropped because their sequence did not carry their job's key: sent by a third party on the fabric, not a rank.",
            |s| s.foreign,
        ),
        (
            "tally_lcore_unexpected_discarded_total",
            "counter",
            "Messages that reached the lcore for no receive of its (another job's tag, a slot or sequence no rank of its jobs sends) and were discarded.",
            |s| s.discarded,
        ),
    ];
    for (name, kind, help, get) in lcore_metrics {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (i, s) in lcores.iter().enumerate() {
            let _ = writeln!(o, "{name}{{lcore=\"{i}\"}} {}", get(s));
        }
    }
    let gauges: [GaugeMetric; 3] = [
        ("tally_lcore_in_flight", "Operations in flight on the lcore's endpoint.", |g| &g.in_flight),
        ("tally_lcore_slab_used_bytes", "Bytes of the lcore's slab held by job regions.", |g| &g.slab_used),
        ("tally_lcore_slab_bytes", "Size of the lcore's slab (regions are carved from it).", |g| &g.slab_bytes),
    ];
    for (name, help, get) in gauges {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge");
        for i in 0..table.lcores {
            let _ = writeln!(o, "{name}{{lcore=\"{i}\"}} {}", get(table.gauges(i)).load(Ordering::Relaxed));
        }
    }

    let _ = writeln!(o, "# HELP tally_jobs Jobs the control plane knows, by state.\n# TYPE tally_jobs gauge");
    for state in ["joining", "starting", "running", "draining", "ending"] {
        let _ = writeln!(o, "tally_jobs{{state=\"{state}\"}} {}", jobs.iter().filter(|j| j.state == state).count());
    }

    let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let control_gauges: [(&str, &str, &str, u64); 10] = [
        ("tally_control_handshakes", "gauge", "Control connections in their handshake.", r(&control.handshakes)),
        ("tally_control_joined", "gauge", "Control connections past their handshake (ranks joining or running).", r(&control.joined)),
        ("tally_control_accepted_total", "counter", "Control connections accepted.", r(&control.accepted)),
        ("tally_control_handshake_timeouts_total", "counter", "Handshakes closed at their deadline.", r(&control.handshake_timeouts)),
        (
            "tally_control_heartbeats_withheld_total",
            "counter",
            "Heartbeat rounds in which a job's heartbeats were withheld: one of its lcores had stopped polling.",
            r(&control.heartbeats_withheld),
        ),
        (
            "tally_control_jobs_fenced_total",
            "counter",
            "Jobs ended because their ranks had declared this server lost and rejoined it.",
            r(&control.jobs_fenced),
        ),
        (
            "tally_control_joins_failed_total",
            "counter",
            "Joins failed because a rank's connection closed before every rank was in.",
            r(&control.joins_failed),
        ),
        (
            "tally_control_backoff_looks_total",
            "counter",
            "Looks at this server's own TCP connections for a rejoin's backoff check.",
            r(&control.backoff_looks),
        ),
        (
            "tally_control_backoff_look_addresses_total",
            "counter",
            "Addresses those looks looked for: the rejoining rank's connection's, and its endpoints' once it proved to be the job's.",
            r(&control.backoff_look_addresses),
        ),
        (
            "tally_control_cc_renewals_total",
            "counter",
            "Connections to a rejoining rank whose BBR those looks started afresh (its model under 10 Mbit/s: a cut read as a policer).",
            r(&control.cc_renewals),
        ),
    ];
    for (name, kind, help, v) in control_gauges {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    }
    let name = "tally_control_refusals_total";
    let _ = writeln!(o, "# HELP {name} Connections and joins refused, by reason.\n# TYPE {name} counter");
    for code in (0..REASONS as u16).filter_map(RejectCode::from_u16) {
        let _ = writeln!(o, "{name}{{reason=\"{}\"}} {}", code.name().replace(' ', "_"), control.refusals(code));
    }
    let h = "tally_control_join_to_running_seconds";
    let _ = writeln!(o, "# HELP {h} From a job's first join to its running.\n# TYPE {h} histogram");
    let mut cum = 0u64;
    for i in 0..BUCKETS {
        cum += r(&control.join_to_running_buckets[i]);
        let _ = writeln!(o, "{h}_bucket{{le=\"{}\"}} {cum}", bucket_le_seconds(i));
    }
    cum += r(&control.join_to_running_buckets[BUCKETS]);
    let _ = writeln!(o, "{h}_bucket{{le=\"+Inf\"}} {cum}\n{h}_sum {}\n{h}_count {cum}", r(&control.join_to_running_sum_ns) as f64 * 1e-9);

    // The blocks of the jobs the server has now, with their labels: a
    // block whose job ended (no longer published), or that still holds the
    // previous occupant of its index (the new job's AddJob not yet
    // processed by that lcore), is left out, so an ended job's series
    // disappear with it.
    let live = |j: usize, b: &JobCounters| jobs.iter().any(|ji| ji.index == Some(j as u16) && ji.job_id == r(&b.job_id));
    let blocks: Vec<(String, &JobCounters)> = (0..table.lcores)
        .flat_map(|l| (0..table.max_jobs).map(move |j| (l, j)))
        .map(|(l, j)| (l, j, table.job(l, j)))
        .filter(|(_, j, b)| r(&b.in_use) == 1 && live(*j, b))
        .map(|(l, j, b)| (format!("job=\"{:#x}\",index=\"{j}\",lcore=\"{l}\"", r(&b.job_id)), b))
        .collect();
    let job_metrics: [JobMetric; 4] = [
        ("tally_job_rounds_total", "Slot rounds reduced and sent back.", |b| b.rounds.load(Ordering::Relaxed) as f64),
        ("tally_job_bytes_in_total", "Bytes received for the job.", |b| b.bytes_in.load(Ordering::Relaxed) as f64),
        ("tally_job_bytes_out_total", "Bytes of results sent for the job.", |b| b.bytes_out.load(Ordering::Relaxed) as f64),
        ("tally_job_reduce_seconds_total", "Time spent in the reduction kernel.", |b| b.reduce_ns.load(Ordering::Relaxed) as f64 * 1e-9),
    ];
    for (name, help, get) in job_metrics {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
        for (labels, b) in &blocks {
            let _ = writeln!(o, "{name}{{{labels}}} {}", get(b));
        }
    }
    let h = "tally_job_round_latency_seconds";
    let _ = writeln!(o, "# HELP {h} Per-slot round latency: first piece in to results posted.\n# TYPE {h} histogram");
    for (labels, b) in &blocks {
        let mut cum = 0u64;
        for i in 0..BUCKETS {
            cum += r(&b.latency_buckets[i]);
            let _ = writeln!(o, "{h}_bucket{{{labels},le=\"{}\"}} {cum}", bucket_le_seconds(i));
        }
        cum += r(&b.latency_buckets[BUCKETS]);
        let _ = writeln!(o, "{h}_bucket{{{labels},le=\"+Inf\"}} {cum}");
        let _ = writeln!(o, "{h}_sum{{{labels}}} {}", r(&b.latency_sum_ns) as f64 * 1e-9);
        // The count is the +Inf bucket, as Prometheus requires (the rounds
        // counter is written separately and may be one update apart).
        let _ = writeln!(o, "{h}_count{{{labels}}} {cum}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_microseconds() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1000), 0);
        assert_eq!(bucket(1001), 1);
        assert_eq!(bucket(2000), 1);
        assert_eq!(bucket(2001), 2);
        assert_eq!(bucket(4000), 2);
        assert_eq!(bucket(1_000_000), 10); // 1 ms <= 1.024 ms
        assert_eq!(bucket(u64::MAX), BUCKETS);
    }

    #[test]
    fn round_summary_finds_the_buckets_of_the_shares() {
        let t = MetricsTable::new(2, 1);
        t.job(0, 0).reset(1);
        t.job(1, 0).reset(1);
        assert_eq!(RoundSummary::of([t.job(0, 0), t.job(1, 0)].into_iter()), None);
        // 98 fast rounds on lcore 0, two slow ones on lcore 1.
        for _ in 0..98 {
            t.job(0, 0).record_round(1_500); // bucket 1: <= 2 us
        }
        t.job(1, 0).record_round(3_000_000); // bucket 12: <= 4.096 ms
        t.job(1, 0).record_round(200_000_000); // bucket 18: <= 262.144 ms
        let s = RoundSummary::of([t.job(0, 0), t.job(1, 0)].into_iter()).unwrap();
        assert_eq!(s.rounds, 100);
        assert_eq!(s.p50_le_s, 2e-6);
        assert_eq!(s.p99_le_s, bucket_le_seconds(12));
        assert_eq!(s.max_le_s, bucket_le_seconds(18));
        assert!((s.mean_s - (98.0 * 1.5e-6 + 3e-3 + 0.2) / 100.0).abs() < 1e-9, "{s:?}");
        let line = s.to_string();
        assert!(line.starts_with("100 rounds, first piece in to results posted: mean 2.03 ms, p50 <= 0.002 ms, p99 <= 4.096 ms"), "{line}");
        // A round past the last finite bucket reads as +Inf.
        t.job(1, 0).record_round(u64::MAX);
        assert!(RoundSummary::of([t.job(0, 0), t.job(1, 0)].into_iter()).unwrap().max_le_s.is_infinite());
    }

    #[test]
    fn round_summary_sums_the_last_pieces_waits_by_rank() {
        let t = MetricsTable::new(2, 1);
        t.job(0, 0).reset(1);
        t.job(1, 0).reset(1);
        t.job(0, 0).record_round(1_000_000);
        let quiet = RoundSummary::of([t.job(0, 0), t.job(1, 0)].into_iter()).unwrap().to_string();
        assert!(!quiet.contains("last piece"), "{quiet}");
        t.job(0, 0).record_last_wait(1, 2_000_000);
        t.job(1, 0).record_last_wait(1, 40_000_000);
        t.job(1, 0).record_last_wait(3, 500_000);
        t.job(0, 0).record_last_wait(9, 100_000); // folded into the last entry
        let s = RoundSummary::of([t.job(0, 0), t.job(1, 0)].into_iter()).unwrap();
        assert_eq!((s.last_wait_max.0, s.last_wait_max.1), (0.04, 1));
        assert!(s.last_wait_max.2 > 1_700_000_000_000_000, "the wall-clock time it ended: {s:?}");
        assert!((s.last_wait_s[1] - 0.042).abs() < 1e-12 && s.last_wait_s[LATE_RANKS - 1] == 1e-4, "{s:?}");
        let line = s.to_string();
        assert!(
            line.contains("; waiting for each round's last piece after the one before it: 42.6 ms in all (by that piece's rank: 0: 0.0, 1: 42.0, 2: 0.0, 3: 0.5, 4: 0.0, 5: 0.0, 6: 0.0, 7+: 0.1), longest 40.00 ms (rank 1, ended "),
            "{line}"
        );
        assert!(line.ends_with(" UTC)"), "{line}");
        t.job(0, 0).reset(2);
        assert_eq!(RoundSummary::of([t.job(0, 0)].into_iter()), None);
    }

    #[test]
    fn histogram_renders_cumulative_buckets() {
        let t = MetricsTable::new(2, 3);
        t.job(1, 2).reset(0xab);
        for ns in [500, 1500, 3000, 3000, 100_000_000_000] {
            t.job(1, 2).record_round(ns);
        }
        let jobs = [published(0xab, 2)];
        let text = render(&[Snapshot::default(), Snapshot::default()], &t, &jobs, &ControlCounters::default(), &ServerHealth::new());
        let l = "job=\"0xab\",index=\"2\",lcore=\"1\"";
        assert!(text.contains(&format!("tally_job_round_latency_seconds_bucket{{{l},le=\"0.000001\"}} 1\n")), "{text}");
        assert!(text.contains(&format!("tally_job_round_latency_seconds_bucket{{{l},le=\"0.000004\"}} 4\n")), "{text}");
        assert!(text.contains(&format!("tally_job_round_latency_seconds_bucket{{{l},le=\"+Inf\"}} 5\n")), "{text}");
        assert!(text.contains(&format!("tally_job_round_latency_seconds_count{{{l}}} 5\n")), "{text}");
        assert!(text.contains(&format!("tally_job_rounds_total{{{l}}} 5\n")), "{text}");
        assert!(text.contains("tally_lcore_polls_total{lcore=\"1\"} 0\n"));
        // Blocks never used are not rendered.
        assert!(!text.contains("lcore=\"0\",index"));
        assert!(!text.contains("index=\"0\""));
    }

    fn published(job_id: u64, index: u16) -> JobInfo {
        JobInfo { job_id, tag: Some(1), index: Some(index), nranks: 2, joined: 2, dtype: "f32", op: "sum", state: "running" }
    }

    #[test]
    fn only_the_published_jobs_blocks_are_rendered() {
        let t = MetricsTable::new(2, 2);
        t.job(0, 0).reset(0xa);
        t.job(1, 0).reset(0xa);
        t.job(0, 1).reset(0xb);
        t.job(0, 0).record_round(1000);
        let render_with = |jobs: &[JobInfo]| render(&[Snapshot::default(); 2], &t, jobs, &ControlCounters::default(), &ServerHealth::new());
        let text = render_with(&[published(0xa, 0), published(0xb, 1)]);
        assert!(text.contains("tally_job_rounds_total{job=\"0xa\",index=\"0\",lcore=\"0\"} 1\n"), "{text}");
        assert!(text.contains("tally_job_rounds_total{job=\"0xb\",index=\"1\",lcore=\"0\"} 0\n"), "{text}");
        // Job 0xa ended (no longer published): its series go, 0xb's stay.
        let text = render_with(&[published(0xb, 1)]);
        assert!(!text.contains("job=\"0xa\""), "{text}");
        assert!(text.contains("job=\"0xb\",index=\"1\""), "{text}");
        // Job 0xc took index 0 and lcore 1 has not reset its block yet: the
        // block still holding 0xa is not shown under either id.
        t.job(0, 0).reset(0xc);
        let text = render_with(&[published(0xc, 0)]);
        assert!(text.contains("tally_job_rounds_total{job=\"0xc\",index=\"0\",lcore=\"0\"} 0\n"), "{text}");
        assert!(
            !text.contains("job=\"0xa\"") && !text.contains("lcore=\"1\",index") && !text.contains("index=\"0\",lcore=\"1\""),
            "{text}"
        );
        // Nothing published: no job series at all; the lcore totals stay.
        let text = render_with(&[]);
        assert!(!text.contains("tally_job_rounds_total{"), "{text}");
        assert!(text.contains("tally_lcore_bytes_in_total{lcore=\"0\"} 0\n"), "{text}");
    }

    #[test]
    fn build_info_and_draining_are_rendered() {
        let t = MetricsTable::new(1, 1);
        let h = ServerHealth::new();
        let text = render(&[Snapshot::default()], &t, &[], &ControlCounters::default(), &h);
        let info = format!("tally_build_info{{version=\"{}\",target=\"{}\"}} 1\n", env!("CARGO_PKG_VERSION"), build_target());
        assert!(text.contains(&info), "{text}");
        assert!(text.contains("# TYPE tally_server_draining gauge\ntally_server_draining 0\n"), "{text}");
        h.advance(ServerPhase::Draining);
        let text = render(&[Snapshot::default()], &t, &[], &ControlCounters::default(), &h);
        assert!(text.contains("tally_server_draining 1\n"), "{text}");
        assert!(build_target().contains("-linux-"), "{}", build_target());
    }
}
