//! Ring all-reduce over libfabric: the baseline every tally figure is held against.
//!
//! # What a ring all-reduce is
//!
//! n ranks each hold a buffer of S bytes and all want the elementwise
//! reduction (sum, max, ...) of all n buffers. Arrange the ranks in a ring,
//! each sending only to the next and receiving only from the previous, and
//! cut the buffer into n segments:
//!
//! 1. **reduce-scatter**, n-1 steps: at each step every rank sends one
//!    segment to the next rank, which combines it with its own copy of that
//!    segment and passes the partial result on at the next step. After n-1
//!    steps, segment k has collected all n contributions at rank k.
//! 2. **all-gather**, n-1 steps: the finished segments travel once more
//!    around the ring, each rank storing and forwarding, until every rank has
//!    every finished segment.
//!
//! Each rank sends (and receives) 2(n-1) segments of S/n bytes: 2(n-1)/n x S
//! per link, which no algorithm that combines on the ranks themselves can
//! beat (every byte of the result needs n-1 inputs from elsewhere and must
//! reach n-1 other ranks). This is the "bus bandwidth" factor of nccl-tests:
//! busbw = algbw x 2(n-1)/n. Reduction servers (the rest of tally) move S per
//! link instead; this ring is what they are compared with.
//!
//! # Pipelining
//!
//! Done step by step, a ring idles every link while a segment is reduced, and
//! a segment cannot leave before it has fully arrived. So each segment is cut
//! into chunks of at most `chunk_bytes`, and a chunk is forwarded as soon as
//! it has arrived and been combined, while later chunks are still on the
//! wire: up to `window` chunks are in flight in each direction.
//!
//! Every message is named by its step t (0..2(n-1)) and its chunk position c
//! within the segment. Rank r sends segment (r-t-1) mod n at step t and
//! receives segment (r-t-2) mod n, so the chunk it receives at step t is the
//! chunk it sends at step t+1: reduce-scatter and all-gather are one stream.
//! Messages are ordered in *blocks* of `window` chunk positions, step-major
//! within a block: (block 0: step 0 chunks 0..W, step 1 chunks 0..W, ...),
//! then block 1. Receives and sends are posted in that order, each rank
//! holding at most W receives and W sends in flight and 2W staging slots.
//! With that order the forward of received message k is sent message k+W,
//! and every wait (for a free slot, a free send, an arrived chunk) is on a
//! message with a smaller index, so the ring cannot deadlock even when the
//! provider sends large messages by rendezvous (a send finishes only once
//! the receiver has posted a receive for it). A whole-step-first order would
//! need a slot for every chunk of a segment to avoid that deadlock.
//!
//! # Memory
//!
//! Received reduce-scatter chunks land in staging slots, registered once at
//! [`Ring::new`]; the rank's own contribution is combined into the slot
//! (the accumulate form of the kernels), which is then forwarded from the
//! slot. The last reduce-scatter step combines straight into the result
//! buffer; all-gather chunks are received straight into it and forwarded
//! from it. That needs providers that take unregistered user memory (shm,
//! tcp); on providers that want every buffer registered (`FI_MR_LOCAL`,
//! e.g. EFA), all traffic goes through the staging slots instead and is
//! copied in and out ("bounce" mode, which [`Ring::set_bounce`] can also
//! force for testing).
//!
//! The average is the sum divided by n once, on the rank that finishes a
//! segment, before the all-gather: every rank ends with the same bytes.
//!
//! Nothing on the per-chunk path allocates: the lanes, slots and completion
//! array are sized at [`Ring::new`].
use crate::bootstrap::{Bootstrap, BootstrapError};
use crate::dataplane::fabric::{
    Completion, Endpoint, EndpointConfig, EndpointName, FabricError, Hints, MemoryHandle, PeerAddr, PollError, PostError, MAX_NAME_LEN,
};
use crate::dataplane::slab::{Slab, SlabConfig};
use crate::reduce::{DataType, Kernels, ReduceOp};
use std::fmt;
use std::time::{Duration, Instant};

/// Default chunk size: large enough that per-message costs vanish, small
/// enough that a pipeline of several chunks fits in a cache-sized segment.
pub const DEFAULT_CHUNK_BYTES: usize = 256 << 10;
/// Default chunks in flight per direction.
pub const DEFAULT_WINDOW: usize = 4;
/// Largest window (the context table and slots grow with it).
pub const MAX_WINDOW: usize = 256;
/// Smallest chunk: one element of the widest type.
pub const MIN_CHUNK_BYTES: usize = 8;
/// How long an all-reduce may go without any completion before it fails.
pub const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_secs(30);
/// Most ranks: 2(n-1) steps must fit the tag's step field.
pub const MAX_RANKS: u32 = 1 << 15;

