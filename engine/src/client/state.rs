//! A client's state: per sub-job (one per (dtype, op) pair) its streams
//! (one per server lcore), the chunks in flight on each (`Flight`), the
//! stream sets operations are cut over (`Gen`), and each all-reduce in
//! progress (`Op`), cut here (`Core::cut`); and [`Core`], what the
//! client's parts (the per-chunk path, control, failover, joins) share and
//! are lent for each call. Only the client's own modules see inside.
//!
//! The context ids: a sub-job `sub` owns `per_sub` of them from
//! `sub * per_sub`. Below `redo_base` they name data flights, two per slot
//! of each stream's window (`(st * window + slot) << 1`, `| 1` for the
//! send); from `redo_base` on, a recovery's redo flights
//! (`failover/redo.rs`). A completion is decoded from its context id alone.
use super::config::ClientConfig;
use super::error::ClientError;
use super::liveness::Liveness;
use super::rails::Rails;
use super::stage::{Landed, Stage};
use crate::dataplane::fabric::{MemoryHandle, PeerAddr};
use crate::reduce::{DataType, ReduceOp};
use crate::wire::{self, JobTag, TOKEN_BYTES};
use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// What the client's parts share, lent to each for one call: the
/// settings, the endpoints, the sub-jobs, the operations in progress and
/// the context ids they post under. The parts' own state (the per-chunk
/// path's, failover's) is theirs; this is what every one of them reads.
pub(super) struct Core {
    pub(super) cfg: ClientConfig,
    pub(super) token: [u8; TOKEN_BYTES],
    /// The endpoints (one, or one per rail thread).
    pub(super) rails: Rails,
    pub(super) subs: Vec<SubJob>,
    pub(super) ops: VecDeque<Op>,
    /// Context ids refused with EAGAIN, retried first.
    pub(super) retry: Vec<u32>,
    /// Context ids per sub-job (see the module doc).
    pub(super) per_sub: u32,
    /// The first of a sub-job's context ids (after `sub * per_sub`) that
    /// names a redo flight.
    pub(super) redo_base: u32,
}

impl Core {
    /// Index of the sub-job's first operation not yet cut into chunks.
    pub(super) fn first_uncut(&self, sub: usize) -> u64 {
        self.ops.iter().filter(|o| o.sub == sub && !o.planned).map(|o| o.index).min().unwrap_or(self.subs[sub].started)
    }

    /// Writes a whole small message on a (non-blocking) control connection.
    pub(super) fn send_control(&mut self, sub: usize, si: usize, bytes: &[u8]) -> Result<(), ClientError> {
        let Some(c) = self.subs[sub].controls[si].as_mut() else { return Ok(()) };
        let _ = c.set_nonblocking(false);
        let r = c.write_all(bytes);
        let _ = c.set_nonblocking(true);
        r.map_err(|e| ClientError::Connect { server: self.cfg.servers[si].clone(), error: e.to_string() })
    }

    /// The server job of this communicator for (dtype, op) when it is not
    /// the first pair: derived with the job's secret (`wire::derive_job_id`).
    pub(super) fn sub_job_id(&self, dtype: DataType, op: ReduceOp) -> u64 {
        wire::derive_job_id(self.cfg.job_id, &self.cfg.job_secret, &[b'd', dtype as u8, b'o', op as u8])
    }

    /// The servers in `mask`, by address, for messages.
    pub(super) fn servers_named(&self, mask: u64) -> String {
        bits(mask).filter_map(|i| self.cfg.servers.get(i)).cloned().collect::<Vec<_>>().join(", ")
    }

    /// Cuts operation `oi` over its stream set: chunk size, chunk count,
    /// first stream, per-stream cursors. Operations of a sub-job are cut in
    /// index order, the same on every rank. (Chunks a recovery redoes are
    /// the client's to hand over: `Client::plan`.)
    pub(super) fn cut(&mut self, oi: usize) -> Result<(), ClientError> {
        let (sub, index, bytes) = (self.ops[oi].sub, self.ops[oi].index, self.ops[oi].bytes);
        let s = &mut self.subs[sub];
        let Some(gen) = s.gen_for(index, bytes) else {
            return Err(ClientError::Refused { server: "every server".into(), reject: "no server left for this job".into() });
        };
        let elem = s.dtype.size();
        let g = &mut s.gens[gen];
        let n = g.set.len();
        let chunk_bytes = op_chunk_bytes(bytes, s.chunk_elems * elem, n, elem, self.cfg.min_piece);
        let chunks = bytes.div_ceil(chunk_bytes);
        let first = g.rotate % n;
        g.rotate = (first + chunks) % n;
        let set = &s.gens[gen].set;
        let op = &mut self.ops[oi];
        op.next.clear();
        op.next.resize(s.streams.len(), usize::MAX);
        for (pos, &st) in set.iter().enumerate() {
            op.next[st] = (pos + n - first) % n;
        }
        (op.gen, op.chunk_bytes, op.chunks, op.first, op.planned) = (gen, chunk_bytes, chunks, first, true);
        Ok(())
    }
}

