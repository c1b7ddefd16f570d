//! The client side of agg all-reduce: what a GPU worker (or the NCCL plugin)
//! runs to use tally servers.
//!
//! A [`Client`] connects to one or more servers for one job. An all-reduce
//! of `count` elements is cut into chunks of at most `chunk_elems` elements;
//! chunk `c` goes to stream `(first + c) mod S`, where the S streams are every
//! (server, lcore) pair the job uses, so each lcore gets its shard straight
//! from the client (no dispatcher on the server). `first`, the stream of
//! chunk 0, is the stream after the previous all-reduce's last chunk: small
//! all-reduces (one chunk) rotate over every lcore of every server instead
//! of all landing on the first, so one lcore's sends and reposts for
//! operation k overlap with another lcore taking operation k+1. An
//! all-reduce smaller than S full
//! chunks is cut into smaller ones ([`op_chunk_bytes`]) so that it still
//! spreads over every server's link instead of queueing on the first few. Each stream keeps up to `window`
//! chunks in flight; a chunk is: post the receive for its result straight
//! into the output buffer, send the input piece, done when both complete.
//! All ranks cut identically, so chunk `c` of every rank meets in the same
//! server slot with the same sequence number.
//!
//! The job fixes one data type and op on the server. A client may use
//! several: the first all-reduce with a new (dtype, op) joins a sibling job
//! (its id derived from the job id, dtype and op). Like every collective,
//! that requires all ranks to issue the same calls in the same order.
//!
//! Pacing: a stream's window bounds the chunks awaiting results, but if
//! every one of them is sent at once, TCP-like fabrics share the link
//! among them fairly, all the uploads finish together and the results come
//! back only afterwards: no overlap of upload and download, about half the
//! link rate. With `send_credits` set, at most that many sends per server
//! are in flight, issued in chunk order across streams, so early chunks
//! finish uploading early and their results flow back while later chunks
//! go up. Receives are posted as before (they cost no bandwidth).
//!
//! Drain: a server that is going away (SIGTERM) sends a `Drain` on the
//! job's control connection. The client answers with the index of its
//! first all-reduce of that sub-job not yet cut into chunks (operations are
//! numbered per sub-job from 0: every rank issues the same ones in the same
//! order) and holds its later all-reduces uncut until the server answers
//! with the switch operation K (the largest index any rank gave). Before K
//! the old streams are used, from K on only the other servers' streams: K
//! starts a new stream set, cut and rotated as from scratch, identically
//! on every rank. Once this rank's operations before K completed it says
//! Bye to the draining server and closes that connection. Each shard's
//! result is the same rank-order sum wherever it is reduced, so results
//! stay bit-identical. A client with no other server answers "stay" and
//! keeps using the draining server. A server that refuses a sub-job's join
//! because it drains is left out of that sub-job (every rank gets the same
//! answer from it).
//!
//! Operations are asynchronous underneath ([`Client::start`] and
//! [`Client::test`], the form the NCCL plugin uses); [`Client::allreduce`]
//! is the blocking convenience.
use crate::dataplane::fabric::{
    select_provider, Completion, Endpoint, EndpointConfig, EndpointName, Hints, MemoryHandle, PeerAddr, PollError, PostError,
};
use crate::reduce::{DataType, Kernels, ReduceOp};
use crate::wire::{self, Accept, Boundary, Drain, Hello, JobSpec, Kind, NameRecord, Reject, RejectCode, SwitchAt, Tag, TOKEN_BYTES};
use std::collections::VecDeque;
use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

pub mod failover;
mod join_wait;
pub mod liveness;
pub mod rails;
pub mod watchdog;
use failover::{Fo, Stage};
use liveness::Liveness;
use rails::Rails;

/// How to reach the servers and cut the work.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Control addresses (`host:port`) of the servers.
    pub servers: Vec<String>,
    /// The same on every rank of the job.
    pub job_id: u64,
    pub rank: u32,
    pub nranks: u32,
    /// Shared token (TALLY_TOKEN), at most 32 bytes.
    pub token: String,
    /// Bytes per shard piece (rounded down to whole elements per type).
    /// Default from TALLY_CHUNK (K/M suffixes), else 256 KiB. Over
    /// tcp;ofi_rxm a chunk at or below the eager limit (32 KiB, see
    /// `fabric::defaults`) avoids a rendezvous round trip per chunk.
    pub chunk_bytes: usize,
    /// Chunks in flight per (server, lcore). Default from TALLY_WINDOW, else 4.
    pub window: u32,
    /// Lcores to use per server (0: all of them).
    pub shards: u32,
    /// Fabric provider (None: TALLY_PROVIDER or tally's default).
    pub provider: Option<String>,
    /// Local address for the fabric endpoint (tcp), e.g. this host's address on the servers' network.
    pub fabric_addr: Option<String>,
    /// Bound on an all-reduce making no progress.
    pub timeout: Duration,
    /// Bound on joining: all ranks must arrive, and a server that says
    /// `busy` (a join storm) is tried again with jittered backoff until
    /// then. Default from TALLY_JOIN_TIMEOUT_S, else 120 s: the ranks of a
    /// thousand-node job start over a minute or more. (The server has its
    /// own, `join_timeout_s`, for all ranks to arrive.)
    pub join_timeout: Duration,
    /// Spin this many empty polls before sleeping on the CQ.
    pub spin_polls: u32,
    /// Longest sleep on the CQ (ms) before polling again. Traffic wakes the
    /// client through the CQ's descriptor (tcp), so this bounds only a
    /// missed wake-up; shm and EFA nap 50 us whatever it says. Hundreds of
    /// clients on a few cores (a load generator) raise it: each wake-up of
    /// an idle client costs system calls. Default 1.
    pub sleep_ms: u32,
    /// Sends in flight per server (0: as many as the windows allow).
    /// Default from TALLY_SEND_CREDITS.
    pub send_credits: u32,
    /// Smallest piece an all-reduce is cut into to spread it over streams
    /// (see [`op_chunk_bytes`]). Must be the same on every rank. Default
    /// from TALLY_MIN_PIECE, else [`MIN_SPREAD_PIECE`].
    pub min_piece: usize,
    /// Survive the loss of a server when the job has others (see
    /// [`failover`]): results land in a staging area first and are copied
    /// out, which costs one copy of every result. Default on; TALLY_FAILOVER=0
    /// turns it off (a lost server then fails the job, as before).
    pub failover: bool,
    /// Fault injection, for tests of failover: results from server
    /// `.0` (its index in `servers`) of operations from index `.1` on are
    /// dropped as they arrive, as if lost in flight. None in real use.
    pub fault_drop_results: Option<(usize, u64)>,
    /// A two-rank job on one server asks it to relay its pieces of at most
    /// [`wire::RELAY_MAX`] bytes (each rank gets the other's piece and
    /// reduces the two itself: one hop through the server for the last
    /// piece in, instead of a reduce and two sends in a row). Must be the
    /// same on both ranks. Default on; TALLY_RELAY=0 turns it off (needed
    /// to join servers older than the relay, which refuse the flag).
    pub relay: bool,
    /// A job of 4 to 64 ranks on one server asks it to split its pieces of
    /// at most [`wire::SPLIT_MAX`] bytes by rank over its lcores (see
    /// `wire`'s module doc): each rank sends to its group's lcore, so no
    /// lcore copies every rank's piece in and the result out to every rank.
    /// Must be the same on every rank. Default on; TALLY_SPLIT=0 turns it
    /// off (needed to join servers older than the split, which refuse the
    /// flag).
    pub split: bool,
    /// Endpoints the client moves bytes through, each driven by its own
    /// thread, server `si` on rail `si mod rails` (see [`rails`]). 1: one
    /// endpoint on the caller's thread, no thread of its own. 0: auto
    /// ([`rails::auto_rails`]: one per server over tcp on hosts of 8 or
    /// more cores). Default from TALLY_RAILS, else 0.
    pub rails: usize,
    /// Cores to pin the rail threads to, one each in order (empty: they
    /// keep the affinity of the thread that connects). From TALLY_RAIL_CORES.
    pub rail_cores: Vec<usize>,
    /// A server of a job that can fail over, heard once, then silent this
    /// long (no heartbeat, no message) is lost (see [`liveness`]). Default
    /// from TALLY_LIVENESS_MS, else 2 s; zero: never.
    pub liveness: Duration,
    /// A provider call on one of the client's endpoints that has not
    /// returned for this long is reported (see [`watchdog`]). Default from
    /// TALLY_PROVIDER_WATCHDOG_S, else 10 s; zero: not watched.
    pub provider_watchdog: Duration,
}