// Tag layout: | 0xA (4) | call sequence (16) | step (16) | chunk position (28) |.
// A message matches only the receive for its own call, step and chunk; the
// marker keeps ring traffic apart from anything else a provider might see.
const TAG_CHUNK_BITS: u32 = 28;
const TAG_STEP_BITS: u32 = 16;
const TAG_MARK: u64 = 0xA << 60;

fn tag(seq: u16, step: u64, chunk: u64) -> u64 {
    TAG_MARK | (seq as u64) << (TAG_CHUNK_BITS + TAG_STEP_BITS) | step << TAG_CHUNK_BITS | chunk
}

/// Empty polls (each followed by a yield) before an adaptive poller sleeps
/// on the completion queue.
const SPIN_POLLS: u32 = 128;
/// How long one sleep on the completion queue may last.
const WAIT_MS: i32 = 1;

/// How a ring is built. Every rank must pass the same `chunk_bytes`,
/// `window` and provider ([`Ring::new`] checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// libfabric provider: `shm`, `tcp` (`tcp;ofi_rxm`), `efa`.
    pub provider: String,
    /// Local address for the endpoint (`127.0.0.1` for tcp on loopback);
    /// `None` lets the provider choose.
    pub node: Option<String>,
    /// Largest message; segments are cut into chunks of at most this.
    pub chunk_bytes: usize,
    /// Chunks in flight per direction.
    pub window: usize,
    /// Spin on the completion queue (a core per rank) rather than sleeping
    /// on it when idle (adaptive; for shared and small machines).
    pub poll_busy: bool,
}

impl RingConfig {
    /// Defaults for `provider`: 256 KiB chunks, window 4, adaptive polling.
    pub fn new(provider: &str) -> RingConfig {
        RingConfig {
            provider: provider.to_string(),
            node: None,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            window: DEFAULT_WINDOW,
            poll_busy: false,
        }
    }
}

/// Why a ring could not be built or an all-reduce failed.
#[derive(Debug)]
pub enum RingError {
    /// The configuration cannot work, or the ranks' configurations differ.
    Config(String),
    /// The control plane failed.
    Bootstrap(BootstrapError),
    /// Opening or setting up the endpoint failed.
    Fabric(FabricError),
    /// The buffers passed in do not fit the call.
    Buffers(String),
    /// A post, a poll or an operation failed during an all-reduce.
    Transport(String),
    /// Nothing completed for the progress timeout: a peer died, stopped
    /// calling, or called with different arguments.
    Stalled(String),
    /// An earlier all-reduce failed; the ring must be rebuilt (the peers'
    /// state is unknown). Carries the first error.
    Broken(String),
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Config(s) => write!(f, "ring: {s}"),
            RingError::Bootstrap(e) => write!(f, "ring: {e}"),
            RingError::Fabric(e) => write!(f, "ring: {e}"),
            RingError::Buffers(s) => write!(f, "ring: {s}"),
            RingError::Transport(s) => write!(f, "ring: {s}"),
            RingError::Stalled(s) => write!(f, "ring: {s}"),
            RingError::Broken(s) => write!(f, "ring: unusable after an earlier failure ({s})"),
        }
    }
}

impl std::error::Error for RingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RingError::Bootstrap(e) => Some(e),
            RingError::Fabric(e) => Some(e),
            _ => None,
        }
    }
}

impl From<BootstrapError> for RingError {
    fn from(e: BootstrapError) -> Self {
        RingError::Bootstrap(e)
    }
}

impl From<FabricError> for RingError {
    fn from(e: FabricError) -> Self {
        RingError::Fabric(e)
    }
}

/// What a receive's staging slot (and bookkeeping entry) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Free,
    /// The receive for this message is posted.
    Posted(u64),
    /// This message has arrived and been combined: ready to forward.
    Ready(u64),
    /// Its forward is in flight; free again when that send completes.
    Forwarding(u64),
}

/// One operation slot per direction and window position. The context id of
/// receive lane l is l, of send lane l is W + l.
#[derive(Debug, Clone, Copy)]
struct Lane {
    busy: bool,
    /// The message (virtual index) in flight on this lane.
    msg: u64,
    /// Sends only: the entry to free when the send completes (forwards).
    release: Option<usize>,
}

const IDLE_LANE: Lane = Lane { busy: false, msg: 0, release: None };

/// A ring of n ranks over one libfabric endpoint.
///
/// Drop it only once every rank is done with it (a [`Bootstrap::barrier`]):
/// a peer may still be finishing the last all-reduce, and with shm, ranks
/// that are threads of one process work directly on each other's endpoint
/// memory (libfabric 1.17 crashes when it is freed under them).
pub struct Ring {
    // Declared before `staging`, so dropped first: closing the endpoint
    // ends every access to the staging slots. `None` once a failure closed it.
    ep: Option<Endpoint>,
    /// 2W receive slots, then W send-bounce slots (one per send lane).
    staging: Slab,
    staging_mr: Option<MemoryHandle>,
    broken: Option<String>,
    rank: u32,
    nranks: u32,
    prev: PeerAddr,
    next: PeerAddr,
    chunk_bytes: usize,
    window: usize,
    poll_busy: bool,
    bounce: bool,
    needs_local_mr: bool,
    progress_timeout: Duration,
    kernels: Kernels,
    /// Calls so far (wrapping): the tag's sequence field.
    seq: u16,
    entries: Box<[Entry]>,
    recv_lanes: Box<[Lane]>,
    send_lanes: Box<[Lane]>,
}

