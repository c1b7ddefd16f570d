//! The NCCL network plugin ABI, versions 7 to 10: the tables NCCL 2.19-2.27 look for.
//!
//! NCCL takes the newest table version it knows that the library exports:
//! 2.19 looks for `_v7` first, 2.20-2.23 for `_v8`, 2.24-2.25 for `_v9`,
//! 2.26-2.27 for `_v10` (2.28 for `_v11`, 2.30 for `_v12`: [`super::abi`]).
//! These versions differ from v11 in ways that matter to a host-memory
//! transport only here:
//!
//! - there is no context: `init` is called once per process (and takes no
//!   comm id), `listen` and `connect` take no context, there is no
//!   `finalize` (NCCL dlcloses the library; it is `-z nodelete`);
//! - v7 and v8 pass sizes and counts as `int` (v7's `regMr` too), v9 and
//!   later as `size_t`; v7-v9's `isend`/`irecv` carry no profiler handles;
//! - v10's `connect` takes the communicator's traffic class;
//! - the properties struct grows: v8 adds `regIsGlobal`, v9 `forceFlush`,
//!   the virtual-device members and the byte limits (v11 then adds
//!   `maxMultiRequestSize`).
//!
//! The field lists were written from the per-version headers of NCCL's
//! public tree (`net_v7.h` .. `net_v10.h`); the layouts are pinned below.
//! Like [`super::abi`], this file depends on nothing but `core`/`std` and
//! that module, so the test harnesses include both by path.
#![allow(dead_code)]

use super::abi::{NcclLogger, NcclResult, NetCommConfig, NetPropertiesV11, NetSge, VDevicePropsV11};
use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

/// `ncclNetProperties_v7_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetPropertiesV7 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v8_t`: v7 plus `regIsGlobal`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetPropertiesV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v9_t` and `_v10_t` (one layout): v11 without
/// `maxMultiRequestSize`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetPropertiesV9 {
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
    pub v_props: VDevicePropsV11,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

impl NetPropertiesV7 {
    pub fn from_v11(p: &NetPropertiesV11) -> Self {
        NetPropertiesV7 {
            name: p.name,
            pci_path: p.pci_path,
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            net_device_type: p.net_device_type,
            net_device_version: p.net_device_version,
        }
    }
}

impl NetPropertiesV8 {
    pub fn from_v11(p: &NetPropertiesV11) -> Self {
        let v7 = NetPropertiesV7::from_v11(p);
        NetPropertiesV8 {
            name: v7.name,
            pci_path: v7.pci_path,
            guid: v7.guid,
            ptr_support: v7.ptr_support,
            reg_is_global: p.reg_is_global,
            speed: v7.speed,
            port: v7.port,
            latency: v7.latency,
            max_comms: v7.max_comms,
            max_recvs: v7.max_recvs,
            net_device_type: v7.net_device_type,
            net_device_version: v7.net_device_version,
        }
    }
}

impl NetPropertiesV9 {
    pub fn from_v11(p: &NetPropertiesV11) -> Self {
        NetPropertiesV9 {
            name: p.name,
            pci_path: p.pci_path,
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: p.reg_is_global,
            force_flush: p.force_flush,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            net_device_type: p.net_device_type,
            net_device_version: p.net_device_version,
            v_props: p.v_props,
            max_p2p_bytes: p.max_p2p_bytes,
            max_coll_bytes: p.max_coll_bytes,
        }
    }
}

