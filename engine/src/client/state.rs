//! A client's state: per sub-job (one per (dtype, op) pair) its streams
//! (one per server lcore), the chunks in flight on each (`Flight`), the
//! stream sets operations are cut over (`Gen`), and each all-reduce in
//! progress (`Op`). Only the client's own modules see inside.
use crate::client::failover::{Fo, Stage};
use crate::client::liveness::Liveness;
use crate::client::rails::Rails;
use crate::dataplane::fabric::{MemoryHandle, PeerAddr};
use crate::reduce::{DataType, ReduceOp};
use crate::wire::JobTag;
use std::collections::VecDeque;
use std::net::TcpStream;
use std::time::{Duration, Instant};

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
    /// Where results land first when the sub-job can fail over (None: straight
    /// into the caller's buffer).
    pub(super) stage: Option<Stage>,
    /// A relay job's receive buffers (see [`ClientConfig::relay`]): the
    /// other rank's small pieces land here and are reduced with this
    /// rank's into the result's place (None: not a relay job).
    pub(super) relay: Option<Stage>,
    /// A split job (see [`ClientConfig::split`]): its split stream, which
    /// carries every operation of at most `split_max` bytes (None: not split).
    pub(super) split: Option<usize>,
    pub(super) split_max: usize,
    /// Failover state: lost servers, the recovery round in progress.
    pub(super) fo: Fo,
    /// When each server was last heard from (see [`liveness`]).
    pub(super) live: Liveness,
}

impl SubJob {
    pub(super) fn holding(&self) -> bool {
        self.fo.recovering || self.fo.rejoin_pending() || self.leave.iter().any(|l| matches!(l, Leave::Awaiting { .. }))
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

    /// Whether a rail thread copies this operation's staged results into
    /// its output as they arrive (`copy_to` of [`Rails::recv`]). Not in place:
    /// there the output is the input, which must stay intact until the main
    /// thread has seen the result (a recovery may send the input again for
    /// a result the rank has not seen), so `failover::land` copies it then.
    pub(super) fn rail_copies(&self, rails: &Rails) -> bool {
        rails.copies_results() && !std::ptr::eq(self.send, self.recv.cast_const())
    }
}