/// What each rank tells the others at [`Ring::new`].
const HELLO_MAGIC: &[u8; 4] = b"RING";

/// What a rank sets up before it knows its peers.
struct Local {
    ep: Endpoint,
    name: EndpointName,
    staging: Slab,
    staging_mr: Option<MemoryHandle>,
    kernels: Kernels,
}

impl Ring {
    /// Opens this rank's endpoint, allocates and registers the staging slots,
    /// exchanges endpoint names over `boot` and connects to the previous and
    /// next rank. Collective: every rank of `boot` must call it.
    pub fn new(cfg: &RingConfig, boot: &mut Bootstrap) -> Result<Ring, RingError> {
        let (rank, nranks) = (boot.rank(), boot.nranks());
        // Set up locally, but take part in the exchange even on failure, so
        // that the other ranks fail now with our reason rather than at a timeout.
        let local = Ring::open_local(cfg, rank, nranks);
        let mut hello = Vec::with_capacity(64 + MAX_NAME_LEN);
        hello.extend_from_slice(HELLO_MAGIC);
        match &local {
            Ok(l) => {
                let (ep, name) = (&l.ep, &l.name);
                hello.push(0);
                hello.extend_from_slice(&(cfg.chunk_bytes as u64).to_le_bytes());
                hello.extend_from_slice(&(cfg.window as u64).to_le_bytes());
                let provider = ep.provider().as_bytes();
                hello.push(provider.len().min(255) as u8);
                hello.extend_from_slice(&provider[..provider.len().min(255)]);
                hello.extend_from_slice(name.as_bytes());
            }
            Err(e) => {
                hello.push(1);
                hello.extend_from_slice(e.to_string().as_bytes());
            }
        }
        let all = boot.allgather(&hello)?;
        // Kept whole until the end: dropping a `Local` closes the endpoint
        // before it unmaps the slots registered on it.
        let mut local = local?;
        let ep = &mut local.ep;
        let mut names = Vec::with_capacity(nranks as usize);
        for (r, h) in all.iter().enumerate() {
            let bad = |what: &str| RingError::Config(format!("rank {r}'s ring hello {what}"));
            if h.len() < 5 || &h[..4] != HELLO_MAGIC {
                return Err(bad("is not a ring hello"));
            }
            if h[4] != 0 {
                return Err(RingError::Config(format!("rank {r} could not set up its ring: {}", String::from_utf8_lossy(&h[5..]))));
            }
            let body = &h[5..];
            if body.len() < 17 {
                return Err(bad("is cut short"));
            }
            let chunk = u64::from_le_bytes(body[0..8].try_into().expect("8 bytes"));
            let window = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
            let plen = body[16] as usize;
            let provider = body.get(17..17 + plen).ok_or_else(|| bad("is cut short"))?;
            let name = &body[17 + plen..];
            // The chunk layout and message order derive from these: ranks that
            // disagree would send messages the others never expect.
            if chunk != cfg.chunk_bytes as u64 || window != cfg.window as u64 || provider != ep.provider().as_bytes() {
                return Err(RingError::Config(format!(
                    "rank {r} uses chunk_bytes {chunk}, window {window}, provider {:?}; rank {rank} uses {}, {}, {:?}",
                    String::from_utf8_lossy(provider),
                    cfg.chunk_bytes,
                    cfg.window,
                    ep.provider()
                )));
            }
            names.push(EndpointName::from_bytes(name).ok_or_else(|| bad("has no endpoint name"))?);
        }
        let (prev_rank, next_rank) = ((rank + nranks - 1) % nranks, (rank + 1) % nranks);
        let (mut prev, mut next) = (0, 0);
        if nranks > 1 {
            next = ep.insert_peer(&names[next_rank as usize])?;
            // With two ranks prev is next: one address-vector entry, so that
            // directed receives match what the provider reports as the source.
            prev = if prev_rank == next_rank { next } else { ep.insert_peer(&names[prev_rank as usize])? };
        }
        let w = cfg.window;
        let needs_local_mr = ep.needs_local_mr();
        Ok(Ring {
            ep: Some(local.ep),
            staging: local.staging,
            staging_mr: local.staging_mr,
            broken: None,
            rank,
            nranks,
            prev,
            next,
            chunk_bytes: cfg.chunk_bytes,
            window: w,
            poll_busy: cfg.poll_busy,
            bounce: needs_local_mr,
            needs_local_mr,
            progress_timeout: DEFAULT_PROGRESS_TIMEOUT,
            kernels: local.kernels,
            seq: 0,
            entries: vec![Entry::Free; 2 * w].into_boxed_slice(),
            recv_lanes: vec![IDLE_LANE; w].into_boxed_slice(),
            send_lanes: vec![IDLE_LANE; w].into_boxed_slice(),
        })
    }

