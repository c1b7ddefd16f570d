//! The C entry points of the version 7-10 tables: thin adapters over [`crate::ffi`].
//!
//! Each adapter only reshapes a call into its v11 form and calls the v11
//! entry point, which does every check, the panic catching and the logging:
//!
//! - **one context per process.** Before v11, NCCL calls `init` once per
//!   process and passes no context to `listen`/`connect`. The first `init`
//!   makes the context (as v11's `init` does for a communicator) and keeps it
//!   here; a later `init` (NCCL reloads a plugin after its last communicator)
//!   keeps that one. Nothing finalizes it: these versions have no
//!   `finalize`, and the library stays mapped (`-z nodelete`).
//! - **`int` sizes** (v7, v8) become `size_t`; a negative one is refused.
//! - the calls without profiler handles (v7-v9) pass NULL ones.
//!
//! The entries whose signatures did not change (accept, deregMr, iflush,
//! test, the closes, CollNet's connect and reduceSupport, and v10's
//! isend/irecv) are v11's own functions in the tables ([`crate`]).
//!
//! # Safety
//!
//! As [`crate::ffi`]: each function's contract is the NCCL plugin API's.
#![allow(clippy::missing_safety_doc)]
use crate::abi::*;
use crate::abi_legacy::*;
use crate::error::Error;
use crate::ffi::{self, guard};
use crate::log;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;

/// The process's ncclNet and ncclCollNet contexts (NULL before `init`).
static NET_CTX: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
static COLL_CTX: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
/// Serialises the first `init`s (NCCL calls them under its own lock, a
/// harness may not).
static INIT: Mutex<()> = Mutex::new(());

/// Makes the process's context once with `make` (a v11 `init`), or keeps
/// the one made before.
fn init_once(slot: &AtomicPtr<c_void>, table: &str, make: impl FnOnce(*mut *mut c_void) -> NcclResult) -> NcclResult {
    let _g = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if !slot.load(Ordering::Acquire).is_null() {
        return NCCL_SUCCESS;
    }
    let mut ctx = ptr::null_mut();
    let rc = make(&mut ctx);
    if rc == NCCL_SUCCESS {
        slot.store(ctx, Ordering::Release);
        log::info_init(&format!("{table} (an NCCL before 2.28): one context for the process"));
    }
    rc
}

fn net_ctx() -> *mut c_void {
    NET_CTX.load(Ordering::Acquire)
}

fn coll_ctx() -> *mut c_void {
    COLL_CTX.load(Ordering::Acquire)
}

/// An `int` size or count as `size_t`, or the call's refusal.
fn size(what: &str, n: c_int) -> Result<usize, NcclResult> {
    usize::try_from(n).map_err(|_| guard(what, || Err(Error::arg(format!("negative size {n}")))))
}

// ---------------------------------------------------------------------------
// ncclNet

fn net_init_legacy(table: &str, logger: Option<NcclLogger>) -> NcclResult {
    log::set_logger(logger);
    init_once(&NET_CTX, table, |ctx| {
        // SAFETY: a valid out-pointer; no config or profiler before v11.
        unsafe { ffi::net_init(ctx, 0, ptr::null_mut(), logger, ptr::null_mut()) }
    })
}

pub unsafe extern "C" fn net_init_v7(logger: Option<NcclLogger>) -> NcclResult {
    net_init_legacy("ncclNet v7", logger)
}

pub unsafe extern "C" fn net_init_v8(logger: Option<NcclLogger>) -> NcclResult {
    net_init_legacy("ncclNet v8", logger)
}

pub unsafe extern "C" fn net_init_v9(logger: Option<NcclLogger>) -> NcclResult {
    net_init_legacy("ncclNet v9", logger)
}

pub unsafe extern "C" fn net_init_v10(logger: Option<NcclLogger>, _prof: *mut c_void) -> NcclResult {
    net_init_legacy("ncclNet v10", logger)
}

/// Fills a v11 properties struct for `dev` through `get` (the net or the
/// CollNet one), then writes its older form.
unsafe fn props_as<T>(
    get: unsafe extern "C" fn(c_int, *mut NetPropertiesV11) -> NcclResult,
    dev: c_int,
    out: *mut T,
    convert: fn(&NetPropertiesV11) -> T,
) -> NcclResult {
    if out.is_null() {
        return guard("getProperties", || Err(Error::arg("props is NULL")));
    }
    // SAFETY: all zeroes is a valid value of this plain C struct.
    let mut p: NetPropertiesV11 = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    let rc = unsafe { get(dev, &mut p) };
    if rc == NCCL_SUCCESS {
        // SAFETY: non-NULL; NCCL passes a writable struct of this version.
        unsafe { out.write(convert(&p)) };
    }
    rc
}

/// getProperties of an older table: the v11 entry point's struct, shortened.
macro_rules! older_properties {
    ($name:ident, $v11:ident, $ty:ty) => {
        pub unsafe extern "C" fn $name(dev: c_int, props: *mut $ty) -> NcclResult {
            // SAFETY: as props_as.
            unsafe { props_as(ffi::$v11, dev, props, <$ty>::from_v11) }
        }
    };
}

