//! The host's CPU over each timed loop: how many cores were busy, and the
//! share of the time some task waited for a CPU.
//!
//! The emulated cluster runs every host's processes, and every host's
//! kernel network path, on one machine. Where more threads want to run
//! than there are cores (busy pollers, rail threads, NCCL's proxies, the
//! kernel's softirqs for every link), a figure is held by the machine and
//! not by what it measures; the rows say so instead of leaving it to be
//! guessed. Busy cores come from `/proc/stat` (the machine's, whatever
//! namespace reads it); the wait from the kernel's pressure figures
//! (`/proc/pressure/cpu`, "some": the time at least one runnable task had
//! no CPU), absent where the kernel has no PSI. The softirq share is apart:
//! the kernel's network path for every link, and, where a link is full,
//! its shaper (tbf runs its queue again from softirqs on the sending cores;
//! where the kernel counts time by ticks those land in whatever process they
//! interrupt, so they are part of the rows' wkr and srv too). Where the
//! placement keeps the workers and the servers on cores apart
//! ([`CoreSets`]), the softirq time on each set is read too, so that a row
//! can say how much of its wkr and srv the kernel's softirqs may hold.
use serde::Serialize;
use std::time::Instant;

/// One reading of the machine's CPU counters.
#[derive(Debug, Clone, Copy)]
pub struct HostCpu {
    at: Instant,
    /// Clock ticks every CPU spent busy (user, nice, system, irq, softirq, steal).
    busy_ticks: u64,
    /// Of them, in softirqs.
    softirq_ticks: u64,
    /// Clock ticks every CPU spent in all (busy, idle, iowait).
    all_ticks: u64,
    /// Microseconds some task waited for a CPU, since boot.
    some_wait_us: Option<u64>,
    /// The workers' and the servers' cores ([`CoreSets`]), where asked for.
    sets: Option<[SetTicks; 2]>,
}

/// The workers' and the servers' cores, where the placement keeps them
/// apart (servers on cores of their own, workers pinned to the rest).
#[derive(Debug, Clone, PartialEq)]
pub struct CoreSets {
    pub workers: Vec<usize>,
    pub servers: Vec<usize>,
}

/// Clock ticks of a set of CPUs: in softirqs, and in all; and how many of
/// its CPUs /proc/stat lists.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct SetTicks {
    softirq: u64,
    all: u64,
    cpus: usize,
}

/// What the machine's CPUs did between two readings.
#[derive(Serialize, Debug, Clone, Copy, PartialEq)]
pub struct HostLoad {
    /// Cores busy on average (of `cores`).
    pub busy_cores: f64,
    /// Of them, in softirqs (every host's network path, shapers included).
    pub softirq_cores: f64,
    pub cores: usize,
    /// Share of the wall time at least one runnable task had no CPU; None
    /// without /proc/pressure.
    pub cpu_wait: Option<f64>,
    /// CPU seconds in softirqs on the workers' cores and on the servers'
    /// ([`CoreSets`]); absent where the placement shares cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers_softirq_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub servers_softirq_s: Option<f64>,
}

/// A rate's [`HostLoad`], over all its loops (`ClusterOutcome::host_cpu`).
#[derive(Serialize, Debug, Clone, Copy)]
pub struct RateLoad {
    pub link_gbit: f64,
    #[serde(flatten)]
    pub load: HostLoad,
}

impl HostCpu {
    /// Now; None where /proc/stat cannot be read.
    pub fn now() -> Option<HostCpu> {
        HostCpu::now_on(None)
    }

