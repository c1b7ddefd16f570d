//! `bench allreduce --mode agg-plugin`: all-reduce through the NCCL plugin,
//! driven the way NCCL drives a ncclCollNet.
//!
//! Each rank process loads `libnccl-net-tally.so` as NCCL does (dlopen,
//! RTLD_NOW | RTLD_LOCAL, the `ncclCollNetPlugin_v11` table), then replays
//! NCCL's sequence: init with a logger, devices, getProperties, listen, an
//! exchange of every rank's handle (NCCL's bootstrap allgather; here tally's
//! bootstrap), the collective connect, regMr of the user buffers, and per
//! all-reduce several iallreduce pieces in flight, each tested until done, as
//! NCCL's proxy pipelines a CollNet all-reduce: pieces of NCCL's size for the
//! all-reduce's size over the plugin's default channels, and NCCL's steps in
//! flight ([`nccl_collnet_step`]). On drop: deregMr, closeColl,
//! finalize. The plugin finds the servers in `TALLY_SERVERS`, which this
//! sets from `--servers` before the library is loaded. This is as close to
//! NCCL's own use as a host without GPUs gets.
//!
//! The sequence itself is [`CollNet`]: one rank's context and communicator,
//! each step one method in NCCL's order, so that the plugin's tests
//! (ffi-plugin/tests/plugin_collnet.rs, plugin_drain.rs) drive it through the same
//! code as the benchmark ([`CollNetDriver`]: the net context, a [`CollNet`]
//! and the piece pipeline of one all-reduce).
#[path = "../../ffi-plugin/src/abi.rs"]
pub mod abi;

use abi::{
    CollNetV11, NcclLogger, NetCommConfig, NetV11, NCCL_LOG_INFO, NCCL_LOG_WARN, NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_HOST, NCCL_SUCCESS,
};
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::ring::bootstrap::Bootstrap;

/// A listen handle, as ranks exchange them before the collective connect.
pub type Handle = [u8; NCCL_NET_HANDLE_MAXSIZE];

/// The plugin logs with format "%s" and one string argument (ffi-plugin's
/// log.rs): this fixed-argument function reads exactly that.
unsafe extern "C" fn nccl_log(level: c_int, _flags: c_ulong, _file: *const c_char, _line: c_int, _fmt: *const c_char, msg: *const c_char) {
    if msg.is_null() {
        return;
    }
    // SAFETY: the plugin passes a NUL-terminated message.
    let m = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    // NCCL's levels (NONE 0, VERSION 1, WARN 2, INFO 3, ...).
    match level {
        NCCL_LOG_WARN => log::warn!("{m}"),
        NCCL_LOG_INFO => log::info!("{m}"),
        _ => log::debug!("{m}"),
    }
}

fn logger() -> Option<NcclLogger> {
    type Fixed = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, *const c_char);
    let f: Fixed = nccl_log;
    // SAFETY: the plugin only ever calls with the arguments `Fixed` names
    // (format "%s" plus one string), passed in the same registers.
    Some(unsafe { std::mem::transmute::<Fixed, NcclLogger>(f) })
}

/// The library next to the `tally` binary (as `make` and `make dist` put it).
pub fn default_library() -> PathBuf {
    let dir = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)).unwrap_or_default();
    for name in ["libnccl-net-tally.so", "libnccl_net_tally.so", "../lib/libnccl-net-tally.so"] {
        if dir.join(name).exists() {
            return dir.join(name);
        }
    }
    dir.join("libnccl-net-tally.so")
}

fn check(what: &str, rc: c_int) -> Result<(), String> {
    if rc == NCCL_SUCCESS {
        Ok(())
    } else {
        Err(format!("ncclCollNet {what} returned {rc}"))
    }
}

/// The plugin's v11 tables: the net (CollNet's device rides on net device 0)
/// and CollNet.
#[derive(Clone, Copy)]
pub struct Tables {
    pub net: &'static NetV11,
    pub coll: &'static CollNetV11,
}