// The layouts NCCL compiles against (x86-64 and aarch64 LP64).
const _: () = {
    assert!(offset_of!(NetPropertiesV7, ptr_support) == 24);
    assert!(offset_of!(NetPropertiesV7, latency) == 36);
    assert!(offset_of!(NetPropertiesV7, net_device_version) == 52);
    assert!(size_of::<NetPropertiesV7>() == 56);
    assert!(offset_of!(NetPropertiesV8, speed) == 32);
    assert!(offset_of!(NetPropertiesV8, net_device_version) == 56);
    assert!(size_of::<NetPropertiesV8>() == 64);
    assert!(offset_of!(NetPropertiesV9, latency) == 44);
    assert!(offset_of!(NetPropertiesV9, v_props) == 64);
    assert!(offset_of!(NetPropertiesV9, max_p2p_bytes) == 88);
    assert!(offset_of!(NetPropertiesV9, max_coll_bytes) == 96);
    assert!(size_of::<NetPropertiesV9>() == 104);
};

type Ptr = *mut c_void;
type PPtr = *mut *mut c_void;

/// Entry types the version 7-10 tables share.
pub type ListenFn = unsafe extern "C" fn(dev: c_int, handle: Ptr, listen_comm: PPtr) -> NcclResult;
pub type AcceptFn = unsafe extern "C" fn(listen_comm: Ptr, recv_comm: PPtr, recv_dev_comm: PPtr) -> NcclResult;
pub type RegMrIntFn = unsafe extern "C" fn(comm: Ptr, data: Ptr, size: c_int, kind: c_int, mhandle: PPtr) -> NcclResult;
pub type RegMrFn = unsafe extern "C" fn(comm: Ptr, data: Ptr, size: usize, kind: c_int, mhandle: PPtr) -> NcclResult;
pub type RegMrDmaBufFn =
    unsafe extern "C" fn(comm: Ptr, data: Ptr, size: usize, kind: c_int, offset: u64, fd: c_int, mhandle: PPtr) -> NcclResult;
pub type CloseFn = unsafe extern "C" fn(comm: Ptr) -> NcclResult;
pub type DeregMrFn = unsafe extern "C" fn(comm: Ptr, mhandle: Ptr) -> NcclResult;
pub type IflushFn =
    unsafe extern "C" fn(recv_comm: Ptr, n: c_int, data: PPtr, sizes: *mut c_int, mhandles: PPtr, request: PPtr) -> NcclResult;
pub type TestFn = unsafe extern "C" fn(request: Ptr, done: *mut c_int, sizes: *mut c_int) -> NcclResult;
pub type GetDeviceMrFn = unsafe extern "C" fn(comm: Ptr, mhandle: Ptr, dptr_mhandle: PPtr) -> NcclResult;
pub type IrecvConsumedFn = unsafe extern "C" fn(recv_comm: Ptr, n: c_int, request: Ptr) -> NcclResult;
pub type MakeVDeviceFn = unsafe extern "C" fn(d: *mut c_int, props: *mut VDevicePropsV11) -> NcclResult;
pub type InitFn = unsafe extern "C" fn(log: Option<NcclLogger>) -> NcclResult;
pub type DevicesFn = unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult;
pub type ConnectFn = unsafe extern "C" fn(dev: c_int, handle: Ptr, send_comm: PPtr, send_dev_comm: PPtr) -> NcclResult;

/// `ncclNet_v7_t` (`R` = [`RegMrIntFn`], `P` = v7 properties) and
/// `ncclNet_v8_t` (`R` = [`RegMrFn`], `P` = v8 properties): sizes are `int`.
#[repr(C)]
pub struct NetTableV7<P, R> {
    pub name: *const c_char,
    pub init: InitFn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(dev: c_int, props: *mut P) -> NcclResult,
    pub listen: ListenFn,
    pub connect: ConnectFn,
    pub accept: AcceptFn,
    pub reg_mr: R,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub isend: unsafe extern "C" fn(send_comm: Ptr, data: Ptr, size: c_int, tag: c_int, mhandle: Ptr, request: PPtr) -> NcclResult,
    #[allow(clippy::type_complexity)]
    pub irecv: unsafe extern "C" fn(
        recv_comm: Ptr,
        n: c_int,
        data: PPtr,
        sizes: *mut c_int,
        tags: *mut c_int,
        mhandles: PPtr,
        request: PPtr,
    ) -> NcclResult,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
}

