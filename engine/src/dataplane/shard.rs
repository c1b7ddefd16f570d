//! The per-lcore dataplane: lcore k serves shard k of every chunk of every job.
//!
//! For each job it serves, a shard owns `window` slots in its lcore's slab.
//! A slot holds one piece per rank. Receives for every (slot, rank) are
//! posted up front. When the last rank's piece of a slot has arrived the
//! shard reduces the pieces in rank order into piece 0 (so the result is the
//! same bit for bit whatever the arrival order), sends piece 0 to every rank,
//! and once all those sends completed reposts the slot's receives for the
//! slot's next sequence number (`seq + window`).
//!
//! Operation contexts encode where an operation belongs, so a completion is
//! decoded without any lookup structure:
//! `context = job_index * per_job + ((slot * nranks + rank) << 1 | is_send)`.
//! A receive that carries another job's tag, the wrong slot or sequence, or
//! an odd length fails that job (and only that job).
//!
//! Nothing in [`ShardWorker::poll_once`]'s steady state allocates, locks,
//! makes a system call of its own or logs: commands from the control plane
//! and events back to it go through channels checked only when idle or
//! every few thousand turns, and only job start and end use them.
//!
//! # Staged receives
//!
//! A job with many ranks may not fit a piece per rank per slot in its slab
//! budget (1024 ranks x window 2 x 256 KiB is 512 MiB). Rather than cut its
//! pieces smaller (each message then carries fewer bytes for the same fixed
//! costs), the control plane may stage it (`JobOnShard::stage` = B): a slot
//! holds an accumulator and B receive buffers. Ranks 0..B are posted; when
//! rank `next`'s piece is in, it and the ranks after it that are also in are
//! folded into the accumulator in rank order (the kernels' staged form,
//! `Kernels::fold`), and each folded rank's buffer takes a receive for
//! rank + B. The fold is the same left fold in rank order that the one-pass
//! reduce does, so the result is bit-identical: `avg` divides once, after
//! the last rank, and 16-bit floats accumulate `f32` partials (their
//! accumulator takes two strides) rounded once, into the accumulator's first
//! half, which is what goes back to the ranks. The pieces of ranks not yet
//! posted wait at the provider (a rendezvous header, or an unexpected
//! message) until their buffer frees.
//!
//! # Split slots
//!
//! A split job (see [`crate::dataplane::split`]) has `window` more slots,
//! `window..2 x window`, for its small all-reduces: each takes only this
//! lcore's group of ranks, in a small area after the job's region, and
//! folds them into the group's partial; the last lcore whose group is in
//! combines the partials, and each lcore sends the result to its own group.
//!
//! A straggler does not stall a job forever: when a slot's first piece has
//! waited [`ShardWorker`]'s `op_timeout` for the others, the job fails
//! naming the ranks that did not send. The check runs on the lcore's
//! housekeeping tick (every 4096 turns and when idle, at most every 50 ms),
//! not per chunk.
//!
//! Metrics: besides the lcore's own counters, each job has a preallocated
//! counter block per lcore in the server's [`MetricsTable`] (rounds, bytes,
//! reduce time, round-latency histogram), written only by this lcore. The
//! clock is read twice per slot round (first piece in, results posted) and
//! twice around the kernel (staged: around the fold, for every piece in):
//! `Instant::now` is a vDSO read, no system call.
use crate::dataplane::fabric::{Completion, Endpoint, MemoryHandle, PeerAddr, PollError, PostError};
use crate::dataplane::lcore::{bump, Counters, Worker};
use crate::dataplane::metrics::MetricsTable;
use crate::dataplane::slab::Slab;
use crate::dataplane::split::SplitShared;
use crate::reduce::{DataType, Kernels, MAX_INPUTS};
use crate::wire::{self, JobSpec, Tag, SPLIT_MAX, SPLIT_MAX_RANKS};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

