//! rdma-core, loaded at run time: libibverbs for the device list and the fork
//! status, libefa for what an EFA device can do.
//!
//! The tools must run on hosts without rdma-core (a developer's laptop, a
//! container with only libfabric's tcp provider), so nothing here is linked:
//! `dlopen("libibverbs.so.1")` and `dlsym` for the handful of calls needed
//! (`ibv_get_device_list`, `ibv_get_device_name`, `ibv_open_device`,
//! `ibv_close_device`, `ibv_free_device_list`, `ibv_is_fork_initialized`),
//! and `dlopen("libefa.so.1")` for `efadv_query_device`. A missing library
//! or symbol is a fact to report, not an error.
//!
//! `ibv_is_fork_initialized` appeared in rdma-core 35 (symbol version
//! IBVERBS_1.13); its absence means an older rdma-core. Its answer comes from
//! the kernel's RDMA core over netlink, so on a host without any RDMA
//! support it says `IBV_FORK_DISABLED` even on a kernel that copies pinned
//! pages on fork: the caller weighs it together with the device list.
//!
//! The rdma-core release is read from the library's file name: libibverbs is
//! installed as `libibverbs.so.1.<abi>.<rdma-core>.0` (Debian 12:
//! `libibverbs.so.1.14.44.0`, rdma-core 44).
//!
//! The libraries are never `dlclose`d: libibverbs keeps provider plugins and
//! may be shared with libfabric in this very process.
use serde::Serialize;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::path::{Path, PathBuf};

/// `enum ibv_fork_status` (verbs.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ForkStatus {
    /// `IBV_FORK_DISABLED` (0): fork support not initialised, and the kernel
    /// did not say it copies pinned pages on fork.
    #[serde(rename = "IBV_FORK_DISABLED")]
    Disabled,
    /// `IBV_FORK_ENABLED` (1): `ibv_fork_init` ran in this process.
    #[serde(rename = "IBV_FORK_ENABLED")]
    Enabled,
    /// `IBV_FORK_UNNEEDED` (2): the kernel copies DMA-pinned pages on fork.
    #[serde(rename = "IBV_FORK_UNNEEDED")]
    Unneeded,
}

impl ForkStatus {
    pub fn from_raw(v: c_int) -> Option<ForkStatus> {
        match v {
            0 => Some(ForkStatus::Disabled),
            1 => Some(ForkStatus::Enabled),
            2 => Some(ForkStatus::Unneeded),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ForkStatus::Disabled => "IBV_FORK_DISABLED",
            ForkStatus::Enabled => "IBV_FORK_ENABLED",
            ForkStatus::Unneeded => "IBV_FORK_UNNEEDED",
        }
    }
}

/// `struct efadv_device_attr` (infiniband/efadv.h). Newer rdma-core may
/// append fields; `efadv_query_device` takes our size (`inlen`) and fills
/// only what fits, which is how the header says to stay compatible.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EfadvDeviceAttr {
    pub comp_mask: u64,
    pub max_sq_wr: u32,
    pub max_rq_wr: u32,
    pub max_sq_sge: u16,
    pub max_rq_sge: u16,
    pub inline_buf_size: u16,
    pub reserved: [u8; 2],
    pub device_caps: u32,
    pub max_rdma_size: u32,
}

const _: () = assert!(std::mem::size_of::<EfadvDeviceAttr>() == 32);

/// `EFADV_DEVICE_ATTR_CAPS_*` bits and their names.
pub const EFA_CAPS: &[(u32, &str)] = &[
    (1 << 0, "rdma-read"),
    (1 << 1, "rnr-retry"),
    (1 << 2, "cq-with-sgid"),
    (1 << 3, "rdma-write"),
    (1 << 4, "unsolicited-write-recv"),
    (1 << 5, "cq-ext-mem-dmabuf"),
];

/// What `efadv_query_device` says about one EFA device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EfaAttr {
    pub rdma_read: bool,
    pub rdma_write: bool,
    pub rnr_retry: bool,
    pub max_inline: u16,
    pub max_sq_wr: u32,
    pub max_rq_wr: u32,
    pub max_sq_sge: u16,
    pub max_rq_sge: u16,
    pub max_rdma_size: u32,
    /// Every capability bit set, by name (unknown bits as `bit N`).
    pub caps: Vec<String>,
}

