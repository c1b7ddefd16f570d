//! Slabs against the real kernel: empty pools, filled 2 MiB and 1 GiB pools,
//! policy `off`, and the pin-then-build contract.
//!
//! The hugepage pools are global to the machine, and tests in one binary run
//! on parallel threads, so every test whose outcome depends on the pools (any
//! slab built with `prefer` or `require`) holds `POOL_LOCK`. Pools are changed
//! only through `PoolGuard`, which puts the old size back when it drops, also
//! when the test panics. Changing a pool needs root; without it those tests
//! print "skipped: needs root" and return.

use std::sync::{Mutex, MutexGuard, Once};

use tally_engine::dataplane::slab::{Backing, HugepagePolicy, Slab, SlabConfig, SlabError};
use tally_engine::host::cpuset;
use tally_engine::host::hugepages::{self, PoolGuard, SIZE_1G, SIZE_2M};

static POOL_LOCK: Mutex<()> = Mutex::new(());

fn lock_pools() -> MutexGuard<'static, ()> {
    // A test that failed while holding the lock has already restored its
    // pools (PoolGuard drops during unwinding), so the poison means nothing.
    POOL_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

// ---- log capture: the "exactly one line per slab" promise is tested ----

static LINES: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = record.args().to_string();
        eprintln!("[{}] {line}", record.level());
        LINES.lock().unwrap().push((record.level(), line));
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture;

fn init_log() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        log::set_logger(&CAPTURE).expect("no other logger in this binary");
        log::set_max_level(log::LevelFilter::Debug);
    });
}

/// The info lines logged for the slab labelled `label`.
fn info_lines(label: &str) -> Vec<String> {
    let prefix = format!("slab {label}:");
    LINES
        .lock()
        .unwrap()
        .iter()
        .filter(|(level, line)| *level == log::Level::Info && line.starts_with(&prefix))
        .map(|(_, line)| line.clone())
        .collect()
}

/// The one info line of `label`'s slab.
fn the_info_line(label: &str) -> String {
    let lines = info_lines(label);
    assert_eq!(lines.len(), 1, "exactly one info line per slab: {lines:?}");
    lines.into_iter().next().unwrap()
}

// ---- helpers ----

fn config(label: &str, slot_size: usize, slots: usize, policy: HugepagePolicy) -> SlabConfig {
    SlabConfig { policy, ..SlabConfig::new(label, slot_size, slots) }
}

fn global_pool(size: u64) -> hugepages::PoolState {
    hugepages::pool(size, None).expect("read hugepage pool")
}

/// Empty both hugetlb pools for the duration of a test. Without root the
/// pools cannot be changed: if they already offer nothing the test can still
/// run (Some(empty)), otherwise it must be skipped (None).
fn empty_pools(test: &str) -> Option<Vec<PoolGuard>> {
    let sizes = hugepages::page_sizes().unwrap();
    if is_root() {
        Some(sizes.iter().filter(|&&s| s == SIZE_2M || s == SIZE_1G).map(|&s| PoolGuard::set(s, 0).expect("empty hugepage pool")).collect())
    } else if sizes.iter().all(|&s| global_pool(s).available() == 0) {
        Some(Vec::new())
    } else {
        println!("{test}: skipped: needs root (hugepage pools are not empty)");
        None
    }
}

/// Write a pattern over every byte of every slot (or the first and last
/// word of each, for big slabs), then read it all back.
fn fill_and_check(slab: &mut Slab, every_byte: bool) {
    let (n, size) = (slab.slots(), slab.slot_size());
    for i in 0..n {
        assert_eq!(slab.slot_ptr(i) as usize, slab.as_ptr() as usize + i * size);
        let slot = slab.slot_mut(i);
        assert_eq!(slot.len(), size);
        if every_byte {
            for (j, b) in slot.iter_mut().enumerate() {
                *b = (i.wrapping_mul(131) ^ j.wrapping_mul(7)) as u8;
            }
        } else {
            slot[..8].copy_from_slice(&(i as u64).to_le_bytes());
            slot[size - 8..].copy_from_slice(&(!(i as u64)).to_le_bytes());
        }
    }
    for i in 0..n {
        let slot = slab.slot(i);
        if every_byte {
            for (j, &b) in slot.iter().enumerate() {
                assert_eq!(b, (i.wrapping_mul(131) ^ j.wrapping_mul(7)) as u8);
            }
        } else {
            assert_eq!(slot[..8], (i as u64).to_le_bytes());
            assert_eq!(slot[size - 8..], (!(i as u64)).to_le_bytes());
        }
    }
    assert_eq!(slab.as_mut_slice().len(), n * size);
}

