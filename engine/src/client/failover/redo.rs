//! A recovery in progress ([`Round`]): the lost work as items, and the redo
//! jobs that carry them: sibling jobs joined on the survivors for one
//! recovery, which carry its items (relayed or recomputed) with sequence
//! numbers of their own, and hand their results to the operations waiting
//! for them. Redo flights are a mode of the per-chunk path of their own:
//! the path hands their context ids here (`Failover::post_redo`,
//! `Failover::on_redo_completion`).
use crate::client::error::ClientError;
use crate::client::greet::greet;
use crate::client::handshake::{await_answer, connect_retry, keepalive};
use crate::client::rails::Rails;
use crate::client::stage::Stage;
use crate::client::state::{Core, Stream};
use crate::dataplane::fabric::{MemoryHandle, PostError};
use crate::reduce::{DataType, ReduceOp};
use crate::wire::{self, HelloMessage, JobSpec};
use std::collections::VecDeque;
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long a redo job's connect to a survivor is retried (a reconnect
/// storm: every rank of every job on the lost server at once).
pub const REDO_CONNECT_FOR: Duration = Duration::from_secs(10);

/// Chunks each redo job keeps in flight per server.
pub const REDO_WINDOW: u32 = 4;
/// Context ids a sub-job keeps for redo jobs, per server: two jobs (relay
/// and recompute), a window each, a send and a receive per slot.
pub const REDO_CONTEXTS_PER_SERVER: u32 = 2 * REDO_WINDOW * 2;

/// One recovery in progress.
pub(super) struct Round {
    /// Operations from this one on run without the lost servers.
    pub(super) switch_op: u64,
    /// The servers this recovery redoes the work of.
    pub(super) dead: u64,
    nranks: usize,
    /// Per rank and stream: the report (oldest incomplete sequence, and
    /// which of the next 32 arrived).
    heads: Vec<u32>,
    masks: Vec<u32>,
    pub(super) items: Vec<Item>,
    /// Items classified and queued so far (the rest wait for the reports'
    /// verdict: only while the round is being set up).
    queued: usize,
    jobs: Vec<RedoJob>,
    /// A piece of the sum's identity for this data type, and its
    /// registration where the provider wants one.
    identity: Vec<u8>,
    identity_mh: Option<MemoryHandle>,
    done: usize,
}

/// A chunk of a lost server's work, as this rank sees it.
pub(super) struct Item {
    pub(super) op_index: u64,
    pub(super) chunk: usize,
    pub(super) st: usize,
    pub(super) seq: u32,
    pub(super) len: usize,
    /// The operation still in progress here that needs the result (0: this
    /// rank has the result staged).
    pub(super) op: u64,
    pub(super) off: usize,
    /// The rank whose copy is relayed; None: recomputed from every input.
    pub(super) holder: Option<u32>,
    pub(super) done: bool,
}

/// A sibling job on the survivors that carries one recovery's items.
struct RedoJob {
    streams: Vec<Stream>,
    controls: Vec<TcpStream>,
    /// Per stream: items assigned, not yet posted, in order.
    queue: Vec<VecDeque<usize>>,
    flights: Vec<RedoFlight>,
    stage: Stage,
    /// Items assigned so far (item n goes to stream n mod streams).
    assigned: usize,
}

#[derive(Clone, Copy, Default)]
struct RedoFlight {
    item: usize,
    seq: u32,
    busy: bool,
    send_done: bool,
    recv_done: bool,
}

/// A redo flight that completed its item: relayed (else recomputed), and
/// whether an operation in progress here took its result.
pub(super) struct Redone {
    pub(super) relayed: bool,
    pub(super) for_op: bool,
}

impl Round {
    /// A recovery of the servers in `dead` from every rank's report, with
    /// no items yet.
    pub(super) fn new(switch_op: u64, dead: u64, nranks: usize, heads: Vec<u32>, masks: Vec<u32>, dtype: DataType, piece: usize) -> Round {
        Round {
            switch_op,
            dead,
            nranks,
            heads,
            masks,
            items: Vec::new(),
            queued: 0,
            jobs: Vec::new(),
            identity: identity(dtype, piece),
            identity_mh: None,
            done: 0,
        }
    }

    /// Per stream, the oldest head in wrapping order (every other is at or
    /// after it): below it every rank has every result.
    /// Whether a redo job's receive will take a message with this tag
    /// (`client::sweep`).
    pub(super) fn awaits(&self, tag: crate::wire::Tag) -> bool {
        self.jobs.iter().any(|j| j.streams.iter().any(|st| st.awaits(REDO_WINDOW, tag)))
    }

