//! Jobs on a shard, outside the per-chunk path: adding one (its receives
//! posted), failing, draining and forgetting it, the housekeeping tick
//! (straggler and drain timeouts), commands from the control plane, and
//! posts retried after EAGAIN.
use super::{
    finished_message, per_slot, Command, Event, Job, JobOnShard, ShardWorker, Slot, SplitPart, State, DRAIN_TIMEOUT, HOUSEKEEPING_EVERY,
};
use crate::wire::SPLIT_MAX_RANKS;
use std::time::Instant;

impl ShardWorker {
    pub(super) fn add_job(&mut self, on: JobOnShard) {
        let ji = on.index as usize;
        let tag = on.tag;
        // The block is this job's from here, failed start or not: the
        // job-end line (`RoundSummary` over every lcore's block) and
        // `/metrics` read it, and a start that fails below must not show
        // the previous occupant's rounds as its own. This lcore is the
        // block's only writer; a scrape may briefly see a half-reset block,
        // which is harmless for counters.
        if ji < self.metrics.max_jobs {
            self.metrics.job(self.lcore, ji).reset(on.spec.job_id);
        }
        let mut peers = Vec::with_capacity(on.client_names.len());
        for name in &on.client_names {
            match self.ep.insert_peer(name) {
                Ok(a) => peers.push(a),
                Err(e) => {
                    for p in &peers {
                        let _ = self.ep.remove_peer(*p);
                    }
                    // The control plane holds names to the server's form
                    // (`names.rs`); a refusal past it still names the cause.
                    let own = self.ep.name().ok();
                    let why = crate::dataplane::fabric::names::insert_refused(self.ep.provider(), own.as_ref(), name, &e, "the client's");
                    let _ = self.events.send(Event::JobFailed { lcore: self.lcore, tag, reason: format!("cannot reach a client: {why}") });
                    let _ = self.events.send(Event::JobEnded { lcore: self.lcore, tag, stuck: 0 });
                    return;
                }
            }
        }
        // A split job's split slots follow its window of slots, with the
        // same sequences (its split stream cycles through them alike).
        let rounds = if on.split.is_some() { 2 } else { 1 };
        let slots: Vec<Slot> = (0..rounds * on.spec.window).map(|i| Slot { seq: i % on.spec.window, ..Default::default() }).collect();
        let window = on.spec.window as usize;
        let len = window * per_slot(&on) * on.stride;
        let split_fits = on.split.as_ref().is_none_or(|sp| {
            sp.base + sp.shared.area_len(sp.position) <= self.slab.len()
                && on.spec.nranks <= SPLIT_MAX_RANKS
                && slots.len() as u32 * on.spec.nranks * 2 <= self.per_job
        });
        if on.base + len > self.slab.len() || on.stride < on.spec.piece_bytes() || ji >= self.jobs.len() || !split_fits {
            let reason = match split_fits {
                true => "job region outside the slab",
                false => "split area outside the slab, or split slots beyond the job's operation contexts",
            };
            let _ = self.events.send(Event::JobFailed { lcore: self.lcore, tag, reason: reason.into() });
            let _ = self.events.send(Event::JobEnded { lcore: self.lcore, tag, stuck: 0 });
            return;
        }
        // SAFETY: base + len <= slab length, checked just above.
        let region = unsafe { self.slab.as_ptr().add(on.base) };
        let words_per_slot = (on.spec.nranks as usize).div_ceil(64);
        let arrived_bits = vec![0u64; slots.len() * words_per_slot];
        let gone = vec![false; on.spec.nranks as usize];
        let split = on.split.as_ref().map(|sp| {
            // SAFETY: base + area_len <= slab length, checked above.
            let area = unsafe { self.slab.as_ptr().add(sp.base) };
            sp.shared.publish_area(sp.position, area);
            SplitPart { shared: sp.shared.clone(), position: sp.position, area, ranks: sp.shared.ranks(sp.position) }
        });
        let nslots = slots.len();
        self.jobs[ji] = Some(Job {
            on,
            region,
            peers,
            slots,
            state: State::Running,
            outstanding: 0,
            arrived_bits,
            words_per_slot,
            gone,
            finished: None,
            split,
            heard: 0,
            drain_deadline: None,
        });
        for slot in 0..nslots {
            if let Err(e) = self.post_slot_receives(ji, slot) {
                self.fail(ji, format!("posting receives: {e}"));
                return;
            }
        }
        let _ = self.events.send(Event::JobReady { lcore: self.lcore, tag });
    }

