//! Test harness shared by the plugin's tests (ncclNet, CollNet and drain
//! alike, all in ffi-plugin/tests/): loads the built library the way NCCL does
//! (dlopen by file name, dlsym of the versioned table symbols) and calls it
//! only through the function-pointer tables, with the C types of
//! `src/abi.rs`.
#![allow(dead_code)]

#[path = "../../src/abi.rs"]
pub mod abi;
#[path = "../../src/abi_legacy.rs"]
pub mod abi_legacy;
pub mod net_api;

use abi::*;
use abi_legacy::*;
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where cargo put the library: next to the test binary's `deps/` folder.
/// `TALLY_PLUGIN_SO` overrides.
pub fn built_library() -> PathBuf {
    if let Some(p) = std::env::var_os("TALLY_PLUGIN_SO") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>/deps/..").to_path_buf();
    let lib = dir.join("libnccl_net_tally.so");
    assert!(lib.exists(), "{} is missing: build the plugin first (cargo build -p tally-nccl-plugin, same profile)", lib.display());
    lib
}

/// The library under the name NCCL loads (`NCCL_NET_PLUGIN=tally` looks
/// for `libnccl-net-tally.so`): a symlink to cargo's output in a private
/// temporary folder (target/ is left to the build).
pub fn shipped_library() -> PathBuf {
    let built = built_library().canonicalize().expect("built library path");
    let dir = std::env::temp_dir().join(format!("tally-plugin-test-{}", std::process::id()));
    let link = dir.join("libnccl-net-tally.so");
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap();
    if std::fs::read_link(&link).ok().as_deref() != Some(built.as_path()) {
        std::fs::create_dir_all(&dir).expect("temporary folder");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&built, &link).expect("symlink libnccl-net-tally.so");
    }
    link
}

/// The tables of a loaded plugin: v11 and v12, and v7-v10 for NCCL 2.19-2.27.
pub struct Plugin {
    pub path: PathBuf,
    pub net11: &'static NetV11,
    pub net12: &'static NetV12,
    pub coll11: &'static CollNetV11,
    pub coll12: &'static CollNetV12,
    pub net7: &'static NetV7,
    pub net8: &'static NetV8,
    pub net9: &'static NetV9,
    pub net10: &'static NetV10,
    pub coll7: &'static CollNetV7,
    pub coll8: &'static CollNetV8,
    pub coll9: &'static CollNetV9,
    pub coll10: &'static CollNetV10,
}

// SAFETY: the tables are immutable statics of the loaded library.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

fn sym<T>(handle: *mut c_void, name: &CStr) -> &'static T {
    // SAFETY: handle is a live dlopen handle; name is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    assert!(!p.is_null(), "symbol {name:?} not found");
    // SAFETY: the symbol is a static table of type T in a library that is
    // never unloaded (RTLD_NODELETE, and the handle is leaked).
    unsafe { &*(p as *const T) }
}

/// dlopens the library as NCCL does (RTLD_NOW | RTLD_LOCAL) and finds the tables.
pub fn load() -> Plugin {
    let path = shipped_library();
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; the handle is intentionally never closed.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a NUL-terminated message after a failure.
        panic!("dlopen {}: {:?}", path.display(), unsafe { CStr::from_ptr(libc::dlerror()) });
    }
    Plugin {
        path,
        net11: sym(h, c"ncclNetPlugin_v11"),
        net12: sym(h, c"ncclNetPlugin_v12"),
        coll11: sym(h, c"ncclCollNetPlugin_v11"),
        coll12: sym(h, c"ncclCollNetPlugin_v12"),
        net7: sym(h, c"ncclNetPlugin_v7"),
        net8: sym(h, c"ncclNetPlugin_v8"),
        net9: sym(h, c"ncclNetPlugin_v9"),
        net10: sym(h, c"ncclNetPlugin_v10"),
        coll7: sym(h, c"ncclCollNetPlugin_v7"),
        coll8: sym(h, c"ncclCollNetPlugin_v8"),
        coll9: sym(h, c"ncclCollNetPlugin_v9"),
        coll10: sym(h, c"ncclCollNetPlugin_v10"),
    }
}

// ---------------------------------------------------------------------------
// A logger like NCCL's

/// Lines the plugin logged: (level, flags, text).
pub static LOG: Mutex<Vec<(c_int, c_ulong, String)>> = Mutex::new(Vec::new());
pub static LOG_CALLS: AtomicUsize = AtomicUsize::new(0);

/// NCCL's logger is variadic; the plugin always calls it as
/// `(level, flags, file, line, "%s", message)`. On the SysV x86-64 and
/// AAPCS64 (Linux) calling conventions a variadic call passes those six
/// arguments exactly as a call to this non-variadic function would, so the
/// test can receive them without C code.
unsafe extern "C" fn test_logger(level: c_int, flags: c_ulong, _file: *const c_char, _line: c_int, fmt: *const c_char, msg: *const c_char) {
    LOG_CALLS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the plugin passes NUL-terminated strings.
    let (fmt, msg) = unsafe { (CStr::from_ptr(fmt).to_string_lossy().into_owned(), CStr::from_ptr(msg).to_string_lossy().into_owned()) };
    assert_eq!(fmt, "%s", "the plugin must pass its text as an argument, never as a format");
    if std::env::var_os("TALLY_TEST_VERBOSE").is_some() {
        eprintln!("NCCL log {level} {flags:#x}: {msg}");
    }
    LOG.lock().unwrap().push((level, flags, msg));
}

pub fn logger() -> Option<NcclLogger> {
    type Fixed = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, *const c_char);
    let f: Fixed = test_logger;
    // SAFETY: see test_logger: same arguments in the same registers.
    Some(unsafe { std::mem::transmute::<Fixed, NcclLogger>(f) })
}

pub fn logged(needle: &str) -> bool {
    LOG.lock().unwrap().iter().any(|(_, _, m)| m.contains(needle))
}

// ---------------------------------------------------------------------------
// Helpers

/// Threads of this process (to check nothing outlives finalize).
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// A deterministic byte for position `k` of message `id` (different
/// messages differ, so a message landing in the wrong buffer is caught).
pub fn pattern(id: u64, k: usize) -> u8 {
    ((k as u64).wrapping_mul(131).wrapping_add(id.wrapping_mul(0x9e37_79b9)) % 251) as u8
}

pub fn fill(buf: &mut [u8], id: u64) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pattern(id, k);
    }
}

pub fn check(buf: &[u8], id: u64, what: &str) {
    if let Some(k) = buf.iter().enumerate().position(|(k, &b)| b != pattern(id, k)) {
        panic!("{what}: byte {k} of {} is {} (expected {})", buf.len(), buf[k], pattern(id, k));
    }
}

pub const HANDLE: usize = NCCL_NET_HANDLE_MAXSIZE;

/// Calls `f` until it returns a non-NULL object, failing on an error code or
/// after `timeout`.
pub fn until_some(what: &str, timeout: Duration, mut f: impl FnMut() -> (NcclResult, *mut c_void)) -> *mut c_void {
    let t = Instant::now();
    loop {
        let (rc, p) = f();
        assert_eq!(rc, NCCL_SUCCESS, "{what} failed");
        if !p.is_null() {
            return p;
        }
        assert!(t.elapsed() < timeout, "{what}: no progress in {timeout:?}");
        std::thread::yield_now();
    }
}

pub fn null() -> *mut c_void {
    ptr::null_mut()
}
