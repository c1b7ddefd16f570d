//! One face for every ncclNet table version, so the net suite replays NCCL's
//! sequence through each: v11's signatures, reshaped for older tables as
//! NCCL's own shims would (no context, `int` sizes before v9, no profiler
//! handles before v10).
use super::abi::*;
use super::abi_legacy::*;
use super::logger;
use std::ffi::{c_int, c_void, CStr};
use std::ptr;

type Ptr = *mut c_void;
type PPtr = *mut *mut c_void;

/// A `size_t` as v7/v8's `int`: an unrepresentable one becomes negative,
/// which the plugin refuses as the oversize one would be.
fn int(n: usize) -> c_int {
    c_int::try_from(n).unwrap_or(-1)
}

/// The calls of the net suite, with v11's arguments. Every method is
/// unsafe as the C call it makes.
#[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
pub trait NetApi: Sync {
    fn version(&self) -> u32;
    fn name(&self) -> &'static str;
    /// init: the context (NULL for versions before v11, which have one per process).
    unsafe fn init(&self, comm_id: u64) -> (NcclResult, Ptr);
    /// getProperties, checked against the v11 struct of the same device.
    unsafe fn check_properties(&self, dev: c_int, v11: &NetPropertiesV11);
    unsafe fn listen(&self, ctx: Ptr, dev: c_int, handle: Ptr, listen_comm: PPtr) -> NcclResult;
    unsafe fn connect(&self, ctx: Ptr, dev: c_int, handle: Ptr, send_comm: PPtr, dev_comm: PPtr) -> NcclResult;
    unsafe fn accept(&self, listen_comm: Ptr, recv_comm: PPtr, dev_comm: PPtr) -> NcclResult;
    unsafe fn reg_mr(&self, comm: Ptr, data: Ptr, size: usize, kind: c_int, mhandle: PPtr) -> NcclResult;
    unsafe fn dereg_mr(&self, comm: Ptr, mhandle: Ptr) -> NcclResult;
    unsafe fn isend(&self, comm: Ptr, data: Ptr, size: usize, tag: c_int, mh: Ptr, ph: Ptr, request: PPtr) -> NcclResult;
    unsafe fn irecv(
        &self,
        comm: Ptr,
        n: c_int,
        data: PPtr,
        sizes: *mut usize,
        tags: *mut c_int,
        mhs: PPtr,
        phs: PPtr,
        req: PPtr,
    ) -> NcclResult;
    unsafe fn iflush(&self, comm: Ptr, n: c_int, data: PPtr, sizes: *mut c_int, mhs: PPtr, request: PPtr) -> NcclResult;
    unsafe fn test(&self, request: Ptr, done: *mut c_int, sizes: *mut c_int) -> NcclResult;
    unsafe fn close_send(&self, comm: Ptr) -> NcclResult;
    unsafe fn close_recv(&self, comm: Ptr) -> NcclResult;
    unsafe fn close_listen(&self, comm: Ptr) -> NcclResult;
}

/// The entries whose signatures every version shares.
macro_rules! shared_entries {
    () => {
        fn name(&self) -> &'static str {
            // SAFETY: the tables' names are static C strings.
            unsafe { CStr::from_ptr(self.name) }.to_str().unwrap()
        }
        unsafe fn accept(&self, l: Ptr, rc: PPtr, dc: PPtr) -> NcclResult {
            // SAFETY: the C call with the caller's arguments (the method's contract).
            unsafe { (self.accept)(l, rc, dc) }
        }
        unsafe fn dereg_mr(&self, c: Ptr, mh: Ptr) -> NcclResult {
            // SAFETY: the C call with the caller's arguments (the method's contract).
            unsafe { (self.dereg_mr)(c, mh) }
        }
        unsafe fn iflush(&self, c: Ptr, n: c_int, d: PPtr, s: *mut c_int, m: PPtr, r: PPtr) -> NcclResult {
            // SAFETY: the C call with the caller's arguments (the method's contract).
            unsafe { (self.iflush)(c, n, d, s, m, r) }
        }
        unsafe fn test(&self, r: Ptr, d: *mut c_int, s: *mut c_int) -> NcclResult {
            // SAFETY: the C call with the caller's arguments (the method's contract).
            unsafe { (self.test)(r, d, s) }
        }
        unsafe fn close_send(&self, c: Ptr) -> NcclResult {
            // SAFETY: the C call with the caller's arguments (the method's contract).
            unsafe { (self.close_send)(c) }
        }
        unsafe fn close_recv(&self, c: Ptr) -> NcclResult {
            // SAFETY: the C call with the caller's arguments (the method's contract).
            unsafe { (self.close_recv)(c) }
        }
        unsafe fn close_listen(&self, c: Ptr) -> NcclResult {
            // SAFETY: the C call with the caller's arguments (the method's contract).
            unsafe { (self.close_listen)(c) }
        }
    };
}

