//! The library's face to NCCL: exactly twelve exported symbols, tables that
//! NCCL can use, and entry points that refuse bad arguments with error codes
//! instead of crashing, a pointer of the wrong kind included. (The data
//! paths are in net_shm.rs, net_tcp.rs and plugin_collnet.rs.)
mod support;

use std::ffi::{c_int, CStr};
use support::abi::*;
use support::*;

/// Names of the defined, globally visible symbols of an ELF64 shared
/// object's dynamic symbol table (what `nm -D --defined-only` lists).
fn exported_symbols(path: &std::path::Path) -> Vec<String> {
    let f = std::fs::read(path).unwrap();
    assert_eq!(&f[0..4], b"\x7fELF", "not ELF");
    assert_eq!(f[4], 2, "not ELF64");
    let u16_at = |o: usize| u16::from_le_bytes(f[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(f[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(f[o..o + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let section = |i: usize| {
        let s = shoff + i * shentsize;
        (u32_at(s + 4), u64_at(s + 24), u64_at(s + 32), u32_at(s + 40))
    };
    const SHT_DYNSYM: usize = 11;
    let (_, symoff, symsize, link) = (0..shnum).map(section).find(|s| s.0 == SHT_DYNSYM).expect("no .dynsym");
    let (_, stroff, _, _) = section(link);
    let mut names = Vec::new();
    for s in (symoff..symoff + symsize).step_by(24) {
        let (name, info, other, shndx) = (u32_at(s), f[s + 4], f[s + 5], u16_at(s + 6));
        let bind = info >> 4;
        let visible = matches!(other & 3, 0 | 3);
        if shndx != 0 && matches!(bind, 1 | 2 | 10) && visible {
            let n = CStr::from_bytes_until_nul(&f[stroff + name..]).unwrap().to_string_lossy().into_owned();
            names.push(n);
        }
    }
    names.sort();
    names
}

#[test]
fn exports_exactly_the_plugin_tables_of_nccl_2_19_to_2_30() {
    let lib = built_library();
    let syms = exported_symbols(&lib);
    let mut want: Vec<String> = (7..=12).flat_map(|v| [format!("ncclNetPlugin_v{v}"), format!("ncclCollNetPlugin_v{v}")]).collect();
    want.sort();
    assert_eq!(syms, want, "dynamic symbols of {}", lib.display());
    // Cross-check with binutils where it is installed.
    if let Ok(out) = std::process::Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output() {
        if out.status.success() {
            let mut nm: Vec<String> =
                String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().nth(2).map(str::to_string)).collect();
            nm.sort();
            assert_eq!(nm, syms, "nm -D --defined-only disagrees");
        }
    }
}

#[test]
fn tables_are_complete_and_named_tally() {
    let p = load();
    let names = [p.net11.name, p.net12.name, p.coll11.name, p.coll12.name, p.net7.name, p.net8.name, p.net9.name, p.net10.name];
    for name in names.into_iter().chain([p.coll7.name, p.coll8.name, p.coll9.name, p.coll10.name]) {
        // SAFETY: the tables' names are static C strings.
        assert_eq!(unsafe { CStr::from_ptr(name) }.to_str().unwrap(), "Tally");
    }
    // Optional entries the plugin does not implement are NULL, as NCCL expects.
    assert!(p.net11.reg_mr_dma_buf.is_none() && p.net11.get_device_mr.is_none() && p.net11.irecv_consumed.is_none());
    assert!(p.net11.make_v_device.is_none() && p.net11.set_net_attr.is_none());
    assert!(p.coll11.iallgather.is_none() && p.coll11.ireducescatter.is_none() && p.coll11.reg_mr_dma_buf.is_none());
    // Both versions share the functions; only getProperties differs.
    assert_eq!(p.net11.isend as usize, p.net12.isend as usize);
    assert_eq!(p.coll11.iallreduce as usize, p.coll12.iallreduce as usize);
    assert_ne!(p.net11.get_properties as usize, p.net12.get_properties as usize);
    // The older tables: v11's functions where the signatures match, NULL optional entries.
    assert_eq!(p.net10.isend as usize, p.net11.isend as usize);
    assert_eq!(p.net7.test as usize, p.net11.test as usize);
    assert_eq!(p.coll9.iallreduce as usize, p.coll11.iallreduce as usize);
    assert_eq!(p.coll7.connect as usize, p.coll11.connect as usize);
    assert!(p.net7.get_device_mr.is_none() && p.net8.irecv_consumed.is_none() && p.net9.make_v_device.is_none());
    assert!(p.net10.reg_mr_dma_buf.is_none() && p.coll8.iallgather.is_none() && p.coll10.ireducescatter.is_none());
}

/// v7 and v8 pass sizes and counts as `int`: a negative one is refused
/// before anything is touched, and so is a NULL properties pointer.
#[test]
fn older_tables_refuse_negative_sizes() {
    let p = load();
    let (mut out, mut req) = (null(), null());
    let mut buf = [0u8; 16];
    let b = buf.as_mut_ptr().cast::<std::ffi::c_void>();
    // SAFETY: every call gets an argument the plugin must refuse first.
    unsafe {
        assert_eq!((p.net7.reg_mr)(null(), b, -1, NCCL_PTR_HOST, &mut out), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net7.isend)(null(), b, -16, 0, null(), &mut req), NCCL_INVALID_ARGUMENT);
        let (mut d, mut sz, mut tag, mut mh) = (b, -4 as c_int, 0 as c_int, null());
        assert_eq!((p.net8.irecv)(null(), 1, &mut d, &mut sz, &mut tag, &mut mh, &mut req), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll7.reg_mr)(null(), b, -1, NCCL_PTR_HOST, &mut out), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll8.iallreduce)(null(), b, b, -1, 7, 0, null(), null(), &mut req), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net7.get_properties)(0, std::ptr::null_mut()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll9.get_properties)(0, std::ptr::null_mut()), NCCL_INVALID_ARGUMENT);
    }
}

#[test]
fn null_and_bad_arguments_get_error_codes() {
    let p = load();
    let mut out = null();
    let mut n: c_int = 0;
    let mut req = null();
    // SAFETY: every call below gets an invalid argument the plugin must
    // refuse before touching anything.
    unsafe {
        assert_eq!((p.net11.init)(std::ptr::null_mut(), 1, std::ptr::null_mut(), logger(), null()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.devices)(std::ptr::null_mut()), NCCL_INVALID_ARGUMENT);
        let mut h = [0u8; HANDLE];
        assert_eq!((p.net11.listen)(null(), 0, h.as_mut_ptr().cast(), &mut out), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.connect)(null(), 0, h.as_mut_ptr().cast(), &mut out, null().cast()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.connect)(null(), 0, h.as_mut_ptr().cast(), std::ptr::null_mut(), null().cast()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.accept)(null(), &mut out, null().cast()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.reg_mr)(null(), h.as_mut_ptr().cast(), 16, NCCL_PTR_HOST, &mut out), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.dereg_mr)(null(), null()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.isend)(null(), h.as_mut_ptr().cast(), 16, 0, null(), null(), &mut req), NCCL_INVALID_ARGUMENT);
        assert_eq!(
            (p.net11.irecv)(
                null(),
                1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut req
            ),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            (p.net11.iflush)(null(), 1, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), &mut req),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!((p.net11.test)(null(), &mut n, &mut n), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.close_send)(null()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.close_recv)(null()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.close_listen)(null()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.net11.finalize)(null()), NCCL_INVALID_ARGUMENT);

        assert_eq!((p.coll11.init)(std::ptr::null_mut(), 1, logger()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.devices)(std::ptr::null_mut()), NCCL_INVALID_ARGUMENT);
        let mut props: NetPropertiesV11 = std::mem::zeroed();
        assert_eq!((p.coll11.get_properties)(5, &mut props), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.listen)(null(), 0, h.as_mut_ptr().cast(), &mut out), NCCL_INVALID_ARGUMENT);
        let mut hp = [h.as_mut_ptr().cast::<std::ffi::c_void>()];
        assert_eq!((p.coll11.connect)(hp.as_mut_ptr(), 1, 0, null(), &mut out), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.connect)(std::ptr::null_mut(), 1, 0, null(), &mut out), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.reduce_support)(7, 0, std::ptr::null_mut()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.iallreduce)(null(), null(), null(), 4, 7, 0, null(), null(), &mut req), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.iflush)(null(), null(), 0, null(), &mut req), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.test)(null(), &mut n, &mut n), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.close_coll)(null()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.close_listen)(null()), NCCL_INVALID_ARGUMENT);
        assert_eq!((p.coll11.finalize)(null()), NCCL_INVALID_ARGUMENT);
    }
}

