//! Process limits a server needs raised: open files.
//!
//! Every control connection is a file descriptor, and a server that takes a
//! thousand-rank job (or a storm of connections) needs more than the usual
//! soft limit of 1024. The hard limit is what an administrator allowed; the
//! server raises its soft limit to it at start, as most network servers do,
//! and says so when even that is short of what its configuration can use.
use crate::host::config::ServerConfig;

/// Raises the soft RLIMIT_NOFILE to the hard one; returns the limit now in force.
pub fn raise_open_files(cfg: &ServerConfig) -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit reads one rlimit from a struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    // Handshakes, every rank of every job, and some for endpoints and files.
    let wanted = cfg.max_handshakes as u64 + cfg.max_jobs as u64 * cfg.max_ranks as u64 + 256;
    let have = lim.rlim_cur;
    if have < wanted {
        log::warn!(
            "open files limit is {have} (hard limit {}); this configuration can use {wanted} connections: raise it (ulimit -n, LimitNOFILE=) or lower max_handshakes",
            lim.rlim_max
        );
    } else {
        log::debug!("open files limit {have}");
    }
    have
}
