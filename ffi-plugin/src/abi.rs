//! The NCCL network plugin ABI, versions 11 and 12, as `#[repr(C)]` Rust.
//!
//! NCCL finds a network plugin by looking up data symbols named
//! `ncclNetPlugin_vN` and `ncclCollNetPlugin_vN` in the library it dlopens:
//! each is a table of function pointers headed by the plugin's name. NCCL
//! 2.28 looks for v11 first, NCCL 2.30 for v12 first; the two versions differ
//! only in the properties struct (v12 has room for 8 virtual-device members
//! instead of 4, and adds rail and plane ids), so the plugin exports both
//! tables over the same functions.
//!
//! The definitions here were written from the field lists of NCCL's public
//! headers (`net_v11.h`, `net_v12.h`, `nccl_net.h`, `net_device.h`); the
//! layouts are pinned below by compile-time size and offset checks. Every C
//! `enum` is an `int` on the platforms NCCL supports.
//!
//! This file depends on nothing but `core`/`std`, so the test harnesses can
//! include it by path and call the built library through the same types.
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_ulong, c_void};
use std::mem::{offset_of, size_of};

/// `ncclResult_t`.
pub type NcclResult = c_int;
pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub const NCCL_INVALID_USAGE: NcclResult = 5;
pub const NCCL_REMOTE_ERROR: NcclResult = 6;

/// Size of the opaque connection handle NCCL exchanges between ranks.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// Requests a communicator may have in flight.
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
/// `ptrSupport` bits and `regMr` types.
pub const NCCL_PTR_HOST: c_int = 0x1;
pub const NCCL_PTR_CUDA: c_int = 0x2;
pub const NCCL_PTR_DMABUF: c_int = 0x4;
/// The value NCCL may store in `*request` before `irecv` for LL/LL128 receives.
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
/// Largest `maxP2pBytes` / `maxCollBytes` NCCL accepts (1 TiB).
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;
/// `ncclNetDeviceType`: a host-side (proxy-driven) transport.
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
/// `netDeviceVersion` of a transport without device offload.
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0;
/// v12's rail/plane ids when the plugin has no such notion.
pub const NCCL_NET_ID_UNDEF: i16 = -1;

/// `ncclDebugLogLevel`.
pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
pub const NCCL_LOG_TRACE: c_int = 5;
/// `ncclDebugLogSubSys` flags the plugin logs under (`NCCL_DEBUG_SUBSYS`).
pub const NCCL_INIT: c_ulong = 0x1;
pub const NCCL_NET: c_ulong = 0x10;

/// `ncclDebugLogger_t`: printf-like, variadic. The plugin always passes the
/// format `"%s"` and one NUL-terminated message.
pub type NcclLogger = unsafe extern "C" fn(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char, ...);

/// `ncclNetVDeviceProps_v11_t` (4 members) and `_v12_t` (8 members).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VDeviceProps<const N: usize> {
    pub ndevs: c_int,
    pub devs: [c_int; N],
}
pub type VDevicePropsV11 = VDeviceProps<4>;
pub type VDevicePropsV12 = VDeviceProps<8>;

/// `ncclNetCommConfig_v11_t` / `_v12_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetCommConfig {
    pub traffic_class: c_int,
}

