//! Redo jobs: sibling jobs joined on the survivors for one recovery, which
//! carry its items (relayed or recomputed) with sequence numbers of their
//! own, and hand their results to the operations waiting for them.
use super::{bits, Item, Stage, REDO_CONNECT_FOR, REDO_WINDOW};
use crate::client::{Client, ClientError, Stream};
use crate::reduce::ReduceOp;
use crate::wire::{self, HelloMessage, JobSpec};
use std::collections::VecDeque;
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A sibling job on the survivors that carries one recovery's items.
pub(in crate::client) struct RedoJob {
    pub(in crate::client) streams: Vec<Stream>,
    pub(in crate::client) controls: Vec<TcpStream>,
    /// Per stream: items assigned, not yet posted, in order.
    pub(in crate::client) queue: Vec<VecDeque<usize>>,
    pub(in crate::client) flights: Vec<RedoFlight>,
    pub(in crate::client) stage: Stage,
    /// Items assigned so far (item n goes to stream n mod streams).
    pub(in crate::client) assigned: usize,
}

#[derive(Clone, Copy, Default)]
pub(in crate::client) struct RedoFlight {
    pub(in crate::client) item: usize,
    pub(in crate::client) seq: u32,
    pub(in crate::client) busy: bool,
    pub(in crate::client) send_done: bool,
    pub(in crate::client) recv_done: bool,
}

impl Client {
    /// Hands operation `oi`'s chunks on the lost streams, not yet posted,
    /// to the recovery (cut over the old set: every rank does the same).
    pub(in crate::client) fn redo_cut(&mut self, oi: usize) -> Result<(), ClientError> {
        let sub = self.ops[oi].sub;
        let window = self.cfg.window;
        if self.subs[sub].fo.round.is_none() {
            return Ok(());
        }
        let gen = self.ops[oi].gen;
        let nset = self.subs[sub].gens[gen].set.len();
        let mut added = false;
        for k in 0..nset {
            let st = self.subs[sub].gens[gen].set[k];
            if !self.subs[sub].streams[st].lost {
                continue;
            }
            while self.ops[oi].next[st] < self.ops[oi].chunks {
                let op = &self.ops[oi];
                let chunk = op.next[st];
                let (off, len) = op.span(chunk);
                let (index, id) = (op.index, op.id);
                let stream = &mut self.subs[sub].streams[st];
                let seq = stream.next_seq;
                stream.next_seq = seq.wrapping_add(1);
                stream.next_slot = (stream.next_slot + 1) % window;
                stream.head_seq = stream.next_seq;
                stream.head_slot = stream.next_slot;
                self.ops[oi].next[st] += nset;
                self.ops[oi].posted += 1;
                let r = self.subs[sub].fo.round.as_mut().unwrap();
                r.items.push(Item { op_index: index, chunk, st, seq, len, op: id, off, holder: None, done: false });
                added = true;
            }
        }
        if added && !self.subs[sub].fo.round.as_ref().unwrap().jobs.is_empty() {
            // The round is running: these come after everything queued.
            self.classify(sub)?;
        }
        Ok(())
    }

