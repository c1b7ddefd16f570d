//! Completions: polling the completion queue (which drives the provider's
//! progress), turning entries and error entries into [`Completion`]s and
//! [`CompletionError`]s and freeing their contexts, and waiting on the
//! queue's wait object. Nothing here allocates, an error included.
use super::{Completion, Endpoint, OpContext};
use crate::dataplane::fabric::call_watch::Call;
use crate::dataplane::fabric::error::{CompletionError, FabricError, PollError};
use crate::dataplane::fabric::sys;
use std::ffi::c_void;

impl Endpoint {
    /// Reads up to `out.len()` completions (and drives the provider's
    /// progress). Returns how many were written. An error completion is
    /// returned as `Err(PollError::Completion)` after the completions read
    /// before it; the endpoint stays usable.
    // The error carries the provider's message in place (`CompletionError`
    // has a fixed text buffer): reporting a failed operation must not
    // allocate inside the poll loop, so it stays large.
    #[allow(clippy::result_large_err)]
    pub fn poll(&mut self, out: &mut [Completion]) -> Result<usize, PollError> {
        const BATCH: usize = 16;
        // Not zeroed: a busy poller calls this millions of times a second,
        // mostly to find nothing, and zeroing 768 bytes each time was a
        // visible share of a polling client's loop (perf, device).
        type Entry = std::mem::MaybeUninit<sys::fi_cq_tagged_entry>;
        let mut entries = [const { Entry::uninit() }; BATCH];
        let want = out.len().min(BATCH);
        if want == 0 {
            return Ok(0);
        }

        self.watch.enter(Call::CqRead);
        // SAFETY: entries has room for `want` tagged entries (the CQ format).
        let ret = unsafe { sys::fi_cq_read(self.cq, entries.as_mut_ptr().cast(), want) };
        self.watch.leave();
        if ret > 0 {
            let n = (ret as usize).min(want);
            for (e, o) in entries[..n].iter().zip(out.iter_mut()) {
                // SAFETY: fi_cq_read wrote `ret` complete entries at the start of the array.
                *o = self.completion_of(unsafe { e.assume_init_ref() });
            }
            Ok(n)
        } else if ret == -(sys::FI_EAGAIN as isize) {
            Ok(0)
        } else if ret == -(sys::FI_EAVAIL as isize) {
            Err(PollError::Completion(self.read_error()))
        } else {
            Err(PollError::Fabric(FabricError::from_ret("fi_cq_read", ret)))
        }
    }

    fn completion_of(&mut self, e: &sys::fi_cq_tagged_entry) -> Completion {
        Completion {
            context: self.finish(e.op_context).unwrap_or(u32::MAX),
            is_recv: e.flags & sys::FI_RECV as u64 != 0,
            len: e.len,
            tag: e.tag,
        }
    }

    /// Marks the context behind an op_context pointer free; returns its id.
    fn finish(&mut self, op_context: *mut c_void) -> Option<u32> {
        if op_context.is_null() {
            return None;
        }
        let base = self.contexts.as_ptr() as usize;
        let off = (op_context as usize).wrapping_sub(base);
        let i = off / size_of::<OpContext>();
        if !off.is_multiple_of(size_of::<OpContext>()) || i >= self.contexts.len() {
            return None;
        }
        let ctx = &mut self.contexts[i];
        if ctx.in_flight {
            ctx.in_flight = false;
            self.in_flight -= 1;
        }
        Some(i as u32)
    }

