//! The client side of agg all-reduce: what a GPU worker (or the NCCL plugin)
//! runs to use tally servers.
//!
//! A [`Client`] connects to one or more servers for one job. An all-reduce
//! of `count` elements is cut into chunks of at most `chunk_elems` elements;
//! chunk `c` goes to stream `(first + c) mod S`, where the S streams are every
//! (server, lcore) pair the job uses, so each lcore gets its shard straight
//! from the client (no dispatcher on the server). They are in server-major
//! order (server 0's lcores, then server 1's), or with
//! [`ClientConfig::interleave`] lcore-major (lcore 0 of every server, then
//! lcore 1), where an all-reduce of fewer chunks than streams reaches every
//! server and rail rather than the first server's lcores. `first`, the stream of
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
//! Pacing (progress.rs) and drains (control.rs) are described where they
//! live.
//!
//! Operations are asynchronous underneath ([`Client::start`] and
//! [`Client::test`], the form the NCCL plugin uses); [`Client::allreduce`]
//! is the blocking convenience.
use crate::dataplane::fabric::{select_provider, Completion, Endpoint, EndpointConfig, Hints, MemoryHandle};
use crate::reduce::{DataType, Kernels, ReduceOp};
use crate::wire::{self, Kind, TOKEN_BYTES};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

mod config;
mod control;
mod error;
pub mod failover;
mod greet;
mod join;
mod join_wait;
pub mod liveness;
pub mod piece_times;
mod progress;
pub mod rails;
pub mod servers;
mod state;
pub mod watchdog;
pub use config::{auto_window, ClientConfig, DEFAULT_LIVENESS_MS};
pub use error::ClientError;
use rails::Rails;
use state::*;

/// Sibling jobs (one per dtype/op pair) a client may open.
pub const MAX_SUBJOBS: usize = 8;
/// Operations queued per client.
pub const MAX_OPS: usize = 64;
/// Empty polls between two checks of the control connections and the timeout.
const IDLE_CHECK_EVERY: u32 = 64;
/// Polls with completions between two checks of the control connections:
/// a rank that never sees an empty poll still hears of a drain.
const BUSY_CHECK_EVERY: u32 = 1024;

/// The smallest piece an all-reduce is cut into when it is spread over
/// streams: below this, a piece's fixed costs outweigh the parallelism.
pub const MIN_SPREAD_PIECE: usize = 4096;

