//! The per-chunk path: posting each chunk's send and receive, reading the
//! completions, landing results and completing operations. Nothing here
//! allocates, locks or logs per chunk.
//!
//! [`Progress::pump`] cuts nothing and decides nothing: it posts the next
//! chunk of each stream with room in its window, in chunk order, and
//! [`Progress::poll`] takes the completions, where a chunk ends. Between
//! the two, each chunk takes one mode, each a function in its file, the
//! way the server's modes are (`dataplane/shard/`):
//!
//! | file | the chunk's mode |
//! |---|---|
//! | `post.rs` | posting a context id's send or receive, decoded from the id alone; EAGAIN keeps it on the retry list |
//! | `pacing.rs` | send credits per server (`ClientConfig::send_credits`): sends in chunk order |
//! | `inject.rs` | a small send copied by the provider at the call: no send completion |
//! | `direct.rs` | the result received straight into the caller's buffer (no failover) |
//! | `staged.rs` | failover's: the result received into a staging slot, copied out once whole |
//! | `relay.rs` | a two-rank relay job's small pieces: the other rank's piece reduced here |
//! | `failover/redo.rs` | a recovery's redo flights (their own context ids, handed over by id) |
//!
//! The tree: `mod.rs` -> `pacing.rs` -> `post.rs` -> the mode files; this
//! file calls `staged.rs` and `relay.rs` for their completions. Below it,
//! failover (its staging areas, its redo flights, an error completion that
//! loses a server) and `control::retire` when an operation completes;
//! nothing here calls back up into the client.
use super::control;
use super::error::ClientError;
use super::failover::{Failover, RedoDone};
use super::piece_times::PieceTimes;
use super::state::{Core, Flight, Op, SLOW_OP};
use super::sweep::Sweep;
use crate::dataplane::fabric::{Completion, PollError};
use crate::reduce::Kernels;
use crate::wire;
use pacing::{issue_send, release_send_credit};
use post::post;
use std::time::Instant;

mod direct;
mod inject;
mod pacing;
mod post;
mod relay;
mod staged;

/// Empty polls between two checks of the control connections and the timeout.
pub(super) const IDLE_CHECK_EVERY: u32 = 64;
/// Polls with completions between two checks of the control connections:
/// a rank that never sees an empty poll still hears of a drain.
const BUSY_CHECK_EVERY: u32 = 1024;

/// The per-chunk path's own state.
pub(super) struct Progress {
    /// Something may have made a chunk postable since `pump` last looked
    /// (an operation started or was cut, a flight finished, an operation
    /// completed, a drain, recovery or rejoin moved on): only then does
    /// `pump` walk the operations. Most calls of `test` find every window
    /// full, and NCCL's proxy thread calls `test` for each request it waits
    /// on: walking every waiting operation's streams each time was the
    /// proxy's top symbol (perf, CollNet at 32 Gbit/s).
    pub(super) pump_due: bool,
    /// The completion batch, kept so that an empty poll writes nothing.
    batch: [Completion; 32],
    /// Per-stream cursors of finished operations, reused by the next ones.
    spare_next: Vec<Vec<usize>>,
    /// Reduces a relay job's pieces (the best kernels this CPU has).
    kernels: Kernels,
    /// Sampled pieces' round trips (`ClientConfig::piece_times`).
    pub(super) times: PieceTimes,
    /// When a completion last came (the all-reduce timeout counts from it).
    pub(super) last_progress: Instant,
    /// Empty polls since the last completion (paces the idle checks).
    pub(super) idle_polls: u32,
    /// Polls with completions (paces the control checks of a busy rank).
    busy_polls: u32,
    /// Results that went through a staging area (`FailoverStats::staged`).
    pub(super) staged: u64,
    /// Receives of lost streams that completed after the loss
    /// (`FailoverStats::late_receives`).
    pub(super) late_receives: u64,
    /// Discards messages no receive of this rank will take (`client::sweep`).
    pub(super) sweep: Sweep,
}

impl Progress {
    /// For a client of at most `max_ops` operations in progress.
    pub(super) fn new(max_ops: usize, sweep: Sweep) -> Progress {
        Progress {
            pump_due: true,
            batch: [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 32],
            spare_next: Vec::with_capacity(max_ops),
            kernels: Kernels::best(),
            times: PieceTimes::default(),
            last_progress: Instant::now(),
            idle_polls: 0,
            busy_polls: 0,
            staged: 0,
            late_receives: 0,
            sweep,
        }
    }

    /// A per-stream cursor for a new operation (a finished one's, once a
    /// few have run: starting an operation then allocates nothing).
    pub(super) fn spare_next(&mut self) -> Vec<usize> {
        self.spare_next.pop().unwrap_or_default()
    }