    /// Joins this recovery's redo jobs on every server not lost: a Sum job
    /// (relays, and recomputes of a Sum), and one with the sub-job's op when
    /// that is not Sum. Collective, like any join: every rank does it on
    /// receiving the same Recover.
    pub(in crate::client) fn join_redo(&mut self, sub: usize) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        let (dtype, op, chunk_elems) = (s.dtype, s.op, s.chunk_elems);
        let round_no = s.fo.handled.count_ones() as u64 + 1;
        let dead = s.fo.dead;
        // Derived with the job's secret, like a sub-job's (`wire::derive_job_id`).
        let what = [&b"redo"[..], &round_no.to_le_bytes()].concat();
        let base = wire::derive_job_id(self.job_id_of(sub), &self.cfg.job_secret, &what);
        let mut ops = vec![ReduceOp::Sum];
        if op != ReduceOp::Sum {
            ops.push(op);
        }
        let survivors: Vec<usize> = (0..self.cfg.servers.len()).filter(|&si| dead & (1u64 << si) == 0).collect();
        let mut jobs = Vec::new();
        for (j, &rop) in ops.iter().enumerate() {
            // None of the options: redo chunks are whole results whatever
            // their size (no relay or split), every result is staged in its
            // own flights, nothing is cut over a stream set (no
            // interleave), and the job is short-lived on free capacity (the
            // communicator's room stays for its own later jobs).
            let job_id = base ^ ((j as u64 + 1) << 32) ^ (rop as u64);
            let spec = JobSpec::new(job_id, self.cfg.nranks, dtype, rop, chunk_elems as u32, REDO_WINDOW, 1);
            let mut conns = Vec::new();
            for &si in &survivors {
                // Named by the rail that carries lcore 0's stream (a redo
                // job has one shard).
                let rail = self.rails.rail_for(si, 0);
                let hello = HelloMessage::new(&spec, self.cfg.rank, &self.cfg.job_secret, &[self.rails.name(rail).as_bytes()])
                    .ok_or_else(|| ClientError::Fabric("endpoint name too long".into()))?;
                let server = &self.cfg.servers[si];
                let err = |e: String| ClientError::Connect { server: server.clone(), error: e };
                let addr = server.to_socket_addrs().map_err(|e| err(e.to_string()))?.next().ok_or_else(|| err("no address".into()))?;
                // Every rank of every job on a lost server joins redo jobs on
                // the survivors at once (a reconnect storm): a refused or
                // timed-out connect is tried again, for at most REDO_CONNECT_FOR
                // (a survivor that stays unreachable that long is a second loss).
                let mut c = crate::client::join::connect_retry(&addr, self.cfg.join_timeout.min(REDO_CONNECT_FOR))
                    .map_err(|e| err(e.to_string()))?;
                let _ = c.set_nodelay(true);
                crate::client::greet::greet(&mut c, &hello, &self.token, self.cfg.join_timeout.min(REDO_CONNECT_FOR))
                    .map_err(|e| err(e.to_string()))?;
                conns.push((si, c, hello));
            }
            let started = Instant::now();
            let mut streams = Vec::new();
            let mut controls = Vec::new();
            for (si, mut c, hello) in conns {
                let server = self.cfg.servers[si].clone();
                // A survivor that breaks off now is dying too: fail, do not wait.
                // Bounded by the all-reduce's own timeout: a rank that died
                // before joining the redo job never comes, and the ranks that
                // wait here read nothing else (not the server ending the job).
                match self.answer(&server, &mut c, &hello, started, self.cfg.join_timeout.min(self.cfg.timeout), false)? {
                    Ok(g) if g.piece_elems != 0 && (g.piece_elems as usize) < chunk_elems => {
                        let granted = g.piece_elems;
                        log::warn!("server {server} grants the redo job pieces of {granted} elements, fewer than the job's {chunk_elems}: not used for it");
                    }
                    Ok(g) => {
                        let rail = self.rails.rail_for(si, 0);
                        let addr = self.rails.insert_peer(rail, &g.names[0]).map_err(|e| ClientError::Fabric(e.to_string()))?;
                        streams.push(Stream::new(addr, si, rail, g.tag));
                        crate::client::join::keepalive(&c);
                        let _ = c.set_nonblocking(true);
                        controls.push(c);
                    }
                    Err(r) => log::warn!("server {server} refused job {:#x}'s redo job: {r}", self.job_id_of(sub)),
                }
            }
            if streams.is_empty() {
                return Err(ClientError::Refused {
                    server: self.server_names(!dead & ((1u64 << self.cfg.servers.len()) - 1)),
                    reject: "no surviving server took the recovery's redo job".into(),
                });
            }
            let n = streams.len();
            jobs.push(RedoJob {
                queue: (0..n).map(|_| VecDeque::new()).collect(),
                flights: vec![RedoFlight::default(); n * REDO_WINDOW as usize],
                stage: Stage::new(n, REDO_WINDOW as usize / 2, chunk_elems * dtype.size(), &mut self.rails)?,
                streams,
                controls,
                assigned: 0,
            });
        }
        self.subs[sub].fo.round.as_mut().unwrap().jobs = jobs;
        Ok(())
    }

    /// The context id (within the sub-job's range, after `redo_base`) of a
    /// redo flight: job j, stream k, slot w; +1 for the send.
    pub(in crate::client) fn redo_ctx(&self, j: usize, k: usize, w: usize) -> u32 {
        (((j * self.cfg.servers.len() + k) * REDO_WINDOW as usize + w) * 2) as u32
    }

    /// Posts queued items on every redo stream with room.
    pub(in crate::client) fn pump_redo(&mut self, sub: usize) -> Result<(), ClientError> {
        let nj = self.subs[sub].fo.round.as_ref().map_or(0, |r| r.jobs.len());
        for j in 0..nj {
            let nk = self.subs[sub].fo.round.as_ref().unwrap().jobs[j].streams.len();
            for k in 0..nk {
                loop {
                    let r = self.subs[sub].fo.round.as_mut().unwrap();
                    let rj = &mut r.jobs[j];
                    let stream = &mut rj.streams[k];
                    if stream.next_seq.wrapping_sub(stream.head_seq) >= REDO_WINDOW {
                        break;
                    }
                    let Some(item) = rj.queue[k].pop_front() else { break };
                    let (w, seq) = (stream.next_slot as usize, stream.next_seq);
                    stream.next_seq = seq.wrapping_add(1);
                    stream.next_slot = (stream.next_slot + 1) % REDO_WINDOW;
                    rj.flights[k * REDO_WINDOW as usize + w] = RedoFlight { item, seq, busy: true, send_done: false, recv_done: false };
                    let ctx = self.redo_ctx(j, k, w);
                    self.post_redo(sub, ctx)?;
                    self.post_redo(sub, ctx + 1)?;
                }
            }
        }
        self.maybe_end_round(sub)
    }

    /// Posts the send or receive of a redo flight.
    pub(in crate::client) fn post_redo(&mut self, sub: usize, local: u32) -> Result<(), ClientError> {
        let is_send = local & 1 == 1;
        let n = self.cfg.servers.len();
        let flat = (local >> 1) as usize;
        let (w, k, j) = (flat % REDO_WINDOW as usize, (flat / REDO_WINDOW as usize) % n, flat / (REDO_WINDOW as usize * n));
        let ctx = sub as u32 * self.per_sub + self.redo_base() + local;
        let s = &self.subs[sub];
        let r = s.fo.round.as_ref().unwrap();
        let rj = &r.jobs[j];
        let f = rj.flights[k * REDO_WINDOW as usize + w];
        let it = &r.items[f.item];
        let stream = &rj.streams[k];
        let tag = stream.job_tag.tag(w as u16, f.seq).0;
        let res = if is_send {
            let (src, mh) = match it.holder {
                Some(h) if h == self.cfg.rank => {
                    let stage = s.stage.as_ref().unwrap();
                    (stage.slot(it.st, it.seq) as *const u8, stage.mh(it.st))
                }
                Some(_) => (r.identity.as_ptr(), r.identity_mh),
                None => {
                    let op = self
                        .ops
                        .iter()
                        .find(|o| o.id == it.op)
                        .ok_or_else(|| ClientError::Fabric("recovery: an item's operation is gone".into()))?;
                    // SAFETY: off + len lies inside the operation's input (contract of `start`).
                    (unsafe { op.send.add(it.off) }, op.mh_send)
                }
            };
            // SAFETY: src holds len bytes (a staged result, the identity
            // piece, or the caller's input) that stay put until the send
            // completes: staged results of a lost stream are never
            // overwritten, and the operation cannot complete before its item.
            unsafe { self.rails.send(stream.rail, src, it.len, mh, stream.addr, tag, ctx) }
        } else {
            // SAFETY: the redo job's staging slot w of stream k, a whole
            // piece, the target of this receive only.
            unsafe {
                self.rails.recv(stream.rail, rj.stage.slot(k, w as u32), it.len, rj.stage.mh(k), Some(stream.addr), (tag, 0), ctx, None)
            }
        };
        match res {
            Ok(()) => Ok(()),
            Err(crate::dataplane::fabric::PostError::Again) => {
                self.retry.push(ctx);
                Ok(())
            }
            Err(e) => Err(ClientError::Fabric(format!("recovery: {e}"))),
        }
    }

    /// A redo flight's send or receive completed.
    pub(in crate::client) fn on_redo_completion(&mut self, sub: usize, local: u32, is_recv: bool) -> Result<(), ClientError> {
        let n = self.cfg.servers.len();
        let flat = (local >> 1) as usize;
        let (w, k, j) = (flat % REDO_WINDOW as usize, (flat / REDO_WINDOW as usize) % n, flat / (REDO_WINDOW as usize * n));
        let Some(r) = self.subs[sub].fo.round.as_mut() else { return Ok(()) };
        let rj = &mut r.jobs[j];
        let f = &mut rj.flights[k * REDO_WINDOW as usize + w];
        if !f.busy {
            return Ok(());
        }
        if is_recv {
            f.recv_done = true;
        } else {
            f.send_done = true;
        }
        if !(f.send_done && f.recv_done) {
            return Ok(());
        }
        let item = f.item;
        *f = RedoFlight::default();
        let stream = &mut rj.streams[k];
        while stream.head_seq != stream.next_seq && !rj.flights[k * REDO_WINDOW as usize + stream.head_slot as usize].busy {
            stream.head_seq = stream.head_seq.wrapping_add(1);
            stream.head_slot = (stream.head_slot + 1) % REDO_WINDOW;
        }
        let src = rj.stage.slot(k, w as u32);
        let it = &mut r.items[item];
        it.done = true;
        r.done += 1;
        let (op_id, off, len, relayed) = (it.op, it.off, it.len, it.holder.is_some());
        if relayed {
            self.stats.relayed += 1;
        } else {
            self.stats.recomputed += 1;
        }
        if op_id != 0 {
            if let Some(op) = self.ops.iter_mut().find(|o| o.id == op_id) {
                // SAFETY: the slot holds the whole redone result; off + len
                // lies inside the caller's output buffer.
                unsafe { std::ptr::copy_nonoverlapping(src, op.recv.add(off), len) };
                op.done += 1;
            }
            self.finish_done_ops()?;
        }
        self.last_progress = Instant::now();
        Ok(())
    }

    /// Completes every operation whose chunks are all done.
    pub(in crate::client) fn finish_done_ops(&mut self) -> Result<(), ClientError> {
        while let Some(pos) = self.ops.iter().position(|o| o.planned && o.chunks > 0 && o.done >= o.pieces()) {
            self.complete_op(pos)?;
        }
        Ok(())
    }

    /// Ends the recovery once every item is done and every operation
    /// before the switch was cut: says Bye to the redo jobs.
    pub(in crate::client) fn maybe_end_round(&mut self, sub: usize) -> Result<(), ClientError> {
        let Some(r) = self.subs[sub].fo.round.as_ref() else { return Ok(()) };
        if r.done < r.items.len() || r.queued < r.items.len() || self.first_uncut(sub) < r.switch_op {
            return Ok(());
        }
        let mut r = self.subs[sub].fo.round.take().unwrap();
        for rj in &mut r.jobs {
            rj.stage.deregister(&mut self.rails);
        }
        if let Some(mh) = r.identity_mh.take() {
            let _ = self.rails.deregister(mh);
        }
        let bye = wire::Header::new(wire::Kind::Bye);
        for rj in &mut r.jobs {
            for c in &mut rj.controls {
                let _ = c.set_nonblocking(false);
                let _ = c.write_all(bytemuck::bytes_of(&bye));
            }
        }
        let s = &mut self.subs[sub];
        s.fo.handled |= r.dead;
        let took = s.fo.noticed.take().map_or(Duration::ZERO, |t| t.elapsed());
        // Take them back when they return (restarted on the same address).
        for si in bits(r.dead) {
            self.watch_again(sub, si);
        }
        self.stats.recoveries += 1;
        self.stats.last_recovery = took;
        log::warn!(
            "job {:#x}: recovered from losing {} in {:.0} ms ({} chunks redone; {} relayed, {} recomputed so far)",
            self.job_id_of(sub),
            self.server_names(r.dead),
            took.as_secs_f64() * 1e3,
            r.items.len(),
            self.stats.relayed,
            self.stats.recomputed
        );
        Ok(())
    }
}
