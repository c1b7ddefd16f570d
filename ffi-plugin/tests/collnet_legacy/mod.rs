//! ncclCollNet through the tables NCCL 2.19-2.27 load (v7-v10): the same
//! servers as the v11 jobs, ranks as threads sharing the process's one
//! CollNet context (those versions have no other), each table's own
//! signatures (`int` sizes and counts in v7/v8). Every element is checked.
use crate::collnet_threads::HandleBoard;
use crate::support::abi::*;
use crate::support::abi_legacy::*;
use crate::support::{logged, logger, null, Plugin, HANDLE};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::time::{Duration, Instant};

type Ptr = *mut c_void;

/// The calls a job makes, with `size_t` sizes (narrowed for v7/v8).
#[allow(clippy::missing_safety_doc)]
pub trait CollApi: Sync {
    unsafe fn init(&self) -> NcclResult;
    unsafe fn devices(&self, n: *mut c_int) -> NcclResult;
    /// getProperties: the name and pciPath it reports.
    unsafe fn name_and_pci(&self) -> (NcclResult, *mut c_char, *mut c_char);
    unsafe fn listen(&self, handle: Ptr, listen_comm: *mut Ptr) -> NcclResult;
    unsafe fn connect(&self, handles: *mut Ptr, n: c_int, rank: c_int, listen_comm: Ptr, comm: *mut Ptr) -> NcclResult;
    unsafe fn reg_mr(&self, comm: Ptr, data: Ptr, size: usize, mh: *mut Ptr) -> NcclResult;
    unsafe fn dereg_mr(&self, comm: Ptr, mh: Ptr) -> NcclResult;
    #[allow(clippy::too_many_arguments)]
    unsafe fn iallreduce(
        &self,
        comm: Ptr,
        s: Ptr,
        r: Ptr,
        count: usize,
        dtype: c_int,
        op: c_int,
        smh: Ptr,
        rmh: Ptr,
        req: *mut Ptr,
    ) -> NcclResult;
    unsafe fn test(&self, req: Ptr, done: *mut c_int, size: *mut c_int) -> NcclResult;
    unsafe fn close_coll(&self, comm: Ptr) -> NcclResult;
    unsafe fn close_listen(&self, comm: Ptr) -> NcclResult;
}

fn int(n: usize) -> c_int {
    c_int::try_from(n).unwrap_or(-1)
}

macro_rules! coll_api {
    ($ty:ty, $props:ty, $reg_size:expr, $count:expr) => {
        impl CollApi for $ty {
            unsafe fn init(&self) -> NcclResult {
                // SAFETY: the C call (the method's contract).
                unsafe { (self.init)(logger()) }
            }
            unsafe fn devices(&self, n: *mut c_int) -> NcclResult {
                // SAFETY: as above.
                unsafe { (self.devices)(n) }
            }
            unsafe fn name_and_pci(&self) -> (NcclResult, *mut c_char, *mut c_char) {
                // SAFETY: plain C data, valid when zeroed; a valid out-pointer.
                let mut p: $props = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let rc = unsafe { (self.get_properties)(0, &mut p) };
                (rc, p.name.cast(), p.pci_path.cast())
            }
            unsafe fn listen(&self, h: Ptr, l: *mut Ptr) -> NcclResult {
                // SAFETY: the C call (the method's contract).
                unsafe { (self.listen)(0, h, l) }
            }
            unsafe fn connect(&self, hs: *mut Ptr, n: c_int, rank: c_int, l: Ptr, c: *mut Ptr) -> NcclResult {
                // SAFETY: as above.
                unsafe { (self.connect)(hs, n, rank, l, c) }
            }
            unsafe fn reg_mr(&self, c: Ptr, d: Ptr, size: usize, mh: *mut Ptr) -> NcclResult {
                // SAFETY: as above.
                unsafe { (self.reg_mr)(c, d, $reg_size(size), NCCL_PTR_HOST, mh) }
            }
            unsafe fn dereg_mr(&self, c: Ptr, mh: Ptr) -> NcclResult {
                // SAFETY: as above.
                unsafe { (self.dereg_mr)(c, mh) }
            }
            unsafe fn iallreduce(
                &self,
                c: Ptr,
                s: Ptr,
                r: Ptr,
                n: usize,
                dt: c_int,
                op: c_int,
                smh: Ptr,
                rmh: Ptr,
                q: *mut Ptr,
            ) -> NcclResult {
                // SAFETY: as above.
                unsafe { (self.iallreduce)(c, s, r, $count(n), dt, op, smh, rmh, q) }
            }
            unsafe fn test(&self, q: Ptr, d: *mut c_int, s: *mut c_int) -> NcclResult {
                // SAFETY: as above.
                unsafe { (self.test)(q, d, s) }
            }
            unsafe fn close_coll(&self, c: Ptr) -> NcclResult {
                // SAFETY: as above.
                unsafe { (self.close_coll)(c) }
            }
            unsafe fn close_listen(&self, c: Ptr) -> NcclResult {
                // SAFETY: as above.
                unsafe { (self.close_listen)(c) }
            }
        }
    };
}

coll_api!(CollNetV7, NetPropertiesV7, int, int);
coll_api!(CollNetV8, NetPropertiesV8, std::convert::identity, int);
// v10's layout is v9's.
coll_api!(CollNetV9, NetPropertiesV9, std::convert::identity, std::convert::identity);

