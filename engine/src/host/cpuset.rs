//! Core lists in the DPDK/taskset syntax, and pinning threads to cores.
//!
//! A server is started with `--lcores 2-9,12`: a comma-separated list of
//! single cores and inclusive ranges. The list is an *ordered* map from lcore
//! index to CPU: lcore k runs on the k-th core of the list as written, so
//! `4,2` puts lcore 0 on CPU 4. [`CoreList`] therefore keeps the user's order
//! and rejects a core given twice (two lcores busy-polling one core would
//! starve each other, and it is always a typo).
//!
//! [`allowed`] is the process's affinity mask (what `taskset`, cgroups or a
//! container left us); a core list is checked against it before any thread
//! starts, so a bad `--lcores` fails at start-up with the offending cores
//! named, not later as an `EINVAL` from one worker thread.
//!
//! [`pin_current_thread`] binds the calling thread to one core with
//! `sched_setaffinity` and reads the mask back: an lcore that silently runs
//! unpinned would still work, just slowly and with its memory on the wrong
//! NUMA node, which is the kind of failure nobody notices.

use core::fmt;
use std::io;
use std::str::FromStr;

/// The largest number of CPUs this module handles: core ids are below this.
///
/// The kernel's affinity syscalls take a mask of any length; 8192 bits is
/// the largest `NR_CPUS` that distribution kernels are built with.
pub const MAX_CORES: usize = 8192;

const MASK_WORDS: usize = MAX_CORES / 64;

/// An ordered list of distinct CPU core ids; lcore k runs on `self[k]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CoreList(Vec<usize>);

/// Why a core list was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpusetError {
    /// The list is empty or only whitespace.
    Empty,
    /// A piece of the list is not a core number or a range `lo-hi`.
    Invalid { input: String, item: String },
    /// A range runs backwards, like `9-2`.
    Reversed { input: String, lo: usize, hi: usize },
    /// A core id is at least [`MAX_CORES`].
    TooLarge { input: String, item: String },
    /// A core appears twice.
    Duplicate { input: String, core: usize },
    /// Cores that the process's affinity mask does not include.
    NotAllowed { missing: CoreList, allowed: CoreList },
}

impl fmt::Display for CpusetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpusetError::Empty => write!(f, "empty core list (expected e.g. 2-9,12)"),
            CpusetError::Invalid { input, item } => {
                write!(f, "invalid core list {input:?}: {item:?} is not a core number or range (expected e.g. 2-9,12)")
            }
            CpusetError::Reversed { input, lo, hi } => {
                write!(f, "invalid core list {input:?}: range {lo}-{hi} runs backwards (write {hi}-{lo})")
            }
            CpusetError::TooLarge { input, item } => {
                write!(f, "invalid core list {input:?}: core {item} is out of range (core ids are below {MAX_CORES})")
            }
            CpusetError::Duplicate { input, core } => write!(f, "invalid core list {input:?}: core {core} is listed more than once"),
            CpusetError::NotAllowed { missing, allowed } => {
                write!(f, "cores {missing} are not in this process's CPU affinity mask (allowed: {allowed})")
            }
        }
    }
}

impl std::error::Error for CpusetError {}

impl CoreList {
    /// Parse `2-9,12`-style lists: single cores and inclusive ranges, separated
    /// by commas, with whitespace allowed around every piece.
    pub fn parse(s: &str) -> Result<CoreList, CpusetError> {
        if s.trim().is_empty() {
            return Err(CpusetError::Empty);
        }
        let mut cores = Vec::new();
        // One bit per core for the duplicate check, so that a list like
        // 0-8191 costs a kilobyte rather than a quadratic search.
        let mut seen = vec![0u64; MASK_WORDS];
        for raw in s.split(',') {
            let item = raw.trim();
            let (lo, hi) = match item.split_once('-') {
                Some((lo, hi)) => (parse_core(s, item, lo)?, parse_core(s, item, hi)?),
                None => {
                    let core = parse_core(s, item, item)?;
                    (core, core)
                }
            };
            if lo > hi {
                return Err(CpusetError::Reversed { input: s.to_string(), lo, hi });
            }
            for core in lo..=hi {
                let (word, bit) = (core / 64, 1u64 << (core % 64));
                if seen[word] & bit != 0 {
                    return Err(CpusetError::Duplicate { input: s.to_string(), core });
                }
                seen[word] |= bit;
                cores.push(core);
            }
        }
        Ok(CoreList(cores))
    }