    /// Stops serving a job: cancel what is in flight, tell the control plane.
    /// Cold path (a job failing), so it may allocate and send events.
    pub(super) fn fail(&mut self, ji: usize, reason: String) {
        if let Some(job) = self.jobs[ji].as_mut() {
            if job.state == State::Running {
                let _ = self.events.send(Event::JobFailed { lcore: self.lcore, tag: job.on.tag, reason });
            }
        }
        self.drain(ji);
    }

    pub(super) fn drain(&mut self, ji: usize) {
        let Some(job) = self.jobs[ji].as_mut() else { return };
        if job.state != State::Running {
            return;
        }
        job.state = State::Draining;
        job.drain_deadline = Some(std::time::Instant::now() + DRAIN_TIMEOUT);
        let base = ji as u32 * self.per_job;
        let span = job.span();
        for ctx in base..base + span {
            self.ep.cancel(ctx);
        }
        self.retry.retain(|&c| c / self.per_job != ji as u32);
        self.maybe_finish_drain(ji);
    }

    pub(super) fn maybe_finish_drain(&mut self, ji: usize) {
        let done = matches!(&self.jobs[ji], Some(j) if j.state == State::Draining && j.outstanding == 0);
        // An abandoned job whose stuck operations the provider finally
        // returned (e.g. a dead peer's connection failed at last): its
        // context ids and region are quiet now, so the slot may be reused.
        let released = matches!(&self.jobs[ji], Some(j) if j.state == State::Abandoned && j.outstanding == 0);
        if released {
            let job = self.jobs[ji].take().unwrap();
            if self.ep.provider() != "shm" {
                for p in &job.peers {
                    let _ = self.ep.remove_peer(*p);
                }
            }
            let _ = self.events.send(Event::JobReleased { lcore: self.lcore, tag: job.on.tag });
            return;
        }
        if done {
            let job = self.jobs[ji].take().unwrap();
            // shm (1.17) crashes in its next progress call after fi_av_remove
            // of a peer it has talked to; there the entries stay (shm's AV
            // holds up to 256 peers, so a shm server serves that many ranks
            // over its lifetime). Other providers forget the job's ranks.
            if self.ep.provider() != "shm" {
                for p in &job.peers {
                    let _ = self.ep.remove_peer(*p);
                }
            }
            let _ = self.events.send(Event::JobEnded { lcore: self.lcore, tag: job.on.tag, stuck: 0 });
        }
    }

    /// Sends to a rank whose process is gone: tcp;ofi_rxm never returns
    /// them; it drops them when it closes the failed connection, after which
    /// nothing reads the region or completes them. When every operation a
    /// stopped job still has out is such a send, they are forgotten and the
    /// job's region and slot can be reused (otherwise a server runs out of
    /// job slots after max_jobs rank deaths). The ranks stay in the AV:
    /// removing a peer with sends queued crashes rxm 1.17 later. Anything
    /// else (a rank alive but unreachable, whose sends may still complete;
    /// shm, which never drops them) keeps waiting. True if forgotten.
    pub(super) fn forget_sends_to_gone_ranks(&mut self, ji: usize) -> bool {
        let Some(job) = self.jobs[ji].as_ref() else { return false };
        if self.ep.provider() == "shm" || job.state == State::Running {
            return false;
        }
        let (base, n) = (ji as u32 * self.per_job, job.on.spec.nranks);
        let span = job.span();
        let only_to_gone = (base..base + span).filter(|&c| self.ep.is_in_flight(c)).all(|c| {
            let local = c - base;
            local & 1 == 1 && job.gone[((local >> 1) % n) as usize]
        });
        if !only_to_gone {
            return false;
        }
        let forgotten = self.ep.forget(base..base + span);
        log::warn!(
            "lcore {}: job {:#x}: {forgotten} send(s) to ranks whose connections failed were dropped by the provider; the job's region is free",
            self.lcore,
            job.on.spec.job_id
        );
        true
    }