/// getProperties of an older version: every field it has equals v11's.
macro_rules! check_legacy_properties {
    ($ty:ty) => {
        unsafe fn check_properties(&self, dev: c_int, v11: &NetPropertiesV11) {
            // SAFETY: plain C data, any bit pattern is valid until overwritten.
            let mut p: $ty = unsafe { std::mem::transmute_copy(&[0xabu8; 256]) };
            // SAFETY: the C call with the caller's arguments (the method's contract).
            assert_eq!(unsafe { (self.get_properties)(dev, &mut p) }, NCCL_SUCCESS);
            assert_eq!(p, <$ty>::from_v11(v11), "v{} properties of device {dev}", self.version());
            // SAFETY: the C call with the caller's arguments (the method's contract).
            assert_eq!(unsafe { (self.get_properties)(dev, ptr::null_mut()) }, NCCL_INVALID_ARGUMENT);
        }
    };
}

// v11 and v12: the plugin's own signatures.
impl<P: Copy, V> NetApi for NetTable<P, V> {
    fn version(&self) -> u32 {
        if std::mem::size_of::<P>() == std::mem::size_of::<NetPropertiesV11>() {
            11
        } else {
            12
        }
    }
    shared_entries!();
    unsafe fn init(&self, comm_id: u64) -> (NcclResult, Ptr) {
        let (mut ctx, mut cfg) = (ptr::null_mut(), NetCommConfig { traffic_class: -1 });
        // SAFETY: the C call with the caller's arguments (the method's contract).
        (unsafe { (self.init)(&mut ctx, comm_id, &mut cfg, logger(), ptr::null_mut()) }, ctx)
    }
    unsafe fn check_properties(&self, _dev: c_int, _v11: &NetPropertiesV11) {
        // net_suite::properties checks v11 and v12 field by field.
    }
    unsafe fn listen(&self, ctx: Ptr, dev: c_int, h: Ptr, l: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.listen)(ctx, dev, h, l) }
    }
    unsafe fn connect(&self, ctx: Ptr, dev: c_int, h: Ptr, s: PPtr, d: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.connect)(ctx, dev, h, s, d) }
    }
    unsafe fn reg_mr(&self, c: Ptr, data: Ptr, size: usize, kind: c_int, mh: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.reg_mr)(c, data, size, kind, mh) }
    }
    unsafe fn isend(&self, c: Ptr, d: Ptr, size: usize, tag: c_int, mh: Ptr, ph: Ptr, r: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.isend)(c, d, size, tag, mh, ph, r) }
    }
    unsafe fn irecv(&self, c: Ptr, n: c_int, d: PPtr, s: *mut usize, t: *mut c_int, m: PPtr, ph: PPtr, r: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.irecv)(c, n, d, s, t, m, ph, r) }
    }
}

