//! Failover: a job keeps running when one of its servers dies.
//!
//! An all-reduce's shard is the same rank-order reduction wherever it is
//! computed, so work a dead server held can be redone on the others with a
//! bit-identical result, provided someone still has either the result or
//! every rank's input. Two things make that always true here:
//!
//! - **Results land in a staging area** (`Stage`, stage.rs) and are copied into the
//!   caller's buffer only once whole. An in-place all-reduce's input is
//!   therefore never half overwritten by a result that stopped arriving.
//!   And no receive into a caller's buffer can outlive the all-reduce it
//!   belongs to: the provider cannot cancel a receive it has matched to a
//!   message half arrived (rxm over tcp; a multi-packet message on EFA),
//!   so when a link is cut, or a server frozen, in the middle of a piece,
//!   the rest of that piece comes in whenever the link returns, possibly
//!   long after the recovery completed the all-reduce and the caller took
//!   its buffer back. It lands in a staging slot of the lost stream, which
//!   nothing reads, and which is reused only once the provider gave the
//!   receive back (`take_back`, `settle_lost`). (Results once went straight
//!   into the caller's buffer where a proof said no rank could still need
//!   them from there, most of every large all-reduce; a cut link then wrote
//!   a stale piece into memory the caller had reused: `tests/suites/linkcut.rs`.)
//! - **A result stays staged until every rank has it.** Stream slots cycle
//!   over twice the window: a rank posts sequence `s + 2W` only after it
//!   received `s + W`, which the server sent only after every rank had
//!   posted `s + W`, which each did only after receiving `s`. So a slot is
//!   reused only once every rank holds what it held. A rank that already
//!   completed (and gave back) an all-reduce still holds what a slower rank
//!   may lack.
//!
//! The recovery, for one lost server X (or several lost together):
//!
//! 1. **Notice.** X's control connection closes (its process died: the
//!    kernel closes its sockets at once), an operation to X completes with
//!    an error, or X ends the job. The rank freezes X's streams as they
//!    stand (later completions from them are ignored), cancels what it
//!    posted there, closes its connection to X, and holds its later
//!    all-reduces uncut.
//! 2. **Report** to the leader, the first server of the job's list it has
//!    not lost: `Lost{dead, boundary, report}`. The report says, per stream,
//!    the oldest sequence not complete here and which of the next W
//!    results arrived. The leader tells every rank (`Failover`), so ranks
//!    that noticed nothing report too, and once every rank reported the
//!    same set it sends every rank every report and the switch operation K,
//!    the largest boundary (`Recover`). A loss noticed before that (the
//!    leader itself, say) grows the set and everyone reports again.
//! 3. **Agree**, each rank on its own and identically from the same
//!    reports. Operations from K on are cut over the survivors only (a new
//!    stream set, as after a drain). The lost work is every chunk of an
//!    operation before K that was (or would have been) X's, from the oldest
//!    sequence any rank lacks: an *item*. Per item: if every rank has it,
//!    nothing; if some rank has it, it is relayed: the lowest such rank
//!    sends its copy and the others send the sum's identity (-0.0, or 0),
//!    through a Sum job, which returns exactly that copy; if no rank has
//!    it, it is recomputed: every rank sends its input again (intact, see
//!    above) through a job with the original op.
//! 4. **Redo** on *redo jobs*: sibling jobs joined on the survivors for
//!    this recovery (one lcore each, a window of [`REDO_WINDOW`]), with
//!    sequence numbers of their own. Items go to them in (operation, chunk)
//!    order, round-robin over their streams. Separate sequences matter: a
//!    rank that has not yet issued operation j+1 (its caller waits for j)
//!    could never fill a slot queued behind j+1's chunks on a shared stream.
//!
//! Rejoin: once a recovery is over, a background thread (`Watcher`, rejoin.rs) tries
//! to reach the lost servers; one that answers again (restarted on its
//! address) gets a Hello flagged REJOIN for the same job, admits it once
//! every rank is back, and asks each rank for its boundary: from the
//! largest, K, operations are cut over its new streams too (streams carry
//! the operations from `born` to before `died`; every rank agrees on both).
//! A restarted one's new streams take the places of its lost ones (their
//! context ids, flights and staging slots: `take_back`), once nothing the
//! provider still holds of the old ones can complete (`settle_lost`): a
//! server killed and restarted any number of times costs a rank what it
//! cost once. (A frozen or cut-off one, the same process, still gets new
//! places each time, `take_back` says why, but not new staging slots:
//! those of a place lost for good whose receives settled, `Stage::hand_over`.)
//!
//! Limits: a second loss while a recovery's items are in flight fails the
//! job with an error saying so (a loss during the agreement is fine: it
//! just grows the set); a rank that finished and said Bye before the loss
//! cannot take part, so the leader ends the job. Failover is on for jobs
//! with two to 64 servers and a window of at most 32 (`TALLY_FAILOVER=0`
//! turns it off), on providers that complete sends independently (the
//! staging area is registered where the provider wants local buffers
//! registered, as EFA does: untested there so far). Not on shm: it completes an endpoint's
//! sends in order (see `fabric::endpoint`), so one send the dead server
//! never took blocks every later send completion of the rank for good.
//! shm is one host's transport, where servers and ranks die together
//! anyway; tcp;ofi_rxm and EFA complete sends per peer.
use super::{Client, ClientError, Flight, Stream};
use crate::dataplane::fabric::MemoryHandle;
use crate::reduce::{DataType, ReduceOp};
use crate::wire::{self};
use std::time::{Duration, Instant};