/// The indices of the bits set in `mask` (servers, by their place in the list).
pub(super) fn bits(mask: u64) -> impl Iterator<Item = usize> {
    (0..64).filter(move |i| mask & (1u64 << i) != 0)
}

/// The chunk size of one all-reduce of `bytes`: the job's `max_chunk`, or,
/// when fewer than one full chunk per stream would be left, an equal share
/// per stream (rounded up to `min_piece`, by default `MIN_SPREAD_PIECE`, and whole elements) so
/// that every server link and lcore carries part of it. Every rank computes
/// the same value from the same arguments, so chunk `c` still meets chunk
/// `c` of every other rank in the same slot.
pub fn op_chunk_bytes(bytes: usize, max_chunk: usize, streams: usize, elem: usize, min_piece: usize) -> usize {
    let share = bytes.div_ceil(streams.max(1)).next_multiple_of(min_piece.max(1)).next_multiple_of(elem);
    share.min(max_chunk).max(elem)
}

/// One (server, lcore) stream of a sub-job.
pub(super) struct Stream {
    /// Its server was lost while this stream served it (failover): nothing
    /// is posted on it again. A server that comes back gets new streams.
    pub(super) lost: bool,
    /// One of its server's latency lcores: it carries only the sub-job's
    /// small operations (`SubJob::latency_max`).
    pub(super) latency: bool,
    /// The split stream (`SubJob::split`): to this rank's group's lcore, in
    /// slots `window..2 x window` of the job's tags (`slot_base`).
    pub(super) split: bool,
    pub(super) slot_base: u16,
    /// The operations it carries: from `born` (0, or the switch of the
    /// rejoin that added it) to before `died` (the switch of the recovery
    /// from losing it). All ranks agree on both.
    pub(super) born: u64,
    pub(super) died: u64,
    pub(super) addr: PeerAddr,
    /// Index of its server in the client's server list.
    pub(super) server: usize,
    /// Its lcore's position among its server's lcores for the job (the
    /// order of the server's answer), for [`SubJob::gen_for`]'s lcore-major order.
    pub(super) lcore: u32,
    /// The rail it goes on (`Rails::rail_for` its server and lcore).
    pub(super) rail: usize,
    pub(super) job_tag: JobTag,
    pub(super) next_seq: u32,
    /// Oldest sequence not yet complete. Slots are reused in sequence order,
    /// so a new chunk may go out only while `next_seq - head_seq < window`,
    /// however the chunks in between complete.
    pub(super) head_seq: u32,
    /// Slots of `next_seq` and `head_seq`, counted separately from the
    /// sequence (which wraps at 2^32, not at a multiple of the window).
    pub(super) next_slot: u32,
    pub(super) head_slot: u32,
}

impl Stream {
    /// Whether this stream (of `window` slots) will take a message with
    /// this tag (`client::sweep`): not lost, its job's tag, one of its
    /// slots, and a sequence from a window before its oldest one in flight
    /// to two windows past its next (a relayed piece comes back at most a
    /// window ahead of this rank).
    pub(super) fn awaits(&self, window: u32, tag: wire::Tag) -> bool {
        if self.lost || tag.job() != self.job_tag.job || tag.slot().wrapping_sub(self.slot_base) as u32 >= window {
            return false;
        }
        let seq = self.job_tag.seq_of(tag);
        let from = self.head_seq.wrapping_sub(window);
        let span = self.next_seq.wrapping_sub(self.head_seq).saturating_add(3 * window);
        seq.wrapping_sub(from) < span
    }