    /// Everything this rank sets up on its own.
    fn open_local(cfg: &RingConfig, rank: u32, nranks: u32) -> Result<Local, RingError> {
        if cfg.chunk_bytes < MIN_CHUNK_BYTES {
            return Err(RingError::Config(format!("chunk_bytes {} is below the minimum of {MIN_CHUNK_BYTES}", cfg.chunk_bytes)));
        }
        if cfg.window == 0 || cfg.window > MAX_WINDOW {
            return Err(RingError::Config(format!("window {} is outside 1..={MAX_WINDOW}", cfg.window)));
        }
        if nranks > MAX_RANKS {
            return Err(RingError::Config(format!("{nranks} ranks exceed the maximum of {MAX_RANKS}")));
        }
        let kernels = Kernels::detect().map_err(|e| RingError::Config(e.to_string()))?;
        let w = cfg.window;
        let mut ep = Endpoint::open(&EndpointConfig {
            hints: Hints::new(&cfg.provider).with_node(cfg.node.as_deref()),
            cq_size: 0,
            contexts: (2 * w) as u32,
            wait_object: !cfg.poll_busy,
        })?;
        let mut slab_cfg = SlabConfig::new(format!("ring rank {rank}"), cfg.chunk_bytes, 3 * w);
        slab_cfg.page_aligned_slots = true;
        let staging = Slab::new(&slab_cfg).map_err(|e| RingError::Config(e.to_string()))?;
        let staging_mr = if ep.needs_local_mr() {
            // SAFETY: the slab's mapping lives in `Ring` next to the endpoint
            // and is dropped after it (field order), so it stays mapped for
            // as long as the registration exists.
            Some(unsafe { ep.register(staging.as_ptr(), staging.len()) }?)
        } else {
            None
        };
        let name = ep.name()?;
        Ok(Local { ep, name, staging, staging_mr, kernels })
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    pub fn window(&self) -> usize {
        self.window
    }

    /// The provider in use (`None` once a failure closed the endpoint).
    pub fn provider(&self) -> Option<&str> {
        self.ep.as_ref().map(|ep| ep.provider())
    }

    /// How long an all-reduce may wait without any completion before failing
    /// (default [`DEFAULT_PROGRESS_TIMEOUT`]).
    pub fn set_progress_timeout(&mut self, t: Duration) {
        self.progress_timeout = t;
    }

    /// Copies all traffic through the registered staging slots, as providers
    /// that need registered local buffers require, even where the user's
    /// buffers could be used directly. Turning it off is refused (ignored) on
    /// such providers. Every rank may choose independently.
    pub fn set_bounce(&mut self, on: bool) {
        self.bounce = on || self.needs_local_mr;
    }

    pub fn bounce(&self) -> bool {
        self.bounce
    }

    /// `recv = op(send of rank 0, ..., send of rank n-1)`, elementwise.
    /// `send` and `recv` have the same length, a whole number of `dtype`
    /// elements, and the same length on every rank. Collective: every rank
    /// calls it with the same dtype, op and length.
    pub fn allreduce(&mut self, send: &[u8], recv: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<(), RingError> {
        if send.len() != recv.len() {
            return Err(RingError::Buffers(format!("send buffer is {} bytes, receive buffer {}", send.len(), recv.len())));
        }
        self.run(send.as_ptr(), recv.as_mut_ptr(), recv.len(), dtype, op)
    }

    /// [`Ring::allreduce`] with the result written over the input.
    pub fn allreduce_in_place(&mut self, buf: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<(), RingError> {
        let p = buf.as_mut_ptr();
        self.run(p, p, buf.len(), dtype, op)
    }

    /// Checks the call, runs the pipeline, and on failure makes sure that
    /// nothing the provider still holds can touch the caller's buffers after
    /// we return.
    fn run(&mut self, send: *const u8, recv: *mut u8, bytes: usize, dtype: DataType, op: ReduceOp) -> Result<(), RingError> {
        if let Some(why) = &self.broken {
            return Err(RingError::Broken(why.clone()));
        }
        if !bytes.is_multiple_of(dtype.size()) {
            return Err(RingError::Buffers(format!(
                "{bytes} bytes is not a whole number of {dtype} elements ({} bytes each)",
                dtype.size()
            )));
        }
        if self.nranks == 1 {
            if !std::ptr::eq(send, recv) {
                // SAFETY: both buffers are `bytes` long (checked by the
                // callers) and do not overlap: `send` is a shared borrow and
                // `recv` a distinct mutable one.
                unsafe { std::ptr::copy_nonoverlapping(send, recv, bytes) };
            }
            return Ok(());
        }
        if bytes == 0 {
            return Ok(());
        }
        let schedule = Schedule::new(self, bytes, dtype)?;
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let result = {
            let Ring {
                ep,
                staging,
                staging_mr,
                prev,
                next,
                poll_busy,
                bounce,
                progress_timeout,
                kernels,
                entries,
                recv_lanes,
                send_lanes,
                nranks,
                rank,
                ..
            } = self;
            let Some(ep) = ep.as_mut() else {
                return Err(RingError::Broken("the endpoint is closed".into()));
            };
            // A successful pass leaves them so; make sure.
            entries.fill(Entry::Free);
            recv_lanes.fill(IDLE_LANE);
            send_lanes.fill(IDLE_LANE);
            let mut pass = Pass {
                ep,
                s: schedule,
                seq,
                dtype,
                op,
                kernels: *kernels,
                send,
                recv,
                staging: staging.as_ptr(),
                slot_bytes: staging.slot_size(),
                mr: *staging_mr,
                bounce: *bounce,
                prev: *prev,
                next: *next,
                prev_rank: (*rank + *nranks - 1) % *nranks,
                next_rank: (*rank + 1) % *nranks,
                entries,
                recv_lanes,
                send_lanes,
                next_recv: 0,
                next_send: 0,
                recvs_in_flight: 0,
                sends_in_flight: 0,
                poll_busy: *poll_busy,
                progress_timeout: *progress_timeout,
            };
            pass.run()
        };
        if let Err(e) = &result {
            self.broken = Some(e.to_string());
            if let Some(ep) = self.ep.as_mut() {
                // Nothing the provider still holds may touch the caller's
                // buffers after we return: cancel everything, and if some
                // operation will not finish, close the endpoint, which ends
                // them all. (Keeping it open otherwise matters for peers in
                // this process: shm maps them onto our endpoint's memory.)
                ep.cancel_all();
                if ep.in_flight() > 0 {
                    self.ep = None;
                }
            }
        }
        result
    }
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("provider", &self.provider())
            .field("chunk_bytes", &self.chunk_bytes)
            .field("window", &self.window)
            .field("bounce", &self.bounce)
            .finish()
    }
}

/// One message of the stream: its step, chunk position, and where its bytes
/// are in the user's buffers.
#[derive(Debug, Clone, Copy)]
struct Msg {
    step: u64,
    chunk: u64,
    /// Byte offset in the buffer.
    off: usize,
    /// Bytes.
    len: usize,
}

/// The message layout of one all-reduce, the same on every rank.
///
/// Messages have virtual indices k = (block, step, position): block b covers
/// chunk positions b·W .. (b+1)·W, and within it step t's W positions come
/// before step t+1's. An index whose chunk lies past the end of its segment
/// (the tail of the last block, short or empty segments) is a hole: neither
/// side sends or receives anything for it.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    rank: u64,
    n: u64,
    elem: usize,
    /// Segment k has `base + (k < rem)` elements.
    base: u64,
    rem: u64,
    chunk_elems: u64,
    /// Chunk positions per block: the window.
    w: u64,
    /// 2(n-1).
    steps: u64,
    /// Virtual indices, holes included.
    total: u64,
}

impl Schedule {
    fn new(ring: &Ring, bytes: usize, dtype: DataType) -> Result<Schedule, RingError> {
        let n = ring.nranks as u64;
        let elem = dtype.size();
        let count = (bytes / elem) as u64;
        let (base, rem) = (count / n, count % n);
        let chunk_elems = (ring.chunk_bytes / elem).max(1) as u64;
        let w = ring.window as u64;
        let steps = 2 * (n - 1);
        // Segment 0 is the longest.
        let chunks = (base + (rem > 0) as u64).div_ceil(chunk_elems);
        if chunks >= 1 << TAG_CHUNK_BITS {
            return Err(RingError::Buffers(format!(
                "{bytes} bytes over {n} ranks is {chunks} chunks per segment, more than tags can name; raise chunk_bytes"
            )));
        }
        let total = chunks.div_ceil(w) * steps * w;
        Ok(Schedule { rank: ring.rank as u64, n, elem, base, rem, chunk_elems, w, steps, total })
    }

