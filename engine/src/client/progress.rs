//! The per-chunk path: posting each chunk's send and receive, reading the
//! completions, landing results and completing operations. Nothing here
//! allocates, locks or logs per chunk.
//!
//! Pacing: a stream's window bounds the chunks awaiting results, but if
//! every one of them is sent at once, TCP-like fabrics share the link
//! among them fairly, all the uploads finish together and the results come
//! back only afterwards: no overlap of upload and download, about half the
//! link rate. With `send_credits` set, at most that many sends per server
//! are in flight, issued in chunk order across streams, so early chunks
//! finish uploading early and their results flow back while later chunks
//! go up. Receives are posted as before (they cost no bandwidth).
use super::piece_times::PieceTimes;
use super::state::{Flight, Op, SLOW_OP};
use super::{failover, Client, BUSY_CHECK_EVERY, IDLE_CHECK_EVERY};
use crate::client::error::ClientError;
use crate::dataplane::fabric::{PollError, PostError};
use crate::wire;
use std::time::Instant;

impl Client {
    /// Posts chunks while streams have room.
    pub(super) fn pump(&mut self) -> Result<(), ClientError> {
        if !self.retry.is_empty() {
            let pending = std::mem::take(&mut self.retry);
            for ctx in &pending {
                self.post(*ctx)?;
            }
        }
        let window = self.cfg.window;
        // Nothing changed since the last look: every operation is still
        // fully posted, held, or waiting for a window (see `pump_due`).
        let ops = if std::mem::take(&mut self.pump_due) { self.ops.len() } else { 0 };
        for oi in 0..ops {
            if self.ops[oi].posted == self.ops[oi].pieces() || !self.ops[oi].planned {
                // The common case while waiting for results: nothing to do.
                // (Or held uncut while a drain's switch is agreed.)
                continue;
            }
            let (sub, gen, first) = (self.ops[oi].sub, self.ops[oi].gen, self.ops[oi].first);
            let nstreams = self.subs[sub].gens[gen].set.len();
            // One chunk per stream per pass, from the op's first stream:
            // chunks go out in chunk order.
            let mut progress = true;
            while progress {
                progress = false;
                for k in 0..nstreams {
                    let st = self.subs[sub].gens[gen].set[(first + k) % nstreams];
                    let op = &self.ops[oi];
                    let stream = &self.subs[sub].streams[st];
                    if !op.left_on(st) || stream.next_seq.wrapping_sub(stream.head_seq) >= window {
                        continue;
                    }
                    if self.subs[sub].lost_stream(st) {
                        // Its server is gone: the recovery redoes these chunks.
                        continue;
                    }
                    // Earlier ops on the same sub-job must have posted all of
                    // this stream's chunks first, to keep sequence order.
                    if self.ops.iter().take(oi).any(|o| o.sub == sub && o.planned && o.left_on(st)) {
                        continue;
                    }
                    progress = true;
                    let chunk = op.next[st];
                    let s = &mut self.subs[sub].streams[st];
                    let seq = s.next_seq;
                    s.next_seq = seq.wrapping_add(1);
                    let slot = s.next_slot as usize;
                    s.next_slot = (s.next_slot + 1) % window;
                    let fi = st * window as usize + slot;
                    let op = &self.ops[oi];
                    let relayed = self.subs[sub].relay.is_some() && op.span(chunk).1 <= wire::RELAY_MAX;
                    self.subs[sub].flights[fi] = Flight { op: op.id, chunk, seq, relayed, ..Flight::default() };
                    self.ops[oi].next[st] += nstreams;
                    self.ops[oi].posted += 1;
                    let base = sub as u32 * self.per_sub + (fi as u32) * 2;
                    // Receive first: the result may come back fast. A relayed
                    // chunk's receive is posted once its send is (`post`):
                    // the other rank's piece may come back before this
                    // rank's went out, and must not complete the flight
                    // while its send waits on the retry list.
                    if !relayed {
                        self.post(base)?;
                    }
                    self.issue_send(base + 1)?;
                }
            }
        }
        for sub in 0..self.subs.len() {
            if self.subs[sub].fo.round.is_some() {
                self.pump_redo(sub)?;
            }
        }
        Ok(())
    }

