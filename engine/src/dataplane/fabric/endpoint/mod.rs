//! One endpoint with everything it needs, owned by one thread.
//!
//! An [`Endpoint`] bundles a fabric, a domain, an address vector, a
//! completion queue and the RDM endpoint itself, plus the memory regions
//! registered on its domain and a fixed table of operation contexts. Keeping
//! them in one value gives the lcore model for free: the thread that owns the
//! `Endpoint` is the only one that can touch any of it (the domain is opened
//! with `FI_THREAD_DOMAIN`, so the provider takes no locks), and dropping it
//! closes everything in the order libfabric requires.
//!
//! Operations are named by a context id, an index into the context table
//! fixed at creation. The table holds the provider's scratch space
//! (`fi_context2`) for each operation in flight, so posting and completing
//! never allocate.
//!
//! shm in libfabric 1.17 and 1.18 matches a message that arrived before its
//! receive (an unexpected message) with the wrong tag mask: `smr_get_tag`
//! (prov/shm/src/smr_ep.c) takes an entry from the receive pool for the
//! message without setting its `ignore` field, and the unexpected queue's
//! match function, `smr_match_tagged`, applies the *queue entry's* `ignore`
//! rather than the new receive's. The mask used is therefore the one of
//! whichever receive last used that pool entry, or zero for an entry never
//! used (the pool is calloc'ed). A receive that ignores tag bits (tally's
//! server ignores the sequence number) then never matches an unexpected
//! message that landed in a fresh entry: it waits forever. (Introduced by
//! "prov/shm: implement shared receive queue internally", 9cf1cb7, first
//! in v1.17.0; 1.19's util_srx matches with the receive's own mask.) The
//! workaround: an shm endpoint uses one tag mask for all its receives, and
//! the first receive with a non-zero mask first stamps that mask on every
//! entry of the pool (posts a receive into each entry, then cancels them all;
//! see `prime_shm_receive_pool`). Every entry then carries the endpoint's
//! mask whatever it was last used for, and matching is exact again.
//!
//! shm also completes an endpoint's sends strictly in order: a send larger
//! than its inject size (4 KiB) takes an entry of the sender's response
//! queue, which the receiver marks done once it has copied the data, and
//! `smr_progress_resp` (prov/shm/src/smr_progress.c) stops at the first
//! entry still `FI_EBUSY`. A send that its receiver never processes (the
//! peer process was killed, or its endpoint closed or canceled the
//! receive) therefore holds up the completion of every later send of the
//! endpoint, to every peer, for good; nothing in the provider clears it
//! (`fi_cancel` only cancels receives, and `fi_av_remove` of that peer makes
//! the next progress call crash on the pending entry). An owner that gives
//! up on such a send says so with [`Endpoint::abandon`]; the endpoint then
//! refuses every further send (`FI_EIO`, the reason in the call name) so
//! that work waiting on it fails at once instead of hanging.
use super::call_watch::{Call, CallWatch};
use super::error::{FabricError, PollError};
use super::info::{Hints, InfoList};
use super::sys;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

mod complete;
mod post;
mod unexpected;
pub use unexpected::provider_can_sweep;

/// An address-vector entry: a peer endpoint this endpoint can reach.
pub type PeerAddr = sys::fi_addr_t;

/// Longest endpoint name tally carries (shm names are strings; EFA's are 32 bytes).
pub const MAX_NAME_LEN: usize = 256;

/// An endpoint's address as bytes, for exchange over the control plane.
#[derive(Clone, PartialEq, Eq)]
pub struct EndpointName {
    len: usize,
    bytes: [u8; MAX_NAME_LEN],
}

impl EndpointName {
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.is_empty() || b.len() > MAX_NAME_LEN {
            return None;
        }
        let mut bytes = [0u8; MAX_NAME_LEN];
        bytes[..b.len()].copy_from_slice(b);
        Some(EndpointName { len: b.len(), bytes })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::fmt::Debug for EndpointName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EndpointName(")?;
        for b in self.as_bytes().iter().take(32) {
            write!(f, "{b:02x}")?;
        }
        write!(f, "{})", if self.len > 32 { "..." } else { "" })
    }
}

