//! Host preparation: the commands that make a machine ready to run a reduction
//! server, and tell whether it is.
//!
//! - `tally hugepages` ([`hugepages`]): the kernel's hugepage pools and
//!   hugetlbfs mounts, what `dpdk-hugepages.py` does for DPDK.
//! - `tally efa-env` ([`efa_env`]): which of `FI_EFA_FORK_SAFE`,
//!   `FI_EFA_USE_HUGE_PAGE`, `RDMAV_FORK_SAFE` and `FI_PROVIDER` a server or a
//!   training worker needs on this host, decided from facts about the kernel,
//!   rdma-core and libfabric rather than copied from a wiki.
//! - `tally doctor` ([`doctor`]): one table of checks against a server
//!   configuration, each with a one-line fix.
//!
//! [`cpu`] names the CPU (on Arm, its Neoverse core and Graviton
//! generation) and its SIMD for all three.
//!
//! [`verbs`] loads libibverbs and libefa at run time, so that all three
//! commands work (and say so) on hosts without rdma-core or without any RDMA
//! device. [`table`] lays out the aligned text tables they print.
//!
//! Every command reads the machine first and decides afterwards, in pure
//! functions over plain structs of facts: those functions are what the tests
//! drive with made-up hosts (an EFA host, an old kernel, a VM without
//! cpufreq), since this build machine is only one of them.
pub mod cpu;
pub mod doctor;
pub mod efa_env;
pub mod hugepages;
pub mod table;
pub mod verbs;

pub use doctor::DoctorArgs;
pub use efa_env::EfaEnvArgs;
pub use hugepages::HugepagesArgs;

/// `tally hugepages ...`
pub fn run_hugepages(args: &HugepagesArgs) -> Result<(), String> {
    hugepages::run(args)
}

/// `tally efa-env ...`
pub fn run_efa_env(args: &EfaEnvArgs) -> Result<(), String> {
    efa_env::run(args)
}

/// `tally doctor ...`; returns the process exit code (1 when a check fails).
pub fn run_doctor(args: &DoctorArgs) -> Result<u8, String> {
    doctor::run(args)
}

/// Whether this process runs as root (effective uid 0).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Write command output to stdout. A closed pipe (`tally ... | head`) ends
/// the output quietly instead of panicking like `print!` does.
pub(crate) fn out(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(format!("cannot write to stdout: {e}")),
    }
}