    pub(super) fn oldest_heads(&self, nstreams: usize) -> Vec<u32> {
        (0..nstreams)
            .map(|st| {
                let hs: Vec<u32> = (0..self.nranks).map(|r2| self.heads[r2 * nstreams + st]).collect();
                hs.iter().copied().find(|&h| hs.iter().all(|&o| seq_ge(o, h))).unwrap_or(hs[0])
            })
            .collect()
    }

    /// Every item queued and done.
    pub(super) fn finished(&self) -> bool {
        self.done >= self.items.len() && self.queued >= self.items.len()
    }

    /// Items still to redo.
    pub(super) fn left(&self) -> usize {
        self.items.iter().filter(|i| !i.done).count()
    }

    /// Hands operation `oi`'s chunks on the lost streams, not yet posted,
    /// to the recovery (cut over the old set: every rank does the same).
    pub(super) fn take_chunks(&mut self, c: &mut Core, oi: usize) -> Result<(), ClientError> {
        let sub = c.ops[oi].sub;
        let window = c.cfg.window;
        let gen = c.ops[oi].gen;
        let nset = c.subs[sub].gens[gen].set.len();
        let mut added = false;
        for k in 0..nset {
            let st = c.subs[sub].gens[gen].set[k];
            if !c.subs[sub].streams[st].lost {
                continue;
            }
            while c.ops[oi].next[st] < c.ops[oi].chunks {
                let op = &c.ops[oi];
                let chunk = op.next[st];
                let (off, len) = op.span(chunk);
                let (index, id) = (op.index, op.id);
                let stream = &mut c.subs[sub].streams[st];
                let seq = stream.next_seq;
                stream.next_seq = seq.wrapping_add(1);
                stream.next_slot = (stream.next_slot + 1) % window;
                stream.head_seq = stream.next_seq;
                stream.head_slot = stream.next_slot;
                c.ops[oi].next[st] += nset;
                c.ops[oi].posted += 1;
                self.items.push(Item { op_index: index, chunk, st, seq, len, op: id, off, holder: None, done: false });
                added = true;
            }
        }
        if added && !self.jobs.is_empty() {
            // The round is running: these come after everything queued.
            self.classify(c, sub)?;
        }
        Ok(())
    }

    /// Decides each new item from the reports (skip, relay or recompute)
    /// and queues it on its redo job's stream.
    pub(super) fn classify(&mut self, c: &Core, sub: usize) -> Result<(), ClientError> {
        let me = c.cfg.rank;
        let job = c.subs[sub].job_id;
        let nstreams = c.subs[sub].streams.len();
        let sum_only = c.subs[sub].op == ReduceOp::Sum;
        let r = self;
        while r.queued < r.items.len() {
            let i = r.queued;
            r.queued += 1;
            let (st, seq, mine) = (r.items[i].st, r.items[i].seq, r.items[i].op == 0);
            let mut holders = (0..r.nranks).filter(|&rk| {
                let (h, m) = (r.heads[rk * nstreams + st], r.masks[rk * nstreams + st]);
                !seq_ge(seq, h) || (seq.wrapping_sub(h) < 32 && m & (1 << seq.wrapping_sub(h)) != 0)
            });
            let first = holders.next();
            let all = first == Some(0) && holders.count() == r.nranks - 1;
            if all {
                if !mine {
                    return Err(ClientError::Fabric(format!(
                        "recovery of job {job:#x}: every rank reported a result this rank lacks (stream {st}, seq {seq})"
                    )));
                }
                r.items[i].done = true;
                r.done += 1;
                continue;
            }
            if first.is_none() && mine {
                return Err(ClientError::Fabric(format!(
                    "recovery of job {job:#x}: no rank reported a result this rank holds (stream {st}, seq {seq})"
                )));
            }
            r.items[i].holder = first.map(|h| h as u32);
            if first == Some(me as usize) && !mine {
                return Err(ClientError::Fabric(format!(
                    "recovery of job {job:#x}: named holder of a result it lacks (stream {st}, seq {seq})"
                )));
            }
            let j = if first.is_some() || sum_only { 0 } else { 1 };
            let rj = &mut r.jobs[j];
            let k = rj.assigned % rj.streams.len();
            rj.assigned += 1;
            rj.queue[k].push_back(i);
        }
        Ok(())
    }

