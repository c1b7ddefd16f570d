//! A job's life after admission: its lcores ready, ranks saying Bye or
//! vanishing, the job ended (by a failure, an lcore, a timeout or its
//! ranks), and its slab regions freed once every lcore let go.
//!
//! # Jobs: admission, Bye, time limits
//!
//! A job is admitted when all its ranks sent matching handshakes (each answering its connection's
//! challenge with a proof of the token, a bad field refused by name, every rank bringing the secret
//! the first one brought: docs/security.md). It gets an index in every lcore's job table, a tag (a
//! rolling 16-bit count: `engine/src/control/mod.rs`), a random 32-bit sequence key (`wire::JobTag`:
//! a piece whose sequence does not carry it is dropped and counted, not the job's failure) and a region of `window x nranks x piece` bytes in each
//! lcore's slab (first fit). The server chooses the piece within the job's budget (a quarter of the
//! slab, at most its largest free range) and the ranks cut to the smallest granted: the module doc of
//! `engine/src/control/budget.rs` has the rule, why, and why results do not depend on the piece. A
//! job that does not fit even at 4 KiB pieces is refused (`no capacity`) with the most ranks that fit
//! at its window and the largest window at its ranks. `max_ranks` defaults to the wire's limit, 1024.
//!
//! A client that finishes sends `Bye`; a connection that closes without it fails the job at once for
//! every rank. A rank that said Bye takes part in no later round (every round it was in had completed
//! before it left), so a round begun after it, or begun and not complete when the lcore hears of it
//! (`Command::RankFinished`), fails the job at once naming that rank: ranks whose loops disagree on
//! the number of all-reduces get an error, not the op timeout (`tests/suites/timeouts.rs`); in a
//! relay job (a rank can be done before the lcore took its last piece in) only rounds begun later do.
//!
//! Time limits, each a configuration key and a `tally server` flag ending only the job concerned,
//! with a reject that says why: `handshake_timeout_s` (`--handshake-timeout`, default 10: a
//! connection without a complete Hello by then is told `timeout` and closed; until then it costs a
//! descriptor, a Hello-sized buffer and a place in the handshake table: Admission above,
//! `tests/suites/storm.rs`); `join_timeout_s` (`--join-timeout`, default 120, counted from the first
//! rank: a thousand-node job's ranks start over a minute or more); `op_timeout_s` (`--op-timeout`: a
//! straggler, `ShardWorker::expire_stragglers`, as the module doc of
//! `engine/src/dataplane/shard/mod.rs` says); `idle_timeout_s` (`--idle-timeout`, 0: never: a job
//! that moved no bytes for that long, `engine/src/control/mod.rs`). A client's own `timeout` bounds,
//! with its own error, an all-reduce that makes no progress (a server vanished, a link went down).
use super::{Active, ControlPlane, Phase, Quarantine, Tombstone, FAILED_JOB_REFUSED_FOR};
use crate::control::join::{accept_latency_lcores, refuse};
use crate::dataplane::metrics::RoundSummary;
use crate::dataplane::shard::Command;
use crate::wire::{self, Accept, Header, Kind, NameRecord, Reject, RejectCode};
use bytemuck::Zeroable;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl ControlPlane {
    /// The active job that control connection `conn` belongs to. (By
    /// connection, not job id: a fenced job and its rejoin share the id.)
    pub(super) fn active_of(&self, conn: u64) -> Option<usize> {
        self.active.iter().position(|a| a.as_ref().is_some_and(|a| a.conns.iter().any(|c| c.id == conn)))
    }

    pub(super) fn find(&mut self, tag: u16) -> Option<(usize, &mut Active)> {
        let i = self.active.iter().position(|a| a.as_ref().is_some_and(|a| a.tag == tag))?;
        self.active[i].as_mut().map(|a| (i, a))
    }

    pub(super) fn ready(&mut self, _lcore: usize, tag: u16) {
        let names = self.names.clone();
        let Some((i, _)) = self.find(tag) else { return };
        let a = self.active[i].as_mut().expect("found");
        a.ready += 1;
        if a.phase != Phase::Starting || a.ready < a.spec.shards {
            return;
        }
        a.phase = Phase::Running;
        let mut msg = Vec::new();
        let acc = Accept {
            header: Header::new(Kind::Accept),
            job_tag: tag,
            latency_lcores: accept_latency_lcores(self.latency_lcores, a.spec.shards),
            latency_max_log2: self.latency_max_log2,
            lcores: a.spec.shards,
            server_lcores: names.len() as u32,
            piece_elems: a.spec.chunk_elems,
            seq_key: a.key,
            heartbeat_ms: self.heartbeat.map_or(0, |d| d.as_millis().clamp(1, u32::MAX as u128) as u32),
        };
        msg.extend_from_slice(bytemuck::bytes_of(&acc));
        for n in names.iter().take(a.spec.shards as usize) {
            let rec = NameRecord::new(n.as_bytes()).unwrap_or_else(NameRecord::zeroed);
            msg.extend_from_slice(bytemuck::bytes_of(&rec));
        }
        for c in &a.conns {
            if let Err(e) = self.net.send(c.id, &msg) {
                log::warn!("job {:#x}: cannot send the accept to rank {} at {}: {e}", a.job_id, c.rank, c.peer);
            }
        }
        let took = a.first_join.elapsed();
        self.counters.record_join_to_running(took.as_nanos() as u64);
        log::info!("job {:#x}: running, {:.1?} after its first rank joined", a.job_id, took);
        if a.rejoin {
            // The ranks run it already: agree on the operation from which
            // they use this server again, as a drain does in reverse.
            self.tell_rejoin(i);
            return;
        }
        if self.draining.is_some() {
            // Admitted just before the drain began: it moves like the others.
            self.tell_drain(i);
        }
    }

    pub(super) fn end(&mut self, index: usize, code: RejectCode, why: &str) {
        let Some(a) = self.active[index].as_mut() else { return };
        if a.phase == Phase::Ending {
            return;
        }
        a.phase = Phase::Ending;
        self.dirty = true;
        let r = Reject::new(code, "", why);
        for c in &a.conns {
            let _ = self.net.send(c.id, bytemuck::bytes_of(&r));
            self.net.close(c.id);
        }
        for l in 0..a.spec.shards as usize {
            let _ = self.lcores[l].send(Command::EndJob { index: index as u16 });
        }
    }

    pub(super) fn failed(&mut self, lcore: usize, tag: u16, reason: &str) {
        let Some((i, a)) = self.find(tag) else { return };
        log::warn!("job {:#x} failed on lcore {lcore}: {reason}", a.job_id);
        self.end(i, RejectCode::JobFailed, &format!("lcore {lcore}: {reason}"));
    }

    pub(super) fn ended(&mut self, lcore: usize, tag: u16, stuck: u32) {
        let Some((i, a)) = self.find(tag) else { return };
        a.ended += 1;
        if stuck > 0 {
            a.stuck_lcores.push(lcore);
        }
        if a.phase != Phase::Ending {
            // An lcore gave the job up on its own (e.g. a client unreachable).
            a.phase = Phase::Ending;
        }
        if a.ended < a.spec.shards {
            return;
        }
        let a = self.active[i].take().unwrap();
        // Before the regions go back: the blocks stay the job's until the
        // index is reused, which needs this slot free.
        if let Some(r) = RoundSummary::of((0..a.spec.shards as usize).map(|l| self.metrics.job(l, i))) {
            log::info!("job {:#x}: {r}", a.job_id);
        }
        for (l, (off, len)) in a.regions.iter().enumerate() {
            if !a.stuck_lcores.contains(&l) {
                self.allocs[l].release(*off, *len);
            }
        }
        for c in &a.conns {
            self.conn_job.remove(&c.id);
        }
        if a.stuck_lcores.is_empty() {
            log::info!("job {:#x} ended; its slab regions are free", a.job_id);
        } else {
            let regions = a.stuck_lcores.iter().map(|&l| (l, a.regions[l].0, a.regions[l].1)).collect();
            self.quarantined[i] = Some(Quarantine { job_id: a.job_id, tag: a.tag, regions });
            let left = self.quarantined.iter().filter(|q| q.is_none()).count();
            log::warn!(
                "job {:#x} ended with operations to vanished ranks still in flight on lcores {:?}; their slab regions and job slot {i} stay quarantined until the provider returns them ({left} of {} job slots left)",
                a.job_id,
                a.stuck_lcores,
                self.quarantined.len()
            );
        }
        // After the quarantine: a slot it holds is not kept again as a room.
        self.job_left(i, &a.spec, &a.secret);
    }

    pub(super) fn released(&mut self, lcore: usize, tag: u16) {
        let Some(i) = self.quarantined.iter().position(|q| q.as_ref().is_some_and(|q| q.tag == tag)) else { return };
        let Some(q) = self.quarantined[i].as_mut() else { return };
        if let Some(k) = q.regions.iter().position(|r| r.0 == lcore) {
            let (l, off, len) = q.regions.swap_remove(k);
            self.allocs[l].release(off, len);
        }
        if q.regions.is_empty() {
            log::info!("job {:#x}: the provider returned its last stuck operations; job slot {i} is back in service", q.job_id);
            self.quarantined[i] = None;
        }
    }

    /// Tells every lcore of job `i` that `rank` is gone: what they still
    /// have queued to it will never be taken (see `ShardWorker`).
    pub(super) fn rank_gone(&self, i: usize, rank: u32) {
        let Some(a) = self.active[i].as_ref() else { return };
        for l in 0..a.spec.shards as usize {
            let _ = self.lcores[l].send(Command::RankGone { index: i as u16, rank });
        }
    }

    pub(super) fn bye(&mut self, conn: u64) {
        let Some(&job_id) = self.conn_job.get(&conn) else { return };
        let Some(i) = self.active_of(conn) else { return };
        let a = self.active[i].as_mut().unwrap();
        if let Some(c) = a.conns.iter().find(|c| c.id == conn) {
            a.done[c.rank as usize] = true;
        }
        if a.done.iter().all(|&d| d) && a.phase != Phase::Ending {
            if a.drain.as_ref().is_some_and(|d| !d.rejoin) {
                log::info!("job {job_id:#x}: every rank left this draining server; ending the job here");
            } else {
                log::info!("job {job_id:#x}: every rank finished; ending the job");
            }
            a.phase = Phase::Ending;
            for l in 0..a.spec.shards as usize {
                let _ = self.lcores[l].send(Command::EndJob { index: i as u16 });
            }
            return;
        }
        // The others must not start another all-reduce: the lcores fail the
        // job at once if they do, rather than at the op timeout. (Every round
        // this rank took part in was complete before it could say Bye.)
        if a.phase == Phase::Running {
            let rank = a.conns.iter().find(|c| c.id == conn).map(|c| c.rank);
            for (l, rank) in (0..a.spec.shards as usize).zip(std::iter::repeat(rank).flatten()) {
                let _ = self.lcores[l].send(Command::RankFinished { index: i as u16, rank });
            }
        }
        // A rank that finished counts as answered: it cuts no more operations.
        self.decide_switch(i);
    }

    pub(super) fn closed(&mut self, conn: u64) {
        let Some(job_id) = self.conn_job.remove(&conn) else { return };
        if let Some(p) = self.pending.get_mut(&job_id) {
            let Some(slot) = p.conns.iter_mut().find(|c| c.as_ref().is_some_and(|c| c.id == conn)) else { return };
            let c = slot.take().unwrap();
            let mut p = self.pending.remove(&job_id).unwrap();
            // The rank is gone (its process died, or its client gave up): the
            // job cannot start. Tell the ranks already in now, and the ones
            // still coming when they come, rather than keep them all until
            // the join timeout.
            let msg = format!("rank {} left (its connection closed) while the job was joining; the join failed", c.rank);
            log::warn!("job {job_id:#x}: {msg} for the {} ranks in", p.joined - 1);
            self.counters.joins_failed.fetch_add(1, Ordering::Relaxed);
            for other in p.conns.iter_mut().flatten() {
                self.conn_job.remove(&other.id);
                refuse(&mut self.net, other, RejectCode::JobFailed, "", &msg);
            }
            let now = Instant::now();
            self.failed_joins.retain(|_, t| t.until > now);
            self.failed_joins.insert(job_id, Tombstone { until: now + self.join_timeout, secret: p.secret, why: msg, rejoins: true });
            return;
        }
        if let Some(i) = self.active_of(conn) {
            let a = self.active[i].as_ref().unwrap();
            let rank = a.conns.iter().find(|c| c.id == conn).map_or(u32::MAX, |c| c.rank);
            if a.done.get(rank as usize).copied().unwrap_or(false) {
                return; // it said bye first: a clean departure
            }
            if a.phase != Phase::Ending {
                log::warn!("job {job_id:#x}: rank {rank} disconnected without finishing; failing the job");
                // Closed by the rank's side (we had not shut it down): the
                // rank's process, or at least its client, is gone.
                self.rank_gone(i, rank);
                let now = Instant::now();
                self.failed_joins.retain(|_, t| t.until > now);
                let why = format!("the job failed on this server: its rank {rank} disconnected without finishing");
                let secret = self.active[i].as_ref().map_or([0; wire::JOB_SECRET_BYTES], |a| a.secret);
                self.failed_joins.insert(job_id, Tombstone { until: now + FAILED_JOB_REFUSED_FOR, secret, why, rejoins: false });
            }
            self.end(i, RejectCode::JobFailed, &format!("rank {rank} disconnected without finishing"));
        }
    }

    pub(super) fn expire_pending(&mut self, now: Instant) {
        let expired: Vec<u64> = self.pending.iter().filter(|(_, p)| p.deadline <= now).map(|(k, _)| *k).collect();
        for id in expired {
            let mut p = self.pending.remove(&id).unwrap();
            let msg = format!("only {} of {} ranks joined within {:?}", p.joined, p.spec.nranks, self.join_timeout);
            log::warn!("job {id:#x} refused: {msg}");
            for c in p.conns.iter_mut().flatten() {
                self.conn_job.remove(&c.id);
                refuse(&mut self.net, c, RejectCode::Timeout, "", &msg);
            }
            self.dirty = true;
        }
    }

    /// Ends running jobs that moved no bytes for the idle timeout.
    pub(super) fn expire_idle(&mut self) {
        let Some(limit) = self.idle_timeout else { return };
        let now = Instant::now();
        if now < self.next_idle_check {
            return;
        }
        self.next_idle_check = now + Duration::from_secs(1).min(limit / 4);
        for i in 0..self.active.len() {
            let Some(a) = self.active[i].as_mut() else { continue };
            if a.phase != Phase::Running {
                continue;
            }
            let bytes: u64 = (0..a.spec.shards as usize).map(|l| self.metrics.job(l, i).bytes_in.load(Ordering::Relaxed)).sum();
            if bytes != a.seen_bytes {
                a.seen_bytes = bytes;
                a.last_traffic = now;
                continue;
            }
            if now.duration_since(a.last_traffic) < limit {
                continue;
            }
            let msg = format!("no traffic for {}s (idle_timeout_s); the job's slots are freed", limit.as_secs());
            log::warn!("job {:#x}: {msg}", a.job_id);
            self.end(i, RejectCode::Timeout, &msg);
        }
    }
}
