//! `tally server --metrics`: a real server process is scraped over HTTP
//! while and after a job runs, and the counters must have moved by exactly
//! what the clients sent; an ended job's series are gone while the
//! per-lcore totals keep what it moved; `tally stats --once --json` reads
//! the same endpoint.
use std::net::TcpListener;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tally_e2e::{get, scrape, sum, ServerProcess};
use tally_engine::client::{Client, ClientConfig};
use tally_engine::reduce::{DataType, ReduceOp};

const NRANKS: u32 = 2;
const COUNT: usize = 100_000;
const ROUNDS: usize = 3;
const JOB: u64 = 0x77;

/// A port that was free a moment ago (the server binds it right after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A rank of the job: its all-reduces, then two waits at `hold` (its
/// work done; the test's scrapes done) before its client closes, which ends
/// the job.
fn rank(addr: String, rank: u32, hold: Arc<Barrier>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut cfg = ClientConfig::new(vec![addr], JOB, rank, NRANKS);
        cfg.provider = Some("shm".into());
        cfg.chunk_bytes = 16 << 10;
        cfg.window = 2;
        cfg.timeout = Duration::from_secs(20);
        cfg.spin_polls = 16;
        let mut c = Client::connect(cfg).unwrap();
        for round in 0..ROUNDS {
            let send: Vec<f32> = (0..COUNT).map(|i| (rank as usize + i % 97 + round) as f32).collect();
            let mut out = vec![0f32; COUNT];
            c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum).unwrap();
            let want = |i: usize| (0..NRANKS).map(|r| (r as usize + i % 97 + round) as f32).sum::<f32>();
            assert!(out.iter().enumerate().all(|(i, v)| *v == want(i)), "rank {rank} round {round}: wrong result");
        }
        hold.wait();
        hold.wait();
    })
}

