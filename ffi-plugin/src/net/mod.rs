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

pub mod conn;
mod handle;
mod port;

use conn::Conn;
use handle::*;
use port::{OpState, PendingConnect, Port, PortRef};

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
    ports: ContextPorts,
    next: Mutex<Vec<[usize; 2]>>,
}

/// A context's endpoints, [device][lane]: lanes 0..n listen, n..2n
/// connect. Its connections hold it too: a send the provider refuses
/// for now progresses every one of them ([`Conn::post`] says why).
pub(super) type ContextPorts = Arc<Mutex<Vec<Vec<Option<PortRef>>>>>;

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
        NetCtx { devices, ports: Arc::new(Mutex::new(ports)), next: Mutex::new(next) }
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
    context: ContextPorts,
    listen_id: u32,
    nonce: u32,
    /// The posted connect-message receive (None: not posted yet).
    ctx: Option<u32>,
    accepted: bool,
}

/// Creates a listen comm on the next listening lane of `dev` and the handle
/// to give the connecting peer.
pub fn listen(ctx: &NetCtx, dev: i32) -> Result<(ListenComm, Handle)> {
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
    let posted = p.post_ctrl(None, connect_tag(listen_id))?;
    Ok((ListenComm { port: port.clone(), context: ctx.ports.clone(), listen_id, nonce, ctx: posted, accepted: false }, handle))
}

impl ListenComm {
    /// The receiving comm, once the peer's connect message has arrived.
    pub fn accept(&mut self) -> Result<Option<Conn>> {
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
        Ok(Some(Conn::new(self.port.clone(), self.context.clone(), false, PeerAddr::default(), self.listen_id)))
    }

    /// Closing consumes the comm NCCL held.
    pub fn close(self) -> Result<()> {
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
pub fn connect(ctx: &NetCtx, dev: i32, handle: &mut Handle) -> Result<Option<Conn>> {
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
        let conn = Conn::new(port.clone(), ctx.ports.clone(), true, peer, h.listen_id);
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

#[cfg(test)]
mod tests;