/// How an [`Endpoint`] is built.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    pub hints: Hints,
    /// Completion queue depth (0: provider default).
    pub cq_size: usize,
    /// Operations that may be in flight at once: the size of the context table.
    pub contexts: u32,
    /// Open the CQ with a wait object so an idle poller can sleep on it
    /// (adaptive polling). Providers without wait objects (EFA) fall back to
    /// a CQ without one; [`Endpoint::can_wait`] says which happened.
    pub wait_object: bool,
}

impl EndpointConfig {
    pub fn new(provider: &str) -> Self {
        EndpointConfig { hints: Hints::new(provider), cq_size: 0, contexts: 1024, wait_object: false }
    }
}

/// What a completed operation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The context id given when the operation was posted.
    pub context: u32,
    /// True for a receive, false for a send.
    pub is_recv: bool,
    /// Bytes received (receives only).
    pub len: usize,
    /// The tag the message carried (receives only).
    pub tag: u64,
}

/// A registration of memory on an endpoint's domain. Copyable: it is a
/// handle; the registration itself is owned by the endpoint and lives until
/// the endpoint is dropped or [`Endpoint::deregister`] is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryHandle {
    index: u32,
    desc: *mut c_void,
    /// Start and length of the registered range.
    pub addr: usize,
    pub len: usize,
}

// SAFETY: the descriptor is an opaque token the provider hands back to itself;
// it is only dereferenced by the provider on the endpoint's owning thread.
unsafe impl Send for MemoryHandle {}

/// One operation's context. All zeroes is a valid free one (null provider
/// scratch, not in flight): the table is allocated zeroed and its pages
/// become resident only once operations use them ([`zeroed_contexts`]).
/// The id is the index in the table.
#[repr(C)]
struct OpContext {
    /// Provider scratch space; must come first: libfabric gets a pointer to it.
    fi: sys::fi_context2,
    in_flight: bool,
    /// Whether the operation in flight (or last posted) is a send.
    is_send: bool,
}

/// A table of `n` free contexts, allocated zeroed. The table is sized for
/// the largest jobs the server admits (max_jobs x max_window x max_ranks x 2
/// per lcore: 36 MiB at the defaults), but zeroed memory of that size comes
/// straight from the kernel as untouched pages, so a job costs resident
/// memory only for the contexts it uses.
fn zeroed_contexts(n: usize) -> Box<[OpContext]> {
    if n == 0 {
        return Box::new([]);
    }
    let layout = std::alloc::Layout::array::<OpContext>(n).expect("context table size");
    // SAFETY: the layout is non-zero in size (n > 0); all zeroes is a valid
    // OpContext (null pointers, false flags); the box owns the allocation,
    // made with the global allocator and this very layout.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<OpContext>();
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(ptr::slice_from_raw_parts_mut(p, n))
    }
}

/// The refusal of a send once an abandoned one blocks the endpoint (shm).
const SENDS_BLOCKED: &str = "fi_tsend (refused: an earlier send to a vanished peer never completes, and shm completes an endpoint's \
     sends in order, so none can complete on this endpoint any more)";

/// Requested MR keys must be unique within a domain for tcp before 2.2 and for
/// providers without FI_MR_PROV_KEY; one process-wide counter keeps them so.
static NEXT_MR_KEY: AtomicU64 = AtomicU64::new(1);

pub struct Endpoint {
    info: InfoList,
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    av: *mut sys::fid_av,
    cq: *mut sys::fid_cq,
    ep: *mut sys::fid_ep,
    mrs: Vec<*mut sys::fid_mr>,
    contexts: Box<[OpContext]>,
    in_flight: u32,
    can_wait: bool,
    provider: String,
    wait_fd: Option<i32>,
    /// shm 1.17/1.18 only (see the module doc): the tag mask every entry of
    /// the provider's receive pool carries, 0 until the first receive with
    /// a mask primes the pool. `None` for providers without the defect.
    shm_rx_mask: Option<u64>,
    /// shm (module doc): sends complete in order, so an abandoned send
    /// blocks every later one.
    in_order_sends: bool,
    /// Set when a send was abandoned on an endpoint with `in_order_sends`:
    /// sends are refused from then on.
    sends_blocked: bool,
    /// `fi_tinject`'s limit, 0 where tally does not inject
    /// (TALLY_INJECT=0, or the provider offers none).
    inject_size: usize,
    /// Which provider call the owner is inside (see [`super::call_watch`]).
    watch: std::sync::Arc<super::call_watch::CallWatch>,
}