    /// Posts a chunk's send now if its server has a send credit, else queues it.
    pub(super) fn issue_send(&mut self, ctx: u32) -> Result<(), ClientError> {
        if self.cfg.send_credits == 0 {
            return self.post(ctx);
        }
        let (sub, fi) = ((ctx / self.per_sub) as usize, ((ctx % self.per_sub) >> 1) as usize);
        let server = self.subs[sub].streams[fi / self.cfg.window as usize].server;
        let p = &mut self.subs[sub].pacing[server];
        if p.in_flight >= self.cfg.send_credits || !p.waiting.is_empty() {
            p.waiting.push_back(ctx);
            return Ok(());
        }
        p.in_flight += 1;
        self.post(ctx)
    }

    /// A send completed: its server's credit goes to the next waiting sends.
    pub(super) fn release_send_credit(&mut self, sub: usize, server: usize) -> Result<(), ClientError> {
        if self.cfg.send_credits == 0 {
            return Ok(());
        }
        let p = &mut self.subs[sub].pacing[server];
        p.in_flight = p.in_flight.saturating_sub(1);
        loop {
            let p = &mut self.subs[sub].pacing[server];
            if p.in_flight >= self.cfg.send_credits {
                return Ok(());
            }
            let Some(ctx) = p.waiting.pop_front() else { return Ok(()) };
            p.in_flight += 1;
            self.post(ctx)?;
        }
    }

    /// Posts the operation a context id names, from the flight it belongs to.
    pub(super) fn post(&mut self, ctx: u32) -> Result<(), ClientError> {
        let (sub, local) = ((ctx / self.per_sub) as usize, ctx % self.per_sub);
        if local >= self.redo_base() {
            return self.post_redo(sub, local - self.redo_base());
        }
        let (fi, is_send) = ((local >> 1) as usize, local & 1 == 1);
        let window = self.cfg.window as usize;
        let (st, slot) = (fi / window, fi % window);
        let f = self.subs[sub].flights[fi];
        let Some(op) = self.ops.iter().find(|o| o.id == f.op) else { return Ok(()) };
        // A sampled send is timed, but not in the sub-job's first all-reduce,
        // which makes the connections.
        if is_send && self.cfg.piece_times && PieceTimes::sampled(f.seq) && op.index > 0 {
            self.subs[sub].flights[fi].sent_at = self.piece_times.now_ns();
        }
        let s = &self.subs[sub];
        let stream = &s.streams[st];
        let rail = stream.rail;
        let (chunk, seq) = (f.chunk, f.seq);
        let (off, len) = op.span(chunk);
        let tag = stream.job_tag.tag(stream.slot_base + slot as u16, seq).0;
        // (Rails on threads inject nothing: their inject size is 0.)
        if is_send && len <= self.rails.inject_size() && self.rails.inject_size() > 0 && self.cfg.send_credits == 0 {
            // Small pieces go by inject: no send completion to wait for.
            // (Not with pacing, whose credits are returned by completions.)
            let addr = stream.addr;
            // SAFETY: [send+off, +len) is inside the caller's buffer, valid
            // for this call (inject copies it).
            return match unsafe { self.rails.inject(op.send.add(off), len, addr, tag) } {
                Ok(()) => {
                    self.subs[sub].flights[fi].send_done = true;
                    if f.relayed {
                        return self.post(ctx - 1);
                    }
                    Ok(())
                }
                Err(PostError::Again) => {
                    self.retry.push(ctx);
                    Ok(())
                }
                Err(e) => Err(ClientError::Fabric(e.to_string())),
            };
        }
        let r = if is_send {
            // SAFETY: [send+off, +len) is inside the caller's buffer, valid
            // until the request completes (contract of `start`).
            unsafe { self.rails.send(rail, op.send.add(off), len, op.mh_send, stream.addr, tag, ctx) }
        } else if let Some(relay) = s.relay.as_ref().filter(|_| f.relayed) {
            // SAFETY: the relay slot of (stream, seq) holds RELAY_MAX bytes
            // and is the target of this receive only (slots cycle over twice
            // the window); it lives as long as the sub-job.
            unsafe { self.rails.recv(rail, relay.slot(st, seq), len, relay.mh(st), Some(stream.addr), (tag, 0), ctx, None) }
        } else if let Some(stage) = s.stage.as_ref() {
            // Where the result goes once whole: a rail copies it there, else `land` does.
            // SAFETY: off + len <= bytes, inside the caller's buffer.
            let copy_to = op.rail_copies(&self.rails).then(|| unsafe { op.recv.add(off) });
            // SAFETY: the staging slot of (stream, seq) holds a whole piece
            // and is the target of this receive only (slots cycle over twice
            // the window, see `Stage`); it lives as long as the sub-job. The
            // chunk's range of `recv` has one receive and stays the caller's
            // until the request completes.
            unsafe { self.rails.recv(rail, stage.slot(st, seq), len, stage.mh(st), Some(stream.addr), (tag, 0), ctx, copy_to) }
        } else {
            // SAFETY: as above; each chunk's range of `recv` has one receive.
            // (Never under failover: see `failover`'s module doc.)
            unsafe { self.rails.recv(rail, op.recv.add(off), len, op.mh_recv, Some(stream.addr), (tag, 0), ctx, None) }
        };
        match r {
            Ok(()) if is_send && f.relayed => self.post(ctx - 1),
            Ok(()) => Ok(()),
            Err(PostError::Again) => {
                self.retry.push(ctx);
                Ok(())
            }
            Err(e) => Err(ClientError::Fabric(e.to_string())),
        }
    }

