//! The C entry points: the only place NCCL's raw pointers are touched
//! (those to plugin objects through [`crate::handed`]).
//!
//! Every function here follows one pattern (as in rustls-ffi): it runs its
//! body inside [`guard`], which catches panics, turns an [`Error`] into an
//! `ncclResult_t` through [`Error::code`] and logs it; the body checks every
//! pointer for NULL before dereferencing it, turns a pointer to a plugin
//! object back into a reference through [`crate::handed`], and calls the
//! safe core in [`crate::net`] / [`crate::collnet`].
//!
//! Objects handed to NCCL (contexts, comms, memory handles) are tagged
//! `Box`es ([`crate::handed::hand_out`]), taken back when NCCL closes them
//! ([`crate::handed::take`]); requests are tagged slots inside their comm's
//! `Box`. Every pointer NCCL passes back is checked to be an open object of
//! the kind the call expects ([`crate::handed::borrow`]): NULL, another
//! kind, or an object already closed is refused with `ncclInvalidArgument`.
//! A pointer that never came from this plugin cannot be detected (nor in C).
//!
//! # Safety
//!
//! Each `extern "C"` function's contract is the NCCL plugin API's: pointers
//! are NULL (refused) or valid for what the API passes there, and objects
//! are used only between their creation and their close.
// The contract is NCCL's, stated once above rather than on each function.
#![allow(clippy::missing_safety_doc)]
use crate::abi::*;
use crate::collnet::{self, CollComm, CollCtx, CollListen, CollMr, CollRequest};
use crate::device;
use crate::error::{Error, Result};
use crate::handed::{borrow, borrow_mut, hand_out, take};
use crate::log;
use crate::net::conn::{Conn, Mr, Request};
use crate::net::{self, ListenComm, NetCtx};
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

/// Runs an entry point's body: panics and errors become codes, and are logged.
pub(crate) fn guard(what: &str, body: impl FnOnce() -> Result<()>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NCCL_SUCCESS,
        Ok(Err(e)) => {
            log::warn(&format!("{what}: {e}"));
            e.code()
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            log::warn(&format!("{what}: internal error (panic: {msg})"));
            NCCL_INTERNAL_ERROR
        }
    }
}

