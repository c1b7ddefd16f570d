//! Latency lcores (`--latency-lcores N --latency-max SIZE`): the server's
//! first N lcores take only operations of at most SIZE bytes, the others
//! only larger ones, so that a small all-reduce never queues behind a bulk
//! job's pieces. Real server processes over shm and tcp; every element of
//! every all-reduce is checked, and the servers' per-lcore byte counters
//! say where each operation went. A latency lcore holds regions only for
//! pieces of at most SIZE bytes (the slab gauges say so).
use tally_e2e::{client, scrape, sum, ServerProcess};
use tally_engine::client::{Client, ClientConfig};
use tally_engine::reduce::{DataType, ReduceOp};

/// Sizes (f32 elements) of one round: two at or below a 16 KiB threshold,
/// two above it.
const SMALL: [usize; 2] = [1024, 4096];
const LARGE: [usize; 2] = [4097, 256 << 10];
const ROUNDS: usize = 5;

/// A round's sizes: small and large interleaved, so that the two classes'
/// rotations interleave too.
const MIXED: [usize; 4] = [SMALL[0], LARGE[0], SMALL[1], LARGE[1]];

/// Runs one rank per config, each doing ROUNDS rounds of sum all-reduces of
/// `sizes`, every element checked.
fn run(cfgs: Vec<ClientConfig>, sizes: &'static [usize]) {
    let n = cfgs.len();
    let hs: Vec<_> = cfgs
        .into_iter()
        .enumerate()
        .map(|(rank, cfg)| {
            std::thread::spawn(move || -> Result<(), String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                for round in 0..ROUNDS {
                    for (k, &count) in sizes.iter().enumerate() {
                        let send: Vec<f32> = (0..count).map(|i| ((rank + i % 89 + round + k) % 1000) as f32).collect();
                        let mut out = vec![0f32; count];
                        c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                            .map_err(|e| format!("rank {rank} round {round} size {count}: {e}"))?;
                        for (i, v) in out.iter().enumerate() {
                            let want: f32 = (0..n).map(|r| ((r + i % 89 + round + k) % 1000) as f32).sum();
                            if *v != want {
                                return Err(format!("rank {rank} round {round} size {count}: element {i} = {v}, want {want}"));
                            }
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in hs {
        h.join().expect("rank thread").unwrap();
    }
}

fn bytes_in(s: &ServerProcess, lcore: usize) -> f64 {
    sum(&scrape(&s.metrics_addr()), "tally_lcore_bytes_in_total", &format!("lcore=\"{lcore}\""))
}

fn class_bytes(sizes: &[usize], ranks: usize) -> f64 {
    (sizes.iter().sum::<usize>() * 4 * ranks * ROUNDS) as f64
}

/// A server on lcores 0-1 whose lcore 0 takes operations of at most 16 KiB,
/// with metrics.
fn latency_server(provider: &str, extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--lcores", "0-1", "--latency-lcores", "1", "--latency-max", "16K", "--provider", provider];
    args.extend_from_slice(&["--poll", "adaptive", "--metrics", "127.0.0.1:0"]);
    args.extend_from_slice(extra);
    ServerProcess::start(&args)
}

fn small_operations_use_only_the_latency_lcore(provider: &str) {
    let s = latency_server(provider, &[]);
    assert!(s.wait_log("latency lcores: the first 1 take operations of at most 16 KiB", std::time::Duration::from_secs(5)));
    let ranks = 3;
    run((0..ranks).map(|r| client(provider, &s.addr, 71, r as u32, ranks as u32)).collect(), &MIXED);
    let (l0, l1) = (bytes_in(&s, 0), bytes_in(&s, 1));
    eprintln!("{provider}: bytes in per lcore: {l0} {l1}");
    assert_eq!(l0, class_bytes(&SMALL, ranks), "the latency lcore took exactly the small operations");
    assert_eq!(l1, class_bytes(&LARGE, ranks), "the other lcore took exactly the large ones");

    // A job on one lcore only (shards 1 <= latency lcores) has no bulk
    // lcore: its one lcore takes everything.
    let (b0, b1) = (l0, l1);
    run(
        (0..2)
            .map(|r| {
                let mut c = client(provider, &s.addr, 72, r, 2);
                c.shards = 1;
                c
            })
            .collect(),
        &MIXED,
    );
    assert_eq!(bytes_in(&s, 0) - b0, class_bytes(&SMALL, 2) + class_bytes(&LARGE, 2));
    assert_eq!(bytes_in(&s, 1), b1);
    s.stop();
}

#[test]
fn shm_small_operations_use_only_the_latency_lcore() {
    small_operations_use_only_the_latency_lcore("shm");
}

#[test]
fn tcp_small_operations_use_only_the_latency_lcore() {
    small_operations_use_only_the_latency_lcore("tcp");
}

/// Two servers, one with a latency lcore and one without: small operations
/// use the first's latency lcore and every lcore of the second; large ones
/// the first's other lcore and, again, every lcore of the second.
#[test]
fn servers_with_and_without_latency_lcores_serve_one_job() {
    let metrics = ["--metrics", "127.0.0.1:0", "--provider", "tcp", "--poll", "adaptive"];
    let a = ServerProcess::start(&[&["--lcores", "0-1", "--latency-lcores", "1", "--latency-max", "16K"][..], &metrics[..]].concat());
    let b = ServerProcess::start(&[&["--lcores", "0-1"][..], &metrics[..]].concat());
    let ranks = 2;
    let job = |id: u64| -> Vec<ClientConfig> {
        (0..ranks)
            .map(|r| {
                let mut c = client("tcp", &a.addr, id, r as u32, ranks as u32);
                c.servers.push(b.addr.clone());
                c
            })
            .collect()
    };
    let b_all = || bytes_in(&b, 0) + bytes_in(&b, 1);
    run(job(73), &SMALL);
    let (a0, a1, b1) = (bytes_in(&a, 0), bytes_in(&a, 1), b_all());
    eprintln!("small only: server a {a0} {a1}, server b {b1}");
    assert!(a0 > 0.0 && a1 == 0.0 && bytes_in(&b, 0) > 0.0 && bytes_in(&b, 1) > 0.0, "{a0} {a1}");
    assert_eq!(a0 + b1, class_bytes(&SMALL, ranks));
    run(job(74), &LARGE);
    let (a0b, a1b, b2) = (bytes_in(&a, 0), bytes_in(&a, 1), b_all());
    eprintln!("then large only: server a {a0b} {a1b}, server b {b2}");
    assert!(a0b == a0 && a1b > 0.0, "{a0b} {a1b}");
    assert_eq!(a1b + b2 - b1, class_bytes(&LARGE, ranks));
    a.stop();
    b.stop();
}

/// A latency lcore gets only operations of at most `latency_max` bytes, so
/// the job's region there holds pieces of that size, not the job's piece:
/// here 16 KiB against 256 KiB, a sixteenth of the slab. The gauges go back
/// to 0 when the job ends.
#[test]
fn a_latency_lcore_holds_regions_for_small_pieces_only() {
    let s = latency_server("tcp", &["--slab-size", "64M"]);
    let used = |lcore: usize| sum(&scrape(&s.metrics_addr()), "tally_lcore_slab_used_bytes", &format!("lcore=\"{lcore}\""));
    assert_eq!(sum(&scrape(&s.metrics_addr()), "tally_lcore_slab_bytes", "lcore=\"1\""), (64 << 20) as f64);
    let (ranks, window) = (2u32, 4usize);
    let (joined_tx, joined_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Arc::new(std::sync::Mutex::new(go_rx));
    let hs: Vec<_> = (0..ranks)
        .map(|rank| {
            let mut cfg = client("tcp", &s.addr, 73, rank, ranks);
            cfg.chunk_bytes = 256 << 10;
            cfg.window = window as u32;
            let (joined_tx, go_rx) = (joined_tx.clone(), go_rx.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                c.join(DataType::Float32, ReduceOp::Sum).map_err(|e| e.to_string())?;
                joined_tx.send(()).unwrap();
                go_rx.lock().unwrap().recv().unwrap();
                // Both classes still work, every element checked.
                for count in [4096usize, 300_000] {
                    let send: Vec<f32> = (0..count).map(|i| (i % 13 + rank as usize) as f32).collect();
                    let mut out = vec![0f32; count];
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                        .map_err(|e| format!("rank {rank}, {count} elements: {e}"))?;
                    if let Some(i) = (0..count).find(|&i| out[i] != (2 * (i % 13) + 1) as f32) {
                        return Err(format!("rank {rank}, {count} elements: element {i} = {}", out[i]));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for _ in 0..ranks {
        joined_rx.recv_timeout(std::time::Duration::from_secs(30)).expect("a rank joined");
    }
    // The control plane publishes the gauges on its next turn after the
    // job started; the ranks may hear of the start first.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while used(1) == 0.0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (small, large) = (used(0), used(1));
    eprintln!("slab used while the job runs: latency lcore {small}, bulk lcore {large}");
    let pieces = (window * ranks as usize) as f64;
    assert!(large >= pieces * (256 << 10) as f64, "bulk lcore region {large}");
    assert!(small >= pieces * (16 << 10) as f64, "latency lcore region {small}");
    assert!(small * 8.0 <= large, "the latency lcore's region ({small}) is not sized for 16 KiB pieces (bulk: {large})");
    for _ in 0..ranks {
        go_tx.send(()).unwrap();
    }
    for h in hs {
        h.join().expect("rank thread").unwrap();
    }
    assert!(s.wait_log("job 0x49 ended", std::time::Duration::from_secs(10)), "the job did not end");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while used(0) + used(1) > 0.0 {
        assert!(std::time::Instant::now() < deadline, "regions still held after the job ended: {} {}", used(0), used(1));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    s.stop();
}
