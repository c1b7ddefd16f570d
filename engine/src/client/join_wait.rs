//! Waiting for a join's answers from several servers at once.
//!
//! A rank sends its Hello to every server of the job, then waits for each
//! server's answer; a server answers when every rank of the job reached it.
//! Waiting on the servers one after the other went wrong when a rank died
//! in the middle: a server it never reached (its link was down while the
//! job formed) waits its whole join timeout (120 s) for it, while the
//! servers it did reach admit the job, see the rank's connection close and
//! fail the job at once, telling the others on connections nobody read. The
//! survivors sat in the first server's wait until the join timeout (the
//! soak's 60 s "hangs" after a rank SIGKILL landing during a link cut).
//!
//! So the join waits on every pending answer at once ([`readable`]) and,
//! between turns, looks at the servers that already accepted: one that has
//! since ended the job, or closed the connection, fails the join for this
//! rank at once ([`ended_meanwhile`]). Leaving closes this rank's pending
//! connections, which fails the join on the servers still waiting, for the
//! ranks there as well. (A rank that dies before it reached *any* server
//! is indistinguishable from a slow one: the servers' join timeout bounds
//! that case.)
use crate::wire::{self, Kind, Reject};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// How long one wait lasts before the accepted servers are looked at again.
pub(super) const TURN_MS: i32 = 100;

/// Which of `streams` have bytes (or an end) to read, waiting at most
/// `timeout_ms`. None entries are never ready.
pub(super) fn readable(streams: &[Option<&TcpStream>], timeout_ms: i32) -> Vec<bool> {
    let mut fds: Vec<libc::pollfd> =
        streams.iter().map(|s| libc::pollfd { fd: s.map_or(-1, |s| s.as_raw_fd()), events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: `fds` is a live array of fds.len() pollfds; negative fds are ignored by poll.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n <= 0 {
        return vec![false; streams.len()];
    }
    fds.iter().map(|p| p.fd >= 0 && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0).collect()
}

/// For a server that accepted the job: why the job is over there already,
/// if it is (it ended the job, or closed the connection). Heartbeats are read
/// and dropped; any other message stays for the client's control reader.
/// Never blocks.
pub(super) fn ended_meanwhile(s: &mut TcpStream) -> Option<String> {
    let _ = s.set_nonblocking(true);
    let why = loop {
        let mut b = [0u8; core::mem::size_of::<Reject>()];
        let n = match s.peek(&mut b) {
            Ok(0) => break Some("it closed the job's connection".to_string()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => break None,
            Err(e) => break Some(format!("its connection failed: {e}")),
        };
        if n < core::mem::size_of::<wire::Header>() {
            break None;
        }
        match wire::read::<wire::Header>(&b).and_then(|h| h.check()) {
            Ok(Kind::Alive) => {
                let mut h = [0u8; core::mem::size_of::<wire::Header>()];
                if std::io::Read::read_exact(s, &mut h).is_err() {
                    break None;
                }
            }
            Ok(Kind::Reject) if n == b.len() => {
                break Some(match wire::read::<Reject>(&b) {
                    Ok(r) => format!("it ended the job: {r}"),
                    Err(e) => format!("it ended the job (unreadable reason: {e})"),
                })
            }
            _ => break None,
        }
    };
    let _ = s.set_nonblocking(false);
    why
}
