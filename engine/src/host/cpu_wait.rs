//! How long a thread of this process has waited for a CPU: the second field
//! of `/proc/self/task/<tid>/schedstat` (nanoseconds spent runnable but not
//! running, since the thread started; kernels with `CONFIG_SCHED_INFO`,
//! which every distribution kernel has).
//!
//! The control plane's watchdog reads it before it calls an lcore stuck
//! (`control::LCORE_STUCK_AFTER`): an lcore whose poll count stood still
//! because the host gave it no CPU (a 2-core machine running a thousand
//! rank processes and a compiler beside the server) is starved, not stuck
//! inside a provider call, and failing its jobs would turn an overloaded
//! host into failed jobs. An lcore stuck spinning on a dead peer's lock, or
//! blocked in a call, does not wait for a CPU, so the verdict still comes.
use std::time::Duration;

/// The calling thread's id (what `/proc/self/task/` names it by). By the
/// system call: glibc has `gettid` from 2.30 only, and tally's binaries
/// link against 2.28.
pub fn current_tid() -> u32 {
    // SAFETY: SYS_gettid takes no arguments, has no preconditions and cannot fail.
    (unsafe { libc::syscall(libc::SYS_gettid) }) as u32
}

/// Thread `tid`'s time runnable but waiting for a CPU so far; None where
/// the kernel does not say (no schedstat, or the thread is gone).
pub fn waited(tid: u32) -> Option<Duration> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    parse(&s)
}

fn parse(schedstat: &str) -> Option<Duration> {
    let ns = schedstat.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_wait_field() {
        assert_eq!(parse("1234 5678 9\n"), Some(Duration::from_nanos(5678)));
        assert_eq!(parse("1234\n"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn this_thread_has_a_wait_figure_that_does_not_go_back() {
        let tid = current_tid();
        let a = waited(tid).expect("this kernel has schedstat");
        std::thread::yield_now();
        assert!(waited(tid).unwrap() >= a);
    }
}
