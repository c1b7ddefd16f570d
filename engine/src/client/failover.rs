//! Failover: a job keeps running when one of its servers dies.
//!
//! An all-reduce's shard is the same rank-order reduction wherever it is
//! computed, so work a dead server held can be redone on the others with a
//! bit-identical result, provided someone still has either the result or
//! every rank's input. Two things make that always true here:
//!
//! - **Results land in a staging area** ([`Stage`]) and are copied into the
//!   caller's buffer only once whole. An in-place all-reduce's input is
//!   therefore never half overwritten by a result that stopped arriving.
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
//! Rejoin: once a recovery is over, a background thread ([`Watcher`]) tries
//! to reach the lost servers; one that answers again (restarted on its
//! address) gets a Hello flagged REJOIN for the same job, admits it once
//! every rank is back, and asks each rank for its boundary: from the
//! largest, K, operations are cut over its new streams too (streams carry
//! the operations from `born` to before `died`; every rank agrees on both).
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
use super::rails::Rails;
use super::{Client, ClientError, Flight, Op, Stream, SubJob};
use crate::dataplane::fabric::MemoryHandle;
use crate::reduce::{DataType, ReduceOp};
use crate::wire::{self, Hello, JobSpec};
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

/// Where a sub-job's results land before they are copied out: per stream,
/// twice the window of piece-sized slots, and what each holds. One block
/// per stream, so that a server taken back adds streams without moving
/// the slots receives are posted into.
pub struct Stage {
    blocks: Vec<Block>,
    piece: usize,
    /// Slots per stream: twice the window.
    slots: usize,
    meta: Vec<Held>,
}

/// One stream's staging slots (registered where the provider wants local
/// buffers registered, as EFA does).
struct Block {
    ptr: *mut u8,
    layout: std::alloc::Layout,
    mh: Option<MemoryHandle>,
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated in `Stage::add` with this layout. The client
        // cancels every receive before its sub-jobs go (Client's Drop).
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// What a staging slot holds once its flight completed.
#[derive(Clone, Copy, Default)]
struct Held {
    valid: bool,
    seq: u32,
    len: u32,
    chunk: u32,
    op_index: u64,
}

impl Stage {
    /// Slots for `streams` streams; registered on `rails` if the provider
    /// wants local buffers registered.
    pub fn new(streams: usize, window: usize, piece: usize, rails: &mut Rails) -> Result<Stage, ClientError> {
        let mut s = Stage { blocks: Vec::new(), piece, slots: 2 * window, meta: Vec::new() };
        s.add(streams, rails)?;
        Ok(s)
    }

    /// Slots for `n` more streams.
    pub fn add(&mut self, n: usize, ep: &mut Rails) -> Result<(), ClientError> {
        for _ in 0..n {
            let layout = std::alloc::Layout::from_size_align((self.slots * self.piece).max(64), 64).expect("staging layout");
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            prefault(ptr, layout.size());
            let mut block = Block { ptr, layout, mh: None };
            if ep.needs_local_mr() {
                // SAFETY: the block stays allocated while registered: the
                // endpoint closes its registrations before the sub-jobs'
                // stages drop (field order of Client), and redo stages are
                // deregistered before they drop (`maybe_end_round`).
                let mh = unsafe { ep.register(ptr, layout.size()) }
                    .map_err(|e| ClientError::Fabric(format!("registering the staging area: {e}")))?;
                block.mh = Some(mh);
            }
            self.blocks.push(block);
        }
        self.meta.resize(self.blocks.len() * self.slots, Held::default());
        Ok(())
    }

    /// The registration of stream `st`'s slots, where the provider wants one.
    #[inline(always)]
    pub fn mh(&self, st: usize) -> Option<MemoryHandle> {
        self.blocks[st].mh
    }

    fn deregister(&mut self, ep: &mut Rails) {
        for b in &mut self.blocks {
            if let Some(mh) = b.mh.take() {
                let _ = ep.deregister(mh);
            }
        }
    }

