//! What arrives on a sub-job's control connections between all-reduces:
//! the server ending the job, heartbeats (liveness), and drains.
//!
//! Drain: a server that is going away (SIGTERM) sends a `Drain` on the
//! job's control connection. The client answers with the index of its
//! first all-reduce of that sub-job not yet cut into chunks (operations are
//! numbered per sub-job from 0: every rank issues the same ones in the same
//! order) and holds its later all-reduces uncut until the server answers
//! with the switch operation K (the largest index any rank gave). Before K
//! the old streams are used, from K on only the other servers' streams: K
//! starts a new stream set, cut and rotated as from scratch, identically
//! on every rank. Once this rank's operations before K completed it says
//! Bye to the draining server and closes that connection. Each shard's
//! result is the same rank-order sum wherever it is reduced, so results
//! stay bit-identical. A client with no other server answers "stay" and
//! keeps using the draining server. A server that refuses a sub-job's join
//! because it drains is left out of that sub-job (every rank gets the same
//! answer from it).
use super::state::Leave;
use super::Client;
use crate::client::error::ClientError;
use crate::reduce::{DataType, ReduceOp};
use crate::wire::{self, Boundary, Drain, Kind, Reject, SwitchAt};
use std::io::{Read, Write};
use std::time::Instant;

impl Client {
    /// A server that ended the job, or drains, says so on the control
    /// connection; a rail stuck in a provider call is an error here.
    pub(super) fn check_controls(&mut self) -> Result<(), ClientError> {
        if let Some(w) = self.watchdog.as_ref() {
            if let Some(report) = w.stuck() {
                let stuck = w.stuck_rails();
                (0..self.rails.count()).filter(|r| stuck & (1 << r) != 0).for_each(|r| self.rails.abandon(r));
                return Err(ClientError::Fabric(report));
            }
        }
        for sub in 0..self.subs.len() {
            if self.subs[sub].fo.watcher.is_some() {
                self.poll_rejoins(sub)?;
            }
            for si in 0..self.subs[sub].controls.len() {
                while let Some(msg) = self.read_control(sub, si)? {
                    let now = Instant::now();
                    match &msg {
                        Control::Alive => self.subs[sub].live.alive(si, now),
                        Control::Gone(_) => {}
                        _ => self.subs[sub].live.heard(si, now),
                    }
                    match msg {
                        Control::Alive => {}
                        Control::Drain => self.on_drain(sub, si)?,
                        Control::SwitchAt(k) => self.on_switch(sub, si, k)?,
                        Control::Gone(why) => self.lose(sub, 1u64 << si, &why)?,
                        Control::Failover(dead) => self.lose(sub, dead, "the recovery's leader says so")?,
                        Control::Recover { dead, switch_op, reports } => {
                            self.subs[sub].fo.verdict = Some((dead, switch_op, reports));
                        }
                    }
                }
                self.check_liveness(sub, si)?;
            }
        }
        // Recoveries join redo jobs, a blocking collective: every rank takes
        // its sub-jobs' verdicts in sub-job order, or two ranks could each
        // wait in a different sub-job's join for the other.
        for sub in 0..self.subs.len() {
            if let Some((dead, switch_op, reports)) = self.subs[sub].fo.verdict.take() {
                self.recover(sub, dead, switch_op, reports)?;
            } else if self.subs[sub].fo.recovering {
                break;
            }
        }
        Ok(())
    }

