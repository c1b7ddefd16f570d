//! The kernel's hugepage pools, as sysfs and procfs show them.
//!
//! Linux keeps one pool of hugetlb pages per page size (2 MiB and 1 GiB on
//! x86-64), globally and per NUMA node. A page in the pool is physically
//! contiguous memory set aside at reservation time: it is never swapped, never
//! split and needs one TLB entry for 2 MiB or 1 GiB of buffer. The pool starts
//! empty unless the boot command line or a sysctl fills it, and filling it at
//! run time can fall short when physical memory is fragmented, most of all
//! for 1 GiB pages. So [`set_pages`] reports what the kernel actually gave.
//!
//! The counters, per pool (`/sys/kernel/mm/hugepages/hugepages-<size>kB/`):
//! - `nr_hugepages`: pages in the pool ([`PoolState::total`]);
//! - `free_hugepages`: pages not faulted into any mapping ([`PoolState::free`]);
//! - `resv_hugepages`: free pages promised to mappings that have not touched
//!   them yet ([`PoolState::reserved`]); what a new mapping can get is
//!   `free - reserved` ([`PoolState::available`]);
//! - `surplus_hugepages`: pages above `nr_hugepages` (overcommit, or pages
//!   still in use after the pool was shrunk) ([`PoolState::surplus`]).
//!
//! Transparent huge pages (THP) are the other route: ordinary anonymous memory
//! that the kernel backs with 2 MiB pages when it can. In `madvise` mode only
//! regions marked with `madvise(MADV_HUGEPAGE)` get them; see [`thp_mode`].
//!
//! This module is what the slab tests use to set up a pool, and what the
//! `tally hugepages` command is built on.

use core::fmt;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const GLOBAL_DIR: &str = "/sys/kernel/mm/hugepages";
const NODE_DIR: &str = "/sys/devices/system/node";
const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// 2 MiB: the x86-64 (and 4 KiB-granule aarch64) PMD-level page size.
pub const SIZE_2M: u64 = 2 << 20;
/// 1 GiB: the x86-64 (and 4 KiB-granule aarch64) PUD-level page size.
pub const SIZE_1G: u64 = 1 << 30;

/// One hugepage pool: a page size, globally (`node == None`) or on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PoolState {
    /// Page size in bytes.
    pub page_size: u64,
    /// The NUMA node, or `None` for the system-wide pool.
    pub node: Option<u32>,
    /// Pages in the pool (`nr_hugepages`).
    pub total: u64,
    /// Pages not faulted into any mapping (`free_hugepages`).
    pub free: u64,
    /// Free pages already promised to mappings (`resv_hugepages`). The
    /// kernel keeps reservations only system-wide, so this is `None` for a
    /// per-node pool.
    pub reserved: Option<u64>,
    /// Pages beyond `nr_hugepages` (`surplus_hugepages`).
    pub surplus: u64,
}

impl PoolState {
    /// Pages a new mapping can still get: free pages nobody has reserved.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved.unwrap_or(0))
    }
}

/// The directory holding the counters of one pool.
fn pool_dir(page_size: u64, node: Option<u32>) -> PathBuf {
    let name = format!("hugepages-{}kB", page_size / 1024);
    match node {
        None => Path::new(GLOBAL_DIR).join(name),
        Some(n) => Path::new(NODE_DIR).join(format!("node{n}")).join("hugepages").join(name),
    }
}