older_properties!(net_get_properties_v7, net_get_properties_v11, NetPropertiesV7);
older_properties!(net_get_properties_v8, net_get_properties_v11, NetPropertiesV8);
older_properties!(net_get_properties_v9, net_get_properties_v11, NetPropertiesV9);

pub unsafe extern "C" fn net_listen(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: the process's context (NULL before init: refused there).
    unsafe { ffi::net_listen(net_ctx(), dev, handle, listen_comm) }
}

pub unsafe extern "C" fn net_connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    dev_comm: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as net_listen.
    unsafe { ffi::net_connect(net_ctx(), dev, handle, send_comm, dev_comm) }
}

pub unsafe extern "C" fn net_connect_v10(
    dev: c_int,
    _config: *mut NetCommConfig,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    dev_comm: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: as net_listen.
    unsafe { ffi::net_connect(net_ctx(), dev, handle, send_comm, dev_comm) }
}

pub unsafe extern "C" fn net_reg_mr_v7(
    comm: *mut c_void,
    data: *mut c_void,
    n: c_int,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    match size("regMr", n) {
        // SAFETY: NCCL's arguments, passed on.
        Ok(n) => unsafe { ffi::net_reg_mr(comm, data, n, kind, mhandle) },
        Err(rc) => rc,
    }
}

pub unsafe extern "C" fn net_isend_v7(
    send_comm: *mut c_void,
    data: *mut c_void,
    n: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    match size("isend", n) {
        // SAFETY: NCCL's arguments, passed on.
        Ok(n) => unsafe { ffi::net_isend(send_comm, data, n, tag, mhandle, ptr::null_mut(), request) },
        Err(rc) => rc,
    }
}

pub unsafe extern "C" fn net_isend_v9(
    send_comm: *mut c_void,
    data: *mut c_void,
    n: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's arguments, passed on.
    unsafe { ffi::net_isend(send_comm, data, n, tag, mhandle, ptr::null_mut(), request) }
}

pub unsafe extern "C" fn net_irecv_v7(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // maxRecvs is 1: net_irecv refuses any other n before it reads sizes.
    let mut one = None;
    if n == 1 && !sizes.is_null() {
        // SAFETY: with n == 1 NCCL passes a one-element sizes array.
        match size("irecv", unsafe { *sizes }) {
            Ok(s) => one = Some(s),
            Err(rc) => return rc,
        }
    }
    let wide = one.as_mut().map_or(ptr::null_mut(), |s| s as *mut usize);
    // SAFETY: NCCL's arguments, with the size widened.
    unsafe { ffi::net_irecv(recv_comm, n, data, wide, tags, mhandles, ptr::null_mut(), request) }
}

pub unsafe extern "C" fn net_irecv_v9(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's arguments, passed on.
    unsafe { ffi::net_irecv(recv_comm, n, data, sizes, tags, mhandles, ptr::null_mut(), request) }
}

// ---------------------------------------------------------------------------
// ncclCollNet

fn coll_init_legacy(table: &str, logger: Option<NcclLogger>) -> NcclResult {
    log::set_logger(logger);
    init_once(&COLL_CTX, table, |ctx| {
        // SAFETY: a valid out-pointer.
        unsafe { ffi::coll_init(ctx, 0, logger) }
    })
}

pub unsafe extern "C" fn coll_init_v7(logger: Option<NcclLogger>) -> NcclResult {
    coll_init_legacy("ncclCollNet v7", logger)
}

pub unsafe extern "C" fn coll_init_v8(logger: Option<NcclLogger>) -> NcclResult {
    coll_init_legacy("ncclCollNet v8", logger)
}

pub unsafe extern "C" fn coll_init_v9(logger: Option<NcclLogger>) -> NcclResult {
    coll_init_legacy("ncclCollNet v9", logger)
}

pub unsafe extern "C" fn coll_init_v10(logger: Option<NcclLogger>) -> NcclResult {
    coll_init_legacy("ncclCollNet v10", logger)
}

older_properties!(coll_get_properties_v7, coll_get_properties_v11, NetPropertiesV7);
older_properties!(coll_get_properties_v8, coll_get_properties_v11, NetPropertiesV8);
older_properties!(coll_get_properties_v9, coll_get_properties_v11, NetPropertiesV9);

pub unsafe extern "C" fn coll_listen(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: the process's CollNet context (NULL before init: refused there).
    unsafe { ffi::coll_listen(coll_ctx(), dev, handle, listen_comm) }
}

pub unsafe extern "C" fn coll_reg_mr_v7(
    comm: *mut c_void,
    data: *mut c_void,
    n: c_int,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    match size("CollNet regMr", n) {
        // SAFETY: NCCL's arguments, passed on.
        Ok(n) => unsafe { ffi::coll_reg_mr(comm, data, n, kind, mhandle) },
        Err(rc) => rc,
    }
}

pub unsafe extern "C" fn coll_iallreduce_v7(
    comm: *mut c_void,
    send: *mut c_void,
    recv: *mut c_void,
    count: c_int,
    dtype: c_int,
    op: c_int,
    send_mh: *mut c_void,
    recv_mh: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    match size("CollNet iallreduce", count) {
        // SAFETY: NCCL's arguments, passed on.
        Ok(n) => unsafe { ffi::coll_iallreduce(comm, send, recv, n, dtype, op, send_mh, recv_mh, request) },
        Err(rc) => rc,
    }
}