    /// Reports draining jobs whose operations did not all complete in time.
    /// The job stays in the table (its context ids are still in flight), in
    /// `Abandoned` state, so the slot is not reused on this lcore until the
    /// provider returns those operations (then `JobReleased`).
    ///
    /// shm completes an endpoint's sends in order (see `fabric::endpoint`):
    /// a send to a rank that vanished without taking it blocks every later
    /// send of this lcore for good, and the endpoint then refuses sends. The
    /// jobs still running here could never complete a round again, so they
    /// fail now, saying why, rather than hang until their clients time out;
    /// jobs admitted later fail at their first result.
    pub(super) fn expire_drains(&mut self) {
        let now = std::time::Instant::now();
        let mut blocked_by = None;
        for ji in 0..self.jobs.len() {
            let Some(job) = self.jobs[ji].as_mut() else { continue };
            if job.state == State::Draining && job.drain_deadline.is_some_and(|d| now >= d) {
                job.state = State::Abandoned;
                let base = ji as u32 * self.per_job;
                let span = job.span();
                let sends = self.ep.abandon(base..base + span);
                log::warn!(
                    "lcore {}: job {:#x}: {} operation(s) not returned by the provider {:?} after the drain began ({sends} sends, {} receives)",
                    self.lcore,
                    job.on.spec.job_id,
                    job.outstanding,
                    DRAIN_TIMEOUT,
                    job.outstanding.saturating_sub(sends)
                );
                if sends > 0 && self.ep.sends_blocked() {
                    blocked_by.get_or_insert(job.on.spec.job_id);
                }
                if self.forget_sends_to_gone_ranks(ji) {
                    let tag = self.jobs[ji].take().map(|j| j.on.tag).unwrap_or(0);
                    let _ = self.events.send(Event::JobEnded { lcore: self.lcore, tag, stuck: 0 });
                    continue;
                }
                let Some(job) = self.jobs[ji].as_ref() else { continue };
                let _ = self.events.send(Event::JobEnded { lcore: self.lcore, tag: job.on.tag, stuck: job.outstanding });
            }
        }
        if let Some(job_id) = blocked_by {
            let reason = format!(
                "results sent to a vanished rank of job {job_id:#x} were never taken, and {} completes an endpoint's sends in order, \
                 so this lcore cannot complete any send any more (restart the server)",
                self.ep.provider()
            );
            for ji in 0..self.jobs.len() {
                if matches!(&self.jobs[ji], Some(j) if j.state == State::Running) {
                    self.fail(ji, reason.clone());
                }
            }
        }
    }

    /// Fails running jobs with a slot whose first piece has waited longer
    /// than `op_timeout` for the rest, naming the ranks that did not send.
    pub(super) fn expire_stragglers(&mut self, now: Instant) {
        for ji in 0..self.jobs.len() {
            let Some(job) = self.jobs[ji].as_ref() else { continue };
            if job.state != State::Running {
                continue;
            }
            let n = job.on.spec.nranks as usize;
            let late = |since: Option<Instant>| since.is_some_and(|t| now.duration_since(t) > self.op_timeout);
            // A split slot whose group is in waits for the other groups five
            // housekeeping ticks longer: an lcore that has part of its group
            // names the silent ranks exactly, and should go first (a CI run
            // met the two lcores' checks in the other order).
            let later = |since: Option<Instant>| since.is_some_and(|t| now.duration_since(t) > self.op_timeout + 5 * HOUSEKEEPING_EVERY);
            // A slot waiting for pieces (some ranks sent, others did not), or
            // for ranks to take their results (a rank or its link vanished).
            // (A split slot waits for its group, then for the other groups.)
            let waiting =
                job.slots.iter().enumerate().find(|(i, s)| {
                    s.arrived > 0 && ((s.arrived < job.expected(*i) && late(s.first)) || (s.combine_wait && later(s.first)))
                });
            let taking = job.slots.iter().enumerate().find(|(_, s)| s.sends_left > 0 && late(s.sending_since));
            let (slot, s, sending) = match (waiting, taking) {
                (Some((i, s)), _) => (i, s, false),
                (None, Some((i, s))) => (i, s, true),
                (None, None) => continue,
            };
            if s.combine_wait {
                let mine = job.split_of(slot).map_or(0..0, |sp| sp.ranks.clone());
                let msg = format!(
                    "straggler: ranks {}-{} (this lcore's group) sent slot {slot} (seq {}), but the other lcores' groups of ranks did not all send within the op timeout of {:?}",
                    mine.start,
                    mine.end.saturating_sub(1),
                    s.seq,
                    self.op_timeout
                );
                self.fail(ji, msg);
                continue;
            }
            let w = job.words_per_slot;
            let bits = &job.arrived_bits[slot * w..(slot + 1) * w];
            // Waiting: ranks whose bit is clear sent nothing. Taking: ranks
            // whose bit is still set have not taken their result.
            // Staged, a waiting slot has only ranks next..next + stage
            // posted: later ranks' pieces may be waiting at the provider.
            let ranks = match (job.split_of(slot), job.on.stage as usize) {
                (Some(sp), _) => sp.ranks.start as usize..sp.ranks.end as usize,
                (None, b) if b > 0 && !sending => s.next as usize..(s.next as usize + b).min(n),
                _ => 0..n,
            };
            let who: Vec<usize> = ranks.filter(|r| (bits[r / 64] & (1 << (r % 64)) != 0) == sending).collect();
            let shown: Vec<String> = who.iter().take(8).map(|r| r.to_string()).collect();
            let more = if who.len() > 8 { format!(" and {} more", who.len() - 8) } else { String::new() };
            let ranks = format!("rank{} {}{more}", if who.len() == 1 { "" } else { "s" }, shown.join(", "));
            let msg = if sending {
                format!(
                    "straggler: {ranks} did not take the result of slot {slot} (seq {}) within the op timeout of {:?}",
                    s.seq, self.op_timeout
                )
            } else {
                format!(
                    "straggler: {ranks} sent nothing for slot {slot} (seq {}) within the op timeout of {:?}, while {} of {} ranks{} had",
                    s.seq,
                    self.op_timeout,
                    s.arrived,
                    job.expected(slot),
                    if job.split_of(slot).is_some() { " of this lcore's group" } else { "" }
                )
            };
            self.fail(ji, msg);
        }
    }