// SAFETY: every libfabric object here belongs to one FI_THREAD_DOMAIN domain,
// which requires that only one thread use it at a time. `Endpoint` is not
// Sync and all data-path methods take &mut self, so moving it to another
// thread (once, at lcore start-up) is the only way a second thread sees it.
unsafe impl Send for Endpoint {}

macro_rules! check {
    ($call:literal, $e:expr) => {{
        let ret = $e as isize;
        if ret < 0 {
            return Err(FabricError::from_ret($call, ret));
        }
        ret
    }};
}

/// What [`Endpoint::settle`] does with the sends still in flight among the
/// contexts it settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingSends {
    /// Count them: their contexts are to name new operations, and a late
    /// completion would be taken for one of those.
    Wait,
    /// Forget them ([`Endpoint::forget`] says when that is right: their
    /// peer's process is gone).
    Forget,
    /// Leave them out: only the receives' buffers are wanted back (a send
    /// never writes into its buffer).
    Ignore,
}

impl Endpoint {
    /// Opens fabric, domain, AV, CQ and endpoint for the first interface the
    /// hints match, and enables the endpoint.
    pub fn open(cfg: &EndpointConfig) -> Result<Endpoint, FabricError> {
        let info = InfoList::get(&cfg.hints)?;
        let provider = info.provider_name();
        if provider == "shm" {
            // Before this process creates its first shm region (fi_enable).
            super::shm::sweep_before_first_endpoint();
        }
        let contexts = zeroed_contexts(cfg.contexts as usize);
        let mut me = Endpoint {
            info,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            av: ptr::null_mut(),
            cq: ptr::null_mut(),
            ep: ptr::null_mut(),
            mrs: Vec::new(),
            contexts,
            in_flight: 0,
            can_wait: false,
            shm_rx_mask: Self::stale_mask_quirk(&provider).then_some(0),
            in_order_sends: Self::in_order_send_quirk(&provider),
            sends_blocked: false,
            inject_size: 0,
            watch: Default::default(),
            provider,
            wait_fd: None,
        };
        // On any failure `me` is dropped, closing whatever was opened so far.
        me.open_objects(cfg)?;
        me.wait_fd = me.query_wait_fd();
        me.inject_size = if std::env::var("TALLY_INJECT").is_ok_and(|v| v == "0") { 0 } else { me.info.inject_size() };
        Ok(me)
    }

    fn open_objects(&mut self, cfg: &EndpointConfig) -> Result<(), FabricError> {
        let info = self.info.head;
        // SAFETY: info is a valid fi_info from fi_getinfo; each out-pointer
        // is a field of self that Drop closes if non-null; the objects are
        // created in dependency order (fabric, domain, av/cq, ep).
        unsafe {
            check!("fi_fabric", sys::fi_fabric((*info).fabric_attr, &mut self.fabric, ptr::null_mut()));
            check!("fi_domain", sys::fi_domain(self.fabric, info, &mut self.domain, ptr::null_mut()));
            let mut av_attr = sys::fi_av_attr { type_: sys::fi_av_type_FI_AV_TABLE, ..Default::default() };
            check!("fi_av_open", sys::fi_av_open(self.domain, &mut av_attr, &mut self.av, ptr::null_mut()));
            let mut cq_attr = sys::fi_cq_attr {
                size: cfg.cq_size,
                format: sys::fi_cq_format_FI_CQ_FORMAT_TAGGED,
                wait_obj: if cfg.wait_object { sys::fi_wait_obj_FI_WAIT_UNSPEC } else { sys::fi_wait_obj_FI_WAIT_NONE },
                wait_cond: sys::fi_cq_wait_cond_FI_CQ_COND_NONE,
                ..Default::default()
            };
            let ret = sys::fi_cq_open(self.domain, &mut cq_attr, &mut self.cq, ptr::null_mut());
            if ret != 0 && cfg.wait_object {
                // EFA has no CQ wait objects: an adaptive poller sleeps instead.
                cq_attr.wait_obj = sys::fi_wait_obj_FI_WAIT_NONE;
                self.cq = ptr::null_mut();
                check!("fi_cq_open", sys::fi_cq_open(self.domain, &mut cq_attr, &mut self.cq, ptr::null_mut()));
            } else {
                check!("fi_cq_open", ret);
                self.can_wait = cfg.wait_object;
            }
            check!("fi_endpoint", sys::fi_endpoint(self.domain, info, &mut self.ep, ptr::null_mut()));
            check!("fi_ep_bind(av)", sys::fi_ep_bind(self.ep, &mut (*self.av).fid, 0));
            check!("fi_ep_bind(cq)", sys::fi_ep_bind(self.ep, &mut (*self.cq).fid, sys::FI_TRANSMIT as u64 | sys::FI_RECV as u64));
            check!("fi_enable", sys::fi_enable(self.ep));
        }
        Ok(())
    }