    /// The message at virtual index `k` of the stream whose step-t segment
    /// is (rank - t - shift) mod n: shift 1 for what this rank sends, 2 for
    /// what it receives. `None` for a hole.
    fn locate(&self, k: u64, shift: u64) -> Option<Msg> {
        let per_block = self.steps * self.w;
        let (block, within) = (k / per_block, k % per_block);
        let (step, chunk) = (within / self.w, block * self.w + within % self.w);
        // rank + 2n - step - shift > 0, as step <= 2n - 3 and shift <= 2.
        let seg = (self.rank + 2 * self.n - step - shift) % self.n;
        let seg_elems = self.base + (seg < self.rem) as u64;
        let seg_start = seg * self.base + seg.min(self.rem);
        let first = chunk * self.chunk_elems;
        if first >= seg_elems {
            return None;
        }
        let elems = self.chunk_elems.min(seg_elems - first);
        Some(Msg { step, chunk, off: ((seg_start + first) as usize) * self.elem, len: elems as usize * self.elem })
    }

    fn send_msg(&self, k: u64) -> Option<Msg> {
        self.locate(k, 1)
    }

    fn recv_msg(&self, k: u64) -> Option<Msg> {
        self.locate(k, 2)
    }

    /// The first message this rank sends at index >= k, or `total`.
    fn next_send(&self, mut k: u64) -> u64 {
        while k < self.total && self.send_msg(k).is_none() {
            k += 1;
        }
        k
    }