pub type NetV7 = NetTableV7<NetPropertiesV7, RegMrIntFn>;
pub type NetV8 = NetTableV7<NetPropertiesV8, RegMrFn>;

/// `ncclNet_v9_t`: `size_t` sizes, no profiler handles, virtual devices.
#[repr(C)]
pub struct NetV9 {
    pub name: *const c_char,
    pub init: InitFn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(dev: c_int, props: *mut NetPropertiesV9) -> NcclResult,
    pub listen: ListenFn,
    pub connect: ConnectFn,
    pub accept: AcceptFn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub isend: unsafe extern "C" fn(send_comm: Ptr, data: Ptr, size: usize, tag: c_int, mhandle: Ptr, request: PPtr) -> NcclResult,
    #[allow(clippy::type_complexity)]
    pub irecv: unsafe extern "C" fn(
        recv_comm: Ptr,
        n: c_int,
        data: PPtr,
        sizes: *mut usize,
        tags: *mut c_int,
        mhandles: PPtr,
        request: PPtr,
    ) -> NcclResult,
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
    pub make_v_device: Option<MakeVDeviceFn>,
}

/// `ncclNet_v10_t`: v9 with a profiler callback to `init`, the traffic
/// class to `connect` and profiler handles to `isend`/`irecv` (whose
/// signatures are then v11's).
#[repr(C)]
pub struct NetV10 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(log: Option<NcclLogger>, prof: Ptr) -> NcclResult,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(dev: c_int, props: *mut NetPropertiesV9) -> NcclResult,
    pub listen: ListenFn,
    pub connect:
        unsafe extern "C" fn(dev: c_int, config: *mut NetCommConfig, handle: Ptr, send_comm: PPtr, send_dev_comm: PPtr) -> NcclResult,
    pub accept: AcceptFn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
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
    pub iflush: IflushFn,
    pub test: TestFn,
    pub close_send: CloseFn,
    pub close_recv: CloseFn,
    pub close_listen: CloseFn,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
    pub make_v_device: Option<MakeVDeviceFn>,
}

pub type CollConnectFn = unsafe extern "C" fn(handles: PPtr, nranks: c_int, rank: c_int, listen_comm: Ptr, coll_comm: PPtr) -> NcclResult;
pub type ReduceSupportFn = unsafe extern "C" fn(dtype: c_int, op: c_int, supported: *mut c_int) -> NcclResult;
pub type CollIflushFn = unsafe extern "C" fn(coll_comm: Ptr, data: Ptr, size: c_int, mhandle: Ptr, request: PPtr) -> NcclResult;
/// `iallreduce` with the element count as `int` (v7, v8) or `size_t` (`C` = usize, v9+).
pub type IallreduceFn<C> = unsafe extern "C" fn(
    coll_comm: Ptr,
    send: Ptr,
    recv: Ptr,
    count: C,
    dtype: c_int,
    op: c_int,
    send_mh: Ptr,
    recv_mh: Ptr,
    request: PPtr,
) -> NcclResult;

/// `ncclNetSGE_v8_t`: v8's scatter-gather entry has a 32-bit size.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetSgeV8 {
    pub mhandle: *mut c_void,
    pub address: *mut c_void,
    pub size: u32,
}

/// The optional `iallgather` of v8 and later (NULL in the plugin).
pub type IallgatherFn<S> = unsafe extern "C" fn(Ptr, Ptr, c_int, *mut S, usize, usize, usize, Ptr, PPtr) -> NcclResult;
/// The optional `ireducescatter` of v8 and later (NULL in the plugin).
pub type IreducescatterFn<S> = unsafe extern "C" fn(Ptr, c_int, *mut S, Ptr, usize, usize, usize, c_int, c_int, Ptr, PPtr) -> NcclResult;