// ---- (a) empty pools + prefer ----

#[test]
fn prefer_falls_back_when_pools_are_empty() {
    init_log();
    let _lock = lock_pools();
    let Some(_guards) = empty_pools("prefer_falls_back_when_pools_are_empty") else {
        return;
    };
    let label = "test-prefer-empty";
    let mut slab = Slab::new(&config(label, 128 << 10, 512, HugepagePolicy::Prefer)).expect("prefer never fails for want of hugepages");
    assert!(matches!(slab.backing(), Backing::TransparentHuge | Backing::Normal), "{:?}", slab.backing());
    assert_eq!(slab.len(), 64 << 20);
    assert_eq!(slab.as_ptr() as usize % (2 << 20), 0, "THP wants 2 MiB alignment");
    fill_and_check(&mut slab, true);

    let line = the_info_line(label);
    println!("{line}");
    assert!(line.contains("64 MiB in"), "{line}");
    assert!(line.contains("512 slots x 128 KiB"), "{line}");
    assert!(line.contains("need 32 x 2 MiB hugetlb pages, 0 free"), "{line}");
    match slab.backing() {
        Backing::TransparentHuge => {
            assert!(line.contains("transparent huge pages"), "{line}");
            let huge = hugepages::thp_bytes_of_mapping(slab.as_ptr()).unwrap();
            assert!(huge.is_some_and(|h| h > 0), "{huge:?}");
        }
        _ => assert!(line.contains("4 KiB pages"), "{line}"),
    }
}

// ---- (b) empty pools + require ----

#[test]
fn require_fails_clearly_when_pools_are_empty() {
    init_log();
    let _lock = lock_pools();
    let Some(_guards) = empty_pools("require_fails_clearly_when_pools_are_empty") else {
        return;
    };
    let err =
        Slab::new(&config("test-require-empty", 128 << 10, 512, HugepagePolicy::Require)).expect_err("require without hugepages must fail");
    let msg = err.to_string();
    println!("{msg}");
    assert!(matches!(err, SlabError::HugepagesUnavailable { need_pages: 32, page_size: SIZE_2M, available: 0, .. }), "{err:?}");
    assert!(msg.contains("hugepages"), "{msg}");
    assert!(msg.contains("need 32 x 2 MiB pages, pool has 0 free"), "{msg}");
    assert!(msg.contains("tally hugepages reserve 64M"), "{msg}");
    assert!(msg.contains("--hugepages prefer"), "{msg}");
    assert!(info_lines("test-require-empty").is_empty());
}

// ---- (c) a real 2 MiB pool ----

#[test]
fn hugetlb_2m_pages_back_the_slab_and_return_to_the_pool() {
    init_log();
    if !is_root() {
        println!("hugetlb_2m_pages_back_the_slab_and_return_to_the_pool: skipped: needs root");
        return;
    }
    let _lock = lock_pools();
    let _no_1g = PoolGuard::set(SIZE_1G, 0).expect("empty 1 GiB pool");
    let pool = PoolGuard::reserve(SIZE_2M, 32).expect("grow 2 MiB pool");
    assert_eq!(pool.added(), 32, "the kernel gave {} of 32 x 2 MiB pages", pool.added());
    let before = global_pool(SIZE_2M);
    assert!(before.available() >= 32, "{before:?}");

    let label = "test-2m";
    let mut slab = Slab::new(&config(label, 128 << 10, 512, HugepagePolicy::Require)).expect("32 free 2 MiB pages back a 64 MiB slab");
    assert_eq!(slab.backing(), Backing::Hugetlb(SIZE_2M));
    assert_eq!(slab.page_size(), 2 << 20);
    assert_eq!(slab.as_ptr() as usize % (2 << 20), 0);
    let during = global_pool(SIZE_2M);
    assert_eq!(before.free - during.free, 32, "touching the slab faults in all its pages: {before:?} -> {during:?}");
    fill_and_check(&mut slab, true);

    let line = the_info_line(label);
    println!("{line}");
    assert_eq!(line, "slab test-2m: 64 MiB in 32 x 2 MiB hugetlb pages, 512 slots x 128 KiB");

    drop(slab);
    let after = global_pool(SIZE_2M);
    assert_eq!(after.free, before.free, "pages went back to the pool");
    drop(pool);
    assert_eq!(global_pool(SIZE_2M).total, before.total - 32);
}