/// Page size in bytes from a sysfs directory name `hugepages-2048kB`.
fn parse_pool_dir_name(name: &str) -> Option<u64> {
    let kb: u64 = name.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Read one counter file: a decimal number and a newline.
fn read_counter(path: &Path) -> io::Result<u64> {
    let text = fs::read_to_string(path)?;
    text.trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{}: not a number: {:?}", path.display(), text.trim())))
}

/// The hugetlb page sizes this kernel offers, ascending (empty when the kernel
/// has no hugetlb support).
pub fn page_sizes() -> io::Result<Vec<u64>> {
    let entries = match fs::read_dir(GLOBAL_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut sizes = Vec::new();
    for entry in entries {
        if let Some(size) = entry?.file_name().to_str().and_then(parse_pool_dir_name) {
            sizes.push(size);
        }
    }
    sizes.sort_unstable();
    Ok(sizes)
}

/// The NUMA nodes that have hugepage pools, ascending (empty on kernels
/// built without NUMA).
pub fn numa_nodes() -> io::Result<Vec<u32>> {
    let entries = match fs::read_dir(NODE_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut nodes = Vec::new();
    for entry in entries {
        let entry = entry?;
        let node = entry.file_name().to_str().and_then(|n| n.strip_prefix("node")).and_then(|n| n.parse::<u32>().ok());
        if let Some(node) = node {
            if entry.path().join("hugepages").is_dir() {
                nodes.push(node);
            }
        }
    }
    nodes.sort_unstable();
    Ok(nodes)
}

/// The counters of one pool.
pub fn pool(page_size: u64, node: Option<u32>) -> io::Result<PoolState> {
    let dir = pool_dir(page_size, node);
    let read = |name: &str| read_counter(&dir.join(name));
    let total = read("nr_hugepages").map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(e.kind(), format!("no hugepage pool at {}", dir.display()))
        } else {
            e
        }
    })?;
    Ok(PoolState {
        page_size,
        node,
        total,
        free: read("free_hugepages")?,
        reserved: match node {
            None => Some(read("resv_hugepages")?),
            Some(_) => None,
        },
        surplus: read("surplus_hugepages")?,
    })
}

/// Every pool: first the system-wide pool of each page size (ascending), then
/// each node's pools (by node, then size).
pub fn pools() -> io::Result<Vec<PoolState>> {
    let sizes = page_sizes()?;
    let mut out = Vec::new();
    for &size in &sizes {
        out.push(pool(size, None)?);
    }
    for node in numa_nodes()? {
        for &size in &sizes {
            // A node may lack a size (memory-less nodes, odd firmware): skip it.
            if pool_dir(size, Some(node)).is_dir() {
                out.push(pool(size, Some(node))?);
            }
        }
    }
    Ok(out)
}

/// Set the number of pages in a pool (`nr_hugepages`) and return how many the
/// kernel actually has now.
///
/// Growing the pool can give fewer pages than asked (physical memory too
/// fragmented to find contiguous 2 MiB or 1 GiB runs); shrinking it below the
/// pages in use leaves those as surplus until they are freed. Either way the
/// returned count is the truth. Needs root.
pub fn set_pages(page_size: u64, node: Option<u32>, count: u64) -> io::Result<u64> {
    let path = pool_dir(page_size, node).join("nr_hugepages");
    fs::write(&path, format!("{count}\n"))
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {count} to {}: {e}", path.display())))?;
    read_counter(&path)
}

/// The system's transparent huge page mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThpMode {
    /// Every anonymous mapping may get huge pages.
    Always,
    /// Only regions marked `madvise(MADV_HUGEPAGE)` get huge pages.
    Madvise,
    /// No transparent huge pages at all.
    Never,
}

impl fmt::Display for ThpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ThpMode::Always => "always",
            ThpMode::Madvise => "madvise",
            ThpMode::Never => "never",
        })
    }
}

/// The selected mode from the text of the `enabled` file:
/// `always [madvise] never` selects `madvise`.
fn parse_thp_mode(text: &str) -> Option<ThpMode> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    match &text[start..end] {
        "always" => Some(ThpMode::Always),
        "madvise" => Some(ThpMode::Madvise),
        "never" => Some(ThpMode::Never),
        _ => None,
    }
}

/// The transparent huge page mode (`/sys/kernel/mm/transparent_hugepage/enabled`).
/// A kernel without THP reads as [`ThpMode::Never`].
pub fn thp_mode() -> io::Result<ThpMode> {
    let text = match fs::read_to_string(THP_ENABLED) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ThpMode::Never),
        Err(e) => return Err(e),
    };
    parse_thp_mode(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{THP_ENABLED}: unexpected contents {:?}", text.trim())))
}