/// Control plane to lcore.
pub enum Command {
    AddJob(Box<JobOnShard>),
    EndJob {
        index: u16,
    },
    /// A rank of the job closed its control connection without finishing
    /// (its process died or dropped its client): what is still queued to
    /// it on a connection-based provider will never be taken.
    RankGone {
        index: u16,
        rank: u32,
    },
    /// A rank of the job said Bye (it finished) while others have not: a
    /// round of the job that starts from now on can never complete.
    RankFinished {
        index: u16,
        rank: u32,
    },
}

/// How an lcore sends [`Event`]s: a channel, and a wake-up for the control
/// thread, which sleeps in epoll rather than on the channel. Events are
/// rare (a job ready, failed or ended), never per chunk.
#[derive(Clone)]
pub struct EventSender {
    tx: Sender<Event>,
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl EventSender {
    pub fn new(tx: Sender<Event>, wake: Arc<dyn Fn() + Send + Sync>) -> EventSender {
        EventSender { tx, wake }
    }

    pub fn send(&self, ev: Event) -> Result<(), std::sync::mpsc::SendError<Event>> {
        self.tx.send(ev)?;
        (self.wake)();
        Ok(())
    }
}

/// Messages to the control plane, from lcores.
pub enum Event {
    JobReady {
        lcore: usize,
        tag: u16,
    },
    JobFailed {
        lcore: usize,
        tag: u16,
        reason: String,
    },
    /// The lcore is done with the job; `stuck` operations never completed
    /// (their region and job slot must not be reused).
    JobEnded {
        lcore: usize,
        tag: u16,
        stuck: u32,
    },
    LcoreError {
        lcore: usize,
        reason: String,
    },
    /// The provider reported that this lcore's connection to a rank of the
    /// job failed: the rank is gone for every lcore (see `Command::RankGone`).
    RankGone {
        tag: u16,
        rank: u32,
    },
    /// A job this lcore had reported ended with operations stuck in flight
    /// got all of them back at last (e.g. its peers' connections finally
    /// failed): its region and job slot may be reused.
    JobReleased {
        lcore: usize,
        tag: u16,
    },
}

/// Everything a shard needs to serve one job, built by the control plane.
pub struct JobOnShard {
    pub index: u16,
    pub tag: u16,
    /// The job as admitted: `chunk_elems` is the piece the control plane
    /// granted (`budget.rs`), which every receive is posted for.
    pub spec: JobSpec,
    /// Byte offset of the job's region in the slab.
    pub base: usize,
    /// Distance between pieces (piece size rounded up to a cache line).
    pub stride: usize,
    /// Receive buffers per slot (0: one per rank; see "Staged receives").
    pub stage: u32,
    /// Fabric names of the ranks' endpoints, in rank order.
    pub client_names: Vec<crate::dataplane::fabric::EndpointName>,
    /// This lcore's part of a split job (see [`crate::dataplane::split`]);
    /// None: the job is not split, or not over this lcore.
    pub split: Option<SplitOn>,
}

/// An lcore's part of a split job: its position among the job's split
/// lcores and where its split area starts in its slab.
pub struct SplitOn {
    pub shared: Arc<SplitShared>,
    pub position: u32,
    pub base: usize,
}

/// This lcore's side of a split job, as it runs.
struct SplitPart {
    shared: Arc<SplitShared>,
    position: u32,
    /// Its split area (published in `shared`).
    area: *mut u8,
    /// The ranks whose small pieces come to this lcore.
    ranks: core::ops::Range<u32>,
}

/// Why a job fails when a round starts after one of its ranks finished.
fn finished_message(rank: u32) -> String {
    format!("rank {rank} finished (said Bye) but other ranks started another all-reduce: every rank must issue the same ones")
}

/// Strides a slot of a job takes in its region: a piece per rank, or
/// (staged, `stage` > 0) the accumulator, two strides for 16-bit floats
/// (their `f32` partials), and `stage` receive buffers.
pub fn slot_strides(dtype: DataType, nranks: u32, stage: u32) -> usize {
    match stage {
        0 => nranks as usize,
        b => dtype.accumulator_size() / dtype.size() + b as usize,
    }
}

fn per_slot(on: &JobOnShard) -> usize {
    slot_strides(on.spec.dtype, on.spec.nranks, on.stage)
}

#[derive(Clone, Copy, Default)]
struct Slot {
    /// The sequence number the slot's current round must carry.
    seq: u32,
    arrived: u32,
    /// Length of the pieces of this round (all ranks must agree).
    len: u32,
    sends_left: u32,
    /// Staged: the next rank to fold into the accumulator.
    next: u32,
    /// Relay: the first piece of this round waits for the other rank to be
    /// heard from (see `Job::heard`) and goes on with the second.
    deferred: bool,
    /// Split slot: this lcore's group is in, and it waits for the combiner.
    combine_wait: bool,
    /// Split slot: the position whose area holds this round's result.
    from: u32,
    /// When the round's first piece arrived (for the latency histogram).
    first: Option<Instant>,
    /// When the round's results were posted, while some are not taken yet.
    sending_since: Option<Instant>,
}

impl Job {
    /// Where (slot, rank)'s piece is received: its own piece, or (staged)
    /// buffer `rank mod stage` after the slot's accumulator.
    fn piece_ptr(&self, slot: usize, rank: usize) -> *mut u8 {
        if let Some(sp) = self.split_of(slot) {
            let off = sp.shared.offset(sp.position, slot - self.on.spec.window as usize, Some(rank as u32));
            // SAFETY: the area is SplitShared::area_len bytes (the control
            // plane allocated it after the region, checked in add_job), and
            // `rank` is one of this lcore's group (only those are posted).
            return unsafe { sp.area.add(off) };
        }
        let stage = self.on.stage as usize;
        let off = if stage == 0 {
            (slot * self.on.spec.nranks as usize + rank) * self.on.stride
        } else {
            let acc = self.per_slot() - stage;
            (slot * self.per_slot() + acc + rank % stage) * self.on.stride
        };
        // SAFETY: the control plane gave the job window x per_slot strides
        // at `region`, checked against the slab's length in add_job;
        // `rank < nranks` and `slot < window`.
        unsafe { self.region.add(off) }
    }