/// v7 and v8: `int` sizes, no context, no profiler handles.
macro_rules! impl_v7 {
    ($ty:ty, $props:ty, $v:expr, $reg_size:expr) => {
        impl NetApi for $ty {
            fn version(&self) -> u32 {
                $v
            }
            shared_entries!();
            check_legacy_properties!($props);
            unsafe fn init(&self, _comm_id: u64) -> (NcclResult, Ptr) {
                // SAFETY: the C call with the caller's arguments (the method's contract).
                (unsafe { (self.init)(logger()) }, ptr::null_mut())
            }
            unsafe fn listen(&self, _ctx: Ptr, dev: c_int, h: Ptr, l: PPtr) -> NcclResult {
                // SAFETY: the C call with the caller's arguments (the method's contract).
                unsafe { (self.listen)(dev, h, l) }
            }
            unsafe fn connect(&self, _ctx: Ptr, dev: c_int, h: Ptr, s: PPtr, d: PPtr) -> NcclResult {
                // SAFETY: the C call with the caller's arguments (the method's contract).
                unsafe { (self.connect)(dev, h, s, d) }
            }
            unsafe fn reg_mr(&self, c: Ptr, data: Ptr, size: usize, kind: c_int, mh: PPtr) -> NcclResult {
                // SAFETY: the C call with the caller's arguments (the method's contract).
                unsafe { (self.reg_mr)(c, data, $reg_size(size), kind, mh) }
            }
            unsafe fn isend(&self, c: Ptr, d: Ptr, size: usize, tag: c_int, mh: Ptr, _ph: Ptr, r: PPtr) -> NcclResult {
                // SAFETY: the C call with the caller's arguments (the method's contract).
                unsafe { (self.isend)(c, d, int(size), tag, mh, r) }
            }
            unsafe fn irecv(&self, c: Ptr, n: c_int, d: PPtr, s: *mut usize, t: *mut c_int, m: PPtr, _ph: PPtr, r: PPtr) -> NcclResult {
                let mut narrow: Vec<c_int> =
                    // SAFETY: the C call with the caller's arguments (the method's contract).
                    if s.is_null() { Vec::new() } else { (0..n.max(0) as usize).map(|i| int(unsafe { *s.add(i) })).collect() };
                let sp = if s.is_null() { ptr::null_mut() } else { narrow.as_mut_ptr() };
                // SAFETY: the C call with the caller's arguments (the method's contract).
                unsafe { (self.irecv)(c, n, d, sp, t, m, r) }
            }
        }
    };
}

// v7's regMr takes an `int` size, v8's a `size_t`.
impl_v7!(NetV7, NetPropertiesV7, 7, int);
impl_v7!(NetV8, NetPropertiesV8, 8, std::convert::identity);
impl NetApi for NetV9 {
    fn version(&self) -> u32 {
        9
    }
    shared_entries!();
    check_legacy_properties!(NetPropertiesV9);
    unsafe fn init(&self, _comm_id: u64) -> (NcclResult, Ptr) {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        (unsafe { (self.init)(logger()) }, ptr::null_mut())
    }
    unsafe fn listen(&self, _ctx: Ptr, dev: c_int, h: Ptr, l: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.listen)(dev, h, l) }
    }
    unsafe fn connect(&self, _ctx: Ptr, dev: c_int, h: Ptr, s: PPtr, d: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.connect)(dev, h, s, d) }
    }
    unsafe fn reg_mr(&self, c: Ptr, data: Ptr, size: usize, kind: c_int, mh: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.reg_mr)(c, data, size, kind, mh) }
    }
    unsafe fn isend(&self, c: Ptr, d: Ptr, size: usize, tag: c_int, mh: Ptr, _ph: Ptr, r: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.isend)(c, d, size, tag, mh, r) }
    }
    unsafe fn irecv(&self, c: Ptr, n: c_int, d: PPtr, s: *mut usize, t: *mut c_int, m: PPtr, _ph: PPtr, r: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.irecv)(c, n, d, s, t, m, r) }
    }
}

impl NetApi for NetV10 {
    fn version(&self) -> u32 {
        10
    }
    shared_entries!();
    check_legacy_properties!(NetPropertiesV9);
    unsafe fn init(&self, _comm_id: u64) -> (NcclResult, Ptr) {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        (unsafe { (self.init)(logger(), ptr::null_mut()) }, ptr::null_mut())
    }
    unsafe fn listen(&self, _ctx: Ptr, dev: c_int, h: Ptr, l: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.listen)(dev, h, l) }
    }
    unsafe fn connect(&self, _ctx: Ptr, dev: c_int, h: Ptr, s: PPtr, d: PPtr) -> NcclResult {
        let mut cfg = NetCommConfig { traffic_class: -1 };
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.connect)(dev, &mut cfg, h, s, d) }
    }
    unsafe fn reg_mr(&self, c: Ptr, data: Ptr, size: usize, kind: c_int, mh: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.reg_mr)(c, data, size, kind, mh) }
    }
    unsafe fn isend(&self, c: Ptr, d: Ptr, size: usize, tag: c_int, mh: Ptr, ph: Ptr, r: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.isend)(c, d, size, tag, mh, ph, r) }
    }
    unsafe fn irecv(&self, c: Ptr, n: c_int, d: PPtr, s: *mut usize, t: *mut c_int, m: PPtr, ph: PPtr, r: PPtr) -> NcclResult {
        // SAFETY: the C call with the caller's arguments (the method's contract).
        unsafe { (self.irecv)(c, n, d, s, t, m, ph, r) }
    }
}