#[test]
fn reduce_support_is_every_nccl_type_and_op_and_nothing_else() {
    let p = load();
    for dtype in -1..16 {
        for op in -1..8 {
            let mut s: c_int = -7;
            // SAFETY: valid out-pointer.
            assert_eq!(unsafe { (p.coll12.reduce_support)(dtype, op, &mut s) }, NCCL_SUCCESS);
            // NCCL types 0..=9 (int8 .. bfloat16; fp8 types 10 and 11 are not
            // reduced by tally) and ops sum, prod, max, min, avg.
            let want = (0..=9).contains(&dtype) && (0..=4).contains(&op);
            assert_eq!(s, want as c_int, "dtype {dtype} op {op}");
        }
    }
}

/// Every pointer NCCL passes back is checked to be an open object of the kind
/// the call expects (ffi-plugin/src/handed.rs): a listen comm where a send
/// comm or a request belongs, a ncclNet comm given to CollNet, a CollNet
/// listen comm given to ncclNet, a comm where a memory handle belongs, are
/// each refused with ncclInvalidArgument (the log names both kinds), and
/// nothing is freed or changed: the same objects then carry a message and
/// close cleanly.
#[test]
fn a_handle_of_the_wrong_kind_is_refused_and_the_plugin_keeps_working() {
    // Before the first init, which reads them; no other test here gets as
    // far as reading them. Over tcp (net_shm covers shm). CollNet listen
    // needs a server list (nothing connects to it).
    std::env::set_var("TALLY_PROVIDER", "tcp");
    std::env::set_var("TALLY_FABRIC_ADDR", "127.0.0.1");
    std::env::set_var("TALLY_SERVERS", "127.0.0.1:9");
    let p = load();
    let (n, c) = (p.net11, p.coll11);
    let (mut ctx, mut cctx) = (null(), null());
    let (mut done, mut size): (c_int, c_int) = (0, 0);
    let mut buf = [0u8; 64];
    let mut rbuf = [0u8; 64];
    let b = buf.as_mut_ptr().cast::<std::ffi::c_void>();
    // SAFETY: valid out-pointers and buffers that outlive every request and
    // registration; every object passed is live (made here, closed at the end).
    unsafe {
        assert_eq!((n.init)(&mut ctx, 0x4b1d, std::ptr::null_mut(), logger(), null()), NCCL_SUCCESS);
        assert_eq!((c.init)(&mut cctx, 0x4b1e, logger()), NCCL_SUCCESS);
        let mut h = [0u8; HANDLE];
        let mut listen = null();
        assert_eq!((n.listen)(ctx, 0, h.as_mut_ptr().cast(), &mut listen), NCCL_SUCCESS);
        let (mut send, mut recv) = (null(), null());
        let t0 = std::time::Instant::now();
        while send.is_null() || recv.is_null() {
            if send.is_null() {
                assert_eq!((n.connect)(ctx, 0, h.as_mut_ptr().cast(), &mut send, null().cast()), NCCL_SUCCESS);
            }
            if recv.is_null() {
                assert_eq!((n.accept)(listen, &mut recv, null().cast()), NCCL_SUCCESS);
            }
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "no connection over tcp");
        }
        let mut ch = [0u8; HANDLE];
        let mut clisten = null();
        assert_eq!((c.listen)(cctx, 0, ch.as_mut_ptr().cast(), &mut clisten), NCCL_SUCCESS);
        let mut mh = null();
        assert_eq!((n.reg_mr)(send, b, buf.len(), NCCL_PTR_HOST, &mut mh), NCCL_SUCCESS);

        let refused = |rc: NcclResult, what: &str, log: &str| {
            assert_eq!(rc, NCCL_INVALID_ARGUMENT, "{what}");
            assert!(logged(log), "{what}: no log line says {log:?}");
        };
        let mut req = null();
        let mut out = null();
        // ncclNet calls given ncclNet objects of the wrong kind.
        refused(
            (n.isend)(listen, b, 8, 0, null(), null(), &mut req),
            "isend on a listen comm",
            "sendComm is a ncclNet listen comm, not a ncclNet send or receive comm",
        );
        refused((n.test)(listen, &mut done, &mut size), "test of a listen comm", "request is a ncclNet listen comm, not a ncclNet request");
        refused((n.test)(send, &mut done, &mut size), "test of a comm", "request is a ncclNet send or receive comm, not a ncclNet request");
        refused(
            (n.accept)(send, &mut out, null().cast()),
            "accept on a comm",
            "listenComm is a ncclNet send or receive comm, not a ncclNet listen comm",
        );
        refused(
            (n.listen)(listen, 0, h.as_mut_ptr().cast(), &mut out),
            "listen with a listen comm as context",
            "ctx is a ncclNet listen comm, not a ncclNet context",
        );
        refused(
            (n.reg_mr)(mh, b, 8, NCCL_PTR_HOST, &mut out),
            "regMr on a memory handle",
            "comm is a ncclNet memory handle, not a ncclNet send or receive comm",
        );
        refused((n.dereg_mr)(send, listen), "deregMr of a listen comm", "mhandle is a ncclNet listen comm, not a ncclNet memory handle");
        refused((n.close_send)(listen), "closeSend of a listen comm", "sendComm is a ncclNet listen comm");
        refused((n.close_listen)(send), "closeListen of a comm", "listenComm is a ncclNet send or receive comm, not a ncclNet listen comm");
        refused((n.finalize)(listen), "finalize of a listen comm", "ctx is a ncclNet listen comm, not a ncclNet context");
        // ncclNet calls given CollNet objects, and CollNet calls given ncclNet ones.
        let (mut d, mut sz, mut tag, mut rmh) = (b, 8usize, 0 as c_int, null());
        refused(
            (n.irecv)(clisten, 1, &mut d, &mut sz, &mut tag, &mut rmh, null().cast(), &mut req),
            "irecv on a CollNet listen comm",
            "recvComm is a CollNet listen comm, not a ncclNet send or receive comm",
        );
        refused(
            (n.listen)(cctx, 0, h.as_mut_ptr().cast(), &mut out),
            "ncclNet listen with a CollNet context",
            "ctx is a CollNet context, not a ncclNet context",
        );
        refused(
            (c.listen)(ctx, 0, ch.as_mut_ptr().cast(), &mut out),
            "CollNet listen with a ncclNet context",
            "ctx is a ncclNet context, not a CollNet context",
        );
        refused(
            (c.iallreduce)(send, b, b, 4, 7, 0, null(), null(), &mut req),
            "iallreduce on a ncclNet comm",
            "collComm is a ncclNet send or receive comm, not a CollNet comm",
        );
        refused(
            (c.reg_mr)(recv, b, 8, NCCL_PTR_HOST, &mut out),
            "CollNet regMr on a ncclNet comm",
            "collComm is a ncclNet send or receive comm, not a CollNet comm",
        );
        refused(
            (c.test)(mh, &mut done, &mut size),
            "CollNet test of a memory handle",
            "request is a ncclNet memory handle, not a CollNet request",
        );
        refused((c.close_coll)(clisten), "closeColl of a CollNet listen comm", "collComm is a CollNet listen comm, not a CollNet comm");
        refused(
            (c.close_listen)(listen),
            "CollNet closeListen of a ncclNet listen comm",
            "listenComm is a ncclNet listen comm, not a CollNet listen comm",
        );
        refused((c.finalize)(ctx), "CollNet finalize of a ncclNet context", "ctx is a ncclNet context, not a CollNet context");
        let mut hp = [ch.as_mut_ptr().cast::<std::ffi::c_void>()];
        refused(
            (c.connect)(hp.as_mut_ptr(), 1, 0, listen, &mut out),
            "CollNet connect on a ncclNet listen comm",
            "listenComm is a ncclNet listen comm, not a CollNet listen comm",
        );

        // A request in flight, then tested through the wrong table.
        let mut rreq = null();
        let (mut d, mut sz, mut tag, mut rmh) = (rbuf.as_mut_ptr().cast(), rbuf.len(), 0 as c_int, null());
        let mut sreq = null();
        fill(&mut buf, 58);
        let t0 = std::time::Instant::now();
        while rreq.is_null() {
            assert_eq!((n.irecv)(recv, 1, &mut d, &mut sz, &mut tag, &mut rmh, null().cast(), &mut rreq), NCCL_SUCCESS);
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "irecv never taken");
        }
        refused(
            (c.test)(rreq, &mut done, &mut size),
            "CollNet test of a ncclNet request",
            "request is a ncclNet request, not a CollNet request",
        );
        // Everything still works: the message goes through the same comms.
        while sreq.is_null() {
            assert_eq!((n.isend)(send, b, buf.len(), 0, mh, null(), &mut sreq), NCCL_SUCCESS);
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "isend never taken");
        }
        let (mut sdone, mut rdone) = (0, 0);
        while sdone == 0 || rdone == 0 {
            if sdone == 0 {
                assert_eq!((n.test)(sreq, &mut sdone, &mut size), NCCL_SUCCESS);
            }
            if rdone == 0 {
                assert_eq!((n.test)(rreq, &mut rdone, &mut size), NCCL_SUCCESS);
            }
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "the message never arrived");
        }
        assert_eq!(size as usize, buf.len());
        check(&rbuf, 58, "the message after the refused calls");
        assert_eq!((n.dereg_mr)(send, mh), NCCL_SUCCESS);
        assert_eq!((n.close_send)(send), NCCL_SUCCESS);
        assert_eq!((n.close_recv)(recv), NCCL_SUCCESS);
        assert_eq!((n.close_listen)(listen), NCCL_SUCCESS);
        assert_eq!((c.close_listen)(clisten), NCCL_SUCCESS);
        assert_eq!((n.finalize)(ctx), NCCL_SUCCESS);
        assert_eq!((c.finalize)(cctx), NCCL_SUCCESS);
    }
}
