//! ncclNet: point-to-point messages over tally's fabric layer.
//!
//! # Endpoints
//!
//! Each NCCL communicator (one `init` context) gets a few libfabric
//! endpoints per device, [`Port`]s, opened on first use and shared by the
//! connections of that context on that device: one listening and one
//! connecting endpoint for shm and EFA, four of each ("lanes", see
//! [`NetCtx`]) for tcp, where each pair of endpoints is one TCP stream.
//! Sharing keeps the number of endpoints (and of shm regions and rxm
//! connections) bounded, and means closing a connection never closes an
//! endpoint a peer may still be talking to: endpoints close only when their
//! context is finalized and the last connection on them is closed. A `Mutex`
//! per endpoint serializes access, since NCCL calls in from its main thread
//! and proxy threads; every call on a connection drives its endpoint's
//! progress.
//!
//! # Handles
//!
//! A listen handle (128 bytes, exchanged by NCCL) carries the listening
//! endpoint's libfabric name itself: 16 bytes for tcp (a `sockaddr_in`, 28
//! for IPv6), 32 for EFA, about 20 for shm (`fi_shm://pid:n:n`), all well
//! within the 96 bytes left after the header, so no separate TCP rendezvous
//! is needed. Layout (little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `TLYn` |
//! | 4 | protocol version |
//! | 5 | provider code (a tcp peer cannot talk to an shm listener) |
//! | 6 | name length |
//! | 8..12 | listen id: unique per endpoint, never reused |
//! | 12..16 | nonce: random, repeated in the connect message |
//! | 16..24 | connect token: 0 as issued; the connecting side writes its progress here |
//! | 24 | the connecting side's lane (with the token) |
//! | 32..128 | endpoint name |
//!
//! # Connection set-up (never blocks)
//!
//! `listen` posts a receive for a *connect message* tagged with the listen
//! id. `connect` inserts the listener's name into its endpoint's address
//! vector and sends the connect message (its own name, the listen id and
//! nonce); until that send has completed it returns a NULL comm, having
//! stored a token in the handle that finds the half-made connection on the
//! next call. `accept` returns the receiving comm once the connect message
//! has arrived. A listen handle takes one connection, as NCCL uses it.
//!
//! # Matching
//!
//! Data messages are tagged `kind (2 bits) | listen id (29) | sequence (32)`:
//! the listen id is unique on the receiving endpoint, so connections sharing
//! it never cross, and per-connection sequence numbers make sends match
//! receives in posting order. Receives match the tag exactly and may be
//! larger than the message; the completion says how much arrived.
//!
//! # Requests
//!
//! Each connection has 32 request slots (NCCL's limit per comm) at fixed
//! addresses inside its `Box`; the pointer NCCL gets for a request is the
//! address of its slot. A full connection, a full context table or a
//! provider that says "try again" yields a NULL request, which NCCL retries.
use crate::abi::{NCCL_NET_HANDLE_MAXSIZE, NCCL_NET_MAX_REQUESTS};
use crate::device::{Device, Devices};
use crate::error::{Error, Result};
use crate::log;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tally_engine::client::watchdog::{self, Watchdog};
use tally_engine::dataplane::fabric::{Completion, Endpoint, EndpointConfig, EndpointName, MemoryHandle, PeerAddr, PollError, PostError};

pub const HANDLE_BYTES: usize = NCCL_NET_HANDLE_MAXSIZE;
pub type Handle = [u8; HANDLE_BYTES];

const HANDLE_MAGIC: [u8; 4] = *b"TLYn";
const CONNECT_MAGIC: [u8; 4] = *b"TLYc";
const PROTO_VERSION: u8 = 1;
const HANDLE_NAME_AT: usize = 32;
/// Longest endpoint name a handle can carry.
pub const HANDLE_NAME_MAX: usize = HANDLE_BYTES - HANDLE_NAME_AT;
const TOKEN_AT: usize = 16;
/// The connecting lane, written with the token.
const LANE_AT: usize = 24;
const CONNECT_HEADER: usize = 16;
const CONNECT_MSG_MAX: usize = CONNECT_HEADER + tally_engine::dataplane::fabric::MAX_NAME_LEN;

/// Operations one endpoint may have in flight, over all its connections.
const CONTEXTS: u32 = 8192;
/// How long closing a connection waits for its operations to finish or be
/// canceled before leaving them to the endpoint.
const CLOSE_DRAIN: Duration = Duration::from_millis(500);

