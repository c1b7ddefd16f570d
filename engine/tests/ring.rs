//! The ring all-reduce and its bootstrap, with every rank a thread of this
//! process and real libfabric endpoints (shm, and tcp;ofi_rxm on loopback).
//!
//! Every element of every result is checked against a reference computed
//! here in rank order with f64 accumulation. The ring combines in another
//! order than rank order, so inputs are small integers (|x| <= 8; products of
//! +-1 and +-2): every partial result is then exact in every type, bf16
//! included, and the comparison can be bit-exact. A separate test runs
//! random f32 data against a relative tolerance.
//!
//! Tests take a process-wide lock: several 4-rank tests at once on a 2-core
//! machine would only slow each other down (and spoil the timing test).
mod ring_model;

use ring_model::{check, fill};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::ring::bootstrap::{Bootstrap, BootstrapError};
use tally_engine::ring::{Ring, RingConfig, RingError};

const BOOT_TIMEOUT: Duration = Duration::from_secs(30);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on n threads, one per rank, each with its own bootstrap
/// connection; rank 0 listens on a port the OS picks. Returns the results in
/// rank order; a panic on any rank fails the test with that panic.
fn run_ranks<T: Send>(n: u32, f: impl Fn(Bootstrap) -> T + Sync) -> Vec<T> {
    let listener = Bootstrap::listen("127.0.0.1:0").expect("bind the bootstrap listener");
    let addr = listener.local_addr().to_string();
    thread::scope(|s| {
        let f = &f;
        let mut handles = vec![s.spawn(move || f(listener.accept(n, BOOT_TIMEOUT).expect("rank 0 bootstrap")))];
        for r in 1..n {
            let addr = addr.clone();
            handles.push(s.spawn(move || f(Bootstrap::connect(&addr, r, n, BOOT_TIMEOUT).expect("bootstrap"))));
        }
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

fn config(provider: &str, chunk_bytes: usize, window: usize) -> RingConfig {
    RingConfig {
        provider: provider.to_string(),
        node: provider.starts_with("tcp").then(|| "127.0.0.1".to_string()),
        chunk_bytes,
        window,
        poll_busy: false,
    }
}

// ---------------------------------------------------------------------------
// Every type, operation and awkward size, exact

/// Element counts: empty, fewer than the ranks, odd ~1 MB (several chunks
/// per segment), and for sum also odd 3 MiB (many chunks: several blocks
/// and a ragged tail; one op is enough, the layout does not depend on it).
fn counts(d: DataType, op: ReduceOp, n: usize) -> Vec<usize> {
    let es = d.size();
    let mut c = vec![0, 1, n - 1, (1_000_003 / es) | 1];
    if op == ReduceOp::Sum {
        c.push(((3 << 20) / es) | 1);
    }
    c
}

fn matrix(provider: &str, n: u32) {
    let _g = serial();
    let started = Instant::now();
    // Small chunks and an odd window: 3 MiB over 4 ranks is 12 chunks per
    // segment, 4 blocks of 3; 1 MB over 3 ranks ends in a part block.
    let cfg = config(provider, 64 << 10, 3);
    let elements = run_ranks(n, |mut boot| {
        let rank = boot.rank() as usize;
        let mut ring = Ring::new(&cfg, &mut boot).unwrap_or_else(|e| panic!("{provider} rank {rank}: {e}"));
        let (mut cases, mut checked) = (0usize, 0usize);
        for (di, d) in DataType::ALL.into_iter().enumerate() {
            for (oi, op) in ReduceOp::ALL.into_iter().enumerate() {
                for count in counts(d, op, n as usize) {
                    let what = format!("{provider} n={n} rank {rank} {d} {op} count {count}");
                    let input = fill(d, op, rank, count);
                    // Half the cases in place, half out of place.
                    let result = if (di + oi) % 2 == 0 {
                        let mut out = vec![0xA5u8; input.len()];
                        ring.allreduce(&input, &mut out, d, op).unwrap_or_else(|e| panic!("{what}: {e}"));
                        out
                    } else {
                        let mut buf = input;
                        ring.allreduce_in_place(&mut buf, d, op).unwrap_or_else(|e| panic!("{what}: {e}"));
                        buf
                    };
                    check(&what, d, op, n as usize, &result);
                    checked += count;
                    cases += 1;
                }
            }
        }
        boot.barrier().unwrap(); // before the ring is dropped: see Ring's docs
        (cases, checked)
    });
    eprintln!(
        "{provider} n={n}: {} cases, {} elements checked on each of {n} ranks, {:.1} s",
        elements[0].0,
        elements[0].1,
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn shm_n2_every_type_op_and_size_exact() {
    matrix("shm", 2);
}

#[test]
fn shm_n3_every_type_op_and_size_exact() {
    matrix("shm", 3);
}

#[test]
fn shm_n4_every_type_op_and_size_exact() {
    matrix("shm", 4);
}

#[test]
fn tcp_n2_every_type_op_and_size_exact() {
    matrix("tcp", 2);
}

#[test]
fn tcp_n3_every_type_op_and_size_exact() {
    matrix("tcp", 3);
}

#[test]
fn tcp_n4_every_type_op_and_size_exact() {
    matrix("tcp", 4);
}

// ---------------------------------------------------------------------------
// Random data, bounce mode, one rank

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

fn random_f32(rank: usize, i: usize) -> f32 {
    let x = xorshift((rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
    // Uniform in [-1, 1), with a spread of magnitudes.
    let u = (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
    u * [1.0, 1e-3, 1e3][i % 3]
}

fn random_f32_within_tolerance(provider: &str, n: u32) {
    let _g = serial();
    let count = 777_777;
    run_ranks(n, |mut boot| {
        let rank = boot.rank() as usize;
        let mut ring = Ring::new(&config(provider, 128 << 10, 4), &mut boot).unwrap();
        let input: Vec<u8> = (0..count).flat_map(|i| random_f32(rank, i).to_le_bytes()).collect();
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let mut out = vec![0u8; input.len()];
            ring.allreduce(&input, &mut out, DataType::Float32, op).unwrap();
            let mut worst = 0.0f64;
            for (i, g) in out.chunks_exact(4).enumerate() {
                let got = f32::from_le_bytes(g.try_into().unwrap()) as f64;
                let xs: Vec<f64> = (0..n as usize).map(|r| random_f32(r, i) as f64).collect();
                let mut want: f64 = xs.iter().sum();
                let mut scale: f64 = xs.iter().map(|x| x.abs()).sum();
                if op == ReduceOp::Avg {
                    want /= n as f64;
                    scale /= n as f64;
                }
                // n-1 roundings of partial sums, one of the division: each at
                // most half an ulp of something no larger than `scale`.
                let err = (got - want).abs() / (scale * f32::EPSILON as f64 * n as f64);
                assert!(err <= 1.0, "{provider} n={n} {op} [{i}]: got {got}, want {want} (inputs {xs:?})");
                worst = worst.max(err);
            }
            if rank == 0 {
                eprintln!("{provider} n={n} random f32 {op}: {count} elements, worst error {worst:.3} of the bound");
            }
        }
        boot.barrier().unwrap();
    });
}

#[test]
fn shm_random_f32_within_tolerance() {
    random_f32_within_tolerance("shm", 4);
}

#[test]
fn tcp_random_f32_within_tolerance() {
    random_f32_within_tolerance("tcp", 3);
}

/// Bounce mode (all traffic through the registered staging slots, as on
/// providers that need registered buffers), on some ranks only: the wire
/// protocol is the same either way.
fn bounce_mode(provider: &str) {
    let _g = serial();
    let n = 3;
    run_ranks(n, |mut boot| {
        let rank = boot.rank() as usize;
        let mut ring = Ring::new(&config(provider, 32 << 10, 2), &mut boot).unwrap();
        ring.set_bounce(rank != 1);
        assert_eq!(ring.bounce(), rank != 1);
        for (d, op) in [
            (DataType::Float32, ReduceOp::Sum),
            (DataType::Bfloat16, ReduceOp::Avg),
            (DataType::Int8, ReduceOp::Max),
            (DataType::Float64, ReduceOp::Prod),
            (DataType::Uint32, ReduceOp::Min),
        ] {
            for count in [1, 2, 100_001, 300_001] {
                let what = format!("{provider} bounce rank {rank} {d} {op} count {count}");
                let mut buf = fill(d, op, rank, count);
                if count % 2 == 0 {
                    ring.allreduce_in_place(&mut buf, d, op).unwrap_or_else(|e| panic!("{what}: {e}"));
                } else {
                    let mut out = vec![0u8; buf.len()];
                    ring.allreduce(&buf, &mut out, d, op).unwrap_or_else(|e| panic!("{what}: {e}"));
                    buf = out;
                }
                check(&what, d, op, n as usize, &buf);
            }
        }
        boot.barrier().unwrap();
    });
}

#[test]
fn shm_bounce_mode_exact() {
    bounce_mode("shm");
}

#[test]
fn tcp_bounce_mode_exact() {
    bounce_mode("tcp");
}

#[test]
fn one_rank_is_a_copy() {
    let _g = serial();
    run_ranks(1, |mut boot| {
        let mut ring = Ring::new(&config("shm", 4096, 2), &mut boot).unwrap();
        for op in ReduceOp::ALL {
            let input = fill(DataType::Float16, op, 0, 1001);
            let mut out = vec![0u8; input.len()];
            ring.allreduce(&input, &mut out, DataType::Float16, op).unwrap();
            assert_eq!(out, input);
            let mut buf = input.clone();
            ring.allreduce_in_place(&mut buf, DataType::Float16, op).unwrap();
            assert_eq!(buf, input);
        }
    });
}

#[test]
fn bad_buffers_are_refused() {
    let _g = serial();
    run_ranks(1, |mut boot| {
        let mut ring = Ring::new(&config("shm", 4096, 2), &mut boot).unwrap();
        let mut out = [0u8; 8];
        let e = ring.allreduce(&[0u8; 12], &mut out, DataType::Float32, ReduceOp::Sum).unwrap_err();
        assert!(matches!(e, RingError::Buffers(_)), "{e}");
        let e = ring.allreduce_in_place(&mut [0u8; 6], DataType::Float32, ReduceOp::Sum).unwrap_err();
        assert!(matches!(e, RingError::Buffers(_)) && e.to_string().contains("whole number"), "{e}");
        // Refusing bad arguments does not break the ring.
        ring.allreduce_in_place(&mut [0u8; 8], DataType::Float32, ReduceOp::Sum).unwrap();
    });
}

// ---------------------------------------------------------------------------
// Failures: errors within a bounded time, never a hang

/// Set in a child process of this test binary: "provider addr rank nranks".
const CHILD_ENV: &str = "TALLY_RING_TEST_CHILD";

/// Not a test of its own: when this binary is started as a child rank (by
/// `peer_process_that_dies`), joins the ring and dies without closing
/// anything, as a crashed process would. Otherwise it does nothing.
#[test]
fn helper_child_rank_that_dies() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let v: Vec<&str> = spec.split(' ').collect();
    let (provider, addr, rank, n) = (v[0], v[1], v[2].parse().unwrap(), v[3].parse().unwrap());
    let mut boot = Bootstrap::connect(addr, rank, n, BOOT_TIMEOUT).unwrap();
    let ring = Ring::new(&config(provider, 64 << 10, 4), &mut boot).unwrap();
    // Let the others start their all-reduce, then vanish mid-stream.
    thread::sleep(Duration::from_millis(200));
    std::mem::forget((ring, boot));
    std::process::exit(0);
}

/// Ranks 0 and 1 are threads here, rank 2 a child process that dies after
/// joining: both survivors must fail within the progress timeout, and stay
/// failed. (A separate process, because shm maps the ranks of one process
/// onto each other's memory: a peer thread closing its endpoint is not a
/// peer dying, and crashes libfabric 1.17 on the next send to it.)
fn peer_process_that_dies(provider: &str) {
    let _g = serial();
    let n = 3;
    let listener = Bootstrap::listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().to_string();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "helper_child_rank_that_dies", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{provider} {addr} 2 {n}"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the child rank");
    let listener = std::sync::Mutex::new(Some(listener));
    // The survivors' bootstrap includes the dead rank: they meet here instead
    // before dropping their rings.
    let done = std::sync::Barrier::new(2);
    let results = thread::scope(|s| {
        let hs: Vec<_> = (0..2u32)
            .map(|rank| {
                let (addr, listener, done) = (&addr, &listener, &done);
                s.spawn(move || {
                    let mut boot = match rank {
                        0 => listener.lock().unwrap().take().unwrap().accept(n, BOOT_TIMEOUT).unwrap(),
                        r => Bootstrap::connect(addr, r, n, BOOT_TIMEOUT).unwrap(),
                    };
                    let mut ring = Ring::new(&config(provider, 64 << 10, 4), &mut boot).unwrap();
                    ring.set_progress_timeout(Duration::from_secs(2));
                    let input = fill(DataType::Float32, ReduceOp::Sum, rank as usize, 4 << 20);
                    let mut out = vec![0u8; input.len()];
                    let started = Instant::now();
                    // The first calls may even succeed before the child is gone.
                    let e = loop {
                        match ring.allreduce(&input, &mut out, DataType::Float32, ReduceOp::Sum) {
                            Ok(()) => assert!(started.elapsed() < Duration::from_secs(10), "rank {rank}: no failure"),
                            Err(e) => break e,
                        }
                    };
                    let took = started.elapsed();
                    assert!(took < Duration::from_secs(15), "rank {rank}: took {took:?} to fail");
                    let again = ring.allreduce(&input, &mut out, DataType::Float32, ReduceOp::Sum).unwrap_err();
                    assert!(matches!(again, RingError::Broken(_)), "{again}");
                    done.wait();
                    format!("rank {rank} failed after {:.1} s: {e}", took.as_secs_f64())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect::<Vec<_>>()
    });
    let status = child.wait().unwrap();
    assert!(status.success(), "child rank: {status}");
    for r in results {
        eprintln!("{provider}: {r}");
    }
}

#[test]
fn shm_peer_process_that_dies_is_an_error() {
    peer_process_that_dies("shm");
}

#[test]
fn tcp_peer_process_that_dies_is_an_error() {
    peer_process_that_dies("tcp");
}

/// A rank that stays alive but never calls: the others fail at the progress
/// timeout with a message that says what they were waiting for.
#[test]
fn peer_that_stops_calling_is_an_error() {
    let _g = serial();
    let done = std::sync::Barrier::new(3);
    run_ranks(3, |mut boot| {
        let rank = boot.rank();
        let mut ring = Ring::new(&config("shm", 64 << 10, 4), &mut boot).unwrap();
        if rank != 2 {
            ring.set_progress_timeout(Duration::from_secs(1));
            let mut buf = fill(DataType::Float64, ReduceOp::Max, rank as usize, 100_000);
            let e = ring.allreduce_in_place(&mut buf, DataType::Float64, ReduceOp::Max).unwrap_err();
            eprintln!("rank {rank}: {e}");
            assert!(matches!(e, RingError::Stalled(_)) && e.to_string().contains("no progress"), "{e}");
        }
        // Rank 2 keeps its endpoint open until the others have given up.
        done.wait();
    });
}

#[test]
fn different_lengths_on_different_ranks_are_an_error() {
    let _g = serial();
    for provider in ["shm", "tcp"] {
        run_ranks(2, |mut boot| {
            let rank = boot.rank() as usize;
            let mut ring = Ring::new(&config(provider, 64 << 10, 4), &mut boot).unwrap();
            ring.set_progress_timeout(Duration::from_secs(2));
            let mut buf = fill(DataType::Float32, ReduceOp::Sum, rank, 1000 * (rank + 1));
            let e = ring.allreduce_in_place(&mut buf, DataType::Float32, ReduceOp::Sum).unwrap_err();
            eprintln!("{provider} rank {rank}: {e}");
            boot.barrier().unwrap();
        });
    }
}

#[test]
fn different_configs_are_refused_at_setup() {
    let _g = serial();
    run_ranks(3, |mut boot| {
        let rank = boot.rank() as usize;
        let chunk = if rank == 1 { 128 << 10 } else { 64 << 10 };
        let e = Ring::new(&config("shm", chunk, 4), &mut boot).unwrap_err();
        assert!(matches!(e, RingError::Config(_)) && e.to_string().contains("chunk_bytes"), "{e}");
    });
    run_ranks(2, |mut boot| {
        // A rank that cannot set up says so to the others.
        let provider = if boot.rank() == 0 { "no-such-provider" } else { "shm" };
        let e = Ring::new(&config(provider, 64 << 10, 4), &mut boot).unwrap_err();
        assert!(e.to_string().contains("fi_getinfo"), "{e}");
    });
}

// ---------------------------------------------------------------------------
// Bootstrap

#[test]
fn bootstrap_collectives() {
    let _g = serial();
    let n = 4;
    run_ranks(n, |mut boot| {
        let r = boot.rank();
        assert_eq!(boot.nranks(), n);
        for round in 0..3u32 {
            let mine = vec![r as u8 ^ round as u8; (r * 3 + round) as usize];
            let all = boot.allgather(&mine).unwrap();
            assert_eq!(all.len(), n as usize);
            for (q, part) in all.iter().enumerate() {
                assert_eq!(part, &vec![q as u8 ^ round as u8; q * 3 + round as usize]);
            }
            boot.barrier().unwrap();
        }
        let b = boot.broadcast(2, if r == 2 { b"from two" } else { b"ignored" }).unwrap();
        assert_eq!(b, b"from two");
        assert_eq!(boot.reduce_sum_u64(r as u64 + 1).unwrap(), 10);
        assert_eq!(boot.reduce_sum_u64(u64::MAX).unwrap(), u64::MAX.wrapping_mul(4));
    });
}

#[test]
fn bootstrap_new_with_a_fixed_port() {
    let _g = serial();
    // Find a free port, then let `new` use it the way a job would.
    let port = Bootstrap::listen("127.0.0.1:0").unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let sums: Vec<u64> = thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let addr = addr.clone();
                s.spawn(move || {
                    let mut b = Bootstrap::new(&addr, r, 3, Duration::from_secs(10)).unwrap();
                    b.reduce_sum_u64(r as u64).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![3, 3, 3]);
}

#[test]
fn bootstrap_refuses_bad_arguments() {
    let t = Duration::from_millis(200);
    let e = Bootstrap::new("127.0.0.1:0", 0, 2, t).unwrap_err();
    assert!(matches!(e, BootstrapError::Config(_)) && e.to_string().contains("fixed port"), "{e}");
    let e = Bootstrap::new("127.0.0.1:1", 2, 2, t).unwrap_err();
    assert!(matches!(e, BootstrapError::Config(_)) && e.to_string().contains("out of range"), "{e}");
    let e = Bootstrap::new("not an address", 1, 2, t).unwrap_err();
    assert!(matches!(e, BootstrapError::Config(_)), "{e}");
}

#[test]
fn bootstrap_connect_times_out_without_rank_0() {
    let port = Bootstrap::listen("127.0.0.1:0").unwrap().port(); // closed again at once
    let started = Instant::now();
    let e = Bootstrap::connect(&format!("127.0.0.1:{port}"), 1, 2, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, BootstrapError::Timeout { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(3));
    eprintln!("{e}");
}

#[test]
fn bootstrap_mismatched_nranks_fails_on_both_sides() {
    let _g = serial();
    let listener = Bootstrap::listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().to_string();
    let (root, leaf) = thread::scope(|s| {
        let root = s.spawn(move || listener.accept(3, Duration::from_secs(5)).unwrap_err());
        let leaf = s.spawn(move || Bootstrap::connect(&addr, 1, 2, Duration::from_secs(5)).unwrap_err());
        (root.join().unwrap(), leaf.join().unwrap())
    });
    eprintln!("rank 0: {root}\nrank 1: {leaf}");
    assert!(matches!(root, BootstrapError::Protocol { .. }) && root.to_string().contains("2 ranks"), "{root}");
    assert!(matches!(leaf, BootstrapError::Rejected(_)) && leaf.to_string().contains("2 ranks"), "{leaf}");
}

#[test]
fn bootstrap_stray_connection_is_an_error() {
    use std::io::Write;
    let _g = serial();
    let listener = Bootstrap::listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let e = thread::scope(|s| {
        let root = s.spawn(move || listener.accept(2, Duration::from_secs(5)).unwrap_err());
        let mut stray = std::net::TcpStream::connect(addr).unwrap();
        stray.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n").unwrap();
        root.join().unwrap()
    });
    eprintln!("{e}");
    assert!(matches!(e, BootstrapError::Protocol { peer: None, .. }) && e.to_string().contains("not a tally"), "{e}");
}

#[test]
fn bootstrap_rank_that_leaves_is_an_error_on_the_others() {
    let _g = serial();
    let results = run_ranks(3, |mut boot| {
        boot.barrier().unwrap();
        if boot.rank() == 2 {
            return None;
        }
        let started = Instant::now();
        let e = boot.barrier().unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{e}");
        Some(e.to_string())
    });
    for e in results.into_iter().flatten() {
        eprintln!("{e}");
    }
}

// ---------------------------------------------------------------------------
// A figure: 4 ranks x 64 MiB f32 over shm

#[test]
fn shm_4_ranks_64mib_f32_timing() {
    let _g = serial();
    let (n, bytes, reps, warmup) = (4u32, 64usize << 20, 20, 2);
    // TALLY_RING_CHUNK / TALLY_RING_WINDOW / TALLY_RING_BUSY override the defaults, for tuning.
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    let mut cfg = RingConfig::new(&std::env::var("TALLY_RING_PROVIDER").unwrap_or("shm".into()));
    cfg.node = cfg.provider.starts_with("tcp").then(|| "127.0.0.1".into());
    cfg.chunk_bytes = env("TALLY_RING_CHUNK").unwrap_or(cfg.chunk_bytes);
    cfg.window = env("TALLY_RING_WINDOW").unwrap_or(cfg.window);
    cfg.poll_busy = env("TALLY_RING_BUSY").is_some_and(|b| b != 0);
    let times = run_ranks(n, |mut boot| {
        let rank = boot.rank() as usize;
        let mut ring = Ring::new(&cfg, &mut boot).unwrap();
        let (d, op) = (DataType::Float32, ReduceOp::Sum);
        let input = fill(d, op, rank, bytes / 4);
        let mut out = vec![0u8; bytes];
        let mut times = Vec::with_capacity(reps);
        for rep in 0..warmup + reps {
            boot.barrier().unwrap();
            let t = Instant::now();
            ring.allreduce(&input, &mut out, d, op).unwrap();
            let mine = t.elapsed().as_secs_f64();
            // An all-reduce takes as long as its slowest rank.
            let all = boot.allgather(&mine.to_le_bytes()).unwrap();
            let slowest = all.iter().map(|b| f64::from_le_bytes(b[..8].try_into().unwrap())).fold(0.0, f64::max);
            if rep >= warmup {
                times.push(slowest);
            }
        }
        check(&format!("timing rank {rank}"), d, op, n as usize, &out);
        boot.barrier().unwrap();
        times
    });
    // The same run's memcpy of the same size, one thread: what one core moves.
    let (src, mut dst) = (vec![1u8; bytes], vec![0u8; bytes]);
    let mut copies: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            t.elapsed().as_secs_f64()
        })
        .collect();
    copies.sort_by(f64::total_cmp);
    let memcpy_gbs = bytes as f64 / copies[2] / 1e9;
    let mut t = times[0].clone();
    t.sort_by(f64::total_cmp);
    let median = t[t.len() / 2];
    let algbw = bytes as f64 / median / 1e9;
    let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
    eprintln!(
        "ring all-reduce, shm, {n} ranks x {} MiB f32 sum, chunk {} KiB, window {}, {} polling: \
         median of {reps} (after {warmup} warm-up) {:.1} ms (min {:.1}, max {:.1}), \
         algbw {algbw:.2} GB/s, busbw {busbw:.2} GB/s; verified. memcpy of {} MiB on one core: {memcpy_gbs:.2} GB/s",
        bytes >> 20,
        cfg.chunk_bytes >> 10,
        cfg.window,
        if cfg.poll_busy { "busy" } else { "adaptive" },
        median * 1e3,
        t[0] * 1e3,
        t[t.len() - 1] * 1e3,
        bytes >> 20
    );
}