    pub(super) fn poll(&mut self) -> Result<(), ClientError> {
        let n = match self.rails.poll(&mut self.batch) {
            Ok(n) => n,
            Err(PollError::Completion(e)) => return self.on_error_completion(e),
            Err(PollError::Fabric(e)) => return Err(ClientError::Fabric(e.to_string())),
        };
        if n == 0 {
            // A busy caller polls in a tight loop: peeking every control
            // connection (a system call each) on every empty poll cost a
            // polling rank a third of its time. Every IDLE_CHECK_EVERY-th
            // empty poll is soon enough to hear that a server ended the job.
            self.idle_polls = self.idle_polls.wrapping_add(1);
            if self.idle_polls.is_multiple_of(IDLE_CHECK_EVERY) {
                return self.check_controls();
            }
            return Ok(());
        }
        self.idle_polls = 0;
        self.busy_polls = self.busy_polls.wrapping_add(1);
        self.last_progress = Instant::now();
        let window = self.cfg.window as usize;
        for i in 0..n {
            let c = self.batch[i];
            let (sub, local) = ((c.context / self.per_sub) as usize, c.context % self.per_sub);
            if local >= self.redo_base() {
                self.on_redo_completion(sub, local - self.redo_base(), c.is_recv)?;
                continue;
            }
            let fi = (local >> 1) as usize;
            if self.subs[sub].lost_stream(fi / window) {
                // A late completion from a lost server: its flights were
                // handed to the recovery as they stood when it was lost.
                self.stats.late_receives += u64::from(c.is_recv);
                continue;
            }
            if let Some((fsi, from)) = self.cfg.fault_drop_results {
                let f = self.subs[sub].flights[fi];
                let index = self.ops.iter().find(|o| o.id == f.op).map_or(0, |o| o.index);
                if c.is_recv && self.subs[sub].streams[fi / window].server == fsi && index >= from {
                    continue;
                }
            }
            let server = self.subs[sub].streams[fi / window].server;
            if !c.is_recv {
                self.release_send_credit(sub, server)?;
            }
            let f = &mut self.subs[sub].flights[fi];
            if c.is_recv {
                f.recv_done = true;
                f.got = c.len as u32;
                if f.sent_at != 0 {
                    self.piece_times.record(f.sent_at, server);
                }
            } else {
                f.send_done = true;
            }
            if f.send_done && f.recv_done && f.relayed {
                // Only now: reducing in place overwrites this rank's piece,
                // which a send not yet completed may still be reading.
                let flight = *f;
                self.reduce_relayed(sub, fi / window, flight)?;
            }
            let f = &self.subs[sub].flights[fi];
            if f.send_done && f.recv_done {
                self.finish_flight(sub, fi)?;
            }
        }
        if self.busy_polls.is_multiple_of(BUSY_CHECK_EVERY) {
            return self.check_controls();
        }
        Ok(())
    }