    /// Posts chunks while streams have room.
    pub(super) fn pump(&mut self, c: &mut Core, fo: &mut Failover) -> Result<(), ClientError> {
        if !c.retry.is_empty() {
            let pending = std::mem::take(&mut c.retry);
            for ctx in &pending {
                post(c, fo, &mut self.times, *ctx)?;
            }
        }
        let window = c.cfg.window;
        // Nothing changed since the last look: every operation is still
        // fully posted, held, or waiting for a window (see `pump_due`).
        let ops = if std::mem::take(&mut self.pump_due) { c.ops.len() } else { 0 };
        for oi in 0..ops {
            if c.ops[oi].posted == c.ops[oi].pieces() || !c.ops[oi].planned {
                // The common case while waiting for results: nothing to do.
                // (Or held uncut while a drain's switch is agreed.)
                continue;
            }
            let (sub, gen, first) = (c.ops[oi].sub, c.ops[oi].gen, c.ops[oi].first);
            let nstreams = c.subs[sub].gens[gen].set.len();
            // One chunk per stream per pass, from the op's first stream:
            // chunks go out in chunk order.
            let mut progress = true;
            while progress {
                progress = false;
                for k in 0..nstreams {
                    let st = c.subs[sub].gens[gen].set[(first + k) % nstreams];
                    let op = &c.ops[oi];
                    let stream = &c.subs[sub].streams[st];
                    if !op.left_on(st) || stream.next_seq.wrapping_sub(stream.head_seq) >= window {
                        continue;
                    }
                    if c.subs[sub].lost_stream(st) {
                        // Its server is gone: the recovery redoes these chunks.
                        continue;
                    }
                    // Earlier ops on the same sub-job must have posted all of
                    // this stream's chunks first, to keep sequence order.
                    if c.ops.iter().take(oi).any(|o| o.sub == sub && o.planned && o.left_on(st)) {
                        continue;
                    }
                    progress = true;
                    let chunk = op.next[st];
                    let s = &mut c.subs[sub].streams[st];
                    let seq = s.next_seq;
                    s.next_seq = seq.wrapping_add(1);
                    let slot = s.next_slot as usize;
                    s.next_slot = (s.next_slot + 1) % window;
                    let fi = st * window as usize + slot;
                    let op = &c.ops[oi];
                    let relayed = c.subs[sub].relay.is_some() && op.span(chunk).1 <= wire::RELAY_MAX;
                    c.subs[sub].flights[fi] = Flight { op: op.id, chunk, seq, relayed, ..Flight::default() };
                    c.ops[oi].next[st] += nstreams;
                    c.ops[oi].posted += 1;
                    let base = sub as u32 * c.per_sub + (fi as u32) * 2;
                    // Receive first: the result may come back fast. A relayed
                    // chunk's receive is posted once its send is (`post`):
                    // the other rank's piece may come back before this
                    // rank's went out, and must not complete the flight
                    // while its send waits on the retry list.
                    if !relayed {
                        post(c, fo, &mut self.times, base)?;
                    }
                    issue_send(c, fo, &mut self.times, base + 1)?;
                }
            }
        }
        for sub in 0..c.subs.len() {
            if fo.redoing(sub) {
                fo.pump_redo(c, sub)?;
            }
        }
        Ok(())
    }

    /// Takes the completions that came; true when the control connections
    /// are due for a look (see [`IDLE_CHECK_EVERY`]).
    #[inline]
    pub(super) fn poll(&mut self, c: &mut Core, fo: &mut Failover) -> Result<bool, ClientError> {
        let n = match c.rails.poll(&mut self.batch) {
            Ok(n) => n,
            Err(PollError::Completion(e)) if e.context.is_some_and(|ctx| self.sweep.owns(ctx)) => {
                self.sweep.on_failed(&e);
                return Ok(false);
            }
            Err(PollError::Completion(e)) => return fo.on_error_completion(c, e).map(|()| false),
            Err(PollError::Fabric(e)) => return Err(ClientError::Fabric(e.to_string())),
        };
        if n == 0 {
            // A busy caller polls in a tight loop: peeking every control
            // connection (a system call each) on every empty poll cost a
            // polling rank a third of its time. Every IDLE_CHECK_EVERY-th
            // empty poll is soon enough to hear that a server ended the job.
            self.idle_polls = self.idle_polls.wrapping_add(1);
            return Ok(self.idle_polls.is_multiple_of(IDLE_CHECK_EVERY));
        }
        self.idle_polls = 0;
        self.busy_polls = self.busy_polls.wrapping_add(1);
        let window = c.cfg.window as usize;
        // The sweep's completions are not the all-reduce's progress: a look
        // every 50 ms must not keep a stalled one from timing out.
        let mut progressed = false;
        for i in 0..n {
            let done = self.batch[i];
            if self.sweep.owns(done.context) {
                self.sweep.on_done(c, fo, done);
                continue;
            }
            if !progressed {
                progressed = true;
                self.last_progress = Instant::now();
            }
            let (sub, local) = ((done.context / c.per_sub) as usize, done.context % c.per_sub);
            if local >= c.redo_base {
                match fo.on_redo_completion(c, sub, local - c.redo_base, done.is_recv) {
                    RedoDone::Pending => {}
                    RedoDone::Item => self.last_progress = Instant::now(),
                    RedoDone::ItemOfOp => {
                        self.finish_done_ops(c)?;
                        self.last_progress = Instant::now();
                    }
                }
                continue;
            }
            let fi = (local >> 1) as usize;
            if c.subs[sub].lost_stream(fi / window) {
                // A late completion from a lost server: its flights were
                // handed to the recovery as they stood when it was lost.
                self.late_receives += u64::from(done.is_recv);
                continue;
            }
            if let Some((fsi, from)) = c.cfg.fault_drop_results {
                let f = c.subs[sub].flights[fi];
                let index = c.ops.iter().find(|o| o.id == f.op).map_or(0, |o| o.index);
                if done.is_recv && c.subs[sub].streams[fi / window].server == fsi && index >= from {
                    continue;
                }
            }
            let server = c.subs[sub].streams[fi / window].server;
            if !done.is_recv {
                release_send_credit(c, fo, &mut self.times, sub, server)?;
            }
            let f = &mut c.subs[sub].flights[fi];
            if done.is_recv {
                f.recv_done = true;
                f.got = done.len as u32;
                if f.sent_at != 0 {
                    self.times.record(f.sent_at, server);
                }
            } else {
                f.send_done = true;
            }
            if f.send_done && f.recv_done && f.relayed {
                // Only now: reducing in place overwrites this rank's piece,
                // which a send not yet completed may still be reading.
                let flight = *f;
                relay::reduce(c, fo.staging(sub), &self.kernels, sub, fi / window, flight)?;
            }
            let f = &c.subs[sub].flights[fi];
            if f.send_done && f.recv_done {
                self.finish_flight(c, fo, sub, fi)?;
            }
        }
        Ok(self.busy_polls.is_multiple_of(BUSY_CHECK_EVERY))
    }