    /// A list from core ids in lcore order; refuses duplicates and ids at or
    /// above [`MAX_CORES`].
    pub fn from_cores(cores: Vec<usize>) -> Result<CoreList, CpusetError> {
        let input = || cores.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
        let mut seen = vec![0u64; MASK_WORDS];
        for &core in &cores {
            if core >= MAX_CORES {
                return Err(CpusetError::TooLarge { input: input(), item: core.to_string() });
            }
            let (word, bit) = (core / 64, 1u64 << (core % 64));
            if seen[word] & bit != 0 {
                return Err(CpusetError::Duplicate { input: input(), core });
            }
            seen[word] |= bit;
        }
        Ok(CoreList(cores))
    }

    /// The cores in lcore order.
    pub fn as_slice(&self) -> &[usize] {
        &self.0
    }

    /// The cores in lcore order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }

    /// How many cores (lcores) the list names.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the list is empty (only [`Default`] or [`allowed`] in a
    /// very odd process can give one; [`CoreList::parse`] never does).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The core that lcore `lcore` runs on.
    pub fn get(&self, lcore: usize) -> Option<usize> {
        self.0.get(lcore).copied()
    }

    /// Whether `core` is in the list.
    pub fn contains(&self, core: usize) -> bool {
        self.0.contains(&core)
    }

    /// Check every core against `allowed`; the error lists the cores missing.
    pub fn validate_against(&self, allowed: &CoreList) -> Result<(), CpusetError> {
        let missing: Vec<usize> = self.iter().filter(|&c| !allowed.contains(c)).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(CpusetError::NotAllowed { missing: CoreList(missing), allowed: allowed.clone() })
        }
    }

    /// Check every core against this process's affinity mask ([`allowed`]).
    ///
    /// Run this before starting lcore threads: pinning to a core outside the
    /// mask fails with `EINVAL`, and a cpuset cgroup can shrink the mask
    /// below what `nproc`-style counting suggests.
    pub fn validate_against_allowed(&self) -> Result<(), CpusetError> {
        // If the mask cannot even be read, pinning will fail too and say why;
        // an unreadable mask is not a reason to refuse a valid list here.
        match allowed() {
            Ok(allowed) => self.validate_against(&allowed),
            Err(_) => Ok(()),
        }
    }
}

/// Parse one core number of a list; `item` is the piece it came from.
fn parse_core(input: &str, item: &str, digits: &str) -> Result<usize, CpusetError> {
    let digits = digits.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpusetError::Invalid { input: input.to_string(), item: item.to_string() });
    }
    match digits.parse::<usize>() {
        Ok(core) if core < MAX_CORES => Ok(core),
        _ => Err(CpusetError::TooLarge { input: input.to_string(), item: digits.to_string() }),
    }
}

impl FromStr for CoreList {
    type Err = CpusetError;

    fn from_str(s: &str) -> Result<CoreList, CpusetError> {
        CoreList::parse(s)
    }
}

impl fmt::Display for CoreList {
    /// The compact form: ascending runs of consecutive cores become ranges,
    /// in list order, so `2-9,12` prints as `2-9,12` and `4,2` as `4,2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                end += 1;
                i += 1;
            }
            if start != self.0[0] {
                // Cores are distinct, so only the first run starts with the
                // first core.
                f.write_str(",")?;
            }
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

impl<'a> IntoIterator for &'a CoreList {
    type Item = usize;
    type IntoIter = core::iter::Copied<core::slice::Iter<'a, usize>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().copied()
    }
}

/// A CPU mask in the kernel's layout: an array of longs, bit `c` for core `c`.
struct Mask([u64; MASK_WORDS]);

impl Mask {
    fn empty() -> Mask {
        Mask([0; MASK_WORDS])
    }

    fn set(&mut self, core: usize) {
        self.0[core / 64] |= 1 << (core % 64);
    }

    fn cores(&self) -> Vec<usize> {
        (0..MAX_CORES).filter(|&c| self.0[c / 64] & (1 << (c % 64)) != 0).collect()
    }