const KIND_CONNECT: u64 = 1 << 61;
const KIND_DATA: u64 = 2 << 61;
const LISTEN_ID_MAX: u32 = (1 << 29) - 1;

fn connect_tag(listen_id: u32) -> u64 {
    KIND_CONNECT | (u64::from(listen_id) << 32)
}

fn data_tag(listen_id: u32, seq: u32) -> u64 {
    KIND_DATA | (u64::from(listen_id) << 32) | u64::from(seq)
}

/// A code per provider, so that mismatched peers fail at connect with a clear message.
fn provider_code(p: &str) -> u8 {
    match p {
        "efa" => 1,
        "tcp;ofi_rxm" => 2,
        "shm" => 3,
        _ => 9,
    }
}

/// A non-cryptographic random number: std's per-process random hash keys
/// mixed with a counter and the clock. Enough to tell handles apart.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.write_u32(std::process::id());
    h.finish()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---------------------------------------------------------------------------
// Handles and connect messages

struct HandleInfo {
    provider: u8,
    listen_id: u32,
    nonce: u32,
    token: u64,
    name: EndpointName,
}

fn encode_handle(provider: u8, listen_id: u32, nonce: u32, name: &EndpointName) -> Result<Handle> {
    let n = name.as_bytes();
    if n.len() > HANDLE_NAME_MAX {
        return Err(Error::System(format!("endpoint name of {} bytes does not fit a {HANDLE_BYTES}-byte handle", n.len())));
    }
    let mut h = [0u8; HANDLE_BYTES];
    h[0..4].copy_from_slice(&HANDLE_MAGIC);
    h[4] = PROTO_VERSION;
    h[5] = provider;
    h[6] = n.len() as u8;
    h[8..12].copy_from_slice(&listen_id.to_le_bytes());
    h[12..16].copy_from_slice(&nonce.to_le_bytes());
    h[HANDLE_NAME_AT..HANDLE_NAME_AT + n.len()].copy_from_slice(n);
    Ok(h)
}

fn decode_handle(h: &Handle) -> Result<HandleInfo> {
    if h[0..4] != HANDLE_MAGIC {
        return Err(Error::InvalidUsage("the handle is not a tally ncclNet listen handle".into()));
    }
    if h[4] != PROTO_VERSION {
        return Err(Error::InvalidUsage(format!("handle protocol version {} (this plugin speaks {PROTO_VERSION})", h[4])));
    }
    let len = h[6] as usize;
    let name = (len <= HANDLE_NAME_MAX)
        .then(|| EndpointName::from_bytes(&h[HANDLE_NAME_AT..HANDLE_NAME_AT + len]))
        .flatten()
        .ok_or_else(|| Error::arg(format!("handle names an endpoint of {len} bytes")))?;
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    Ok(HandleInfo {
        provider: h[5],
        listen_id: u32_at(8),
        nonce: u32_at(12),
        token: u64::from_le_bytes(h[TOKEN_AT..TOKEN_AT + 8].try_into().expect("8 bytes")),
        name,
    })
}

fn encode_connect(provider: u8, listen_id: u32, nonce: u32, name: &EndpointName) -> Vec<u8> {
    let n = name.as_bytes();
    let mut m = vec![0u8; CONNECT_HEADER + n.len()];
    m[0..4].copy_from_slice(&CONNECT_MAGIC);
    m[4] = PROTO_VERSION;
    m[5] = provider;
    m[6..8].copy_from_slice(&(n.len() as u16).to_le_bytes());
    m[8..12].copy_from_slice(&listen_id.to_le_bytes());
    m[12..16].copy_from_slice(&nonce.to_le_bytes());
    m[CONNECT_HEADER..].copy_from_slice(n);
    m
}

/// Checks a connect message against the listen comm it arrived for; returns
/// the connecting endpoint's name (for the log).
fn check_connect(m: &[u8], provider: u8, listen_id: u32, nonce: u32) -> Result<Vec<u8>> {
    if m.len() < CONNECT_HEADER || m[0..4] != CONNECT_MAGIC || m[4] != PROTO_VERSION {
        return Err(Error::Remote(format!("malformed connect message of {} bytes", m.len())));
    }
    if m[5] != provider {
        return Err(Error::InvalidUsage(format!(
            "peer uses provider code {}, this endpoint {provider}: set the same TALLY_PROVIDER on every rank",
            m[5]
        )));
    }
    let len = u16::from_le_bytes([m[6], m[7]]) as usize;
    let id = u32::from_le_bytes(m[8..12].try_into().expect("4 bytes"));
    let n = u32::from_le_bytes(m[12..16].try_into().expect("4 bytes"));
    if id != listen_id || n != nonce || CONNECT_HEADER + len != m.len() {
        return Err(Error::Remote(format!(
            "connect message for listen id {id} nonce {n:#x} arrived at listen id {listen_id} nonce {nonce:#x}"
        )));
    }
    Ok(m[CONNECT_HEADER..].to_vec())
}

