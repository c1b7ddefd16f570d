//! Ports: one libfabric endpoint of a context on a device and its
//! operation table (posted, done, failed, abandoned), its connect
//! buffers, peers and memory registrations.
use super::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OpState {
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
pub(super) struct CtrlBuf {
    pub(super) buf: Box<[u8]>,
    pub(super) mh: Option<MemoryHandle>,
}

pub(super) struct PendingConnect {
    pub(super) conn: Conn,
    pub(super) msg: Vec<u8>,
    pub(super) ctx: Option<u32>,
}

pub struct Port {
    // First field: dropped (closed) before the buffers below are freed.
    pub(super) ep: Endpoint,
    pub(super) device: usize,
    pub(super) provider: u8,
    /// Largest message per operation (the device's maxP2pBytes).
    pub(super) max_bytes: usize,
    pub(super) name: EndpointName,
    pub(super) mr_local: bool,
    pub(super) ops: Vec<OpState>,
    pub(super) free: Vec<u32>,
    pub(super) ctrl: HashMap<u32, CtrlBuf>,
    pub(super) peers: HashMap<Vec<u8>, PeerAddr>,
    pub(super) next_listen: u32,
    pub(super) pending: HashMap<u64, PendingConnect>,
    /// (address, length) -> registration and its reference count.
    pub(super) mrs: HashMap<(usize, usize), (MemoryHandle, usize)>,
    /// Logs a provider call on `ep` that does not return (None: off).
    pub(super) _watchdog: Option<Watchdog>,
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
        let _watchdog =
            Watchdog::start(who, ep.provider(), vec![ep.call_watch()], watchdog::OnStuck::Log, watchdog::limit_from_env(), None);
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

    pub(super) fn alloc(&mut self) -> Option<u32> {
        self.free.pop()
    }

    pub(super) fn release(&mut self, ctx: u32) {
        self.ops[ctx as usize] = OpState::Free;
        if let Some(c) = self.ctrl.remove(&ctx) {
            if let Some(mh) = c.mh {
                let _ = self.ep.deregister(mh);
            }
        }
        self.free.push(ctx);
    }

    pub(super) fn is_posted(&self, ctx: u32) -> bool {
        self.ops[ctx as usize] == OpState::Posted
    }

    /// Reads completions (which also drives the provider) until the queue is
    /// empty or a bounded number was handled.
    pub(super) fn progress(&mut self) -> Result<()> {
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

    pub(super) fn complete(&mut self, ctx: u32, outcome: std::result::Result<usize, String>) {
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
    pub(super) fn finish(&mut self, ctx: u32) -> Option<std::result::Result<usize, String>> {
        let r = match &self.ops[ctx as usize] {
            OpState::Done(len) => Ok(*len),
            OpState::Failed(e) => Err(e.clone()),
            _ => return None,
        };
        self.release(ctx);
        Some(r)
    }

    /// Gives up on an operation of a closing connection.
    pub(super) fn abandon(&mut self, ctx: u32, cancel: bool) {
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

    pub(super) fn peer(&mut self, name: &EndpointName) -> Result<PeerAddr> {
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
    pub(super) fn post_ctrl(&mut self, send: Option<(&[u8], PeerAddr)>, tag: u64) -> Result<Option<u32>> {
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

    pub(super) fn register(&mut self, addr: usize, len: usize) -> Result<MemoryHandle> {
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

    pub(super) fn deregister(&mut self, addr: usize, len: usize) -> Result<()> {
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