    /// The slot of sequence `seq` on stream `st`.
    #[inline(always)]
    pub fn slot(&self, st: usize, seq: u32) -> *mut u8 {
        // SAFETY: (seq mod slots) * piece lies inside the stream's block.
        unsafe { self.blocks[st].ptr.add(seq as usize % self.slots * self.piece) }
    }
}

/// Touches every page of a fresh allocation, so that its page faults happen
/// here, at the join, and not in the provider's receives during the first
/// all-reduces (a worker's staging area is tens of MiB: at 32 Gbit/s the
/// faults took a tenth off the first ten all-reduces' rate on the device).
fn prefault(ptr: *mut u8, len: usize) {
    for off in (0..len).step_by(4096) {
        // SAFETY: off < len, inside the allocation; a volatile write of the
        // zero already there, so the compiler keeps it.
        unsafe { std::ptr::write_volatile(ptr.add(off), 0) };
    }
}

/// A completed flight's result: copy it out of the staging slot into the
/// caller's buffer (unless a rail thread `copied` it already) and remember
/// what the slot holds.
#[inline]
pub(super) fn land(s: &mut SubJob, op: &Op, st: usize, seq: u32, chunk: usize, copied: bool) {
    let Some(stage) = s.stage.as_mut() else { return };
    let off = chunk * op.chunk_bytes;
    let len = op.chunk_bytes.min(op.bytes - off);
    if !copied {
        // SAFETY: the slot holds the whole result (its receive completed); the
        // caller's buffer holds `bytes` (contract of `start`), off + len <= bytes.
        unsafe { std::ptr::copy_nonoverlapping(stage.slot(st, seq), op.recv.add(off), len) };
    }
    let i = st * stage.slots + seq as usize % stage.slots;
    stage.meta[i] = Held { valid: true, seq, len: len as u32, chunk: chunk as u32, op_index: op.index };
}

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

/// A lost server that answered again, on its way back into the job.
struct Rejoin {
    server: usize,
    conn: TcpStream,
    phase: RejoinPhase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RejoinPhase {
    /// Hello sent; waiting for the Accept (every rank must come).
    Accept,
    /// Accepted (its new streams added); waiting for its Rejoin question.
    Question,
    /// Answered with our boundary; waiting for the switch.
    Switch,
    /// Taken back (the entry goes).
    Done,
}

/// A thread that tries to reach lost servers (a blocking connect to a dead
/// host must not stall the data path) and hands over the connections.
pub struct Watcher {
    /// (sub-job, server, address) still to reach.
    wanted: std::sync::Arc<std::sync::Mutex<Vec<(usize, usize, std::net::SocketAddr)>>>,
    /// Connections made, not yet taken.
    reached: std::sync::Arc<std::sync::Mutex<Vec<(usize, usize, TcpStream)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Watcher {
    fn start() -> Watcher {
        use std::sync::{atomic::AtomicBool, atomic::Ordering, Arc, Mutex};
        let wanted: Arc<Mutex<Vec<(usize, usize, std::net::SocketAddr)>>> = Arc::default();
        let reached: Arc<Mutex<Vec<(usize, usize, TcpStream)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (w, r, st) = (wanted.clone(), reached.clone(), stop.clone());
        let _ = std::thread::Builder::new().name("tally-rejoin".into()).spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let todo: Vec<_> = w.lock().map(|v| v.clone()).unwrap_or_default();
                for (sub, si, addr) in todo {
                    if let Ok(c) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                        if let (Ok(mut wv), Ok(mut rv)) = (w.lock(), r.lock()) {
                            wv.retain(|x| (x.0, x.1) != (sub, si));
                            rv.push((sub, si, c));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        Watcher { wanted, reached, stop }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
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
        self.stats
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
                            let rail = self.rails.rail_of(si);
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
                let off = f.chunk * op.chunk_bytes;
                let len = op.chunk_bytes.min(op.bytes - off);
                let index = op.index;
                if f.recv_done {
                    // The result is here; only the send's completion was missing.
                    // (Never a relayed piece: relay jobs have one server.)
                    let s = &mut self.subs[sub];
                    super::failover::land(s, &self.ops[pos], st, f.seq, f.chunk, self.ops[pos].rail_copies(&self.rails));
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
        self.pump()
    }

    /// Hands operation `oi`'s chunks on the lost streams, not yet posted,
    /// to the recovery (cut over the old set: every rank does the same).
    pub(super) fn redo_cut(&mut self, oi: usize) -> Result<(), ClientError> {
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
                let off = chunk * op.chunk_bytes;
                let len = op.chunk_bytes.min(op.bytes - off);
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

    /// Joins this recovery's redo jobs on every server not lost: a Sum job
    /// (relays, and recomputes of a Sum), and one with the sub-job's op when
    /// that is not Sum. Collective, like any join: every rank does it on
    /// receiving the same Recover.
    fn join_redo(&mut self, sub: usize) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        let (dtype, op, chunk_elems) = (s.dtype, s.op, s.chunk_elems);
        let round_no = s.fo.handled.count_ones() as u64 + 1;
        let dead = s.fo.dead;
        let base = self.job_id_of(sub) ^ 0x5245_444f_0000_0000 ^ (round_no << 40);
        let mut ops = vec![ReduceOp::Sum];
        if op != ReduceOp::Sum {
            ops.push(op);
        }
        let survivors: Vec<usize> = (0..self.cfg.servers.len()).filter(|&si| dead & (1u64 << si) == 0).collect();
        let mut jobs = Vec::new();
        for (j, &rop) in ops.iter().enumerate() {
            let spec = JobSpec {
                job_id: base ^ ((j as u64 + 1) << 32) ^ (rop as u64),
                nranks: self.cfg.nranks,
                dtype,
                op: rop,
                chunk_elems: chunk_elems as u32,
                window: REDO_WINDOW,
                shards: 1,
                // Redo chunks are whole results, whatever their size.
                relay: false,
                split: false,
            };
            let mut conns = Vec::new();
            for &si in &survivors {
                // Named by the rail that carries this server's streams.
                let hello = Hello::new(&spec, self.cfg.rank, &self.token, self.rails.name(self.rails.rail_of(si)).as_bytes())
                    .ok_or_else(|| ClientError::Fabric("endpoint name too long".into()))?;
                let server = &self.cfg.servers[si];
                let err = |e: String| ClientError::Connect { server: server.clone(), error: e };
                let addr = server.to_socket_addrs().map_err(|e| err(e.to_string()))?.next().ok_or_else(|| err("no address".into()))?;
                // Every rank of every job on a lost server joins redo jobs on
                // the survivors at once (a reconnect storm): a refused or
                // timed-out connect is tried again, for at most REDO_CONNECT_FOR
                // (a survivor that stays unreachable that long is a second loss).
                let mut c = super::join::connect_retry(&addr, self.cfg.join_timeout.min(REDO_CONNECT_FOR)).map_err(err)?;
                let _ = c.set_nodelay(true);
                c.write_all(bytemuck::bytes_of(&hello)).map_err(|e| err(e.to_string()))?;
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
                        let addr =
                            self.rails.insert_peer(self.rails.rail_of(si), &g.names[0]).map_err(|e| ClientError::Fabric(e.to_string()))?;
                        streams.push(Stream::new(addr, si, g.tag));
                        super::keepalive(&c);
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
    fn redo_ctx(&self, j: usize, k: usize, w: usize) -> u32 {
        (((j * self.cfg.servers.len() + k) * REDO_WINDOW as usize + w) * 2) as u32
    }

    /// Posts queued items on every redo stream with room.
    pub(super) fn pump_redo(&mut self, sub: usize) -> Result<(), ClientError> {
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
    pub(super) fn post_redo(&mut self, sub: usize, local: u32) -> Result<(), ClientError> {
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
        let tag = wire::Tag::new(stream.job_tag, w as u16, f.seq).0;
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
            unsafe { self.rails.send(self.rails.rail_of(stream.server), src, it.len, mh, stream.addr, tag, ctx) }
        } else {
            // SAFETY: the redo job's staging slot w of stream k, a whole
            // piece, the target of this receive only.
            unsafe {
                self.rails.recv(
                    self.rails.rail_of(stream.server),
                    rj.stage.slot(k, w as u32),
                    it.len,
                    rj.stage.mh(k),
                    Some(stream.addr),
                    (tag, 0),
                    ctx,
                    None,
                )
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
    pub(super) fn on_redo_completion(&mut self, sub: usize, local: u32, is_recv: bool) -> Result<(), ClientError> {
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
    pub(super) fn finish_done_ops(&mut self) -> Result<(), ClientError> {
        while let Some(pos) = self.ops.iter().position(|o| o.planned && o.chunks > 0 && o.done >= o.chunks) {
            if let Some(op) = self.ops.remove(pos) {
                self.note_if_slow(&op);
                self.spare_next.push(op.next);
                if self.subs[op.sub].retiring {
                    self.retire(op.sub)?;
                }
            }
        }
        Ok(())
    }

    /// Ends the recovery once every item is done and every operation
    /// before the switch was cut: says Bye to the redo jobs.
    fn maybe_end_round(&mut self, sub: usize) -> Result<(), ClientError> {
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
        let watcher = s.fo.watcher.get_or_insert_with(Watcher::start);
        if let Ok(mut w) = watcher.wanted.lock() {
            for si in bits(r.dead) {
                if let Some(addr) = self.cfg.servers[si].to_socket_addrs().ok().and_then(|mut a| a.next()) {
                    w.push((sub, si, addr));
                }
            }
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

    /// Takes back lost servers that answer again: joins the job there anew
    /// (a Hello flagged REJOIN, the job's own spec), adds the streams of its
    /// Accept, answers its question with this rank's boundary and, at the
    /// switch operation K it names, cuts operations over it again. All
    /// ranks do the same (each finds the server within a second), so the
    /// server admits the job once every rank is back, like any job.
    pub(super) fn poll_rejoins(&mut self, sub: usize) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        if s.fo.round.is_some() || s.fo.recovering {
            return Ok(());
        }
        let reached: Vec<(usize, usize, TcpStream)> = match s.fo.watcher.as_ref().map(|w| w.reached.try_lock()) {
            Some(Ok(mut v)) if v.iter().any(|x| x.0 == sub) => {
                let (mine, rest): (Vec<_>, Vec<_>) = v.drain(..).partition(|x| x.0 == sub);
                *v = rest;
                mine
            }
            _ => Vec::new(),
        };
        for (_, si, mut conn) in reached {
            let spec = JobSpec {
                job_id: self.job_id_of(sub),
                nranks: self.cfg.nranks,
                dtype: self.subs[sub].dtype,
                op: self.subs[sub].op,
                chunk_elems: self.subs[sub].chunk_elems as u32,
                window: self.cfg.window,
                shards: self.cfg.shards,
                relay: self.subs[sub].relay.is_some(),
                split: self.subs[sub].split.is_some(),
            };
            let name = self.rails.name(self.rails.rail_of(si));
            let Some(mut hello) = Hello::new(&spec, self.cfg.rank, &self.token, name.as_bytes()) else { continue };
            hello.flags |= Hello::REJOIN;
            if self.wants_heartbeats() {
                hello.flags |= Hello::ALIVE;
            }
            let _ = conn.set_nodelay(true);
            super::keepalive(&conn);
            if conn.write_all(bytemuck::bytes_of(&hello)).is_ok() && conn.set_nonblocking(true).is_ok() {
                log::info!("server {} answers again: taking it back into job {:#x}", self.cfg.servers[si], spec.job_id);
                self.subs[sub].fo.rejoins.push(Rejoin { server: si, conn, phase: RejoinPhase::Accept });
            } else {
                self.watch_again(sub, si);
            }
        }
        let mut i = 0;
        while i < self.subs[sub].fo.rejoins.len() {
            match self.step_rejoin(sub, i) {
                Ok(true) => i += 1,
                Ok(false) => {
                    self.subs[sub].fo.rejoins.remove(i);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn watch_again(&mut self, sub: usize, si: usize) {
        if let (Some(w), Some(addr)) =
            (self.subs[sub].fo.watcher.as_ref(), self.cfg.servers[si].to_socket_addrs().ok().and_then(|mut a| a.next()))
        {
            if let Ok(mut v) = w.wanted.lock() {
                v.push((sub, si, addr));
            }
        }
    }

    /// Advances rejoin `i` with what arrived; false: it is over (taken
    /// back, or given up).
    fn step_rejoin(&mut self, sub: usize, i: usize) -> Result<bool, ClientError> {
        use std::io::Read;
        let si = self.subs[sub].fo.rejoins[i].server;
        let server = self.cfg.servers[si].clone();
        let mut hdr = [0u8; core::mem::size_of::<wire::Accept>()];
        let n = match self.subs[sub].fo.rejoins[i].conn.peek(&mut hdr) {
            Ok(0) => {
                log::info!("server {server} went away again while taking it back; waiting for it");
                self.watch_again(sub, si);
                return Ok(false);
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(true),
            Err(_) => {
                self.watch_again(sub, si);
                return Ok(false);
            }
        };
        if n < 8 {
            return Ok(true);
        }
        let kind = match wire::read::<wire::Header>(&hdr).and_then(|h| h.check()) {
            Ok(k) => k,
            Err(e) => {
                log::warn!("server {server}: {e} while taking it back; giving up on it for this job");
                return Ok(false);
            }
        };
        let phase = self.subs[sub].fo.rejoins[i].phase;
        let need = match (kind, phase) {
            (wire::Kind::Reject, _) => core::mem::size_of::<wire::Reject>(),
            (wire::Kind::Accept, RejoinPhase::Accept) => {
                if n < hdr.len() {
                    return Ok(true);
                }
                let a: wire::Accept = wire::read(&hdr).map_err(|e| ClientError::Fabric(e.to_string()))?;
                hdr.len() + a.lcores.min(4096) as usize * core::mem::size_of::<wire::NameRecord>()
            }
            (wire::Kind::Rejoin, RejoinPhase::Question) => 8,
            // Heartbeats start once the server admitted the job again.
            (wire::Kind::Alive, RejoinPhase::Question | RejoinPhase::Switch) => 8,
            (wire::Kind::SwitchAt, RejoinPhase::Switch) => core::mem::size_of::<wire::SwitchAt>(),
            (k, p) => {
                log::warn!("server {server}: unexpected {k:?} while taking it back ({p:?}); giving up on it for this job");
                return Ok(false);
            }
        };
        let mut msg = vec![0u8; need];
        let c = &mut self.subs[sub].fo.rejoins[i].conn;
        if c.peek(&mut msg).map_or(true, |got| got < need) {
            return Ok(true);
        }
        if c.read_exact(&mut msg).is_err() {
            self.watch_again(sub, si);
            return Ok(false);
        }
        match kind {
            // Taken; whatever follows it is read at once.
            wire::Kind::Alive => self.step_rejoin(sub, i),
            wire::Kind::Reject => {
                let r: wire::Reject = wire::read(&msg).map_err(|e| ClientError::Fabric(e.to_string()))?;
                if r.code() == Some(wire::RejectCode::Busy) {
                    // Every rank of every job reconnects to a restarted
                    // server at once: the watcher tries again in 0.5 s.
                    log::debug!("server {server} is busy ({r}); taking it back later");
                    self.watch_again(sub, si);
                    return Ok(false);
                }
                log::warn!("server {server} refused to take job {:#x} back ({r}); the job goes on without it", self.job_id_of(sub));
                Ok(false)
            }
            wire::Kind::Accept => {
                let a: wire::Accept = wire::read(&msg).map_err(|e| ClientError::Fabric(e.to_string()))?;
                let window = self.cfg.window as usize;
                if a.piece_elems != 0 && (a.piece_elems as usize) < self.subs[sub].chunk_elems {
                    log::warn!(
                        "server {server} grants pieces of {} elements now, fewer than job {:#x}'s {}: it goes on without it",
                        a.piece_elems,
                        self.job_id_of(sub),
                        self.subs[sub].chunk_elems
                    );
                    return Ok(false);
                }
                let s = &self.subs[sub];
                let grown = s.streams.len() + a.lcores as usize;
                if (grown * window * 2) as u32 + REDO_CONTEXTS_PER_SERVER * self.cfg.servers.len() as u32 > self.per_sub {
                    log::warn!(
                        "server {server}: no room for its streams in this client's context table; job {:#x} goes on without it",
                        self.job_id_of(sub)
                    );
                    return Ok(false);
                }
                let mut added = Vec::new();
                let latency_lcores = a.latency_split().map_or(0, |(l, _)| l);
                for k in 0..a.lcores as usize {
                    let off = hdr.len() + k * core::mem::size_of::<wire::NameRecord>();
                    let rec: wire::NameRecord = wire::read(&msg[off..]).map_err(|e| ClientError::Fabric(e.to_string()))?;
                    let name = rec.name().map_err(|e| ClientError::Fabric(e.to_string()))?;
                    let name =
                        crate::dataplane::fabric::EndpointName::from_bytes(name).ok_or_else(|| ClientError::Fabric("bad name".into()))?;
                    let addr = self.rails.insert_peer(self.rails.rail_of(si), &name).map_err(|e| ClientError::Fabric(e.to_string()))?;
                    // It carries nothing until the switch names its first operation.
                    added.push(Stream { born: u64::MAX, latency: k < latency_lcores, ..Stream::new(addr, si, a.job_tag) });
                }
                let s = &mut self.subs[sub];
                let n = added.len();
                s.streams.extend(added);
                s.flights.resize(s.streams.len() * window, Flight::default());
                if let Some(stage) = s.stage.as_mut() {
                    stage.add(n, &mut self.rails)?;
                }
                s.fo.rejoins[i].phase = RejoinPhase::Question;
                Ok(true)
            }
            wire::Kind::Rejoin => {
                let b = self.first_uncut(sub);
                let msg = wire::Boundary::new(b);
                let c = &mut self.subs[sub].fo.rejoins[i].conn;
                let _ = c.set_nonblocking(false);
                let ok = c.write_all(bytemuck::bytes_of(&msg)).is_ok();
                let _ = c.set_nonblocking(true);
                if !ok {
                    self.watch_again(sub, si);
                    return Ok(false);
                }
                self.subs[sub].fo.rejoins[i].phase = RejoinPhase::Switch;
                Ok(true)
            }
            _ => {
                let k = wire::read::<wire::SwitchAt>(&msg).and_then(|m| m.check()).map_err(|e| ClientError::Fabric(e.to_string()))?;
                let job = self.job_id_of(sub);
                // The caller drops the rejoin entry; the connection lives on
                // (a duplicate descriptor) as the job's control connection.
                let conn = self.subs[sub].fo.rejoins[i].conn.try_clone().map_err(|e| ClientError::Fabric(e.to_string()))?;
                let s = &mut self.subs[sub];
                s.fo.rejoins[i].phase = RejoinPhase::Done;
                for st in s.streams.iter_mut().filter(|st| st.server == si && st.born == u64::MAX) {
                    st.born = k;
                }
                s.fo.dead &= !(1u64 << si);
                s.fo.handled &= !(1u64 << si);
                s.fo.reported &= !(1u64 << si);
                s.controls[si] = Some(conn);
                // Armed again by its first heartbeat on this connection.
                s.live.disarm(si);
                log::warn!("server {server} is back in job {job:#x} from operation {k}");
                self.stats.rejoins += 1;
                if !self.subs[sub].holding() {
                    for oi in 0..self.ops.len() {
                        if self.ops[oi].sub == sub && !self.ops[oi].planned {
                            self.plan(oi)?;
                        }
                    }
                }
                Ok(false)
            }
        }
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
        let mut stream = Stream::new(0, 0, 1);
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
