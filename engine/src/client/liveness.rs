//! Liveness: a server that stops proving it makes progress is lost.
//!
//! A SIGKILLed server's sockets close at once and a dead host's control
//! connection fails its keepalive, but a *frozen* server (SIGSTOP, a host in
//! a soft lockup, a process stuck in a provider call) keeps its connections
//! open: the kernel still answers TCP and keepalives for it, and its own op
//! timeout is frozen with it. Without more, every job on it stalls for as
//! long as it hangs.
//!
//! So a rank asks each server for heartbeats (`Hello::ALIVE`): the server's
//! control thread sends a bare `Alive` header every `heartbeat_ms` (250 by
//! default), and only while every lcore of the job keeps polling. A frozen
//! process sends nothing; a stuck lcore withholds its jobs' heartbeats. A
//! rank that has heard a server once and then hears nothing from it for
//! `ClientConfig::liveness` (2 s by default, `TALLY_LIVENESS_MS`) declares
//! it lost, exactly as if its connection had closed, and the job fails over.
//!
//! The rank checks where it reads its control connections (while it waits
//! on an all-reduce) and reads everything buffered first, so a rank that
//! did not call into the client for a while is not fooled by its own
//! absence: what the server sent meanwhile counts as heard now. A server
//! that never sent a heartbeat (one older than heartbeats, or run with
//! `heartbeat_ms = 0`) is never declared lost this way. Jobs that cannot
//! fail over (one server, shm, `TALLY_FAILOVER=0`) do not check: losing
//! their only server is an error, and waiting for one that resumes is
//! better; the client's own `timeout` bounds that wait.
use std::time::{Duration, Instant};

/// When each server of a sub-job was last heard (None: not armed: no
/// heartbeat from it yet, or it was lost and not taken back). Sized at the
/// join: a heartbeat is read while an all-reduce runs, and allocates nothing.
pub struct Liveness {
    heard: Vec<Option<Instant>>,
}

impl Liveness {
    /// For a client of `servers` servers, none armed.
    pub fn new(servers: usize) -> Liveness {
        Liveness { heard: vec![None; servers] }
    }

    /// A heartbeat from server `si`: it is armed from now on.
    pub fn alive(&mut self, si: usize, now: Instant) {
        if let Some(h) = self.heard.get_mut(si) {
            *h = Some(now);
        }
    }

    /// Any other message from `si` is as good as a heartbeat once armed.
    pub fn heard(&mut self, si: usize, now: Instant) {
        if let Some(Some(t)) = self.heard.get_mut(si) {
            *t = now;
        }
    }

    /// Forget `si` (lost, or taken back on a new connection: armed again by
    /// its first heartbeat there).
    pub fn disarm(&mut self, si: usize) {
        if let Some(h) = self.heard.get_mut(si) {
            *h = None;
        }
    }

    /// How long `si` has been silent, if longer than `limit` and armed.
    pub fn overdue(&self, si: usize, limit: Duration, now: Instant) -> Option<Duration> {
        let silent = now.saturating_duration_since(self.heard.get(si).copied().flatten()?);
        (silent > limit).then_some(silent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_server_that_sent_a_heartbeat_can_be_overdue() {
        let mut l = Liveness::new(2);
        let t0 = Instant::now();
        let limit = Duration::from_secs(2);
        l.heard(1, t0);
        assert_eq!(l.overdue(1, limit, t0 + Duration::from_secs(9)), None, "never armed");
        l.alive(1, t0);
        assert_eq!(l.overdue(1, limit, t0 + Duration::from_secs(1)), None);
        assert_eq!(l.overdue(1, limit, t0 + Duration::from_secs(3)), Some(Duration::from_secs(3)));
        l.heard(1, t0 + Duration::from_secs(2));
        assert_eq!(l.overdue(1, limit, t0 + Duration::from_secs(3)), None, "a message counts once armed");
        l.disarm(1);
        assert_eq!(l.overdue(1, limit, t0 + Duration::from_secs(30)), None);
        assert_eq!(l.overdue(0, limit, t0 + Duration::from_secs(30)), None, "another server");
    }
}
