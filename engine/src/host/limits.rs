//! Process limits tally raises: open files (RLIMIT_NOFILE).
//!
//! Every control connection is a file descriptor, and over tcp (ofi_rxm)
//! every rank is also a socket on each lcore's endpoint; a server that takes
//! thousand-rank jobs needs more than the usual soft limit of 1024. The hard
//! limit is what an administrator allowed: a server raises its soft limit to
//! it at start, as most network servers do, and warns, once, only when even
//! that is short of what the ranks it may admit can hold
//! ([`server_rank_descriptors`]). Connections still in their handshake are
//! not counted: they are bounded by `max_handshakes` and by what is left,
//! and running out of descriptors only holds new ones in the listen backlog
//! (the control plane says so when it happens). `tally bench allreduce`
//! raises its own limit with [`raise_open_files`] for its rank processes.
use crate::host::config::ServerConfig;

/// Descriptors a server keeps beside its ranks' connections: the listener,
/// endpoints and their completion queues, epoll sets, metrics, files.
pub const SERVER_RESERVE: u64 = 256;

/// RLIMIT_NOFILE as it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    pub soft: u64,
    pub hard: u64,
}

/// This process's open files limits.
pub fn open_files() -> std::io::Result<OpenFiles> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(OpenFiles { soft: lim.rlim_cur, hard: lim.rlim_max })
}

/// Raises the soft limit to `want`, or to the hard limit where that is lower
/// (no privilege needed); never lowers it. Returns the limits now in force.
pub fn raise_open_files(want: u64) -> std::io::Result<OpenFiles> {
    let now = open_files()?;
    let target = want.min(now.hard);
    if target <= now.soft {
        return Ok(now);
    }
    let raised = libc::rlimit { rlim_cur: target, rlim_max: now.hard };
    // SAFETY: setrlimit reads one rlimit from a struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(OpenFiles { soft: target, hard: now.hard })
}

/// Descriptors a server with `cfg` over `provider` holds when every job it
/// admits (`max_jobs`) has every rank it admits (`max_ranks`): a control
/// connection per rank, over tcp also a connection per rank on each lcore's
/// endpoint (efa and shm hold none per peer), and [`SERVER_RESERVE`].
pub fn server_rank_descriptors(cfg: &ServerConfig, provider: &str) -> u64 {
    let per_rank = 1 + if provider.starts_with("tcp") { cfg.lcores.len() as u64 } else { 0 };
    cfg.max_jobs as u64 * cfg.max_ranks as u64 * per_rank + SERVER_RESERVE
}

/// At server start: raises the soft limit to the hard one and warns when
/// the ranks this configuration admits can need more. Returns the limit now
/// in force (0 where it cannot be read).
pub fn raise_for_server(cfg: &ServerConfig, provider: &str) -> u64 {
    let lim = match raise_open_files(u64::MAX) {
        Ok(l) => l,
        Err(e) => {
            log::warn!("cannot raise the open files limit: {e}");
            match open_files() {
                Ok(l) => l,
                Err(_) => return 0,
            }
        }
    };
    let need = server_rank_descriptors(cfg, provider);
    if lim.soft < need {
        let tcp = if provider.starts_with("tcp") {
            format!(" and, over tcp, one on each of the {} lcores", cfg.lcores.len())
        } else {
            String::new()
        };
        log::warn!(
            "open files limit is {}, and {} jobs of {} ranks can need {need} descriptors (a control connection per rank{tcp}): \
             ranks past the limit cannot connect; raise the hard limit (LimitNOFILE= in the unit, ulimit -Hn) or lower max_jobs or max_ranks",
            lim.soft,
            cfg.max_jobs,
            cfg.max_ranks
        );
    } else {
        log::debug!(
            "open files limit {}: {need} for admitted ranks, the rest for connections in their handshake (at most {})",
            lim.soft,
            cfg.max_handshakes
        );
    }
    lim.soft
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::config::ServerFile;

    fn config(text: &str) -> ServerConfig {
        ServerFile::parse(text).and_then(|f| f.resolve()).unwrap()
    }

    #[test]
    fn rank_descriptors_count_tcp_lcore_connections() {
        let cfg = config("lcores = \"0-1\"\nmax_jobs = 16\nmax_ranks = 1024\n");
        assert_eq!(server_rank_descriptors(&cfg, "shm"), 16 * 1024 + SERVER_RESERVE);
        assert_eq!(server_rank_descriptors(&cfg, "efa"), 16 * 1024 + SERVER_RESERVE);
        assert_eq!(server_rank_descriptors(&cfg, "tcp;ofi_rxm"), 16 * 1024 * 3 + SERVER_RESERVE);
    }

    #[test]
    fn raising_never_lowers_and_stops_at_the_hard_limit() {
        let before = open_files().unwrap();
        let now = raise_open_files(1).unwrap();
        assert_eq!(now.soft, before.soft.max(1));
        let top = raise_open_files(u64::MAX).unwrap();
        assert_eq!(top.soft, top.hard);
        assert_eq!(open_files().unwrap(), top);
    }
}