    pub(super) fn new(addr: PeerAddr, server: usize, rail: usize, job_tag: JobTag) -> Stream {
        Stream {
            lost: false,
            latency: false,
            split: false,
            slot_base: 0,
            born: 0,
            died: u64::MAX,
            addr,
            server,
            lcore: 0,
            rail,
            job_tag,
            next_seq: 0,
            head_seq: 0,
            next_slot: 0,
            head_slot: 0,
        }
    }
}

/// One chunk in flight, at its stream's slot.
#[derive(Clone, Copy, Default)]
pub(super) struct Flight {
    pub(super) op: u64,
    pub(super) chunk: usize,
    pub(super) seq: u32,
    pub(super) send_done: bool,
    pub(super) recv_done: bool,
    /// Relayed (see [`ClientConfig::relay`]): the other rank's piece lands
    /// in the sub-job's relay slot, `got` bytes of it.
    pub(super) relayed: bool,
    pub(super) got: u32,
    /// A sampled piece's send post, in `PieceTimes` ns (0: not timed).
    pub(super) sent_at: u64,
}

/// Where a sub-job stands with one of its servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leave {
    /// In use, not draining.
    Serving,
    /// Draining, but the job has nowhere else to go: still in use.
    Stays,
    /// Draining: this rank answered `next_op` and waits for the switch.
    Awaiting { next_op: u64 },
    /// Operations from this index on do not use the server. (A server
    /// that refused the join because it drains is `At(0)`.)
    At(u64),
}

/// `SubJob::gen_for`'s working lists, kept between calls.
#[derive(Default)]
pub(super) struct GenScratch {
    pub(super) member: Vec<bool>,
    pub(super) set: Vec<usize>,
    pub(super) has: Vec<bool>,
}

/// A stream set: the streams a run of operations of one size class uses
/// (the servers in use, their latency or bulk lcores).
pub(super) struct Gen {
    pub(super) set: Vec<usize>,
    /// The position in `set` of the next all-reduce's chunk 0. Every rank
    /// issues the same all-reduces in the same order, so it advances
    /// identically; a new set starts at 0.
    pub(super) rotate: usize,
}

/// A job on the servers for one (dtype, op).
pub(super) struct SubJob {
    /// Its job on the servers: the caller's id for the first pair, derived
    /// for the others (`Core::sub_job_id`).
    pub(super) job_id: u64,
    pub(super) dtype: DataType,
    pub(super) op: ReduceOp,
    pub(super) chunk_elems: usize,
    pub(super) streams: Vec<Stream>,
    pub(super) flights: Vec<Flight>,
    /// Per server: the job's control connection (None once this rank left
    /// the server, or when the server refused the join because it drains).
    pub(super) controls: Vec<Option<TcpStream>>,
    pub(super) leave: Vec<Leave>,
    /// Stream sets seen so far; at most two (small, bulk) per server left.
    pub(super) gens: Vec<Gen>,
    /// Operations of at most this many bytes use only the latency lcores of
    /// the servers that have them, larger ones only the others (0: no split).
    pub(super) latency_max: usize,
    /// Stream sets in lcore-major order (`ClientConfig::interleave`).
    pub(super) interleave: bool,
    /// Reused by `gen_for`.
    pub(super) scratch: GenScratch,
    /// Index of the next operation started on this sub-job.
    pub(super) started: u64,
    /// Some server is left from an operation on but not told Bye yet.
    pub(super) retiring: bool,
    /// Per server: sends in flight, and send contexts waiting for a credit
    /// (in chunk order). Only used with `send_credits`.
    pub(super) pacing: Vec<Pacing>,
    /// A relay job's receive buffers (see [`ClientConfig::relay`]): the
    /// other rank's small pieces land here and are reduced with this
    /// rank's into the result's place (None: not a relay job).
    pub(super) relay: Option<Stage>,
    /// A split job (see [`ClientConfig::split`]): its split stream, which
    /// carries every operation of at most `split_max` bytes (None: not split).
    pub(super) split: Option<usize>,
    pub(super) split_max: usize,
    /// When each server was last heard from (see [`liveness`]).
    pub(super) live: Liveness,
}

impl SubJob {
    /// A drain's switch is being agreed: operations are held uncut
    /// (failover holds them too, `Client::holding`).
    pub(super) fn awaiting_switch(&self) -> bool {
        self.leave.iter().any(|l| matches!(l, Leave::Awaiting { .. }))
    }