/// Loads the plugin as NCCL does (dlopen, RTLD_NOW | RTLD_LOCAL) and finds its
/// v11 tables. Loading a path again gives the same library and tables.
pub fn load(lib: &Path) -> Result<Tables, String> {
    let c = CString::new(lib.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path; the handle is never closed (NCCL
    // keeps its plugins loaded, and the plugin is built -z nodelete).
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a NUL-terminated message after a failure.
        let e = unsafe { CStr::from_ptr(libc::dlerror()) }.to_string_lossy().into_owned();
        return Err(format!("cannot load the NCCL plugin {}: {e} (--plugin PATH)", lib.display()));
    }
    // SAFETY: live handle, NUL-terminated names.
    let (pn, pc) = unsafe { (libc::dlsym(h, c"ncclNetPlugin_v11".as_ptr()), libc::dlsym(h, c"ncclCollNetPlugin_v11".as_ptr())) };
    if pn.is_null() || pc.is_null() {
        return Err(format!("{} exports no ncclNetPlugin_v11 / ncclCollNetPlugin_v11", lib.display()));
    }
    // SAFETY: the symbols are the plugin's static v11 tables (layouts pinned in abi.rs).
    let (net, coll) = unsafe { (&*(pn as *const NetV11), &*(pc as *const CollNetV11)) };
    Ok(Tables { net, coll })
}

/// An iallreduce in flight, as [`CollNet::post`] handed it out: only a
/// request the plugin gave can be tested.
#[derive(Clone, Copy, Debug)]
pub struct Request(*mut c_void);

/// One rank's ncclCollNet context and communicator, driven step by step in
/// NCCL's order: [`init`](CollNet::init), [`devices`](CollNet::devices),
/// [`connect`](CollNet::connect) (listen, the handle exchange, the
/// collective connect, closeListen), [`reg_mr`](CollNet::reg_mr),
/// [`post`](CollNet::post) and [`test`](CollNet::test) (or
/// [`wait_all`](CollNet::wait_all)), then [`close`](CollNet::close)
/// (deregMr of every buffer, closeColl, finalize), which drop does quietly
/// when it was not called.
pub struct CollNet {
    t: &'static CollNetV11,
    ctx: *mut c_void,
    /// NULL until [`CollNet::connect`].
    comm: *mut c_void,
    /// (address, length, handle) of every buffer registered with regMr.
    mrs: Vec<(usize, usize, *mut c_void)>,
    closed: bool,
}

impl CollNet {
    /// ncclCollNet init: a context for the job `comm_id`, logging to `logger`.
    pub fn init(t: &'static CollNetV11, comm_id: u64, logger: Option<NcclLogger>) -> Result<CollNet, String> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: a live out-pointer; the logger takes NCCL's calling convention.
        check("init", unsafe { (t.init)(&mut ctx, comm_id, logger) })?;
        Ok(CollNet { t, ctx, comm: std::ptr::null_mut(), mrs: Vec::new(), closed: false })
    }

    /// The CollNet devices the plugin offers (none without servers).
    pub fn devices(&self) -> Result<c_int, String> {
        let mut ndev: c_int = 0;
        // SAFETY: a live out-pointer.
        check("devices", unsafe { (self.t.devices)(&mut ndev) })?;
        Ok(ndev)
    }

    /// Listens on device 0, hands this rank's handle to `exchange` (NCCL's
    /// bootstrap allgather: every rank's handle, in rank order), connects
    /// rank `rank` of `nranks` (collective) and closes the listener.
    pub fn connect(
        &mut self,
        rank: usize,
        nranks: usize,
        exchange: impl FnOnce(&Handle) -> Result<Vec<Handle>, String>,
    ) -> Result<(), String> {
        let mut handle: Handle = [0; NCCL_NET_HANDLE_MAXSIZE];
        let mut listen = std::ptr::null_mut();
        // SAFETY: a live context, a handle buffer of the ABI's size and an out-pointer.
        check("listen", unsafe { (self.t.listen)(self.ctx, 0, handle.as_mut_ptr().cast(), &mut listen) })?;
        let mut all = exchange(&handle)?;
        if all.len() != nranks {
            return Err(format!("the handle exchange gave {} handles for {nranks} ranks", all.len()));
        }
        let mut ptrs: Vec<*mut c_void> = all.iter_mut().map(|h| h.as_mut_ptr().cast()).collect();
        // SAFETY: nranks handle pointers that outlive the call, a live listen comm, an out-pointer.
        check("connect", unsafe { (self.t.connect)(ptrs.as_mut_ptr(), nranks as c_int, rank as c_int, listen, &mut self.comm) })?;
        // SAFETY: closed once, after connect, as NCCL does.
        check("closeListen", unsafe { (self.t.close_listen)(listen) })
    }

    /// The communicator, for calls beyond the sequence (a test's bad arguments).
    pub fn comm(&self) -> *mut c_void {
        self.comm
    }

    /// regMr of `len` bytes at `p` (host memory), once per buffer: a range
    /// inside one registered before reuses its handle. The buffer must stay
    /// valid until [`CollNet::close`] (or drop) deregisters it.
    pub fn reg_mr(&mut self, p: *const u8, len: usize) -> Result<*mut c_void, String> {
        let a = p as usize;
        if let Some(&(_, _, mh)) = self.mrs.iter().find(|(s, l, _)| *s <= a && a + len <= s + l) {
            return Ok(mh);
        }
        let mut mh = std::ptr::null_mut();
        // SAFETY: live comm; the caller keeps the buffer valid while registered.
        check("regMr", unsafe { (self.t.reg_mr)(self.comm, p as *mut c_void, len, NCCL_PTR_HOST, &mut mh) })?;
        self.mrs.push((a, len, mh));
        Ok(mh)
    }

    /// One iallreduce of `count` elements: Some(request), or None when the
    /// plugin did not take it now (NCCL tries again after testing others).
    ///
    /// # Safety
    /// `send` and `recv` hold `count` elements of `dtype`, inside the
    /// buffers of `smh` and `rmh`, and stay valid (`send` unchanged) until
    /// the request completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn post(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: c_int,
        op: c_int,
        smh: *mut c_void,
        rmh: *mut c_void,
    ) -> Result<Option<Request>, String> {
        let mut req = std::ptr::null_mut();
        // SAFETY: the caller's contract above; a live comm.
        check("iallreduce", unsafe {
            (self.t.iallreduce)(self.comm, send as *mut c_void, recv.cast(), count, dtype, op, smh, rmh, &mut req)
        })?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// Tests `req`: Some(bytes) once done (bytes only when `sized`: NCCL
    /// may pass a NULL size), None while it is in flight.
    pub fn test(&self, req: Request, sized: bool) -> Result<Option<Option<usize>>, String> {
        let (mut done, mut size): (c_int, c_int) = (0, 0);
        let size_ptr = if sized { &mut size as *mut c_int } else { std::ptr::null_mut() };
        // SAFETY: a request of this comm (only `post` makes one); size_ptr is NULL or ours.
        check("test", unsafe { (self.t.test)(req.0, &mut done, size_ptr) })?;
        Ok((done == 1).then(|| sized.then_some(size as usize)))
    }

    /// Tests every request in `reqs` (None: done) until all are done, each
    /// then set to None; request k must report `expect[k]` bytes where that
    /// is Some (tested with a size pointer), and is tested without one
    /// where it is None. Fails after `deadline`.
    pub fn wait_all(&self, reqs: &mut [Option<Request>], expect: &[Option<usize>], deadline: Instant) -> Result<(), String> {
        let mut left = reqs.iter().flatten().count();
        while left > 0 {
            for (k, slot) in reqs.iter_mut().enumerate() {
                let Some(req) = *slot else { continue };
                let want = expect.get(k).copied().flatten();
                let Some(size) = self.test(req, want.is_some()).map_err(|e| format!("request {k}: {e}"))? else { continue };
                if size != want {
                    return Err(format!("request {k}: test reported {size:?} bytes, expected {want:?}"));
                }
                *slot = None;
                left -= 1;
            }
            if Instant::now() > deadline {
                return Err(format!("{left} requests not done in time"));
            }
        }
        Ok(())
    }

    /// deregMr of every registration, closeColl, finalize: the first error, if any.
    pub fn close(mut self) -> Result<(), String> {
        self.closed = true;
        self.release()
    }

    fn release(&mut self) -> Result<(), String> {
        let mut first = Ok(());
        // SAFETY: registrations and comm of this context, released once, then the context.
        unsafe {
            for &(_, _, mh) in &self.mrs {
                first = first.and(check("deregMr", (self.t.dereg_mr)(self.comm, mh)));
            }
            if !self.comm.is_null() {
                first = first.and(check("closeColl", (self.t.close_coll)(self.comm)));
            }
            first.and(check("finalize", (self.t.finalize)(self.ctx)))
        }
    }
}

impl Drop for CollNet {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self.release();
        }
    }
}