fn non_null<T>(p: *mut T, what: &str) -> Result<*mut T> {
    if p.is_null() {
        Err(Error::arg(format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

/// # Safety
/// `p` must be NULL or a valid, writable pointer (checked non-NULL here).
unsafe fn write<T>(p: *mut T, v: T, what: &str) -> Result<()> {
    let p = non_null(p, what)?;
    // SAFETY: non-NULL, and the caller (NCCL) passes writable out-pointers.
    unsafe { p.write(v) };
    Ok(())
}

fn copy_handle(dst: *mut c_void, src: &[u8; NCCL_NET_HANDLE_MAXSIZE]) -> Result<()> {
    let dst = non_null(dst, "handle")?;
    // SAFETY: NCCL's handle buffers are NCCL_NET_HANDLE_MAXSIZE bytes.
    unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst.cast::<u8>(), NCCL_NET_HANDLE_MAXSIZE) };
    Ok(())
}

fn read_handle(src: *const c_void) -> Result<[u8; NCCL_NET_HANDLE_MAXSIZE]> {
    if src.is_null() {
        return Err(Error::arg("handle is NULL"));
    }
    let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    // SAFETY: NCCL's handle buffers are NCCL_NET_HANDLE_MAXSIZE bytes.
    unsafe { ptr::copy_nonoverlapping(src.cast::<u8>(), h.as_mut_ptr(), NCCL_NET_HANDLE_MAXSIZE) };
    Ok(h)
}

fn host_only(kind: c_int) -> Result<()> {
    if kind == NCCL_PTR_HOST {
        Ok(())
    } else {
        Err(Error::arg(format!("memory type {kind}: this transport reaches host memory only (NCCL_PTR_HOST)")))
    }
}

fn check_buffer(data: *mut c_void, size: usize) -> Result<()> {
    if data.is_null() && size > 0 {
        return Err(Error::arg(format!("NULL buffer of {size} bytes")));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// ncclNet

pub unsafe extern "C" fn net_init(
    ctx: *mut *mut c_void,
    comm_id: u64,
    _config: *mut NetCommConfig,
    logger: Option<NcclLogger>,
    _prof: *mut c_void,
) -> NcclResult {
    log::set_logger(logger);
    guard("init", || {
        log::install_bridge();
        non_null(ctx, "ctx")?;
        let tuned = device::tune_provider_env();
        if !tuned.is_empty() {
            log::info_init(&format!("libfabric defaults set (unset before): {}", tuned.join(" ")));
        }
        let nccl = device::tune_nccl_env();
        if !nccl.is_empty() {
            log::info_init(&format!("NCCL defaults set (unset before): {}", nccl.join(" ")));
        }
        let devices = device::acquire()?;
        let list: Vec<String> = devices
            .list
            .iter()
            .map(|d| format!("[{}]{} ({}, {} Mbps)", d.index, d.name.to_string_lossy(), d.domain, d.speed_mbps))
            .collect();
        log::info_init(&format!(
            "plugin {} (ncclNet v11/v12) comm {comm_id:#x}: provider {}, {} device(s): {}",
            env!("CARGO_PKG_VERSION"),
            devices.provider,
            devices.list.len(),
            list.join(" ")
        ));
        // SAFETY: checked non-NULL above; NCCL passes a writable pointer.
        unsafe { write(ctx, hand_out(NetCtx::new(devices)), "ctx") }
    })
}

pub unsafe extern "C" fn net_devices(ndev: *mut c_int) -> NcclResult {
    guard("devices", || {
        let n = device::current().map_or(0, |d| d.list.len());
        // SAFETY: NCCL passes a writable int (NULL is rejected).
        unsafe { write(ndev, n as c_int, "ndev") }
    })
}

pub unsafe extern "C" fn net_get_properties_v11(dev: c_int, props: *mut NetPropertiesV11) -> NcclResult {
    guard("getProperties", || {
        let (devs, i) = device::get(dev)?;
        // SAFETY: NCCL passes a writable properties struct of this version.
        unsafe { write(props, devs.list[i].properties_v11(device::MAX_COLL_BYTES), "props") }
    })
}

pub unsafe extern "C" fn net_get_properties_v12(dev: c_int, props: *mut NetPropertiesV12) -> NcclResult {
    guard("getProperties", || {
        let (devs, i) = device::get(dev)?;
        // SAFETY: as for v11.
        unsafe { write(props, devs.list[i].properties_v12(device::MAX_COLL_BYTES), "props") }
    })
}

pub unsafe extern "C" fn net_listen(ctx: *mut c_void, dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult {
    guard("listen", || {
        non_null(handle, "handle")?;
        non_null(listen_comm, "listenComm")?;
        // SAFETY: ctx comes from net_init (its tag is checked).
        let ctx: &NetCtx = unsafe { borrow(ctx, "ctx")? };
        let (l, h) = net::listen(ctx, dev)?;
        copy_handle(handle, &h)?;
        // SAFETY: checked non-NULL above.
        unsafe { write(listen_comm, hand_out(l), "listenComm") }
    })
}

pub unsafe extern "C" fn net_connect(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut c_void,
) -> NcclResult {
    guard("connect", || {
        // SAFETY: NCCL passes a writable comm pointer (NULL is rejected).
        unsafe { write(send_comm, ptr::null_mut(), "sendComm")? };
        // SAFETY: ctx comes from net_init (its tag is checked).
        let ctx: &NetCtx = unsafe { borrow(ctx, "ctx")? };
        let mut h = read_handle(handle)?;
        let r = net::connect(ctx, dev, &mut h);
        // The handle now carries this connection's progress token.
        copy_handle(handle, &h)?;
        if let Some(c) = r? {
            // SAFETY: checked above.
            unsafe { write(send_comm, hand_out(c), "sendComm")? };
        }
        Ok(())
    })
}

pub unsafe extern "C" fn net_accept(listen_comm: *mut c_void, recv_comm: *mut *mut c_void, _recv_dev_comm: *mut *mut c_void) -> NcclResult {
    guard("accept", || {
        // SAFETY: NCCL passes a writable comm pointer (NULL is rejected).
        unsafe { write(recv_comm, ptr::null_mut(), "recvComm")? };
        // SAFETY: listen comms come from net_listen (the tag is checked);
        // NCCL does not use one from two threads at once.
        let l: &mut ListenComm = unsafe { borrow_mut(listen_comm, "listenComm")? };
        if let Some(c) = l.accept()? {
            // SAFETY: checked above.
            unsafe { write(recv_comm, hand_out(c), "recvComm")? };
        }
        Ok(())
    })
}

pub unsafe extern "C" fn net_reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    guard("regMr", || {
        non_null(mhandle, "mhandle")?;
        host_only(kind)?;
        check_buffer(data, size)?;
        // SAFETY: send and receive comms come from net_connect / net_accept
        // (the tag is checked).
        let c: &Conn = unsafe { borrow(comm, "comm")? };
        let mr = c.reg_mr(data as usize, size)?;
        // SAFETY: checked non-NULL above.
        unsafe { write(mhandle, hand_out(mr), "mhandle") }
    })
}

pub unsafe extern "C" fn net_dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
    guard("deregMr", || {
        // SAFETY: as in regMr.
        let c: &Conn = unsafe { borrow(comm, "comm")? };
        // SAFETY: memory handles come from net_reg_mr and are freed once,
        // here (the tag is checked, and closed).
        let mr: Mr = unsafe { take(mhandle, "mhandle")? };
        c.dereg_mr(mr)
    })
}

/// Posts on a comm and writes the request (NULL: try again).
///
/// # Safety
/// As [`Conn::post`]; `request` writable.
unsafe fn post(c: &Conn, data: *mut c_void, size: usize, mhandle: *mut c_void, request: *mut *mut c_void) -> Result<()> {
    let mr = if mhandle.is_null() {
        None
    } else {
        // SAFETY: memory handles come from net_reg_mr (the tag is checked).
        Some(unsafe { borrow::<Mr>(mhandle, "mhandle")? })
    };
    // SAFETY: NCCL keeps the buffer valid until the request completes.
    let r = unsafe { c.post(data.cast::<u8>(), size, mr)? };
    let p = r.map_or(ptr::null_mut(), |i| c.request(i).as_handed());
    // SAFETY: the caller checked request.
    unsafe { write(request, p, "request") }
}

pub unsafe extern "C" fn net_isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    _tag: c_int,
    mhandle: *mut c_void,
    _phandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("isend", || {
        // `*request` may hold NCCL's hints on input: it is only written.
        // SAFETY: NCCL passes a writable request pointer (NULL is rejected).
        unsafe { write(request, ptr::null_mut(), "request")? };
        check_buffer(data, size)?;
        // SAFETY: send comms come from net_connect (the tag is checked).
        let c: &Conn = unsafe { borrow(send_comm, "sendComm")? };
        if !c.is_send {
            return Err(Error::InvalidUsage("isend on a receive comm".into()));
        }
        // SAFETY: see `post`.
        unsafe { post(c, data, size, mhandle, request) }
    })
}

pub unsafe extern "C" fn net_irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    _tags: *mut c_int,
    mhandles: *mut *mut c_void,
    _phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("irecv", || {
        // SAFETY: NCCL passes a writable request pointer (NULL is rejected).
        unsafe { write(request, ptr::null_mut(), "request")? };
        if n != 1 {
            return Err(Error::arg(format!("{n} grouped receives (maxRecvs is 1)")));
        }
        let data = non_null(data, "data")?;
        let sizes = non_null(sizes, "sizes")?;
        // SAFETY: with n == 1, NCCL passes one-element arrays.
        let (buf, size) = unsafe { (*data, *sizes) };
        let mh = if mhandles.is_null() {
            ptr::null_mut()
        } else {
            // SAFETY: as above.
            unsafe { *mhandles }
        };
        check_buffer(buf, size)?;
        // SAFETY: receive comms come from net_accept (the tag is checked).
        let c: &Conn = unsafe { borrow(recv_comm, "recvComm")? };
        if c.is_send {
            return Err(Error::InvalidUsage("irecv on a send comm".into()));
        }
        // SAFETY: see `post`.
        unsafe { post(c, buf, size, mh, request) }
    })
}

pub unsafe extern "C" fn net_iflush(
    recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("iflush", || {
        // SAFETY: receive comms come from net_accept (the tag is checked).
        let _: &Conn = unsafe { borrow(recv_comm, "recvComm")? };
        // Host memory needs no flush: a NULL request means done.
        // SAFETY: NCCL passes a writable request pointer (NULL is rejected).
        unsafe { write(request, ptr::null_mut(), "request") }
    })
}

pub unsafe extern "C" fn net_test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
    guard("test", || {
        non_null(done, "done")?;
        // SAFETY: requests are slots of live comms (the tag is checked).
        let r: &Request = unsafe { borrow(request, "request")? };
        // SAFETY: a slot's owner is the pointer NCCL holds for the comm
        // whose Box holds it (the tag is checked).
        let c: &Conn = unsafe { borrow(r.owner as *mut c_void, "request's comm")? };
        let out = c.test(r.index);
        // SAFETY: done checked above; sizes may be NULL (checked).
        unsafe {
            match out {
                Ok(Some(n)) => {
                    *done = 1;
                    if !sizes.is_null() {
                        *sizes = c_int::try_from(n).unwrap_or(c_int::MAX);
                    }
                }
                Ok(None) => *done = 0,
                Err(e) => {
                    *done = 0;
                    return Err(e);
                }
            }
        }
        Ok(())
    })
}