/// The kernel's default hugepage size (`Hugepagesize:` in /proc/meminfo), the
/// size of a hugetlbfs mount without a `pagesize=` option.
pub fn default_page_size() -> io::Result<u64> {
    let text = fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|line| {
            let kb = line.strip_prefix("Hugepagesize:")?.trim().strip_suffix("kB")?;
            kb.trim().parse::<u64>().ok()?.checked_mul(1024)
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no Hugepagesize in /proc/meminfo"))
}

/// A mounted hugetlbfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HugetlbfsMount {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Its page size in bytes: the `pagesize=` option, else the kernel's default.
    pub page_size: u64,
}

/// /proc/mounts escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mount_field(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// The hugetlbfs entries of a /proc/mounts text.
fn parse_mounts(text: &str, default_page_size: u64) -> Vec<HugetlbfsMount> {
    use std::os::unix::ffi::OsStringExt;
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_source, target, fstype, options) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
            if fstype != "hugetlbfs" {
                return None;
            }
            let page_size = options
                .split(',')
                .find_map(|o| o.strip_prefix("pagesize="))
                .and_then(|p| crate::host::units::parse_size(p).ok())
                .unwrap_or(default_page_size);
            let mount_point = PathBuf::from(std::ffi::OsString::from_vec(unescape_mount_field(target)));
            Some(HugetlbfsMount { mount_point, page_size })
        })
        .collect()
}

/// The mounted hugetlbfs file systems, from /proc/mounts.
pub fn mounts() -> io::Result<Vec<HugetlbfsMount>> {
    let text = fs::read_to_string("/proc/mounts")?;
    // Without a default size (no hugetlb support) there are no mounts to
    // describe anyway; 2 MiB keeps the parse total.
    let default = default_page_size().unwrap_or(SIZE_2M);
    Ok(parse_mounts(&text, default))
}

/// How many bytes of the anonymous mapping that starts at `start` the kernel
/// backs with transparent huge pages now (`AnonHugePages` in
/// /proc/self/smaps), or `None` if no mapping starts there.
///
/// Exact only when the mapping is a VMA of its own: the kernel merges
/// neighbouring anonymous mappings with identical flags into one VMA, and
/// smaps reports per VMA. [`crate::dataplane::slab`] keeps a guard page on each side of
/// its mappings so that they never merge.
pub fn thp_bytes_of_mapping(start: *const u8) -> io::Result<Option<u64>> {
    let text = fs::read_to_string("/proc/self/smaps")?;
    Ok(parse_smaps_anon_huge(&text, start as usize))
}

/// The `AnonHugePages` of the smaps entry whose range starts at `start`.
fn parse_smaps_anon_huge(text: &str, start: usize) -> Option<u64> {
    let mut in_entry = false;
    for line in text.lines() {
        // An entry header: "7f00c0000000-7f00c4000000 rw-p 00000000 00:00 0".
        let header_start = line
            .split_once('-')
            .filter(|(lo, rest)| {
                !lo.is_empty()
                    && lo.bytes().all(|b| b.is_ascii_hexdigit())
                    && rest.split_whitespace().next().is_some_and(|hi| hi.bytes().all(|b| b.is_ascii_hexdigit()))
            })
            .and_then(|(lo, _)| usize::from_str_radix(lo, 16).ok());
        if let Some(lo) = header_start {
            in_entry = lo == start;
            continue;
        }
        if in_entry {
            if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                let kb = kb.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
                return Some(kb * 1024);
            }
        }
    }
    None
}

fn path_cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("path {} contains a NUL byte", path.display())))
}

/// Mount a hugetlbfs of `page_size` pages at `mount_point` (an existing
/// directory). Needs root (CAP_SYS_ADMIN).
pub fn mount(mount_point: &Path, page_size: u64) -> io::Result<()> {
    let target = path_cstring(mount_point)?;
    let options = CString::new(format!("pagesize={}", page_size)).expect("no NUL in digits");
    // SAFETY: every pointer is a NUL-terminated string that lives across the
    // call; mount(2) only reads them.
    let rc = unsafe { libc::mount(c"hugetlbfs".as_ptr(), target.as_ptr(), c"hugetlbfs".as_ptr(), 0, options.as_ptr().cast()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot mount hugetlbfs ({} pages) at {}: {e}", crate::host::units::format_size(page_size), mount_point.display()),
        ));
    }
    Ok(())
}

