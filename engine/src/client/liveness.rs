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
//! rank that hears nothing from a server for `ClientConfig::liveness` (2 s
//! by default, `TALLY_LIVENESS_MS`) from the moment its Accept said it
//! sends them (`Accept::heartbeat_ms`, at the join and when it is taken
//! back) declares it lost, exactly as if its connection had closed, and the
//! job fails over.
//!
//! The rank checks where it reads its control connections (while it waits
//! on an all-reduce) and reads everything buffered first, so a rank that
//! did not call into the client for a while is not fooled by its own
//! absence: what the server sent meanwhile counts as heard now. A server
//! run with `heartbeat_ms = 0` is never declared lost this way; one from
//! before `Accept::heartbeat_ms` (which sends them unannounced) only once
//! it sent its first. Jobs that cannot
//! fail over (one server, shm, `TALLY_FAILOVER=0`) do not check: losing
//! their only server is an error, and waiting for one that resumes is
//! better; the client's own `timeout` bounds that wait.
//!
//! # Failure detection: each way a server can fail
//!
//! What a job with several servers sees of each way a server can fail (tcp, default settings;
//! figures from this 2-core machine, `tests/suites/grayfail.rs`, `linkcut.rs`, `failover.rs`,
//! `ffi-plugin/tests/plugin_drain.rs`):
//!
//! | failure | how the ranks see it | how long | what the job sees | what operators see |
//! |---|---|---|---|---|
//! | process dies (SIGKILL, crash) | its control connection closes (the kernel closes its sockets) | at once | a slower all-reduce: recovery 10-80 ms | ranks log `server ... lost (it closed the job's connection)`; the leader logs `every rank reported losing servers` |
//! | process frozen (SIGSTOP, a host in a soft lockup) | no heartbeat for `TALLY_LIVENESS_MS` | 2 s (longest stall measured 1.97-2.03 s) | a stall of the liveness time, then failover | ranks log `server ... lost (no heartbeat for 2.0 s ...)` |
//! | an lcore stuck in a provider call | its poll counter stands still: the control plane withholds the job's heartbeats after 1 s (`LCORE_QUIET_AFTER`), ends the job at 5 s (`LCORE_STUCK_AFTER`) | 2 s (liveness) | failover, as for a freeze | server logs `heartbeats withheld: lcore N has not polled`, then `lcore N ... stuck inside the fabric provider`; `tally_control_heartbeats_withheld_total` |
//! | link cut (switch port down, no FIN/RST) | no heartbeat | 2 s (1.95-2.03 s measured); TCP keepalive (probes after 2 s idle, every second, 3 of them) would take 5 s | as for a freeze | as for a freeze |
//! | server drains (SIGTERM) | a `Drain` on the control connection | at once | nothing: the job moves off at an agreed operation | server logs `drained` |
//! | a rank dies during the join | the servers it reached see its connection close; the ranks wait on every server's answer at once (`client/join_wait.rs`), so a server that already admitted the job and then failed it ends the others' join even while another server (frozen, cut off, never reached by the dead rank) still holds it | at once (120 ms measured with a frozen server holding the join); a rank that reached no server: the join timeout (120 s) | the others' join fails: `rank N left ... while the job was joining`, or `it ended the job ... while this rank waited for the other servers' answers` | `tally_control_joins_failed_total` |
//! | the client's own provider call does not return | `CallWatch` count stands still (`client/watchdog.rs`) | `TALLY_PROVIDER_WATCHDOG_S` (10 s) | on a rail thread (several rails; shm's one with `TALLY_SHM_RAIL=1`): the all-reduce fails naming the call, the rail is abandoned (`Rails::abandon`: no more calls, no join, its endpoint left open) and the rank can exit; shm's one endpoint on the caller's thread (the default: no hop on a small all-reduce's path): the process ends with the report, exit status 70 (`OnStuck::Exit`, `_exit`: no handler may call into the stuck provider); one endpoint on the caller's thread over tcp or EFA (whose locks are the process's own): only the log line | error log `fi_tsend on rail 0 (provider shm) has not returned for 10 s`, then `rail 0 is abandoned`; or `fi_tsend on the caller's thread (provider shm) ...; ending the process (exit status 70)` |
//!
//! A whole server frozen (SIGSTOP) freezes its control thread with its lcores: on resuming, a gap of
//! more than a second in the control thread's own checks gives the lcores a fresh start instead of
//! reading their old poll counters as "stuck" (a 6 s stop in the soak otherwise failed every job).
//!
//! **Heartbeats**: the module doc of `engine/src/client/liveness.rs` is the long version. The
//! server's side is `ControlPlane::beat` (`control/liveness.rs`): the control thread sends them, so a
//! frozen process sends none, and only for jobs whose lcores all polled within the last second. Cost:
//! 8 bytes per rank per 250 ms on the control connection and a system call per rank per beat on the
//! control thread; nothing on the data path.
//!
//! **Fencing.** A server declared lost may come back (resumed after a freeze, or its link restored
//! while it still runs the job, the ranks' FINs lost with the link); it must not serve the job as it
//! stood, and must free what the job held. How it learns that it was dropped and ends the stale job:
//! `engine/src/wire/mod.rs`. It logs `rank N disconnected without finishing` (the ranks' FIN, or its
//! own write reaching a closed socket) or `fencing the stale job`
//! (`tally_control_jobs_fenced_total`), admits the rejoin under a new tag, and is taken back at an
//! operation boundary as a restarted server is. A tag comes back only after 65535 other jobs
//! (`ControlPlane::next_tag`; why, and the timings: [measurements, "Failure
//! detection"](docs/measurements.md#failure-detection)); until then the provider keeps the stale
//! job's unexpected messages (memory): draining them is not done. Sends a rank posted to a frozen or
//! cut-off server before declaring it lost stay in the provider's queue and read the caller's input
//! buffer when they finally go: harmless to a fenced job, but the buffer must stay mapped (it does
//! under NCCL and PyTorch, whose buffers live on).
//!
//! **Joins under a link blip.** A rank's join connection gets its keepalive only once the Accept is
//! read: a link down for seconds must not break a join the server may have admitted (the other ranks
//! would run a job this rank can no longer enter); TCP retransmits what the blip held up, and the
//! join deadline bounds the wait. A rank whose join connection broke anyway (the server restarted)
//! joins again: from the same endpoint it replaces its first connection in the pending job
//! (`rank N joined again`); another endpoint claiming that rank is refused as a duplicate. A job that
//! failed here because a rank disconnected refuses fresh joins of its id for 10 s with that reason,
//! so a rank late to a job the others left gets an error at once (rejoins are exempt: they are how
//! the job takes a fenced server back). A rank connects to its servers side by side, so a server that
//! does not answer yet holds back none of its Hellos to the others (had it died meanwhile, they could
//! not have told the other ranks at once); how it then waits on every answer at once, and why a rank
//! that dies before any server heard it is caught only by the join timeout (NCCL's bootstrap or the
//! launcher sees that death first): `engine/src/client/join_wait.rs`. A redo job's join waits at most
//! the all-reduce's timeout (`TALLY_TIMEOUT_S`): a rank that died before joining it never comes, and
//! the ranks waiting there read nothing else. Redo joins are a reconnect storm (every rank of every
//! job on the lost server at once): a refused or timed-out connect is retried for up to 10 s
//! (`REDO_CONNECT_FOR`), and a `busy` answer as any join's is.
use std::time::{Duration, Instant};

/// When each server of a sub-job was last heard (None: not armed: it was
/// lost and not taken back, or its job asked for no heartbeats). Sized at the
/// join: a heartbeat is read while an all-reduce runs, and allocates nothing.
pub struct Liveness {
    heard: Vec<Option<Instant>>,
}

impl Liveness {
    /// For a client of `servers` servers, none armed.
    pub fn new(servers: usize) -> Liveness {
        Liveness { heard: vec![None; servers] }
    }

    /// A heartbeat from server `si`, or its Accept saying it sends them
    /// (`Accept::heartbeat_ms`): it is armed from now on. Armed only at a
    /// first beat, a server frozen right after admitting the job (at the
    /// join, or taken back) was never declared lost: the job stood still
    /// for the whole freeze.
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

    /// Forget `si` (lost: armed again when it is taken back, by
    /// [`Liveness::alive`]).
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