    /// Whether stream `st` belongs to a server this rank lost.
    #[inline(always)]
    pub(super) fn lost_stream(&self, st: usize) -> bool {
        self.streams[st].lost
    }

    /// Whether server `si` carries operation `index`.
    pub(super) fn member(&self, si: usize, index: u64) -> bool {
        !matches!(self.leave[si], Leave::At(k) if k <= index)
    }

    /// The stream set of operation `index` of `bytes` (added on first use);
    /// None when no server is left, which the drain protocol never lets happen.
    /// Called for every operation: it works in `scratch`, so that once the
    /// sets in use exist it allocates nothing.
    pub(super) fn gen_for(&mut self, index: u64, bytes: usize) -> Option<usize> {
        let n = self.leave.len();
        let mut sc = std::mem::take(&mut self.scratch);
        sc.member.clear();
        sc.member.extend((0..n).map(|si| self.member(si, index)));
        // A server lost and taken back has new streams (the old ones carry
        // the operations before the loss), so sets are told apart by their
        // streams, not by their servers.
        sc.set.clear();
        match self.split {
            // A split job's small operations go to its split stream only
            // (one server: no member changes to follow).
            Some(st) if bytes <= self.split_max => sc.set.push(st),
            _ => {
                for (st, s) in self.streams.iter().enumerate() {
                    if sc.member[s.server] && s.born <= index && index < s.died && !s.split {
                        sc.set.push(st);
                    }
                }
            }
        }
        if self.latency_max > 0 && sc.set.iter().all(|&st| !self.streams[st].split) {
            // Per server: the lcores of the operation's class, or all of its
            // lcores where it has none of that class.
            let small = bytes <= self.latency_max;
            sc.has.clear();
            sc.has.resize(n, false);
            for &st in &sc.set {
                sc.has[self.streams[st].server] |= self.streams[st].latency == small;
            }
            let (has, streams) = (&sc.has, &self.streams);
            sc.set.retain(|&st| !has[streams[st].server] || streams[st].latency == small);
        }
        if self.interleave {
            // Lcore-major: every rank has the same streams in the same
            // order, so this order is the same on every rank too.
            let streams = &self.streams;
            sc.set.sort_unstable_by_key(|&st| (streams[st].lcore, streams[st].server, st));
        }
        let found = match self.gens.iter().position(|g| g.set == sc.set) {
            Some(g) => Some(g),
            None if sc.set.is_empty() => None,
            None => {
                self.gens.push(Gen { set: sc.set.clone(), rotate: 0 });
                Some(self.gens.len() - 1)
            }
        };
        self.scratch = sc;
        found
    }
}

#[derive(Default)]
pub(super) struct Pacing {
    pub(super) in_flight: u32,
    pub(super) waiting: VecDeque<u32>,
}

/// One all-reduce in progress.
pub(super) struct Op {
    pub(super) id: u64,
    pub(super) sub: usize,
    /// Its index among the sub-job's operations (the same on every rank).
    pub(super) index: u64,
    /// Cut into chunks (`chunk_bytes`, `chunks`, `first`, `next`, `gen`
    /// set). An operation started while a drain's switch is being agreed is
    /// held uncut until the switch is known.
    pub(super) planned: bool,
    /// Its stream set (index into the sub-job's `gens`).
    pub(super) gen: usize,
    pub(super) send: *const u8,
    pub(super) recv: *mut u8,
    pub(super) bytes: usize,
    /// This operation's chunk size ([`op_chunk_bytes`]).
    pub(super) chunk_bytes: usize,
    pub(super) chunks: usize,
    /// The position of chunk 0 in the stream set: chunk c goes to the
    /// set's stream (first + c) mod S.
    pub(super) first: usize,
    /// Next chunk to post, per stream (chunk = (position - first) mod S + k * S;
    /// usize::MAX for streams outside the operation's set).
    /// Recycled through `Client::spare_next`, so starting an operation
    /// allocates nothing once the first few have run.
    pub(super) next: Vec<usize>,
    /// Chunks posted so far (all [`Op::pieces`]: nothing left for `pump`).
    pub(super) posted: usize,
    /// Chunks done.
    pub(super) done: usize,
    pub(super) mh_send: Option<MemoryHandle>,
    pub(super) mh_recv: Option<MemoryHandle>,
    /// When it was started (for [`SLOW_OP`]).
    pub(super) started: Instant,
}