pub unsafe extern "C" fn net_close_send(send_comm: *mut c_void) -> NcclResult {
    guard("closeSend", || {
        // SAFETY: comms come from net_connect (the tag is checked).
        if !unsafe { borrow::<Conn>(send_comm, "sendComm")? }.is_send {
            return Err(Error::InvalidUsage("closeSend on a receive comm".into()));
        }
        // SAFETY: as above; closed once (the tag is closed).
        unsafe { take::<Conn>(send_comm, "sendComm")? }.close()
    })
}

pub unsafe extern "C" fn net_close_recv(recv_comm: *mut c_void) -> NcclResult {
    guard("closeRecv", || {
        // SAFETY: comms come from net_accept (the tag is checked).
        if unsafe { borrow::<Conn>(recv_comm, "recvComm")? }.is_send {
            return Err(Error::InvalidUsage("closeRecv on a send comm".into()));
        }
        // SAFETY: as above; closed once (the tag is closed).
        unsafe { take::<Conn>(recv_comm, "recvComm")? }.close()
    })
}

pub unsafe extern "C" fn net_close_listen(listen_comm: *mut c_void) -> NcclResult {
    guard("closeListen", || {
        // SAFETY: listen comms come from net_listen and are closed once
        // (the tag is checked, and closed).
        unsafe { take::<ListenComm>(listen_comm, "listenComm")? }.close()
    })
}

