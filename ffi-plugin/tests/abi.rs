//! The library's face to NCCL: exactly twelve exported symbols, tables that
//! NCCL can use, and entry points that refuse bad arguments with error codes
//! instead of crashing. (The data paths are in net_shm.rs, net_tcp.rs and
//! tools/tests/plugin_collnet.rs.)
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
