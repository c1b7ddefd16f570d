//! Draining (SIGTERM): no new job is admitted, every running job's ranks
//! agree on a switch operation from which they use only their other
//! servers, and the server exits once no job uses it.
//!
//! # Drain, beyond the messages
//!
//! A training run lasts days; servers get upgraded under it. The first SIGTERM (or SIGINT) puts
//! `tally server` into draining (`Server::drain`); a second stops it at once (jobs still there get a
//! `shutdown` reject). A draining server admits no new job (reject code `draining`: a client with
//! other servers leaves it out of that sub-job, every rank alike) and moves its running jobs off
//! without an error, from an operation K all ranks agree on. The long version (`Drain`, `Boundary`,
//! `SwitchAt`, why K is the first operation all ranks can switch at): the module docs of
//! `engine/src/control/mod.rs` (server), `engine/src/client/control.rs` (rank) and
//! `engine/src/wire/mod.rs` (messages); the code is `control/drain.rs`. Beyond them:
//! - A client peeks its control connections as "The hot path" says, so it answers while all-reduces
//!   are in flight, queued, or at its next call when idle (a time gate on those peeks was dropped:
//!   [measurements, "Drain"](docs/measurements.md#drain)). A rank that said Bye counts as answered.
//! - From K, `op_chunk_bytes` and the rotation use the new S. Streams keep their own sequence
//!   numbers, so the remaining servers see nothing new. An operation's chunking depends only on its
//!   size and stream set, which all ranks agree on: results stay bit-identical.
//! - With no job left the server logs `drained` and exits with status 0; at `drain_timeout_s`
//!   (`--drain-timeout`, default 60) it ends the rest with a `draining` reject naming the timeout.
//!   Meanwhile `Server::jobs` and `/metrics` (`tally_jobs{state="draining"}`) count its jobs as
//!   `draining` (not an lcore draining a job that ends: `State::Draining` in `dataplane/shard/`).
//! - Any `Boundary::STAY` makes K = STAY. With several servers draining at once a rank says STAY
//!   unless some server not draining remains, so no job is left without a server. Each sub-job
//!   (dtype, op) is its own server job and negotiates alone.
//! - Limits: a rank that does not call into the client for longer than the drain timeout (or a client
//!   built before drain, which never answers) leaves its job there until the timeout ends it; ranks
//!   holding all-reduces while the switch is agreed count that time against their own `timeout`.
use super::{ControlPlane, Draining, JobDrain, Phase};
use crate::control::join::refuse;
use crate::dataplane::metrics::ServerPhase;
use crate::wire::{Boundary, Drain, RejectCode, SwitchAt};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl ControlPlane {
    /// Starts draining when asked; ends it when no job is left, or ends the
    /// jobs still here at the drain timeout.
    pub(super) fn check_drain(&mut self, now: Instant) {
        if self.draining.is_none() {
            if !self.drain_requested.load(Ordering::Relaxed) {
                return;
            }
            self.start_drain(now);
        }
        let Some(d) = self.draining.as_mut() else { return };
        if self.drained.load(Ordering::Relaxed) {
            return;
        }
        let left = self.active.iter().flatten().count();
        if left == 0 && self.pending.is_empty() {
            log::info!("drained: no job left after {:.1?}", now.duration_since(d.since));
            self.drained.store(true, Ordering::Relaxed);
            return;
        }
        let waited = now.duration_since(d.since);
        if !d.timed_out && waited >= self.drain_timeout {
            d.timed_out = true;
            let msg = format!("the server drained for drain_timeout_s={} and ends the jobs still on it", self.drain_timeout.as_secs());
            log::warn!("drain timeout: ending {left} jobs still here");
            for i in 0..self.active.len() {
                if let Some(a) = self.active[i].as_ref() {
                    log::warn!("job {:#x}: {msg}", a.job_id);
                }
                self.end(i, RejectCode::Draining, &msg);
            }
        } else if d.timed_out && waited >= self.drain_timeout + Duration::from_secs(3) {
            // Lcores that cannot drain those jobs: stop anyway (the shutdown
            // path bounds the wait for them once more).
            log::warn!("drain: {left} jobs still ending 3 s after the drain timeout; stopping anyway");
            self.drained.store(true, Ordering::Relaxed);
        }
    }

    pub(super) fn start_drain(&mut self, now: Instant) {
        self.dirty = true;
        self.health.advance(ServerPhase::Draining);
        let running: Vec<usize> =
            (0..self.active.len()).filter(|&i| self.active[i].as_ref().is_some_and(|a| a.phase == Phase::Running)).collect();
        let ranks: u32 = running.iter().filter_map(|&i| self.active[i].as_ref()).map(|a| a.spec.nranks).sum();
        log::info!(
            "draining: {} running jobs ({ranks} ranks) move to their other servers; admitting no new jobs; exit when no job is left or after drain_timeout_s={}",
            running.len(),
            self.drain_timeout.as_secs()
        );
        self.draining = Some(Draining { since: now, timed_out: false });
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            let mut p = self.pending.remove(&id).unwrap();
            log::info!("job {id:#x} refused: the server is draining ({} of {} ranks had joined)", p.joined, p.spec.nranks);
            for c in p.conns.iter_mut().flatten() {
                self.conn_job.remove(&c.id);
                refuse(&mut self.net, c, RejectCode::Draining, "", "the server is draining (shutting down): it admits no new jobs");
            }
        }
        for i in running {
            self.tell_drain(i);
        }
    }

    /// Sends every rank of job `i` that has not finished a Drain.
    pub(super) fn tell_drain(&mut self, i: usize) {
        let timeout_s = self.drain_timeout.as_secs().min(u32::MAX as u64) as u32;
        let Some(a) = self.active[i].as_mut() else { return };
        // A rejoined job drains like any other once it is back in use.
        let rejoined = a.drain.as_ref().is_some_and(|d| d.rejoin && d.switch_at.is_some());
        if (a.drain.is_some() && !rejoined) || a.phase != Phase::Running {
            return;
        }
        a.drain = Some(JobDrain { boundaries: vec![None; a.spec.nranks as usize], switch_at: None, rejoin: false });
        let msg = Drain::new(timeout_s);
        for c in &a.conns {
            if a.done[c.rank as usize] {
                continue;
            }
            if let Err(e) = self.net.send(c.id, bytemuck::bytes_of(&msg)) {
                log::warn!("job {:#x}: cannot tell rank {} at {} that the server drains: {e}", a.job_id, c.rank, c.peer);
            }
        }
        self.decide_switch(i);
    }

    pub(super) fn boundary(&mut self, conn: u64, next_op: u64) {
        let Some(&job_id) = self.conn_job.get(&conn) else { return };
        let Some(i) = self.active_of(conn) else { return };
        let a = self.active[i].as_mut().unwrap();
        let Some(rank) = a.conns.iter().find(|c| c.id == conn).map(|c| c.rank as usize) else { return };
        let Some(d) = a.drain.as_mut() else {
            log::warn!("job {job_id:#x}: rank {rank} sent a boundary, but the server does not drain; ignored");
            return;
        };
        if d.switch_at.is_some() || d.boundaries[rank].is_some() {
            log::warn!("job {job_id:#x}: rank {rank} sent a second boundary; ignored");
            return;
        }
        d.boundaries[rank] = Some(next_op);
        if next_op == Boundary::STAY {
            log::debug!("job {job_id:#x}: rank {rank} has no other server");
        } else {
            log::debug!("job {job_id:#x}: rank {rank} can move from operation {next_op}");
        }
        self.decide_switch(i);
    }

    /// Once every rank answered (or finished), picks the switch operation
    /// and tells every rank still here.
    pub(super) fn decide_switch(&mut self, i: usize) {
        let Some(a) = self.active[i].as_mut() else { return };
        if a.phase != Phase::Running {
            return;
        }
        let Some(d) = a.drain.as_mut() else { return };
        if d.switch_at.is_some() {
            return;
        }
        let mut k = 0u64;
        for (r, b) in d.boundaries.iter().enumerate() {
            match b {
                Some(b) => k = k.max(*b), // STAY is u64::MAX: it wins
                None if a.done[r] => {}
                None => return,
            }
        }
        d.switch_at = Some(k);
        if d.rejoin {
            log::info!("job {:#x}: rejoined: every rank uses this server again from operation {k}", a.job_id);
        } else if k == Boundary::STAY {
            log::info!(
                "job {:#x}: a rank has no other server to move to; the job stays here until it ends (at most drain_timeout_s={})",
                a.job_id,
                self.drain_timeout.as_secs()
            );
        } else {
            log::info!("job {:#x}: every rank moves off this server from operation {k}", a.job_id);
        }
        let msg = SwitchAt::new(k);
        for c in &a.conns {
            if a.done[c.rank as usize] {
                continue;
            }
            if let Err(e) = self.net.send(c.id, bytemuck::bytes_of(&msg)) {
                log::warn!("job {:#x}: cannot send the switch to rank {} at {}: {e}", a.job_id, c.rank, c.peer);
            }
        }
    }
}
