//! Nothing on the per-chunk path allocates (ARCHITECTURE.md "The hot path"),
//! counted rather than reviewed: this test's global allocator counts every
//! allocation per thread (by the kernel's thread id). Servers run in this
//! process (two lcores each, tcp on loopback, adaptive polling) and the
//! ranks on threads of their own; after warm-up all-reduces (joins, first
//! connections, every sub-job), the counted ones must leave the count of
//! every lcore thread (`/proc/self/task/*/comm` = `lcore-N`) and every rank
//! thread where it was. Each shape takes a path of its own: one server and
//! two ranks (the relay of small pieces), one server and four (the split),
//! two servers and two ranks (failover's staging of every result and the
//! copy out of it); and the ring (`ring/`, the baseline), three ranks over
//! tcp. libfabric's own allocations (malloc) are not counted: the rule is
//! tally's.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;
use tally_engine::client::{Client, ClientConfig};
use tally_engine::host::config::ServerFile;
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::ring::bootstrap::Bootstrap;
use tally_engine::ring::{Ring, RingConfig};
use tally_engine::server::Server;

const SLOTS: usize = 1024;
static TIDS: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];
static COUNTS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// This thread's kernel id. The raw syscall, not libc's `gettid`: that
/// wrapper is glibc 2.30's, and the tests link against 2.28's symbols as the
/// shipped binaries do (the Makefile's test-rust).
fn gettid() -> i32 {
    // SAFETY: SYS_gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Counts each thread's allocations in a fixed open-addressed table (no
/// allocation of its own), then hands the call to the system allocator.
struct Counting;

fn note() {
    let tid = gettid();
    let start = tid as usize % SLOTS;
    for k in 0..SLOTS {
        let i = (start + k) % SLOTS;
        match TIDS[i].compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {}
            Err(t) if t == tid => {}
            Err(_) => continue,
        }
        COUNTS[i].fetch_add(1, Ordering::Relaxed);
        return;
    }
}

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: as alloc.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's pointer and layout, passed on.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's pointer and layout, passed on.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations_of(tid: i32) -> u64 {
    (0..SLOTS).find(|&i| TIDS[i].load(Ordering::Acquire) == tid).map_or(0, |i| COUNTS[i].load(Ordering::Relaxed))
}

/// This process's threads named `lcore-N`, with their allocations so far.
fn lcore_threads() -> Vec<(i32, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim().starts_with("lcore-") {
            out.push((tid, allocations_of(tid)));
        }
    }
    out.sort();
    out
}

fn server() -> Server {
    let text = "listen = \"127.0.0.1:0\"\nlcores = \"0-1\"\nprovider = \"tcp\"\npoll = \"adaptive\"\nhugepages = \"off\"\nslab_size = \"32M\"\nmax_jobs = 4\nmax_ranks = 8\n";
    Server::start(&ServerFile::parse(text).and_then(|f| f.resolve()).unwrap()).unwrap()
}

/// Rank `rank`'s input: small integers, so every sum is exact in every type.
fn input(rank: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i as u32 * 7 + rank) % 13) as f32).collect()
}

