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
//! interrupt, so they are part of the rows' wkr and srv too).
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
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let Ticks { busy: busy_ticks, softirq: softirq_ticks, all: all_ticks } = cpu_ticks(&stat)?;
        let some_wait_us = std::fs::read_to_string("/proc/pressure/cpu").ok().and_then(|p| some_total_us(&p));
        Some(HostCpu { at: Instant::now(), busy_ticks, softirq_ticks, all_ticks, some_wait_us })
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
        HostLoad { busy_cores, softirq_cores, cores, cpu_wait: cpu_wait.map(|w| w.min(1.0)) }
    }
}

impl HostLoad {
    /// The machine's load since `before`; None where either reading failed.
    pub fn over(before: Option<HostCpu>) -> Option<HostLoad> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Some(HostCpu::now()?.since(&before?, cores))
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

fn cpu_ticks(stat: &str) -> Option<Ticks> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice: in user already]
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some(Ticks { busy, softirq: at(6), all: busy + at(3) + at(4) })
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
        let a = HostCpu { at: t0, busy_ticks: 1000, softirq_ticks: 100, all_ticks: 4000, some_wait_us: Some(5_000_000) };
        let b = HostCpu {
            at: t0 + Duration::from_secs(2),
            busy_ticks: 1600,
            softirq_ticks: 300,
            all_ticks: 4800,
            some_wait_us: Some(5_500_000),
        };
        let load = b.since(&a, 4);
        assert!((load.busy_cores - 3.0).abs() < 1e-9, "{load:?}");
        assert!((load.softirq_cores - 1.0).abs() < 1e-9, "{load:?}");
        assert!((load.cpu_wait.unwrap() - 0.25).abs() < 1e-9, "{load:?}");
        assert_eq!(load.text(), "busy 3.0/4 (softirq 1.0), waited 25%");
        let no_psi = HostCpu { some_wait_us: None, ..b }.since(&a, 4);
        assert_eq!(no_psi.cpu_wait, None);
        // This machine's own counters read and move forward.
        let before = HostCpu::now().expect("/proc/stat");
        let load = HostLoad::over(Some(before)).expect("a second reading");
        assert!(load.busy_cores >= 0.0 && load.busy_cores <= load.cores as f64 + 1e-9, "{load:?}");
        assert!(load.softirq_cores >= 0.0 && load.softirq_cores <= load.busy_cores + 1e-9, "{load:?}");
    }
}