    /// A flight whose send and receive both completed: frees its slot, moves
    /// the stream's head past the free slots, lands a staged result and counts
    /// the chunk to its operation, which completes with its last chunk.
    #[inline]
    fn finish_flight(&mut self, sub: usize, fi: usize) -> Result<(), ClientError> {
        let window = self.cfg.window as usize;
        let s = &mut self.subs[sub];
        let f = &mut s.flights[fi];
        let op_id = f.op;
        let (chunk, seq) = (f.chunk, f.seq);
        *f = Flight::default();
        self.pump_due = true;
        let st = fi / window;
        let stream = &mut s.streams[st];
        while stream.head_seq != stream.next_seq && s.flights[st * window + stream.head_slot as usize].op == 0 {
            stream.head_seq = stream.head_seq.wrapping_add(1);
            stream.head_slot = (stream.head_slot + 1) % window as u32;
        }
        if let Some(pos) = self.ops.iter().position(|o| o.id == op_id) {
            if s.stage.is_some() {
                // One search for the operation serves both.
                let how = failover::Landed::of(self.ops[pos].rail_copies(&self.rails));
                let began = (self.cfg.piece_times && how == failover::Landed::Staged).then(Instant::now);
                failover::land(s, &self.ops[pos], st, seq, chunk, how);
                if let Some(t) = began {
                    self.piece_times.record_copy(t);
                }
                self.stats.staged += 1;
            }
            self.ops[pos].done += 1;
            if self.ops[pos].done == self.ops[pos].pieces() {
                self.complete_op(pos)?;
            }
        }
        Ok(())
    }

    /// Hands back operation `pos`, all of whose chunks are done: its
    /// slow-operation note, its cursor for reuse, and the end of a sub-job
    /// that was retiring.
    #[inline]
    pub(in crate::client) fn complete_op(&mut self, pos: usize) -> Result<(), ClientError> {
        if let Some(op) = self.ops.remove(pos) {
            self.pump_due = true;
            if self.cfg.piece_times {
                self.piece_times.record_op(op.index, op.started.elapsed());
            }
            self.note_if_slow(&op);
            self.spare_next.push(op.next);
            if self.subs[op.sub].retiring {
                self.retire(op.sub)?;
            }
        }
        Ok(())
    }

    /// A relayed flight (of stream `st`) has the other rank's piece and sent its own:
    /// reduces the two, in rank order, into where the result goes (the
    /// staging slot, or the caller's buffer).
    pub(super) fn reduce_relayed(&mut self, sub: usize, st: usize, f: Flight) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        let Some(op) = self.ops.iter().find(|o| o.id == f.op) else { return Ok(()) };
        let Some(relay) = s.relay.as_ref() else { return Ok(()) };
        let (off, len) = op.span(f.chunk);
        let got = f.got as usize;
        if got != len {
            return Err(ClientError::Fabric(format!("a relayed piece of {got} bytes where the chunk has {len}")));
        }
        let peer = relay.slot(st, f.seq);
        // SAFETY: off + len <= bytes, inside the caller's buffers (contract of `start`).
        let (own, out) = unsafe { (op.send.add(off), s.stage.as_ref().map_or(op.recv.add(off), |g| g.slot(st, f.seq))) };
        let elems = len / s.dtype.size();
        // SAFETY: peer holds the whole piece (its receive completed), own and
        // out `len` bytes each; out overlaps no input except inputs[0]
        // exactly: rank 1 reducing in place reduces into the peer's slot and
        // copies from there, since out would be its second input.
        let r = unsafe {
            if self.cfg.rank == 0 {
                self.kernels.reduce_raw(s.dtype, s.op, out, &[own, peer], elems)
            } else if std::ptr::eq(own, out) {
                let r = self.kernels.reduce_raw(s.dtype, s.op, peer, &[peer, own], elems);
                std::ptr::copy_nonoverlapping(peer, out, len);
                r
            } else {
                self.kernels.reduce_raw(s.dtype, s.op, out, &[peer, own], elems)
            }
        };
        r.map_err(|e| ClientError::Fabric(format!("reducing a relayed piece: {e}")))
    }

    /// Logs an operation that took longer than [`SLOW_OP`] (once per such
    /// operation, never per chunk).
    pub(super) fn note_if_slow(&self, op: &Op) {
        let took = op.started.elapsed();
        if took > SLOW_OP {
            log::warn!(
                "rank {}: all-reduce {} ({} bytes) took {:.2} s (longer than {} s: see the lines before it for why)",
                self.cfg.rank,
                op.index,
                op.bytes,
                took.as_secs_f64(),
                SLOW_OP.as_secs()
            );
        }
    }
}