    /// Strides per slot: a piece per rank, or (staged) the accumulator's
    /// and the receive buffers'.
    fn per_slot(&self) -> usize {
        per_slot(&self.on)
    }

    /// Where a slot's result is: piece 0, or (staged) the accumulator.
    fn result_ptr(&self, slot: usize) -> *mut u8 {
        if let Some(sp) = self.split_of(slot) {
            let from = self.slots[slot].from;
            let area = if from == sp.position { sp.area } else { sp.shared.area(from).unwrap_or(sp.area) };
            // SAFETY: position `from`'s area is its area_len bytes long,
            // and the result buffer is inside it.
            return unsafe { area.add(sp.shared.offset(from, slot - self.on.spec.window as usize, None)) };
        }
        let stage = self.on.stage as usize;
        if stage == 0 {
            return self.piece_ptr(slot, 0);
        }
        // SAFETY: as in piece_ptr; the accumulator is the slot's first strides.
        unsafe { self.region.add(slot * self.per_slot() * self.on.stride) }
    }

    /// What a send of `slot`'s round to `rank` carries: the result, or in a
    /// relay job (small pieces) the other rank's piece.
    fn send_ptr(&self, slot: usize, rank: usize, len: u32) -> *mut u8 {
        match self.on.spec.relays(len as usize) {
            true => self.piece_ptr(slot, 1 - rank),
            false => self.result_ptr(slot),
        }
    }

    /// Ranks whose receives a slot posts at the start of a round.
    fn first_posted(&self, slot: usize) -> core::ops::Range<u32> {
        if let Some(sp) = self.split_of(slot) {
            return sp.ranks.clone();
        }
        match self.on.stage {
            0 => 0..self.on.spec.nranks,
            b => 0..b.min(self.on.spec.nranks),
        }
    }

    /// The split part, if `slot` is one of a split job's split slots
    /// (`window..2 x window`).
    fn split_of(&self, slot: usize) -> Option<&SplitPart> {
        self.split.as_ref().filter(|_| slot >= self.on.spec.window as usize)
    }

