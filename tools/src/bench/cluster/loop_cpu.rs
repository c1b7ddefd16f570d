//! What each timed loop cost, read by this process at its start (worker
//! 0's `LOOP` line) and its end (the `RESULT` row): the servers' and every
//! rank process's CPU (`proc_cpu`), the hosts' TCP counters (`tcp_loss`)
//! and the machine's CPU (`host_cpu`); and what each rank cost between
//! loops, from one loop's result to the next loop's start.
//!
//! Why every rank and not worker 0 alone: ranks wait for each other, and
//! one that spins while it waits (busy polling, a rail that never sleeps)
//! costs its whole time; worker 0's figure says nothing of the others.
//! Why between loops: a rank that is not all-reducing should cost next to
//! nothing (issue 54). The gap is not idle time, though: it holds the
//! result's check, the next mode's set-up (joining, the ring's
//! connections), its warm-up all-reduces and two barriers. It bounds a
//! rank's idle cost from above; `tests/suites/idle.rs` measures the idle
//! cost itself.
//!
//! The readings are taken when this process reads worker 0's lines, a
//! pipe and a thread later: on a loaded machine a scheduler slice late. So
//! a row's `loop_wall_s` holds the result's check and that lag, and the
//! ranks' CPU over it may differ from worker 0's own `cpu_s` (its
//! getrusage over the loop alone) by the check and a clock tick or two.
//! Worker 0 waits after each `RESULT` row until this process has read the
//! loop's end and says so on its standard input (`workers::run_rate`), and
//! the other ranks wait for worker 0 in the barrier that follows: so no rank
//! exits after a rate's last loop before its CPU over it was read.
use super::host_cpu::{CoreSets, HostCpu, HostLoad};
use super::proc_cpu::CpuMark;
use super::tcp_loss::NetLoss;
use serde::Serialize;

/// Reads the servers and the ranks (one process per worker host, in rank
/// order) at each loop's start and end.
pub(super) struct LoopTracker {
    server_pids: Vec<u32>,
    rank_pids: Vec<u32>,
    /// The workers' and the servers' cores, where they are apart: their
    /// softirq time over each loop.
    sets: Option<CoreSets>,
    started: Option<Started>,
    /// The ranks at the last result, where the next gap begins.
    last_result: Option<CpuMark>,
}

/// What was read when a loop started.
struct Started {
    step: String,
    servers: CpuMark,
    ranks: CpuMark,
    loss: Option<NetLoss>,
    host: Option<HostCpu>,
    between: Option<Stretch>,
}

/// Each rank process's CPU seconds over one stretch of wall time.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Stretch {
    pub(super) wall_s: f64,
    pub(super) cpu_s: Vec<f64>,
}

impl Stretch {
    /// From `then` to `now`; None where a rank could not be read.
    fn of(now: &CpuMark, then: &CpuMark) -> Option<Stretch> {
        Some(Stretch { wall_s: now.wall_since(then), cpu_s: now.each_since(then)? })
    }

    /// Each rank's share of one core over the stretch.
    fn core_shares(&self) -> Vec<f64> {
        self.cpu_s.iter().map(|s| if self.wall_s > 0.0 { s / self.wall_s } else { 0.0 }).collect()
    }
}

/// What one timed loop cost, besides its row.
#[derive(Debug, Default)]
pub(super) struct OverLoop {
    /// Every server together; None where one could not be read.
    pub(super) server_cpu_s: Option<f64>,
    pub(super) ranks: Option<Stretch>,
    /// The ranks from the previous loop's result to this loop's start.
    pub(super) between: Option<Stretch>,
    pub(super) loss: Option<NetLoss>,
    pub(super) host: Option<HostLoad>,
}

/// `mode bytes`: how a `LOOP` line names the loop whose row follows.
pub(super) fn step_name(mode: &str, bytes: usize) -> String {
    format!("{mode} {bytes}")
}

impl LoopTracker {
    pub(super) fn new(server_pids: Vec<u32>, rank_pids: Vec<u32>, sets: Option<CoreSets>) -> LoopTracker {
        LoopTracker { server_pids, rank_pids, sets, started: None, last_result: None }
    }

    /// One process in each host's namespace, for its TCP counters.
    fn host_pids(&self) -> Vec<u32> {
        self.server_pids.iter().chain(&self.rank_pids).copied().collect()
    }

    /// The loop `step` starts now.
    pub(super) fn start(&mut self, step: &str) {
        let ranks = CpuMark::now(&self.rank_pids);
        let between = self.last_result.take().and_then(|then| Stretch::of(&ranks, &then));
        self.started = Some(Started {
            step: step.to_string(),
            servers: CpuMark::now(&self.server_pids),
            ranks,
            loss: NetLoss::of(&self.host_pids()),
            host: HostCpu::now_on(self.sets.as_ref()),
            between,
        });
    }