/// The CollNet channels NCCL runs where the plugin sets its default
/// (`NCCL_MIN_NCHANNELS=4`, ffi-plugin's `device::COLLNET_NCCL_DEFAULTS`).
pub const NCCL_COLLNET_CHANNELS: usize = 4;

/// NCCL's steps in flight per group of channels (`NCCL_STEPS`).
pub const NCCL_STEPS: usize = 8;

/// Channels per group of NCCL's CollNet proxy: one iallreduce per step
/// covers a group's chunks (`COLLNET_GROUP_NSUBS` in NCCL 2.28's
/// src/transport/coll_net.cc).
pub const COLLNET_GROUP_CHANNELS: usize = 8;

/// The CollNet channels NCCL runs: `NCCL_MIN_NCHANNELS` where set (by the
/// user, or by the plugin's `init`, which the driver has called by then),
/// else [`NCCL_COLLNET_CHANNELS`]. One GPU per node gives NCCL no more
/// channels of its own than that minimum on these hosts.
pub fn nccl_channels() -> usize {
    channels_from(std::env::var("NCCL_MIN_NCHANNELS").ok().as_deref())
}

/// [`nccl_channels`] from the variable's value: NCCL's `MAXCHANNELS` (64)
/// at most; unset, empty or not a positive number gives the plugin's 4.
fn channels_from(v: Option<&str>) -> usize {
    v.and_then(|v| v.trim().parse::<usize>().ok()).filter(|&c| c > 0).map_or(NCCL_COLLNET_CHANNELS, |c| c.min(64))
}