// ---------------------------------------------------------------------------
// Ports: one endpoint and its operation table

#[derive(Debug, Clone, PartialEq, Eq)]
enum OpState {
    Free,
    Posted,
    /// Completed; bytes received (0 for sends).
    Done(usize),
    Failed(String),
    /// Its connection was closed while it was in flight: freed when its
    /// completion (or cancellation) arrives.
    Abandoned,
}

/// A buffer owned by the port while an operation on it is in flight
/// (connect messages), registered when the provider wants local MRs.
struct CtrlBuf {
    buf: Box<[u8]>,
    mh: Option<MemoryHandle>,
}

struct PendingConnect {
    conn: Box<Conn>,
    msg: Vec<u8>,
    ctx: Option<u32>,
}

pub struct Port {
    // First field: dropped (closed) before the buffers below are freed.
    ep: Endpoint,
    device: usize,
    provider: u8,
    /// Largest message per operation (the device's maxP2pBytes).
    max_bytes: usize,
    name: EndpointName,
    mr_local: bool,
    ops: Vec<OpState>,
    free: Vec<u32>,
    ctrl: HashMap<u32, CtrlBuf>,
    peers: HashMap<Vec<u8>, PeerAddr>,
    next_listen: u32,
    pending: HashMap<u64, PendingConnect>,
    /// (address, length) -> registration and its reference count.
    mrs: HashMap<(usize, usize), (MemoryHandle, usize)>,
    /// Logs a provider call on `ep` that does not return (None: off).
    _watchdog: Option<Watchdog>,
}

pub type PortRef = Arc<Mutex<Port>>;

impl Port {
    pub fn open(dev: &Device) -> Result<Port> {
        let cfg = EndpointConfig { hints: dev.hints(), cq_size: 0, contexts: CONTEXTS, wait_object: false };
        let ep = Endpoint::open(&cfg).map_err(|e| Error::System(format!("opening a {} endpoint on {}: {e}", dev.provider, dev.domain)))?;
        let name = ep.name().map_err(|e| Error::System(e.to_string()))?;
        if name.as_bytes().len() > HANDLE_NAME_MAX {
            return Err(Error::System(format!("{} endpoint name of {} bytes does not fit a handle", dev.provider, name.as_bytes().len())));
        }
        log::info_init(&format!(
            "device {} ({}, {}): endpoint {} opened",
            dev.index,
            ep.provider(),
            ep.domain_name(),
            hex(name.as_bytes())
        ));
        let who = format!("ncclNet device {}", dev.index);
        let _watchdog = Watchdog::start(who, ep.provider(), vec![ep.call_watch()], false, watchdog::limit_from_env());
        Ok(Port {
            _watchdog,
            mr_local: ep.needs_local_mr(),
            provider: provider_code(ep.provider()),
            ep,
            device: dev.index,
            max_bytes: dev.max_p2p_bytes(),
            name,
            ops: vec![OpState::Free; CONTEXTS as usize],
            free: (0..CONTEXTS).rev().collect(),
            ctrl: HashMap::new(),
            peers: HashMap::new(),
            next_listen: 1,
            pending: HashMap::new(),
            mrs: HashMap::new(),
        })
    }

    fn alloc(&mut self) -> Option<u32> {
        self.free.pop()
    }

    fn release(&mut self, ctx: u32) {
        self.ops[ctx as usize] = OpState::Free;
        if let Some(c) = self.ctrl.remove(&ctx) {
            if let Some(mh) = c.mh {
                let _ = self.ep.deregister(mh);
            }
        }
        self.free.push(ctx);
    }

    fn is_posted(&self, ctx: u32) -> bool {
        self.ops[ctx as usize] == OpState::Posted
    }