    /// `sched_getaffinity` for the calling thread.
    fn of_current_thread() -> io::Result<Mask> {
        let mut mask = Mask::empty();
        // SAFETY: the pointer and length describe `mask.0`, which lives for
        // the call; the kernel writes at most that many bytes. A mask of
        // u64s has the layout of the kernel's array of longs on 64-bit Linux
        // and on little-endian 32-bit Linux (the targets here are 64-bit).
        let rc = unsafe { libc::syscall(libc::SYS_sched_getaffinity, 0, core::mem::size_of_val(&mask.0), mask.0.as_mut_ptr()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(mask)
    }

    /// `sched_setaffinity` for the calling thread.
    fn apply_to_current_thread(&self) -> io::Result<()> {
        // SAFETY: the pointer and length describe `self.0`, which the kernel
        // only reads, and which lives for the call.
        let rc = unsafe { libc::syscall(libc::SYS_sched_setaffinity, 0, core::mem::size_of_val(&self.0), self.0.as_ptr()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The cores the calling thread may run on (its `sched_getaffinity` mask), in
/// ascending order.
///
/// Called before any pinning, this is the process's mask as `taskset`, a
/// container or a cpuset cgroup set it. It is per thread: called from a
/// pinned thread it returns that thread's single core.
pub fn allowed() -> io::Result<CoreList> {
    Ok(CoreList(Mask::of_current_thread()?.cores()))
}

/// Pin the calling thread to `core` and check that the kernel now reports
/// exactly that core as its affinity.
///
/// The kernel migrates the thread before returning, so from here on it runs
/// (and first-touches memory) on `core`. Errors name the core: `EINVAL`
/// means the core is offline or outside the process's cpuset.
pub fn pin_current_thread(core: usize) -> io::Result<()> {
    if core >= MAX_CORES {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cannot pin to core {core}: core ids are below {MAX_CORES}")));
    }
    let mut mask = Mask::empty();
    mask.set(core);
    mask.apply_to_current_thread()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot pin thread to core {core}: sched_setaffinity: {e}")))?;
    let now = Mask::of_current_thread()?.cores();
    if now != [core] {
        return Err(io::Error::other(format!("pinned thread to core {core} but its affinity reads back as {}", CoreList(now))));
    }
    Ok(())
}

/// Let the calling thread run on the cores of `list` only (what it forks
/// inherits the mask: a process started from it runs there too).
pub fn restrict_current_thread(list: &CoreList) -> io::Result<()> {
    let mut mask = Mask::empty();
    for c in list.iter() {
        mask.set(c);
    }
    mask.apply_to_current_thread()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot restrict a thread to cores {list}: sched_setaffinity: {e}")))
}

/// The core the calling thread is running on at this instant (`sched_getcpu`).
///
/// Only meaningful for a pinned thread; an unpinned one may move right after.
pub fn current_core() -> io::Result<usize> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cpu as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_compact_and_keeps_order() {
        let table: &[(&[usize], &str)] = &[
            (&[0], "0"),
            (&[2, 3, 4, 5, 6, 7, 8, 9, 12], "2-9,12"),
            (&[4, 2], "4,2"),
            (&[1, 2], "1-2"),
            (&[5, 6, 7, 0, 1], "5-7,0-1"),
            (&[3, 1, 2], "3,1-2"),
            (&[], ""),
        ];
        for &(cores, want) in table {
            assert_eq!(CoreList(cores.to_vec()).to_string(), want);
        }
    }

    #[test]
    fn mask_round_trip() {
        let mut m = Mask::empty();
        for c in [0, 63, 64, 1000, MAX_CORES - 1] {
            m.set(c);
        }
        assert_eq!(m.cores(), vec![0, 63, 64, 1000, MAX_CORES - 1]);
    }

    #[test]
    fn a_restricted_thread_and_what_it_starts_run_on_the_list_only() {
        let before = allowed().unwrap();
        let first = before.as_slice()[0];
        let list = CoreList::from_cores(vec![first]).unwrap();
        let (mine, child) = std::thread::spawn(move || {
            restrict_current_thread(&list).unwrap();
            let child = std::thread::spawn(|| allowed().unwrap()).join().unwrap();
            (allowed().unwrap(), child)
        })
        .join()
        .unwrap();
        assert_eq!(mine.as_slice(), [first]);
        assert_eq!(child.as_slice(), [first], "a thread it starts inherits the mask");
        assert_eq!(allowed().unwrap().as_slice(), before.as_slice(), "the caller's own mask is untouched");
    }
}
