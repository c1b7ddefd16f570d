//! The server's side of failover: a rank's `Lost` report, relayed to every
//! rank until all reported the same set (the leader's `Recover`), the
//! rejoin of a restarted server, and fencing a job whose ranks dropped this
//! server while it was frozen.
use super::round_budget::{RoundBudget, ROUND_BURST, ROUND_EVERY};
use super::{ControlPlane, JobDrain, JobRecovery, Phase};
use crate::wire::{self, Header, Kind, RejectCode};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl ControlPlane {
    /// A rank lost other servers of job `conn`'s job and takes this server
    /// as the recovery's leader.
    pub(super) fn lost(&mut self, conn: u64, dead: u64, boundary: u64, report: Vec<u8>) {
        let Some(&job_id) = self.conn_job.get(&conn) else { return };
        let Some(i) = self.active_of(conn) else { return };
        let a = self.active[i].as_mut().unwrap();
        let Some(rank) = a.conns.iter().find(|c| c.id == conn).map(|c| c.rank as usize) else { return };
        if a.phase != Phase::Running {
            return;
        }
        let now = Instant::now();
        if a.recovery.is_none() && !a.rounds.take_round(now) {
            let msg = format!(
                "rank {rank} started more recovery rounds than servers can be lost ({ROUND_BURST} at once, then one every {ROUND_EVERY:?})"
            );
            log::warn!("job {job_id:#x}: {msg}; ending the job");
            self.end(i, RejectCode::JobFailed, &msg);
            return;
        }
        let nranks = a.spec.nranks as usize;
        let r = a.recovery.get_or_insert_with(|| JobRecovery { dead: 0, reports: vec![None; nranks] });
        if dead & !r.dead != 0 {
            // News: a new round. Every rank hears the whole set and reports it.
            r.dead |= dead;
            r.reports.iter_mut().for_each(|x| *x = None);
            if quiet_line(&mut a.rounds, job_id, now) {
                log::warn!("job {job_id:#x}: rank {rank} lost servers {:#x}; the job recovers on the others (led here)", r.dead);
            }
            let msg = wire::Failover::new(r.dead);
            for c in &a.conns {
                if !a.done[c.rank as usize] {
                    if let Err(e) = self.net.send(c.id, bytemuck::bytes_of(&msg)) {
                        log::warn!("job {job_id:#x}: cannot tell rank {} at {} of the failover: {e}", c.rank, c.peer);
                    }
                }
            }
        }
        if dead != r.dead {
            return; // an older view; the rank reports again after the Failover
        }
        r.reports[rank] = Some((boundary, report));
        self.recover_if_all_reported(i, now);
    }

    /// Once every rank of job `i` reported its recovery's set: the
    /// `Recover` (the switch point and every report) to every rank.
    fn recover_if_all_reported(&mut self, i: usize, now: Instant) {
        let a = self.active[i].as_mut().unwrap();
        let job_id = a.job_id;
        let r = a.recovery.as_ref().expect("a round runs");
        let mut k = 0u64;
        let mut len = None;
        for (rk, x) in r.reports.iter().enumerate() {
            match x {
                Some((b, rep)) => {
                    k = k.max(*b);
                    if *len.get_or_insert(rep.len()) != rep.len() {
                        let msg = format!("ranks sent recovery reports of different lengths ({} and {})", len.unwrap(), rep.len());
                        log::warn!("job {job_id:#x}: {msg}");
                        self.end(i, RejectCode::JobFailed, &msg);
                        return;
                    }
                }
                None if a.done[rk] => {
                    // It finished and left: it cannot take part in a redo.
                    let msg = format!("rank {rk} had finished and left when the job lost servers {:#x}", r.dead);
                    log::warn!("job {job_id:#x}: {msg}");
                    self.end(i, RejectCode::JobFailed, &msg);
                    return;
                }
                None => return,
            }
        }
        let (len, nranks) = (len.unwrap_or(0), r.reports.len());
        let mut msg = Vec::with_capacity(32 + nranks * len);
        msg.extend_from_slice(bytemuck::bytes_of(&wire::Recover::new(r.dead, k, nranks as u32, len as u32)));
        for (_, rep) in r.reports.iter().flatten() {
            msg.extend_from_slice(rep);
        }
        let dead = r.dead;
        if quiet_line(&mut a.rounds, job_id, now) {
            log::info!("job {job_id:#x}: every rank reported losing servers {dead:#x}; switching at operation {k}");
        }
        // The round is over: the next starts from what the ranks report
        // then. Kept, this set outlived the servers' return: a server lost,
        // taken back, and a later loss of another made this leader tell
        // every rank to lose both (on the device's soak each freeze or cut
        // took back every server frozen or cut before it once more).
        // Every rank reported this set, and reports a set only once, so no
        // report of this round can come after.
        a.recovery = None;
        for c in &a.conns {
            if let Err(e) = self.net.send(c.id, &msg) {
                log::warn!("job {job_id:#x}: cannot send the recovery to rank {} at {}: {e}", c.rank, c.peer);
            }
        }
    }

    /// A rejoined job: ask every rank where it can take this server back.
    pub(super) fn tell_rejoin(&mut self, i: usize) {
        let Some(a) = self.active[i].as_mut() else { return };
        a.drain = Some(JobDrain { boundaries: vec![None; a.spec.nranks as usize], switch_at: None, rejoin: true });
        let msg = Header::new(Kind::Rejoin);
        for c in &a.conns {
            if let Err(e) = self.net.send(c.id, bytemuck::bytes_of(&msg)) {
                log::warn!("job {:#x}: cannot ask rank {} at {} where it rejoins: {e}", a.job_id, c.rank, c.peer);
            }
        }
    }

    /// A rank rejoins job `i`, which still runs here: its ranks declared
    /// this server lost (it was frozen, hung or cut off while they moved
    /// on), so what runs here is stale. End it (its results carry its tag,
    /// which no rank receives on any more; its regions come back once its
    /// lcores let go), so that the rejoin is admitted as for a restarted server.
    pub(super) fn fence(&mut self, i: usize, rank: u32, peer: SocketAddr) {
        let Some(a) = self.active[i].as_ref() else { return };
        log::warn!(
            "job {:#x}: rank {rank} rejoins it from {peer} while it still runs here: its ranks declared this server lost \
             (it was frozen, hung or cut off); fencing the stale job and taking the job back",
            a.job_id
        );
        self.counters.jobs_fenced.fetch_add(1, Ordering::Relaxed);
        self.end(i, RejectCode::JobFailed, "fenced: the job's ranks declared this server lost and are taking it back");
    }
}

/// Whether job `job_id`'s next recovery line goes to the log
/// ([`RoundBudget::line`]); first, how many were held back before it.
fn quiet_line(rounds: &mut RoundBudget, job_id: u64, now: Instant) -> bool {
    let l = rounds.line(now);
    if l.held > 0 {
        log::warn!("job {job_id:#x}: {} more recovery lines not logged (its ranks report losses faster than they are logged)", l.held);
    }
    l.line
}
