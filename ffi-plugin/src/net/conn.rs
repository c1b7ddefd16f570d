//! Connections and requests: one direction of a connection (NCCL's
//! sendComm or recvComm), its request slots, its sends and receives, and
//! the registrations NCCL makes for them (`regMr`).
use super::*;
use crate::handed::Tagged;

/// A request slot, at a fixed address NCCL holds as the request pointer
/// (tagged: [`crate::handed`]).
#[derive(Debug)]
pub struct Request {
    /// The pointer NCCL holds for the owning [`Conn`] (a number: turned back
    /// into the comm only by the FFI layer, through its tag).
    pub owner: usize,
    pub index: usize,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Flight {
    pub(super) ctx: u32,
    pub(super) size: usize,
}

pub(super) struct ConnState {
    pub(super) next_seq: u32,
    pub(super) slots: [Option<Flight>; NCCL_NET_MAX_REQUESTS],
}

/// One direction of a connection: NCCL's sendComm or recvComm.
pub struct Conn {
    pub(super) port: PortRef,
    /// Every endpoint of the context this connection belongs to.
    pub(super) context: ContextPorts,
    pub is_send: bool,
    pub(super) peer: PeerAddr,
    pub(super) listen_id: u32,
    pub(super) state: Mutex<ConnState>,
    pub(super) requests: [Tagged<Request>; NCCL_NET_MAX_REQUESTS],
}

/// A registration from `regMr`.
#[derive(Debug)]
pub struct Mr {
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) mh: Option<MemoryHandle>,
}

impl Conn {
    /// A connection whose requests get their owner once it is handed to
    /// NCCL ([`Conn::set_requests_owner`]).
    pub(super) fn new(port: PortRef, context: ContextPorts, is_send: bool, peer: PeerAddr, listen_id: u32) -> Conn {
        Conn {
            port,
            context,
            is_send,
            peer,
            listen_id,
            state: Mutex::new(ConnState { next_seq: 0, slots: [None; NCCL_NET_MAX_REQUESTS] }),
            requests: std::array::from_fn(|index| Tagged::new(Request { owner: 0, index })),
        }
    }

    pub fn request(&self, index: usize) -> &Tagged<Request> {
        &self.requests[index]
    }

    /// Every request slot's owner: `at`, the pointer NCCL holds for this comm.
    pub(crate) fn set_requests_owner(&mut self, at: usize) {
        for r in self.requests.iter_mut() {
            r.owner = at;
        }
    }

    /// Marks every request slot closed, as NCCL closes the comm.
    pub(crate) fn close_requests(&mut self) {
        self.requests.iter_mut().for_each(Tagged::close);
    }

    pub fn reg_mr(&self, addr: usize, len: usize) -> Result<Mr> {
        let mut p = self.port.lock()?;
        let mh = if p.mr_local { Some(p.register(addr, len)?) } else { None };
        Ok(Mr { addr, len, mh })
    }

    /// Deregistering consumes the handle NCCL held.
    pub fn dereg_mr(&self, mr: Mr) -> Result<()> {
        if mr.mh.is_some() {
            self.port.lock()?.deregister(mr.addr, mr.len)?;
        }
        Ok(())
    }

    pub(super) fn memory(&self, p: &Port, addr: usize, size: usize, mr: Option<&Mr>) -> Result<Option<MemoryHandle>> {
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
        // the provider's queues: this endpoint's, and the context's others.
        // shm without cross-memory attach (qemu-user; a container without
        // CAP_SYS_PTRACE) sends above its inject size by copying through
        // the peer's buffers, one such send per peer at a time: the next
        // waits until the peer's endpoint has taken the last. Where the
        // peer is this context's own listening endpoint (two ranks of one
        // process), or its owner is itself waiting in a send, only a
        // progress of every endpoint lets either go on: two ranks each
        // retrying 32 sends of 4097 B waited for each other forever.
        for attempt in 0..2 {
            if attempt == 1 {
                p.progress()?;
                drop(p);
                self.progress_context();
                p = self.port.lock()?;
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

    /// Drives every other endpoint of this connection's context once (its
    /// own is the caller's to drive); their errors are theirs to report.
    fn progress_context(&self) {
        // Under the context's lock, without a copy of its list (no
        // allocation on a send's retry): nothing locks a port before it.
        let Ok(ports) = self.context.lock() else { return };
        for port in ports.iter().flatten().flatten().filter(|p| !Arc::ptr_eq(p, &self.port)) {
            if let Ok(mut p) = port.lock() {
                let _ = p.progress();
            }
        }
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
    pub fn close(self) -> Result<()> {
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