    /// The first message this rank receives at index >= k, or `total`.
    fn next_recv(&self, mut k: u64) -> u64 {
        while k < self.total && self.recv_msg(k).is_none() {
            k += 1;
        }
        k
    }
}

/// One all-reduce in progress: the state the event loop works on.
struct Pass<'a> {
    ep: &'a mut Endpoint,
    s: Schedule,
    seq: u16,
    dtype: DataType,
    op: ReduceOp,
    kernels: Kernels,
    send: *const u8,
    recv: *mut u8,
    staging: *mut u8,
    slot_bytes: usize,
    mr: Option<MemoryHandle>,
    bounce: bool,
    prev: PeerAddr,
    next: PeerAddr,
    prev_rank: u32,
    next_rank: u32,
    /// Indexed by virtual index mod 2W; entry i uses staging slot i.
    entries: &'a mut [Entry],
    recv_lanes: &'a mut [Lane],
    send_lanes: &'a mut [Lane],
    /// Next message to post, in order; `s.total` when all are posted.
    next_recv: u64,
    next_send: u64,
    recvs_in_flight: usize,
    sends_in_flight: usize,
    poll_busy: bool,
    progress_timeout: Duration,
}

impl Pass<'_> {
    fn run(&mut self) -> Result<(), RingError> {
        self.next_recv = self.s.next_recv(0);
        self.next_send = self.s.next_send(0);
        let mut completions = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
        let mut last_progress = Instant::now();
        let mut idle_polls = 0u32;
        loop {
            self.post_recvs()?;
            self.post_sends()?;
            if self.next_recv == self.s.total && self.next_send == self.s.total && self.recvs_in_flight == 0 && self.sends_in_flight == 0 {
                return Ok(());
            }
            let got = match self.ep.poll(&mut completions) {
                Ok(got) => got,
                Err(PollError::Completion(e)) => {
                    let what = match e.context {
                        Some(c) => self.describe_context(c),
                        None => "an operation".to_string(),
                    };
                    return Err(RingError::Transport(format!("{what} failed: {e}")));
                }
                Err(PollError::Fabric(e)) => return Err(RingError::Transport(format!("polling: {e}"))),
            };
            for c in &completions[..got] {
                self.complete(c)?;
            }
            if got > 0 {
                last_progress = Instant::now();
                idle_polls = 0;
                continue;
            }
            idle_polls = idle_polls.saturating_add(1);
            if !self.poll_busy {
                if idle_polls <= SPIN_POLLS {
                    // Ranks often outnumber cores here: let a peer that has
                    // work run, rather than spin against it.
                    std::thread::yield_now();
                } else {
                    // Sleep until the provider signals a completion (or nap
                    // briefly). Progress is manual: the next poll drives it.
                    self.ep.wait(WAIT_MS).map_err(|e| RingError::Transport(format!("waiting: {e}")))?;
                }
            }
            if (self.poll_busy && !idle_polls.is_multiple_of(1024)) || last_progress.elapsed() < self.progress_timeout {
                continue;
            }
            return Err(self.stalled());
        }
    }

    fn slot(&self, entry: usize) -> *mut u8 {
        // Slots are `slot_bytes` apart from the start of the slab; entry is
        // below 3W, the number of slots.
        self.staging.wrapping_add(entry * self.slot_bytes)
    }

    fn w(&self) -> u64 {
        self.s.w
    }

    /// Posts receives in stream order while a lane and the message's entry
    /// (and slot) are free.
    fn post_recvs(&mut self) -> Result<(), RingError> {
        while self.next_recv < self.s.total {
            let k = self.next_recv;
            let lane = (k % self.w()) as usize;
            let entry = (k % (2 * self.w())) as usize;
            if self.recv_lanes[lane].busy || self.entries[entry] != Entry::Free {
                return Ok(());
            }
            let m = self.s.recv_msg(k).expect("next_recv names a message");
            // All-gather chunks are final: straight into the result, unless bouncing.
            let direct = !self.bounce && m.step >= self.s.n - 1;
            let (buf, mr) = if direct { (self.recv.wrapping_add(m.off), None) } else { (self.slot(entry), self.mr) };
            // SAFETY: `buf` is either the chunk's own range of the result
            // buffer, which the caller lent us for the whole call and which
            // nothing else writes while this receive is posted (every chunk
            // is received once), or a staging slot that is Free, so no other
            // operation uses it; the slot holds chunk_bytes >= m.len. The
            // endpoint is closed before `run` returns an error, so the
            // provider never writes after we return.
            let r = unsafe { self.ep.recv(buf, m.len, mr, Some(self.prev), tag(self.seq, m.step, m.chunk), 0, lane as u32) };
            match r {
                Ok(()) => {}
                Err(PostError::Again) => return Ok(()),
                Err(e) => {
                    return Err(RingError::Transport(format!(
                        "posting the receive of step {} chunk {} from rank {}: {e}",
                        m.step, m.chunk, self.prev_rank
                    )))
                }
            }
            self.recv_lanes[lane] = Lane { busy: true, msg: k, release: None };
            self.entries[entry] = Entry::Posted(k);
            self.recvs_in_flight += 1;
            self.next_recv = self.s.next_recv(k + 1);
        }
        Ok(())
    }

    /// Posts sends in stream order while a lane is free and the data is ready.
    fn post_sends(&mut self) -> Result<(), RingError> {
        while self.next_send < self.s.total {
            let k = self.next_send;
            let lane = (k % self.w()) as usize;
            if self.send_lanes[lane].busy {
                return Ok(());
            }
            let m = self.s.send_msg(k).expect("next_send names a message");
            let (buf, mr, release) = if m.step == 0 {
                // This rank's own data for the segment it starts.
                if self.bounce {
                    let bounce = self.slot(2 * self.w() as usize + lane);
                    // SAFETY: the send lane is free, so its bounce slot is not
                    // in use; it holds chunk_bytes >= m.len; the source is the
                    // caller's send buffer, valid for the whole call.
                    unsafe { std::ptr::copy_nonoverlapping(self.send.add(m.off), bounce, m.len) };
                    (bounce as *const u8, self.mr, None)
                } else {
                    (self.send.wrapping_add(m.off), None, None)
                }
            } else {
                // Forward the chunk received W messages earlier, once it has
                // arrived and been combined.
                let src = k - self.w();
                let entry = (src % (2 * self.w())) as usize;
                if self.entries[entry] != Entry::Ready(src) {
                    return Ok(());
                }
                // Intermediate reduce-scatter results live in the slot;
                // final data in the result buffer (and, bouncing, also in the slot).
                if self.bounce || m.step < self.s.n - 1 {
                    (self.slot(entry) as *const u8, self.mr, Some(entry))
                } else {
                    (self.recv.wrapping_add(m.off) as *const u8, None, Some(entry))
                }
            };
            // SAFETY: `buf` is m.len bytes of the caller's buffers (valid for
            // the whole call; a chunk's final bytes are never written again),
            // or of a staging slot held (Forwarding, or the lane's bounce
            // slot) until this send's completion. The endpoint is closed
            // before `run` returns an error.
            let r = unsafe { self.ep.send(buf, m.len, mr, self.next, tag(self.seq, m.step, m.chunk), (self.w() as usize + lane) as u32) };
            match r {
                Ok(()) => {}
                Err(PostError::Again) => return Ok(()),
                Err(e) => {
                    return Err(RingError::Transport(format!(
                        "posting the send of step {} chunk {} to rank {}: {e}",
                        m.step, m.chunk, self.next_rank
                    )))
                }
            }
            if let Some(entry) = release {
                self.entries[entry] = Entry::Forwarding(k - self.w());
            }
            self.send_lanes[lane] = Lane { busy: true, msg: k, release };
            self.sends_in_flight += 1;
            self.next_send = self.s.next_send(k + 1);
        }
        Ok(())
    }

    fn complete(&mut self, c: &Completion) -> Result<(), RingError> {
        let w = self.w() as usize;
        let ctx = c.context as usize;
        if !c.is_recv {
            let lane = ctx
                .checked_sub(w)
                .filter(|&l| l < w && self.send_lanes[l].busy)
                .ok_or_else(|| RingError::Transport(format!("send completion for unknown context {}", c.context)))?;
            if let Some(entry) = self.send_lanes[lane].release {
                self.entries[entry] = Entry::Free;
            }
            self.send_lanes[lane] = IDLE_LANE;
            self.sends_in_flight -= 1;
            return Ok(());
        }
        if ctx >= w || !self.recv_lanes[ctx].busy {
            return Err(RingError::Transport(format!("receive completion for unknown context {}", c.context)));
        }
        let k = self.recv_lanes[ctx].msg;
        self.recv_lanes[ctx] = IDLE_LANE;
        self.recvs_in_flight -= 1;
        let m = self.s.recv_msg(k).expect("a posted receive names a message");
        let want = tag(self.seq, m.step, m.chunk);
        if c.tag != want || c.len != m.len {
            return Err(RingError::Transport(format!(
                "step {} chunk {} from rank {}: got {} bytes with tag {:#x}, expected {} bytes with tag {want:#x} \
                 (do all ranks call with the same length and type?)",
                m.step, m.chunk, self.prev_rank, c.len, c.tag, m.len
            )));
        }
        let entry = (k % (2 * self.w())) as usize;
        let slot = self.slot(entry);
        let n = self.s.n;
        let elems = m.len / self.s.elem;
        // Combining goes pairwise; avg adds and divides once at the end.
        let op = if self.op == ReduceOp::Avg { ReduceOp::Sum } else { self.op };
        let mine = self.send.wrapping_add(m.off);
        let out = self.recv.wrapping_add(m.off);
        if m.step + 2 < n {
            // Reduce-scatter, not the last step: slot = slot op mine, then forward.
            // SAFETY: the slot holds the m.len bytes just received and no
            // operation uses it (its receive completed, its forward is not
            // posted); `mine` is m.len bytes of the caller's send buffer,
            // which overlaps no slot. Out is exactly inputs[0], as allowed.
            unsafe { self.kernels.reduce_raw(self.dtype, op, slot, &[slot as *const u8, mine], elems) }
                .map_err(|e| RingError::Transport(format!("reduce: {e}")))?;
            self.entries[entry] = Entry::Ready(k);
        } else if m.step + 2 == n {
            // Last reduce-scatter step: this rank's segment is complete.
            // SAFETY: `out` and `mine` are the same m.len-byte range of the
            // result and send buffers, which are either the same buffer
            // (in place: out is exactly inputs[0], as allowed) or disjoint;
            // the slot is disjoint from both and no operation uses it.
            unsafe { self.kernels.reduce_raw(self.dtype, op, out, &[mine, slot as *const u8], elems) }
                .map_err(|e| RingError::Transport(format!("reduce: {e}")))?;
            if self.op == ReduceOp::Avg {
                // SAFETY: m.len bytes of the result buffer, written just above
                // and not otherwise referenced while this slice lives.
                let result = unsafe { std::slice::from_raw_parts_mut(out, m.len) };
                self.kernels.finish_avg(self.dtype, result, n as usize).map_err(|e| RingError::Transport(format!("average: {e}")))?;
            }
            if self.bounce {
                // SAFETY: as above; the slot is forwarded from, so it gets a copy.
                unsafe { std::ptr::copy_nonoverlapping(out, slot, m.len) };
            }
            self.entries[entry] = Entry::Ready(k);
        } else {
            // All-gather: the chunk is final.
            if self.bounce {
                // SAFETY: the slot holds the m.len bytes just received; `out`
                // is that chunk's range of the result buffer, disjoint from it.
                unsafe { std::ptr::copy_nonoverlapping(slot, out, m.len) };
            }
            self.entries[entry] = if m.step + 1 == self.s.steps { Entry::Free } else { Entry::Ready(k) };
        }
        Ok(())
    }

    /// Names the message behind a context id, for error messages.
    fn describe_context(&self, context: u32) -> String {
        let w = self.w() as usize;
        let c = context as usize;
        let (lane, is_recv) = if c < w {
            (self.recv_lanes[c], true)
        } else if c < 2 * w {
            (self.send_lanes[c - w], false)
        } else {
            return format!("operation with context {context}");
        };
        let m = if is_recv { self.s.recv_msg(lane.msg) } else { self.s.send_msg(lane.msg) };
        match (m, is_recv) {
            (Some(m), true) => format!("the receive of step {} chunk {} from rank {}", m.step, m.chunk, self.prev_rank),
            (Some(m), false) => format!("the send of step {} chunk {} to rank {}", m.step, m.chunk, self.next_rank),
            (None, _) => format!("operation with context {context}"),
        }
    }

    fn stalled(&self) -> RingError {
        let waiting = self
            .recv_lanes
            .iter()
            .filter(|l| l.busy)
            .map(|l| l.msg)
            .min()
            .and_then(|k| self.s.recv_msg(k))
            .map(|m| format!("step {} chunk {} from rank {}", m.step, m.chunk, self.prev_rank))
            .unwrap_or_else(|| format!("send completions from rank {}", self.next_rank));
        RingError::Stalled(format!(
            "no progress for {:.1} s, waiting for {waiting} ({} receives and {} sends in flight): \
             a peer died, stopped calling, or called with a different length or type",
            self.progress_timeout.as_secs_f64(),
            self.recvs_in_flight,
            self.sends_in_flight
        ))
    }
}