mod redo;
mod rejoin;
mod stage;
use redo::RedoJob;
pub(in crate::client) use rejoin::Watcher;
use rejoin::{Rejoin, RejoinPhase};
pub(in crate::client) use stage::{land, Landed, Stage};

/// How long a redo job's connect to a survivor is retried (a reconnect
/// storm: every rank of every job on the lost server at once).
pub const REDO_CONNECT_FOR: Duration = Duration::from_secs(10);

/// Chunks each redo job keeps in flight per server.
pub const REDO_WINDOW: u32 = 4;
/// Context ids a sub-job keeps for redo jobs, per server: two jobs (relay
/// and recompute), a window each, a send and a receive per slot.
pub const REDO_CONTEXTS_PER_SERVER: u32 = 2 * REDO_WINDOW * 2;

/// Failover state of a sub-job.
#[derive(Default)]
pub struct Fo {
    /// Servers this rank lost (bit i: the i-th server of the list).
    pub dead: u64,
    /// The set it last reported.
    reported: u64,
    /// Lost servers whose recovery is complete.
    handled: u64,
    /// Reported, waiting for the leader's Recover: later operations are
    /// held uncut.
    pub recovering: bool,
    pub round: Option<Round>,
    /// When this rank noticed the first loss of the recovery in progress.
    noticed: Option<Instant>,
    /// Streams lost since the last recovery (it redoes their work).
    fresh: Vec<usize>,
    /// The leader's Recover, waiting for the sub-jobs before this one.
    pub verdict: Option<(u64, u64, Vec<u8>)>,
    /// Restarted servers being taken back.
    rejoins: Vec<Rejoin>,
    /// Connects to lost servers in the background until they answer.
    pub watcher: Option<Watcher>,
}

impl Fo {
    /// A rejoin waits for its switch operation: hold operations uncut.
    pub fn rejoin_pending(&self) -> bool {
        self.rejoins.iter().any(|r| matches!(r.phase, RejoinPhase::Switch))
    }
}

/// Counters of what failover did, for logs and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailoverStats {
    /// Recoveries completed on this rank.
    pub recoveries: u32,
    /// Chunks relayed from a rank that had the result.
    pub relayed: u64,
    /// Chunks recomputed from every rank's input.
    pub recomputed: u64,
    /// From noticing the loss to the recovery's last redone chunk, last recovery.
    pub last_recovery: Duration,
    /// Lost servers taken back into the job.
    pub rejoins: u32,
    /// Results that went through the staging area (received into a slot and
    /// copied out), while failover was on: every one.
    pub staged: u64,
    /// What the first sub-job holds now, lost servers' part included: its
    /// streams (a server taken back as another process takes its lost
    /// streams' places; as the same process, places of its own), and the
    /// bytes of its staging area, which a server lost and taken back any
    /// number of times, either way, does not grow (`Stage::hand_over`).
    pub streams: u32,
    pub staging_bytes: u64,
    /// Receives of lost streams that completed after the loss (their
    /// results are ignored): the provider had already taken them when the
    /// rank cancelled, and wrote them once the lost server's data came.
    pub late_receives: u64,
}