    /// Whether `provider` (at this library version) matches unexpected
    /// messages with a pool entry's stale tag mask (the module doc).
    fn stale_mask_quirk(provider: &str) -> bool {
        let v = super::info::library_version();
        provider == "shm" && ((1, 17)..(1, 19)).contains(&v)
    }

    /// Whether `provider` completes sends strictly in order, so that one that
    /// never completes blocks the rest (the module doc). shm's response queue
    /// works that way from 1.17 through 2.0 at least.
    fn in_order_send_quirk(provider: &str) -> bool {
        let v = super::info::library_version();
        provider == "shm" && ((1, 17)..=(2, 0)).contains(&v)
    }

    /// The provider actually in use (e.g. `tcp;ofi_rxm`).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The domain (NIC) name.
    pub fn domain_name(&self) -> String {
        self.info.domain_name()
    }

    pub fn max_msg_size(&self) -> usize {
        self.info.max_msg_size()
    }

    /// Whether the provider wants local buffers registered (`FI_MR_LOCAL`).
    pub fn needs_local_mr(&self) -> bool {
        self.info.mr_mode() & sys::FI_MR_LOCAL != 0
    }

    /// Whether [`Endpoint::wait`] sleeps on a descriptor that traffic wakes
    /// (otherwise it naps).
    pub fn can_wait(&self) -> bool {
        self.wait_fd.is_some()
    }