/// The largest `min_piece` (TALLY_MIN_PIECE) a client takes; the servers
/// refuse a Hello above it alike. [`op_chunk_bytes`] never cuts past the
/// job's chunk, so a minimum above every chunk a server grants (at most its
/// `max_chunk`, 1 MiB by default, within its slab per lcore) means "never
/// spread" and nothing more; 1 GiB is past any of them. The bound keeps the
/// rounding up to a multiple of `min_piece` far from overflow (a wrapped
/// share would cut an all-reduce into single elements) and the value within
/// the Hello's u32.
pub const MAX_MIN_PIECE: usize = wire::MAX_MIN_PIECE as usize;

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
    /// Something may have made a chunk postable since `pump` last looked
    /// (an operation started or was cut, a flight finished, an operation
    /// completed, a drain, recovery or rejoin moved on): only then does
    /// `pump` walk the operations. Most calls of `test` find every window
    /// full, and NCCL's proxy thread calls `test` for each request it waits
    /// on: walking every waiting operation's streams each time was the
    /// proxy's top symbol (perf, CollNet at 32 Gbit/s).
    pump_due: bool,
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
    /// Per server, the IP addresses of its endpoints as its Accepts named
    /// them (tcp only): where a lost one's watcher looks for connections
    /// still backed off (`failover::Watcher`).
    server_ips: Vec<Vec<std::net::IpAddr>>,
    /// Every server's endpoint addresses together (tcp only), shared with
    /// the watchdog's chore that sets the floor of the TCP timers on this
    /// process's connections to them (`host::tcp_rto_min`).
    tcp_peers: Arc<Mutex<Vec<std::net::IpAddr>>>,
    /// Per server, a fingerprint of its endpoint names (`note_server_names`).
    server_names: Vec<u64>,
    /// Sampled pieces' round trips (`ClientConfig::piece_times`).
    piece_times: piece_times::PieceTimes,
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
    pub fn connect(mut cfg: ClientConfig) -> Result<Client, ClientError> {
        if cfg.window == 0 {
            cfg.window = config::auto_window(cfg.chunk_bytes);
        }
        cfg.check()?;
        // Resolved here, not in `check`: two spellings of one server are
        // found only by resolving them (IP literals resolve without DNS).
        servers::check_resolved(&cfg.servers).map_err(|e| ClientError::Config(e.to_string()))?;
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
            let copier = cfg.runs_copier(eps.len());
            Rails::threaded(eps, cfg.rail_spin_polls, cfg.sleep_ms, &cfg.rail_cores, ecfg.contexts as usize, cfg.piece_times, copier)
        }
        .map_err(|e| ClientError::Fabric(e.to_string()))?
        .serve(cfg.servers.len());
        if rails.count() > 1 {
            let how = if rails.count() <= cfg.servers.len() {
                format!("server i on rail i mod {}", rails.count())
            } else {
                format!("server i's lcores spread over rails i, i + {0}, ... (lcore k on its lane k mod lanes)", cfg.servers.len())
            };
            let copier = if rails.has_copier() { ", and a copier thread for staged results" } else { "" };
            log::info!("rank {}: {} rails (an endpoint and a thread each){copier}, {how}", cfg.rank, rails.count());
        }
        crate::dataplane::lcore::precise_naps();
        let tcp_peers = Arc::new(Mutex::new(Vec::new()));
        let watchdog = watchdog::Watchdog::start(
            format!("rank {}", cfg.rank),
            rails.provider(),
            rails.call_watches().to_vec(),
            match (rails.has_threads(), rails::calls_may_spin_forever(rails.provider())) {
                (true, _) => watchdog::OnStuck::Report,
                (false, true) => watchdog::OnStuck::Exit,
                (false, false) => watchdog::OnStuck::Log,
            },
            cfg.provider_watchdog,
            watchdog::rto_floor_chore(rails.provider(), cfg.tcp_rto_min_ms, &tcp_peers),
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
            pump_due: true,
            per_sub,
            registrations: Vec::new(),
            last_progress: Instant::now(),
            failed: false,
            stats: failover::FailoverStats::default(),
            server_ips: vec![Vec::new(); cfg.servers.len()],
            tcp_peers,
            server_names: vec![0; cfg.servers.len()],
            piece_times: piece_times::PieceTimes::default(),
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

    /// The settings this client runs with (its window resolved from auto).
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The sampled pieces' round trips and the copies of staged results so
    /// far, where `ClientConfig::piece_times` is on (else None).
    pub fn piece_times(&self) -> Option<piece_times::PieceReport> {
        self.cfg.piece_times.then(|| self.piece_times.report(self.rails.copy_times(), self.rails.copier_copies(), self.rails.busy_shares()))
    }

    /// [`Client::piece_times`], for a caller that logs it itself (the NCCL
    /// plugin, with its rank, through NCCL's logger): the client then does
    /// not log it when it closes.
    pub fn take_piece_times(&mut self) -> Option<piece_times::PieceReport> {
        let r = self.piece_times();
        self.cfg.piece_times = false;
        r
    }

    /// Streams (server, lcore pairs) of the first joined sub-job.
    pub fn streams(&self) -> usize {
        self.subs.first().map_or(0, |s| s.streams.len())
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
        if self.cfg.piece_times {
            self.piece_times.record_start(index);
        }
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
        self.pump_due = true;
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

    /// Blocks until `req` completes, driving every queued all-reduce (a
    /// caller keeping several in flight waits for the oldest), spinning
    /// `spin_polls` idle polls and then sleeping on the endpoints. On a
    /// failure it cancels every operation before it returns, so that no
    /// receive still targets a caller's buffer.
    pub fn wait(&mut self, req: Request) -> Result<(), ClientError> {
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
}

impl Drop for Client {
    fn drop(&mut self) {
        // Nothing queued: this rank is done, say so (the job ends when every
        // rank said bye). Otherwise just close: the servers fail the job and
        // the other ranks hear of it at once. Canceling first means no
        // receive still targets a caller's buffer.
        let clean = self.ops.is_empty() && !self.failed;
        if let Some(r) = self.piece_times() {
            log::info!("rank {}: {r}", self.cfg.rank);
        }
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

#[cfg(test)]
mod tests {
    use super::{auto_window, op_chunk_bytes, MIN_SPREAD_PIECE};

    #[test]
    fn the_auto_window_keeps_a_stream_within_a_mebibyte_but_two_chunks() {
        assert_eq!(auto_window(32 << 10), 4);
        assert_eq!(auto_window(256 << 10), 4);
        assert_eq!(auto_window(300 << 10), 3);
        assert_eq!(auto_window(512 << 10), 2);
        assert_eq!(auto_window(4 << 20), 2);
        assert_eq!(auto_window(0), 4);
    }

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