impl EfaAttr {
    pub fn from_raw(a: &EfadvDeviceAttr) -> EfaAttr {
        let has = |bit: u32| a.device_caps & bit != 0;
        let mut caps: Vec<String> = Vec::new();
        for bit in 0..32 {
            let mask = 1u32 << bit;
            if has(mask) {
                match EFA_CAPS.iter().find(|(m, _)| *m == mask) {
                    Some((_, name)) => caps.push(name.to_string()),
                    None => caps.push(format!("bit {bit}")),
                }
            }
        }
        EfaAttr {
            rdma_read: has(1 << 0),
            rdma_write: has(1 << 3),
            rnr_retry: has(1 << 1),
            max_inline: a.inline_buf_size,
            max_sq_wr: a.max_sq_wr,
            max_rq_wr: a.max_rq_wr,
            max_sq_sge: a.max_sq_sge,
            max_rq_sge: a.max_rq_sge,
            max_rdma_size: a.max_rdma_size,
            caps,
        }
    }

    /// One line: `RDMA read yes, RDMA write no, inline 32 B, SQ 512 x 2 SGE, ...`.
    pub fn summary(&self) -> String {
        let yn = |b: bool| if b { "yes" } else { "no" };
        format!(
            "RDMA read {}, RDMA write {}, max inline {} B, send queue {} WRs x {} SGE, \
             receive queue {} WRs x {} SGE, max RDMA {}",
            yn(self.rdma_read),
            yn(self.rdma_write),
            self.max_inline,
            self.max_sq_wr,
            self.max_sq_sge,
            self.max_rq_wr,
            self.max_rq_sge,
            tally_engine::host::units::format_size(u64::from(self.max_rdma_size)),
        )
    }
}

/// One RDMA device as libibverbs lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RdmaDevice {
    pub name: String,
    /// `/sys/class/infiniband/<name>/device/numa_node`; `None` when absent or -1.
    pub numa_node: Option<u32>,
    /// The kernel driver (`efa`, `mlx5_core`, ...), from sysfs.
    pub driver: Option<String>,
    /// `efadv_query_device`'s answer for EFA devices.
    pub efa: Option<EfaAttr>,
    /// Why `efa` is missing when the device looked like one (open or query failed).
    pub efa_error: Option<String>,
}

/// libibverbs as found (or not) on this host.
#[derive(Debug, Clone, Serialize)]
pub struct VerbsReport {
    /// The library file loaded, resolved through symlinks.
    pub library: Option<String>,
    /// Why it could not be loaded (dlerror).
    pub load_error: Option<String>,
    /// rdma-core release, from the library's file name.
    pub rdma_core: Option<u32>,
    /// Whether `ibv_is_fork_initialized` exists (rdma-core >= 35).
    pub has_fork_query: bool,
    pub fork_status: Option<ForkStatus>,
    /// The devices, when `ibv_get_device_list` worked.
    pub devices: Vec<RdmaDevice>,
    /// Why there is no device list (e.g. ENOSYS: no RDMA support in this kernel).
    pub device_list_error: Option<String>,
    /// Whether libefa (for `efadv_query_device`) loaded.
    pub libefa: Option<String>,
}

impl VerbsReport {
    pub fn loaded(&self) -> bool {
        self.library.is_some()
    }

    /// Whether the kernel's RDMA core answered at all (the device list call
    /// worked, even if empty). Without it `ibv_is_fork_initialized` cannot
    /// learn whether the kernel copies pinned pages on fork.
    pub fn kernel_rdma(&self) -> bool {
        self.loaded() && self.device_list_error.is_none()
    }

    /// Plain words for the device list.
    pub fn devices_line(&self) -> String {
        if !self.loaded() {
            return "unknown: libibverbs not found (rdma-core not installed)".into();
        }
        if let Some(e) = &self.device_list_error {
            return format!("none: no RDMA devices (ibv_get_device_list: {e})");
        }
        if self.devices.is_empty() {
            return "none: no RDMA devices".into();
        }
        self.devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>().join(", ")
    }