    /// Now, and the softirq ticks of `sets` where given.
    pub fn now_on(sets: Option<&CoreSets>) -> Option<HostCpu> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let Ticks { busy: busy_ticks, softirq: softirq_ticks, all: all_ticks } = cpu_ticks(&stat)?;
        let some_wait_us = std::fs::read_to_string("/proc/pressure/cpu").ok().and_then(|p| some_total_us(&p));
        let sets = sets.map(|c| [set_ticks(&stat, &c.workers), set_ticks(&stat, &c.servers)]);
        Some(HostCpu { at: Instant::now(), busy_ticks, softirq_ticks, all_ticks, some_wait_us, sets })
    }

    /// What happened between `before` and `self`, on a machine of `cores`.
    pub fn since(&self, before: &HostCpu, cores: usize) -> HostLoad {
        let all = self.all_ticks.saturating_sub(before.all_ticks);
        let busy = self.busy_ticks.saturating_sub(before.busy_ticks);
        let share = |ticks: u64| if all == 0 { 0.0 } else { ticks as f64 / all as f64 * cores as f64 };
        let busy_cores = share(busy);
        let softirq_cores = share(self.softirq_ticks.saturating_sub(before.softirq_ticks));
        let wall_us = self.at.saturating_duration_since(before.at).as_micros() as f64;
        let cpu_wait = self
            .some_wait_us
            .zip(before.some_wait_us)
            .filter(|_| wall_us > 0.0)
            .map(|(now, then)| now.saturating_sub(then) as f64 / wall_us);
        // A set's softirq share of its own ticks, times its CPUs and the
        // wall time: seconds, without the kernel's tick rate.
        let secs = |i: usize| {
            let (now, then) = (self.sets?[i], before.sets?[i]);
            let all = now.all.saturating_sub(then.all);
            (all > 0).then(|| now.softirq.saturating_sub(then.softirq) as f64 / all as f64 * now.cpus as f64 * wall_us / 1e6)
        };
        let (workers_softirq_s, servers_softirq_s) = (secs(0), secs(1));
        HostLoad { busy_cores, softirq_cores, cores, cpu_wait: cpu_wait.map(|w| w.min(1.0)), workers_softirq_s, servers_softirq_s }
    }
}

impl HostLoad {
    /// The machine's load since `before`, and that of `sets` where `before`
    /// read them too; None where either reading failed.
    pub fn over(before: Option<HostCpu>, sets: Option<&CoreSets>) -> Option<HostLoad> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Some(HostCpu::now_on(sets)?.since(&before?, cores))
    }

    /// `busy 61.2/64 (softirq 9.5), waited 37%`: what a rate's line says.
    pub fn text(&self) -> String {
        let wait = self.cpu_wait.map_or_else(|| "wait unknown (no /proc/pressure)".into(), |w| format!("waited {:.0}%", w * 100.0));
        format!("busy {:.1}/{} (softirq {:.1}), {wait}", self.busy_cores, self.cores, self.softirq_cores)
    }

    /// The line a rate's table ends with.
    pub fn note(&self, rate: f64, what: &str) -> String {
        format!(
            "# host CPU at {rate} Gbit/s, {what}: {} (cores busy of all, of them in softirqs; share of the time some task waited for a CPU, /proc/pressure/cpu)",
            self.text()
        )
    }
}

/// Clock ticks of every CPU, from /proc/stat's `cpu` line.
#[derive(Debug, PartialEq)]
struct Ticks {
    busy: u64,
    softirq: u64,
    all: u64,
}

/// The `cpu` line's ticks: every CPU's.
fn cpu_ticks(stat: &str) -> Option<Ticks> {
    line_ticks(stat.lines().find_map(|l| l.strip_prefix("cpu "))?)
}

/// The ticks of one /proc/stat CPU line, its name taken off.
fn line_ticks(fields: &str) -> Option<Ticks> {
    let v: Vec<u64> = fields.split_whitespace().map(|x| x.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice: in user already]
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some(Ticks { busy, softirq: at(6), all: busy + at(3) + at(4) })
}

/// The ticks of the CPUs in `set`, from /proc/stat's `cpuN` lines (a CPU
/// not listed, offline, adds nothing).
fn set_ticks(stat: &str, set: &[usize]) -> SetTicks {
    let mut t = SetTicks::default();
    for line in stat.lines() {
        let Some((name, rest)) = line.split_once(' ') else { continue };
        let Some(n) = name.strip_prefix("cpu").and_then(|n| n.parse::<usize>().ok()) else { continue };
        if !set.contains(&n) {
            continue;
        }
        let Some(Ticks { softirq, all, .. }) = line_ticks(rest) else { continue };
        t = SetTicks { softirq: t.softirq + softirq, all: t.all + all, cpus: t.cpus + 1 };
    }
    t
}