    /// Pieces a slot's round waits for: every rank's, or its group's.
    fn expected(&self, slot: usize) -> u32 {
        self.split_of(slot).map_or(self.on.spec.nranks, |sp| sp.ranks.len() as u32)
    }

    /// Bytes a receive of `slot` is posted for.
    fn recv_len(&self, slot: usize) -> usize {
        match self.split_of(slot) {
            Some(_) => SPLIT_MAX,
            None => self.on.spec.piece_bytes(),
        }
    }

    /// Context ids the job spans (every slot's receive and send per rank).
    fn span(&self) -> u32 {
        self.slots.len() as u32 * self.on.spec.nranks * 2
    }

    fn has_arrived(&self, slot: usize, rank: usize) -> bool {
        self.arrived_bits[slot * self.words_per_slot + rank / 64] & (1 << (rank % 64)) != 0
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Running,
    /// Failed or ended: nothing is reposted; waiting for in-flight operations
    /// (canceled) to complete before the region can be reused.
    Draining,
    /// Drained past [`DRAIN_TIMEOUT`] with operations still in flight: kept
    /// only so that its slot and context ids are never reused.
    Abandoned,
}

struct Job {
    on: JobOnShard,
    /// Start of the job's region in the slab.
    region: *mut u8,
    peers: Vec<PeerAddr>,
    slots: Vec<Slot>,
    state: State,
    /// Operations of this job in flight on the endpoint.
    outstanding: u32,
    /// One bit per (slot, rank) piece received this round, to name the
    /// ranks a straggling slot waits for. Preallocated: window x words.
    arrived_bits: Vec<u64>,
    words_per_slot: usize,
    /// Ranks whose control connection their side closed without finishing.
    gone: Vec<bool>,
    /// The first rank that said Bye while others still run the job.
    finished: Option<u32>,
    /// A split job's part on this lcore (its slots follow the job's
    /// `window` in `slots`).
    split: Option<SplitPart>,
    /// Relay jobs: the ranks (bit r) this lcore has had a piece from. A
    /// piece goes on to a rank only once it has: before that the rank's
    /// side of the connection may not be set up, and a provider that then
    /// connects from both ends at once loses messages (seen with shm and
    /// tcp;ofi_rxm 1.17: a rank's sends refused forever, or a result lost).
    heard: u8,
    /// When a draining job gives up waiting for its operations.
    drain_deadline: Option<std::time::Instant>,
}

/// How long a draining job waits for its canceled operations to complete.
/// Sends to a rank that was killed may never complete (tcp;ofi_rxm keeps them
/// queued on the dead connection); after this the job is reported ended with
/// its operations still in flight, and the control plane quarantines its
/// region and job slot instead of reusing memory the provider may still use.
pub const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub struct ShardWorker {
    pub lcore: usize,
    ep: Endpoint,
    // Declared after `ep`: the registration must go before the memory does.
    slab: Slab,
    mh: MemoryHandle,
    kernels: Kernels,
    per_job: u32,
    jobs: Vec<Option<Job>>,
    /// Operations the provider refused with EAGAIN, as context ids, retried
    /// first on every turn. Preallocated to the context table's size.
    retry: Vec<u32>,
    /// The retry list being worked through, swapped with `retry` each pass
    /// (preallocated alike, so a pass allocates nothing).
    retrying: Vec<u32>,
    commands: Receiver<Command>,
    events: EventSender,
    turns: u32,
    /// Empty polls, counted to pace the idle checks.
    idle: u32,
    /// Result bytes sent by inject since the last poll (no completion will
    /// count them), added to the lcore's counters once per turn.
    injected_bytes: u64,
    completions: [Completion; 32],
    /// Split slots waiting for their combiner (`check_split_waits`); while
    /// there are any the lcore does not sleep.
    split_waits: u32,
    metrics: MetricsTable,
    /// How long a slot's first piece waits for the other ranks' pieces.
    op_timeout: std::time::Duration,
    next_housekeeping: Instant,
    /// Fault injection, for tests of the server's watchdog and heartbeats:
    /// from this time on the lcore blocks for good, as inside a provider call
    /// that does not return (`TALLY_FAULT_STALL=LCORE@SECONDS`). None in real use.
    stall_at: Option<Instant>,
}

/// Empty polls between two looks at the command channel and the clock.
const IDLE_CHECK_EVERY: u32 = 32;

/// Least time between two housekeeping passes (commands, drains, stragglers).
const HOUSEKEEPING_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// What an lcore's shard is built from (named, rather than eleven
/// positional arguments of which several share a type).
pub struct ShardSetup {
    pub lcore: usize,
    pub ep: Endpoint,
    /// The lcore's slab, registered with `ep` as `mh`.
    pub slab: Slab,
    pub mh: MemoryHandle,
    pub kernels: Kernels,
    /// Job slots, and operation contexts per job slot.
    pub max_jobs: usize,
    pub per_job: u32,
    pub commands: Receiver<Command>,
    pub events: EventSender,
    pub metrics: MetricsTable,
    pub op_timeout: std::time::Duration,
}

impl ShardWorker {
    pub fn new(setup: ShardSetup) -> ShardWorker {
        let ShardSetup { lcore, ep, slab, mh, kernels, max_jobs, per_job, commands, events, metrics, op_timeout } = setup;
        let capacity = ep.context_capacity() as usize;
        ShardWorker {
            lcore,
            ep,
            slab,
            mh,
            kernels,
            per_job,
            jobs: (0..max_jobs).map(|_| None).collect(),
            retry: Vec::with_capacity(capacity),
            retrying: Vec::with_capacity(capacity),
            commands,
            events,
            turns: 0,
            idle: 0,
            injected_bytes: 0,
            completions: [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 32],
            split_waits: 0,
            metrics,
            op_timeout,
            next_housekeeping: Instant::now(),
            stall_at: crate::host::fault::stall_at("TALLY_FAULT_STALL", lcore),
        }
    }