    /// The loop `step` ended now: what it cost. Without a start, nothing;
    /// where the start named another loop, its counters and the machine's
    /// CPU but no process's CPU.
    pub(super) fn finish(&mut self, step: &str) -> OverLoop {
        let ranks = CpuMark::now(&self.rank_pids);
        let servers = CpuMark::now(&self.server_pids);
        self.last_result = Some(ranks.clone());
        let Some(s) = self.started.take() else { return OverLoop::default() };
        let loss = s.loss.and_then(|then| Some(NetLoss::of(&self.host_pids())?.since(then)));
        let host = HostLoad::over(s.host, self.sets.as_ref());
        if s.step != step {
            return OverLoop { loss, host, ..OverLoop::default() };
        }
        OverLoop { server_cpu_s: servers.sum_since(&s.servers), ranks: Stretch::of(&ranks, &s.ranks), between: s.between, loss, host }
    }
}

/// Every rank process's CPU, as a row reports it (flattened into it).
#[derive(Serialize, Debug, Clone, Default, PartialEq)]
pub struct RankCpu {
    /// The loop's wall seconds as `tally bench cluster` saw it (worker 0's
    /// `LOOP` line to its `RESULT` row: the result's check is in it).
    pub loop_wall_s: Option<f64>,
    /// Each rank process's CPU seconds over that interval (user + system,
    /// every thread, /proc/<pid>/stat), in rank order; None where one
    /// could not be read.
    pub rank_cpu_s: Option<Vec<f64>>,
    /// Over ranks: the median and the largest of rank_cpu_s per GB of the
    /// rank's buffer all-reduced (size x iters).
    pub rank_cpu_s_per_gb_median: Option<f64>,
    pub rank_cpu_s_per_gb_max: Option<f64>,
    /// The gap before this loop, from the previous loop's result (None for
    /// a rate's first loop and for tcp rows, whose stream processes are
    /// new): its wall seconds and each rank's share of a core over it, and
    /// their mean. Not idle time: the check, the next mode's set-up,
    /// warm-up and barriers are in it.
    pub between_loops_s: Option<f64>,
    pub between_loops_core_share: Option<Vec<f64>>,
    pub between_loops_core_share_mean: Option<f64>,
}

impl RankCpu {
    /// The ranks over a loop in which each all-reduced `gb` GB, and the gap before it.
    pub(super) fn new(ranks: Option<&Stretch>, between: Option<&Stretch>, gb: f64) -> RankCpu {
        let per_gb: Option<Vec<f64>> = ranks.filter(|_| gb > 0.0).map(|r| r.cpu_s.iter().map(|s| s / gb).collect());
        let spread = per_gb.as_deref().and_then(spread);
        let shares = between.map(Stretch::core_shares);
        RankCpu {
            loop_wall_s: ranks.map(|r| r.wall_s),
            rank_cpu_s: ranks.map(|r| r.cpu_s.clone()),
            rank_cpu_s_per_gb_median: spread.map(|s| s.median),
            rank_cpu_s_per_gb_max: spread.map(|s| s.max),
            between_loops_s: between.map(|b| b.wall_s),
            between_loops_core_share_mean: shares.as_ref().filter(|s| !s.is_empty()).map(|s| s.iter().sum::<f64>() / s.len() as f64),
            between_loops_core_share: shares,
        }
    }

    /// `loop 31/33/35%, 0.61/0.65/0.70 s/GB; between loops (1.2 s) 12/14/15%`:
    /// min/median/max over ranks, of a core and per GB (`gb`: what each
    /// rank all-reduced in the loop); "-" where unread.
    pub fn text(&self, gb: f64) -> String {
        let pct = |s: Spread| format!("{:.0}/{:.0}/{:.0}%", s.min * 100.0, s.median * 100.0, s.max * 100.0);
        let scaled = |v: &[f64], by: f64| spread(&v.iter().map(|x| x / by).collect::<Vec<_>>());
        let (over, per_gb) = match (&self.rank_cpu_s, self.loop_wall_s) {
            (Some(cpu), Some(wall)) if wall > 0.0 => (
                scaled(cpu, wall).map_or_else(|| "-".into(), pct),
                scaled(cpu, gb)
                    .filter(|_| gb > 0.0)
                    .map_or_else(String::new, |s| format!(", {:.3}/{:.3}/{:.3} s/GB", s.min, s.median, s.max)),
            ),
            _ => ("-".into(), String::new()),
        };
        let between = match (&self.between_loops_core_share, self.between_loops_s) {
            (Some(shares), Some(wall)) => spread(shares).map_or_else(|| "-".into(), |s| format!("({wall:.1} s) {}", pct(s))),
            _ => "- (no loop before it in these processes, or unread)".into(),
        };
        format!("loop {over}{per_gb}; between loops {between}")
    }
}