/// An all-reduce that took longer than this is logged when it completes: a
/// gray failure should cost at most the liveness time (2 s) plus a recovery,
/// and an operator (or the soak) wants to see which operation stood still,
/// and when, beside the failover lines that say why.
pub(super) const SLOW_OP: Duration = Duration::from_secs(3);

impl Op {
    /// Chunks: what it posts and completes.
    #[inline(always)]
    pub(super) fn pieces(&self) -> usize {
        self.chunks
    }

    /// Chunk `chunk`'s offset and length in the operation's buffers (the
    /// one place that says how an operation is cut: every rank cuts alike).
    #[inline(always)]
    pub(super) fn span(&self, chunk: usize) -> (usize, usize) {
        let off = chunk * self.chunk_bytes;
        (off, self.chunk_bytes.min(self.bytes - off))
    }

    /// Whether it still has a chunk to post on stream `st`. (`next` is
    /// `usize::MAX` for a stream outside its set.)
    #[inline(always)]
    pub(super) fn left_on(&self, st: usize) -> bool {
        self.next.get(st).is_some_and(|&n| n < self.chunks)
    }

    /// Whether the thread of rail `rail` copies this operation's staged
    /// results received there into its output as they arrive (`copy_to` of
    /// [`Rails::recv`]). Not an endpoint the caller drives, and not in place:
    /// there the output is the input, which must stay intact until the main
    /// thread has seen the result (a recovery may send the input again for
    /// a result the rank has not seen), so [`Op::land`] copies it then.
    pub(super) fn rail_copies(&self, rails: &Rails, rail: usize) -> bool {
        rails.copies_results(rail) && !std::ptr::eq(self.send, self.recv.cast_const())
    }

    /// Chunk `chunk`'s result, staged in `stage`'s slot of (`st`, `seq`):
    /// copied into this operation's output where it is still to be copied
    /// (`how`), and remembered as what the slot stands for.
    #[inline]
    pub(super) fn land(&self, stage: &mut Stage, st: usize, seq: u32, chunk: usize, how: Landed) {
        let (off, len) = self.span(chunk);
        // SAFETY: off + len <= bytes, inside the caller's output (contract
        // of `start`), which no staging slot overlaps.
        unsafe { stage.land(st, seq, chunk, self.index, self.recv.add(off), len, how) };
    }
}

#[cfg(test)]
mod tests {
    use super::op_chunk_bytes;
    use crate::client::config::MIN_SPREAD_PIECE;

    #[test]
    fn small_operations_spread_over_every_stream() {
        const M: usize = MIN_SPREAD_PIECE;
        // 1 MiB over 8 streams with 512 KiB chunks: 8 pieces of 128 KiB.
        assert_eq!(op_chunk_bytes(1 << 20, 512 << 10, 8, 4, M), 128 << 10);
        // Large operations keep the job's chunk.
        assert_eq!(op_chunk_bytes(64 << 20, 512 << 10, 8, 4, M), 512 << 10);
        // A few KiB stay whole: one piece, one stream.
        assert_eq!(op_chunk_bytes(4096, 512 << 10, 8, 4, M), MIN_SPREAD_PIECE);
        assert_eq!(op_chunk_bytes(100, 512 << 10, 8, 4, M), MIN_SPREAD_PIECE);
        // Whole elements, never above the job's chunk, never zero.
        assert_eq!(op_chunk_bytes(3 << 20, 1 << 20, 3, 8, M), 1 << 20);
        assert_eq!(op_chunk_bytes(8, 8, 1, 8, M), 8);
        // A smaller minimum piece spreads a 4 KiB all-reduce over 4 streams.
        assert_eq!(op_chunk_bytes(4096, 512 << 10, 8, 4, 1024), 1024);
        for (bytes, max, streams, elem) in [(12345usize, 65536usize, 7usize, 2usize), (1 << 22, 4096, 64, 8), (0, 4096, 4, 4)] {
            let c = op_chunk_bytes(bytes, max, streams, elem, M);
            assert!(c.is_multiple_of(elem) && c <= max && c >= elem, "{bytes} {max} {streams} {elem}: {c}");
            assert!(bytes.div_ceil(c) <= streams.max(bytes.div_ceil(max)), "{bytes} {max} {streams}: {c}");
        }
    }
}