/// One recovery in progress.
pub struct Round {
    /// Operations from this one on run without the lost servers.
    pub switch_op: u64,
    /// The servers this recovery redoes the work of.
    dead: u64,
    nranks: usize,
    /// Per rank and stream: the report (oldest incomplete sequence, and
    /// which of the next 32 arrived).
    heads: Vec<u32>,
    masks: Vec<u32>,
    items: Vec<Item>,
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
struct Item {
    op_index: u64,
    chunk: usize,
    st: usize,
    seq: u32,
    len: usize,
    /// The operation still in progress here that needs the result (0: this
    /// rank has the result staged).
    op: u64,
    off: usize,
    /// The rank whose copy is relayed; None: recomputed from every input.
    holder: Option<u32>,
    done: bool,
}

/// `a` comes at or after `b` in wrapping sequence order.
#[inline]
fn seq_ge(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) < 1 << 31
}

fn bits(mask: u64) -> impl Iterator<Item = usize> {
    (0..64).filter(move |i| mask & (1u64 << i) != 0)
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

impl Client {
    /// Whether the first sub-job survives the loss of a server (several
    /// servers, failover on, a provider that completes sends per peer).
    pub fn can_fail_over(&self) -> bool {
        self.subs.first().is_some_and(|s| s.stage.is_some())
    }

    /// Failover counters of the first sub-job.
    pub fn failover_stats(&self) -> FailoverStats {
        let first = self.subs.first();
        FailoverStats {
            streams: first.map_or(0, |s| s.streams.len() as u32),
            staging_bytes: first.and_then(|s| s.stage.as_ref()).map_or(0, |g| g.bytes() as u64),
            ..self.stats
        }
    }

    pub(super) fn redo_base(&self) -> u32 {
        self.per_sub - REDO_CONTEXTS_PER_SERVER * self.cfg.servers.len() as u32
    }

    fn server_names(&self, mask: u64) -> String {
        bits(mask).filter_map(|i| self.cfg.servers.get(i)).cloned().collect::<Vec<_>>().join(", ")
    }

    /// This rank lost the servers in `mask` (or was told so): freeze their
    /// streams, close their connections, and report to the leader.
    pub(super) fn lose(&mut self, sub: usize, mask: u64, why: &str) -> Result<(), ClientError> {
        let job = self.job_id_of(sub);
        if self.subs[sub].stage.is_none() {
            return Err(ClientError::Refused {
                server: self.server_names(mask),
                reject: format!("lost ({why}); failover is off for this job"),
            });
        }
        let new = mask & !self.subs[sub].fo.dead;
        if new != 0 {
            if let Some(r) = &self.subs[sub].fo.round {
                return Err(ClientError::Refused {
                    server: self.server_names(new),
                    reject: format!(
                        "lost ({why}) while job {job:#x} was still redoing the work of {}: a second loss during a recovery is not recovered",
                        self.server_names(r.dead)
                    ),
                });
            }
            let window = self.cfg.window as usize;
            for si in bits(new) {
                log::warn!("server {} lost ({why}): job {job:#x} fails over to its other servers", self.cfg.servers[si]);
                let s = &mut self.subs[sub];
                s.controls[si] = None; // if it lives, it ends the job there, which tells the others
                s.fo.rejoins.retain(|r| r.server != si);
                for st in 0..s.streams.len() {
                    if s.streams[st].server != si || s.streams[st].lost {
                        continue;
                    }
                    s.streams[st].lost = true;
                    s.fo.fresh.push(st);
                    for slot in 0..window {
                        if s.flights[st * window + slot].op != 0 {
                            let base = sub as u32 * self.per_sub + ((st * window + slot) as u32) * 2;
                            let rail = s.streams[st].rail;
                            self.rails.cancel(rail, base);
                            self.rails.cancel(rail, base + 1);
                        }
                    }
                }
            }
            let s = &mut self.subs[sub];
            s.fo.dead |= new;
            s.fo.noticed.get_or_insert_with(Instant::now);
            // Queued sends to a lost server must not wait for its credits.
            for si in bits(new) {
                if let Some(p) = s.pacing.get_mut(si) {
                    p.in_flight = 0;
                    p.waiting.clear();
                }
            }
            // Posts waiting for a retry on the lost streams are dropped too.
            let (per_sub, redo_base, streams) = (self.per_sub, self.redo_base(), &self.subs[sub].streams);
            self.retry.retain(|&ctx| {
                let (csub, local) = ((ctx / per_sub) as usize, ctx % per_sub);
                csub != sub || local >= redo_base || !streams[(local >> 1) as usize / window].lost
            });
        }
        let s = &self.subs[sub];
        if s.fo.dead & !s.fo.handled == 0 || s.fo.reported == s.fo.dead {
            return Ok(());
        }
        let Some(leader) = (0..self.cfg.servers.len()).find(|&si| s.fo.dead & (1u64 << si) == 0 && s.controls[si].is_some()) else {
            return Err(ClientError::Refused {
                server: self.server_names(s.fo.dead),
                reject: format!("every server of job {job:#x} is lost (last: {why}); no server left to fail over to"),
            });
        };
        self.report(sub, leader)
    }

    /// Sends the leader this rank's boundary and its view of every stream.
    fn report(&mut self, sub: usize, leader: usize) -> Result<(), ClientError> {
        let window = self.cfg.window as usize;
        let boundary = self.first_uncut(sub);
        let s = &self.subs[sub];
        let mut msg = Vec::with_capacity(32 + 8 * s.streams.len());
        msg.extend_from_slice(bytemuck::bytes_of(&wire::Lost::new(s.fo.dead, boundary, 8 * s.streams.len() as u32)));
        for (st, stream) in s.streams.iter().enumerate() {
            let mask = held_mask(stream, &s.flights[st * window..(st + 1) * window]);
            msg.extend_from_slice(&stream.head_seq.to_le_bytes());
            msg.extend_from_slice(&mask.to_le_bytes());
        }
        let dead = s.fo.dead;
        log::debug!(
            "job {:#x}: reporting lost servers {dead:#x} to {} (boundary {boundary})",
            self.job_id_of(sub),
            self.cfg.servers[leader]
        );
        match self.send_control(sub, leader, &msg) {
            Ok(()) => {
                let s = &mut self.subs[sub];
                s.fo.reported = dead;
                s.fo.recovering = true;
                Ok(())
            }
            Err(e) => self.lose(sub, 1u64 << leader, &format!("cannot report to it: {e}")),
        }
    }

    /// The leader's verdict: every rank's report for the lost set `dead`,
    /// and the switch operation. Work out the items and start redoing them.
    pub(super) fn recover(&mut self, sub: usize, dead: u64, switch_op: u64, reports: Vec<u8>) -> Result<(), ClientError> {
        let job = self.job_id_of(sub);
        let (nranks, window) = (self.cfg.nranks as usize, self.cfg.window as usize);
        {
            let s = &self.subs[sub];
            if dead != s.fo.dead || s.fo.round.is_some() || !s.fo.recovering {
                log::debug!("job {job:#x}: recovery for {dead:#x} is stale here (lost {:#x}); ignored", s.fo.dead);
                return Ok(());
            }
        }
        let nstreams = self.subs[sub].streams.len();
        if reports.len() != nranks * nstreams * 8 {
            return Err(ClientError::Fabric(format!(
                "recovery of job {job:#x}: {} bytes of reports, expected {} ranks x {nstreams} streams x 8",
                reports.len(),
                nranks
            )));
        }
        let word = |i: usize| u32::from_le_bytes(reports[4 * i..4 * i + 4].try_into().unwrap());
        let heads: Vec<u32> = (0..nranks * nstreams).map(|i| word(2 * i)).collect();
        let masks: Vec<u32> = (0..nranks * nstreams).map(|i| word(2 * i + 1)).collect();
        let s = &mut self.subs[sub];
        let new = dead & !s.fo.handled;
        let dtype = s.dtype;
        let piece = s.chunk_elems * dtype.size();
        s.fo.recovering = false;
        s.fo.round = Some(Round {
            switch_op,
            dead: new,
            nranks,
            heads,
            masks,
            items: Vec::new(),
            queued: 0,
            jobs: Vec::new(),
            identity: identity(dtype, piece),
            identity_mh: None,
            done: 0,
        });
        let lost: Vec<usize> = std::mem::take(&mut s.fo.fresh);
        for &st in &lost {
            s.streams[st].died = switch_op;
        }
        // Per stream, the oldest head in wrapping order (every other is at or
        // after it): below it every rank has every result.
        let lo: Vec<u32> = (0..nstreams)
            .map(|st| {
                let r = s.fo.round.as_ref().unwrap();
                let hs: Vec<u32> = (0..nranks).map(|r2| r.heads[r2 * nstreams + st]).collect();
                hs.iter().copied().find(|&h| hs.iter().all(|&o| seq_ge(o, h))).unwrap_or(hs[0])
            })
            .collect();
        let mut items = Vec::new();
        // (a) Results staged here of operations that completed here.
        let s = &self.subs[sub];
        if let Some(stage) = &s.stage {
            for &st in &lost {
                for k in 0..stage.slots {
                    let h = stage.meta[st * stage.slots + k];
                    let in_flight = (0..window).any(|w| s.flights[st * window + w].op != 0 && s.flights[st * window + w].seq == h.seq);
                    if h.valid && seq_ge(h.seq, lo[st]) && !in_flight {
                        items.push(Item {
                            op_index: h.op_index,
                            chunk: h.chunk as usize,
                            st,
                            seq: h.seq,
                            len: h.len as usize,
                            op: 0,
                            off: 0,
                            holder: None,
                            done: false,
                        });
                    }
                }
            }
        }
        // (b) Flights to the lost servers, as they stood when lost.
        for &st in &lost {
            for w in 0..window {
                let f = self.subs[sub].flights[st * window + w];
                if f.op == 0 {
                    continue;
                }
                self.subs[sub].flights[st * window + w] = Flight::default();
                let Some(pos) = self.ops.iter().position(|o| o.id == f.op) else { continue };
                let op = &self.ops[pos];
                let (off, len) = op.span(f.chunk);
                let index = op.index;
                if f.recv_done {
                    // The result is here; only the send's completion was missing.
                    // (Never a relayed piece: relay jobs have one server.)
                    let s = &mut self.subs[sub];
                    stage::land(s, &self.ops[pos], st, f.seq, f.chunk, Landed::of(self.ops[pos].rail_copies(&self.rails)));
                    self.ops[pos].done += 1;
                    items.push(Item { op_index: index, chunk: f.chunk, st, seq: f.seq, len, op: 0, off, holder: None, done: false });
                } else {
                    items.push(Item { op_index: index, chunk: f.chunk, st, seq: f.seq, len, op: f.op, off, holder: None, done: false });
                }
            }
            let stream = &mut self.subs[sub].streams[st];
            stream.head_seq = stream.next_seq;
            stream.head_slot = stream.next_slot;
        }
        items.sort_by_key(|it| (it.op_index, it.chunk));
        self.subs[sub].fo.round.as_mut().unwrap().items = items;
        // (c) Chunks of operations already cut that were never posted there.
        for oi in 0..self.ops.len() {
            if self.ops[oi].sub == sub && self.ops[oi].planned && self.ops[oi].index < switch_op {
                self.redo_cut(oi)?;
            }
        }
        {
            let r = self.subs[sub].fo.round.as_mut().unwrap();
            r.items.sort_by_key(|it| (it.op_index, it.chunk));
        }
        if let Err(e) = self.join_redo(sub) {
            return Err(ClientError::Refused {
                server: self.server_names(!dead & ((1u64 << self.cfg.servers.len()) - 1)),
                reject: format!("the recovery of job {job:#x} from losing {} failed: {e}", self.server_names(new)),
            });
        }
        if self.rails.needs_local_mr() {
            let r = self.subs[sub].fo.round.as_mut().unwrap();
            // SAFETY: the identity piece lives in the round, which
            // deregisters it before it drops (`maybe_end_round`).
            let mh = unsafe { self.rails.register(r.identity.as_mut_ptr(), r.identity.len()) }
                .map_err(|e| ClientError::Fabric(format!("registering the identity piece: {e}")))?;
            r.identity_mh = Some(mh);
        }
        self.classify(sub)?;
        log::info!(
            "job {job:#x}: recovering from losing {}: operations from {switch_op} run on the other servers; {} chunks to redo",
            self.server_names(new),
            self.subs[sub].fo.round.as_ref().map_or(0, |r| r.items.iter().filter(|i| !i.done).count())
        );
        self.finish_done_ops()?;
        if !self.subs[sub].holding() {
            for oi in 0..self.ops.len() {
                if self.ops[oi].sub == sub && !self.ops[oi].planned {
                    self.plan(oi)?;
                }
            }
        }
        self.pump_due = true;
        self.pump()
    }

    /// Decides each new item from the reports (skip, relay or recompute)
    /// and queues it on its redo job's stream.
    fn classify(&mut self, sub: usize) -> Result<(), ClientError> {
        let me = self.cfg.rank;
        let job = self.job_id_of(sub);
        let nstreams = self.subs[sub].streams.len();
        let sum_only = self.subs[sub].op == ReduceOp::Sum;
        let r = self.subs[sub].fo.round.as_mut().unwrap();
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

    /// An error completion: from a lost server's stream, expected (canceled);
    /// from a live server's, that server is lost to this job (if it can fail
    /// over); from a redo job, a second loss.
    pub(super) fn on_error_completion(&mut self, e: crate::dataplane::fabric::CompletionError) -> Result<(), ClientError> {
        let Some(ctx) = e.context else { return Err(ClientError::Fabric(e.to_string())) };
        let (sub, local) = ((ctx / self.per_sub) as usize, ctx % self.per_sub);
        if sub >= self.subs.len() {
            return Err(ClientError::Fabric(e.to_string()));
        }
        if local >= self.redo_base() {
            return Err(ClientError::Fabric(format!("while recovering from a lost server: {e}")));
        }
        let st = (local >> 1) as usize / self.cfg.window as usize;
        let Some(si) = self.subs[sub].streams.get(st).map(|s| s.server) else { return Err(ClientError::Fabric(e.to_string())) };
        if self.subs[sub].lost_stream(st) {
            return Ok(());
        }
        if self.subs[sub].stage.is_some() {
            return self.lose(sub, 1u64 << si, &format!("fabric error: {e}"));
        }
        Err(ClientError::Fabric(e.to_string()))
    }
}

/// A stream's report mask: bit i is set when this rank holds the result of
/// sequence `head_seq + i` (`flights` are the stream's window of slots).
/// Held: its result came in, or the flight completed already: its slot is
/// cleared while the head still waits for an older flight in flight (results
/// can complete out of order, e.g. a relayed small piece beside a large one),
/// and its result is staged like any other.
fn held_mask(stream: &Stream, flights: &[Flight]) -> u32 {
    let window = flights.len();
    let posted = stream.next_seq.wrapping_sub(stream.head_seq) as usize;
    let mut mask = 0u32;
    for i in 0..window.min(posted) {
        let seq = stream.head_seq.wrapping_add(i as u32);
        let f = &flights[(stream.head_slot as usize + i) % window];
        if f.op == 0 || (f.seq == seq && f.recv_done) {
            mask |= 1 << i;
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::{held_mask, identity, seq_ge};
    use crate::client::{Flight, Stream};
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

    /// Window 4, head at sequence 10 in slot 2; 10, 11 and 12 posted. 11
    /// completed before 10 (its slot is cleared, the head still waits on
    /// 10), 12's result came in but its send did not complete, 10 waits
    /// for its result: this rank holds 11 and 12 (bits 1 and 2), not 10.
    /// Before 9be490d the cleared slot of 11 was reported as not held.
    #[test]
    fn a_flight_completed_out_of_order_counts_as_held() {
        let mut stream = Stream::new(0, 0, 0, crate::wire::JobTag { job: 1, key: 0 });
        (stream.head_seq, stream.head_slot, stream.next_seq, stream.next_slot) = (10, 2, 13, 1);
        let mut flights = [Flight::default(); 4];
        flights[2] = Flight { op: 7, seq: 10, send_done: true, ..Flight::default() };
        flights[0] = Flight { op: 8, seq: 12, recv_done: true, ..Flight::default() };
        assert_eq!(held_mask(&stream, &flights), 0b110);
        // A result still missing is not held; nothing past next_seq is.
        flights[0].recv_done = false;
        assert_eq!(held_mask(&stream, &flights), 0b010);
        // A stale flight (an older sequence in the slot) is not this one.
        flights[0] = Flight { op: 8, seq: 8, recv_done: true, ..Flight::default() };
        assert_eq!(held_mask(&stream, &flights), 0b010);
        // Sequences wrap at 2^32, not at a multiple of the window.
        (stream.head_seq, stream.next_seq) = (u32::MAX, 2);
        flights[2].seq = u32::MAX;
        flights[0] = Flight { op: 8, seq: 1, recv_done: true, ..Flight::default() };
        assert_eq!(held_mask(&stream, &flights), 0b110);
    }

    #[test]
    fn sequence_order_wraps() {
        assert!(seq_ge(5, 5) && seq_ge(6, 5) && !seq_ge(4, 5));
        assert!(seq_ge(2, u32::MAX - 1) && !seq_ge(u32::MAX - 1, 2));
    }
}