    /// The EFA devices among [`Self::devices`].
    pub fn efa_devices(&self) -> impl Iterator<Item = &RdmaDevice> {
        self.devices.iter().filter(|d| d.efa.is_some() || d.driver.as_deref() == Some("efa"))
    }
}

/// rdma-core's release from a libibverbs file name:
/// `libibverbs.so.1.14.44.0` -> 44.
pub fn rdma_core_from_file_name(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("libibverbs.so.")?;
    let parts: Vec<&str> = rest.split('.').collect();
    if parts.len() < 3 {
        return None;
    }
    parts[2].parse().ok()
}

/// A `dlopen`ed library handle (never closed; see the module comment).
struct Lib(*mut c_void);

impl Lib {
    fn open(name: &str) -> Result<Lib, String> {
        let c = CString::new(name).expect("library names have no NUL");
        // SAFETY: `c` is a NUL-terminated string; dlopen has no other
        // preconditions. Library constructors run here, as with any dlopen.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(dlerror().unwrap_or_else(|| format!("{name}: cannot load")));
        }
        Ok(Lib(h))
    }

    fn sym(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).expect("symbol names have no NUL");
        // SAFETY: the handle came from dlopen and was never closed; `c` is
        // NUL-terminated.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// The file a symbol of this library lives in, through symlinks.
    fn file_of(&self, sym: *mut c_void) -> Option<PathBuf> {
        let mut info: libc::Dl_info = dl_info_empty();
        // SAFETY: `sym` is an address inside a loaded library and `info` is a
        // valid out-parameter.
        let ok = unsafe { libc::dladdr(sym, &mut info) };
        if ok == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dladdr sets dli_fname to a NUL-terminated path owned by the loader.
        let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
        Some(Path::new(&path).canonicalize().unwrap_or_else(|_| PathBuf::from(path)))
    }
}

fn dl_info_empty() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    }
}

