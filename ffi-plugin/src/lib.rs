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
//! The library exports four symbols and nothing else: `ncclNetPlugin_v11`,
//! `ncclNetPlugin_v12`, `ncclCollNetPlugin_v11`, `ncclCollNetPlugin_v12`
//! (NCCL 2.28 looks for v11 first, 2.30 for v12; both tables share the same
//! functions). Layout of the crate: [`abi`] has the C types, [`ffi`] the C
//! entry points (pointer checks, panic catching, error codes, logging: the
//! only place NCCL's raw pointers are dereferenced), and [`net`],
//! [`collnet`], [`device`] the safe core. The plugin starts no threads:
//! everything runs on NCCL's threads, inside its calls.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod collnet;
pub mod device;
pub mod error;
pub mod ffi;
pub mod log;
pub mod net;

use abi::{CollNetV11, CollNetV12, NetV11, NetV12};
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