    /// Joins this recovery's redo jobs on every server not in `dead`: a Sum
    /// job (relays, and recomputes of a Sum), and one with the sub-job's op
    /// when that is not Sum. Collective, like any join: every rank does it
    /// on receiving the same Recover (`round_no`: this sub-job's how many-th).
    pub(super) fn join_jobs(&mut self, c: &mut Core, sub: usize, round_no: u64, dead: u64) -> Result<(), ClientError> {
        let s = &c.subs[sub];
        let (dtype, op, chunk_elems, job) = (s.dtype, s.op, s.chunk_elems, s.job_id);
        // Derived with the job's secret, like a sub-job's (`wire::derive_job_id`).
        let what = [&b"redo"[..], &round_no.to_le_bytes()].concat();
        let base = wire::derive_job_id(job, &c.cfg.job_secret, &what);
        let mut ops = vec![ReduceOp::Sum];
        if op != ReduceOp::Sum {
            ops.push(op);
        }
        let survivors: Vec<usize> = (0..c.cfg.servers.len()).filter(|&si| dead & (1u64 << si) == 0).collect();
        let mut jobs = Vec::new();
        for (j, &rop) in ops.iter().enumerate() {
            // None of the options: redo chunks are whole results whatever
            // their size (no relay or split), every result is staged in its
            // own flights, nothing is cut over a stream set (no
            // interleave), and the job is short-lived on free capacity (the
            // communicator's room stays for its own later jobs).
            let job_id = base ^ ((j as u64 + 1) << 32) ^ (rop as u64);
            let spec = JobSpec::new(job_id, c.cfg.nranks, dtype, rop, chunk_elems as u32, REDO_WINDOW, 1);
            let mut conns = Vec::new();
            for &si in &survivors {
                // Named by the rail that carries lcore 0's stream (a redo
                // job has one shard).
                let rail = c.rails.rail_for(si, 0);
                let hello = HelloMessage::new(&spec, c.cfg.rank, &c.cfg.job_secret, &[c.rails.name(rail).as_bytes()])
                    .ok_or_else(|| ClientError::Fabric("endpoint name too long".into()))?;
                let server = &c.cfg.servers[si];
                let err = |e: String| ClientError::Connect { server: server.clone(), error: e };
                let addr = server.to_socket_addrs().map_err(|e| err(e.to_string()))?.next().ok_or_else(|| err("no address".into()))?;
                // Every rank of every job on a lost server joins redo jobs on
                // the survivors at once (a reconnect storm): a refused or
                // timed-out connect is tried again, for at most REDO_CONNECT_FOR
                // (a survivor that stays unreachable that long is a second loss).
                let mut conn = connect_retry(&addr, c.cfg.join_timeout.min(REDO_CONNECT_FOR)).map_err(|e| err(e.to_string()))?;
                let _ = conn.set_nodelay(true);
                greet(&mut conn, &hello, &c.token, c.cfg.join_timeout.min(REDO_CONNECT_FOR)).map_err(|e| err(e.to_string()))?;
                conns.push((si, conn, hello));
            }
            let started = Instant::now();
            let mut streams = Vec::new();
            let mut controls = Vec::new();
            for (si, mut conn, hello) in conns {
                let server = c.cfg.servers[si].clone();
                // A survivor that breaks off now is dying too: fail, do not wait.
                // Bounded by the all-reduce's own timeout: a rank that died
                // before joining the redo job never comes, and the ranks that
                // wait here read nothing else (not the server ending the job).
                let limit = c.cfg.join_timeout.min(c.cfg.timeout);
                match await_answer(c.cfg.rank, &c.token, &server, &mut conn, &hello, started, limit, false)? {
                    Ok(g) if g.piece_elems != 0 && (g.piece_elems as usize) < chunk_elems => {
                        let granted = g.piece_elems;
                        log::warn!("server {server} grants the redo job pieces of {granted} elements, fewer than the job's {chunk_elems}: not used for it");
                    }
                    Ok(g) => {
                        let rail = c.rails.rail_for(si, 0);
                        let addr = c.rails.insert_peer(rail, &g.names[0]).map_err(|e| ClientError::Fabric(e.to_string()))?;
                        streams.push(Stream::new(addr, si, rail, g.tag));
                        keepalive(&conn);
                        let _ = conn.set_nonblocking(true);
                        controls.push(conn);
                    }
                    Err(r) => log::warn!("server {server} refused job {job:#x}'s redo job: {r}"),
                }
            }
            if streams.is_empty() {
                return Err(ClientError::Refused {
                    server: c.servers_named(!dead & ((1u64 << c.cfg.servers.len()) - 1)),
                    reject: "no surviving server took the recovery's redo job".into(),
                });
            }
            let n = streams.len();
            jobs.push(RedoJob {
                queue: (0..n).map(|_| VecDeque::new()).collect(),
                flights: vec![RedoFlight::default(); n * REDO_WINDOW as usize],
                stage: Stage::new(n, REDO_WINDOW as usize / 2, chunk_elems * dtype.size(), &mut c.rails)?,
                streams,
                controls,
                assigned: 0,
            });
        }
        self.jobs = jobs;
        Ok(())
    }