pub unsafe extern "C" fn net_finalize(ctx: *mut c_void) -> NcclResult {
    guard("finalize", || {
        // SAFETY: contexts come from net_init and are finalized once (the
        // tag is checked, and closed). Comms still open keep their endpoint
        // alive; nothing here runs a thread.
        drop(unsafe { take::<NetCtx>(ctx, "ctx")? });
        device::release();
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// ncclCollNet

pub unsafe extern "C" fn coll_init(ctx: *mut *mut c_void, comm_id: u64, logger: Option<NcclLogger>) -> NcclResult {
    log::set_logger(logger);
    guard("CollNet init", || {
        non_null(ctx, "ctx")?;
        let _ = device::tune_provider_env();
        let servers = collnet::servers_from_env()?;
        if servers.is_empty() {
            log::info_init(&format!("CollNet comm {comm_id:#x}: TALLY_SERVERS is not set, no CollNet device"));
        } else {
            log::info_init(&format!("CollNet comm {comm_id:#x}: tally servers {}", servers.join(",")));
        }
        // SAFETY: checked non-NULL above.
        unsafe { write(ctx, hand_out(CollCtx { servers }), "ctx") }
    })
}

pub unsafe extern "C" fn coll_devices(ndev: *mut c_int) -> NcclResult {
    guard("CollNet devices", || {
        let n = collnet::device_count(device::current().as_deref());
        // SAFETY: NCCL passes a writable int (NULL is rejected).
        unsafe { write(ndev, n as c_int, "ndev") }
    })
}

fn coll_device(dev: c_int) -> Result<std::sync::Arc<device::Devices>> {
    let devs = device::current();
    if dev != 0 || collnet::device_count(devs.as_deref()) == 0 {
        return Err(Error::arg(format!("CollNet device {dev} does not exist")));
    }
    Ok(devs.expect("counted above"))
}

pub unsafe extern "C" fn coll_get_properties_v11(dev: c_int, props: *mut NetPropertiesV11) -> NcclResult {
    guard("CollNet getProperties", || {
        let devs = coll_device(dev)?;
        // SAFETY: NCCL passes a writable properties struct of this version.
        unsafe { write(props, devs.list[0].properties_v11(device::MAX_COLL_BYTES), "props") }
    })
}

pub unsafe extern "C" fn coll_get_properties_v12(dev: c_int, props: *mut NetPropertiesV12) -> NcclResult {
    guard("CollNet getProperties", || {
        let devs = coll_device(dev)?;
        // SAFETY: as for v11.
        unsafe { write(props, devs.list[0].properties_v12(device::MAX_COLL_BYTES), "props") }
    })
}

pub unsafe extern "C" fn coll_listen(ctx: *mut c_void, dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult {
    guard("CollNet listen", || {
        non_null(handle, "handle")?;
        non_null(listen_comm, "listenComm")?;
        // SAFETY: ctx comes from coll_init (the tag is checked).
        let ctx: &CollCtx = unsafe { borrow(ctx, "ctx")? };
        let (l, h) = collnet::listen(ctx, dev)?;
        copy_handle(handle, &h)?;
        // SAFETY: checked non-NULL above.
        unsafe { write(listen_comm, hand_out(l), "listenComm") }
    })
}

pub unsafe extern "C" fn coll_connect(
    handles: *mut *mut c_void,
    nranks: c_int,
    rank: c_int,
    listen_comm: *mut c_void,
    coll_comm: *mut *mut c_void,
) -> NcclResult {
    guard("CollNet connect", || {
        // SAFETY: NCCL passes a writable comm pointer (NULL is rejected).
        unsafe { write(coll_comm, ptr::null_mut(), "collComm")? };
        let handles = non_null(handles, "handles")?;
        let n = usize::try_from(nranks).ok().filter(|&n| n > 0).ok_or_else(|| Error::arg(format!("nranks {nranks}")))?;
        let hs = (0..n)
            .map(|i| {
                // SAFETY: NCCL passes an array of nranks handle pointers.
                read_handle(unsafe { *handles.add(i) })
            })
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: listen comms come from coll_listen (the tag is checked).
        let l: &CollListen = unsafe { borrow(listen_comm, "listenComm")? };
        let c = collnet::connect(l, &hs, rank)?;
        // SAFETY: checked above.
        unsafe { write(coll_comm, hand_out(c), "collComm") }
    })
}

pub unsafe extern "C" fn coll_reduce_support(dtype: c_int, op: c_int, supported: *mut c_int) -> NcclResult {
    guard("CollNet reduceSupport", || {
        // SAFETY: NCCL passes a writable int (NULL is rejected).
        unsafe { write(supported, collnet::reduce_support(dtype, op) as c_int, "supported") }
    })
}

pub unsafe extern "C" fn coll_reg_mr(
    coll_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    guard("CollNet regMr", || {
        // SAFETY: comms come from coll_connect (the tag is checked).
        let _: &CollComm = unsafe { borrow(coll_comm, "collComm")? };
        non_null(mhandle, "mhandle")?;
        host_only(kind)?;
        check_buffer(data, size)?;
        // SAFETY: checked non-NULL above.
        unsafe { write(mhandle, hand_out(CollMr { addr: data as usize, len: size }), "mhandle") }
    })
}

pub unsafe extern "C" fn coll_dereg_mr(coll_comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
    guard("CollNet deregMr", || {
        // SAFETY: comms come from coll_connect (the tag is checked).
        let _: &CollComm = unsafe { borrow(coll_comm, "collComm")? };
        // A CollMr is only a record: taking it back frees it.
        // SAFETY: memory handles come from coll_reg_mr and are freed once,
        // here (the tag is checked, and closed).
        let _: CollMr = unsafe { take(mhandle, "mhandle")? };
        Ok(())
    })
}

pub unsafe extern "C" fn coll_iallreduce(
    coll_comm: *mut c_void,
    send: *mut c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    _send_mh: *mut c_void,
    _recv_mh: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("CollNet iallreduce", || {
        // SAFETY: NCCL passes a writable request pointer (NULL is rejected).
        unsafe { write(request, ptr::null_mut(), "request")? };
        // SAFETY: comms come from coll_connect (the tag is checked).
        let c: &CollComm = unsafe { borrow(coll_comm, "collComm")? };
        // SAFETY: NCCL keeps both buffers valid until the request completes.
        let r = unsafe { c.iallreduce(send.cast::<u8>(), recv.cast::<u8>(), count, dtype, op)? };
        let p = r.map_or(ptr::null_mut(), |i| c.request(i).as_handed());
        // SAFETY: checked above.
        unsafe { write(request, p, "request") }
    })
}

pub unsafe extern "C" fn coll_iflush(
    coll_comm: *mut c_void,
    _data: *mut c_void,
    _size: c_int,
    _mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    guard("CollNet iflush", || {
        // SAFETY: comms come from coll_connect (the tag is checked).
        let _: &CollComm = unsafe { borrow(coll_comm, "collComm")? };
        // Host memory needs no flush: a NULL request means done.
        // SAFETY: NCCL passes a writable request pointer (NULL is rejected).
        unsafe { write(request, ptr::null_mut(), "request") }
    })
}

pub unsafe extern "C" fn coll_test(request: *mut c_void, done: *mut c_int, size: *mut c_int) -> NcclResult {
    guard("CollNet test", || {
        non_null(done, "done")?;
        // SAFETY: requests are slots of live comms (the tag is checked).
        let r: &CollRequest = unsafe { borrow(request, "request")? };
        // SAFETY: a slot's owner is the pointer NCCL holds for the comm
        // whose Box holds it (the tag is checked).
        let c: &CollComm = unsafe { borrow(r.owner as *mut c_void, "request's comm")? };
        let out = c.test(r.index);
        // SAFETY: done checked above; size may be NULL (checked).
        unsafe {
            match out {
                Ok(Some(n)) => {
                    *done = 1;
                    if !size.is_null() {
                        *size = c_int::try_from(n).unwrap_or(c_int::MAX);
                    }
                }
                Ok(None) => *done = 0,
                Err(e) => {
                    *done = 0;
                    return Err(e);
                }
            }
        }
        Ok(())
    })
}

pub unsafe extern "C" fn coll_close_coll(coll_comm: *mut c_void) -> NcclResult {
    guard("CollNet closeColl", || {
        // SAFETY: comms come from coll_connect and are closed once (the tag
        // is checked, and closed).
        unsafe { take::<CollComm>(coll_comm, "collComm")? }.close()
    })
}

pub unsafe extern "C" fn coll_close_listen(listen_comm: *mut c_void) -> NcclResult {
    guard("CollNet closeListen", || {
        // SAFETY: listen comms come from coll_listen and are closed once
        // (the tag is checked, and closed).
        drop(unsafe { take::<CollListen>(listen_comm, "listenComm")? });
        Ok(())
    })
}

pub unsafe extern "C" fn coll_finalize(ctx: *mut c_void) -> NcclResult {
    guard("CollNet finalize", || {
        // SAFETY: contexts come from coll_init and are finalized once (the
        // tag is checked, and closed).
        drop(unsafe { take::<CollCtx>(ctx, "ctx")? });
        Ok(())
    })
}