/// (NCCL type, elements): f32 and bf16 sums, one odd size each.
const CASES: &[(c_int, usize)] = &[(7, 1000), (7, 262_147), (9, 300_007)];
const TIMEOUT: Duration = Duration::from_secs(60);

fn value(r: usize, i: usize) -> f32 {
    ((i * 7 + r * 3) % 13) as f32 + 1.0
}

fn encode(dtype: c_int, v: f32, out: &mut Vec<u8>) {
    match dtype {
        7 => out.extend_from_slice(&v.to_le_bytes()),
        // bf16: the top half of an f32 (exact for these small integers).
        _ => out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes()),
    }
}

fn rank(t: &dyn CollApi, v: u32, r: usize, n: usize, board: &HandleBoard) {
    let mut h = [0u8; HANDLE];
    let mut listen = null();
    // SAFETY: a handle buffer of NCCL's size and a valid out-pointer.
    assert_eq!(unsafe { t.listen(h.as_mut_ptr().cast(), &mut listen) }, NCCL_SUCCESS, "v{v} listen");
    let mut all = board.allgather(r, &h);
    let mut ptrs: Vec<Ptr> = all.iter_mut().map(|h| h.as_mut_ptr().cast()).collect();
    let mut comm = null();
    // SAFETY: every rank's handle, a live listen comm.
    assert_eq!(unsafe { t.connect(ptrs.as_mut_ptr(), n as c_int, r as c_int, listen, &mut comm) }, NCCL_SUCCESS, "v{v} connect");
    for &(dtype, count) in CASES {
        let mut send = Vec::new();
        let mut want = Vec::new();
        for i in 0..count {
            encode(dtype, value(r, i), &mut send);
            encode(dtype, (0..n).map(|q| value(q, i)).sum(), &mut want);
        }
        let mut recv = vec![0xeeu8; send.len()];
        let (mut smh, mut rmh, mut req) = (null(), null(), null());
        let t0 = Instant::now();
        // SAFETY: buffers that outlive their registrations and the request.
        unsafe {
            assert_eq!(t.reg_mr(comm, send.as_mut_ptr().cast(), send.len(), &mut smh), NCCL_SUCCESS);
            assert_eq!(t.reg_mr(comm, recv.as_mut_ptr().cast(), recv.len(), &mut rmh), NCCL_SUCCESS);
            while req.is_null() {
                let rc = t.iallreduce(comm, send.as_mut_ptr().cast(), recv.as_mut_ptr().cast(), count, dtype, 0, smh, rmh, &mut req);
                assert_eq!(rc, NCCL_SUCCESS, "v{v} iallreduce");
                assert!(t0.elapsed() < TIMEOUT, "v{v}: the plugin took no iallreduce");
            }
            let (mut done, mut size) = (0, -1);
            while done == 0 {
                assert_eq!(t.test(req, &mut done, &mut size), NCCL_SUCCESS, "v{v} test");
                assert!(t0.elapsed() < TIMEOUT, "v{v}: all-reduce of {count} not done");
            }
            assert_eq!(size as usize, recv.len());
            assert_eq!(t.dereg_mr(comm, smh), NCCL_SUCCESS);
            assert_eq!(t.dereg_mr(comm, rmh), NCCL_SUCCESS);
        }
        let elem = if dtype == 7 { 4 } else { 2 };
        if let Some(i) = (0..count).find(|&i| recv[i * elem..(i + 1) * elem] != want[i * elem..(i + 1) * elem]) {
            panic!("v{v} rank {r}: element {i} of {count} (type {dtype}) is wrong");
        }
    }
    board.barrier.wait();
    // SAFETY: live comms, closed once.
    unsafe {
        assert_eq!(t.close_coll(comm), NCCL_SUCCESS);
        assert_eq!(t.close_listen(listen), NCCL_SUCCESS);
    }
}

/// A job of `n` ranks through each older table in turn; `TALLY_SERVERS`
/// must be set before the first (the context reads it once).
pub fn jobs(p: &Plugin, n: usize, net_name: &str) {
    let tables: [(u32, &'static dyn CollApi); 4] = [(7, p.coll7), (8, p.coll8), (9, p.coll9), (10, p.coll10)];
    for (v, t) in tables {
        let mut ndev = -1;
        // SAFETY: init without a context; valid out-pointers.
        unsafe {
            assert_eq!(t.init(), NCCL_SUCCESS, "v{v} init");
            assert_eq!(t.devices(&mut ndev), NCCL_SUCCESS);
            let (rc, name, _) = t.name_and_pci();
            assert_eq!((rc, ndev), (NCCL_SUCCESS, 1), "v{v}: one CollNet device");
            assert_eq!(CStr::from_ptr(name).to_str().unwrap(), net_name, "v{v}: CollNet rides on the net device");
        }
        let board = HandleBoard::new(n);
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for r in 0..n {
                let board = &board;
                s.spawn(move || rank(t, v, r, n, board));
            }
        });
        eprintln!("ncclCollNet v{v}: {n} ranks, {} all-reduces in {:?}", CASES.len(), t0.elapsed());
    }
    assert!(logged("ncclCollNet v7 (an NCCL before 2.28): one context for the process"));
}