#[test]
fn metrics_count_what_the_clients_sent() {
    let port = free_port();
    let maddr = format!("127.0.0.1:{port}");
    let srv =
        ServerProcess::start(&["--lcores", "0-1", "--provider", "shm", "--poll", "adaptive", "--slab-size", "8M", "--metrics", &maddr]);

    // Before any job: lcore series exist, no job series, and only /metrics is served.
    let m0 = scrape(&maddr);
    assert!(m0.contains_key("tally_lcore_polls_total{lcore=\"0\"}"), "{m0:?}");
    assert!(m0.contains_key("tally_lcore_in_flight{lcore=\"1\"}"), "{m0:?}");
    assert_eq!(sum(&m0, "tally_lcore_bytes_in_total", ""), 0.0);
    assert!(!m0.keys().any(|k| k.starts_with("tally_job_")), "{m0:?}");
    assert!(get(&maddr, "/").0.starts_with("HTTP/1.1 404"));

    let hold = Arc::new(Barrier::new(NRANKS as usize + 1));
    let hs: Vec<_> = (0..NRANKS).map(|r| rank(srv.addr.clone(), r, hold.clone())).collect();
    // A scrape while the job runs answers too.
    let during = scrape(&maddr);
    assert!(during.contains_key("tally_jobs{state=\"running\"}"));
    // Every rank's all-reduces are done; the job stays until they close.
    hold.wait();

    // Each rank sends its whole buffer once per all-reduce and gets the whole
    // result back. bytes_out counts send completions, which may trail the
    // clients' receives by a little: wait until it settles.
    let bytes = (NRANKS as usize * COUNT * 4 * ROUNDS) as f64;
    let deadline = Instant::now() + Duration::from_secs(2);
    let m = loop {
        let m = scrape(&maddr);
        if sum(&m, "tally_lcore_bytes_out_total", "") == bytes || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let job = format!("job=\"{JOB:#x}\"");
    assert_eq!(sum(&m, "tally_lcore_bytes_in_total", ""), bytes);
    assert_eq!(sum(&m, "tally_lcore_bytes_out_total", ""), bytes);
    assert_eq!(sum(&m, "tally_job_bytes_in_total", &job), bytes);
    assert_eq!(sum(&m, "tally_job_bytes_out_total", &job), bytes);
    let rounds = sum(&m, "tally_job_rounds_total", &job);
    assert!(rounds > 0.0, "{m:?}");
    // Every reduced slot round was sent back: one result per rank per round.
    let chunk_bytes_total: f64 = bytes / NRANKS as f64;
    assert!(rounds * (16 << 10) as f64 >= chunk_bytes_total, "{rounds} rounds cannot carry {chunk_bytes_total} bytes");
    assert_eq!(sum(&m, "tally_job_round_latency_seconds_count", &job), rounds);
    // Buckets are cumulative: the +Inf one holds every round.
    assert_eq!(
        m.iter()
            .filter(|(k, _)| k.starts_with("tally_job_round_latency_seconds_bucket") && k.contains(&job) && k.contains("le=\"+Inf\""))
            .map(|(_, v)| v)
            .sum::<f64>(),
        rounds
    );
    assert!(sum(&m, "tally_job_round_latency_seconds_sum", &job) > 0.0);
    assert!(sum(&m, "tally_job_reduce_seconds_total", &job) > 0.0);
    assert!(sum(&m, "tally_lcore_empty_polls_total", "") > 0.0);
    assert!(sum(&m, "tally_lcore_completions_total", "") >= 2.0 * rounds * NRANKS as f64);
    assert_eq!(sum(&m, "tally_lcore_cq_errors_total", ""), 0.0);

    // The ranks close: the job ends, and its series leave /metrics while
    // the per-lcore totals keep what it moved.
    hold.wait();
    for h in hs {
        h.join().expect("rank thread");
    }
    assert!(srv.wait_log(&format!("job {JOB:#x} ended"), Duration::from_secs(5)), "the job ended");
    let deadline = Instant::now() + Duration::from_secs(2);
    let after = loop {
        let m = scrape(&maddr);
        if !m.keys().any(|k| k.starts_with("tally_job_")) || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!after.keys().any(|k| k.starts_with("tally_job_") && k.contains(&job)), "an ended job's series stayed: {after:?}");
    assert_eq!(sum(&after, "tally_lcore_bytes_in_total", ""), bytes);
    assert_eq!(sum(&after, "tally_lcore_bytes_out_total", ""), bytes);
    assert_eq!(after["tally_jobs{state=\"running\"}"], 0.0);

    // The terminal view's script mode reads the same endpoint.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tally")).args(["stats", &maddr, "--once", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lcores = v["lcores"].as_array().unwrap();
    assert_eq!(lcores.len(), 2, "{v}");
    assert!(lcores[0]["polls_per_s"].as_f64().unwrap() >= 0.0, "{v}");

    assert!(srv.stop().success());
}

/// Small all-reduces (one piece each) rotate over the server's lcores, and
/// results that go out by inject (no send completion) are still counted.
#[test]
fn small_all_reduces_rotate_over_lcores() {
    const OPS: usize = 40;
    const ELEMS: usize = 1024; // 4 KiB of f32: one piece, at shm's inject size
    let port = free_port();
    let maddr = format!("127.0.0.1:{port}");
    let srv =
        ServerProcess::start(&["--lcores", "0-1", "--provider", "shm", "--poll", "adaptive", "--slab-size", "8M", "--metrics", &maddr]);
    let hs: Vec<_> = (0..NRANKS)
        .map(|rank| {
            let addr = srv.addr.clone();
            std::thread::spawn(move || {
                let mut cfg = ClientConfig::new(vec![addr], JOB + 1, rank, NRANKS);
                cfg.provider = Some("shm".into());
                cfg.timeout = Duration::from_secs(20);
                cfg.spin_polls = 16;
                let mut c = Client::connect(cfg).unwrap();
                for op in 0..OPS {
                    let send: Vec<f32> = (0..ELEMS).map(|i| (rank as usize * 7 + i + op) as f32).collect();
                    let mut out = vec![0f32; ELEMS];
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum).unwrap();
                    for (i, v) in out.iter().enumerate() {
                        let want: f32 = (0..NRANKS).map(|r| (r as usize * 7 + i + op) as f32).sum();
                        assert_eq!(*v, want, "rank {rank} op {op} element {i}");
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("rank thread");
    }
    // Operation k went whole to lcore k mod 2: each lcore took half of them.
    let per_lcore = (OPS / 2 * NRANKS as usize * ELEMS * 4) as f64;
    let deadline = Instant::now() + Duration::from_secs(2);
    let m = loop {
        let m = scrape(&maddr);
        if sum(&m, "tally_lcore_bytes_out_total", "") == 2.0 * per_lcore || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for l in 0..2 {
        assert_eq!(m[&format!("tally_lcore_bytes_in_total{{lcore=\"{l}\"}}")], per_lcore, "lcore {l}: {m:?}");
        assert_eq!(m[&format!("tally_lcore_bytes_out_total{{lcore=\"{l}\"}}")], per_lcore, "lcore {l}: {m:?}");
    }
    assert!(srv.stop().success());
}