/// `total=` of /proc/pressure/cpu's `some` line.
fn some_total_us(psi: &str) -> Option<u64> {
    psi.lines().find(|l| l.starts_with("some "))?.split_whitespace().find_map(|f| f.strip_prefix("total="))?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn busy_and_waiting_are_read_from_the_kernels_tables() {
        let stat = "cpu  100 10 50 800 40 5 5 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        assert_eq!(cpu_ticks(stat), Some(Ticks { busy: 170, softirq: 5, all: 1010 }));
        assert_eq!(cpu_ticks("intr 1 2\n"), None);
        let psi = "some avg10=0.00 avg60=0.50 avg300=13.28 total=19667196547\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(some_total_us(psi), Some(19_667_196_547));
        assert_eq!(some_total_us("full total=3\n"), None);
        let t0 = Instant::now();
        let a = HostCpu { at: t0, busy_ticks: 1000, softirq_ticks: 100, all_ticks: 4000, some_wait_us: Some(5_000_000), sets: None };
        let b = HostCpu {
            at: t0 + Duration::from_secs(2),
            busy_ticks: 1600,
            softirq_ticks: 300,
            all_ticks: 4800,
            some_wait_us: Some(5_500_000),
            sets: None,
        };
        let load = b.since(&a, 4);
        assert!((load.busy_cores - 3.0).abs() < 1e-9, "{load:?}");
        assert!((load.softirq_cores - 1.0).abs() < 1e-9, "{load:?}");
        assert!((load.cpu_wait.unwrap() - 0.25).abs() < 1e-9, "{load:?}");
        assert_eq!(load.text(), "busy 3.0/4 (softirq 1.0), waited 25%");
        assert_eq!((load.workers_softirq_s, load.servers_softirq_s), (None, None), "no sets asked for");
        let no_psi = HostCpu { some_wait_us: None, ..b }.since(&a, 4);
        assert_eq!(no_psi.cpu_wait, None);
        // This machine's own counters read and move forward.
        let before = HostCpu::now().expect("/proc/stat");
        let load = HostLoad::over(Some(before), None).expect("a second reading");
        assert!(load.busy_cores >= 0.0 && load.busy_cores <= load.cores as f64 + 1e-9, "{load:?}");
        assert!(load.softirq_cores >= 0.0 && load.softirq_cores <= load.busy_cores + 1e-9, "{load:?}");
    }

    #[test]
    fn softirq_seconds_are_read_per_set_of_cores() {
        // Servers on CPUs 0-1, workers on 2-3: idle and softirq ticks each.
        let stat = |(w_idle, w): (u64, u64), (s_idle, s): (u64, u64)| {
            let cpu = |n: u32, idle: u64, softirq: u64| format!("cpu{n} 10 0 10 {idle} 0 0 {softirq} 0 0 0\n");
            format!(
                "cpu  0 0 0 0 0 0 0 0 0 0\n{}{}{}{}intr 5\n",
                cpu(0, s_idle, s),
                cpu(1, s_idle, s),
                cpu(2, w_idle, w),
                cpu(3, w_idle, w)
            )
        };
        let sets = CoreSets { workers: vec![2, 3], servers: vec![0, 1, 9] };
        let first = stat((80, 5), (80, 1));
        assert_eq!(set_ticks(&first, &sets.workers), SetTicks { softirq: 10, all: 210, cpus: 2 });
        assert_eq!(set_ticks(&first, &sets.servers), SetTicks { softirq: 2, all: 202, cpus: 2 }, "cpu9 is not listed");
        let at = |text: &str, secs: u64| HostCpu {
            at: Instant::now() + Duration::from_secs(secs),
            busy_ticks: 0,
            softirq_ticks: 0,
            all_ticks: 1,
            some_wait_us: None,
            sets: Some([set_ticks(text, &sets.workers), set_ticks(text, &sets.servers)]),
        };
        // Over 2 s, each CPU 200 ticks more; the workers' two spent 50 of
        // them each in softirqs (a quarter: 0.5 s each, 1 s together), the
        // servers' 20 each (0.2 s each).
        let (a, b) = (at(&first, 0), at(&stat((230, 55), (260, 21)), 2));
        let load = b.since(&a, 4);
        let near = |x: Option<f64>, want: f64| x.is_some_and(|x| (x - want).abs() < 0.01);
        assert!(near(load.workers_softirq_s, 1.0) && near(load.servers_softirq_s, 0.4), "{load:?}");
        // A reading without sets gives none.
        let plain = HostCpu { sets: None, ..b };
        assert_eq!(plain.since(&a, 4).workers_softirq_s, None);
        // This machine's CPU 0 reads.
        let here = HostCpu::now_on(Some(&CoreSets { workers: vec![0], servers: vec![] })).expect("/proc/stat");
        assert_eq!(here.sets.map(|s| (s[0].cpus, s[1].cpus)), Some((1, 0)));
    }
}
