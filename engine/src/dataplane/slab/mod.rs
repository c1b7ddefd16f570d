//! Hugepage-backed buffer slabs.
//!
//! Each lcore owns one [`Slab`]: a single large anonymous mapping carved into
//! fixed-size slots, which the fabric layer registers with libfabric once, at
//! start-up, through [`Slab::as_ptr`] and [`Slab::len`]. Receives land in
//! slots, chunks are reduced in place, results are sent from the same slots;
//! nothing on the data path allocates or registers memory.
//!
//! What backs the mapping matters for speed. A NIC walks the same page tables
//! as the CPU, through its own translation cache: 64 MiB of 4 KiB pages is
//! 16384 translations, of 2 MiB pages 32, of 1 GiB pages one. So a slab is
//! backed by the first of these that works, in order:
//!
//! 1. hugetlb 1 GiB pages, when the slab fills at least three quarters of the
//!    1 GiB pages it would take (a smaller slab would waste most of a scarce
//!    page) and the pool has enough free;
//! 2. hugetlb 2 MiB pages (the mapping is rounded up to whole pages);
//! 3. transparent huge pages: an ordinary mapping aligned to 2 MiB and marked
//!    `MADV_HUGEPAGE`, which the kernel fills with 2 MiB pages when it can;
//! 4. normal pages.
//!
//! Those are x86-64's sizes, and an arm64 kernel of 4 KiB pages; other
//! kernels (64 KiB base pages, 512 MiB huge pages) get the same rules over
//! their own sizes ([`geometry`]).
//!
//! [`HugepagePolicy`] chooses how far down the chain to go: `Require` stops
//! after hugetlb with an error that says what to reserve, `Prefer` goes all
//! the way, `Off` uses normal pages only (marked `MADV_NOHUGEPAGE`, so that
//! THP in `always` mode does not sneak in either). Whatever happens, exactly
//! one `info` log line per slab says what backs it and why.
//!
//! # The NUMA contract
//!
//! [`Slab::new`] writes to every page of the mapping before it returns, so
//! that all the memory is allocated there and then, not page by page on the
//! data path. Linux places a page on the NUMA node of the CPU that first
//! touches it, so `Slab::new` must be called **on the owning lcore's thread,
//! after that thread is pinned** ([`crate::host::cpuset::pin_current_thread`]);
//! the slab is then NUMA-local to the core that uses it. The memory is also
//! locked (`mlock`, best effort) so that it is never paged out from under a
//! registration, and marked `MADV_DONTFORK` so that a forked child (a data
//! loader of the process that hosts the NCCL plugin) neither copies nor
//! shares buffers that the NIC is writing into.

use core::fmt;
use core::ptr::NonNull;
use core::str::FromStr;
use std::io;

use crate::host::hugepages;
use crate::host::units::{format_size, format_size_arg};

pub mod geometry;
pub use geometry::PageGeometry;

/// How hard to try for huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugepagePolicy {
    /// hugetlb pages (1 GiB or 2 MiB) or an error naming the shortfall.
    Require,
    /// hugetlb pages if the pools have them, else transparent huge pages,
    /// else normal pages.
    #[default]
    Prefer,
    /// Normal pages only, with transparent huge pages refused too.
    Off,
}

impl fmt::Display for HugepagePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HugepagePolicy::Require => "require",
            HugepagePolicy::Prefer => "prefer",
            HugepagePolicy::Off => "off",
        })
    }
}

/// A string that is not `require`, `prefer` or `off`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsePolicyError {
    pub input: String,
}

impl fmt::Display for ParsePolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid hugepage policy {:?} (expected require, prefer or off)", self.input)
    }
}

impl std::error::Error for ParsePolicyError {}

impl FromStr for HugepagePolicy {
    type Err = ParsePolicyError;

    /// `require`, `prefer` or `off`, in any case.
    fn from_str(s: &str) -> Result<HugepagePolicy, ParsePolicyError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "require" => Ok(HugepagePolicy::Require),
            "prefer" => Ok(HugepagePolicy::Prefer),
            "off" => Ok(HugepagePolicy::Off),
            _ => Err(ParsePolicyError { input: s.to_string() }),
        }
    }
}

