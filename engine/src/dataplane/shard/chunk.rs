//! The per-chunk path of a shard: posting a slot's receives, taking each
//! completion (a rank's piece in, a result out), reducing a slot once every
//! piece is in and sending the result to every rank. Nothing here
//! allocates, locks, makes a system call of its own or logs per chunk.
use super::*;

impl ShardWorker {
    /// Posts the operation a context id stands for (receive into its piece,
    /// or send of its slot's result). On EAGAIN it is queued for retry.
    pub(super) fn post(&mut self, context: u32) -> Result<(), String> {
        let (ji, local) = ((context / self.per_job) as usize, context % self.per_job);
        let Some(job) = self.jobs[ji].as_ref() else { return Ok(()) };
        if job.state != State::Running {
            return Ok(());
        }
        let n = job.on.spec.nranks;
        let (piece, is_send) = (local >> 1, local & 1 == 1);
        let (slot, rank) = ((piece / n) as usize, (piece % n) as usize);
        let s = job.slots[slot];
        if is_send && s.len as usize <= self.ep.inject_size() {
            let buf = job.send_ptr(slot, rank, s.len);
            let tag = Tag::new(job.on.tag, slot as u16, s.seq);
            // SAFETY: the buffer holds the reduced result (or the relayed
            // piece, received whole); inject copies it before returning.
            return match unsafe { self.ep.inject(buf, s.len as usize, job.peers[rank], tag.0) } {
                Ok(()) => {
                    self.injected_bytes += s.len as u64;
                    self.result_taken(ji, slot, rank);
                    Ok(())
                }
                Err(PostError::Again) => {
                    self.retry.push(context);
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            };
        }
        let r = if is_send {
            let buf = job.send_ptr(slot, rank, s.len);
            let tag = Tag::new(job.on.tag, slot as u16, s.seq);
            // SAFETY: the slot's result (piece 0, or the accumulator) or the
            // relayed piece is not written again until every send of this
            // round completed (the receives are reposted only then).
            unsafe { self.ep.send(buf, s.len as usize, Some(self.mh), job.peers[rank], tag.0, context) }
        } else {
            let buf = job.piece_ptr(slot, rank);
            let tag = Tag::new(job.on.tag, slot as u16, 0);
            // SAFETY: each (slot, rank) piece has exactly one receive in
            // flight, and nothing reads it until that receive completed.
            unsafe { self.ep.recv(buf, job.recv_len(slot), Some(self.mh), Some(job.peers[rank]), tag.0, Tag::SEQ_BITS, context) }
        };
        match r {
            Ok(()) => {
                self.jobs[ji].as_mut().unwrap().outstanding += 1;
                Ok(())
            }
            Err(PostError::Again) => {
                self.retry.push(context);
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    pub(super) fn post_slot_receives(&mut self, ji: usize, slot: usize) -> Result<(), String> {
        let (n, first) = self.jobs[ji].as_ref().map_or((0, 0..0), |j| (j.on.spec.nranks, j.first_posted(slot)));
        let base = ji as u32 * self.per_job;
        for rank in first {
            self.post(base + ((slot as u32 * n + rank) << 1))?;
        }
        Ok(())
    }

    /// Rank `rank` has its result of `slot` (its send completed, or went
    /// out by inject). After the last rank's, the slot starts its next round.
    pub(super) fn result_taken(&mut self, ji: usize, slot: usize, rank: usize) {
        let Some(job) = self.jobs[ji].as_mut() else { return };
        let s = &mut job.slots[slot];
        bump(&self.metrics.job(self.lcore, ji).bytes_out, s.len as u64);
        s.sends_left -= 1;
        // The piece bits now track which ranks still have to take their result.
        job.arrived_bits[slot * job.words_per_slot + rank / 64] &= !(1 << (rank % 64));
        let s = &mut job.slots[slot];
        if s.sends_left == 0 {
            s.sending_since = None;
            s.seq = s.seq.wrapping_add(job.on.spec.window);
            s.arrived = 0;
            s.next = 0;
            let w = job.words_per_slot;
            job.arrived_bits[slot * w..(slot + 1) * w].fill(0);
            if let Err(e) = self.post_slot_receives(ji, slot) {
                self.fail(ji, format!("reposting receives: {e}"));
            }
        }
    }

    pub(super) fn on_completion(&mut self, c: Completion, stats: &Counters) {
        let (ji, local) = ((c.context / self.per_job) as usize, c.context % self.per_job);
        let Some(job) = self.jobs.get_mut(ji).and_then(Option::as_mut) else {
            bump(&stats.errors, 1);
            return;
        };
        job.outstanding = job.outstanding.saturating_sub(1);
        if job.state != State::Running {
            self.maybe_finish_drain(ji);
            return;
        }
        let n = job.on.spec.nranks;
        let (piece, is_send) = (local >> 1, local & 1 == 1);
        let (slot, rank) = ((piece / n) as usize, (piece % n) as usize);
        if is_send {
            bump(&stats.bytes_out, job.slots[slot].len as u64);
            self.result_taken(ji, slot, rank);
            return;
        }
        bump(&stats.bytes_in, c.len as u64);
        bump(&self.metrics.job(self.lcore, ji).bytes_in, c.len as u64);
        let tag = Tag(c.tag);
        let s = job.slots[slot];
        let dsize = job.on.spec.dtype.size();
        let problem = if tag.job() != job.on.tag || tag.slot() as usize != slot {
            Some("a chunk carried another job's or slot's tag")
        } else if tag.seq() != s.seq {
            Some("a chunk arrived with an unexpected sequence number")
        } else if !c.len.is_multiple_of(dsize) {
            Some("a chunk's length is not a whole number of elements")
        } else if s.arrived > 0 && c.len as u32 != s.len {
            Some("ranks sent chunks of different lengths")
        } else {
            None
        };
        if let Some(p) = problem {
            let msg = format!("{p} (rank {rank}, slot {slot}, tag {:#x}, expected seq {}, length {})", c.tag, s.seq, c.len);
            self.fail(ji, msg);
            return;
        }
        job.arrived_bits[slot * job.words_per_slot + rank / 64] |= 1 << (rank % 64);
        if job.slots[slot].arrived == 0 {
            if let Some(done) = job.finished {
                self.fail(ji, finished_message(done));
                return;
            }
        }
        let is_split = job.split_of(slot).is_some();
        let s = &mut job.slots[slot];
        s.len = c.len as u32;
        if s.arrived == 0 {
            s.first = Some(Instant::now());
        }
        s.arrived += 1;
        if is_split {
            // A split slot: this lcore's group only; the last group in
            // combines (see `dataplane::split`).
            if job.slots[slot].arrived < job.expected(slot) {
                return;
            }
            let sp = job.split.as_ref().unwrap();
            let t0 = Instant::now();
            if wire::split_folds_groups(sp.shared.groups(), job.on.spec.dtype) {
                // The group's partial, before counting: the combiner reads
                // it once the count says this group is in.
                if let Err(e) = self.fold_group(ji, slot, c.len / dsize) {
                    self.fail(ji, e);
                    return;
                }
            }
            let job = self.jobs[ji].as_mut().unwrap();
            let sp = job.split.as_ref().unwrap();
            if !sp.shared.group_complete(slot - job.on.spec.window as usize) {
                job.slots[slot].combine_wait = true;
                self.split_waits += 1;
                bump(&self.metrics.job(self.lcore, ji).reduce_ns, t0.elapsed().as_nanos() as u64);
                return;
            }
            if let Err(e) = self.combine(ji, slot, c.len / dsize) {
                self.fail(ji, e);
                return;
            }
            bump(&self.metrics.job(self.lcore, ji).reduce_ns, t0.elapsed().as_nanos() as u64);
            self.send_results(ji, slot, Instant::now());
            return;
        }
        if job.on.spec.relays(c.len) {
            // Relay (two ranks, a small piece): it goes on to the other rank
            // now, which reduces the two itself. The round ends when both
            // pieces went on.
            let base = ji as u32 * self.per_job;
            let to = 1 - rank as u32;
            job.heard |= 1 << rank;
            let mut sends = [None, None];
            if s.arrived == 1 {
                s.sends_left = 2;
                s.sending_since = s.first;
                // Deferred to the other piece's arrival if `to` was never heard from.
                s.deferred = job.heard & (1 << to) == 0;
                if !s.deferred {
                    sends[0] = Some(to);
                }
            } else {
                if let Some(first) = s.first.take() {
                    self.metrics.job(self.lcore, ji).record_round(first.elapsed().as_nanos() as u64);
                }
                sends = [Some(to), s.deferred.then_some(rank as u32)];
                s.deferred = false;
            }
            for dest in sends.into_iter().flatten() {
                if let Err(e) = self.post(base + ((slot as u32 * n + dest) << 1 | 1)) {
                    self.fail(ji, format!("relaying a piece: {e}"));
                    return;
                }
            }
            return;
        }
        let (dtype, op, elems) = (job.on.spec.dtype, job.on.spec.op, c.len / dsize);
        let t0;
        if job.on.stage > 0 {
            t0 = Instant::now();
            if let Err(e) = self.fold(ji, slot, elems) {
                self.fail(ji, e);
                return;
            }
            let job = self.jobs[ji].as_ref().unwrap();
            if job.slots[slot].next < n {
                bump(&self.metrics.job(self.lcore, ji).reduce_ns, t0.elapsed().as_nanos() as u64);
                return;
            }
        } else {
            if s.arrived < n {
                return;
            }
            // Every piece is here: reduce in rank order into piece 0, send it back.
            let mut inputs = [core::ptr::null::<u8>(); MAX_INPUTS];
            for (r, p) in inputs.iter_mut().enumerate().take(n as usize) {
                *p = job.piece_ptr(slot, r);
            }
            let out = inputs[0] as *mut u8;
            t0 = Instant::now();
            // SAFETY: every input is a completed receive of `elems` elements in
            // this job's region; out == inputs[0] exactly, which reduce_raw allows.
            if let Err(e) = unsafe { self.kernels.reduce_raw(dtype, op, out, &inputs[..n as usize], elems) } {
                self.fail(ji, format!("reduce failed: {e}"));
                return;
            }
        }
        let now = Instant::now();
        bump(&self.metrics.job(self.lcore, ji).reduce_ns, now.duration_since(t0).as_nanos() as u64);
        self.send_results(ji, slot, now);
    }

    /// A slot's result is ready: send it to every rank (a split slot: to
    /// this lcore's group).
    pub(super) fn send_results(&mut self, ji: usize, slot: usize, now: Instant) {
        let block = self.metrics.job(self.lcore, ji);
        let job = self.jobs[ji].as_mut().unwrap();
        // The round's latency (first piece in to results going out) is known
        // now; recorded before the sends, which may (by inject) finish the
        // round and start the slot's next one.
        if let Some(first) = job.slots[slot].first.take() {
            block.record_round(now.duration_since(first).as_nanos() as u64);
        }
        let n = job.on.spec.nranks;
        let to = job.split_of(slot).map_or(0..n, |sp| sp.ranks.clone());
        job.slots[slot].sends_left = to.len() as u32;
        job.slots[slot].sending_since = Some(now);
        let base = ji as u32 * self.per_job;
        for rank in to {
            if let Err(e) = self.post(base + ((slot as u32 * n + rank) << 1 | 1)) {
                self.fail(ji, format!("sending results: {e}"));
                return;
            }
        }
    }
}
