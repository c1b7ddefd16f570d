//! libnccl-net-tally.so: tally's NCCL network plugin.
//!
//! NCCL loads the library named by `NCCL_NET_PLUGIN` (`tally` finds
//! `libnccl-net-tally.so` on the library path; an absolute path works too)
//! and looks up the tables exported here. `NCCL_NET=Tally` selects it.
//!
//! - **ncclNet** ([`net`]): point-to-point messages between GPUs' proxy
//!   threads over tally's libfabric layer: EFA on AWS, `tcp;ofi_rxm` or `shm`
//!   elsewhere (`TALLY_PROVIDER`). Host memory only: NCCL stages GPU data
//!   through pinned host buffers.
//! - **ncclCollNet** ([`collnet`]): whole all-reduces handed to tally
//!   reduction servers (`TALLY_SERVERS`), NCCL's CollNet algorithms.
//!
//! The library exports twelve symbols and nothing else: `ncclNetPlugin_vN`
//! and `ncclCollNetPlugin_vN` for N = 7 to 12. NCCL takes the newest version
//! it knows: 2.19 v7, 2.20-2.23 v8, 2.24-2.25 v9, 2.26-2.27 v10, 2.28-2.29
//! v11, 2.30 v12. v11 and v12 share their functions (only the properties
//! differ); v7-v10 are thin adapters over them ([`ffi_legacy`]). Layout of
//! the crate: [`abi`] and [`abi_legacy`] have the C types, [`ffi`] the C
//! entry points (pointer checks, panic catching, error codes, logging: the
//! only place NCCL's raw pointers are dereferenced), [`handed`] the objects
//! handed to NCCL as `void*`, tagged by kind and checked on the way back
//! (the only way from NCCL's `void*` to a plugin object), and [`net`],
//! [`collnet`], [`device`] the safe core. The plugin starts no threads:
//! everything runs on NCCL's threads, inside its calls.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod abi_legacy;
pub mod collnet;
pub mod device;
pub mod error;
pub mod ffi;
pub mod ffi_legacy;
pub mod handed;
pub mod log;
pub mod net;

use abi::{CollNetV11, CollNetV12, NetV11, NetV12};
use abi_legacy::{CollNetV10, CollNetV7, CollNetV8, CollNetV9, NetV10, NetV7, NetV8, NetV9};
use ffi_legacy as old;
use std::ffi::c_char;

/// The name NCCL matches against `NCCL_NET` (case-insensitively) and logs.
const NAME: *const c_char = c"Tally".as_ptr();

macro_rules! net_table {
    ($props:ident) => {
        abi::NetTable {
            name: NAME,
            init: ffi::net_init,
            devices: ffi::net_devices,
            get_properties: ffi::$props,
            listen: ffi::net_listen,
            connect: ffi::net_connect,
            accept: ffi::net_accept,
            reg_mr: ffi::net_reg_mr,
            // No DMA-BUF: ptrSupport does not claim NCCL_PTR_DMABUF.
            reg_mr_dma_buf: None,
            dereg_mr: ffi::net_dereg_mr,
            isend: ffi::net_isend,
            irecv: ffi::net_irecv,
            iflush: ffi::net_iflush,
            test: ffi::net_test,
            close_send: ffi::net_close_send,
            close_recv: ffi::net_close_recv,
            close_listen: ffi::net_close_listen,
            // No device offload, no virtual NICs, no traffic attributes.
            get_device_mr: None,
            irecv_consumed: None,
            make_v_device: None,
            finalize: ffi::net_finalize,
            set_net_attr: None,
        }
    };
}

macro_rules! collnet_table {
    ($props:ident) => {
        abi::CollNetTable {
            name: NAME,
            init: ffi::coll_init,
            devices: ffi::coll_devices,
            get_properties: ffi::$props,
            listen: ffi::coll_listen,
            connect: ffi::coll_connect,
            reduce_support: ffi::coll_reduce_support,
            reg_mr: ffi::coll_reg_mr,
            reg_mr_dma_buf: None,
            dereg_mr: ffi::coll_dereg_mr,
            iallreduce: ffi::coll_iallreduce,
            // All-reduce only: NCCL uses CollNet for nothing else then.
            iallgather: None,
            ireducescatter: None,
            iflush: ffi::coll_iflush,
            test: ffi::coll_test,
            close_coll: ffi::coll_close_coll,
            close_listen: ffi::coll_close_listen,
            make_v_device: None,
            finalize: ffi::coll_finalize,
        }
    };
}

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclNetPlugin_v11: NetV11 = net_table!(net_get_properties_v11);

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclNetPlugin_v12: NetV12 = net_table!(net_get_properties_v12);

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclCollNetPlugin_v11: CollNetV11 = collnet_table!(coll_get_properties_v11);

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclCollNetPlugin_v12: CollNetV12 = collnet_table!(coll_get_properties_v12);