    /// Cold work, on a clock rather than per chunk: control-plane commands,
    /// drains past their deadline, stragglers past the op timeout.
    pub(super) fn housekeeping(&mut self) {
        let now = Instant::now();
        if now < self.next_housekeeping {
            return;
        }
        self.next_housekeeping = now + HOUSEKEEPING_EVERY;
        if self.stall_at.is_some_and(|t| now >= t) {
            log::warn!("lcore {}: fault injection (TALLY_FAULT_STALL): blocking for good, as inside a provider call", self.lcore);
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        self.check_commands();
        self.expire_drains();
        self.expire_stragglers(now);
        self.sweep();
        self.trim_after_sweep();
    }

    pub(super) fn check_commands(&mut self) {
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::AddJob(on) => self.add_job(*on),
                Command::EndJob { index } => self.drain(index as usize),
                Command::RankGone { index, rank } => {
                    let ji = index as usize;
                    let Some(job) = self.jobs.get_mut(ji).and_then(Option::as_mut) else { continue };
                    if let Some(g) = job.gone.get_mut(rank as usize) {
                        *g = true;
                    }
                    // A job already given up on may be releasable now.
                    if job.state == State::Abandoned && self.forget_sends_to_gone_ranks(ji) {
                        let tag = self.jobs[ji].take().map(|j| j.on.tag).unwrap_or(0);
                        let _ = self.events.send(Event::JobReleased { lcore: self.lcore, tag });
                    }
                }
                Command::RankFinished { index, rank } => {
                    let ji = index as usize;
                    let Some(job) = self.jobs.get_mut(ji).and_then(Option::as_mut) else { continue };
                    job.finished.get_or_insert(rank);
                    // Every round the rank took part in was complete before
                    // it could say Bye, so a round begun but not complete is
                    // one it will never join. (Later ones fail at their
                    // first piece.) Not so in a relay job: a rank is done
                    // once the other's piece came back and its own send
                    // completed, which may be before this lcore took that
                    // piece in; there a round begun is left to finish (or
                    // to the op timeout).
                    let partial = job.slots.iter().enumerate().any(|(i, s)| s.arrived > 0 && s.arrived < job.expected(i));
                    if job.state == State::Running && partial && !job.on.spec.relay {
                        self.fail(ji, finished_message(rank));
                    }
                }
            }
        }
    }

    pub(super) fn retry_posts(&mut self) {
        // Work through the list while posting refills `retry`; both vectors
        // have the context table's capacity, so neither ever grows.
        std::mem::swap(&mut self.retry, &mut self.retrying);
        // Once the provider refused a receive, the rest of this pass's
        // receives would be refused too: rxm queues a fixed number per
        // endpoint (2048 in 1.17), so a job past it (1024 ranks at window 4)
        // had every refused receive retried on every turn, thousands of
        // failing calls before each poll. They keep their order and are
        // tried again next turn.
        let mut recv_full = false;
        for i in 0..self.retrying.len() {
            let ctx = self.retrying[i];
            let is_recv = (ctx % self.per_job) & 1 == 0;
            if recv_full && is_recv {
                self.retry.push(ctx);
                continue;
            }
            let queued = self.retry.len();
            if let Err(e) = self.post(ctx) {
                let ji = (ctx / self.per_job) as usize;
                self.fail(ji, format!("posting: {e}"));
            }
            recv_full |= is_recv && self.retry.len() > queued;
        }
        self.retrying.clear();
    }
}
