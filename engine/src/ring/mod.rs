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
use crate::dataplane::fabric::{Endpoint, EndpointConfig, EndpointName, FabricError, Hints, MemoryHandle, PeerAddr, MAX_NAME_LEN};
use crate::dataplane::slab::{Slab, SlabConfig};
use crate::reduce::{DataType, Kernels, ReduceOp};
use bootstrap::{Bootstrap, BootstrapError};
use std::fmt;
use std::time::Duration;

pub mod bootstrap;
mod pass;

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