// The tables of NCCL 2.19-2.27 (abi_legacy): the v11 functions where the
// signature did not change, adapters (ffi_legacy) where it did. Optional
// entries are NULL as in v11/v12.

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclNetPlugin_v7: NetV7 = abi_legacy::NetTableV7 {
    name: NAME,
    init: old::net_init_v7,
    devices: ffi::net_devices,
    get_properties: old::net_get_properties_v7,
    listen: old::net_listen,
    connect: old::net_connect,
    accept: ffi::net_accept,
    reg_mr: old::net_reg_mr_v7,
    reg_mr_dma_buf: None,
    dereg_mr: ffi::net_dereg_mr,
    isend: old::net_isend_v7,
    irecv: old::net_irecv_v7,
    iflush: ffi::net_iflush,
    test: ffi::net_test,
    close_send: ffi::net_close_send,
    close_recv: ffi::net_close_recv,
    close_listen: ffi::net_close_listen,
    get_device_mr: None,
    irecv_consumed: None,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclNetPlugin_v8: NetV8 = abi_legacy::NetTableV7 {
    name: NAME,
    init: old::net_init_v8,
    devices: ffi::net_devices,
    get_properties: old::net_get_properties_v8,
    listen: old::net_listen,
    connect: old::net_connect,
    accept: ffi::net_accept,
    reg_mr: ffi::net_reg_mr,
    reg_mr_dma_buf: None,
    dereg_mr: ffi::net_dereg_mr,
    isend: old::net_isend_v7,
    irecv: old::net_irecv_v7,
    iflush: ffi::net_iflush,
    test: ffi::net_test,
    close_send: ffi::net_close_send,
    close_recv: ffi::net_close_recv,
    close_listen: ffi::net_close_listen,
    get_device_mr: None,
    irecv_consumed: None,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclNetPlugin_v9: NetV9 = NetV9 {
    name: NAME,
    init: old::net_init_v9,
    devices: ffi::net_devices,
    get_properties: old::net_get_properties_v9,
    listen: old::net_listen,
    connect: old::net_connect,
    accept: ffi::net_accept,
    reg_mr: ffi::net_reg_mr,
    reg_mr_dma_buf: None,
    dereg_mr: ffi::net_dereg_mr,
    isend: old::net_isend_v9,
    irecv: old::net_irecv_v9,
    iflush: ffi::net_iflush,
    test: ffi::net_test,
    close_send: ffi::net_close_send,
    close_recv: ffi::net_close_recv,
    close_listen: ffi::net_close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclNetPlugin_v10: NetV10 = NetV10 {
    name: NAME,
    init: old::net_init_v10,
    devices: ffi::net_devices,
    // v9's layout.
    get_properties: old::net_get_properties_v9,
    listen: old::net_listen,
    connect: old::net_connect_v10,
    accept: ffi::net_accept,
    reg_mr: ffi::net_reg_mr,
    reg_mr_dma_buf: None,
    dereg_mr: ffi::net_dereg_mr,
    isend: ffi::net_isend,
    irecv: ffi::net_irecv,
    iflush: ffi::net_iflush,
    test: ffi::net_test,
    close_send: ffi::net_close_send,
    close_recv: ffi::net_close_recv,
    close_listen: ffi::net_close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_v_device: None,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclCollNetPlugin_v7: CollNetV7 = CollNetV7 {
    name: NAME,
    init: old::coll_init_v7,
    devices: ffi::coll_devices,
    get_properties: old::coll_get_properties_v7,
    listen: old::coll_listen,
    connect: ffi::coll_connect,
    reduce_support: ffi::coll_reduce_support,
    reg_mr: old::coll_reg_mr_v7,
    reg_mr_dma_buf: None,
    dereg_mr: ffi::coll_dereg_mr,
    iallreduce: old::coll_iallreduce_v7,
    iflush: ffi::coll_iflush,
    test: ffi::coll_test,
    close_coll: ffi::coll_close_coll,
    close_listen: ffi::coll_close_listen,
};

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclCollNetPlugin_v8: CollNetV8 = CollNetV8 {
    name: NAME,
    init: old::coll_init_v8,
    devices: ffi::coll_devices,
    get_properties: old::coll_get_properties_v8,
    listen: old::coll_listen,
    connect: ffi::coll_connect,
    reduce_support: ffi::coll_reduce_support,
    reg_mr: ffi::coll_reg_mr,
    reg_mr_dma_buf: None,
    dereg_mr: ffi::coll_dereg_mr,
    iallreduce: old::coll_iallreduce_v7,
    iallgather: None,
    ireducescatter: None,
    iflush: ffi::coll_iflush,
    test: ffi::coll_test,
    close_coll: ffi::coll_close_coll,
    close_listen: ffi::coll_close_listen,
};

macro_rules! collnet_table_v9 {
    ($init:ident) => {
        CollNetV9 {
            name: NAME,
            init: old::$init,
            devices: ffi::coll_devices,
            get_properties: old::coll_get_properties_v9,
            listen: old::coll_listen,
            connect: ffi::coll_connect,
            reduce_support: ffi::coll_reduce_support,
            reg_mr: ffi::coll_reg_mr,
            reg_mr_dma_buf: None,
            dereg_mr: ffi::coll_dereg_mr,
            iallreduce: ffi::coll_iallreduce,
            iallgather: None,
            ireducescatter: None,
            iflush: ffi::coll_iflush,
            test: ffi::coll_test,
            close_coll: ffi::coll_close_coll,
            close_listen: ffi::coll_close_listen,
            make_v_device: None,
        }
    };
}

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclCollNetPlugin_v9: CollNetV9 = collnet_table_v9!(coll_init_v9);

#[allow(non_upper_case_globals)]
#[no_mangle]
pub static ncclCollNetPlugin_v10: CollNetV10 = collnet_table_v9!(coll_init_v10);