    fn read_error(&mut self) -> CompletionError {
        let mut e = sys::fi_cq_err_entry::default();
        // SAFETY: e is a properly sized err entry; with err_data_size 0 the
        // provider may point err_data at its own buffer, valid until the next
        // CQ call, and fi_cq_strerror reads it immediately below.
        let ret = unsafe { sys::fi_cq_readerr(self.cq, &mut e, 0) };
        if ret < 0 {
            let fe = sys::fi_cq_err_entry { err: (-ret) as i32, ..Default::default() };
            return CompletionError::new(&fe, None, b"fi_cq_readerr failed");
        }
        let mut text = [0u8; 160];
        // SAFETY: text has text.len() bytes; fi_cq_strerror writes a NUL-terminated
        // string of at most that length and returns a pointer to a string
        // (ours or a static one) valid until the next CQ call.
        let s = unsafe {
            let p = sys::fi_cq_strerror(self.cq, e.prov_errno, e.err_data, text.as_mut_ptr().cast(), text.len());
            if p.is_null() {
                &b""[..]
            } else {
                std::ffi::CStr::from_ptr(p).to_bytes()
            }
        };
        let owned: [u8; 160] = {
            let mut b = [0u8; 160];
            let n = s.len().min(160);
            b[..n].copy_from_slice(&s[..n]);
            b
        };
        let n = s.len().min(160);
        let ctx = self.finish(e.op_context);
        CompletionError::new(&e, ctx, &owned[..n])
    }

    /// Sleeps until a completion may be ready or `timeout_ms` passes.
    ///
    /// Where the CQ has a wait file descriptor (tcp;ofi_rxm) this sleeps in
    /// `poll(2)` on it and wakes on traffic. shm (1.17) offers no descriptor
    /// and its `fi_cq_sread` ignores the timeout, and EFA has no CQ wait
    /// objects at all; there it naps for at most `NAP` instead.
    pub fn wait(&mut self, timeout_ms: i32) -> Result<(), FabricError> {
        self.wait_also(None, timeout_ms)
    }

    /// [`Endpoint::wait`], also woken when `wake_fd` (an eventfd another
    /// thread writes) becomes readable: a client's rail thread sleeps on its
    /// CQ and on the descriptor its owner writes after queueing work for it.
    pub fn wait_also(&mut self, wake_fd: Option<i32>, timeout_ms: i32) -> Result<(), FabricError> {
        const NAP: std::time::Duration = std::time::Duration::from_micros(50);
        let Some(fd) = self.wait_fd else {
            std::thread::sleep(NAP.min(std::time::Duration::from_millis(timeout_ms.max(0) as u64)));
            return Ok(());
        };
        // fi_trywait first: tcp;ofi_rxm hangs its sockets' readiness
        // under the CQ's descriptor only through it (the msg CQ's
        // trywait), and says -FI_EAGAIN when progress is due now.
        // Without it poll(2) slept its whole timeout while data sat
        // in the sockets.
        let mut fids = [self.cq_fid()];
        // SAFETY: fabric and CQ are open while self is; one fid in the array.
        if unsafe { sys::fi_trywait(self.fabric, fids.as_mut_ptr(), 1) } != 0 {
            return Ok(());
        }
        let pfd = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let mut pfds = [pfd(fd), pfd(wake_fd.unwrap_or(-1))];
        let n = if wake_fd.is_some() { 2 } else { 1 };
        // SAFETY: n valid pollfds: the CQ's descriptor, open while self is,
        // and the caller's, which it keeps open while it calls this.
        unsafe { libc::poll(pfds.as_mut_ptr(), n, timeout_ms) };
        Ok(())
    }

    fn cq_fid(&mut self) -> *mut sys::fid {
        // SAFETY: the CQ is open while self is; taking the address of its fid field.
        unsafe { &mut (*self.cq).fid as *mut sys::fid }
    }

    /// The CQ's wait file descriptor (FI_GETWAIT), if the provider has one.
    pub(super) fn query_wait_fd(&mut self) -> Option<i32> {
        if !self.can_wait {
            return None;
        }
        let mut fd: libc::c_int = -1;
        // SAFETY: FI_GETWAIT on a CQ opened with a wait object writes an int fd.
        let ret = unsafe { sys::fi_control(&mut (*self.cq).fid, sys::FI_GETWAIT as i32, (&mut fd as *mut libc::c_int).cast()) };
        (ret == 0 && fd >= 0).then_some(fd)
    }
}