/// `ncclCollNet_v7_t`: `int` sizes and counts, no gather/scatter entries.
#[repr(C)]
pub struct CollNetV7 {
    pub name: *const c_char,
    pub init: InitFn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(dev: c_int, props: *mut NetPropertiesV7) -> NcclResult,
    pub listen: ListenFn,
    pub connect: CollConnectFn,
    pub reduce_support: ReduceSupportFn,
    pub reg_mr: RegMrIntFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub iallreduce: IallreduceFn<c_int>,
    pub iflush: CollIflushFn,
    pub test: TestFn,
    pub close_coll: CloseFn,
    pub close_listen: CloseFn,
}

/// `ncclCollNet_v8_t`: v7 with `size_t` registrations and the optional
/// gather/scatter entries; counts are still `int`.
#[repr(C)]
pub struct CollNetV8 {
    pub name: *const c_char,
    pub init: InitFn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(dev: c_int, props: *mut NetPropertiesV8) -> NcclResult,
    pub listen: ListenFn,
    pub connect: CollConnectFn,
    pub reduce_support: ReduceSupportFn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub iallreduce: IallreduceFn<c_int>,
    pub iallgather: Option<IallgatherFn<NetSgeV8>>,
    pub ireducescatter: Option<IreducescatterFn<NetSgeV8>>,
    pub iflush: CollIflushFn,
    pub test: TestFn,
    pub close_coll: CloseFn,
    pub close_listen: CloseFn,
}

/// `ncclCollNet_v9_t` and `ncclCollNet_v10_t` (one layout): `size_t` counts.
#[repr(C)]
pub struct CollNetV9 {
    pub name: *const c_char,
    pub init: InitFn,
    pub devices: DevicesFn,
    pub get_properties: unsafe extern "C" fn(dev: c_int, props: *mut NetPropertiesV9) -> NcclResult,
    pub listen: ListenFn,
    pub connect: CollConnectFn,
    pub reduce_support: ReduceSupportFn,
    pub reg_mr: RegMrFn,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: DeregMrFn,
    pub iallreduce: IallreduceFn<usize>,
    pub iallgather: Option<IallgatherFn<NetSge>>,
    pub ireducescatter: Option<IreducescatterFn<NetSge>>,
    pub iflush: CollIflushFn,
    pub test: TestFn,
    pub close_coll: CloseFn,
    pub close_listen: CloseFn,
    pub make_v_device: Option<MakeVDeviceFn>,
}
pub type CollNetV10 = CollNetV9;

// The name plus one function pointer per field of the headers, in their order.
const _: () = {
    assert!(size_of::<NetV7>() == 19 * 8);
    assert!(size_of::<NetV8>() == 19 * 8);
    assert!(offset_of!(NetV7, test) == 13 * 8);
    assert!(size_of::<NetV9>() == 20 * 8);
    assert!(size_of::<NetV10>() == 20 * 8);
    assert!(offset_of!(NetV10, make_v_device) == 19 * 8);
    assert!(size_of::<CollNetV7>() == 15 * 8);
    assert!(offset_of!(CollNetV7, iallreduce) == 10 * 8);
    assert!(size_of::<CollNetV8>() == 17 * 8);
    assert!(offset_of!(CollNetV8, iflush) == 13 * 8);
    assert!(size_of::<CollNetV9>() == 18 * 8);
    assert!(size_of::<NetSgeV8>() == 24);
};

// SAFETY: the tables are immutable after construction: function pointers and
// a pointer to a static NUL-terminated string, safe to read from any thread.
unsafe impl<P, R> Sync for NetTableV7<P, R> {}
// SAFETY: as above.
unsafe impl Sync for NetV9 {}
// SAFETY: as above.
unsafe impl Sync for NetV10 {}
// SAFETY: as above.
unsafe impl Sync for CollNetV7 {}
// SAFETY: as above.
unsafe impl Sync for CollNetV8 {}
// SAFETY: as above.
unsafe impl Sync for CollNetV9 {}
