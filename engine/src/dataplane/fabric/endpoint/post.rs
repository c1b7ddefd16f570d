//! Posting: sends, injects and receives, each named by a context id of the
//! endpoint's table (taken here, given back on completion), and the shm
//! receive-pool workaround (see the `endpoint` module doc). Nothing here
//! allocates.
use super::{Endpoint, MemoryHandle, OpContext, PeerAddr, SENDS_BLOCKED};
use crate::dataplane::fabric::call_watch::Call;
use crate::dataplane::fabric::error::{FabricError, PostError};
use crate::dataplane::fabric::sys;
use std::ffi::c_void;
use std::ptr;

impl Endpoint {
    pub(super) fn take_context(&mut self, id: u32) -> Result<*mut c_void, PostError> {
        let ctx = self.contexts.get_mut(id as usize).ok_or(PostError::BadContext(id))?;
        if ctx.in_flight {
            return Err(PostError::ContextBusy(id));
        }
        Ok((ctx as *mut OpContext).cast())
    }

    fn desc_for(&self, mh: Option<MemoryHandle>, addr: usize, len: usize) -> Result<*mut c_void, PostError> {
        match mh {
            None => Ok(ptr::null_mut()),
            Some(m) => {
                let live = self.mrs.get(m.index as usize).is_some_and(|p| !p.is_null());
                if !live || addr < m.addr || addr + len > m.addr + m.len {
                    return Err(PostError::BadMemory);
                }
                Ok(m.desc)
            }
        }
    }

    pub(super) fn posted(&mut self, id: u32, ret: isize, call: &'static str, is_send: bool) -> Result<(), PostError> {
        if ret == 0 {
            let ctx = &mut self.contexts[id as usize];
            ctx.in_flight = true;
            ctx.is_send = is_send;
            self.in_flight += 1;
            Ok(())
        } else if ret == -(sys::FI_EAGAIN as isize) {
            Err(PostError::Again)
        } else {
            Err(PostError::Fabric(FabricError::from_ret(call, ret)))
        }
    }

    /// Posts a tagged send of `len` bytes at `buf` to `dest`.
    ///
    /// # Safety
    /// `[buf, buf+len)` must stay valid and unmodified until the completion
    /// for `context` has been returned by [`Endpoint::poll`] (or the endpoint
    /// is dropped).
    pub unsafe fn send(
        &mut self,
        buf: *const u8,
        len: usize,
        mh: Option<MemoryHandle>,
        dest: PeerAddr,
        tag: u64,
        context: u32,
    ) -> Result<(), PostError> {
        let ctx = self.take_context(context)?;
        let desc = self.desc_for(mh, buf as usize, len)?;
        if self.sends_blocked {
            return Err(PostError::Fabric(FabricError { call: SENDS_BLOCKED, code: sys::FI_EIO as i32 }));
        }
        self.watch.enter(Call::Send);
        // SAFETY: ep is open; the caller guarantees the buffer's lifetime;
        // ctx points into the context table, which outlives the operation.
        let ret = unsafe { sys::fi_tsend(self.ep, buf.cast(), len, desc, dest, tag, ctx) };
        self.watch.leave();
        self.posted(context, ret, "fi_tsend", true)
    }

    /// Messages of at most this many bytes may go with [`Endpoint::inject`]
    /// (0: none).
    pub fn inject_size(&self) -> usize {
        self.inject_size
    }

    /// Sends `len` bytes at `buf` to `dest` from a copy the provider takes
    /// now (`fi_tinject`): the buffer is free again when this returns, and
    /// no completion follows. For small messages this saves the send
    /// completion (a CQ entry written and read) and lets the sender reuse
    /// the buffer at once. `len` must be at most [`Endpoint::inject_size`].
    ///
    /// # Safety
    /// `[buf, buf+len)` must be valid for reads for the duration of the call.
    pub unsafe fn inject(&mut self, buf: *const u8, len: usize, dest: PeerAddr, tag: u64) -> Result<(), PostError> {
        if len > self.inject_size {
            return Err(PostError::Fabric(FabricError { call: "fi_tinject", code: sys::FI_EMSGSIZE as i32 }));
        }
        if self.sends_blocked {
            return Err(PostError::Fabric(FabricError { call: SENDS_BLOCKED, code: sys::FI_EIO as i32 }));
        }
        self.watch.enter(Call::Inject);
        // SAFETY: ep is open; the caller guarantees the buffer for the call's
        // duration, and inject copies it before returning.
        let ret = unsafe { sys::fi_tinject(self.ep, buf.cast(), len, dest, tag) };
        self.watch.leave();
        if ret == 0 {
            Ok(())
        } else if ret == -(sys::FI_EAGAIN as isize) {
            Err(PostError::Again)
        } else {
            Err(PostError::Fabric(FabricError::from_ret("fi_tinject", ret)))
        }
    }