    /// A flight whose send and receive both completed: frees its slot, moves
    /// the stream's head past the free slots, lands a staged result and counts
    /// the chunk to its operation, which completes with its last chunk.
    #[inline]
    fn finish_flight(&mut self, c: &mut Core, fo: &mut Failover, sub: usize, fi: usize) -> Result<(), ClientError> {
        let window = c.cfg.window as usize;
        let s = &mut c.subs[sub];
        let f = &mut s.flights[fi];
        let op_id = f.op;
        let (chunk, seq) = (f.chunk, f.seq);
        *f = Flight::default();
        self.pump_due = true;
        let st = fi / window;
        let stream = &mut s.streams[st];
        let rail = stream.rail;
        while stream.head_seq != stream.next_seq && s.flights[st * window + stream.head_slot as usize].op == 0 {
            stream.head_seq = stream.head_seq.wrapping_add(1);
            stream.head_slot = (stream.head_slot + 1) % window as u32;
        }
        if let Some(pos) = c.ops.iter().position(|o| o.id == op_id) {
            if let Some(stage) = fo.staging_mut(sub) {
                // One search for the operation serves both.
                let times = c.cfg.piece_times.then_some(&mut self.times);
                staged::complete(stage, &c.ops[pos], &c.rails, rail, times, st, seq, chunk);
                self.staged += 1;
            }
            c.ops[pos].done += 1;
            if c.ops[pos].done == c.ops[pos].pieces() {
                self.complete_op(c, pos)?;
            }
        }
        Ok(())
    }

    /// Hands back operation `pos`, all of whose chunks are done: its
    /// slow-operation note, its cursor for reuse, and the end of a sub-job
    /// that was retiring.
    #[inline]
    fn complete_op(&mut self, c: &mut Core, pos: usize) -> Result<(), ClientError> {
        if let Some(op) = c.ops.remove(pos) {
            self.pump_due = true;
            if c.cfg.piece_times {
                self.times.record_op(op.index, op.started.elapsed());
            }
            note_if_slow(c.cfg.rank, &op);
            self.spare_next.push(op.next);
            if c.subs[op.sub].retiring {
                control::retire(c, op.sub)?;
            }
        }
        Ok(())
    }

    /// Completes every operation whose chunks are all done (a recovery's
    /// redone chunks complete operations outside `finish_flight`).
    pub(super) fn finish_done_ops(&mut self, c: &mut Core) -> Result<(), ClientError> {
        while let Some(pos) = c.ops.iter().position(|o| o.planned && o.chunks > 0 && o.done >= o.pieces()) {
            self.complete_op(c, pos)?;
        }
        Ok(())
    }
}

/// Logs an operation that took longer than [`SLOW_OP`] (once per such
/// operation, never per chunk).
fn note_if_slow(rank: u32, op: &Op) {
    let took = op.started.elapsed();
    if took > SLOW_OP {
        log::warn!(
            "rank {rank}: all-reduce {} ({} bytes) took {:.2} s (longer than {} s: see the lines before it for why)",
            op.index,
            op.bytes,
            took.as_secs_f64(),
            SLOW_OP.as_secs()
        );
    }
}