/// The bytes of one iallreduce that NCCL's CollNet chain (one GPU per node,
/// the default 4 MiB buffer) hands the plugin for an all-reduce of `bytes`
/// over `channels` channels. These are facts read in NCCL 2.28
/// (src/enqueue.cc, the CollNet chain's chunk; src/transport/coll_net.cc,
/// the proxy's groups), not its code:
/// - each channel's chunk starts at 256 KiB (at most one 512 KiB step of
///   the buffer) and halves while the all-reduce gives each channel fewer
///   than 64 chunks (down to 128 KiB), then fewer than 8 (down to 64 KiB),
///   then less than one (down to 32 KiB);
/// - the send proxy posts one iallreduce per step for a group of up to 8
///   channels, covering the group's chunks of that step, and keeps up to
///   [`NCCL_STEPS`] of them in flight (each group its own).
///
/// So 16 MiB over 4 channels goes as 512 KiB iallreduces (4 x 128 KiB), 64
/// MiB as 1 MiB ones; over 16 channels, both as two groups' 1 MiB ones (8 x
/// 128 KiB).
pub fn nccl_collnet_step(bytes: usize, channels: usize) -> usize {
    let channels = channels.max(1);
    let per_channel = |chunk: usize| bytes / (channels * chunk);
    let mut chunk = 256usize << 10;
    while per_channel(chunk) < 64 && chunk > 128 << 10 {
        chunk /= 2;
    }
    while per_channel(chunk) < 8 && chunk > 64 << 10 {
        chunk /= 2;
    }
    while per_channel(chunk) < 1 && chunk > 32 << 10 {
        chunk /= 2;
    }
    channels.min(COLLNET_GROUP_CHANNELS) * chunk
}