    /// Operations posted and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    pub fn context_capacity(&self) -> u32 {
        self.contexts.len() as u32
    }

    /// This endpoint's address, to hand to peers.
    pub fn name(&self) -> Result<EndpointName, FabricError> {
        let mut buf = [0u8; MAX_NAME_LEN];
        let mut len = MAX_NAME_LEN;
        // SAFETY: buf has len bytes; fi_getname writes at most len and
        // updates len (or fails with FI_ETOOSMALL).
        unsafe {
            check!("fi_getname", sys::fi_getname(&mut (*self.ep).fid, buf.as_mut_ptr().cast(), &mut len));
        }
        Ok(EndpointName::from_bytes(&buf[..len.min(MAX_NAME_LEN)]).expect("non-empty endpoint name"))
    }

    /// Makes a peer reachable; the returned address is used to send to it and
    /// to direct receives at it.
    pub fn insert_peer(&mut self, name: &EndpointName) -> Result<PeerAddr, FabricError> {
        let mut addr: sys::fi_addr_t = 0;
        // SAFETY: name bytes are a provider address of the same format (the
        // peer's fi_getname output); one address is inserted into addr.
        let n = unsafe { sys::fi_av_insert(self.av, name.as_bytes().as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut()) };
        if n != 1 {
            return Err(FabricError { call: "fi_av_insert", code: if n < 0 { -n } else { sys::FI_EINVAL as i32 } });
        }
        Ok(addr)
    }

    /// Forgets a peer (its job ended). Operations to it must have completed.
    pub fn remove_peer(&mut self, addr: PeerAddr) -> Result<(), FabricError> {
        let mut a = addr;
        // SAFETY: one address from this AV; the AV is open.
        let ret = unsafe { sys::fi_av_remove(self.av, &mut a, 1, 0) };
        if ret != 0 {
            return Err(FabricError::from_ret("fi_av_remove", ret as isize));
        }
        Ok(())
    }

    /// Registers `len` bytes at `addr` for sends and receives.
    ///
    /// # Safety
    /// The memory must stay mapped until the endpoint is dropped or the
    /// registration is removed with [`Endpoint::deregister`].
    pub unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<MemoryHandle, FabricError> {
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        let key = NEXT_MR_KEY.fetch_add(1, Ordering::Relaxed);
        let access = (sys::FI_SEND | sys::FI_RECV | sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE) as u64;
        // SAFETY: the caller keeps [addr, addr+len) mapped while registered;
        // the domain is open.
        unsafe {
            check!("fi_mr_reg", sys::fi_mr_reg(self.domain, addr.cast(), len, access, 0, key, 0, &mut mr, ptr::null_mut()));
            let desc = sys::fi_mr_desc(mr);
            self.mrs.push(mr);
            Ok(MemoryHandle { index: (self.mrs.len() - 1) as u32, desc, addr: addr as usize, len })
        }
    }

    /// Removes a registration. Operations on it must have completed.
    pub fn deregister(&mut self, mh: MemoryHandle) -> Result<(), FabricError> {
        let slot = self.mrs.get_mut(mh.index as usize).ok_or(FabricError { call: "fi_close(mr)", code: sys::FI_EINVAL as i32 })?;
        if slot.is_null() {
            return Ok(());
        }
        // SAFETY: the MR is open (non-null) and closed exactly once.
        let ret = unsafe { sys::fi_close(&mut (**slot).fid) };
        *slot = ptr::null_mut();
        if ret != 0 {
            return Err(FabricError::from_ret("fi_close(mr)", ret as isize));
        }
        Ok(())
    }

    /// Which provider call this endpoint's owner is inside, for a watchdog
    /// on another thread (see [`super::call_watch`]).
    pub fn call_watch(&self) -> std::sync::Arc<CallWatch> {
        self.watch.clone()
    }

    /// Whether the operation named by `context` is in flight.
    pub fn is_in_flight(&self, context: u32) -> bool {
        self.contexts.get(context as usize).is_some_and(|c| c.in_flight)
    }

    /// The owner gives up waiting for the operations named by `contexts` that
    /// are still in flight (their peer vanished). They stay in flight: the
    /// provider may still complete them, and their buffers stay its own until
    /// then or until the endpoint is dropped. Returns how many of them are sends.
    ///
    /// With shm (module doc) an abandoned send blocks the completion of every
    /// later send of this endpoint: from then on [`Endpoint::sends_blocked`]
    /// is true and every send is refused with `FI_EIO`, so the owner should
    /// fail whatever still waits for a send completion here.
    pub fn abandon(&mut self, contexts: std::ops::Range<u32>) -> u32 {
        let sends = contexts.filter(|&c| self.contexts.get(c as usize).is_some_and(|x| x.in_flight && x.is_send)).count() as u32;
        if sends > 0 && self.in_order_sends && !self.sends_blocked {
            self.sends_blocked = true;
            log::warn!(
                "{}: {sends} send(s) to a vanished peer never completed; this provider completes sends in order, so this endpoint refuses all further sends",
                self.provider
            );
        }
        sends
    }

    /// Forgets the operations named by `contexts` that are still in flight:
    /// their context ids become free for new operations. Only for
    /// operations the provider has dropped: tcp;ofi_rxm (1.17) discards the
    /// sends queued on a connection that failed (the peer process died and
    /// its kernel reset the connection) without ever completing them, and
    /// never touches their buffers again. Returns how many were forgotten.
    pub fn forget(&mut self, contexts: std::ops::Range<u32>) -> u32 {
        let mut n = 0;
        for c in contexts {
            if let Some(ctx) = self.contexts.get_mut(c as usize) {
                if ctx.in_flight {
                    ctx.in_flight = false;
                    n += 1;
                }
            }
        }
        self.in_flight -= n;
        n
    }

    /// Before the owner names new operations with `contexts` again (a
    /// server taken back reuses its lost streams' ids), or hands their
    /// receive buffers to others: how many of the operations they last
    /// named are still in flight. Receives among them are asked to cancel
    /// (again: a cancel asked for earlier may have come while the provider
    /// still held the receive); `sends` says what is done with sends. 0: no
    /// completion can name them any more (with [`PendingSends::Ignore`]:
    /// no receive), and no receive writes into their buffers.
    pub fn settle(&mut self, contexts: std::ops::Range<u32>, sends: PendingSends) -> u32 {
        let mut left = 0;
        for c in contexts {
            let Some(ctx) = self.contexts.get(c as usize) else { continue };
            match (ctx.in_flight, ctx.is_send, sends) {
                (false, _, _) | (true, true, PendingSends::Ignore) => {}
                (true, true, PendingSends::Forget) => {
                    self.forget(c..c + 1);
                }
                (true, true, PendingSends::Wait) => left += 1,
                (true, false, _) => {
                    self.cancel(c);
                    left += 1;
                }
            }
        }
        left
    }

    /// Whether the provider completes this endpoint's sends strictly in
    /// order, whatever their peer (shm: see the module doc).
    pub fn in_order_sends(&self) -> bool {
        self.in_order_sends
    }

    /// Whether sends are refused because an abandoned send blocks them (shm).
    pub fn sends_blocked(&self) -> bool {
        self.sends_blocked
    }

    /// Asks the provider to cancel one operation. A canceled operation
    /// completes with an `FI_ECANCELED` error completion (which frees its
    /// context); one that already finished completes normally.
    pub fn cancel(&mut self, context: u32) {
        if let Some(ctx) = self.contexts.get_mut(context as usize) {
            if ctx.in_flight {
                let p: *mut c_void = (ctx as *mut OpContext).cast();
                self.watch.enter(Call::Cancel);
                // SAFETY: ep is open; p names an operation we posted and that
                // has not completed, so the provider still knows it.
                unsafe { sys::fi_cancel(&mut (*self.ep).fid, p) };
                self.watch.leave();
            }
        }
    }

    /// Cancels every operation in flight and drains their completions (bounded).
    /// Used at stop so that no buffer is still owned by the provider.
    pub fn cancel_all(&mut self) {
        // (Nothing in flight: no need to read the whole table in.)
        for i in (0..self.contexts.len()).take_while(|_| self.in_flight > 0) {
            if self.contexts[i].in_flight {
                let p: *mut c_void = (&mut self.contexts[i] as *mut OpContext).cast();
                // SAFETY: ep is open; p is the context of an operation we posted.
                unsafe { sys::fi_cancel(&mut (*self.ep).fid, p) };
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
        let mut scratch = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
        while self.in_flight > 0 && std::time::Instant::now() < deadline {
            match self.poll(&mut scratch) {
                Ok(0) => std::thread::yield_now(),
                Ok(_) | Err(PollError::Completion(_)) => {}
                Err(PollError::Fabric(_)) => break,
            }
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if self.in_flight > 0 && !self.ep.is_null() {
            // Operations the provider never returned (sends queued to a peer
            // that vanished or whose link is down; the owner canceled what it
            // could). Closing tcp;ofi_rxm with such sends queued crashes in
            // libfabric 1.17, so the endpoint and everything it references
            // (MRs, context table) are left open: with manual progress
            // nothing runs in them any more, and the process's exit, or for a
            // long-lived process a bounded leak per failed endpoint, is the
            // lesser harm.
            log::warn!(
                "{}: closing with {} operation(s) the provider never returned; leaving the endpoint open instead of risking a crash",
                self.provider,
                self.in_flight
            );
            std::mem::forget(std::mem::take(&mut self.contexts));
            std::mem::forget(std::mem::take(&mut self.mrs));
            return;
        }
        // SAFETY: each object is closed once, children before parents: the
        // endpoint (which stops all access to posted buffers), then MRs, CQ,
        // AV, domain, fabric. Null pointers were never opened.
        unsafe {
            if !self.ep.is_null() {
                sys::fi_close(&mut (*self.ep).fid);
            }
            for mr in self.mrs.drain(..) {
                if !mr.is_null() {
                    sys::fi_close(&mut (*mr).fid);
                }
            }
            if !self.cq.is_null() {
                sys::fi_close(&mut (*self.cq).fid);
            }
            if !self.av.is_null() {
                sys::fi_close(&mut (*self.av).fid);
            }
            if !self.domain.is_null() {
                sys::fi_close(&mut (*self.domain).fid);
            }
            if !self.fabric.is_null() {
                sys::fi_close(&mut (*self.fabric).fid);
            }
        }
    }
}