/// Unmount the file system at `mount_point`. Needs root.
pub fn unmount(mount_point: &Path) -> io::Result<()> {
    let target = path_cstring(mount_point)?;
    // SAFETY: `target` is a NUL-terminated string that lives across the
    // call; umount2(2) only reads it.
    let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("cannot unmount {}: {e}", mount_point.display())));
    }
    Ok(())
}

/// A change to a system-wide pool that is undone when the guard drops.
///
/// For tests and tools that need hugepages for a while and must leave the
/// machine as they found it, even when they panic: the guard remembers the
/// pool's `nr_hugepages` before the change and writes it back on drop.
#[derive(Debug)]
pub struct PoolGuard {
    page_size: u64,
    previous: u64,
    now: u64,
}

impl PoolGuard {
    /// Grow the system-wide pool of `page_size` pages by `additional` pages.
    ///
    /// The kernel may give fewer; [`PoolGuard::added`] says how many it gave.
    /// Only an error writing the pool is an error.
    pub fn reserve(page_size: u64, additional: u64) -> io::Result<PoolGuard> {
        let previous = pool(page_size, None)?.total;
        PoolGuard::set_inner(page_size, previous, previous.saturating_add(additional))
    }

    /// Set the system-wide pool of `page_size` pages to exactly `total` pages
    /// (the kernel may give fewer), restoring the old count on drop.
    pub fn set(page_size: u64, total: u64) -> io::Result<PoolGuard> {
        let previous = pool(page_size, None)?.total;
        PoolGuard::set_inner(page_size, previous, total)
    }

    fn set_inner(page_size: u64, previous: u64, total: u64) -> io::Result<PoolGuard> {
        // From here on the pool may have changed: the guard must exist so the
        // old count comes back even if reading the result fails.
        let mut guard = PoolGuard { page_size, previous, now: previous };
        guard.now = set_pages(page_size, None, total)?;
        Ok(guard)
    }

    /// The page size of the pool this guard changed.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// `nr_hugepages` before the change; what drop restores.
    pub fn previous(&self) -> u64 {
        self.previous
    }

    /// `nr_hugepages` right after the change.
    pub fn total(&self) -> u64 {
        self.now
    }