/// What memory backs a slab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// hugetlb pages of this many bytes (1 GiB or 2 MiB on x86-64).
    Hugetlb(u64),
    /// An ordinary mapping that the kernel backed, at least partly, with
    /// transparent huge pages.
    TransparentHuge,
    /// Base pages (4 KiB on x86-64, 4 or 64 KiB on arm64).
    Normal,
}

impl Backing {
    /// Whether the backing is a hugetlb pool (what `Require` insists on).
    pub fn is_hugetlb(self) -> bool {
        matches!(self, Backing::Hugetlb(_))
    }
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backing::Hugetlb(size) => write!(f, "{} hugetlb pages", format_size(*size)),
            Backing::TransparentHuge => f.write_str("transparent huge pages"),
            Backing::Normal => f.write_str("normal pages"),
        }
    }
}

/// How to build a slab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlabConfig {
    /// Who owns the slab, for the log line and errors: `lcore 3`.
    pub label: String,
    /// Bytes per slot; rounded up to a multiple of 64 (a cache line, so that
    /// no two slots share one), or of the page size if `page_aligned_slots`.
    pub slot_size: usize,
    /// Number of slots.
    pub slots: usize,
    /// How hard to try for huge pages.
    pub policy: HugepagePolicy,
    /// Round slots up to whole base pages (4 KiB, or the system page size if
    /// larger): some providers register or pin at page granularity and want
    /// every buffer to start on a page.
    pub page_aligned_slots: bool,
}

impl SlabConfig {
    /// A config with policy `Prefer` and cache-line-aligned slots.
    pub fn new(label: impl Into<String>, slot_size: usize, slots: usize) -> SlabConfig {
        SlabConfig { label: label.into(), slot_size, slots, policy: HugepagePolicy::Prefer, page_aligned_slots: false }
    }
}

/// Why a slab could not be built.
#[derive(Debug)]
pub enum SlabError {
    /// The config itself is unusable (no slots, or too large to address).
    InvalidConfig { label: String, reason: String },
    /// `Require` was asked and the hugetlb pools cannot back the slab.
    HugepagesUnavailable {
        label: String,
        /// Pages of `page_size` the slab needs.
        need_pages: u64,
        page_size: u64,
        /// Pages the pool could still give (free and not reserved).
        available: u64,
        /// What `mmap` said.
        source: io::Error,
    },
    /// Even a mapping of normal pages failed.
    Map { label: String, len: usize, source: io::Error },
}

impl fmt::Display for SlabError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlabError::InvalidConfig { label, reason } => {
                write!(f, "slab {label}: invalid configuration: {reason}")
            }
            SlabError::HugepagesUnavailable { label, need_pages, page_size, available, source } => {
                let shortfall = need_pages.saturating_sub(*available).max(1) * page_size;
                write!(
                    f,
                    "slab {label}: hugepages required but unavailable: need {need_pages} x {} pages, \
                     pool has {available} free (mmap: {source}); run `tally hugepages reserve {}` \
                     or use --hugepages prefer",
                    format_size(*page_size),
                    format_size_arg(shortfall),
                )
            }
            SlabError::Map { label, len, source } => write!(f, "slab {label}: cannot map {} of memory: {source}", format_size(*len as u64)),
        }
    }
}

impl std::error::Error for SlabError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SlabError::InvalidConfig { .. } => None,
            SlabError::HugepagesUnavailable { source, .. } | SlabError::Map { source, .. } => Some(source),
        }
    }
}

