//! Processes' CPU time, read from `/proc/<pid>/stat`: the servers', the
//! ranks' and the kernel baseline's stream processes', each read by this
//! process at worker 0's `LOOP` line and at its `RESULT` row (`loop_cpu`).
//!
//! Read from outside, not reported by each process, so that every process
//! of a host is read the same way and at the same moments, a server that
//! reports nothing included. A process started through `ip netns exec`
//! (and `env`) keeps the pid its `Child` has: both exec the command.
//!
//! What the figures leave out: the kernel's softirq work (a veth's receive,
//! tbf's timers) is charged to whatever task its CPU was running at the
//! tick (tick accounting without IRQ time accounting): another host's
//! process, ksoftirqd or the idle task. The machine's figure (`host_cpu`)
//! holds it all.
use std::time::Instant;

/// Several processes' CPU clock ticks at one moment.
#[derive(Debug, Clone)]
pub(super) struct CpuMark {
    pub(super) at: Instant,
    /// Per process, in the order of the pids read; None where one could
    /// not be read (no /proc, or it has exited).
    ticks: Vec<Option<u64>>,
}

impl CpuMark {
    /// The processes `pids`, now.
    pub(super) fn now(pids: &[u32]) -> CpuMark {
        CpuMark { at: Instant::now(), ticks: pids.iter().map(|&pid| process_cpu_ticks(pid)).collect() }
    }

    /// Each process's CPU seconds between `before` and this mark; None if
    /// any process could not be read either time. Resolution: one clock
    /// tick (10 ms at the usual 100 Hz) per process.
    pub(super) fn each_since(&self, before: &CpuMark) -> Option<Vec<f64>> {
        let tick = clock_tick_s()?;
        if self.ticks.len() != before.ticks.len() {
            return None;
        }
        self.ticks.iter().zip(&before.ticks).map(|(now, then)| Some(now.as_ref()?.checked_sub((*then)?)? as f64 * tick)).collect()
    }

    /// Every process's CPU seconds since `before`, together.
    pub(super) fn sum_since(&self, before: &CpuMark) -> Option<f64> {
        Some(self.each_since(before)?.iter().sum())
    }

    /// Wall seconds between `before` and this mark.
    pub(super) fn wall_since(&self, before: &CpuMark) -> f64 {
        self.at.saturating_duration_since(before.at).as_secs_f64()
    }
}

/// Seconds per clock tick, the unit of /proc/<pid>/stat's times.
fn clock_tick_s() -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| 1.0 / hz as f64)
}

/// User + system clock ticks of process `pid` (every thread, the tgid's
/// stat); None if /proc has no such process or it has exited (a zombie).
fn process_cpu_ticks(pid: u32) -> Option<u64> {
    stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// utime + stime (fields 14 and 15 of proc(5)) of a /proc/<pid>/stat line,
/// counted after the last ')' since the command name (field 2) may hold
/// spaces and parentheses; None if malformed or the process is a zombie
/// or dead (state Z or X: its times are no longer its own).
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), so field k is fields[k - 3].
    if matches!(*fields.first()?, "Z" | "X" | "x") {
        return None;
    }
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let stat = "4242 (tally (x) y) S 1 4242 4242 0 -1 4194560 1200 0 3 0 250 31 0 0 20 0 5 0 100 1000000 500 18446744073709551615";
        assert_eq!(stat_cpu_ticks(stat), Some(281));
        assert_eq!(stat_cpu_ticks(&stat.replace(") S ", ") Z ")), None, "a zombie's times are not counted");
        assert_eq!(stat_cpu_ticks("4242 (tally) S 1 2"), None, "too short");
        assert_eq!(stat_cpu_ticks("4242 tally S"), None, "no command name");
        // This process, read as the servers are: present and counting.
        assert!(process_cpu_ticks(std::process::id()).is_some());
        assert_eq!(process_cpu_ticks(u32::MAX), None);
    }

    #[test]
    fn marks_give_each_process_its_seconds_or_none() {
        let me = std::process::id();
        let before = CpuMark::now(&[me, me]);
        // Spin until this process has used a clock tick or two.
        let first = CpuMark::now(&[me]);
        let mut x = 0u64;
        while CpuMark::now(&[me]).sum_since(&first).unwrap() < 0.02 {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = CpuMark::now(&[me, me]);
        let each = after.each_since(&before).expect("both read both times");
        assert_eq!(each.len(), 2);
        assert!(each.iter().all(|&s| s >= 0.02), "{each:?}");
        assert!(after.sum_since(&before).unwrap() >= 0.04);
        assert!(after.wall_since(&before) > 0.0);
        // A process that cannot be read, or marks of other processes: no figure.
        assert_eq!(CpuMark::now(&[me, u32::MAX]).each_since(&before), None);
        assert_eq!(CpuMark::now(&[me]).each_since(&before), None);
    }
}
