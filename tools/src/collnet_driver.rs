//! `bench allreduce --mode agg-plugin`: all-reduce through the NCCL plugin,
//! driven the way NCCL drives a ncclCollNet.
//!
//! Each rank process loads `libnccl-net-tally.so` as NCCL does (dlopen,
//! RTLD_NOW | RTLD_LOCAL, the `ncclCollNetPlugin_v11` table), then replays
//! NCCL's sequence: init with a logger, devices, getProperties, listen, an
//! exchange of every rank's handle (NCCL's bootstrap allgather; here tally's
//! bootstrap), the collective connect, regMr of the user buffers, and per
//! all-reduce several iallreduce pieces in flight, each tested until done, as
//! NCCL's proxy pipelines a CollNet all-reduce. On drop: deregMr, closeColl,
//! finalize. The plugin finds the servers in `TALLY_SERVERS`, which this
//! sets from `--servers` before the library is loaded. This is as close to
//! NCCL's own use as a host without GPUs gets.
#[path = "../../ffi-plugin/src/abi.rs"]
mod abi;

use abi::{CollNetV11, NcclLogger, NetCommConfig, NetV11, NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_HOST, NCCL_SUCCESS};
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::ring::bootstrap::Bootstrap;

/// The plugin logs with format "%s" and one string argument (ffi-plugin's
/// log.rs): this fixed-argument function reads exactly that.
unsafe extern "C" fn nccl_log(level: c_int, _flags: c_ulong, _file: *const c_char, _line: c_int, _fmt: *const c_char, msg: *const c_char) {
    if msg.is_null() {
        return;
    }
    // SAFETY: the plugin passes a NUL-terminated message.
    let m = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    match level {
        1 => log::warn!("{m}"),
        2 => log::info!("{m}"),
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

pub struct CollNetDriver {
    net: &'static NetV11,
    net_ctx: *mut c_void,
    t: &'static CollNetV11,
    ctx: *mut c_void,
    comm: *mut c_void,
    /// (address, length, handle) of every buffer registered with regMr.
    mrs: Vec<(usize, usize, *mut c_void)>,
    piece: usize,
    in_flight: usize,
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
        piece: usize,
        in_flight: usize,
        chunk: usize,
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
        // The plugin's client cuts each iallreduce into chunks of this size,
        // as `--mode agg` does (TALLY_CHUNK is what a user sets for NCCL).
        std::env::set_var("TALLY_CHUNK", chunk.to_string());
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
        let (net, t): (&'static NetV11, &'static CollNetV11) = unsafe { (&*(pn as *const NetV11), &*(pc as *const CollNetV11)) };
        let rank = boot.rank();
        let n = boot.nranks();
        let (mut net_ctx, mut ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: every call passes live out-pointers and the plugin's own objects, in NCCL's order.
        unsafe {
            // NCCL initialises the net first: CollNet's device rides on net device 0.
            let mut cfg = NetCommConfig { traffic_class: -1 };
            check("net init", (net.init)(&mut net_ctx, job_id, &mut cfg, logger(), std::ptr::null_mut()))?;
            check("init", (t.init)(&mut ctx, job_id, logger()))?;
            let mut ndev: c_int = 0;
            check("devices", (t.devices)(&mut ndev))?;
            if ndev < 1 {
                return Err("the plugin offers no CollNet device (is TALLY_SERVERS reachable?)".into());
            }
            let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
            let mut listen = std::ptr::null_mut();
            check("listen", (t.listen)(ctx, 0, handle.as_mut_ptr().cast(), &mut listen))?;
            let mut all = boot.allgather(&handle).map_err(|e| e.to_string())?;
            let mut ptrs: Vec<*mut c_void> = all.iter_mut().map(|h| h.as_mut_ptr().cast()).collect();
            let mut comm = std::ptr::null_mut();
            check("connect", (t.connect)(ptrs.as_mut_ptr(), n as c_int, rank as c_int, listen, &mut comm))?;
            check("closeListen", (t.close_listen)(listen))?;
            Ok(CollNetDriver {
                net,
                net_ctx,
                t,
                ctx,
                comm,
                mrs: Vec::new(),
                piece: piece.max(1),
                in_flight: in_flight.clamp(1, 32),
                timeout,
            })
        }
    }

    fn mr(&mut self, p: *const u8, len: usize) -> Result<*mut c_void, String> {
        let a = p as usize;
        if let Some(&(_, _, mh)) = self.mrs.iter().find(|(s, l, _)| *s <= a && a + len <= s + l) {
            return Ok(mh);
        }
        let mut mh = std::ptr::null_mut();
        // SAFETY: live comm; the caller's buffer outlives the registration (dropped with self).
        check("regMr", unsafe { (self.t.reg_mr)(self.comm, p as *mut c_void, len, NCCL_PTR_HOST, &mut mh) })?;
        self.mrs.push((a, len, mh));
        Ok(mh)
    }

    /// One all-reduce of `send` into `recv`, cut into pieces of at most
    /// `piece` bytes with up to `in_flight` of them outstanding.
    pub fn allreduce(&mut self, send: &[u8], recv: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<(), String> {
        let (es, len) = (dtype.size(), send.len());
        let (smh, rmh) = (self.mr(send.as_ptr(), len)?, self.mr(recv.as_ptr(), len)?);
        let piece = (self.piece / es).max(1) * es;
        let pieces = len.div_ceil(piece);
        // The engine's types and ops carry NCCL's codes as discriminants.
        let (dt, rop) = (dtype as c_int, op as c_int);
        let mut reqs: Vec<(*mut c_void, usize)> = Vec::with_capacity(self.in_flight);
        let (mut next, mut done) = (0usize, 0usize);
        let deadline = Instant::now() + self.timeout;
        while done < pieces {
            while next < pieces && reqs.len() < self.in_flight {
                let off = next * piece;
                let bytes = piece.min(len - off);
                let mut req = std::ptr::null_mut();
                // SAFETY: both ranges lie inside the caller's buffers, which stay
                // valid until every request of this call completed (we wait below).
                check("iallreduce", unsafe {
                    (self.t.iallreduce)(
                        self.comm,
                        send.as_ptr().add(off) as *mut c_void,
                        recv.as_mut_ptr().add(off).cast(),
                        bytes / es,
                        dt,
                        rop,
                        smh,
                        rmh,
                        &mut req,
                    )
                })?;
                if req.is_null() {
                    break; // not accepted now: NCCL retries after testing others
                }
                reqs.push((req, bytes));
                next += 1;
            }
            let (mut i, before) = (0, done);
            while i < reqs.len() {
                let (mut fin, mut size): (c_int, c_int) = (0, 0);
                // SAFETY: a live request of this comm.
                check("test", unsafe { (self.t.test)(reqs[i].0, &mut fin, &mut size) })?;
                if fin == 1 {
                    if size as usize != reqs[i].1 {
                        return Err(format!("test reported {size} bytes for a piece of {}", reqs[i].1));
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
        // SAFETY: registrations and comm of this driver, released once, then the context.
        unsafe {
            for &(_, _, mh) in &self.mrs {
                let _ = (self.t.dereg_mr)(self.comm, mh);
            }
            let _ = (self.t.close_coll)(self.comm);
            let _ = (self.t.finalize)(self.ctx);
            let _ = (self.net.finalize)(self.net_ctx);
        }
    }
}