    /// How many pages the change added (0 if the pool shrank or the kernel
    /// found no memory).
    pub fn added(&self) -> u64 {
        self.now.saturating_sub(self.previous)
    }
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        match set_pages(self.page_size, None, self.previous) {
            Ok(n) if n == self.previous => {}
            // Pages still mapped cannot be freed yet; the kernel turns them
            // into surplus and releases them when they are unmapped.
            Ok(n) => log::warn!(
                "hugepage pool of {}: restored to {} pages, kernel reports {n} (pages still in use?)",
                crate::host::units::format_size(self.page_size),
                self.previous
            ),
            Err(e) => {
                log::warn!(
                    "hugepage pool of {}: could not restore {} pages: {e}",
                    crate::host::units::format_size(self.page_size),
                    self.previous
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_dir_names() {
        assert_eq!(parse_pool_dir_name("hugepages-2048kB"), Some(SIZE_2M));
        assert_eq!(parse_pool_dir_name("hugepages-1048576kB"), Some(SIZE_1G));
        assert_eq!(parse_pool_dir_name("hugepages-64kB"), Some(64 << 10));
        assert_eq!(parse_pool_dir_name("hugepages-kB"), None);
        assert_eq!(parse_pool_dir_name("something"), None);
        assert_eq!(pool_dir(SIZE_2M, Some(1)), Path::new("/sys/devices/system/node/node1/hugepages/hugepages-2048kB"));
        assert_eq!(pool_dir(SIZE_1G, None), Path::new("/sys/kernel/mm/hugepages/hugepages-1048576kB"));
    }

    #[test]
    fn thp_modes() {
        assert_eq!(parse_thp_mode("always [madvise] never\n"), Some(ThpMode::Madvise));
        assert_eq!(parse_thp_mode("[always] madvise never"), Some(ThpMode::Always));
        assert_eq!(parse_thp_mode("always madvise [never]"), Some(ThpMode::Never));
        assert_eq!(parse_thp_mode("always madvise never"), None);
        assert_eq!(parse_thp_mode("[sometimes]"), None);
        // Whatever this machine says must parse.
        thp_mode().expect("THP mode readable");
    }

    #[test]
    fn mount_table() {
        let text = "\
sysfs /sys sysfs rw,nosuid 0 0
hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0
none /mnt/huge\\0401G hugetlbfs rw,relatime,pagesize=1024M 0 0
nodev /mnt/default hugetlbfs rw,relatime 0 0
";
        let mounts = parse_mounts(text, SIZE_2M);
        assert_eq!(
            mounts,
            vec![
                HugetlbfsMount { mount_point: "/dev/hugepages".into(), page_size: SIZE_2M },
                HugetlbfsMount { mount_point: "/mnt/huge 1G".into(), page_size: SIZE_1G },
                HugetlbfsMount { mount_point: "/mnt/default".into(), page_size: SIZE_2M },
            ]
        );
        assert_eq!(unescape_mount_field("a\\134b\\011"), b"a\\b\t");
        assert_eq!(unescape_mount_field("trail\\"), b"trail\\");
        super::mounts().expect("/proc/mounts readable");
    }

    #[test]
    fn smaps_entries() {
        let text = "\
55d0a0000000-55d0a0021000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
AnonHugePages:         0 kB
7f00c0000000-7f00c4000000 rw-p 00000000 00:00 0 
Size:              65536 kB
Rss:               65536 kB
AnonHugePages:     63488 kB
Locked:                0 kB
VmFlags: rd wr mr mw me ac hg
7f00c4000000-7f00c4001000 ---p 00000000 00:00 0 
AnonHugePages:         0 kB
";
        assert_eq!(parse_smaps_anon_huge(text, 0x7f00c0000000), Some(63488 * 1024));
        assert_eq!(parse_smaps_anon_huge(text, 0x55d0a0000000), Some(0));
        assert_eq!(parse_smaps_anon_huge(text, 0x7f00c0001000), None);
        // The heap of this very process is an entry.
        let v = vec![0u8; 1 << 16];
        let _ = thp_bytes_of_mapping(v.as_ptr()).unwrap();
    }

    #[test]
    fn mounts_and_unmounts_hugetlbfs() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            println!("mounts_and_unmounts_hugetlbfs: skipped: needs root");
            return;
        }
        if !page_sizes().unwrap().contains(&SIZE_2M) {
            println!("mounts_and_unmounts_hugetlbfs: skipped: no 2 MiB hugetlb pages");
            return;
        }
        let dir = std::env::temp_dir().join(format!("tally-hugetlbfs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        mount(&dir, SIZE_2M).unwrap();
        let found = super::mounts().unwrap().into_iter().find(|m| m.mount_point == dir);
        // Unmount before asserting, so a failure leaves no mount behind.
        let unmounted = unmount(&dir);
        let _ = fs::remove_dir(&dir);
        unmounted.unwrap();
        assert_eq!(found.map(|m| m.page_size), Some(SIZE_2M));
        let err = unmount(&dir).unwrap_err();
        assert!(err.to_string().contains("tally-hugetlbfs"), "{err}");
    }

    #[test]
    fn reads_this_machines_pools() {
        let sizes = page_sizes().unwrap();
        let all = pools().unwrap();
        for size in &sizes {
            let global = all.iter().find(|p| p.page_size == *size && p.node.is_none()).expect("a system-wide pool for every size");
            assert!(global.reserved.is_some());
            assert!(global.available() <= global.free);
        }
        assert!(all.iter().filter(|p| p.node.is_some()).all(|p| p.reserved.is_none()));
        if !sizes.is_empty() {
            assert!(sizes.contains(&default_page_size().unwrap()));
        }
    }
}