/// One lcore's buffer memory: `slots()` slots of `slot_size()` bytes, back to
/// back from `as_ptr()`, in one mapping.
///
/// Built on the owning lcore's pinned thread (see the module documentation
/// for why), then used only by that thread. It is `Send` so that it can be
/// built where it is used and moved as needed, and not `Sync`: the raw
/// pointers it hands out let the owner write through `&self`.
pub struct Slab {
    label: String,
    /// The whole mapping, guard pages included: what drop unmaps.
    map_base: NonNull<u8>,
    map_len: usize,
    /// The slots: the usable, writable part of the mapping.
    ptr: NonNull<u8>,
    /// Writable bytes from `ptr`: `slots * slot_size` rounded up to pages.
    region_len: usize,
    slot_size: usize,
    slots: usize,
    backing: Backing,
    /// The page size of the backing (a base page for normal pages, 2 MiB
    /// for transparent huge pages).
    page_size: usize,
}

// SAFETY: a Slab owns its mapping outright (no other handle to it exists),
// and nothing about it belongs to the thread that created it: the pages stay
// where first touch placed them whichever thread later uses them.
unsafe impl Send for Slab {}

/// `n` rounded up to a multiple of `to` (a power of two), or `None` on overflow.
fn round_up(n: usize, to: usize) -> Option<usize> {
    debug_assert!(to.is_power_of_two());
    Some(n.checked_add(to - 1)? & !(to - 1))
}

/// A mapping made by one of the `map_*` functions, not yet a slab.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
    region: NonNull<u8>,
    region_len: usize,
}

