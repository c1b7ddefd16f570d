//! Agg all-reduce end to end: a real `tally server` process (lcores, slabs,
//! libfabric) on loopback and client ranks as threads of the test, over shm
//! and tcp;ofi_rxm. Every element of every result is compared with the
//! scalar kernel applied in rank order: the server promises bit-identical
//! results.
mod common;
use common::ServerProcess;
use std::sync::Arc;
use std::time::Duration;
use tally_engine::client::{Client, ClientConfig};
use tally_engine::reduce::{DataType, Kernels, ReduceOp};

fn server(provider: &str) -> ServerProcess {
    ServerProcess::start(&["--lcores", "0-1", "--provider", provider, "--poll", "adaptive", "--slab-size", "64M"])
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random values that are ordinary numbers in every type (no NaN from random bits).
fn fill(dtype: DataType, buf: &mut [u8], rng: &mut Rng) {
    let n = buf.len() / dtype.size();
    for i in 0..n {
        let r = rng.next();
        let f = ((r % 2001) as f64 - 1000.0) / 64.0;
        let e = &mut buf[i * dtype.size()..(i + 1) * dtype.size()];
        match dtype {
            DataType::Float32 => e.copy_from_slice(&(f as f32).to_le_bytes()),
            DataType::Float64 => e.copy_from_slice(&f.to_le_bytes()),
            DataType::Float16 => e.copy_from_slice(&half::f16::from_f64(f / 16.0).to_le_bytes()),
            DataType::Bfloat16 => e.copy_from_slice(&half::bf16::from_f64(f).to_le_bytes()),
            _ => e.copy_from_slice(&r.to_le_bytes()[..dtype.size()]),
        }
    }
}

fn seed() -> u64 {
    let s = std::env::var("TALLY_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
    eprintln!("seed {s} (TALLY_TEST_SEED to repeat)");
    s
}

struct Job {
    job_id: u64,
    nranks: u32,
    chunk_bytes: usize,
    window: u32,
    /// (dtype, op, count) all-reduces, run in order by every rank.
    ops: Vec<(DataType, ReduceOp, usize)>,
}

/// Runs a job's ranks as threads against `addr`; checks every element.
fn run_job(addr: &str, provider: &str, job: &Job, seed: u64) {
    let inputs: Vec<Vec<Vec<u8>>> = job
        .ops
        .iter()
        .enumerate()
        .map(|(k, &(dt, _, count))| {
            (0..job.nranks)
                .map(|r| {
                    let mut v = vec![0u8; count * dt.size()];
                    fill(dt, &mut v, &mut Rng(seed ^ (k as u64 * 7919 + r as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15)));
                    v
                })
                .collect()
        })
        .collect();
    let inputs = Arc::new(inputs);
    let handles: Vec<_> = (0..job.nranks)
        .map(|rank| {
            let mut cfg = ClientConfig::new(vec![addr.to_string()], job.job_id, rank, job.nranks);
            cfg.provider = Some(provider.to_string());
            cfg.chunk_bytes = job.chunk_bytes;
            cfg.window = job.window;
            cfg.timeout = Duration::from_secs(30);
            cfg.spin_polls = 64;
            let (inputs, ops) = (inputs.clone(), job.ops.clone());
            std::thread::spawn(move || -> Vec<Vec<u8>> {
                let mut c = Client::connect(cfg).expect("client");
                ops.iter()
                    .enumerate()
                    .map(|(k, &(dt, op, _))| {
                        let send = &inputs[k][rank as usize];
                        let mut out = vec![0xA5u8; send.len()];
                        c.allreduce(send, &mut out, dt, op).unwrap_or_else(|e| panic!("rank {rank} op {k} ({dt} {op}): {e}"));
                        out
                    })
                    .collect()
            })
        })
        .collect();
    let results: Vec<Vec<Vec<u8>>> = handles.into_iter().map(|h| h.join().expect("rank thread")).collect();
    let scalar = Kernels::scalar();
    for (k, &(dt, op, count)) in job.ops.iter().enumerate() {
        let ins: Vec<&[u8]> = inputs[k].iter().map(|v| v.as_slice()).collect();
        let mut want = vec![0u8; count * dt.size()];
        scalar.reduce(dt, op, &mut want, &ins).unwrap();
        for (rank, res) in results.iter().enumerate() {
            if res[k] != want {
                let i = res[k].iter().zip(&want).position(|(a, b)| a != b).unwrap() / dt.size();
                panic!("{provider}: rank {rank} op {k} ({dt} {op}, {count} elements): element {i} differs");
            }
        }
    }
}

fn every_type_and_op(provider: &str) {
    let srv = server(provider);
    let addr = srv.addr.clone();
    let s = seed();
    // One job per type, each running every op (a client opens one server
    // job per (type, op) pair it uses).
    for (i, dt) in DataType::ALL.iter().enumerate() {
        let ops = ReduceOp::ALL
            .iter()
            .enumerate()
            // Sizes that are not multiples of anything, crossing chunk boundaries.
            .map(|(j, op)| (*dt, *op, [1, 7, 1000, 12_345, 65_537][(i + j) % 5]))
            .collect();
        run_job(&addr, provider, &Job { job_id: 1 + i as u64, nranks: 3, chunk_bytes: 4000, window: 3, ops }, s);
    }
    assert!(srv.stop().success());
}

#[test]
fn shm_every_type_and_op_3_ranks() {
    every_type_and_op("shm");
}

#[test]
fn tcp_every_type_and_op_3_ranks() {
    every_type_and_op("tcp");
}

#[test]
fn shm_rank_counts_2_to_8_large_and_odd_sizes() {
    let srv = server("shm");
    let addr = srv.addr.clone();
    let s = seed();
    for (i, n) in [2u32, 5, 8].into_iter().enumerate() {
        let ops = vec![
            (DataType::Float32, ReduceOp::Sum, 0),
            (DataType::Float32, ReduceOp::Sum, 1),
            (DataType::Float32, ReduceOp::Sum, (3 << 20) / 4 + 3),
            (DataType::Bfloat16, ReduceOp::Avg, 99_999),
        ];
        run_job(&addr, "shm", &Job { job_id: 100 + i as u64, nranks: n, chunk_bytes: 64 << 10, window: 4, ops }, s);
    }
    assert!(srv.stop().success());
}
