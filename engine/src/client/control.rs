//! What arrives on a sub-job's control connections between all-reduces:
//! the server ending the job, heartbeats (liveness), failover's messages
//! and drains. This file reads them ([`read`]) and keeps the drain
//! protocol; the client (`mod.rs`, `check_controls`) hands each message to
//! its handler: a drain here, a loss or a recovery to failover.
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
use super::error::ClientError;
use super::state::{Core, Leave};
use crate::wire::{self, Boundary, Drain, Kind, Reject, SwitchAt};
use std::io::Read;
use std::time::Instant;

/// Server `si` of sub-job `sub`, armed, silent past the liveness time
/// (everything it sent has just been read): why it is lost, as if its
/// connection had closed (the client hands that to failover). Only asked
/// for servers of jobs that can fail over, not lost yet (see [`liveness`]).
///
/// [`liveness`]: super::liveness
pub(super) fn silence(c: &mut Core, sub: usize, si: usize) -> Option<String> {
    let s = &c.subs[sub];
    if c.cfg.liveness.is_zero() || s.controls[si].is_none() {
        return None;
    }
    let silent = s.live.overdue(si, c.cfg.liveness, Instant::now())?;
    c.subs[sub].live.disarm(si);
    Some(format!(
        "no heartbeat for {:.1} s (liveness {:.1} s, TALLY_LIVENESS_MS): frozen, hung or cut off",
        silent.as_secs_f64(),
        c.cfg.liveness.as_secs_f64()
    ))
}

/// The next whole message on a control connection, if one has arrived
/// (peeked first: a message is taken only once all of it is there). Where
/// the sub-job `fails_over`, a server that closed or ended the job is
/// [`Control::Gone`], else an error.
pub(super) fn read(c: &mut Core, sub: usize, si: usize, fails_over: bool) -> Result<Option<Control>, ClientError> {
    let server = || c.cfg.servers[si].clone();
    let Some(conn) = c.subs[sub].controls[si].as_mut() else { return Ok(None) };
    let mut b = [0u8; core::mem::size_of::<Reject>()];
    let n = match conn.peek(&mut b) {
        Ok(0) if fails_over => return Ok(Some(Control::Gone("it closed the job's connection".into()))),
        Ok(0) => return Err(ClientError::Refused { server: server(), reject: "the server closed the job's connection".into() }),
        Ok(n) => n,
        Err(e) if fails_over && e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::Interrupted => {
            return Ok(Some(Control::Gone(format!("its control connection failed: {e}"))));
        }
        Err(_) => return Ok(None),
    };
    if n < core::mem::size_of::<wire::Header>() {
        return Ok(None);
    }
    let bad = |e: String| ClientError::Fabric(format!("control message from {}: {e}", c.cfg.servers[si]));
    let kind = wire::read::<wire::Header>(&b).and_then(|h| h.check()).map_err(|e| bad(e.to_string()))?;
    let need = kind.server_message_bytes().ok_or_else(|| bad(format!("unexpected {kind:?}")))?;
    if n < need {
        return Ok(None);
    }
    conn.read_exact(&mut b[..need]).map_err(|e| bad(e.to_string()))?;
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
            let _ = conn.set_nonblocking(false);
            let _ = conn.set_read_timeout(Some(c.cfg.timeout));
            let r = conn.read_exact(&mut reports);
            let _ = conn.set_nonblocking(true);
            r.map_err(|e| bad(format!("recovery reports: {e}")))?;
            Ok(Some(Control::Recover { dead: m.dead, switch_op: m.switch_op, reports }))
        }
        _ => {
            let r: Reject = wire::read(&b).map_err(|e| bad(e.to_string()))?;
            if fails_over {
                // The job may live on elsewhere: the server is lost to it.
                return Ok(Some(Control::Gone(format!("it ended the job: {r}"))));
            }
            Err(ClientError::Refused { server: server(), reject: r.to_string() })
        }
    }
}

/// Server `si` drains: answer where this rank can switch, and hold
/// operations uncut until the server names the switch.
pub(super) fn on_drain(c: &mut Core, sub: usize, si: usize) -> Result<(), ClientError> {
    let s = &c.subs[sub];
    if s.leave[si] != Leave::Serving {
        return Ok(());
    }
    // Only a server that does not drain itself can take the shards over.
    let elsewhere = (0..s.leave.len()).any(|o| o != si && s.leave[o] == Leave::Serving);
    let next_op = if elsewhere { c.first_uncut(sub) } else { Boundary::STAY };
    let server = &c.cfg.servers[si];
    if elsewhere {
        log::info!("server {server} drains: moving its shards of job {:#x} to the other servers at an operation boundary", s.job_id);
    } else {
        log::info!("server {server} drains, but job {:#x} has no other server: it stays there", s.job_id);
    }
    c.send_control(sub, si, bytemuck::bytes_of(&Boundary::new(next_op)))?;
    c.subs[sub].leave[si] = if elsewhere { Leave::Awaiting { next_op } } else { Leave::Stays };
    Ok(())
}

/// The draining server `si` names the switch operation `k`: from it on,
/// operations are cut without it. The client then cuts what it held
/// (`Client::on_switch`) and retires the server once its last operation
/// completed ([`retire`]).
pub(super) fn on_switch(c: &mut Core, sub: usize, si: usize, k: u64) -> Result<(), ClientError> {
    let server = c.cfg.servers[si].clone();
    let job = c.subs[sub].job_id;
    match c.subs[sub].leave[si] {
        Leave::Awaiting { next_op } if k != Boundary::STAY && k < next_op => {
            return Err(ClientError::Refused { server, reject: format!("switch at operation {k}, before this rank's boundary {next_op}") });
        }
        Leave::Awaiting { .. } | Leave::Stays => {}
        other => return Err(ClientError::Refused { server, reject: format!("unexpected switch while {other:?}") }),
    }
    if k == Boundary::STAY {
        log::info!("server {server} drains; job {job:#x} stays on it (a rank has no other server)");
        c.subs[sub].leave[si] = Leave::Stays;
    } else {
        log::info!("server {server} draining: moving its shards of job {job:#x} to the other servers from operation {k}");
        c.subs[sub].leave[si] = Leave::At(k);
        c.subs[sub].retiring = true;
    }
    Ok(())
}

/// Says Bye to (and closes) each server the sub-job left whose last
/// operation on this rank completed.
pub(super) fn retire(c: &mut Core, sub: usize) -> Result<(), ClientError> {
    let mut still = false;
    for si in 0..c.subs[sub].leave.len() {
        let Leave::At(k) = c.subs[sub].leave[si] else { continue };
        if c.subs[sub].controls[si].is_none() {
            continue;
        }
        if c.subs[sub].started < k || c.ops.iter().any(|o| o.sub == sub && o.index < k) {
            still = true;
            continue;
        }
        // Failing to say it is not this rank's problem: the server then
        // fails the job on itself, which no longer matters to anyone.
        let _ = c.send_control(sub, si, bytemuck::bytes_of(&wire::Header::new(Kind::Bye)));
        c.subs[sub].controls[si] = None;
        log::debug!("left server {} (job {:#x}) after operation {}", c.cfg.servers[si], c.subs[sub].job_id, k.saturating_sub(1));
    }
    c.subs[sub].retiring = still;
    Ok(())
}

/// A server's message on a job's control connection, other than a reject.
pub(super) enum Control {
    /// A heartbeat (see [`liveness`]).
    ///
    /// [`liveness`]: super::liveness
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