/// `nranks` ranks on `servers`: warm-up, then `ROUNDS` counted all-reduces
/// of each size; every rank thread's and lcore thread's count must not move.
fn no_allocations(servers: &[&Server], nranks: u32, job_id: u64) {
    const ROUNDS: usize = 30;
    // 1 KiB (relay, split), a piece per lcore and more, an odd size.
    const SIZES: [usize; 3] = [256, 64 << 10, 300_001];
    let addrs: Vec<String> = servers.iter().map(|s| s.local_addr().to_string()).collect();
    let warm = Arc::new(Barrier::new(nranks as usize + 1));
    let done = Arc::new(Barrier::new(nranks as usize + 1));
    let ranks: Vec<_> = (0..nranks)
        .map(|rank| {
            let (addrs, warm, done) = (addrs.clone(), warm.clone(), done.clone());
            std::thread::spawn(move || {
                let mut cfg = ClientConfig::new(addrs, job_id, rank, nranks);
                cfg.provider = Some("tcp".into());
                cfg.rails = 1;
                let mut c = Client::connect(cfg).unwrap();
                let ins: Vec<Vec<f32>> = SIZES.iter().map(|&n| input(rank, n)).collect();
                let mut outs: Vec<Vec<f32>> = SIZES.iter().map(|&n| vec![0f32; n]).collect();
                let round = |c: &mut Client, outs: &mut [Vec<f32>]| {
                    for (i, o) in ins.iter().zip(outs.iter_mut()) {
                        c.allreduce(bytemuck::cast_slice(i), bytemuck::cast_slice_mut(o), DataType::Float32, ReduceOp::Sum).unwrap();
                    }
                };
                for _ in 0..3 {
                    round(&mut c, &mut outs);
                }
                let tid = gettid();
                warm.wait();
                let before = allocations_of(tid);
                for _ in 0..ROUNDS {
                    round(&mut c, &mut outs);
                }
                let after = allocations_of(tid);
                done.wait();
                for (n, o) in SIZES.iter().zip(&outs) {
                    for (k, v) in o.iter().enumerate() {
                        let want: f32 = (0..nranks).map(|r| ((k as u32 * 7 + r) % 13) as f32).sum();
                        assert_eq!(*v, want, "rank {rank}, {n} elements, element {k}");
                    }
                }
                (rank, after - before)
            })
        })
        .collect();
    warm.wait();
    let lcores_before = lcore_threads();
    done.wait();
    let lcores_after = lcore_threads();
    for r in ranks {
        let (rank, n) = r.join().unwrap();
        assert_eq!(n, 0, "rank {rank} allocated {n} times in {ROUNDS} rounds of all-reduces");
    }
    assert_eq!(lcores_before.len(), 2 * servers.len(), "every server's lcore threads found: {lcores_before:?}");
    assert_eq!(lcores_before, lcores_after, "lcore threads (tid, allocations) before and after the counted all-reduces");
}

#[test]
fn the_per_chunk_path_allocates_nothing_on_servers_or_ranks() {
    let a = server();
    no_allocations(&[&a], 2, 0xa110c);
    no_allocations(&[&a], 4, 0xa110d);
    let b = server();
    no_allocations(&[&a, &b], 2, 0xa110e);
    a.stop();
    b.stop();
}

#[test]
fn the_rings_per_chunk_path_allocates_nothing() {
    const N: u32 = 3;
    const ROUNDS: usize = 30;
    let listener = Bootstrap::listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().to_string();
    let boot = |rank: u32| match rank {
        0 => unreachable!("rank 0 accepts"),
        r => Bootstrap::connect(&addr, r, N, Duration::from_secs(30)).unwrap(),
    };
    let counted = std::thread::scope(|s| {
        let run = |mut b: Bootstrap| {
            let cfg =
                RingConfig { provider: "tcp".into(), node: Some("127.0.0.1".into()), chunk_bytes: 64 << 10, window: 3, poll_busy: false };
            let rank = b.rank();
            let mut ring = Ring::new(&cfg, &mut b).unwrap();
            // Several chunks per segment, and a ragged tail.
            let input = input(rank, 300_001);
            let mut out = vec![0f32; input.len()];
            let mut round = |ring: &mut Ring| {
                ring.allreduce(bytemuck::cast_slice(&input), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum).unwrap();
            };
            for _ in 0..3 {
                round(&mut ring);
            }
            b.barrier().unwrap();
            let tid = gettid();
            let before = allocations_of(tid);
            for _ in 0..ROUNDS {
                round(&mut ring);
            }
            let n = allocations_of(tid) - before;
            b.barrier().unwrap(); // before the ring is dropped: see Ring's docs
            for (k, v) in out.iter().enumerate() {
                let want: f32 = (0..N).map(|r| ((k as u32 * 7 + r) % 13) as f32).sum();
                assert_eq!(*v, want, "rank {rank}, element {k}");
            }
            (rank, n)
        };
        let first = s.spawn(move || run(listener.accept(N, Duration::from_secs(30)).unwrap()));
        let mut all: Vec<_> = (1..N).map(|r| s.spawn(move || run(boot(r)))).collect();
        all.insert(0, first);
        all.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    for (rank, n) in counted {
        assert_eq!(n, 0, "ring rank {rank} allocated {n} times in {ROUNDS} all-reduces");
    }
}