/// `ncclNetProperties_v11_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPropertiesV11 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    /// Mbit/s.
    pub speed: c_int,
    pub port: c_int,
    /// Microseconds.
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDevicePropsV11,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNetProperties_v12_t`: v11 with 8 virtual-device members, plus rail and plane ids.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPropertiesV12 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDevicePropsV12,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

// The layouts NCCL compiles against (x86-64 and aarch64 LP64).
const _: () = {
    assert!(size_of::<VDevicePropsV11>() == 20);
    assert!(size_of::<VDevicePropsV12>() == 36);
    assert!(offset_of!(NetPropertiesV11, guid) == 16);
    assert!(offset_of!(NetPropertiesV11, latency) == 44);
    assert!(offset_of!(NetPropertiesV11, net_device_type) == 56);
    assert!(offset_of!(NetPropertiesV11, v_props) == 64);
    assert!(offset_of!(NetPropertiesV11, max_p2p_bytes) == 88);
    assert!(offset_of!(NetPropertiesV11, max_coll_bytes) == 96);
    assert!(offset_of!(NetPropertiesV11, max_multi_request_size) == 104);
    assert!(size_of::<NetPropertiesV11>() == 112);
    assert!(offset_of!(NetPropertiesV12, v_props) == 64);
    assert!(offset_of!(NetPropertiesV12, max_p2p_bytes) == 104);
    assert!(offset_of!(NetPropertiesV12, max_multi_request_size) == 120);
    assert!(offset_of!(NetPropertiesV12, rail_id) == 124);
    assert!(offset_of!(NetPropertiesV12, plane_id) == 126);
    assert!(size_of::<NetPropertiesV12>() == 128);
};

/// `ncclNetSGE_v11_t` / `_v12_t` (used only by the optional iallgather /
/// ireducescatter entries, which the plugin leaves NULL).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetSge {
    pub mhandle: *mut c_void,
    pub address: *mut c_void,
    pub size: usize,
}

type Ptr = *mut c_void;
type PPtr = *mut *mut c_void;

/// `ncclNet_v11_t` / `ncclNet_v12_t`, generic over the properties struct
/// (`P`) and the virtual-device properties struct (`V`), the only
/// differences between the two versions.
#[repr(C)]
pub struct NetTable<P, V> {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(ctx: PPtr, comm_id: u64, config: *mut NetCommConfig, log: Option<NcclLogger>, prof: Ptr) -> NcclResult,
    pub devices: unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult,
    pub get_properties: unsafe extern "C" fn(dev: c_int, props: *mut P) -> NcclResult,
    pub listen: unsafe extern "C" fn(ctx: Ptr, dev: c_int, handle: Ptr, listen_comm: PPtr) -> NcclResult,
    pub connect: unsafe extern "C" fn(ctx: Ptr, dev: c_int, handle: Ptr, send_comm: PPtr, send_dev_comm: PPtr) -> NcclResult,
    pub accept: unsafe extern "C" fn(listen_comm: Ptr, recv_comm: PPtr, recv_dev_comm: PPtr) -> NcclResult,
    pub reg_mr: unsafe extern "C" fn(comm: Ptr, data: Ptr, size: usize, kind: c_int, mhandle: PPtr) -> NcclResult,
    pub reg_mr_dma_buf:
        Option<unsafe extern "C" fn(comm: Ptr, data: Ptr, size: usize, kind: c_int, offset: u64, fd: c_int, mhandle: PPtr) -> NcclResult>,
    pub dereg_mr: unsafe extern "C" fn(comm: Ptr, mhandle: Ptr) -> NcclResult,
    pub isend:
        unsafe extern "C" fn(send_comm: Ptr, data: Ptr, size: usize, tag: c_int, mhandle: Ptr, phandle: Ptr, request: PPtr) -> NcclResult,
    #[allow(clippy::type_complexity)]
    pub irecv: unsafe extern "C" fn(
        recv_comm: Ptr,
        n: c_int,
        data: PPtr,
        sizes: *mut usize,
        tags: *mut c_int,
        mhandles: PPtr,
        phandles: PPtr,
        request: PPtr,
    ) -> NcclResult,
    pub iflush: unsafe extern "C" fn(recv_comm: Ptr, n: c_int, data: PPtr, sizes: *mut c_int, mhandles: PPtr, request: PPtr) -> NcclResult,
    pub test: unsafe extern "C" fn(request: Ptr, done: *mut c_int, sizes: *mut c_int) -> NcclResult,
    pub close_send: unsafe extern "C" fn(send_comm: Ptr) -> NcclResult,
    pub close_recv: unsafe extern "C" fn(recv_comm: Ptr) -> NcclResult,
    pub close_listen: unsafe extern "C" fn(listen_comm: Ptr) -> NcclResult,
    pub get_device_mr: Option<unsafe extern "C" fn(comm: Ptr, mhandle: Ptr, dptr_mhandle: PPtr) -> NcclResult>,
    pub irecv_consumed: Option<unsafe extern "C" fn(recv_comm: Ptr, n: c_int, request: Ptr) -> NcclResult>,
    pub make_v_device: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut V) -> NcclResult>,
    pub finalize: unsafe extern "C" fn(ctx: Ptr) -> NcclResult,
    pub set_net_attr: Option<unsafe extern "C" fn(ctx: Ptr, attr: Ptr) -> NcclResult>,
}

pub type NetV11 = NetTable<NetPropertiesV11, VDevicePropsV11>;
pub type NetV12 = NetTable<NetPropertiesV12, VDevicePropsV12>;

/// `ncclCollNet_v11_t` / `ncclCollNet_v12_t`, generic like [`NetTable`].
#[repr(C)]
pub struct CollNetTable<P, V> {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(ctx: PPtr, comm_id: u64, log: Option<NcclLogger>) -> NcclResult,
    pub devices: unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult,
    pub get_properties: unsafe extern "C" fn(dev: c_int, props: *mut P) -> NcclResult,
    pub listen: unsafe extern "C" fn(ctx: Ptr, dev: c_int, handle: Ptr, listen_comm: PPtr) -> NcclResult,
    pub connect: unsafe extern "C" fn(handles: PPtr, nranks: c_int, rank: c_int, listen_comm: Ptr, coll_comm: PPtr) -> NcclResult,
    pub reduce_support: unsafe extern "C" fn(dtype: c_int, op: c_int, supported: *mut c_int) -> NcclResult,
    pub reg_mr: unsafe extern "C" fn(coll_comm: Ptr, data: Ptr, size: usize, kind: c_int, mhandle: PPtr) -> NcclResult,
    pub reg_mr_dma_buf: Option<
        unsafe extern "C" fn(coll_comm: Ptr, data: Ptr, size: usize, kind: c_int, offset: u64, fd: c_int, mhandle: PPtr) -> NcclResult,
    >,
    pub dereg_mr: unsafe extern "C" fn(coll_comm: Ptr, mhandle: Ptr) -> NcclResult,
    #[allow(clippy::type_complexity)]
    pub iallreduce: unsafe extern "C" fn(
        coll_comm: Ptr,
        send: Ptr,
        recv: Ptr,
        count: usize,
        dtype: c_int,
        op: c_int,
        send_mh: Ptr,
        recv_mh: Ptr,
        request: PPtr,
    ) -> NcclResult,
    #[allow(clippy::type_complexity)]
    pub iallgather: Option<
        unsafe extern "C" fn(
            coll_comm: Ptr,
            send: Ptr,
            n_recv_parts: c_int,
            recv_parts: *mut NetSge,
            bytes_per_rank: usize,
            window_offset: usize,
            window_bytes: usize,
            send_mh: Ptr,
            request: PPtr,
        ) -> NcclResult,
    >,
    #[allow(clippy::type_complexity)]
    pub ireducescatter: Option<
        unsafe extern "C" fn(
            coll_comm: Ptr,
            n_send_parts: c_int,
            send_parts: *mut NetSge,
            recv: Ptr,
            bytes_per_rank: usize,
            window_offset: usize,
            window_bytes: usize,
            dtype: c_int,
            op: c_int,
            recv_mh: Ptr,
            request: PPtr,
        ) -> NcclResult,
    >,
    pub iflush: unsafe extern "C" fn(coll_comm: Ptr, data: Ptr, size: c_int, mhandle: Ptr, request: PPtr) -> NcclResult,
    pub test: unsafe extern "C" fn(request: Ptr, done: *mut c_int, size: *mut c_int) -> NcclResult,
    pub close_coll: unsafe extern "C" fn(coll_comm: Ptr) -> NcclResult,
    pub close_listen: unsafe extern "C" fn(listen_comm: Ptr) -> NcclResult,
    pub make_v_device: Option<unsafe extern "C" fn(d: *mut c_int, props: *mut V) -> NcclResult>,
    pub finalize: unsafe extern "C" fn(ctx: Ptr) -> NcclResult,
}

pub type CollNetV11 = CollNetTable<NetPropertiesV11, VDevicePropsV11>;
pub type CollNetV12 = CollNetTable<NetPropertiesV12, VDevicePropsV12>;

// The name plus 21 function pointers for the net table, plus 18 for the
// collnet table: one per field of the headers, in their order.
const _: () = {
    assert!(size_of::<NetV11>() == 22 * 8);
    assert!(offset_of!(NetV11, finalize) == 20 * 8);
    assert!(offset_of!(NetV11, test) == 13 * 8);
    assert!(size_of::<CollNetV11>() == 19 * 8);
    assert!(offset_of!(CollNetV11, iallreduce) == 10 * 8);
    assert!(offset_of!(CollNetV11, finalize) == 18 * 8);
};

// SAFETY: the tables are immutable after construction: function pointers and
// a pointer to a static NUL-terminated string, safe to read from any thread.
unsafe impl<P, V> Sync for NetTable<P, V> {}
// SAFETY: as above.
unsafe impl<P, V> Sync for CollNetTable<P, V> {}