/// `--mode agg-plugin`'s all-reduce: the net context, one [`CollNet`], and
/// NCCL's pipeline of iallreduce pieces.
pub struct CollNetDriver {
    net: &'static NetV11,
    net_ctx: *mut c_void,
    /// Dropped (closed) before the net context is finalized.
    coll: Option<CollNet>,
    /// Bytes per iallreduce; None: NCCL's own ([`nccl_collnet_step`]).
    piece: Option<usize>,
    /// Iallreduces in flight per group of up to 8 channels.
    in_flight: usize,
    /// The CollNet channels NCCL would run ([`nccl_channels`]).
    channels: usize,
    timeout: Duration,
}

impl CollNetDriver {
    /// Loads the plugin and connects rank `rank` of `nranks` (collective).
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        lib: &Path,
        servers: &[String],
        provider: &str,
        fabric_addr: Option<&str>,
        boot: &mut Bootstrap,
        job_id: u64,
        piece: Option<usize>,
        in_flight: usize,
        chunk: Option<usize>,
        timeout: Duration,
    ) -> Result<CollNetDriver, String> {
        if servers.is_empty() {
            return Err("--mode agg-plugin needs --servers (the plugin's TALLY_SERVERS)".into());
        }
        // What a user sets for NCCL; read by the plugin at init. No other
        // thread of this process runs yet.
        std::env::set_var("TALLY_SERVERS", servers.join(","));
        std::env::set_var("TALLY_PROVIDER", provider.split(';').next().unwrap_or(provider));
        if let Some(a) = fabric_addr {
            std::env::set_var("TALLY_FABRIC_ADDR", a);
        }
        std::env::set_var("TALLY_TIMEOUT_S", timeout.as_secs().max(1).to_string());
        // Where asked, the plugin's client cuts each iallreduce into chunks
        // of this size (TALLY_CHUNK is what a user sets for NCCL); else it
        // keeps its own default, as under NCCL.
        if let Some(chunk) = chunk {
            std::env::set_var("TALLY_CHUNK", chunk.to_string());
        }
        let tables = load(lib)?;
        let (rank, n) = (boot.rank() as usize, boot.nranks() as usize);
        // NCCL initialises the net first: CollNet's device rides on net device 0.
        let mut net_ctx = std::ptr::null_mut();
        let mut cfg = NetCommConfig { traffic_class: -1 };
        // SAFETY: live out-pointers; the logger takes NCCL's calling convention.
        check("net init", unsafe { (tables.net.init)(&mut net_ctx, job_id, &mut cfg, logger(), std::ptr::null_mut()) })?;
        let mut driver = CollNetDriver {
            net: tables.net,
            net_ctx,
            coll: None,
            piece: piece.map(|p| p.max(1)),
            in_flight: in_flight.clamp(1, 32),
            channels: nccl_channels(),
            timeout,
        };
        let mut coll = CollNet::init(tables.coll, job_id, logger())?;
        if coll.devices()? < 1 {
            return Err("the plugin offers no CollNet device (is TALLY_SERVERS reachable?)".into());
        }
        coll.connect(rank, n, |h| {
            let all = boot.allgather(h).map_err(|e| e.to_string())?;
            all.iter().map(|h| Handle::try_from(h.as_slice()).map_err(|_| format!("a handle of {} bytes", h.len()))).collect()
        })?;
        driver.coll = Some(coll);
        Ok(driver)
    }

    /// One all-reduce of `send` into `recv`, cut into pieces of at most
    /// `piece` bytes (NCCL's step where none was given) with up to
    /// `in_flight` of them outstanding.
    pub fn allreduce(&mut self, send: &[u8], recv: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<(), String> {
        let coll = self.coll.as_mut().expect("connected in open");
        let (es, len) = (dtype.size(), send.len());
        let (smh, rmh) = (coll.reg_mr(send.as_ptr(), len)?, coll.reg_mr(recv.as_ptr(), len)?);
        let piece = self.piece.unwrap_or_else(|| nccl_collnet_step(len, self.channels));
        let piece = (piece / es).max(1) * es;
        let pieces = len.div_ceil(piece);
        // Each group of up to 8 channels keeps its own steps in flight (a
        // last group of fewer channels is run as a full one: 12 channels
        // as two groups of 8).
        let in_flight = self.in_flight * self.channels.div_ceil(COLLNET_GROUP_CHANNELS);
        // The engine's types and ops carry NCCL's codes as discriminants.
        let (dt, rop) = (dtype as c_int, op as c_int);
        let mut reqs: Vec<(Request, usize)> = Vec::with_capacity(in_flight);
        let (mut next, mut done) = (0usize, 0usize);
        let deadline = Instant::now() + self.timeout;
        while done < pieces {
            while next < pieces && reqs.len() < in_flight {
                let off = next * piece;
                let bytes = piece.min(len - off);
                // SAFETY: both ranges lie inside the caller's buffers, which stay
                // valid until every request of this call completed (we wait below).
                let posted = unsafe { coll.post(send.as_ptr().add(off), recv.as_mut_ptr().add(off), bytes / es, dt, rop, smh, rmh) }?;
                let Some(req) = posted else {
                    break; // not accepted now: NCCL retries after testing others
                };
                reqs.push((req, bytes));
                next += 1;
            }
            let (mut i, before) = (0, done);
            while i < reqs.len() {
                if let Some(size) = coll.test(reqs[i].0, true)? {
                    if size != Some(reqs[i].1) {
                        return Err(format!("test reported {size:?} bytes for a piece of {}", reqs[i].1));
                    }
                    reqs.swap_remove(i);
                    done += 1;
                } else {
                    i += 1;
                }
            }
            if done == before {
                // NCCL's proxy thread yields when a pass made no progress.
                std::thread::yield_now();
            }
            if Instant::now() > deadline {
                return Err(format!("an all-reduce through the plugin took longer than {:?}", self.timeout));
            }
        }
        Ok(())
    }
}