fn dlerror() -> Option<String> {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the
    // next dl* call on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

type GetDeviceListFn = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceListFn = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceNameFn = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDeviceFn = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CloseDeviceFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type IsForkInitializedFn = unsafe extern "C" fn() -> c_int;
type EfadvQueryDeviceFn = unsafe extern "C" fn(*mut c_void, *mut EfadvDeviceAttr, u32) -> c_int;

fn sysfs_device(name: &str, leaf: &str) -> PathBuf {
    Path::new("/sys/class/infiniband").join(name).join("device").join(leaf)
}

/// `/sys/class/infiniband/<name>/device/numa_node`, `None` when absent or -1.
pub fn device_numa_node(name: &str) -> Option<u32> {
    std::fs::read_to_string(sysfs_device(name, "numa_node")).ok()?.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
}

fn device_driver(name: &str) -> Option<String> {
    let link = std::fs::read_link(sysfs_device(name, "driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// Load libibverbs (and libefa) and ask them everything the tools need.
pub fn probe() -> VerbsReport {
    let mut r = VerbsReport {
        library: None,
        load_error: None,
        rdma_core: None,
        has_fork_query: false,
        fork_status: None,
        devices: Vec::new(),
        device_list_error: None,
        libefa: None,
    };
    let lib = match Lib::open("libibverbs.so.1") {
        Ok(l) => l,
        Err(e) => {
            r.load_error = Some(e);
            return r;
        }
    };
    let names = ["ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device", "ibv_close_device"];
    let syms: Vec<Option<*mut c_void>> = names.iter().map(|n| lib.sym(n)).collect();
    let file = syms[0].and_then(|s| lib.file_of(s));
    r.library = Some(file.as_ref().map_or("libibverbs.so.1".to_string(), |f| f.display().to_string()));
    r.rdma_core = file.as_ref().and_then(|f| f.file_name()).and_then(|n| rdma_core_from_file_name(&n.to_string_lossy()));
    if let Some(p) = lib.sym("ibv_is_fork_initialized") {
        r.has_fork_query = true;
        // SAFETY: the symbol is `enum ibv_fork_status ibv_is_fork_initialized(void)`
        // (verbs.h); an enum is returned as an int.
        let f: IsForkInitializedFn = unsafe { std::mem::transmute::<*mut c_void, IsForkInitializedFn>(p) };
        // SAFETY: takes no arguments and only reads libibverbs' state.
        r.fork_status = ForkStatus::from_raw(unsafe { f() });
    }
    let missing: Vec<&str> = names.iter().zip(&syms).filter(|(_, s)| s.is_none()).map(|(n, _)| *n).collect();
    if !missing.is_empty() {
        r.device_list_error = Some(format!("libibverbs lacks {}", missing.join(", ")));
        return r;
    }
    let p = |i: usize| syms[i].expect("checked above");
    // SAFETY: each pointer is the named libibverbs function; the types match
    // their prototypes in verbs.h (device pointers kept opaque).
    let (get_list, free_list, get_name, open, close) = unsafe {
        (
            std::mem::transmute::<*mut c_void, GetDeviceListFn>(p(0)),
            std::mem::transmute::<*mut c_void, FreeDeviceListFn>(p(1)),
            std::mem::transmute::<*mut c_void, GetDeviceNameFn>(p(2)),
            std::mem::transmute::<*mut c_void, OpenDeviceFn>(p(3)),
            std::mem::transmute::<*mut c_void, CloseDeviceFn>(p(4)),
        )
    };
    let efa_query: Option<EfadvQueryDeviceFn> = match Lib::open("libefa.so.1") {
        Ok(efa) => {
            let q = efa.sym("efadv_query_device");
            r.libefa = efa.sym("efadv_query_device").and_then(|s| efa.file_of(s)).map(|f| f.display().to_string());
            // SAFETY: the symbol is `int efadv_query_device(struct ibv_context *,
            // struct efadv_device_attr *, uint32_t)` (efadv.h).
            q.map(|s| unsafe { std::mem::transmute::<*mut c_void, EfadvQueryDeviceFn>(s) })
        }
        Err(_) => None,
    };

    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-parameter; the list is freed below.
    let list = unsafe { get_list(&mut n) };
    if list.is_null() {
        let e = io::Error::last_os_error();
        r.device_list_error = Some(match e.raw_os_error() {
            Some(libc::ENOSYS) => format!("{e}: this kernel has no RDMA support loaded"),
            _ => e.to_string(),
        });
        return r;
    }
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` valid device pointers (NULL-terminated).
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a device of the list; the name is NUL-terminated
        // and lives as long as the list.
        let name = unsafe { CStr::from_ptr(get_name(dev)) }.to_string_lossy().into_owned();
        let driver = device_driver(&name);
        let mut device = RdmaDevice { numa_node: device_numa_node(&name), driver, efa: None, efa_error: None, name };
        if let Some(query) = efa_query {
            // SAFETY: opening a listed device; closed below.
            let ctx = unsafe { open(dev) };
            if ctx.is_null() {
                if device.driver.as_deref() == Some("efa") {
                    device.efa_error = Some(format!("ibv_open_device: {}", io::Error::last_os_error()));
                }
            } else {
                let mut attr = EfadvDeviceAttr::default();
                // SAFETY: `ctx` is an open context; `attr` is a valid
                // efadv_device_attr of the size passed as inlen.
                let rc = unsafe { query(ctx, &mut attr, std::mem::size_of::<EfadvDeviceAttr>() as u32) };
                if rc == 0 {
                    device.efa = Some(EfaAttr::from_raw(&attr));
                } else if device.driver.as_deref() == Some("efa") {
                    device.efa_error = Some(format!("efadv_query_device: {}", io::Error::from_raw_os_error(rc.abs())));
                }
                // SAFETY: closing the context opened above, once.
                unsafe { close(ctx) };
            }
        }
        r.devices.push(device);
    }
    // SAFETY: freeing the list from ibv_get_device_list, once, after use.
    unsafe { free_list(list) };
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_core_release_from_file_name() {
        assert_eq!(rdma_core_from_file_name("libibverbs.so.1.14.44.0"), Some(44));
        assert_eq!(rdma_core_from_file_name("libibverbs.so.1.11.32.0"), Some(32));
        assert_eq!(rdma_core_from_file_name("libibverbs.so.1"), None);
        assert_eq!(rdma_core_from_file_name("libefa.so.1.2.44.0"), None);
    }

    #[test]
    fn fork_status_values_match_verbs_h() {
        assert_eq!(ForkStatus::from_raw(0), Some(ForkStatus::Disabled));
        assert_eq!(ForkStatus::from_raw(1), Some(ForkStatus::Enabled));
        assert_eq!(ForkStatus::from_raw(2), Some(ForkStatus::Unneeded));
        assert_eq!(ForkStatus::from_raw(3), None);
        assert_eq!(ForkStatus::Unneeded.name(), "IBV_FORK_UNNEEDED");
    }

    #[test]
    fn decodes_efa_caps() {
        let raw = EfadvDeviceAttr {
            max_sq_wr: 512,
            max_rq_wr: 8192,
            max_sq_sge: 2,
            max_rq_sge: 1,
            inline_buf_size: 32,
            device_caps: 1 | 2 | 8 | (1 << 9),
            max_rdma_size: 1 << 30,
            ..Default::default()
        };
        let a = EfaAttr::from_raw(&raw);
        assert!(a.rdma_read && a.rdma_write && a.rnr_retry);
        assert_eq!(a.caps, ["rdma-read", "rnr-retry", "rdma-write", "bit 9"]);
        let s = a.summary();
        assert!(s.contains("RDMA read yes, RDMA write yes, max inline 32 B"), "{s}");
        assert!(s.contains("send queue 512 WRs x 2 SGE"), "{s}");
        assert!(s.contains("max RDMA 1 GiB"), "{s}");
    }

    /// The Rust mirror of the C struct and enum must match the installed
    /// headers; compile a probe against them when a C compiler and the
    /// headers are here (they are wherever `make deps` ran).
    #[test]
    fn layout_matches_installed_headers() {
        let header = Path::new("/usr/include/infiniband/efadv.h");
        if !header.exists() {
            println!("layout_matches_installed_headers: skipped: no {}", header.display());
            return;
        }
        let dir = std::env::temp_dir().join(format!("tally-efadv-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("probe.c");
        std::fs::write(
            &src,
            r#"#include <stddef.h>
#include <stdio.h>
#include <infiniband/efadv.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %d %d %d\n",
        sizeof(struct efadv_device_attr),
        offsetof(struct efadv_device_attr, max_sq_wr),
        offsetof(struct efadv_device_attr, max_rq_wr),
        offsetof(struct efadv_device_attr, max_sq_sge),
        offsetof(struct efadv_device_attr, max_rq_sge),
        offsetof(struct efadv_device_attr, inline_buf_size),
        offsetof(struct efadv_device_attr, device_caps),
        offsetof(struct efadv_device_attr, max_rdma_size),
        (int)IBV_FORK_DISABLED, (int)IBV_FORK_ENABLED, (int)IBV_FORK_UNNEEDED);
    return 0;
}
"#,
        )
        .unwrap();
        let exe = dir.join("probe");
        let cc = std::process::Command::new("cc").arg(&src).arg("-o").arg(&exe).output();
        let ok = matches!(&cc, Ok(o) if o.status.success());
        if !ok {
            let _ = std::fs::remove_dir_all(&dir);
            println!("layout_matches_installed_headers: skipped: cc could not build the probe");
            return;
        }
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8(out.stdout).unwrap();
        let ours = format!(
            "{} {} {} {} {} {} {} {} 0 1 2",
            std::mem::size_of::<EfadvDeviceAttr>(),
            std::mem::offset_of!(EfadvDeviceAttr, max_sq_wr),
            std::mem::offset_of!(EfadvDeviceAttr, max_rq_wr),
            std::mem::offset_of!(EfadvDeviceAttr, max_sq_sge),
            std::mem::offset_of!(EfadvDeviceAttr, max_rq_sge),
            std::mem::offset_of!(EfadvDeviceAttr, inline_buf_size),
            std::mem::offset_of!(EfadvDeviceAttr, device_caps),
            std::mem::offset_of!(EfadvDeviceAttr, max_rdma_size),
        );
        assert_eq!(text.trim(), ours);
    }

    #[test]
    fn probes_this_host_without_crashing() {
        let r = probe();
        // Whatever this host has, the report must say it in words.
        let line = r.devices_line();
        assert!(!line.is_empty());
        if r.loaded() {
            assert!(r.library.as_deref().unwrap().contains("libibverbs"));
        } else {
            assert!(r.load_error.is_some());
        }
    }
}