    /// Registers the identity piece, where the provider wants local
    /// buffers registered.
    pub(super) fn register_identity(&mut self, rails: &mut Rails) -> Result<(), ClientError> {
        // SAFETY: the identity piece lives in the round, which
        // deregisters it before it ends (`Round::close`).
        let mh = unsafe { rails.register(self.identity.as_mut_ptr(), self.identity.len()) }
            .map_err(|e| ClientError::Fabric(format!("registering the identity piece: {e}")))?;
        self.identity_mh = Some(mh);
        Ok(())
    }

    /// Posts queued items on every redo stream with room (`stage`: the
    /// sub-job's staging area, where this rank's copies of relayed results are).
    pub(super) fn post_queued(&mut self, c: &mut Core, sub: usize, stage: Option<&Stage>) -> Result<(), ClientError> {
        let servers = c.cfg.servers.len();
        for j in 0..self.jobs.len() {
            for k in 0..self.jobs[j].streams.len() {
                loop {
                    let rj = &mut self.jobs[j];
                    let stream = &mut rj.streams[k];
                    if stream.next_seq.wrapping_sub(stream.head_seq) >= REDO_WINDOW {
                        break;
                    }
                    let Some(item) = rj.queue[k].pop_front() else { break };
                    let (w, seq) = (stream.next_slot as usize, stream.next_seq);
                    stream.next_seq = seq.wrapping_add(1);
                    stream.next_slot = (stream.next_slot + 1) % REDO_WINDOW;
                    rj.flights[k * REDO_WINDOW as usize + w] = RedoFlight { item, seq, busy: true, send_done: false, recv_done: false };
                    let ctx = redo_ctx(servers, j, k, w);
                    self.post(c, sub, stage, ctx)?;
                    self.post(c, sub, stage, ctx + 1)?;
                }
            }
        }
        Ok(())
    }