impl Drop for CollNetDriver {
    fn drop(&mut self) {
        // The CollNet side first (deregMr, closeColl, finalize), then the net.
        drop(self.coll.take());
        // SAFETY: the net context of this driver, finalized once.
        let _ = unsafe { (self.net.finalize)(self.net_ctx) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_follow_nccl_min_nchannels() {
        assert_eq!(channels_from(None), 4);
        assert_eq!(channels_from(Some("8")), 8);
        assert_eq!(channels_from(Some(" 16 ")), 16);
        assert_eq!(channels_from(Some("0")), 4);
        assert_eq!(channels_from(Some("x")), 4);
        assert_eq!(channels_from(Some("100")), 64);
    }

    #[test]
    fn pieces_follow_nccls_collnet_chain_steps() {
        const K: usize = 1 << 10;
        const M: usize = 1 << 20;
        // 4 channels: 128 KiB chunks up to 32 MiB, 256 KiB from 64 MiB.
        assert_eq!(nccl_collnet_step(16 * M, 4), 512 * K);
        assert_eq!(nccl_collnet_step(64 * M, 4), M);
        assert_eq!(nccl_collnet_step(256 * M, 4), M);
        // Fewer than 8 chunks a channel: 64 KiB; less than one: 32 KiB.
        assert_eq!(nccl_collnet_step(8 * M, 4), 512 * K);
        assert_eq!(nccl_collnet_step(2 * M, 4), 4 * 64 * K);
        assert_eq!(nccl_collnet_step(M, 4), 4 * 64 * K);
        assert_eq!(nccl_collnet_step(128 * K, 4), 4 * 32 * K);
        // Two channels, and a group holds 8 at most.
        assert_eq!(nccl_collnet_step(16 * M, 2), 2 * 128 * K);
        assert_eq!(nccl_collnet_step(64 * M, 16), 8 * 128 * K);
        assert_eq!(nccl_collnet_step(16 * M, 16), 8 * 128 * K);
        assert_eq!(nccl_collnet_step(16 * M, 8), 8 * 128 * K);
        assert_eq!(nccl_collnet_step(64 * M, 8), 8 * 128 * K);
    }
}