#[test]
fn hugetlb_2m_rounds_up_to_whole_pages() {
    init_log();
    if !is_root() {
        println!("hugetlb_2m_rounds_up_to_whole_pages: skipped: needs root");
        return;
    }
    let _lock = lock_pools();
    let _no_1g = PoolGuard::set(SIZE_1G, 0).expect("empty 1 GiB pool");
    let pool = PoolGuard::reserve(SIZE_2M, 2).expect("grow 2 MiB pool");
    assert_eq!(pool.added(), 2);
    let label = "test-2m-round";
    // 3 x 1000 bytes round to 3 x 1024: one page, with most of it unused.
    let mut slab = Slab::new(&config(label, 1000, 3, HugepagePolicy::Prefer)).unwrap();
    assert_eq!(slab.backing(), Backing::Hugetlb(SIZE_2M));
    assert_eq!(slab.slot_size(), 1024);
    assert_eq!(slab.mapped_len(), 2 << 20);
    fill_and_check(&mut slab, true);
    assert!(the_info_line(label).contains("1 x 2 MiB hugetlb pages, 3 slots x 1 KiB"));
}

// ---- (d) 1 GiB pages ----

#[test]
fn hugetlb_1g_pages_when_the_kernel_has_them() {
    init_log();
    if !is_root() {
        println!("hugetlb_1g_pages_when_the_kernel_has_them: skipped: needs root");
        return;
    }
    let _lock = lock_pools();
    let _no_2m = PoolGuard::set(SIZE_2M, 0).expect("empty 2 MiB pool");
    if !hugepages::page_sizes().unwrap().contains(&SIZE_1G) {
        println!("this kernel offers no 1 GiB hugetlb pages: checking the fallback");
        let slab = Slab::new(&config("test-1g-none", 1 << 20, 1024, HugepagePolicy::Prefer)).unwrap();
        assert!(!slab.backing().is_hugetlb());
        return;
    }
    let pool = PoolGuard::reserve(SIZE_1G, 1).expect("grow 1 GiB pool");
    let label = "test-1g";
    let cfg = config(label, 1 << 20, 1024, HugepagePolicy::Prefer);

    if pool.added() == 0 {
        // Growing the 1 GiB pool at run time needs a free, physically
        // contiguous, aligned gigabyte; fragmentation can deny it.
        println!(
            "the kernel gave 0 of 1 x 1 GiB pages (no contiguous free gigabyte); \
             checking the fallback instead. /proc/meminfo: {}",
            std::fs::read_to_string("/proc/meminfo")
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("MemFree") || l.starts_with("HugePages_"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut slab = Slab::new(&cfg).expect("prefer falls back");
        assert!(matches!(slab.backing(), Backing::TransparentHuge | Backing::Normal), "{:?}", slab.backing());
        fill_and_check(&mut slab, false);
        assert!(the_info_line(label).contains("need 1 x 1 GiB hugetlb pages, 0 free"));
        return;
    }

    let before = global_pool(SIZE_1G);
    let mut slab = Slab::new(&cfg).expect("a free 1 GiB page backs a 1 GiB slab");
    assert_eq!(slab.backing(), Backing::Hugetlb(SIZE_1G));
    assert_eq!(slab.as_ptr() as usize % (1 << 30), 0);
    assert_eq!(global_pool(SIZE_1G).free, before.free - 1);
    fill_and_check(&mut slab, false);
    assert_eq!(the_info_line(label), "slab test-1g: 1 GiB in 1 x 1 GiB hugetlb pages, 1024 slots x 1 MiB");
    drop(slab);
    assert_eq!(global_pool(SIZE_1G).free, before.free);

    // A small slab does not take a whole gigabyte page even when one is free.
    let small = Slab::new(&config("test-1g-small", 1 << 20, 64, HugepagePolicy::Prefer)).expect("prefer falls back");
    assert_ne!(small.backing(), Backing::Hugetlb(SIZE_1G));
    assert_eq!(global_pool(SIZE_1G).free, before.free);
    let err = Slab::new(&config("test-1g-small-req", 1 << 20, 64, HugepagePolicy::Require))
        .expect_err("no 2 MiB pages, and 1 GiB pages are not for small slabs");
    assert!(err.to_string().contains("need 32 x 2 MiB pages"), "{err}");
}

// ---- (e) policy off ----

#[test]
fn off_means_normal_pages() {
    init_log();
    // No lock: `off` never looks at the pools, and nothing else may change it.
    let label = "test-off";
    let mut slab = Slab::new(&config(label, 64 << 10, 256, HugepagePolicy::Off)).unwrap();
    assert_eq!(slab.backing(), Backing::Normal);
    assert_eq!(slab.len(), 16 << 20);
    fill_and_check(&mut slab, true);
    assert_eq!(hugepages::thp_bytes_of_mapping(slab.as_ptr()).unwrap(), Some(0), "MADV_NOHUGEPAGE keeps THP out");
    assert_eq!(the_info_line(label), "slab test-off: 16 MiB in 4 KiB pages (hugepages off), 256 slots x 64 KiB");
}

// ---- the pool guard restores on panic ----

#[test]
fn pool_guard_restores_after_a_panic() {
    init_log();
    if !is_root() {
        println!("pool_guard_restores_after_a_panic: skipped: needs root");
        return;
    }
    let _lock = lock_pools();
    let before = global_pool(SIZE_2M).total;
    let result = std::thread::spawn(|| {
        let guard = PoolGuard::reserve(SIZE_2M, 4).unwrap();
        assert_eq!(global_pool(SIZE_2M).total, guard.total());
        panic!("test failure while holding the pool");
    })
    .join();
    assert!(result.is_err());
    assert_eq!(global_pool(SIZE_2M).total, before);
}

// ---- pin, then build: the NUMA contract ----

/// The NUMA node the page at `p` lives on, or None where the kernel has no
/// NUMA support.
fn node_of_page(p: *const u8) -> Option<i32> {
    const MPOL_F_NODE: libc::c_ulong = 1;
    const MPOL_F_ADDR: libc::c_ulong = 2;
    let mut node: libc::c_int = -1;
    // SAFETY: get_mempolicy writes one int to `node`; with a NULL nodemask
    // and maxnode 0 it writes nothing else. `p` is only looked up.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            p,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    (rc == 0).then_some(node)
}

/// The NUMA node of the CPU the calling thread runs on.
fn node_of_this_cpu() -> i32 {
    let (mut cpu, mut node): (libc::c_uint, libc::c_uint) = (0, 0);
    // SAFETY: getcpu writes one unsigned int to each pointer; the third
    // argument is unused by the kernel and may be NULL.
    let rc = unsafe {
        libc::syscall(libc::SYS_getcpu, &mut cpu as *mut libc::c_uint, &mut node as *mut libc::c_uint, std::ptr::null_mut::<libc::c_void>())
    };
    assert_eq!(rc, 0);
    node as i32
}

#[test]
fn slab_built_on_a_pinned_thread_is_local_and_moves() {
    init_log();
    let _lock = lock_pools();
    let allowed = cpuset::allowed().unwrap();
    let core = allowed.get(allowed.len() - 1).unwrap();
    let label = format!("lcore 0 (core {core})");
    let cfg = config(&label, 256 << 10, 32, HugepagePolicy::Prefer);

    // Build inside a pinned thread, as an lcore does, and hand it back.
    let (mut slab, node) = std::thread::spawn(move || {
        cpuset::pin_current_thread(core).expect("pin");
        let slab = Slab::new(&cfg).expect("prefer always builds");
        assert_eq!(cpuset::current_core().unwrap(), core);
        let node = node_of_this_cpu();
        for off in [0, slab.len() / 2, slab.len() - 1] {
            match node_of_page(slab.as_ptr().wrapping_add(off)) {
                Some(n) => assert_eq!(n, node, "page at +{off} is on node {n}, cpu on {node}"),
                None => println!("get_mempolicy unsupported: NUMA placement not checked"),
            }
        }
        (slab, node)
    })
    .join()
    .unwrap();

    // Slab is Send: the same memory is usable from here, and stays put.
    fill_and_check(&mut slab, true);
    if let Some(n) = node_of_page(slab.as_ptr()) {
        assert_eq!(n, node);
    }
    let line = the_info_line(&label);
    assert!(line.contains("8 MiB in"), "{line}");
    assert!(line.contains("32 slots x 256 KiB"), "{line}");
}
