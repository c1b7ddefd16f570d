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
//!
//! # Files
//!
//! This file holds the state and [`ShardWorker::poll_once`]. The per-chunk
//! path: `complete.rs` takes a completion, checks and counts a piece and
//! hands it to its slot's mode, one file each: `one_pass.rs`, `staged.rs`,
//! `relay.rs`, `split_round.rs`; `post.rs` posts receives and results and
//! ends a slot's round; `error.rs` says why a round failed its job.
//! `jobs.rs` adds, drains and times out jobs (off the per-chunk path).
//!
//! # The data path of one chunk
//!
//! Client side: the module docs of `engine/src/client/mod.rs` (the cut into chunks, `op_chunk_bytes`,
//! the streams and their rotation: each shard goes straight to the lcore that owns it, the RSS idea,
//! no dispatcher) and `client/progress/` (the posts and each mode; pacing with `send_credits`) are the long
//! version. A chunk is at most `chunk_elems` (the piece the servers granted, see Jobs), and an
//! all-reduce smaller than S full chunks is cut into S equal ones of at least 4 KiB
//! (`TALLY_MIN_PIECE`). Pieces are tagged `job(16) | slot(16) | seq(32)` (`wire/tag.rs`); one at or
//! below the provider's inject size (shm: 4 KiB) goes with `fi_tinject`, which has no send completion
//! (`TALLY_INJECT=0` turns that off, here and on the server). Slots are reused in sequence order.
//! `send_credits` is `TALLY_SEND_CREDITS` (`tally bench allreduce --send-credits`); the sends it
//! holds back wait in a per-server FIFO. A credit comes back when the caller's thread sees the send
//! completion (from the rail thread, through the ring between them), so with small pieces one credit
//! holds a server to a piece per round trip of that hop. The plugin over tcp runs none (NCCL's
//! steps pace its sends; one credit, then four, cost CollNet at 32 Gbit/s), with a window of 16
//! (ffi-plugin `tcp_defaults`, [measurements](docs/measurements.md#collnet-at-32-gbits-the-plugins-pacing)).
//!
//! Server side (`dataplane/shard/`), for job J on lcore k, slot s (the **one-pass** mode):
//!
//! 1. Receives for every (slot, rank) were posted up front into the job's slab region, directed
//!    at that rank's address, matching job and slot but not the sequence.
//! 2. A receive completes: the context id says (job, slot, rank) without any lookup. The tag's
//!    job, slot and sequence and the length are checked; a mismatch fails job J only.
//! 3. When the last rank's piece of the slot is in, `reduce_raw` sums the pieces in rank order
//!    into piece 0 (bit-identical whatever the arrival order; 16-bit types accumulate in f32 and
//!    round once). Past 8 pieces it works in 16 KiB tiles of the output, 8 inputs at a time,
//!    the running result staying in L1 (`Kernels::run`): the same operations in the same order
//!    per element, but 8 memory streams at a time instead of one per rank, which the hardware
//!    prefetchers can follow (1024 inputs of 256 KiB: 9.0 -> 27 GB/s). 16-bit types, which
//!    storing between groups would round, keep their running result as f32 partials in a 16 KiB
//!    stack tile (`Kernels::run_wide`, the staged form's kernels below) and round once. Figures:
//!    [measurements, "The data path of one chunk"](docs/measurements.md#the-data-path-of-one-chunk).
//! 4. Piece 0 is sent to every rank with the same tag (by inject when it fits: that send is
//!    done at once).
//! 5. When all those sends completed, the slot's sequence advances by `window` and its receives
//!    are reposted.
//!
//! A **staged** job (`JobOnShard::stage` = B > 0: its piece per rank would not fit its slab budget,
//! see Many ranks) differs in steps 1, 3 and 4: a slot holds an accumulator and B receive buffers,
//! rank r is posted into buffer r mod B, and pieces are folded into the accumulator in rank order as
//! they come, up to 8 per kernel call (`ShardWorker::fold`, the kernels' staged form
//! `Kernels::fold`), then finished once (`Kernels::finish_fold`: `avg` divided): the same left fold
//! as the one-pass reduce, so the same bits. The long version is "Staged receives" in
//! `engine/src/dataplane/shard/mod.rs` (16-bit floats' f32 partials included); the kernels' side is
//! "The staged form" in `engine/src/reduce/mod.rs`, and the SIMD kernels keep a register pair's
//! partials in register order, which only the same kernels read back (`simd::WideLanes`).
//! `tally bench reduce --staged 8 --inputs 64 --sizes 128K` times the staged form; its vector loads
//! must stay inline (out of line they cost a fifth of a staged 1024-rank bf16 job's lcore time:
//! [measurements](docs/measurements.md#the-data-path-of-one-chunk)).
//!
//! The **relay** (two ranks) and the **split** (4-64 ranks) are the small all-reduces' modes:
//! "Small all-reduces" below. Steps 2-5 of every mode follow "The hot path" above.
use crate::dataplane::fabric::{Completion, Endpoint, MemoryHandle, PeerAddr, PollError};
use crate::dataplane::lcore::{bump, Counters, Worker};
use crate::dataplane::metrics::MetricsTable;
use crate::dataplane::slab::Slab;
use crate::dataplane::split::SplitShared;
use crate::reduce::{DataType, Kernels};
use crate::wire::{JobSpec, SPLIT_MAX};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

mod complete;
mod error;
mod jobs;
mod one_pass;
mod post;
mod relay;
mod split_round;
mod staged;
mod sweep;

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
    /// The job's sequence key ([`crate::wire::JobTag`]): pieces whose
    /// sequence does not carry it are dropped (`complete.rs`).
    pub key: u32,
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
    /// When the round's latest piece arrived: the last one's wait is timed
    /// from it (`JobCounters::record_last_wait`).
    latest: Option<Instant>,
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
    /// Looking at and discarding unexpected messages (`sweep.rs`).
    sweep: sweep::Sweep,
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
        // The sweep's two contexts are the ones past every job's, where the endpoint has them.
        let sweep_context = max_jobs as u32 * per_job;
        let sweep = sweep::Sweep::new(ep.can_sweep() && sweep_context as usize + 2 <= capacity, sweep_context);
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
            sweep,
            stall_at: crate::host::fault::stall_at("TALLY_FAULT_STALL", lcore),
        }
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
        if self.sweep.eager > 0 {
            self.sweep.eager -= 1;
            self.sweep();
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
            Err(PollError::Completion(e)) => self.on_failed_completion(e, stats),
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
