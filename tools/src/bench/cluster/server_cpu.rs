//! The servers' CPU time, read from `/proc/<pid>/stat` over the interval of
//! each timed loop (worker 0's `LOOP` line to its `RESULT` row).
use crate::bench::report::Row;

/// The servers' CPU seconds between worker 0's `LOOP` line (`started`: the
/// step it named and the servers' ticks then) and `row`, its result: None
/// if that loop was not announced or a server could not be read either time.
/// Resolution: one clock tick (10 ms at the usual 100 Hz) per server.
pub(super) fn server_cpu_over(started: Option<(String, Option<u64>)>, row: &Row, pids: &[u32]) -> Option<f64> {
    let (step, Some(before)) = started? else { return None };
    if step != format!("{} {}", row.mode, row.bytes) {
        return None;
    }
    let spent = servers_cpu_ticks(pids)?.checked_sub(before)?;
    Some(spent as f64 * clock_tick_s()?)
}

/// Every server's user + system clock ticks so far, summed; None if any
/// cannot be read.
pub(super) fn servers_cpu_ticks(pids: &[u32]) -> Option<u64> {
    pids.iter().map(|&pid| process_cpu_ticks(pid)).sum()
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
}