impl Mapping {
    /// Unmap after a failure between mapping and building the slab.
    fn unmap(self) {
        // SAFETY: base/len is exactly a range this module mapped and that no
        // slab owns yet.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// An anonymous private hugetlb mapping of `len` bytes (a multiple of
/// `page_size`). The kernel reserves the pages at mmap time, so ENOMEM comes
/// now, not as a SIGBUS at first touch.
fn map_hugetlb(len: usize, page_size: u64) -> io::Result<Mapping> {
    let log2 = page_size.trailing_zeros() as libc::c_int;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | (log2 << libc::MAP_HUGE_SHIFT);
    // SAFETY: an anonymous mapping at an address of the kernel's choosing
    // touches no existing memory; the result is checked before use.
    let p = unsafe { libc::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = NonNull::new(p.cast::<u8>()).expect("mmap never returns NULL on success");
    Ok(Mapping { base, len, region: base, region_len: len })
}

/// An anonymous private mapping of `len` writable bytes starting at a
/// multiple of `align`, with an inaccessible guard page on each side.
///
/// The guards catch a write past either end of the slab, and they keep the
/// kernel from merging this mapping with a neighbour of the same flags (for
/// example another lcore's slab), which keeps per-mapping figures in
/// /proc/self/smaps exact.
fn map_guarded(len: usize, align: usize, page: usize) -> io::Result<Mapping> {
    let too_big = || io::Error::from_raw_os_error(libc::ENOMEM);
    // Room for the region, alignment slack and a guard on each side.
    let total = len.checked_add(align).and_then(|n| n.checked_add(2 * page)).ok_or_else(too_big)?;
    // SAFETY: an anonymous inaccessible mapping at an address of the
    // kernel's choosing touches no existing memory; checked before use.
    let p = unsafe { libc::mmap(core::ptr::null_mut(), total, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = p as usize;
    let start = round_up(base + page, align).ok_or_else(too_big)?;
    let (keep_lo, keep_hi) = (start - page, start + len + page);
    // Give back the slack outside the two guard pages.
    // SAFETY: both ranges lie inside the mapping just made, which nothing
    // else refers to; page-aligned because base, start and len are.
    unsafe {
        if keep_lo > base {
            libc::munmap(p, keep_lo - base);
        }
        if base + total > keep_hi {
            libc::munmap(keep_hi as *mut libc::c_void, base + total - keep_hi);
        }
    }
    let mapping = Mapping {
        base: NonNull::new(keep_lo as *mut u8).expect("above a mapped page"),
        len: keep_hi - keep_lo,
        region: NonNull::new(start as *mut u8).expect("inside a mapping"),
        region_len: len,
    };
    // SAFETY: the region lies inside the mapping, between the guards.
    let rc = unsafe { libc::mprotect(start as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_WRITE) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        mapping.unmap();
        return Err(e);
    }
    Ok(mapping)
}

/// `madvise` over a range, returning the error rather than the -1.
fn madvise(ptr: NonNull<u8>, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: callers pass a range of a mapping this module made; madvise
    // with these advices changes how the kernel backs it, not its contents
    // (none of them discards data).
    let rc = unsafe { libc::madvise(ptr.as_ptr().cast(), len, advice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Slab {
    /// Map, touch and lock a slab as `config` says, and log what backs it.
    ///
    /// Call this on the thread that will use the slab, after pinning it:
    /// every page is written here, and first touch decides the NUMA node.
    pub fn new(config: &SlabConfig) -> Result<Slab, SlabError> {
        Slab::with_geometry(config, &PageGeometry::detect())
    }

    /// [`Slab::new`] with the page sizes given rather than read from the
    /// kernel: tests map a 64 KiB-page kernel's slab on this host.
    pub fn with_geometry(config: &SlabConfig, geometry: &PageGeometry) -> Result<Slab, SlabError> {
        let label = config.label.clone();
        let invalid = |reason: String| SlabError::InvalidConfig { label: label.clone(), reason };
        if config.slots == 0 || config.slot_size == 0 {
            return Err(invalid(format!("{} slots of {} bytes: a slab needs at least one non-empty slot", config.slots, config.slot_size)));
        }
        let page = geometry.base;
        let slot_align = if config.page_aligned_slots { geometry.page_align() } else { 64 };
        let slot_size =
            round_up(config.slot_size, slot_align).ok_or_else(|| invalid(format!("slot size {} is too large", config.slot_size)))?;
        let len = slot_size
            .checked_mul(config.slots)
            .filter(|&n| n <= isize::MAX as usize / 2)
            .ok_or_else(|| invalid(format!("{} slots x {} bytes is too large", config.slots, slot_size)))?;

        // Why each better backing was passed over, for the log line.
        let mut passed_over: Vec<String> = Vec::new();
        let (mapping, backing, page_size) = match config.policy {
            HugepagePolicy::Off => {
                let m = map_guarded(round_up(len, page).expect("bounded above"), page, page).map_err(|source| SlabError::Map {
                    label: label.clone(),
                    len,
                    source,
                })?;
                // Refuse THP even where the system mode is `always`: "off"
                // must mean the same thing on every host. Kernels without
                // THP reject the advice, which is then true anyway.
                let _ = madvise(m.region, m.region_len, libc::MADV_NOHUGEPAGE);
                passed_over.push("hugepages off".to_string());
                (m, Backing::Normal, page)
            }
            HugepagePolicy::Require | HugepagePolicy::Prefer => match Slab::try_hugetlb(&label, len, geometry, &mut passed_over) {
                Ok(found) => found,
                Err(e) if config.policy == HugepagePolicy::Require => return Err(e),
                Err(_) => Slab::map_thp_or_normal(&label, len, geometry, &mut passed_over)?,
            },
        };

        let mut slab = Slab {
            label,
            map_base: mapping.base,
            map_len: mapping.len,
            ptr: mapping.region,
            region_len: mapping.region_len,
            slot_size,
            slots: config.slots,
            backing,
            page_size,
        };
        slab.touch(if backing.is_hugetlb() { page_size } else { page });

        // A THP request is a hope, not a promise: now that every page is
        // faulted in, ask the kernel how much of it is huge.
        let mut thp_note = String::new();
        if backing == Backing::TransparentHuge {
            match hugepages::thp_bytes_of_mapping(slab.ptr.as_ptr()) {
                Ok(Some(0)) => {
                    passed_over.push("THP requested but the kernel gave no huge pages".into());
                    slab.backing = Backing::Normal;
                    slab.page_size = page;
                }
                Ok(Some(huge)) => {
                    thp_note = format!("{} of it huge", format_size(huge));
                }
                Ok(None) | Err(_) => thp_note = "huge share unknown".into(),
            }
        }

        // SAFETY: the region is a mapping this slab owns.
        if unsafe { libc::mlock(slab.ptr.as_ptr().cast(), slab.region_len) } != 0 {
            log::debug!(
                "slab {}: mlock of {} failed ({}); pages may be swapped out",
                slab.label,
                format_size(slab.region_len as u64),
                io::Error::last_os_error()
            );
        }
        if let Err(e) = madvise(slab.ptr, slab.region_len, libc::MADV_DONTFORK) {
            log::debug!("slab {}: MADV_DONTFORK failed: {e}", slab.label);
        }

        let what = match slab.backing {
            Backing::Hugetlb(_) => {
                format!("{} x {} hugetlb pages", slab.region_len / slab.page_size, format_size(slab.page_size as u64))
            }
            Backing::TransparentHuge => "transparent huge pages".to_string(),
            Backing::Normal => format!("{} pages", format_size(page as u64)),
        };
        let notes: Vec<&str> =
            core::iter::once(thp_note.as_str()).filter(|n| !n.is_empty()).chain(passed_over.iter().map(String::as_str)).collect();
        let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) };
        log::info!(
            "slab {}: {} in {what}{notes}, {} slots x {}",
            slab.label,
            format_size(slab.len() as u64),
            slab.slots,
            format_size(slab.slot_size as u64),
        );
        Ok(slab)
    }

    /// Try hugetlb 1 GiB (when the 1 GiB rule allows) then 2 MiB pages, or
    /// the sizes of another geometry ([`PageGeometry::hugetlb_candidates`]).
    /// On failure the error describes the shortfall of the last (smallest),
    /// the pool an operator would fill.
    fn try_hugetlb(
        label: &str,
        len: usize,
        geometry: &PageGeometry,
        passed_over: &mut Vec<String>,
    ) -> Result<(Mapping, Backing, usize), SlabError> {
        let mut last_err = None;
        for size in geometry.hugetlb_candidates(len) {
            let backing = Backing::Hugetlb(size);
            let map_len = round_up(len, size as usize).expect("bounded above");
            let need = (map_len as u64) / size;
            match map_hugetlb(map_len, size) {
                Ok(m) => return Ok((m, backing, size as usize)),
                Err(e) => {
                    let available = hugepages::pool(size, None).map(|p| p.available()).unwrap_or(0);
                    log::debug!("slab {label}: {need} x {} hugetlb pages: {e} ({available} available)", format_size(size));
                    passed_over.push(if e.raw_os_error() == Some(libc::ENOMEM) {
                        format!("need {need} x {} hugetlb pages, {available} free", format_size(size))
                    } else {
                        format!("{} hugetlb pages: {e}", format_size(size))
                    });
                    last_err = Some(SlabError::HugepagesUnavailable {
                        label: label.to_string(),
                        need_pages: need,
                        page_size: size,
                        available,
                        source: e,
                    });
                }
            }
        }
        Err(last_err.expect("at least one candidate"))
    }

    /// Transparent huge pages if the system allows them, else normal pages.
    fn map_thp_or_normal(
        label: &str,
        len: usize,
        geometry: &PageGeometry,
        passed_over: &mut Vec<String>,
    ) -> Result<(Mapping, Backing, usize), SlabError> {
        let page = geometry.base;
        let thp = hugepages::thp_mode().unwrap_or(hugepages::ThpMode::Never);
        if thp != hugepages::ThpMode::Never && !geometry.thp_fits(len) {
            passed_over.push(format!("{} transparent huge pages would round it up too far", format_size(geometry.pmd)));
        } else if thp != hugepages::ThpMode::Never {
            let align = geometry.pmd as usize;
            let thp_len = round_up(len, align).expect("bounded above");
            match map_guarded(thp_len, align, page) {
                Ok(m) => match madvise(m.region, m.region_len, libc::MADV_HUGEPAGE) {
                    Ok(()) => return Ok((m, Backing::TransparentHuge, align)),
                    Err(e) => {
                        passed_over.push(format!("MADV_HUGEPAGE: {e}"));
                        m.unmap();
                    }
                },
                Err(e) => passed_over.push(format!("THP mapping: {e}")),
            }
        } else {
            passed_over.push("THP mode never".to_string());
        }
        let m = map_guarded(round_up(len, page).expect("bounded above"), page, page).map_err(|source| SlabError::Map {
            label: label.to_string(),
            len,
            source,
        })?;
        Ok((m, Backing::Normal, page))
    }

    /// Write every page once, so that all of it is allocated now and on this
    /// thread's NUMA node.
    ///
    /// For hugetlb the pages were reserved at mmap time, so these faults
    /// cannot run out of pages (a cpuset that confines memory to nodes whose
    /// pools are empty is the one exception the kernel does not guard
    /// against: there the fault is a SIGBUS).
    fn touch(&mut self, stride: usize) {
        let mut off = 0;
        while off < self.region_len {
            // SAFETY: off < region_len, inside the writable region this slab
            // owns; a volatile write cannot be optimised away.
            unsafe { self.ptr.as_ptr().add(off).write_volatile(0) };
            off += stride;
        }
    }

    /// What backs the slab.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// The owner's label (`lcore 3`).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Bytes of slots: `slots() * slot_size()`. Register `as_ptr()..+len()`.
    pub fn len(&self) -> usize {
        self.slots * self.slot_size
    }

    /// Never true: a slab has at least one non-empty slot.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes actually mapped writable: `len()` rounded up to whole pages.
    pub fn mapped_len(&self) -> usize {
        self.region_len
    }

    /// Size of the pages backing the slab (for transparent huge pages, the
    /// huge page size the kernel was asked for).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Bytes per slot, after rounding.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Start of the slab, aligned to its page size: what the fabric
    /// registers. Writing through it while a `&[u8]` from this slab is alive
    /// is the caller's responsibility, as with any raw pointer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Start of slot `i`.
    ///
    /// # Panics
    /// If `i >= slots()`: a slot index is never out of range in a correct
    /// program.
    pub fn slot_ptr(&self, i: usize) -> *mut u8 {
        self.check(i);
        // SAFETY: i < slots, so the offset is inside the region.
        unsafe { self.ptr.as_ptr().add(i * self.slot_size) }
    }

    /// Slot `i`, to read. Panics if `i >= slots()`.
    pub fn slot(&self, i: usize) -> &[u8] {
        self.check(i);
        // SAFETY: the slot lies inside the writable region this slab owns
        // and was initialised (zeroed) by the kernel; the borrow of self
        // keeps the mapping alive for the slice's lifetime.
        unsafe { core::slice::from_raw_parts(self.slot_ptr(i), self.slot_size) }
    }

    /// Slot `i`, to write. Panics if `i >= slots()`.
    pub fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        self.check(i);
        // SAFETY: as in `slot`, and the unique borrow of self means no
        // other slice of this slab exists.
        unsafe { core::slice::from_raw_parts_mut(self.slot_ptr(i), self.slot_size) }
    }

    /// All slots as one slice.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: len() bytes from ptr lie inside the region; see `slot`.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// All slots as one mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, with a unique borrow of self.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }

    /// The slot that `p` points into, if any: maps a completion's buffer
    /// address back to its slot.
    pub fn slot_of(&self, p: *const u8) -> Option<usize> {
        let off = (p as usize).checked_sub(self.ptr.as_ptr() as usize)?;
        (off < self.len()).then(|| off / self.slot_size)
    }

    fn check(&self, i: usize) {
        assert!(i < self.slots, "slab {}: slot {i} out of range ({} slots)", self.label, self.slots);
    }
}

impl fmt::Debug for Slab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slab")
            .field("label", &self.label)
            .field("ptr", &self.ptr)
            .field("len", &self.len())
            .field("slots", &self.slots)
            .field("slot_size", &self.slot_size)
            .field("backing", &self.backing)
            .finish()
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: map_base/map_len is the whole mapping this slab owns, and
        // no slice of it outlives the slab (they all borrow it).
        let rc = unsafe { libc::munmap(self.map_base.as_ptr().cast(), self.map_len) };
        if rc != 0 {
            log::warn!("slab {}: munmap failed: {}", self.label, io::Error::last_os_error());
        }
    }
}

#[cfg(test)]
mod tests;