    /// Posts a tagged receive into `[buf, buf+len)` for messages whose tag
    /// matches `tag` outside the bits set in `ignore`, from `src` (or anyone).
    ///
    /// With shm 1.17/1.18 all receives of an endpoint must use the same
    /// `ignore`; the first one with a non-zero mask must be posted while
    /// nothing is in flight and before any peer sends (it primes the
    /// provider's receive pool, see the module doc). A receive with another
    /// mask is refused with `FI_EINVAL`.
    ///
    /// # Safety
    /// `[buf, buf+len)` must stay valid, and must not be read or written by
    /// anyone else, until the completion for `context` has been returned by
    /// [`Endpoint::poll`] (or the endpoint is dropped).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn recv(
        &mut self,
        buf: *mut u8,
        len: usize,
        mh: Option<MemoryHandle>,
        src: Option<PeerAddr>,
        tag: u64,
        ignore: u64,
        context: u32,
    ) -> Result<(), PostError> {
        let ctx = self.take_context(context)?;
        let desc = self.desc_for(mh, buf as usize, len)?;
        if let Some(mask) = self.shm_rx_mask {
            if mask != ignore {
                self.prime_shm_receive_pool(ignore)?;
            }
        }
        self.watch.enter(Call::Recv);
        // SAFETY: as for send; the caller guarantees exclusive access to the buffer.
        let ret = unsafe { sys::fi_trecv(self.ep, buf.cast(), len, desc, src.unwrap_or(sys::FI_ADDR_UNSPEC), tag, ignore, ctx) };
        self.watch.leave();
        self.posted(context, ret, "fi_trecv", false)
    }

    /// Stamps `mask` on every entry of shm's receive pool (module doc): posts
    /// a zero-length receive with that mask into each free entry, directed at
    /// an address no peer has, then cancels them all and reads back their
    /// canceled completions. Once per endpoint, at its first masked receive.
    #[cold]
    #[inline(never)]
    fn prime_shm_receive_pool(&mut self, mask: u64) -> Result<(), PostError> {
        const ONE_MASK: &str = "fi_trecv (shm 1.17: one tag mask per endpoint, set by a receive posted while nothing is in flight)";
        if self.shm_rx_mask != Some(0) || self.in_flight != 0 {
            return Err(PostError::Fabric(FabricError { call: ONE_MASK, code: sys::FI_EINVAL as i32 }));
        }
        // An fi_addr_t no address vector hands out (shm's are small indices;
        // FI_ADDR_UNSPEC is u64::MAX), so no message matches these receives.
        const NOWHERE: sys::fi_addr_t = sys::FI_ADDR_UNSPEC - 1;
        let entries = self.info.rx_size().max(1).next_power_of_two();
        let mut scratch = vec![sys::fi_context2::default(); entries].into_boxed_slice();
        let mut posted = 0;
        let mut failure = None;
        for c in scratch.iter_mut() {
            let p: *mut c_void = (c as *mut sys::fi_context2).cast();
            // SAFETY: ep is open; a zero-length receive writes no buffer; its
            // context is an element of `scratch`, which stays allocated until
            // the receive's completion has been read below (or is leaked).
            let ret = unsafe { sys::fi_trecv(self.ep, ptr::null_mut(), 0, ptr::null_mut(), NOWHERE, !mask, mask, p) };
            if ret == 0 {
                posted += 1;
            } else {
                // ENOMEM: the pool is exhausted (entries held by unexpected
                // messages cannot be primed; the caller's contract excludes them).
                if ret != -(sys::FI_ENOMEM as isize) && ret != -(sys::FI_EAGAIN as isize) {
                    failure = Some(FabricError::from_ret("fi_trecv (priming shm's receive pool)", ret));
                }
                break;
            }
        }
        for c in scratch.iter_mut().take(posted) {
            // SAFETY: ep is open; c is the context of a receive posted above
            // that nothing can have matched (NOWHERE), so shm still holds it.
            unsafe { sys::fi_cancel(&mut (*self.ep).fid, (c as *mut sys::fi_context2).cast()) };
        }
        // shm writes each canceled completion inside fi_cancel; read them back.
        let range = scratch.as_ptr() as usize..scratch.as_ptr() as usize + entries * size_of::<sys::fi_context2>();
        let mut done = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while done < posted && std::time::Instant::now() < deadline {
            let mut entry = [sys::fi_cq_tagged_entry::default(); 16];
            // SAFETY: entry has room for 16 tagged entries (the CQ format).
            let ret = unsafe { sys::fi_cq_read(self.cq, entry.as_mut_ptr().cast(), entry.len()) };
            if ret > 0 {
                // Nothing else is in flight: only a priming receive can
                // complete, and only if a message from a sender outside the
                // AV matched it. Done either way.
                done += entry[..ret as usize].iter().filter(|e| range.contains(&(e.op_context as usize))).count();
            } else if ret == -(sys::FI_EAVAIL as isize) {
                let mut e = sys::fi_cq_err_entry::default();
                // SAFETY: e is a properly sized error entry.
                if unsafe { sys::fi_cq_readerr(self.cq, &mut e, 0) } > 0 && range.contains(&(e.op_context as usize)) {
                    done += 1;
                }
            } else if ret != -(sys::FI_EAGAIN as isize) {
                failure.get_or_insert(FabricError::from_ret("fi_cq_read (priming shm's receive pool)", ret));
                break;
            }
        }
        if done < posted {
            // The provider may still point into `scratch`: it must outlive the endpoint.
            Box::leak(scratch);
            return Err(PostError::Fabric(
                failure.unwrap_or(FabricError { call: "fi_cancel (priming shm's receive pool)", code: sys::FI_ETIMEDOUT as i32 }),
            ));
        }
        if let Some(f) = failure {
            return Err(PostError::Fabric(f));
        }
        self.shm_rx_mask = Some(mask);
        log::debug!("shm: stamped tag mask {mask:#x} on {posted} receive pool entries (libfabric 1.17 unexpected-message matching)");
        Ok(())
    }
}