    /// Posts the operation a context id stands for (receive into its piece,
    /// or send of its slot's result). On EAGAIN it is queued for retry.
    fn post(&mut self, context: u32) -> Result<(), String> {
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

    fn post_slot_receives(&mut self, ji: usize, slot: usize) -> Result<(), String> {
        let (n, first) = self.jobs[ji].as_ref().map_or((0, 0..0), |j| (j.on.spec.nranks, j.first_posted(slot)));
        let base = ji as u32 * self.per_job;
        for rank in first {
            self.post(base + ((slot as u32 * n + rank) << 1))?;
        }
        Ok(())
    }

    /// Rank `rank` has its result of `slot` (its send completed, or went
    /// out by inject). After the last rank's, the slot starts its next round.
    fn result_taken(&mut self, ji: usize, slot: usize, rank: usize) {
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

    fn on_completion(&mut self, c: Completion, stats: &Counters) {
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
    fn send_results(&mut self, ji: usize, slot: usize, now: Instant) {
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

    /// Split slot `slot`'s group is in: folds its pieces in rank order (an
    /// average: summed) into its first rank's piece, the group's partial
    /// (see `dataplane::split`).
    fn fold_group(&mut self, ji: usize, slot: usize, elems: usize) -> Result<(), String> {
        let job = self.jobs[ji].as_ref().unwrap();
        let sp = job.split.as_ref().unwrap();
        let j = slot - job.on.spec.window as usize;
        let mut inputs = [core::ptr::null::<u8>(); SPLIT_MAX_RANKS as usize];
        let group = sp.ranks.clone();
        for rank in group.clone() {
            // SAFETY: the offset is inside this lcore's area (add_job checked).
            inputs[(rank - group.start) as usize] = unsafe { sp.area.add(sp.shared.offset(sp.position, j, Some(rank))) };
        }
        let op = match job.on.spec.op {
            crate::reduce::ReduceOp::Avg => crate::reduce::ReduceOp::Sum,
            op => op,
        };
        // SAFETY: every input is a completed receive of `elems` elements of
        // this lcore's group, and out is exactly inputs[0], which reduce_raw
        // allows; no other lcore reads them before this group is counted.
        unsafe { self.kernels.reduce_raw(job.on.spec.dtype, op, inputs[0] as *mut u8, &inputs[..group.len()], elems) }
            .map_err(|e| format!("reduce failed: {e}"))
    }

    /// Split slot `slot`'s groups are all in and this lcore is the last:
    /// combines the groups' partials in group order (or, see
    /// `wire::split_folds_groups`, every rank's piece in rank order) into
    /// its own area's result buffer and publishes the round (see
    /// `dataplane::split`).
    fn combine(&mut self, ji: usize, slot: usize, elems: usize) -> Result<(), String> {
        let job = self.jobs[ji].as_mut().unwrap();
        let sp = job.split.as_ref().unwrap();
        let (n, j) = (job.on.spec.nranks as usize, slot - job.on.spec.window as usize);
        let (dtype, op) = (job.on.spec.dtype, job.on.spec.op);
        let folded = wire::split_folds_groups(sp.shared.groups(), dtype);
        // The inputs: each group's partial (its first rank's piece), or every rank's piece.
        let mut inputs = [core::ptr::null::<u8>(); SPLIT_MAX_RANKS as usize];
        let mut count = 0;
        for p in 0..sp.shared.groups() {
            let area = sp.shared.area(p).ok_or_else(|| format!("split lcore {p} of the job has no area"))?;
            let ranks = sp.shared.ranks(p);
            for rank in if folded { ranks.start..ranks.start + 1 } else { ranks } {
                // SAFETY: the offset is inside position p's area, which is
                // SplitShared::area_len bytes of p's slab (add_job checked).
                inputs[count] = unsafe { area.add(sp.shared.offset(p, j, Some(rank))) };
                count += 1;
            }
        }
        // SAFETY: as above, for this lcore's result buffer of slot j.
        let out = unsafe { sp.area.add(sp.shared.offset(sp.position, j, None)) };
        // SAFETY: every input holds `elems` elements: a completed receive, or
        // a partial folded from them, this lcore's or another group's,
        // whose lcore wrote it before counting its group complete (release)
        // and this lcore's count (acquire), and reposts nothing before the
        // result is published below. `out` is a result buffer, which
        // overlaps no piece.
        let r = unsafe {
            match folded {
                true => self.kernels.reduce_partials(dtype, op, out, &inputs[..count], elems, n),
                false => self.kernels.reduce_raw(dtype, op, out, &inputs[..count], elems),
            }
        };
        r.map_err(|e| format!("reduce failed: {e}"))?;
        sp.shared.publish_result(j, job.slots[slot].seq, sp.position);
        job.slots[slot].from = sp.position;
        Ok(())
    }

    /// Split slots waiting for their combiner: those whose result is
    /// published now go out to this lcore's group. Returns how many did.
    fn check_split_waits(&mut self) -> usize {
        let (mut waits, mut released) = (0, 0);
        for ji in 0..self.jobs.len() {
            let Some(window) = self.jobs[ji].as_ref().filter(|j| j.split.is_some()).map(|j| j.on.spec.window as usize) else { continue };
            for slot in window..2 * window {
                let Some(job) = self.jobs[ji].as_mut().filter(|j| j.state == State::Running) else { break };
                let s = job.slots[slot];
                if !s.combine_wait {
                    continue;
                }
                let sp = job.split.as_ref().unwrap();
                let Some(from) = sp.shared.result_of(slot - window, s.seq) else {
                    waits += 1;
                    continue;
                };
                let position = sp.position;
                job.slots[slot].combine_wait = false;
                job.slots[slot].from = from;
                if s.len as usize > self.ep.inject_size() && from != position {
                    // A send reads its buffer until it completes, from
                    // memory registered with this endpoint: send a copy.
                    let src = job.result_ptr(slot);
                    job.slots[slot].from = position;
                    // SAFETY: both are result buffers of SPLIT_MAX >= len
                    // bytes in different lcores' areas; the combiner's is
                    // not rewritten before every rank has this round's
                    // result (see `dataplane::split`).
                    unsafe { core::ptr::copy_nonoverlapping(src, job.result_ptr(slot), s.len as usize) };
                }
                self.send_results(ji, slot, Instant::now());
                released += 1;
            }
        }
        self.split_waits = waits;
        released
    }

    /// Staged: folds the run of arrived ranks from the slot's `next` into
    /// its accumulator, in rank order, reposting each folded rank's buffer
    /// for rank + stage; after the last rank the fold is finished (an
    /// average divided, 16-bit partials rounded) into the accumulator.
    /// It runs as soon as rank `next` is in, even for one piece: waiting
    /// for groups of 4 (fewer passes over the accumulator) was 15-25%
    /// slower on the device at 1024 ranks, since it also holds back the
    /// buffers' reposts.
    fn fold(&mut self, ji: usize, slot: usize, elems: usize) -> Result<(), String> {
        /// Ranks per kernel call: a bound for the stack array, not for the
        /// result (every grouping gives the same bytes).
        const GROUP: usize = 8;
        let job = self.jobs[ji].as_ref().unwrap();
        let (n, stage) = (job.on.spec.nranks as usize, job.on.stage as usize);
        let (dtype, op) = (job.on.spec.dtype, job.on.spec.op);
        let acc = job.result_ptr(slot);
        let base = ji as u32 * self.per_job;
        loop {
            let job = self.jobs[ji].as_ref().unwrap();
            let next = job.slots[slot].next as usize;
            let mut inputs = [core::ptr::null::<u8>(); GROUP];
            let mut r = next;
            while r - next < GROUP && r < n && job.has_arrived(slot, r) {
                inputs[r - next] = job.piece_ptr(slot, r);
                r += 1;
            }
            if r == next {
                return Ok(());
            }
            // SAFETY: every input is a completed receive of `elems` elements;
            // the accumulator (ranks 0..next folded) has its own strides of
            // the region, room for `elems` accumulator elements, and overlaps
            // no piece.
            unsafe { self.kernels.fold(dtype, op, acc, next > 0, &inputs[..r - next], elems) }
                .map_err(|e| format!("reduce failed: {e}"))?;
            self.jobs[ji].as_mut().unwrap().slots[slot].next = r as u32;
            // The folded ranks' buffers are free: each takes the receive of
            // the rank `stage` further on.
            for folded in next..r {
                if folded + stage < n {
                    self.post(base + (((slot * n + folded + stage) as u32) << 1)).map_err(|e| format!("posting receives: {e}"))?;
                }
            }
            if r == n {
                // SAFETY: as above; nothing else refers to the accumulator now.
                unsafe { self.kernels.finish_fold(dtype, op, acc, elems, n) }.map_err(|e| format!("reduce failed: {e}"))?;
                return Ok(());
            }
        }
    }

    /// Stops serving a job: cancel what is in flight, tell the control plane.
    /// Cold path (a job failing), so it may allocate and send events.
    fn fail(&mut self, ji: usize, reason: String) {
        if let Some(job) = self.jobs[ji].as_mut() {
            if job.state == State::Running {
                let _ = self.events.send(Event::JobFailed { lcore: self.lcore, tag: job.on.tag, reason });
            }
        }
        self.drain(ji);
    }

    fn drain(&mut self, ji: usize) {
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

    fn maybe_finish_drain(&mut self, ji: usize) {
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
    fn forget_sends_to_gone_ranks(&mut self, ji: usize) -> bool {
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
    fn expire_drains(&mut self) {
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
    fn expire_stragglers(&mut self, now: Instant) {
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
    fn housekeeping(&mut self) {
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
    }

    fn add_job(&mut self, on: JobOnShard) {
        let ji = on.index as usize;
        let tag = on.tag;
        let mut peers = Vec::with_capacity(on.client_names.len());
        for name in &on.client_names {
            match self.ep.insert_peer(name) {
                Ok(a) => peers.push(a),
                Err(e) => {
                    for p in &peers {
                        let _ = self.ep.remove_peer(*p);
                    }
                    let _ = self.events.send(Event::JobFailed { lcore: self.lcore, tag, reason: format!("cannot reach a client: {e}") });
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
        // This lcore is the block's only writer; a scrape may briefly see
        // a half-reset block, which is harmless for counters.
        self.metrics.job(self.lcore, ji).reset(on.spec.job_id);
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

    fn check_commands(&mut self) {
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

    fn retry_posts(&mut self) {
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

impl Worker for ShardWorker {
    fn poll_once(&mut self, stats: &Counters) -> usize {
        self.turns = self.turns.wrapping_add(1);
        if self.turns.is_multiple_of(4096) {
            self.housekeeping();
        }
        if !self.retry.is_empty() {
            self.retry_posts();
        }
        let released = if self.split_waits > 0 { self.check_split_waits() } else { 0 };
        // Queue depth gauge: one plain store on this lcore's own cache line.
        self.metrics.gauges(self.lcore).in_flight.store(self.ep.in_flight() as u64, Ordering::Relaxed);
        let mut batch = self.completions;
        match self.ep.poll(&mut batch) {
            Ok(0) => {
                // Idle: take job starts and ends soon, but not on every
                // empty poll: a busy lcore polls every few hundred ns, and
                // the channel check and clock read cost it 9% of its turns
                // (perf, device) and a small all-reduce that much latency.
                self.idle = self.idle.wrapping_add(1);
                if self.idle.is_multiple_of(IDLE_CHECK_EVERY) {
                    self.check_commands();
                    self.housekeeping();
                }
                released
            }
            Ok(n) => {
                for c in &batch[..n] {
                    self.on_completion(*c, stats);
                }
                if self.injected_bytes > 0 {
                    bump(&stats.bytes_out, self.injected_bytes);
                    self.injected_bytes = 0;
                }
                n + released
            }
            Err(PollError::Completion(e)) => {
                // Canceled operations of a draining job are how jobs end, not errors.
                if !e.is_canceled() {
                    bump(&stats.errors, 1);
                }
                match e.context {
                    Some(ctx) if (ctx / self.per_job) < self.jobs.len() as u32 => {
                        let ji = (ctx / self.per_job) as usize;
                        if let Some(job) = self.jobs[ji].as_mut() {
                            job.outstanding = job.outstanding.saturating_sub(1);
                            // The provider says the rank's connection failed:
                            // what is queued to it was dropped with it.
                            if matches!(e.prov_errno, libc::ENOTCONN | libc::ECONNRESET | libc::EPIPE | libc::ECONNREFUSED) {
                                let n = job.on.spec.nranks;
                                let rank = (((ctx % self.per_job) >> 1) % n) as usize;
                                if job.gone.get(rank) == Some(&false) {
                                    job.gone[rank] = true;
                                    // The other lcores have connections of their own to it.
                                    let _ = self.events.send(Event::RankGone { tag: job.on.tag, rank: rank as u32 });
                                }
                            }
                            if job.state == State::Running {
                                self.fail(ji, e.to_string());
                            } else {
                                self.maybe_finish_drain(ji);
                            }
                        }
                    }
                    _ => {
                        let _ = self.events.send(Event::LcoreError { lcore: self.lcore, reason: e.to_string() });
                    }
                }
                1
            }
            Err(PollError::Fabric(e)) => {
                bump(&stats.errors, 1);
                let _ = self.events.send(Event::LcoreError { lcore: self.lcore, reason: e.to_string() });
                0
            }
        }
    }

    fn wait(&mut self, timeout_ms: i32) {
        self.check_commands();
        self.housekeeping();
        if self.split_waits > 0 {
            // Another lcore is about to publish a result this one sends on,
            // which the provider's wait would not wake it for: only yield.
            std::thread::yield_now();
            return;
        }
        let _ = self.ep.wait(timeout_ms);
    }

    fn shutdown(&mut self) {
        for ji in 0..self.jobs.len() {
            if self.jobs[ji].is_some() {
                self.drain(ji);
            }
        }
        self.ep.cancel_all();
    }
}