    /// Reads completions (which also drives the provider) until the queue is
    /// empty or a bounded number was handled.
    fn progress(&mut self) -> Result<()> {
        let mut batch = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
        for _ in 0..8 {
            match self.ep.poll(&mut batch) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    for c in &batch[..n] {
                        self.complete(c.context, Ok(if c.is_recv { c.len } else { 0 }));
                    }
                }
                Err(PollError::Completion(e)) => match e.context {
                    Some(ctx) => self.complete(ctx, Err(e.to_string())),
                    None => log::warn(&format!("completion error for no known operation: {e}")),
                },
                Err(PollError::Fabric(e)) => return Err(Error::System(format!("reading the completion queue: {e}"))),
            }
        }
        Ok(())
    }

    fn complete(&mut self, ctx: u32, outcome: std::result::Result<usize, String>) {
        let Some(state) = self.ops.get(ctx as usize) else {
            log::warn(&format!("completion for unknown context {ctx}"));
            return;
        };
        match state {
            OpState::Posted => {
                self.ops[ctx as usize] = match outcome {
                    Ok(len) => OpState::Done(len),
                    Err(e) => OpState::Failed(e),
                }
            }
            OpState::Abandoned => self.release(ctx),
            other => log::warn(&format!("completion for context {ctx} in state {other:?}")),
        }
    }

    /// The outcome of a finished operation, freeing its context; None while in flight.
    fn finish(&mut self, ctx: u32) -> Option<std::result::Result<usize, String>> {
        let r = match &self.ops[ctx as usize] {
            OpState::Done(len) => Ok(*len),
            OpState::Failed(e) => Err(e.clone()),
            _ => return None,
        };
        self.release(ctx);
        Some(r)
    }

    /// Gives up on an operation of a closing connection.
    fn abandon(&mut self, ctx: u32, cancel: bool) {
        match self.ops[ctx as usize] {
            OpState::Posted => {
                if cancel {
                    self.ep.cancel(ctx);
                }
                self.ops[ctx as usize] = OpState::Abandoned;
            }
            OpState::Done(_) | OpState::Failed(_) => self.release(ctx),
            OpState::Free | OpState::Abandoned => {}
        }
    }

    fn peer(&mut self, name: &EndpointName) -> Result<PeerAddr> {
        if let Some(&a) = self.peers.get(name.as_bytes()) {
            return Ok(a);
        }
        let a = self
            .ep
            .insert_peer(name)
            .map_err(|e| Error::System(format!("adding peer {} to the address vector: {e}", hex(name.as_bytes()))))?;
        self.peers.insert(name.as_bytes().to_vec(), a);
        Ok(a)
    }

    /// Posts a connect-message send or receive on a port-owned buffer.
    /// Ok(None): the provider said try again.
    fn post_ctrl(&mut self, send: Option<(&[u8], PeerAddr)>, tag: u64) -> Result<Option<u32>> {
        let Some(ctx) = self.alloc() else {
            return Ok(None);
        };
        let mut buf: Box<[u8]> = match send {
            Some((m, _)) => m.into(),
            None => vec![0u8; CONNECT_MSG_MAX].into(),
        };
        let mh = if self.mr_local {
            // SAFETY: the buffer is moved into self.ctrl below and kept until
            // `release` deregisters it, or until the endpoint (declared
            // first) is closed; a Box's heap data does not move.
            match unsafe { self.ep.register(buf.as_mut_ptr(), buf.len()) } {
                Ok(mh) => Some(mh),
                Err(e) => {
                    self.free.push(ctx);
                    return Err(Error::System(format!("registering a control buffer: {e}")));
                }
            }
        } else {
            None
        };
        let r = match send {
            // SAFETY: buf lives in self.ctrl until the operation's context is
            // released (after its completion) or the endpoint is closed.
            Some((_, dest)) => unsafe { self.ep.send(buf.as_ptr(), buf.len(), mh, dest, tag, ctx) },
            // SAFETY: as above; nothing else reads or writes buf meanwhile.
            None => unsafe { self.ep.recv(buf.as_mut_ptr(), buf.len(), mh, None, tag, 0, ctx) },
        };
        self.ctrl.insert(ctx, CtrlBuf { buf, mh });
        match r {
            Ok(()) => {
                self.ops[ctx as usize] = OpState::Posted;
                Ok(Some(ctx))
            }
            Err(PostError::Again) => {
                self.release(ctx);
                Ok(None)
            }
            Err(e) => {
                self.release(ctx);
                Err(Error::System(format!("posting a connect message: {e}")))
            }
        }
    }

    fn register(&mut self, addr: usize, len: usize) -> Result<MemoryHandle> {
        if let Some((mh, refs)) = self.mrs.get_mut(&(addr, len)) {
            *refs += 1;
            return Ok(*mh);
        }
        // SAFETY: NCCL keeps a registered buffer mapped until it calls
        // deregMr (the contract of regMr); the endpoint's registration is
        // removed there, or when the endpoint closes.
        let mh = unsafe { self.ep.register(addr as *mut u8, len) }.map_err(|e| Error::System(format!("registering {len} bytes: {e}")))?;
        self.mrs.insert((addr, len), (mh, 1));
        Ok(mh)
    }

    fn deregister(&mut self, addr: usize, len: usize) -> Result<()> {
        let Some((mh, refs)) = self.mrs.get_mut(&(addr, len)) else {
            return Err(Error::arg("memory handle is not registered on this endpoint"));
        };
        *refs -= 1;
        if *refs == 0 {
            let mh = *mh;
            self.mrs.remove(&(addr, len));
            self.ep.deregister(mh).map_err(|e| Error::System(e.to_string()))?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Contexts

/// What `init` returns: the devices and this context's endpoints on them.
///
/// Over tcp, rxm carries everything between two endpoints on one TCP
/// connection, and one TCP stream is what limits large messages on a fast
/// link; so a context has several endpoints per device, *lanes*: listens take
/// the listening lanes and connects the connecting lanes in turn, and each
/// (connecting lane, listening lane) pair is its own TCP connection, one per
/// direction, as NCCL's socket transport has a socket per connection. Other
/// providers get one lane each way (shm and EFA have no stream to share).
/// `TALLY_NET_LANES` overrides the count.
pub struct NetCtx {
    pub devices: Arc<Devices>,
    /// [device][lane]: lanes 0..n listen, n..2n connect.
    ports: Mutex<Vec<Vec<Option<PortRef>>>>,
    next: Mutex<Vec<[usize; 2]>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Listen = 0,
    Connect = 1,
}

/// Lanes per direction for a provider.
fn lanes(provider: &str) -> usize {
    if let Some(n) = std::env::var("TALLY_NET_LANES").ok().and_then(|s| s.trim().parse::<usize>().ok()) {
        return n.clamp(1, 64);
    }
    if provider == "tcp;ofi_rxm" {
        4
    } else {
        1
    }
}

impl NetCtx {
    pub fn new(devices: Arc<Devices>) -> NetCtx {
        let ports = devices.list.iter().map(|d| vec![None; 2 * lanes(&d.provider)]).collect();
        let next = vec![[0, 0]; devices.list.len()];
        NetCtx { devices, ports: Mutex::new(ports), next: Mutex::new(next) }
    }

    fn device(&self, dev: i32) -> Result<usize> {
        usize::try_from(dev)
            .ok()
            .filter(|&i| i < self.devices.list.len())
            .ok_or_else(|| Error::arg(format!("device {dev} does not exist ({} devices)", self.devices.list.len())))
    }

    /// A lane of this context on `dev` (the next one in turn for `role` when
    /// `lane` is None), its endpoint opened on first use.
    fn port(&self, dev: usize, role: Role, lane: Option<usize>) -> Result<(PortRef, usize)> {
        let mut ports = self.ports.lock()?;
        let n = ports[dev].len() / 2;
        let lane = match lane {
            Some(l) if l < n => l,
            Some(l) => return Err(Error::InvalidUsage(format!("the handle names connecting lane {l} of {n}"))),
            None => {
                let mut next = self.next.lock()?;
                let l = next[dev][role as usize] % n;
                next[dev][role as usize] += 1;
                l
            }
        };
        let slot = &mut ports[dev][role as usize * n + lane];
        if let Some(p) = slot {
            return Ok((p.clone(), lane));
        }
        let p = Arc::new(Mutex::new(Port::open(&self.devices.list[dev])?));
        *slot = Some(p.clone());
        Ok((p, lane))
    }
}

// ---------------------------------------------------------------------------
// Listening

pub struct ListenComm {
    port: PortRef,
    listen_id: u32,
    nonce: u32,
    /// The posted connect-message receive (None: not posted yet).
    ctx: Option<u32>,
    accepted: bool,
}

/// Creates a listen comm on the next listening lane of `dev` and the handle
/// to give the connecting peer.
pub fn listen(ctx: &NetCtx, dev: i32) -> Result<(Box<ListenComm>, Handle)> {
    let (port, _) = ctx.port(ctx.device(dev)?, Role::Listen, None)?;
    let port = &port;
    let mut p = port.lock()?;
    if p.next_listen > LISTEN_ID_MAX {
        return Err(Error::System("listen ids of this endpoint are used up".into()));
    }
    let listen_id = p.next_listen;
    p.next_listen += 1;
    let nonce = random_u64() as u32;
    let handle = encode_handle(p.provider, listen_id, nonce, &p.name)?;
    let ctx = p.post_ctrl(None, connect_tag(listen_id))?;
    Ok((Box::new(ListenComm { port: port.clone(), listen_id, nonce, ctx, accepted: false }), handle))
}

impl ListenComm {
    /// The receiving comm, once the peer's connect message has arrived.
    pub fn accept(&mut self) -> Result<Option<Box<Conn>>> {
        if self.accepted {
            return Err(Error::InvalidUsage("a listen handle takes one connection, and this one was accepted".into()));
        }
        let mut p = self.port.lock()?;
        if self.ctx.is_none() {
            self.ctx = p.post_ctrl(None, connect_tag(self.listen_id))?;
        }
        p.progress()?;
        let Some(ctx) = self.ctx else { return Ok(None) };
        let msg = match &p.ops[ctx as usize] {
            OpState::Done(len) => p.ctrl.get(&ctx).map(|c| c.buf[..(*len).min(c.buf.len())].to_vec()).unwrap_or_default(),
            OpState::Failed(_) => Vec::new(),
            _ => return Ok(None),
        };
        let outcome = p.finish(ctx).expect("finished operation");
        self.ctx = None;
        outcome.map_err(|e| Error::Remote(format!("receiving a connect message: {e}")))?;
        let peer = check_connect(&msg, p.provider, self.listen_id, self.nonce)?;
        let device = p.device;
        drop(p);
        self.accepted = true;
        log::info(&format!("device {device}: accepted a connection from {} on listen id {}", hex(&peer), self.listen_id));
        Ok(Some(Conn::boxed(self.port.clone(), false, PeerAddr::default(), self.listen_id)))
    }

    // Takes the Box NCCL held: closing consumes the comm.
    #[allow(clippy::boxed_local)]
    pub fn close(self: Box<Self>) -> Result<()> {
        if let Some(ctx) = self.ctx {
            self.port.lock()?.abandon(ctx, true);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Connecting

/// One step of connecting to the listener named by `handle`: Some(comm) once
/// the connect message is delivered. Progress is kept in the port, found
/// through a token written into the handle.
pub fn connect(ctx: &NetCtx, dev: i32, handle: &mut Handle) -> Result<Option<Box<Conn>>> {
    let dev = ctx.device(dev)?;
    let h = decode_handle(handle)?;
    // The first call takes the next connecting lane and records it in the
    // handle next to the token; retries come back to it.
    let (port, lane) = ctx.port(dev, Role::Connect, (h.token != 0).then_some(handle[LANE_AT] as usize))?;
    let port = &port;
    let mut p = port.lock()?;
    if h.provider != p.provider {
        return Err(Error::InvalidUsage(format!(
            "the listener uses provider code {}, this endpoint {}: set the same TALLY_PROVIDER on every rank",
            h.provider, p.provider
        )));
    }
    let token = if h.token == 0 {
        let peer = p.peer(&h.name)?;
        let msg = encode_connect(p.provider, h.listen_id, h.nonce, &p.name);
        let mut token = random_u64() | 1;
        while p.pending.contains_key(&token) {
            token = random_u64() | 1;
        }
        let conn = Conn::boxed(port.clone(), true, peer, h.listen_id);
        p.pending.insert(token, PendingConnect { conn, msg, ctx: None });
        handle[TOKEN_AT..TOKEN_AT + 8].copy_from_slice(&token.to_le_bytes());
        handle[LANE_AT] = lane as u8;
        token
    } else {
        h.token
    };
    let mut pc = p
        .pending
        .remove(&token)
        .ok_or_else(|| Error::InvalidUsage("the handle's connect token names no connection in progress on this endpoint".into()))?;
    if pc.ctx.is_none() {
        let dest = pc.conn.peer;
        match p.post_ctrl(Some((&pc.msg, dest)), connect_tag(h.listen_id)) {
            Ok(ctx) => pc.ctx = ctx,
            Err(e) => return Err(e),
        }
    }
    p.progress()?;
    let done = match pc.ctx {
        Some(ctx) => p.finish(ctx),
        None => None,
    };
    match done {
        None => {
            p.pending.insert(token, pc);
            Ok(None)
        }
        Some(Ok(_)) => {
            log::info(&format!("device {}: connected to {} listen id {}", p.device, hex(h.name.as_bytes()), h.listen_id));
            Ok(Some(pc.conn))
        }
        Some(Err(e)) => Err(Error::Remote(format!("sending the connect message to {}: {e}", hex(h.name.as_bytes())))),
    }
}

// ---------------------------------------------------------------------------
// Connections and requests

/// A request slot, at a fixed address NCCL holds as the request pointer.
#[derive(Debug)]
pub struct Request {
    /// Address of the owning [`Conn`] (a number: dereferenced only by the
    /// FFI layer, which got it from NCCL).
    pub owner: usize,
    pub index: usize,
}

#[derive(Clone, Copy, Debug)]
struct Flight {
    ctx: u32,
    size: usize,
}

struct ConnState {
    next_seq: u32,
    slots: [Option<Flight>; NCCL_NET_MAX_REQUESTS],
}

/// One direction of a connection: NCCL's sendComm or recvComm.
pub struct Conn {
    port: PortRef,
    pub is_send: bool,
    peer: PeerAddr,
    listen_id: u32,
    state: Mutex<ConnState>,
    requests: [Request; NCCL_NET_MAX_REQUESTS],
}

/// A registration from `regMr`.
#[derive(Debug)]
pub struct Mr {
    addr: usize,
    len: usize,
    mh: Option<MemoryHandle>,
}

impl Conn {
    fn boxed(port: PortRef, is_send: bool, peer: PeerAddr, listen_id: u32) -> Box<Conn> {
        let mut c = Box::new(Conn {
            port,
            is_send,
            peer,
            listen_id,
            state: Mutex::new(ConnState { next_seq: 0, slots: [None; NCCL_NET_MAX_REQUESTS] }),
            requests: std::array::from_fn(|index| Request { owner: 0, index }),
        });
        let owner = &*c as *const Conn as usize;
        for r in c.requests.iter_mut() {
            r.owner = owner;
        }
        c
    }

    pub fn request(&self, index: usize) -> &Request {
        &self.requests[index]
    }

    pub fn reg_mr(&self, addr: usize, len: usize) -> Result<Box<Mr>> {
        let mut p = self.port.lock()?;
        let mh = if p.mr_local { Some(p.register(addr, len)?) } else { None };
        Ok(Box::new(Mr { addr, len, mh }))
    }

    // Takes the Box NCCL held: deregistering consumes the handle.
    #[allow(clippy::boxed_local)]
    pub fn dereg_mr(&self, mr: Box<Mr>) -> Result<()> {
        if mr.mh.is_some() {
            self.port.lock()?.deregister(mr.addr, mr.len)?;
        }
        Ok(())
    }

    fn memory(&self, p: &Port, addr: usize, size: usize, mr: Option<&Mr>) -> Result<Option<MemoryHandle>> {
        match mr {
            Some(m) => {
                if size > 0 && (addr < m.addr || addr + size > m.addr + m.len) {
                    return Err(Error::arg(format!("buffer {addr:#x}+{size} is outside its registration {:#x}+{}", m.addr, m.len)));
                }
                Ok(m.mh)
            }
            None if p.mr_local && size > 0 => Err(Error::arg("this provider needs registered memory, and no memory handle was given")),
            None => Ok(None),
        }
    }

    /// Posts a send (or, for a receive comm, a receive) of `size` bytes at
    /// `data`. Ok(None): try again later.
    ///
    /// # Safety
    /// `[data, data+size)` must stay valid (and, for a receive, untouched by
    /// anyone else) until [`Conn::test`] reports the request done or the
    /// connection is closed.
    pub unsafe fn post(&self, data: *mut u8, size: usize, mr: Option<&Mr>) -> Result<Option<usize>> {
        let mut st = self.state.lock()?;
        let Some(slot) = st.slots.iter().position(Option::is_none) else {
            return Ok(None);
        };
        let mut p = self.port.lock()?;
        if size > p.max_bytes {
            return Err(Error::arg(format!("{size} bytes exceed the device's maxP2pBytes ({})", p.max_bytes)));
        }
        let mh = self.memory(&p, data as usize, size, mr)?;
        let tag = data_tag(self.listen_id, st.next_seq);
        // Two tries: the second after driving progress, which is what frees
        // the provider's queues.
        for attempt in 0..2 {
            if attempt == 1 {
                p.progress()?;
            }
            let Some(ctx) = p.alloc() else { continue };
            let r = if self.is_send {
                // SAFETY: the caller keeps the buffer valid until the request
                // completes; ctx is a free context of this endpoint.
                unsafe { p.ep.send(data, size, mh, self.peer, tag, ctx) }
            } else {
                // SAFETY: as above, and nobody else touches the buffer.
                unsafe { p.ep.recv(data, size, mh, None, tag, 0, ctx) }
            };
            match r {
                Ok(()) => {
                    p.ops[ctx as usize] = OpState::Posted;
                    st.next_seq = st.next_seq.wrapping_add(1);
                    st.slots[slot] = Some(Flight { ctx, size });
                    return Ok(Some(slot));
                }
                Err(PostError::Again) => p.release(ctx),
                Err(e) => {
                    p.release(ctx);
                    return Err(Error::System(format!("posting a {} of {size} bytes: {e}", if self.is_send { "send" } else { "receive" })));
                }
            }
        }
        Ok(None)
    }

    /// Some(bytes) once request `index` is done: the size sent, or the size received.
    pub fn test(&self, index: usize) -> Result<Option<usize>> {
        let mut st = self.state.lock()?;
        let Some(f) = st.slots.get(index).copied().flatten() else {
            return Err(Error::InvalidUsage(format!("request {index} is not in flight")));
        };
        let mut p = self.port.lock()?;
        // One progress round per call: NCCL's proxy thread tests every
        // connection in turn, and spinning here starves the others (measured:
        // 8 extra rounds cost 3%, 64 cost 10%, 512 cost 35% at 256 MiB).
        if p.is_posted(f.ctx) {
            p.progress()?;
        }
        match p.finish(f.ctx) {
            None => Ok(None),
            Some(r) => {
                st.slots[index] = None;
                let len = r.map_err(|e| {
                    Error::Remote(format!("{} on listen id {}: {e}", if self.is_send { "send" } else { "receive" }, self.listen_id))
                })?;
                Ok(Some(if self.is_send { f.size } else { len }))
            }
        }
    }

    /// Closes the connection. Receives still posted are canceled; every
    /// operation in flight gets a bounded time to finish, so that the
    /// provider is done with NCCL's buffers before NCCL frees them, then is
    /// left to the endpoint.
    pub fn close(self: Box<Self>) -> Result<()> {
        let st = self.state.lock()?;
        let live: Vec<u32> = st.slots.iter().flatten().map(|f| f.ctx).collect();
        if live.is_empty() {
            return Ok(());
        }
        let mut p = self.port.lock()?;
        for &ctx in &live {
            p.abandon(ctx, !self.is_send);
        }
        let deadline = Instant::now() + CLOSE_DRAIN;
        while live.iter().any(|&c| p.ops[c as usize] == OpState::Abandoned) && Instant::now() < deadline {
            p.progress()?;
            std::thread::yield_now();
        }
        let left = live.iter().filter(|&&c| p.ops[c as usize] == OpState::Abandoned).count();
        if left > 0 {
            log::info(&format!("closed a connection (listen id {}) with {left} operation(s) still in flight", self.listen_id));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip() {
        let name = EndpointName::from_bytes(b"fi_shm://1234:0:0\0").unwrap();
        let mut h = encode_handle(3, 77, 0xdead_beef, &name).unwrap();
        let d = decode_handle(&h).unwrap();
        assert_eq!((d.provider, d.listen_id, d.nonce, d.token), (3, 77, 0xdead_beef, 0));
        assert_eq!(d.name.as_bytes(), name.as_bytes());
        h[TOKEN_AT..TOKEN_AT + 8].copy_from_slice(&42u64.to_le_bytes());
        assert_eq!(decode_handle(&h).unwrap().token, 42);
        h[0] = b'X';
        assert!(decode_handle(&h).is_err());
        let long = EndpointName::from_bytes(&[1u8; HANDLE_NAME_MAX + 1]).unwrap();
        assert!(encode_handle(3, 1, 1, &long).is_err());
    }

    #[test]
    fn connect_messages_are_checked() {
        let name = EndpointName::from_bytes(&[7u8; 16]).unwrap();
        let m = encode_connect(2, 5, 9, &name);
        assert_eq!(check_connect(&m, 2, 5, 9).unwrap(), vec![7u8; 16]);
        assert!(matches!(check_connect(&m, 3, 5, 9), Err(Error::InvalidUsage(_))));
        assert!(check_connect(&m, 2, 6, 9).is_err());
        assert!(check_connect(&m, 2, 5, 8).is_err());
        assert!(check_connect(&m[..10], 2, 5, 9).is_err());
    }

    #[test]
    fn tags_keep_connections_apart() {
        assert_ne!(data_tag(1, 0), data_tag(2, 0));
        assert_ne!(data_tag(1, 0), connect_tag(1));
        assert_eq!(data_tag(LISTEN_ID_MAX, u32::MAX) >> 63, 0);
    }
}