    /// Server `si` of sub-job `sub`, armed, silent past the liveness time
    /// (everything it sent has just been read): lost, as if its connection
    /// had closed. Only for jobs that can fail over (see [`liveness`]).
    pub(super) fn check_liveness(&mut self, sub: usize, si: usize) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        if self.cfg.liveness.is_zero() || s.stage.is_none() || s.controls[si].is_none() || s.fo.dead & (1u64 << si) != 0 {
            return Ok(());
        }
        let Some(silent) = s.live.overdue(si, self.cfg.liveness, Instant::now()) else { return Ok(()) };
        self.subs[sub].live.disarm(si);
        let why = format!(
            "no heartbeat for {:.1} s (liveness {:.1} s, TALLY_LIVENESS_MS): frozen, hung or cut off",
            silent.as_secs_f64(),
            self.cfg.liveness.as_secs_f64()
        );
        self.lose(sub, 1u64 << si, &why)
    }

    /// Whether this client asks its servers for heartbeats: only jobs that
    /// can fail over act on them (a server older than heartbeats refuses
    /// the flag, so single-server jobs do not send it).
    pub(super) fn wants_heartbeats(&self) -> bool {
        !self.cfg.liveness.is_zero() && self.cfg.failover && self.cfg.servers.len() > 1
    }

    /// The next whole message on a control connection, if one has arrived
    /// (peeked first: a message is taken only once all of it is there).
    pub(super) fn read_control(&mut self, sub: usize, si: usize) -> Result<Option<Control>, ClientError> {
        let server = || self.cfg.servers[si].clone();
        let can_fail_over = self.subs[sub].stage.is_some();
        let Some(c) = self.subs[sub].controls[si].as_mut() else { return Ok(None) };
        let mut b = [0u8; core::mem::size_of::<Reject>()];
        let n = match c.peek(&mut b) {
            Ok(0) if can_fail_over => return Ok(Some(Control::Gone("it closed the job's connection".into()))),
            Ok(0) => return Err(ClientError::Refused { server: server(), reject: "the server closed the job's connection".into() }),
            Ok(n) => n,
            Err(e) if can_fail_over && e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::Interrupted => {
                return Ok(Some(Control::Gone(format!("its control connection failed: {e}"))));
            }
            Err(_) => return Ok(None),
        };
        if n < core::mem::size_of::<wire::Header>() {
            return Ok(None);
        }
        let bad = |e: String| ClientError::Fabric(format!("control message from {}: {e}", self.cfg.servers[si]));
        let kind = wire::read::<wire::Header>(&b).and_then(|h| h.check()).map_err(|e| bad(e.to_string()))?;
        let need = kind.server_message_bytes().ok_or_else(|| bad(format!("unexpected {kind:?}")))?;
        if n < need {
            return Ok(None);
        }
        c.read_exact(&mut b[..need]).map_err(|e| bad(e.to_string()))?;
        match kind {
            Kind::Alive => Ok(Some(Control::Alive)),
            Kind::Drain => {
                wire::read::<Drain>(&b).and_then(|d| d.check()).map_err(|e| bad(e.to_string()))?;
                Ok(Some(Control::Drain))
            }
            Kind::SwitchAt => {
                let k = wire::read::<SwitchAt>(&b).and_then(|m| m.check()).map_err(|e| bad(e.to_string()))?;
                Ok(Some(Control::SwitchAt(k)))
            }
            Kind::Failover => {
                let dead = wire::read::<wire::Failover>(&b).and_then(|m| m.check()).map_err(|e| bad(e.to_string()))?;
                Ok(Some(Control::Failover(dead)))
            }
            Kind::Recover => {
                let m = wire::read::<wire::Recover>(&b).map_err(|e| bad(e.to_string()))?;
                m.check().map_err(|e| bad(e.to_string()))?;
                // The reports follow at once; read them whole (blocking, bounded).
                let mut reports = vec![0u8; m.nranks as usize * m.report_len as usize];
                let c = self.subs[sub].controls[si].as_mut().expect("checked above");
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(self.cfg.timeout));
                let r = c.read_exact(&mut reports);
                let _ = c.set_nonblocking(true);
                r.map_err(|e| bad(format!("recovery reports: {e}")))?;
                Ok(Some(Control::Recover { dead: m.dead, switch_op: m.switch_op, reports }))
            }
            _ => {
                let r: Reject = wire::read(&b).map_err(|e| bad(e.to_string()))?;
                if can_fail_over {
                    // The job may live on elsewhere: the server is lost to it.
                    return Ok(Some(Control::Gone(format!("it ended the job: {r}"))));
                }
                Err(ClientError::Refused { server: server(), reject: r.to_string() })
            }
        }
    }

    /// Index of the sub-job's first operation not yet cut into chunks.
    pub(super) fn first_uncut(&self, sub: usize) -> u64 {
        self.ops.iter().filter(|o| o.sub == sub && !o.planned).map(|o| o.index).min().unwrap_or(self.subs[sub].started)
    }

    /// Server `si` drains: answer where this rank can switch, and hold
    /// operations uncut until the server names the switch.
    pub(super) fn on_drain(&mut self, sub: usize, si: usize) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        if s.leave[si] != Leave::Serving {
            return Ok(());
        }
        // Only a server that does not drain itself can take the shards over.
        let elsewhere = (0..s.leave.len()).any(|o| o != si && s.leave[o] == Leave::Serving);
        let next_op = if elsewhere { self.first_uncut(sub) } else { Boundary::STAY };
        let server = &self.cfg.servers[si];
        if elsewhere {
            log::info!(
                "server {server} drains: moving its shards of job {:#x} to the other servers at an operation boundary",
                self.job_id_of(sub)
            );
        } else {
            log::info!("server {server} drains, but job {:#x} has no other server: it stays there", self.job_id_of(sub));
        }
        self.send_control(sub, si, bytemuck::bytes_of(&Boundary::new(next_op)))?;
        self.subs[sub].leave[si] = if elsewhere { Leave::Awaiting { next_op } } else { Leave::Stays };
        Ok(())
    }

    /// The draining server `si` names the switch operation `k`.
    pub(super) fn on_switch(&mut self, sub: usize, si: usize, k: u64) -> Result<(), ClientError> {
        let server = self.cfg.servers[si].clone();
        match self.subs[sub].leave[si] {
            Leave::Awaiting { next_op } if k != Boundary::STAY && k < next_op => {
                return Err(ClientError::Refused {
                    server,
                    reject: format!("switch at operation {k}, before this rank's boundary {next_op}"),
                });
            }
            Leave::Awaiting { .. } | Leave::Stays => {}
            other => return Err(ClientError::Refused { server, reject: format!("unexpected switch while {other:?}") }),
        }
        if k == Boundary::STAY {
            log::info!("server {server} drains; job {:#x} stays on it (a rank has no other server)", self.job_id_of(sub));
            self.subs[sub].leave[si] = Leave::Stays;
        } else {
            log::info!(
                "server {server} draining: moving its shards of job {:#x} to the other servers from operation {k}",
                self.job_id_of(sub)
            );
            self.subs[sub].leave[si] = Leave::At(k);
            self.subs[sub].retiring = true;
        }
        if !self.subs[sub].holding() {
            for oi in 0..self.ops.len() {
                if self.ops[oi].sub == sub && !self.ops[oi].planned {
                    self.plan(oi)?;
                }
            }
        }
        self.retire(sub)?;
        self.pump_due = true;
        self.pump()
    }

    /// Says Bye to (and closes) each server the sub-job left whose last
    /// operation on this rank completed.
    pub(super) fn retire(&mut self, sub: usize) -> Result<(), ClientError> {
        let mut still = false;
        for si in 0..self.subs[sub].leave.len() {
            let Leave::At(k) = self.subs[sub].leave[si] else { continue };
            if self.subs[sub].controls[si].is_none() {
                continue;
            }
            if self.subs[sub].started < k || self.ops.iter().any(|o| o.sub == sub && o.index < k) {
                still = true;
                continue;
            }
            // Failing to say it is not this rank's problem: the server then
            // fails the job on itself, which no longer matters to anyone.
            let _ = self.send_control(sub, si, bytemuck::bytes_of(&wire::Header::new(Kind::Bye)));
            self.subs[sub].controls[si] = None;
            log::debug!("left server {} (job {:#x}) after operation {}", self.cfg.servers[si], self.job_id_of(sub), k.saturating_sub(1));
        }
        self.subs[sub].retiring = still;
        Ok(())
    }

    /// Writes a whole small message on a (non-blocking) control connection.
    pub(super) fn send_control(&mut self, sub: usize, si: usize, bytes: &[u8]) -> Result<(), ClientError> {
        let Some(c) = self.subs[sub].controls[si].as_mut() else { return Ok(()) };
        let _ = c.set_nonblocking(false);
        let r = c.write_all(bytes);
        let _ = c.set_nonblocking(true);
        r.map_err(|e| ClientError::Connect { server: self.cfg.servers[si].clone(), error: e.to_string() })
    }

    pub(super) fn job_id_of(&self, sub: usize) -> u64 {
        let s = &self.subs[sub];
        if sub == 0 {
            self.cfg.job_id
        } else {
            self.sub_job_id(s.dtype, s.op)
        }
    }

    /// The server job of this communicator for (dtype, op) when it is not
    /// the first pair: derived with the job's secret (`wire::derive_job_id`).
    pub(super) fn sub_job_id(&self, dtype: DataType, op: ReduceOp) -> u64 {
        wire::derive_job_id(self.cfg.job_id, &self.cfg.job_secret, &[b'd', dtype as u8, b'o', op as u8])
    }
}

/// A server's message on a job's control connection, other than a reject.
pub(super) enum Control {
    /// A heartbeat (see [`liveness`]).
    Alive,
    Drain,
    SwitchAt(u64),
    /// The server is gone (or ended the job there): fail over, if possible.
    Gone(String),
    /// The recovery's leader: ranks lost these servers.
    Failover(u64),
    /// The recovery's leader: every rank's report, and the switch operation.
    Recover {
        dead: u64,
        switch_op: u64,
        reports: Vec<u8>,
    },
}