    /// Posts the send or receive of a redo flight (`local`: its context id
    /// after the sub-job's `redo_base`).
    pub(super) fn post(&self, c: &mut Core, sub: usize, stage: Option<&Stage>, local: u32) -> Result<(), ClientError> {
        let is_send = local & 1 == 1;
        let (w, k, j) = redo_place(c.cfg.servers.len(), local);
        let ctx = sub as u32 * c.per_sub + c.redo_base + local;
        let rj = &self.jobs[j];
        let f = rj.flights[k * REDO_WINDOW as usize + w];
        let it = &self.items[f.item];
        let stream = &rj.streams[k];
        let tag = stream.job_tag.tag(w as u16, f.seq).0;
        let res = if is_send {
            let (src, mh) = match it.holder {
                Some(h) if h == c.cfg.rank => {
                    let stage = stage.expect("a sub-job that fails over stages its results");
                    (stage.slot(it.st, it.seq) as *const u8, stage.mh(it.st))
                }
                Some(_) => (self.identity.as_ptr(), self.identity_mh),
                None => {
                    let op = c
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
            unsafe { c.rails.send(stream.rail, src, it.len, mh, stream.addr, tag, ctx) }
        } else {
            // SAFETY: the redo job's staging slot w of stream k, a whole
            // piece, the target of this receive only.
            unsafe { c.rails.recv(stream.rail, rj.stage.slot(k, w as u32), it.len, rj.stage.mh(k), Some(stream.addr), (tag, 0), ctx, None) }
        };
        match res {
            Ok(()) => Ok(()),
            Err(PostError::Again) => {
                c.retry.push(ctx);
                Ok(())
            }
            Err(e) => Err(ClientError::Fabric(format!("recovery: {e}"))),
        }
    }

    /// A redo flight's send or receive completed (`local` as in `post`):
    /// once both did, its item is done, and its result goes to the
    /// operation waiting for it.
    pub(super) fn on_completion(&mut self, c: &mut Core, local: u32, is_recv: bool) -> Option<Redone> {
        let (w, k, j) = redo_place(c.cfg.servers.len(), local);
        let rj = &mut self.jobs[j];
        let f = &mut rj.flights[k * REDO_WINDOW as usize + w];
        if !f.busy {
            return None;
        }
        if is_recv {
            f.recv_done = true;
        } else {
            f.send_done = true;
        }
        if !(f.send_done && f.recv_done) {
            return None;
        }
        let item = f.item;
        *f = RedoFlight::default();
        let stream = &mut rj.streams[k];
        while stream.head_seq != stream.next_seq && !rj.flights[k * REDO_WINDOW as usize + stream.head_slot as usize].busy {
            stream.head_seq = stream.head_seq.wrapping_add(1);
            stream.head_slot = (stream.head_slot + 1) % REDO_WINDOW;
        }
        let src = rj.stage.slot(k, w as u32);
        let it = &mut self.items[item];
        it.done = true;
        self.done += 1;
        let (op_id, off, len, relayed) = (it.op, it.off, it.len, it.holder.is_some());
        if op_id != 0 {
            if let Some(op) = c.ops.iter_mut().find(|o| o.id == op_id) {
                // SAFETY: the slot holds the whole redone result; off + len
                // lies inside the caller's output buffer.
                unsafe { std::ptr::copy_nonoverlapping(src, op.recv.add(off), len) };
                op.done += 1;
            }
        }
        Some(Redone { relayed, for_op: op_id != 0 })
    }

    /// The recovery is over: its registrations go, and its redo jobs are
    /// told Bye.
    pub(super) fn close(&mut self, rails: &mut Rails) {
        for rj in &mut self.jobs {
            rj.stage.deregister(rails);
        }
        if let Some(mh) = self.identity_mh.take() {
            let _ = rails.deregister(mh);
        }
        let bye = wire::Header::new(wire::Kind::Bye);
        for rj in &mut self.jobs {
            for c in &mut rj.controls {
                let _ = c.set_nonblocking(false);
                let _ = c.write_all(bytemuck::bytes_of(&bye));
            }
        }
    }
}

/// The context id (within the sub-job's range, after `redo_base`) of a
/// redo flight: job j, stream k, slot w; +1 for the send.
fn redo_ctx(servers: usize, j: usize, k: usize, w: usize) -> u32 {
    (((j * servers + k) * REDO_WINDOW as usize + w) * 2) as u32
}

/// The (slot, stream, job) of a redo flight's context id, as [`redo_ctx`] made it.
fn redo_place(servers: usize, local: u32) -> (usize, usize, usize) {
    let flat = (local >> 1) as usize;
    (flat % REDO_WINDOW as usize, (flat / REDO_WINDOW as usize) % servers, flat / (REDO_WINDOW as usize * servers))
}

/// `a` comes at or after `b` in wrapping sequence order.
#[inline]
pub(super) fn seq_ge(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) < 1 << 31
}

/// One piece of the sum's identity: -0.0 for floats (-0.0 + x is x for
/// every x, +0.0 and NaN included), 0 for integers.
fn identity(dtype: DataType, piece: usize) -> Vec<u8> {
    let mut v = vec![0u8; piece];
    if dtype.is_float() {
        let size = dtype.size();
        for e in v.chunks_exact_mut(size) {
            e[size - 1] = 0x80; // the sign bit, little-endian
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::{identity, redo_ctx, redo_place, seq_ge};
    use crate::reduce::DataType;

    #[test]
    fn identity_is_negative_zero_for_floats() {
        assert_eq!(identity(DataType::Float32, 8), [0, 0, 0, 0x80, 0, 0, 0, 0x80]);
        assert_eq!(identity(DataType::Bfloat16, 4), [0, 0x80, 0, 0x80]);
        assert_eq!(identity(DataType::Int32, 4), [0; 4]);
        let x = f32::from_le_bytes(identity(DataType::Float32, 4).try_into().unwrap());
        for v in [0.0f32, -0.0, 1.5, -3.25e-30, f32::INFINITY] {
            assert_eq!((x + v).to_bits(), v.to_bits());
            assert_eq!((v + x).to_bits(), v.to_bits());
        }
    }

    #[test]
    fn sequence_order_wraps() {
        assert!(seq_ge(5, 5) && seq_ge(6, 5) && !seq_ge(4, 5));
        assert!(seq_ge(2, u32::MAX - 1) && !seq_ge(u32::MAX - 1, 2));
    }

    #[test]
    fn a_redo_context_names_its_place() {
        for servers in [2, 3, 7] {
            for (j, k, w) in [(0, 0, 0), (1, servers - 1, 3), (0, 1, 2)] {
                let ctx = redo_ctx(servers, j, k, w);
                assert_eq!(redo_place(servers, ctx), (w, k, j));
                assert_eq!(redo_place(servers, ctx + 1), (w, k, j));
            }
        }
    }
}