/// The least, median and largest of some values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

/// None for no values.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = match n {
        0 => return None,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    };
    Some(Spread { min: v[0], median, max: v[n - 1] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_take_the_middle_of_an_even_count() {
        assert_eq!(spread(&[]), None);
        assert_eq!(spread(&[3.0, 1.0, 2.0]), Some(Spread { min: 1.0, median: 2.0, max: 3.0 }));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]), Some(Spread { min: 1.0, median: 2.5, max: 4.0 }));
    }

    #[test]
    fn rank_cpu_is_per_gb_over_the_loop_and_a_share_of_a_core_between() {
        let ranks = Stretch { wall_s: 2.0, cpu_s: vec![0.5, 1.0, 0.25, 0.75] };
        let between = Stretch { wall_s: 0.5, cpu_s: vec![0.05, 0.1, 0.0, 0.05] };
        let r = RankCpu::new(Some(&ranks), Some(&between), 0.5);
        assert_eq!(r.rank_cpu_s.as_deref(), Some(&[0.5, 1.0, 0.25, 0.75][..]));
        assert_eq!((r.rank_cpu_s_per_gb_median, r.rank_cpu_s_per_gb_max), (Some(1.25), Some(2.0)));
        assert_eq!(r.between_loops_core_share.as_deref(), Some(&[0.1, 0.2, 0.0, 0.1][..]));
        assert!((r.between_loops_core_share_mean.unwrap() - 0.1).abs() < 1e-12, "{r:?}");
        assert_eq!(r.text(0.5), "loop 12/31/50%, 0.500/1.250/2.000 s/GB; between loops (0.5 s) 0/10/20%");
        // A rate's first loop has no gap before it; an unread loop no figures.
        let first = RankCpu::new(Some(&ranks), None, 0.5);
        assert!(first.between_loops_s.is_none() && first.between_loops_core_share_mean.is_none());
        assert!(first.text(0.5).ends_with("between loops - (no loop before it in these processes, or unread)"), "{}", first.text(0.5));
        let unread = RankCpu::new(None, None, 0.5);
        assert_eq!(unread, RankCpu::default());
        assert!(unread.text(0.5).starts_with("loop -; "), "{}", unread.text(0.5));
        // No GB moved (a row without iters): CPU seconds, no s/GB.
        let none = RankCpu::new(Some(&ranks), None, 0.0);
        assert!(none.rank_cpu_s.is_some() && none.rank_cpu_s_per_gb_median.is_none());
    }

    #[test]
    fn a_tracker_reads_ranks_over_loops_and_between_them() {
        let me = std::process::id();
        let mut t = LoopTracker::new(vec![me], vec![me, me], None);
        // A result with no loop announced: no figures, but the gap starts.
        let o = t.finish(&step_name("agg", 4096));
        assert!(o.ranks.is_none() && o.server_cpu_s.is_none() && o.between.is_none());
        t.start(&step_name("agg", 4096));
        let o = t.finish(&step_name("agg", 4096));
        assert_eq!(o.ranks.as_ref().map(|r| r.cpu_s.len()), Some(2), "{o:?}");
        assert!(o.server_cpu_s.is_some_and(|s| s >= 0.0), "{o:?}");
        assert!(o.between.as_ref().is_some_and(|b| b.cpu_s.len() == 2 && b.wall_s >= 0.0), "{o:?}");
        assert!(o.host.is_some_and(|h| h.workers_softirq_s.is_none()), "no sets, no softirq per side: {o:?}");
        // A result that is not the loop announced: no process's CPU.
        t.start(&step_name("ring", 4096));
        let o = t.finish(&step_name("agg", 4096));
        assert!(o.ranks.is_none() && o.server_cpu_s.is_none() && o.between.is_none(), "{o:?}");
    }

    #[test]
    fn a_tracker_with_core_sets_reads_each_sides_softirqs_over_the_loop() {
        let me = std::process::id();
        let sets = CoreSets { workers: vec![0], servers: vec![1] };
        let mut t = LoopTracker::new(vec![me], vec![me], Some(sets));
        t.start(&step_name("agg", 4096));
        std::thread::sleep(std::time::Duration::from_millis(30));
        let host = t.finish(&step_name("agg", 4096)).host.expect("/proc/stat");
        let (w, s) = (host.workers_softirq_s, host.servers_softirq_s);
        assert!(w.is_some_and(|w| w >= 0.0), "{host:?}");
        // CPU 1 is read where the machine has it (this one has 2 cores or more).
        let two = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
        assert!(!two || s.is_some_and(|s| s >= 0.0), "{host:?}");
    }
}