impl ClientConfig {
    pub fn new(servers: Vec<String>, job_id: u64, rank: u32, nranks: u32) -> ClientConfig {
        ClientConfig {
            servers,
            job_id,
            rank,
            nranks,
            token: std::env::var("TALLY_TOKEN").unwrap_or_default(),
            chunk_bytes: env_size("TALLY_CHUNK").unwrap_or(256 << 10),
            window: env_size("TALLY_WINDOW").map_or(4, |w| w.clamp(1, 64) as u32),
            shards: 0,
            provider: None,
            fabric_addr: None,
            timeout: Duration::from_secs(30),
            join_timeout: Duration::from_secs(
                std::env::var("TALLY_JOIN_TIMEOUT_S").ok().and_then(|v| v.trim().parse().ok()).filter(|&s| s > 0).unwrap_or(120),
            ),
            spin_polls: 2048,
            sleep_ms: 1,
            send_credits: std::env::var("TALLY_SEND_CREDITS").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
            min_piece: env_size("TALLY_MIN_PIECE").unwrap_or(MIN_SPREAD_PIECE),
            failover: std::env::var("TALLY_FAILOVER").map_or(true, |v| v != "0"),
            fault_drop_results: None,
            relay: std::env::var("TALLY_RELAY").map_or(true, |v| v != "0"),
            split: std::env::var("TALLY_SPLIT").map_or(true, |v| v != "0"),
            rails: std::env::var("TALLY_RAILS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0),
            rail_cores: std::env::var("TALLY_RAIL_CORES")
                .ok()
                .and_then(|v| crate::host::cpuset::CoreList::parse(&v).ok())
                .map_or_else(Vec::new, |l| l.as_slice().to_vec()),
            liveness: Duration::from_millis(
                std::env::var("TALLY_LIVENESS_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(DEFAULT_LIVENESS_MS),
            ),
            provider_watchdog: watchdog::limit_from_env(),
        }
    }
}

/// A rank's default liveness time (ms): eight of the server's default heartbeats.
pub const DEFAULT_LIVENESS_MS: u64 = 2000;

/// A positive size from the environment (K/M/G suffixes), if set and valid.
fn env_size(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| crate::host::units::parse_size(&v).ok()).map(|v| v as usize).filter(|&v| v > 0)
}

#[derive(Debug)]
pub enum ClientError {
    Config(String),
    Connect {
        server: String,
        error: String,
    },
    /// The server refused the job, or ended it (a rank left, a bad chunk...).
    Refused {
        server: String,
        reject: String,
    },
    Fabric(String),
    /// No progress within the timeout.
    Timeout(String),
    BadArgument(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Config(m) => write!(f, "configuration: {m}"),
            ClientError::Connect { server, error } => write!(f, "cannot connect to {server}: {error}"),
            ClientError::Refused { server, reject } => write!(f, "server {server}: {reject}"),
            ClientError::Fabric(m) => write!(f, "fabric: {m}"),
            ClientError::Timeout(m) => write!(f, "timed out: {m}"),
            ClientError::BadArgument(m) => write!(f, "bad argument: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Sibling jobs (one per dtype/op pair) a client may open.
pub const MAX_SUBJOBS: usize = 8;
/// Operations queued per client.
pub const MAX_OPS: usize = 64;
/// Empty polls between two checks of the control connections and the timeout.
const IDLE_CHECK_EVERY: u32 = 64;
/// Polls with completions between two checks of the control connections:
/// a rank that never sees an empty poll still hears of a drain.
const BUSY_CHECK_EVERY: u32 = 1024;

/// One (server, lcore) stream of a sub-job.
struct Stream {
    /// Its server was lost while this stream served it (failover): nothing
    /// is posted on it again. A server that comes back gets new streams.
    lost: bool,
    /// One of its server's latency lcores: it carries only the sub-job's
    /// small operations (`SubJob::latency_max`).
    latency: bool,
    /// The split stream (`SubJob::split`): to this rank's group's lcore, in
    /// slots `window..2 x window` of the job's tags (`slot_base`).
    split: bool,
    slot_base: u16,
    /// The operations it carries: from `born` (0, or the switch of the
    /// rejoin that added it) to before `died` (the switch of the recovery
    /// from losing it). All ranks agree on both.
    born: u64,
    died: u64,
    addr: PeerAddr,
    /// Index of its server in the client's server list.
    server: usize,
    job_tag: u16,
    next_seq: u32,
    /// Oldest sequence not yet complete. Slots are reused in sequence order,
    /// so a new chunk may go out only while `next_seq - head_seq < window`,
    /// however the chunks in between complete.
    head_seq: u32,
    /// Slots of `next_seq` and `head_seq`, counted separately from the
    /// sequence (which wraps at 2^32, not at a multiple of the window).
    next_slot: u32,
    head_slot: u32,
}

impl Stream {
    fn new(addr: PeerAddr, server: usize, job_tag: u16) -> Stream {
        Stream {
            lost: false,
            latency: false,
            split: false,
            slot_base: 0,
            born: 0,
            died: u64::MAX,
            addr,
            server,
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
struct Flight {
    op: u64,
    chunk: usize,
    seq: u32,
    send_done: bool,
    recv_done: bool,
    /// Relayed (see [`ClientConfig::relay`]): the other rank's piece lands
    /// in the sub-job's relay slot, `got` bytes of it.
    relayed: bool,
    got: u32,
}

/// Where a sub-job stands with one of its servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leave {
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
struct GenScratch {
    member: Vec<bool>,
    set: Vec<usize>,
    has: Vec<bool>,
}

/// A stream set: the streams a run of operations of one size class uses
/// (the servers in use, their latency or bulk lcores).
struct Gen {
    set: Vec<usize>,
    /// The position in `set` of the next all-reduce's chunk 0. Every rank
    /// issues the same all-reduces in the same order, so it advances
    /// identically; a new set starts at 0.
    rotate: usize,
}

/// A job on the servers for one (dtype, op).
struct SubJob {
    dtype: DataType,
    op: ReduceOp,
    chunk_elems: usize,
    streams: Vec<Stream>,
    flights: Vec<Flight>,
    /// Per server: the job's control connection (None once this rank left
    /// the server, or when the server refused the join because it drains).
    controls: Vec<Option<TcpStream>>,
    leave: Vec<Leave>,
    /// Stream sets seen so far; at most two (small, bulk) per server left.
    gens: Vec<Gen>,
    /// Operations of at most this many bytes use only the latency lcores of
    /// the servers that have them, larger ones only the others (0: no split).
    latency_max: usize,
    /// Reused by `gen_for`.
    scratch: GenScratch,
    /// Index of the next operation started on this sub-job.
    started: u64,
    /// Some server is left from an operation on but not told Bye yet.
    retiring: bool,
    /// Per server: sends in flight, and send contexts waiting for a credit
    /// (in chunk order). Only used with `send_credits`.
    pacing: Vec<Pacing>,
    /// Where results land first when the sub-job can fail over (None: straight
    /// into the caller's buffer).
    stage: Option<Stage>,
    /// A relay job's receive buffers (see [`ClientConfig::relay`]): the
    /// other rank's small pieces land here and are reduced with this
    /// rank's into the result's place (None: not a relay job).
    relay: Option<Stage>,
    /// A split job (see [`ClientConfig::split`]): its split stream, which
    /// carries every operation of at most `split_max` bytes (None: not split).
    split: Option<usize>,
    split_max: usize,
    /// Failover state: lost servers, the recovery round in progress.
    fo: Fo,
    /// When each server was last heard from (see [`liveness`]).
    live: Liveness,
}

impl SubJob {
    fn holding(&self) -> bool {
        self.fo.recovering || self.fo.rejoin_pending() || self.leave.iter().any(|l| matches!(l, Leave::Awaiting { .. }))
    }

    /// Whether stream `st` belongs to a server this rank lost.
    #[inline(always)]
    fn lost_stream(&self, st: usize) -> bool {
        self.streams[st].lost
    }

    /// Whether server `si` carries operation `index`.
    fn member(&self, si: usize, index: u64) -> bool {
        !matches!(self.leave[si], Leave::At(k) if k <= index)
    }

    /// The stream set of operation `index` of `bytes` (added on first use);
    /// None when no server is left, which the drain protocol never lets happen.
    /// Called for every operation: it works in `scratch`, so that once the
    /// sets in use exist it allocates nothing.
    fn gen_for(&mut self, index: u64, bytes: usize) -> Option<usize> {
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
struct Pacing {
    in_flight: u32,
    waiting: VecDeque<u32>,
}

/// One all-reduce in progress.
struct Op {
    id: u64,
    sub: usize,
    /// Its index among the sub-job's operations (the same on every rank).
    index: u64,
    /// Cut into chunks (`chunk_bytes`, `chunks`, `first`, `next`, `gen`
    /// set). An operation started while a drain's switch is being agreed is
    /// held uncut until the switch is known.
    planned: bool,
    /// Its stream set (index into the sub-job's `gens`).
    gen: usize,
    send: *const u8,
    recv: *mut u8,
    bytes: usize,
    /// This operation's chunk size ([`op_chunk_bytes`]).
    chunk_bytes: usize,
    chunks: usize,
    /// The position of chunk 0 in the stream set: chunk c goes to the
    /// set's stream (first + c) mod S.
    first: usize,
    /// Next chunk to post, per stream (chunk = (position - first) mod S + k * S;
    /// usize::MAX for streams outside the operation's set).
    /// Recycled through `Client::spare_next`, so starting an operation
    /// allocates nothing once the first few have run.
    next: Vec<usize>,
    /// Chunks posted so far (all of them: nothing left for `pump`).
    posted: usize,
    done: usize,
    mh_send: Option<MemoryHandle>,
    mh_recv: Option<MemoryHandle>,
    /// When it was started (for [`SLOW_OP`]).
    started: Instant,
}

/// An all-reduce that took longer than this is logged when it completes: a
/// gray failure should cost at most the liveness time (2 s) plus a recovery,
/// and an operator (or the soak) wants to see which operation stood still,
/// and when, beside the failover lines that say why.
const SLOW_OP: Duration = Duration::from_secs(3);

impl Op {
    /// Whether a rail thread copies this operation's staged results into
    /// its output as they arrive (`copy_to` of [`Rails::recv`]). Not in place:
    /// there the output is the input, which must stay intact until the main
    /// thread has seen the result (a recovery may send the input again for
    /// a result the rank has not seen), so `failover::land` copies it then.
    fn rail_copies(&self, rails: &Rails) -> bool {
        rails.copies_results() && !std::ptr::eq(self.send, self.recv.cast_const())
    }
}

/// The smallest piece an all-reduce is cut into when it is spread over
/// streams: below this, a piece's fixed costs outweigh the parallelism.
pub const MIN_SPREAD_PIECE: usize = 4096;

/// The chunk size of one all-reduce of `bytes`: the job's `max_chunk`, or,
/// when fewer than one full chunk per stream would be left, an equal share
/// per stream (rounded up to [`MIN_SPREAD_PIECE`] and whole elements) so
/// that every server link and lcore carries part of it. Every rank computes
/// the same value from the same arguments, so chunk `c` still meets chunk
/// `c` of every other rank in the same slot.
pub fn op_chunk_bytes(bytes: usize, max_chunk: usize, streams: usize, elem: usize, min_piece: usize) -> usize {
    let share = bytes.div_ceil(streams.max(1)).next_multiple_of(min_piece.max(1)).next_multiple_of(elem);
    share.min(max_chunk).max(elem)
}

/// An all-reduce handle from [`Client::start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request(u64);

pub struct Client {
    cfg: ClientConfig,
    token: [u8; TOKEN_BYTES],
    /// The endpoints (one, or one per rail thread).
    rails: Rails,
    subs: Vec<SubJob>,
    ops: VecDeque<Op>,
    /// Per-stream cursors of finished operations, reused by the next ones.
    spare_next: Vec<Vec<usize>>,
    next_op: u64,
    /// Context ids refused with EAGAIN, retried first.
    retry: Vec<u32>,
    per_sub: u32,
    registrations: Vec<(usize, usize, MemoryHandle)>,
    last_progress: Instant,
    /// Empty polls since the last completion (paces the idle checks).
    idle_polls: u32,
    /// Polls with completions (paces the control checks of a busy rank).
    busy_polls: u32,
    /// The completion batch, kept so that an empty poll writes nothing.
    batch: [Completion; 32],
    /// What failover did so far.
    stats: failover::FailoverStats,
    /// Reports a provider call that does not return (None: off).
    watchdog: Option<watchdog::Watchdog>,
    /// Reduces a relay job's pieces (the best kernels this CPU has).
    kernels: Kernels,
    /// An operation failed or was aborted: this rank did not finish
    /// cleanly, so it must not say Bye (the servers then fail the job for
    /// the other ranks at once instead of counting this one as done).
    failed: bool,
}

// SAFETY: the raw buffer pointers in queued operations belong to the caller,
// who promised (in `start`) they stay valid until the operation completes;
// the endpoint is used only through &mut self.
unsafe impl Send for Client {}

impl Client {
    /// Opens the fabric endpoint. Jobs are joined on first use (or with [`Client::join`]).
    pub fn connect(cfg: ClientConfig) -> Result<Client, ClientError> {
        if cfg.servers.is_empty() {
            return Err(ClientError::Config("no servers given (TALLY_SERVERS)".into()));
        }
        if cfg.rank >= cfg.nranks {
            return Err(ClientError::Config(format!("rank {} is not below nranks {}", cfg.rank, cfg.nranks)));
        }
        let token = wire::token_bytes(&cfg.token).ok_or_else(|| ClientError::Config("token longer than 32 bytes".into()))?;
        let local = cfg.servers.iter().all(|s| s.starts_with("127.") || s.starts_with("localhost:") || s.starts_with("[::1]"));
        let provider = select_provider(cfg.provider.as_deref(), local);
        let node = match (&cfg.fabric_addr, provider.starts_with("tcp")) {
            (Some(a), _) => Some(a.clone()),
            (None, true) if local => Some("127.0.0.1".to_string()),
            _ => None,
        };
        let servers_lcores_guess = 64u32; // contexts per sub-job are sized on join
        let per_sub = cfg.servers.len() as u32 * servers_lcores_guess * cfg.window.max(1) * 2;
        let ecfg = EndpointConfig {
            hints: Hints::new(&provider).with_node(node.as_deref()),
            cq_size: 0,
            contexts: per_sub * MAX_SUBJOBS as u32,
            wait_object: true,
        };
        let want = rails::resolve_rails(cfg.rails, &provider, cfg.servers.len());
        let open = || Endpoint::open(&ecfg).map_err(|e| ClientError::Fabric(format!("{provider}: {e}")));
        let first = open()?;
        let rails = if !rails::wants_rail_threads(&provider, want) || first.needs_local_mr() {
            Rails::direct(first)
        } else {
            let mut eps = vec![first];
            for _ in 1..want {
                eps.push(open()?);
            }
            Rails::threaded(eps, cfg.spin_polls, cfg.sleep_ms, &cfg.rail_cores, ecfg.contexts as usize)
        }
        .map_err(|e| ClientError::Fabric(e.to_string()))?;
        if rails.count() > 1 {
            log::info!(
                "rank {}: {} rails (an endpoint and a thread each), server i on rail i mod {}",
                cfg.rank,
                rails.count(),
                rails.count()
            );
        }
        crate::dataplane::lcore::precise_naps();
        let watchdog = watchdog::Watchdog::start(
            format!("rank {}", cfg.rank),
            rails.provider(),
            rails.call_watches().to_vec(),
            rails.has_threads(),
            cfg.provider_watchdog,
        );
        Ok(Client {
            token,
            watchdog,
            rails,
            subs: Vec::new(),
            ops: VecDeque::with_capacity(MAX_OPS),
            spare_next: Vec::with_capacity(MAX_OPS),
            next_op: 1,
            retry: Vec::with_capacity((per_sub as usize) * MAX_SUBJOBS),
            per_sub,
            registrations: Vec::new(),
            last_progress: Instant::now(),
            failed: false,
            stats: failover::FailoverStats::default(),
            kernels: Kernels::best(),
            idle_polls: 0,
            busy_polls: 0,
            batch: [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 32],
            cfg,
        })
    }

    pub fn provider(&self) -> &str {
        self.rails.provider()
    }

    /// Streams (server, lcore pairs) of the first joined sub-job.
    pub fn streams(&self) -> usize {
        self.subs.first().map_or(0, |s| s.streams.len())
    }

    fn job_id_for(&self, dtype: DataType, op: ReduceOp) -> u64 {
        // The first pair keeps the caller's id; the others derive one.
        match self.subs.iter().position(|s| s.dtype == dtype && s.op == op) {
            Some(0) | None if self.subs.is_empty() => self.cfg.job_id,
            _ => self.cfg.job_id ^ (((dtype as u64) << 56) | ((op as u64) << 48) | 0x5a5a_0000_0000),
        }
    }

    /// Joins the job for (dtype, op) on every server, if not joined yet.
    /// Blocks until every rank joined (or the timeout). Collective.
    pub fn join(&mut self, dtype: DataType, op: ReduceOp) -> Result<usize, ClientError> {
        if let Some(i) = self.subs.iter().position(|s| s.dtype == dtype && s.op == op) {
            return Ok(i);
        }
        if self.subs.len() == MAX_SUBJOBS {
            return Err(ClientError::BadArgument(format!("more than {MAX_SUBJOBS} (dtype, op) pairs in one job")));
        }
        let mut chunk_elems = (self.cfg.chunk_bytes / dtype.size()).max(1);
        let spec = JobSpec {
            job_id: self.job_id_for(dtype, op),
            nranks: self.cfg.nranks,
            dtype,
            op,
            chunk_elems: chunk_elems as u32,
            window: self.cfg.window,
            shards: self.cfg.shards,
            // One server only: the relay is not combined with failover
            // (see ARCHITECTURE "Small all-reduces"). Every rank has the
            // same server list, so every rank decides alike.
            relay: self.cfg.relay && self.cfg.nranks == 2 && self.cfg.servers.len() == 1,
            // The same for the split, which needs two ranks per lcore.
            split: self.cfg.split
                && self.cfg.servers.len() == 1
                && (wire::SPLIT_MIN_RANKS..=wire::SPLIT_MAX_RANKS).contains(&self.cfg.nranks),
        };
        // Each server's Hello names the rail that carries its streams.
        let mut hellos = (0..self.cfg.servers.len())
            .map(|si| Hello::new(&spec, self.cfg.rank, &self.token, self.rails.name(self.rails.rail_of(si)).as_bytes()))
            .collect::<Option<Vec<Hello>>>()
            .ok_or_else(|| ClientError::Fabric("endpoint name too long".into()))?;
        if self.wants_heartbeats() {
            hellos.iter_mut().for_each(|h| h.flags |= Hello::ALIVE);
        }
        // Send every Hello first, then wait for the answers: servers admit
        // the job only when all ranks are in, on all servers at once. The
        // connects run side by side: one to a server that does not answer
        // yet (its link down a while) must not hold back this rank's Hellos
        // to the others, which could then not tell the other ranks at once
        // if this rank died meanwhile (they would wait out the join timeout).
        let timeout = self.cfg.join_timeout;
        let connected: Vec<Result<TcpStream, ClientError>> = if hellos.len() == 1 {
            vec![say_hello(&self.cfg.servers[0], &hellos[0], timeout)]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = self
                    .cfg
                    .servers
                    .iter()
                    .zip(&hellos)
                    .map(|(server, hello)| scope.spawn(move || say_hello(server, hello, timeout)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err(ClientError::Config("a connect thread panicked".into()))))
                    .collect()
            })
        };
        let controls = connected.into_iter().collect::<Result<Vec<TcpStream>, ClientError>>()?;
        let mut streams = Vec::new();
        let mut latency_max = 0usize;
        // The lcores a split job's small operations may go to (one server).
        let mut small_lcores = 0u32;
        let mut leave = vec![Leave::Serving; controls.len()];
        let mut refused_draining = None;
        let mut controls: Vec<Option<TcpStream>> = controls.into_iter().map(Some).collect();
        let join_started = Instant::now();
        let mut answers = self.collect_answers(&mut controls, &hellos, join_started)?;
        for (si, slot) in controls.iter_mut().enumerate() {
            let server = &self.cfg.servers[si];
            let Some(s) = slot.as_mut() else { continue };
            let Some(answer) = answers[si].take() else { continue };
            let g = match answer {
                Ok(g) => g,
                // Every rank of the sub-job gets this same answer from a
                // draining server, so all of them leave it out alike.
                Err(r) if r.code() == Some(RejectCode::Draining) => {
                    log::info!("server {server} drains: job {:#x} runs on the other servers", spec.job_id);
                    refused_draining = Some(ClientError::Refused { server: server.clone(), reject: r.to_string() });
                    leave[si] = Leave::At(0);
                    *slot = None;
                    continue;
                }
                Err(r) => return Err(ClientError::Refused { server: server.clone(), reject: r.to_string() }),
            };
            // A server may grant smaller pieces than asked (its slab budget):
            // cut to the smallest grant. Every rank gets the same answers.
            if g.piece_elems != 0 {
                chunk_elems = chunk_elems.min(g.piece_elems as usize);
            }
            // The smallest threshold of the servers that split operations by
            // size: every rank gets the same answers, so classes every op alike.
            if let Some((_, max)) = g.latency {
                latency_max = if latency_max == 0 { max } else { latency_max.min(max) };
            }
            let latency_lcores = g.latency.map_or(0, |(l, _)| l);
            small_lcores = if latency_lcores > 0 { latency_lcores } else { g.names.len() } as u32;
            for (k, n) in g.names.iter().enumerate() {
                let addr = self.rails.insert_peer(self.rails.rail_of(si), n).map_err(|e| ClientError::Fabric(e.to_string()))?;
                streams.push(Stream { latency: k < latency_lcores, ..Stream::new(addr, si, g.tag) });
            }
            keepalive(s);
            let _ = s.set_nonblocking(true);
        }
        if streams.is_empty() {
            return Err(refused_draining.unwrap_or_else(|| ClientError::Config("no server accepted the job".into())));
        }
        // A split job: the stream to this rank's group's lcore, which the
        // server (from the same Accept) serves in slots window..2 x window.
        let groups = wire::split_lcores(self.cfg.nranks, small_lcores);
        let (split, split_max) = if spec.split && groups >= 2 {
            let p = wire::split_position(self.cfg.rank, self.cfg.nranks, groups) as usize;
            let base = Stream::new(streams[p].addr, streams[p].server, streams[p].job_tag);
            streams.push(Stream { split: true, slot_base: self.cfg.window as u16, ..base });
            (Some(streams.len() - 1), wire::SPLIT_MAX.min(chunk_elems * dtype.size()))
        } else {
            (None, 0)
        };
        if streams.len() as u32 * self.cfg.window * 2 + failover::REDO_CONTEXTS_PER_SERVER * self.cfg.servers.len() as u32 > self.per_sub {
            return Err(ClientError::Config(format!(
                "{} streams x window {} exceeds this client's context table",
                streams.len(),
                self.cfg.window
            )));
        }
        let flights = vec![Flight::default(); streams.len() * self.cfg.window as usize];
        // Failover needs another server to move to and a window the report's
        // per-stream bitmap covers.
        let can_fail_over = self.cfg.failover
            && self.cfg.servers.len() > 1
            && self.cfg.servers.len() <= 64
            && self.cfg.window <= 32
            && !self.rails.in_order_sends();
        if self.cfg.failover && self.cfg.servers.len() > 1 && !can_fail_over && self.subs.is_empty() {
            log::info!("failover is off for this client: {} completes sends in order", self.rails.provider());
        }
        let stage = match can_fail_over {
            true => Some(Stage::new(streams.len(), self.cfg.window as usize, chunk_elems * dtype.size(), &mut self.rails)?),
            false => None,
        };
        let relay = match spec.relay {
            true => Some(Stage::new(streams.len(), self.cfg.window as usize, wire::RELAY_MAX, &mut self.rails)?),
            false => None,
        };
        let per_server = streams.len().div_ceil(self.cfg.servers.len()) * self.cfg.window as usize;
        let pacing = (0..self.cfg.servers.len()).map(|_| Pacing { in_flight: 0, waiting: VecDeque::with_capacity(per_server) }).collect();
        let gens = Vec::new();
        self.subs.push(SubJob {
            dtype,
            op,
            chunk_elems,
            streams,
            flights,
            controls,
            leave,
            gens,
            latency_max,
            scratch: GenScratch::default(),
            started: 0,
            retiring: false,
            pacing,
            stage,
            relay,
            split,
            split_max,
            fo: Fo::default(),
            live: Liveness::default(),
        });
        Ok(self.subs.len() - 1)
    }

    /// Reads a server's answer to `hello` on `s`. A server that is busy
    /// (too many connections in their handshake, as in a join storm) says
    /// so at once: join again after a jittered backoff, until the join
    /// deadline; so does one whose connection broke before it answered, if
    /// `rejoin_broken` (a server restarting under a job's start). `limit`
    /// bounds the whole wait from `join_started`. Ok(Err(reject)): the server
    /// refused the job.
    /// Every server's answer to this rank's Hello, waited for side by side
    /// (see [`join_wait`]): a refusal, or a server that accepted and has
    /// since ended the job, fails the join at once instead of after the
    /// slowest server's answer. (A draining server's refusal is an answer:
    /// the job runs on the others.)
    #[allow(clippy::type_complexity)]
    fn collect_answers(
        &self,
        controls: &mut [Option<TcpStream>],
        hellos: &[Hello],
        join_started: Instant,
    ) -> Result<Vec<Option<Result<Granted, Box<Reject>>>>, ClientError> {
        let n = controls.len();
        let mut answers: Vec<Option<Result<Granted, Box<Reject>>>> = (0..n).map(|_| None).collect();
        loop {
            let pending: Vec<bool> = (0..n).map(|si| answers[si].is_none() && controls[si].is_some()).collect();
            if !pending.contains(&true) {
                return Ok(answers);
            }
            let waiting_on: Vec<Option<&TcpStream>> =
                controls.iter().zip(&pending).map(|(c, &p)| if p { c.as_ref() } else { None }).collect();
            let ready = join_wait::readable(&waiting_on, join_wait::TURN_MS);
            for si in (0..n).filter(|&si| ready[si]) {
                let (server, s) = (&self.cfg.servers[si], controls[si].as_mut().expect("pending servers have a connection"));
                let a = self.answer(server, s, &hellos[si], join_started, self.cfg.join_timeout, true)?;
                if let Err(r) = &a {
                    if r.code() != Some(RejectCode::Draining) {
                        return Err(ClientError::Refused { server: server.clone(), reject: r.to_string() });
                    }
                }
                answers[si] = Some(a);
            }
            for si in (0..n).filter(|&si| matches!(answers[si], Some(Ok(_)))) {
                if let Some(why) = controls[si].as_mut().and_then(join_wait::ended_meanwhile) {
                    return Err(ClientError::Refused {
                        server: self.cfg.servers[si].clone(),
                        reject: format!("{why} (while this rank waited for the other servers' answers to its join)"),
                    });
                }
            }
            if join_started.elapsed() > self.cfg.join_timeout + Duration::from_secs(5) {
                let late: Vec<&str> = (0..n).filter(|&si| pending[si]).map(|si| self.cfg.servers[si].as_str()).collect();
                return Err(ClientError::Timeout(format!(
                    "no answer to the join from {} within {:?}",
                    late.join(", "),
                    self.cfg.join_timeout
                )));
            }
        }
    }

    fn answer(
        &self,
        server: &str,
        s: &mut TcpStream,
        hello: &Hello,
        join_started: Instant,
        limit: Duration,
        rejoin_broken: bool,
    ) -> Result<Result<Granted, Box<Reject>>, ClientError> {
        let _ = s.set_read_timeout(Some(limit + Duration::from_secs(5)));
        let mut tries = 0u32;
        loop {
            match read_answer(s) {
                Ok(a) => return Ok(Ok(a)),
                Err(Answer::Rejected(r)) if r.code() == Some(RejectCode::Busy) => {
                    let waited = join_started.elapsed();
                    if waited >= limit {
                        return Err(ClientError::Refused {
                            server: server.to_string(),
                            reject: format!(
                                "{r} (retried {tries} times for {:.1} s, until the join deadline of {:.0} s)",
                                waited.as_secs_f64(),
                                limit.as_secs_f64()
                            ),
                        });
                    }
                    tries += 1;
                    let pause = join_backoff(tries, self.cfg.rank).min(limit - waited);
                    log::debug!("server {server} is busy ({r}); joining again in {pause:?} (try {tries})");
                    std::thread::sleep(pause);
                    *s = hello_again(server, hello, limit.saturating_sub(join_started.elapsed()))?;
                    let _ = s.set_read_timeout(Some(limit + Duration::from_secs(5)));
                }
                Err(Answer::Rejected(r)) => return Ok(Err(r)),
                // The connection broke before the answer (the server died or
                // restarts): join again, as after `busy`, until the deadline.
                // Every rank of the job then meets the server's next life.
                Err(Answer::Io(e)) if rejoin_broken && join_started.elapsed() + Duration::from_millis(100) < limit => {
                    tries += 1;
                    let pause = join_backoff(tries, self.cfg.rank).min(limit.saturating_sub(join_started.elapsed()));
                    log::info!("server {server}: the join broke off ({e}); joining again in {pause:?}");
                    std::thread::sleep(pause);
                    *s = hello_again(server, hello, limit.saturating_sub(join_started.elapsed()))?;
                    let _ = s.set_read_timeout(Some(limit + Duration::from_secs(5)));
                }
                Err(Answer::Io(e)) => return Err(ClientError::Connect { server: server.to_string(), error: e }),
            }
        }
    }

    /// Starts an all-reduce of `count` elements from `send` into `recv`
    /// (which may be the same buffer).
    ///
    /// # Safety
    /// Both buffers must hold `count` elements of `dtype` and stay valid,
    /// and `recv` unread and unwritten by anyone else, until [`Client::test`]
    /// reports the request done (or the client is dropped).
    pub unsafe fn start(
        &mut self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Request, ClientError> {
        if self.ops.len() >= MAX_OPS {
            return Err(ClientError::BadArgument(format!("more than {MAX_OPS} all-reduces in flight")));
        }
        if count > 0 && (send.is_null() || recv.is_null()) {
            return Err(ClientError::BadArgument("null buffer".into()));
        }
        let bytes = count.checked_mul(dtype.size()).ok_or_else(|| ClientError::BadArgument("count overflows".into()))?;
        let sub = self.join(dtype, op)?;
        let (mh_send, mh_recv) = if self.rails.needs_local_mr() && bytes > 0 {
            (Some(self.registration(send as *mut u8, bytes)?), Some(self.registration(recv, bytes)?))
        } else {
            (None, None)
        };
        let id = self.next_op;
        self.next_op += 1;
        // Every operation counts, empty ones too: every rank numbers them alike.
        let index = self.subs[sub].started;
        self.subs[sub].started += 1;
        if bytes == 0 {
            // Nothing to move: complete at once (never queued, so `test`
            // finds it done).
            return self.after_start(sub, id);
        }
        let next = self.spare_next.pop().unwrap_or_default();
        self.ops.push_back(Op {
            id,
            sub,
            index,
            planned: false,
            gen: 0,
            send,
            recv,
            bytes,
            chunk_bytes: 0,
            chunks: 0,
            first: 0,
            next,
            posted: 0,
            done: 0,
            mh_send,
            mh_recv,
            started: Instant::now(),
        });
        self.last_progress = Instant::now();
        if !self.subs[sub].holding() {
            let oi = self.ops.len() - 1;
            if let Err(e) = self.plan(oi) {
                self.failed = true;
                return Err(e);
            }
        }
        if let Err(e) = self.pump() {
            self.failed = true;
            return Err(e);
        }
        self.after_start(sub, id)
    }

    fn after_start(&mut self, sub: usize, id: u64) -> Result<Request, ClientError> {
        if self.subs[sub].retiring {
            if let Err(e) = self.retire(sub) {
                self.failed = true;
                return Err(e);
            }
        }
        Ok(Request(id))
    }

    /// Cuts operation `oi` over its stream set: chunk size, chunk count,
    /// first stream, per-stream cursors. Operations of a sub-job are cut in
    /// index order, the same on every rank.
    fn plan(&mut self, oi: usize) -> Result<(), ClientError> {
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
        if self.subs[sub].fo.round.as_ref().is_some_and(|r| index < r.switch_op) {
            // Cut over the old set, which still has the lost servers: their
            // chunks go to the recovery instead.
            self.redo_cut(oi)?;
        }
        Ok(())
    }

    /// Registration cache for providers that want local buffers registered (EFA).
    fn registration(&mut self, p: *mut u8, len: usize) -> Result<MemoryHandle, ClientError> {
        let a = p as usize;
        if let Some(&(_, _, mh)) = self.registrations.iter().find(|(s, l, _)| *s <= a && a + len <= s + l) {
            return Ok(mh);
        }
        // SAFETY: the caller of `start` keeps the buffer valid while the
        // operation runs; the registration is dropped with the endpoint, and
        // a later buffer at the same address is re-registered only if it is
        // larger (cache entries cover the exact ranges registered).
        let mh = unsafe { self.rails.register(p, len) }.map_err(|e| ClientError::Fabric(e.to_string()))?;
        if self.registrations.len() >= 64 {
            let (_, _, old) = self.registrations.remove(0);
            let _ = self.rails.deregister(old);
        }
        self.registrations.push((a, len, mh));
        Ok(mh)
    }

    /// Drives every queued all-reduce; true once `req` is complete.
    pub fn test(&mut self, req: Request) -> Result<bool, ClientError> {
        let r = self.drive(req);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn drive(&mut self, req: Request) -> Result<bool, ClientError> {
        self.pump()?;
        self.poll()?;
        self.pump()?;
        let done = !self.ops.iter().any(|o| o.id == req.0);
        // The clock is read only on the empty polls that also check the
        // control connections (see `poll`), not on every call.
        if !done && self.idle_polls.is_multiple_of(IDLE_CHECK_EVERY) && self.last_progress.elapsed() > self.cfg.timeout {
            return Err(ClientError::Timeout(format!("all-reduce made no progress for {:?}", self.cfg.timeout)));
        }
        Ok(done)
    }

    /// Blocking all-reduce from `send` into `recv` (same length, whole elements).
    pub fn allreduce(&mut self, send: &[u8], recv: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<(), ClientError> {
        if send.len() != recv.len() || !send.len().is_multiple_of(dtype.size()) {
            return Err(ClientError::BadArgument(format!("buffers of {} and {} bytes for {dtype}", send.len(), recv.len())));
        }
        // SAFETY: both slices outlive this call, which returns only once the
        // request completed, failed (the endpoint is then unusable for the
        // request's buffers: see below) or timed out.
        let req = unsafe { self.start(send.as_ptr(), recv.as_mut_ptr(), send.len() / dtype.size(), dtype, op)? };
        self.wait(req)
    }

    /// Blocking in-place all-reduce.
    pub fn allreduce_in_place(&mut self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<(), ClientError> {
        if !buf.len().is_multiple_of(dtype.size()) {
            return Err(ClientError::BadArgument(format!("{} bytes is not whole {dtype} elements", buf.len())));
        }
        let p = buf.as_mut_ptr();
        // SAFETY: as in `allreduce`; in place is allowed by `start`.
        let req = unsafe { self.start(p, p, buf.len() / dtype.size(), dtype, op)? };
        self.wait(req)
    }

    fn wait(&mut self, req: Request) -> Result<(), ClientError> {
        let mut empty = 0u32;
        loop {
            let before = self.last_progress;
            match self.test(req) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    // The request's buffers may still be targets of posted
                    // receives: cancel everything before returning them.
                    self.abort();
                    return Err(e);
                }
            }
            if self.last_progress == before {
                empty += 1;
                if empty >= self.cfg.spin_polls {
                    let _ = self.rails.wait(self.cfg.sleep_ms.min(i32::MAX as u32) as i32);
                    empty = 0;
                }
            } else {
                empty = 0;
            }
        }
    }

    /// Cancels every operation and forgets every queued all-reduce. The
    /// rank no longer counts as finishing cleanly.
    pub fn abort(&mut self) {
        self.failed = true;
        self.rails.cancel_all();
        self.ops.clear();
        self.retry.clear();
        for s in &mut self.subs {
            for st in &mut s.streams {
                st.head_seq = st.next_seq;
                st.head_slot = st.next_slot;
            }
            s.flights.iter_mut().for_each(|f| *f = Flight::default());
            for p in &mut s.pacing {
                p.in_flight = 0;
                p.waiting.clear();
            }
        }
    }

    /// Posts chunks while streams have room.
    fn pump(&mut self) -> Result<(), ClientError> {
        if !self.retry.is_empty() {
            let pending = std::mem::take(&mut self.retry);
            for ctx in &pending {
                self.post(*ctx)?;
            }
        }
        let window = self.cfg.window;
        for oi in 0..self.ops.len() {
            if self.ops[oi].posted == self.ops[oi].chunks || !self.ops[oi].planned {
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
                    if op.next[st] >= op.chunks || stream.next_seq.wrapping_sub(stream.head_seq) >= window {
                        continue;
                    }
                    if self.subs[sub].lost_stream(st) {
                        // Its server is gone: the recovery redoes these chunks.
                        continue;
                    }
                    // Earlier ops on the same sub-job must have posted all of
                    // this stream's chunks first, to keep sequence order.
                    if self.ops.iter().take(oi).any(|o| o.sub == sub && o.planned && o.next.get(st).is_some_and(|&n| n < o.chunks)) {
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
                    let relayed =
                        self.subs[sub].relay.is_some() && op.chunk_bytes.min(op.bytes - chunk * op.chunk_bytes) <= wire::RELAY_MAX;
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
    fn issue_send(&mut self, ctx: u32) -> Result<(), ClientError> {
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
    fn release_send_credit(&mut self, sub: usize, server: usize) -> Result<(), ClientError> {
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
    fn post(&mut self, ctx: u32) -> Result<(), ClientError> {
        let (sub, local) = ((ctx / self.per_sub) as usize, ctx % self.per_sub);
        if local >= self.redo_base() {
            return self.post_redo(sub, local - self.redo_base());
        }
        let (fi, is_send) = ((local >> 1) as usize, local & 1 == 1);
        let window = self.cfg.window as usize;
        let s = &self.subs[sub];
        let (st, slot) = (fi / window, fi % window);
        let f = s.flights[fi];
        let Some(op) = self.ops.iter().find(|o| o.id == f.op) else { return Ok(()) };
        let stream = &s.streams[st];
        let rail = self.rails.rail_of(stream.server);
        let (chunk, seq) = (f.chunk, f.seq);
        let off = chunk * op.chunk_bytes;
        let len = op.chunk_bytes.min(op.bytes - off);
        let tag = Tag::new(stream.job_tag, stream.slot_base + slot as u16, seq).0;
        if is_send && len <= self.rails.inject_size() && self.cfg.send_credits == 0 {
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
        } else if let Some(stage) = &s.stage {
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

    fn poll(&mut self) -> Result<(), ClientError> {
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
                continue;
            }
            if let Some((fsi, from)) = self.cfg.fault_drop_results {
                let f = self.subs[sub].flights[fi];
                let index = self.ops.iter().find(|o| o.id == f.op).map_or(0, |o| o.index);
                if c.is_recv && self.subs[sub].streams[fi / window].server == fsi && index >= from {
                    continue;
                }
            }
            if !c.is_recv {
                let server = self.subs[sub].streams[fi / window].server;
                self.release_send_credit(sub, server)?;
            }
            let f = &mut self.subs[sub].flights[fi];
            if c.is_recv {
                f.recv_done = true;
                f.got = c.len as u32;
            } else {
                f.send_done = true;
            }
            if f.send_done && f.recv_done && f.relayed {
                // Only now: reducing in place overwrites this rank's piece,
                // which a send not yet completed may still be reading.
                let flight = *f;
                self.reduce_relayed(sub, fi / window, flight)?;
            }
            let s = &mut self.subs[sub];
            let f = &mut s.flights[fi];
            if f.send_done && f.recv_done {
                let op_id = f.op;
                let (chunk, seq) = (f.chunk, f.seq);
                *f = Flight::default();
                let st = fi / window;
                let stream = &mut s.streams[st];
                while stream.head_seq != stream.next_seq && s.flights[st * window + stream.head_slot as usize].op == 0 {
                    stream.head_seq = stream.head_seq.wrapping_add(1);
                    stream.head_slot = (stream.head_slot + 1) % window as u32;
                }
                if let Some(pos) = self.ops.iter().position(|o| o.id == op_id) {
                    if s.stage.is_some() {
                        // One search for the operation serves both.
                        failover::land(s, &self.ops[pos], st, seq, chunk, self.ops[pos].rail_copies(&self.rails));
                    }
                    self.ops[pos].done += 1;
                    if self.ops[pos].done == self.ops[pos].chunks {
                        if let Some(op) = self.ops.remove(pos) {
                            self.note_if_slow(&op);
                            self.spare_next.push(op.next);
                            if self.subs[op.sub].retiring {
                                self.retire(op.sub)?;
                            }
                        }
                    }
                }
            }
        }
        if self.busy_polls.is_multiple_of(BUSY_CHECK_EVERY) {
            return self.check_controls();
        }
        Ok(())
    }

    /// A relayed flight (of stream `st`) has the other rank's piece and sent its own:
    /// reduces the two, in rank order, into where the result goes (the
    /// staging slot, or the caller's buffer).
    fn reduce_relayed(&mut self, sub: usize, st: usize, f: Flight) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        let Some(op) = self.ops.iter().find(|o| o.id == f.op) else { return Ok(()) };
        let Some(relay) = s.relay.as_ref() else { return Ok(()) };
        let off = f.chunk * op.chunk_bytes;
        let len = op.chunk_bytes.min(op.bytes - off);
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
    fn note_if_slow(&self, op: &Op) {
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

    /// A server that ended the job, or drains, says so on the control
    /// connection; a rail stuck in a provider call is an error here.
    fn check_controls(&mut self) -> Result<(), ClientError> {
        if let Some(w) = self.watchdog.as_ref() {
            if let Some(report) = w.stuck() {
                let stuck = w.stuck_rails();
                (0..self.rails.count()).filter(|r| stuck & (1 << r) != 0).for_each(|r| self.rails.abandon(r));
                return Err(ClientError::Fabric(report));
            }
        }
        for sub in 0..self.subs.len() {
            if self.subs[sub].fo.watcher.is_some() {
                self.poll_rejoins(sub)?;
            }
            for si in 0..self.subs[sub].controls.len() {
                while let Some(msg) = self.read_control(sub, si)? {
                    let now = Instant::now();
                    match &msg {
                        Control::Alive => self.subs[sub].live.alive(si, now),
                        Control::Gone(_) => {}
                        _ => self.subs[sub].live.heard(si, now),
                    }
                    match msg {
                        Control::Alive => {}
                        Control::Drain => self.on_drain(sub, si)?,
                        Control::SwitchAt(k) => self.on_switch(sub, si, k)?,
                        Control::Gone(why) => self.lose(sub, 1u64 << si, &why)?,
                        Control::Failover(dead) => self.lose(sub, dead, "the recovery's leader says so")?,
                        Control::Recover { dead, switch_op, reports } => {
                            self.subs[sub].fo.verdict = Some((dead, switch_op, reports));
                        }
                    }
                }
                self.check_liveness(sub, si)?;
            }
        }
        // Recoveries join redo jobs, a blocking collective: every rank takes
        // its sub-jobs' verdicts in sub-job order, or two ranks could each
        // wait in a different sub-job's join for the other.
        for sub in 0..self.subs.len() {
            if let Some((dead, switch_op, reports)) = self.subs[sub].fo.verdict.take() {
                self.recover(sub, dead, switch_op, reports)?;
            } else if self.subs[sub].fo.recovering {
                break;
            }
        }
        Ok(())
    }

    /// Server `si` of sub-job `sub`, armed, silent past the liveness time
    /// (everything it sent has just been read): lost, as if its connection
    /// had closed. Only for jobs that can fail over (see [`liveness`]).
    fn check_liveness(&mut self, sub: usize, si: usize) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        if self.cfg.liveness.is_zero() || s.stage.is_none() || s.controls[si].is_none() || s.fo.dead & (1u64 << si) != 0 {
            return Ok(());
        }
        let Some(silent) = s.live.overdue(si, self.cfg.liveness, Instant::now()) else { return Ok(()) };
        self.subs[sub].live.disarm(si);
        let why = format!(
            "no heartbeat for {:.1} s (liveness {:.1} s, TALLY_LIVENESS_MS): frozen, hung or cut off",
            silent.as_secs_f64(),
            self.cfg.liveness.as_secs_f64()
        );
        self.lose(sub, 1u64 << si, &why)
    }

    /// Whether this client asks its servers for heartbeats: only jobs that
    /// can fail over act on them (a server older than heartbeats refuses
    /// the flag, so single-server jobs do not send it).
    fn wants_heartbeats(&self) -> bool {
        !self.cfg.liveness.is_zero() && self.cfg.failover && self.cfg.servers.len() > 1
    }

    /// The next whole message on a control connection, if one has arrived
    /// (peeked first: a message is taken only once all of it is there).
    fn read_control(&mut self, sub: usize, si: usize) -> Result<Option<Control>, ClientError> {
        let server = || self.cfg.servers[si].clone();
        let can_fail_over = self.subs[sub].stage.is_some();
        let Some(c) = self.subs[sub].controls[si].as_mut() else { return Ok(None) };
        let mut b = [0u8; core::mem::size_of::<Reject>()];
        let n = match c.peek(&mut b) {
            Ok(0) if can_fail_over => return Ok(Some(Control::Gone("it closed the job's connection".into()))),
            Ok(0) => return Err(ClientError::Refused { server: server(), reject: "the server closed the job's connection".into() }),
            Ok(n) => n,
            Err(e) if can_fail_over && e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::Interrupted => {
                return Ok(Some(Control::Gone(format!("its control connection failed: {e}"))));
            }
            Err(_) => return Ok(None),
        };
        if n < core::mem::size_of::<wire::Header>() {
            return Ok(None);
        }
        let bad = |e: String| ClientError::Fabric(format!("control message from {}: {e}", self.cfg.servers[si]));
        let kind = wire::read::<wire::Header>(&b).and_then(|h| h.check()).map_err(|e| bad(e.to_string()))?;
        let need = kind.server_message_bytes().ok_or_else(|| bad(format!("unexpected {kind:?}")))?;
        if n < need {
            return Ok(None);
        }
        c.read_exact(&mut b[..need]).map_err(|e| bad(e.to_string()))?;
        match kind {
            Kind::Alive => Ok(Some(Control::Alive)),
            Kind::Drain => {
                wire::read::<Drain>(&b).and_then(|d| d.check()).map_err(|e| bad(e.to_string()))?;
                Ok(Some(Control::Drain))
            }
            Kind::SwitchAt => {
                let k = wire::read::<SwitchAt>(&b).and_then(|m| m.check()).map_err(|e| bad(e.to_string()))?;
                Ok(Some(Control::SwitchAt(k)))
            }
            Kind::Failover => {
                let dead = wire::read::<wire::Failover>(&b).and_then(|m| m.check()).map_err(|e| bad(e.to_string()))?;
                Ok(Some(Control::Failover(dead)))
            }
            Kind::Recover => {
                let m = wire::read::<wire::Recover>(&b).map_err(|e| bad(e.to_string()))?;
                m.check().map_err(|e| bad(e.to_string()))?;
                // The reports follow at once; read them whole (blocking, bounded).
                let mut reports = vec![0u8; m.nranks as usize * m.report_len as usize];
                let c = self.subs[sub].controls[si].as_mut().expect("checked above");
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(self.cfg.timeout));
                let r = c.read_exact(&mut reports);
                let _ = c.set_nonblocking(true);
                r.map_err(|e| bad(format!("recovery reports: {e}")))?;
                Ok(Some(Control::Recover { dead: m.dead, switch_op: m.switch_op, reports }))
            }
            _ => {
                let r: Reject = wire::read(&b).map_err(|e| bad(e.to_string()))?;
                if can_fail_over {
                    // The job may live on elsewhere: the server is lost to it.
                    return Ok(Some(Control::Gone(format!("it ended the job: {r}"))));
                }
                Err(ClientError::Refused { server: server(), reject: r.to_string() })
            }
        }
    }

    /// Index of the sub-job's first operation not yet cut into chunks.
    fn first_uncut(&self, sub: usize) -> u64 {
        self.ops.iter().filter(|o| o.sub == sub && !o.planned).map(|o| o.index).min().unwrap_or(self.subs[sub].started)
    }

    /// Server `si` drains: answer where this rank can switch, and hold
    /// operations uncut until the server names the switch.
    fn on_drain(&mut self, sub: usize, si: usize) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        if s.leave[si] != Leave::Serving {
            return Ok(());
        }
        // Only a server that does not drain itself can take the shards over.
        let elsewhere = (0..s.leave.len()).any(|o| o != si && s.leave[o] == Leave::Serving);
        let next_op = if elsewhere { self.first_uncut(sub) } else { Boundary::STAY };
        let server = &self.cfg.servers[si];
        if elsewhere {
            log::info!(
                "server {server} drains: moving its shards of job {:#x} to the other servers at an operation boundary",
                self.job_id_of(sub)
            );
        } else {
            log::info!("server {server} drains, but job {:#x} has no other server: it stays there", self.job_id_of(sub));
        }
        self.send_control(sub, si, bytemuck::bytes_of(&Boundary::new(next_op)))?;
        self.subs[sub].leave[si] = if elsewhere { Leave::Awaiting { next_op } } else { Leave::Stays };
        Ok(())
    }

    /// The draining server `si` names the switch operation `k`.
    fn on_switch(&mut self, sub: usize, si: usize, k: u64) -> Result<(), ClientError> {
        let server = self.cfg.servers[si].clone();
        match self.subs[sub].leave[si] {
            Leave::Awaiting { next_op } if k != Boundary::STAY && k < next_op => {
                return Err(ClientError::Refused {
                    server,
                    reject: format!("switch at operation {k}, before this rank's boundary {next_op}"),
                });
            }
            Leave::Awaiting { .. } | Leave::Stays => {}
            other => return Err(ClientError::Refused { server, reject: format!("unexpected switch while {other:?}") }),
        }
        if k == Boundary::STAY {
            log::info!("server {server} drains; job {:#x} stays on it (a rank has no other server)", self.job_id_of(sub));
            self.subs[sub].leave[si] = Leave::Stays;
        } else {
            log::info!(
                "server {server} draining: moving its shards of job {:#x} to the other servers from operation {k}",
                self.job_id_of(sub)
            );
            self.subs[sub].leave[si] = Leave::At(k);
            self.subs[sub].retiring = true;
        }
        if !self.subs[sub].holding() {
            for oi in 0..self.ops.len() {
                if self.ops[oi].sub == sub && !self.ops[oi].planned {
                    self.plan(oi)?;
                }
            }
        }
        self.retire(sub)?;
        self.pump()
    }

    /// Says Bye to (and closes) each server the sub-job left whose last
    /// operation on this rank completed.
    fn retire(&mut self, sub: usize) -> Result<(), ClientError> {
        let mut still = false;
        for si in 0..self.subs[sub].leave.len() {
            let Leave::At(k) = self.subs[sub].leave[si] else { continue };
            if self.subs[sub].controls[si].is_none() {
                continue;
            }
            if self.subs[sub].started < k || self.ops.iter().any(|o| o.sub == sub && o.index < k) {
                still = true;
                continue;
            }
            // Failing to say it is not this rank's problem: the server then
            // fails the job on itself, which no longer matters to anyone.
            let _ = self.send_control(sub, si, bytemuck::bytes_of(&wire::Header::new(Kind::Bye)));
            self.subs[sub].controls[si] = None;
            log::debug!("left server {} (job {:#x}) after operation {}", self.cfg.servers[si], self.job_id_of(sub), k.saturating_sub(1));
        }
        self.subs[sub].retiring = still;
        Ok(())
    }

    /// Writes a whole small message on a (non-blocking) control connection.
    fn send_control(&mut self, sub: usize, si: usize, bytes: &[u8]) -> Result<(), ClientError> {
        let Some(c) = self.subs[sub].controls[si].as_mut() else { return Ok(()) };
        let _ = c.set_nonblocking(false);
        let r = c.write_all(bytes);
        let _ = c.set_nonblocking(true);
        r.map_err(|e| ClientError::Connect { server: self.cfg.servers[si].clone(), error: e.to_string() })
    }

    fn job_id_of(&self, sub: usize) -> u64 {
        let s = &self.subs[sub];
        if sub == 0 {
            self.cfg.job_id
        } else {
            self.cfg.job_id ^ (((s.dtype as u64) << 56) | ((s.op as u64) << 48) | 0x5a5a_0000_0000)
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Nothing queued: this rank is done, say so (the job ends when every
        // rank said bye). Otherwise just close: the servers fail the job and
        // the other ranks hear of it at once. Canceling first means no
        // receive still targets a caller's buffer.
        let clean = self.ops.is_empty() && !self.failed;
        self.rails.cancel_all();
        if clean {
            let bye = wire::Header::new(Kind::Bye);
            for s in &mut self.subs {
                for c in s.controls.iter_mut().flatten() {
                    let _ = c.set_nonblocking(false);
                    let _ = c.write_all(bytemuck::bytes_of(&bye));
                }
            }
        }
    }
}

/// The pause before join attempt `tries` + 1 after a `busy` answer: 50 ms
/// doubling to 2 s, each drawn between half and all of that (ranks that
/// were turned away together do not come back together).
fn join_backoff(tries: u32, rank: u32) -> Duration {
    let cap_ms = (50u64 << tries.min(6)).min(2000);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64);
    let mut x = nanos ^ (u64::from(rank) << 32) ^ u64::from(tries).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    Duration::from_millis(cap_ms / 2 + x % (cap_ms / 2 + 1))
}

/// TCP keepalive on a job's control connection, probing after 2 s idle,
/// every second, 3 times: a server whose host went away or whose link is
/// down is noticed in about 5 s (the connection fails, and failover takes
/// over), where TCP alone would wait for minutes. A SIGKILLed server's
/// kernel closes the connection at once; this is for hosts that vanish.
/// (Heartbeats, see [`liveness`], notice that in 2 s where the server sends
/// them.) Set once the server accepted the job, not while the join waits:
/// a link down for a few seconds while a job starts must not break a join
/// that the server may have admitted already (the other ranks would run a
/// job this rank can no longer enter); the join deadline bounds that wait.
pub(crate) fn keepalive(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = s.as_raw_fd();
    for (level, name, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 2),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ] {
        let v: libc::c_int = value;
        // SAFETY: fd is an open socket owned by `s`; v is a c_int whose size is passed.
        unsafe {
            libc::setsockopt(fd, level, name, (&v as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t)
        };
    }
}

/// A control connection to `server` (retried until `timeout`) that has sent `hello`.
fn say_hello(server: &str, hello: &Hello, timeout: Duration) -> Result<TcpStream, ClientError> {
    let err = |e: String| ClientError::Connect { server: server.to_string(), error: e };
    let addr = server.to_socket_addrs().map_err(|e| err(e.to_string()))?.next().ok_or_else(|| err("no address".into()))?;
    let mut s = connect_retry(&addr, timeout).map_err(err)?;
    let _ = s.set_nodelay(true);
    s.write_all(bytemuck::bytes_of(hello)).map_err(|e| err(e.to_string()))?;
    Ok(s)
}

/// A new control connection to `server` with the same Hello.
fn hello_again(server: &str, hello: &Hello, timeout: Duration) -> Result<TcpStream, ClientError> {
    say_hello(server, hello, timeout.max(Duration::from_millis(100)))
}

fn connect_retry(addr: &std::net::SocketAddr, timeout: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(addr, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e.to_string()),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A server's message on a job's control connection, other than a reject.
enum Control {
    /// A heartbeat (see [`liveness`]).
    Alive,
    Drain,
    SwitchAt(u64),
    /// The server is gone (or ended the job there): fail over, if possible.
    Gone(String),
    /// The recovery's leader: ranks lost these servers.
    Failover(u64),
    /// The recovery's leader: every rank's report, and the switch operation.
    Recover {
        dead: u64,
        switch_op: u64,
        reports: Vec<u8>,
    },
}

enum Answer {
    Rejected(Box<Reject>),
    Io(String),
}

/// What a server's Accept grants a job.
pub(crate) struct Granted {
    pub tag: u16,
    /// The job's lcores' endpoint names (the job's shards, in order).
    pub names: Vec<EndpointName>,
    /// Elements per piece (0: as asked).
    pub piece_elems: u32,
    /// The first `.0` names take only operations of at most `.1` bytes
    /// (`Accept::latency_split`).
    pub latency: Option<(usize, usize)>,
}

/// An Accept's grant, or why not.
fn read_answer(s: &mut TcpStream) -> Result<Granted, Answer> {
    let io = |e: std::io::Error| Answer::Io(e.to_string());
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr).map_err(io)?;
    let h: wire::Header = wire::read(&hdr).map_err(|e| Answer::Io(e.to_string()))?;
    match h.check().map_err(|e| Answer::Io(e.to_string()))? {
        Kind::Reject => {
            let mut b = [0u8; core::mem::size_of::<Reject>()];
            b[..8].copy_from_slice(&hdr);
            s.read_exact(&mut b[8..]).map_err(io)?;
            let r: Reject = wire::read(&b).map_err(|e| Answer::Io(e.to_string()))?;
            Err(Answer::Rejected(Box::new(r)))
        }
        Kind::Accept => {
            let mut b = [0u8; core::mem::size_of::<Accept>()];
            b[..8].copy_from_slice(&hdr);
            s.read_exact(&mut b[8..]).map_err(io)?;
            let a: Accept = wire::read(&b).map_err(|e| Answer::Io(e.to_string()))?;
            if a.lcores == 0 || a.lcores > 4096 {
                return Err(Answer::Io(format!("accept names {} lcores", a.lcores)));
            }
            let mut names = Vec::new();
            for _ in 0..a.lcores {
                let mut r = [0u8; core::mem::size_of::<NameRecord>()];
                s.read_exact(&mut r).map_err(io)?;
                let rec: NameRecord = wire::read(&r).map_err(|e| Answer::Io(e.to_string()))?;
                let n = rec.name().map_err(|e| Answer::Io(e.to_string()))?;
                names.push(EndpointName::from_bytes(n).ok_or_else(|| Answer::Io("bad name".into()))?);
            }
            Ok(Granted { tag: a.job_tag, names, piece_elems: a.piece_elems, latency: a.latency_split() })
        }
        k => Err(Answer::Io(format!("unexpected {k:?} from the server"))),
    }
}

#[cfg(test)]
mod tests {
    use super::{op_chunk_bytes, MIN_SPREAD_PIECE};
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
