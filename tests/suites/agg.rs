//! Agg all-reduce end to end: a real `tally server` process (lcores, slabs,
//! libfabric) on loopback and client ranks as threads of the test, over shm
//! and tcp;ofi_rxm. Every element of every result is compared with the
//! scalar kernel applied in rank order: the server promises bit-identical
//! results. (A split job's small all-reduces are folded by group instead,
//! the same on every rank: see `wire::split_folds_groups`; `check` knows.)
use std::sync::Arc;
use std::time::Duration;
use tally_e2e::ServerProcess;
use tally_engine::client::{Client, ClientConfig};
use tally_engine::reduce::{DataType, Kernels, ReduceOp};

/// Lcores of every server here (`--lcores 0-1`).
const LCORES: u32 = 2;

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
    /// Each rank's `relay` setting (two-rank jobs: see `ClientConfig::relay`).
    relay: [bool; 2],
    /// Each rank's `split` setting, by rank parity (see `ClientConfig::split`).
    split: [bool; 2],
    /// Reduce in place (the result overwrites the input).
    in_place: bool,
    /// `ClientConfig::rails` (0: the default) and `failover`.
    rails: usize,
    failover: bool,
    /// Each rank's `ClientConfig::caller_rail` (its thread drives rail 0), by rank parity.
    caller_rail: [bool; 2],
    /// Each rank's `ClientConfig::interleave` (stream sets in lcore-major
    /// order), by rank parity.
    interleave: [bool; 2],
    /// Each rank's `ClientConfig::min_piece`, by rank parity (None: the default).
    min_piece: [Option<usize>; 2],
}

impl Job {
    /// The groups of ranks whose partials a split all-reduce of `bytes` of
    /// `dtype` combines (see `wire::split_folds_groups`), on a server of
    /// [`LCORES`] lcores; None where the job folds every piece in rank order.
    fn split_groups(&self, dtype: DataType, bytes: usize) -> Option<Vec<std::ops::Range<u32>>> {
        use tally_engine::wire::{split_folds_groups, split_lcores, split_ranks, SPLIT_MAX};
        let groups = split_lcores(self.nranks, LCORES);
        let split = self.split == [true; 2] && (4..=64).contains(&self.nranks) && groups >= 2;
        let small = bytes <= SPLIT_MAX.min(self.chunk_bytes / dtype.size() * dtype.size());
        (split && small && split_folds_groups(groups, dtype)).then(|| (0..groups).map(|p| split_ranks(p, self.nranks, groups)).collect())
    }

    fn new(job_id: u64, nranks: u32, chunk_bytes: usize, window: u32, ops: Vec<(DataType, ReduceOp, usize)>) -> Job {
        Job {
            job_id,
            nranks,
            chunk_bytes,
            window,
            ops,
            relay: [true; 2],
            split: [true; 2],
            in_place: false,
            rails: 0,
            failover: true,
            caller_rail: [false; 2],
            interleave: [false; 2],
            min_piece: [None; 2],
        }
    }
}

/// Runs a job's ranks as threads against `addr`; checks every element.
fn run_job(addr: &str, provider: &str, job: &Job, seed: u64) {
    let results = run_ranks(addr, provider, job, seed);
    let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(errors.is_empty(), "{provider}: {errors:?}");
    let results: Vec<Vec<Vec<u8>>> = results.into_iter().map(Result::unwrap).collect();
    check(provider, job, seed, &results);
}

/// Every rank's input of each of `job`'s all-reduces.
fn inputs(job: &Job, seed: u64) -> Vec<Vec<Vec<u8>>> {
    job.ops
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
        .collect()
}

/// Runs a job's ranks as threads against `addr` (servers, comma-separated):
/// each rank's results, or its first error.
fn run_ranks(addr: &str, provider: &str, job: &Job, seed: u64) -> Vec<Result<Vec<Vec<u8>>, String>> {
    let inputs = Arc::new(inputs(job, seed));
    let in_place = job.in_place;
    let handles: Vec<_> = (0..job.nranks)
        .map(|rank| {
            let mut cfg = ClientConfig::new(addr.split(',').map(str::to_string).collect(), job.job_id, rank, job.nranks);
            if job.rails > 0 {
                cfg.rails = job.rails;
            }
            cfg.failover = job.failover;
            cfg.caller_rail = job.caller_rail[rank as usize % 2];
            cfg.interleave = job.interleave[rank as usize % 2];
            if let Some(p) = job.min_piece[rank as usize % 2] {
                cfg.min_piece = p;
            }
            cfg.provider = Some(provider.to_string());
            cfg.chunk_bytes = job.chunk_bytes;
            cfg.window = job.window;
            cfg.timeout = Duration::from_secs(30);
            cfg.spin_polls = 64;
            cfg.relay = job.relay[rank as usize % 2];
            cfg.split = job.split[rank as usize % 2];
            let (inputs, ops) = (inputs.clone(), job.ops.clone());
            std::thread::spawn(move || -> Result<Vec<Vec<u8>>, String> {
                let mut c = Client::connect(cfg).map_err(|e| format!("rank {rank}: {e}"))?;
                ops.iter()
                    .enumerate()
                    .map(|(k, &(dt, op, _))| {
                        let send = &inputs[k][rank as usize];
                        let r = if in_place {
                            let mut buf = send.clone();
                            c.allreduce_in_place(&mut buf, dt, op).map(|()| buf)
                        } else {
                            let mut out = vec![0xA5u8; send.len()];
                            c.allreduce(send, &mut out, dt, op).map(|()| out)
                        };
                        r.map_err(|e| format!("rank {rank} op {k} ({dt} {op}): {e}"))
                    })
                    .collect()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

/// Compares every element of every rank's results with the scalar kernel
/// applied to the inputs in rank order (a split job's small ones: each
/// group's in rank order, then the partials in group order).
fn check(provider: &str, job: &Job, seed: u64, results: &[Vec<Vec<u8>>]) {
    let inputs = inputs(job, seed);
    let scalar = Kernels::scalar();
    for (k, &(dt, op, count)) in job.ops.iter().enumerate() {
        let ins: Vec<&[u8]> = inputs[k].iter().map(|v| v.as_slice()).collect();
        let mut want = vec![0u8; count * dt.size()];
        match job.split_groups(dt, count * dt.size()) {
            None => scalar.reduce(dt, op, &mut want, &ins).unwrap(),
            Some(groups) => {
                let pop = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
                let partials: Vec<Vec<u8>> = groups
                    .iter()
                    .map(|g| {
                        let mut p = vec![0u8; want.len()];
                        scalar.reduce(dt, pop, &mut p, &ins[g.start as usize..g.end as usize]).unwrap();
                        p
                    })
                    .collect();
                let ptrs: Vec<*const u8> = partials.iter().map(|p| p.as_ptr()).collect();
                // SAFETY: every partial and `want` hold `count` elements; `want` overlaps none.
                unsafe { scalar.reduce_partials(dt, op, want.as_mut_ptr(), &ptrs, count, job.nranks as usize) }.unwrap();
            }
        }
        for (rank, res) in results.iter().enumerate() {
            if res[k] != want {
                let i = res[k].iter().zip(&want).position(|(a, b)| a != b).unwrap() / dt.size();
                panic!(
                    "{provider}: rank {rank} op {k} ({dt} {op}, {count} elements, in place {}): element {i} differs: {:?} against {:?}",
                    job.in_place,
                    &res[k][i * dt.size()..][..dt.size()],
                    &want[i * dt.size()..][..dt.size()]
                );
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
        run_job(&addr, provider, &Job::new(1 + i as u64, 3, 4000, 3, ops), s);
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

/// Ranks with rails (an endpoint and a thread each, here on 2 cores where
/// the default is none): three servers of two lcores over two rails (shared
/// by servers), three (one each), six (lanes: each lcore a rail of its own)
/// and four (server 0 on two lanes, the others on one); in place and not,
/// with failover's staging (results copied out by the rail threads) and
/// without; eight types, odd sizes across chunk boundaries. Then the
/// caller's rail (`TALLY_CALLER_RAIL`: the caller's thread drives rail 0,
/// and copies the staged results received there itself) on every rank,
/// and on every other one beside ranks whose rails are all threads.
#[test]
fn tcp_ranks_with_rails_every_element_right() {
    let srvs: Vec<_> = (0..3).map(|_| server("tcp")).collect();
    let addrs = srvs.iter().map(|s| s.addr.clone()).collect::<Vec<_>>().join(",");
    let s = seed();
    let (all, alternate, none) = ([true; 2], [true, false], [false; 2]);
    let jobs = [
        (3, false, true, none),
        (2, true, true, none),
        (6, true, true, none),
        (4, false, false, none),
        (2, false, true, all),
        (6, true, true, alternate),
        (3, false, false, alternate),
    ];
    for (id, (rails, in_place, failover, caller_rail)) in (700..).zip(jobs) {
        // At most 8 (type, op) pairs: a client's sub-jobs.
        let ops = DataType::ALL
            .iter()
            .take(8)
            .enumerate()
            .map(|(i, dt)| (*dt, ReduceOp::ALL[i % ReduceOp::ALL.len()], [1, 1000, 65_537, 300_001][i % 4]))
            .collect();
        let job = Job { rails, in_place, failover, caller_rail, ..Job::new(id, 3, 16 << 10, 2, ops) };
        run_job(&addrs, "tcp", &job, s);
    }
    for srv in srvs {
        assert!(srv.stop().success());
    }
}

/// Stream sets in lcore-major order (`TALLY_INTERLEAVE=1`): three servers,
/// all-reduces of fewer pieces than lcores (each then reaches every server)
/// and of many, one after another so that the rotation moves on; with rails
/// and failover's staging, in place and not.
#[test]
fn tcp_interleaved_streams_every_element_right() {
    let srvs: Vec<_> = (0..3).map(|_| server("tcp")).collect();
    let addrs = srvs.iter().map(|s| s.addr.clone()).collect::<Vec<_>>().join(",");
    let s = seed();
    // 8 KiB pieces: 1, 3, 5 pieces, then several per lcore, then odd sizes.
    let counts = [2048, 6144, 10_000, 200_001, 2048, 1, 65_537, 6144];
    for (id, (rails, in_place)) in (720..).zip([(3, false), (1, true)]) {
        let ops = counts.iter().enumerate().map(|(i, &n)| (DataType::ALL[i % 2], ReduceOp::Sum, n)).collect();
        let job = Job { rails, in_place, interleave: [true; 2], ..Job::new(id, 3, 8 << 10, 2, ops) };
        run_job(&addrs, "tcp", &job, s);
    }
    assert!(srvs.iter().all(|srv| srv.log_contains("streams lcore-major")), "every server admitted the job as interleaved");
    for srv in srvs {
        assert!(srv.stop().success());
    }
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
        run_job(&addr, "shm", &Job::new(100 + i as u64, n, 64 << 10, 4, ops), s);
    }
    assert!(srv.stop().success());
}

/// Jobs whose small pieces take a path of their own (the relay, the split):
/// for each (in place, ranks) case, every type and op with pieces at the
/// 4 KiB limit, just above it and far above it, then 64 KiB pieces mixing
/// small all-reduces with 4100-byte and large ones in one job; every
/// element checked. The server must say `said` (it took the path).
fn small_piece_jobs(provider: &str, env: &[(&str, &str)], cases: &[(bool, u32)], said: &str) {
    let args = ["--lcores", "0-1", "--provider", provider, "--poll", "adaptive", "--slab-size", "64M"];
    let s = seed();
    let mut id = 500;
    // An shm lcore takes at most 256 client endpoints over its life (each
    // server job's ranks are new AV entries; ARCHITECTURE, provider facts):
    // a fresh server before a job would pass 200.
    let mut srv: Option<ServerProcess> = None;
    let mut inserted = 0;
    let mut run = |job: Job| {
        let ops = job.ops.iter().map(|(dt, op, _)| (*dt, *op)).collect::<std::collections::HashSet<_>>().len();
        inserted += ops as u32 * job.nranks;
        if srv.is_none() || inserted > 200 {
            if let Some(old) = srv.take() {
                assert!(old.log_contains(said), "the server never said: {said}");
                assert!(old.stop().success());
            }
            srv = Some(ServerProcess::start_with("127.0.0.1:0", &args, env));
            inserted = ops as u32 * job.nranks;
        }
        run_job(&srv.as_ref().unwrap().addr, provider, &job, s);
    };
    for &(in_place, nranks) in cases {
        for (i, dt) in DataType::ALL.iter().enumerate() {
            // 4 KiB pieces: 1024 f32 is one piece at the limit, 12,345 f32
            // several; 8-bit types' 4096 elements fill it exactly.
            let ops =
                ReduceOp::ALL.iter().enumerate().map(|(j, op)| (*dt, *op, [1, 7, 1000, 4096 / dt.size(), 12_345][(i + j) % 5])).collect();
            id += 1;
            run(Job { in_place, ..Job::new(id, nranks, 4096, 3, ops) });
        }
        // 64 KiB pieces: small all-reduces (one piece per lcore of at most
        // 4 KiB) take the path, 4100-byte and large ones the server's usual
        // one, interleaved in one job.
        let ops = vec![
            (DataType::Float32, ReduceOp::Sum, 1024),
            (DataType::Float32, ReduceOp::Sum, 300_001),
            (DataType::Float32, ReduceOp::Sum, 2048),
            (DataType::Float32, ReduceOp::Sum, 4100),
            (DataType::Bfloat16, ReduceOp::Avg, 2048),
            (DataType::Bfloat16, ReduceOp::Avg, 99_999),
            (DataType::Bfloat16, ReduceOp::Avg, 3),
        ];
        id += 1;
        run(Job { in_place, ..Job::new(id, nranks, 64 << 10, 4, ops) });
    }
    let last = srv.take().unwrap();
    assert!(last.log_contains(said), "the server never said: {said}");
    assert!(last.stop().success());
}

/// Two-rank jobs relay pieces of at most 4 KiB (each rank gets the other's
/// and reduces the two itself), over shm with the server's sends by inject
/// and by send (TALLY_INJECT=0), and over tcp.
fn relay_jobs(provider: &str, env: &[(&str, &str)]) {
    small_piece_jobs(provider, env, &[(false, 2), (true, 2)], "relay (pieces of at most 4096 bytes");
}

#[test]
fn shm_two_rank_jobs_relay_small_pieces() {
    relay_jobs("shm", &[]);
}

#[test]
fn shm_two_rank_jobs_relay_small_pieces_without_inject() {
    relay_jobs("shm", &[("TALLY_INJECT", "0")]);
}

#[test]
fn tcp_two_rank_jobs_relay_small_pieces() {
    relay_jobs("tcp", &[]);
}

/// Ranks of `mixed` disagree on a flag: they are refused, naming it (the
/// later ones at once, the first when the server's join timeout ends its
/// wait); `off`, the same job with the flag off on every rank, runs as
/// before and is exact, and the server never says `feature` for it.
fn disagreeing_ranks_are_refused(mixed: Job, off: Job, field: &str, feature: &str) {
    let srv =
        ServerProcess::start(&["--lcores", "0-1", "--provider", "shm", "--poll", "adaptive", "--slab-size", "64M", "--join-timeout", "3"]);
    let addr = srv.addr.clone();
    let s = seed();
    let errors: Vec<String> = run_ranks(&addr, "shm", &mixed, s).into_iter().map(|r| r.expect_err("a rank of a mixed job ran")).collect();
    assert!(errors.iter().any(|e| e.contains(field) && e.contains("differs")), "{errors:?}");
    run_job(&addr, "shm", &off, s);
    assert!(!srv.log_contains(feature), "a job without the flag had it: {feature}");
    assert!(srv.stop().success());
}

#[test]
fn ranks_that_disagree_on_interleave_are_refused() {
    let ops = vec![(DataType::Float32, ReduceOp::Sum, 100_000)];
    disagreeing_ranks_are_refused(
        Job { interleave: [true, false], ..Job::new(920, 3, 4096, 2, ops.clone()) },
        Job { interleave: [false, false], ..Job::new(921, 3, 4096, 2, ops) },
        "flags",
        "streams lcore-major",
    );
}

/// `TALLY_MIN_PIECE` decides how an all-reduce smaller than a chunk per
/// stream is cut, so ranks that differ would meet with different pieces in
/// one slot: refused ("min_piece"), and a job whose ranks agree runs.
#[test]
fn ranks_that_disagree_on_min_piece_are_refused() {
    let ops = vec![(DataType::Float32, ReduceOp::Sum, 100_000)];
    disagreeing_ranks_are_refused(
        Job { min_piece: [Some(32 << 10), None], ..Job::new(922, 3, 64 << 10, 2, ops.clone()) },
        Job { min_piece: [None, None], ..Job::new(923, 3, 64 << 10, 2, ops.clone()) },
        "TALLY_MIN_PIECE alike",
        "pieces spread down to",
    );
    // Both at 32 KiB: admitted, and every element right.
    let srv = ServerProcess::start(&["--lcores", "0-1", "--provider", "shm", "--poll", "adaptive", "--slab-size", "64M"]);
    run_job(&srv.addr, "shm", &Job { min_piece: [Some(32 << 10); 2], ..Job::new(924, 3, 64 << 10, 2, ops) }, seed());
    assert!(
        srv.log_contains("pieces spread down to 32768 bytes"),
        "{:?}",
        srv.log.lock().unwrap().iter().filter(|l| l.contains("starting")).collect::<Vec<_>>()
    );
    assert!(srv.stop().success());
}

#[test]
fn ranks_that_disagree_on_relay_are_refused() {
    let ops = vec![(DataType::Float32, ReduceOp::Sum, 1000)];
    disagreeing_ranks_are_refused(
        Job { relay: [true, false], ..Job::new(900, 2, 4096, 2, ops.clone()) },
        Job { relay: [false, false], ..Job::new(901, 2, 4096, 2, ops) },
        "flags",
        "relay (pieces",
    );
}

/// Jobs of 4 to 7 ranks split their pieces of at most 4 KiB by rank over
/// the lcores (each lcore takes its group's and folds them, the last group
/// in combines the partials; 16-bit floats: it folds every piece in rank
/// order). (More than two lcores, and latency lcores, need
/// more cores than CI has: the device session's `split` part and the load
/// generator, which checks every element too, cover them.)
fn split_jobs(provider: &str, env: &[(&str, &str)]) {
    small_piece_jobs(provider, env, &[(false, 4), (true, 5), (false, 7)], "split (pieces of at most 4096 bytes by rank over 2 lcores)");
}

#[test]
fn shm_split_jobs() {
    split_jobs("shm", &[]);
}

/// The lcore that does not combine sends the combiner's result from a copy
/// of its own when it cannot inject it.
#[test]
fn shm_split_jobs_without_inject() {
    split_jobs("shm", &[("TALLY_INJECT", "0")]);
}

#[test]
fn tcp_split_jobs() {
    split_jobs("tcp", &[]);
}

#[test]
fn ranks_that_disagree_on_split_are_refused() {
    let ops = vec![(DataType::Float32, ReduceOp::Sum, 1000)];
    disagreeing_ranks_are_refused(
        Job { split: [true, false], ..Job::new(910, 4, 4096, 2, ops.clone()) },
        Job { split: [false, false], ..Job::new(911, 4, 4096, 2, ops) },
        "flags",
        "split (pieces",
    );
}

/// This machine's established TCP connections as `ss -tnpi` lists them:
/// (owner pid, local port, peer port, rto in ms).
fn tcp_connections() -> Vec<(u32, u16, u16, f64)> {
    let out = std::process::Command::new("ss").args(["-tnpi", "state", "established"]).output().expect("ss (iproute2)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let port = |a: &str| a.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    let mut found = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(pid) = l.split("pid=").nth(1).and_then(|r| r.split(',').next()).and_then(|p| p.parse::<u32>().ok()) else { continue };
        let (Some(local), Some(peer)) = (f.get(2).and_then(|a| port(a)), f.get(3).and_then(|a| port(a))) else { continue };
        let info = lines.peek().filter(|n| n.starts_with(char::is_whitespace)).copied().unwrap_or("");
        if let Some(rto) = info.split_whitespace().find_map(|w| w.strip_prefix("rto:")).and_then(|v| v.parse::<f64>().ok()) {
            found.push((pid, local, peer, rto));
        }
    }
    found
}

/// Over tcp both ends lower the floor of TCP's timers on the provider's
/// connections by default (`host::tcp_rto_min`: a lost last packet then
/// costs ~5 ms, not 200): the server on every connection but its control
/// port's, the rank on its connections to the server's endpoints, soon
/// after the job's first all-reduce (both ends walk their sockets every 50
/// ms while a job's connections open, then once a second). Read
/// from outside, as `ss` shows each connection's retransmission timeout,
/// which follows the floor once traffic moved after it was set (on
/// loopback the round trip is microseconds: the timeout is the floor).
#[test]
fn tcp_connections_carry_tallys_timer_floor_on_both_ends() {
    if !tally_engine::host::tcp_rto_min::kernel_has_option() {
        eprintln!("skipped: this kernel has no TCP_RTO_MIN_US (before Linux 6.15); the doctor row says so");
        return;
    }
    // The defaults: nothing asks for the floor (`make test` may run with
    // TALLY_TCP_RTO_MIN_MS=0 in the environment: this test then says so).
    if std::env::var("TALLY_TCP_RTO_MIN_MS").is_ok_and(|v| v.trim() == "0") {
        eprintln!("skipped: TALLY_TCP_RTO_MIN_MS=0 turns the floor off");
        return;
    }
    let s = ServerProcess::start(&["--lcores", "0-1", "--provider", "tcp", "--poll", "adaptive", "--slab-size", "64M"]);
    let control: u16 = s.addr.rsplit(':').next().unwrap().parse().unwrap();
    let server_pid = s.child.id();
    let (job, n, count) = (0x7e0_f100, 2u32, 64 << 10);
    let ranks: Vec<_> = (0..n)
        .map(|rank| {
            let cfg = tally_e2e::client("tcp", &s.addr, job, rank, n);
            std::thread::spawn(move || -> Result<(), String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                let send: Vec<f32> = (0..count).map(|i| (rank as usize + i % 89) as f32).collect();
                let mut out = vec![0f32; count];
                // Connections open with the first; the walks find them
                // within 50 ms; traffic after that brings the timeout down.
                for round in 0..3 {
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                        .map_err(|e| e.to_string())?;
                    for (i, v) in out.iter().enumerate() {
                        let want: f32 = (0..n).map(|r| (r as usize + i % 89) as f32).sum();
                        if *v != want {
                            return Err(format!("rank {rank} round {round}: element {i} = {v}, want {want}"));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                let conns = tcp_connections();
                // Checked while the client (and its connections) still live.
                check_floors(&conns, server_pid, control);
                Ok(())
            })
        })
        .collect();
    tally_e2e::join_all(ranks);
    drop(s);
}

/// The server's data connections (its pid's, not its control port's) and
/// the ranks' connections to them all run a timeout well under the
/// kernel's 200 ms floor. (The ranks' are found by port: `ss` may name them
/// by the pid of `ss` itself, which inherits the provider's descriptors.)
fn check_floors(conns: &[(u32, u16, u16, f64)], server: u32, control: u16) {
    let server_side: Vec<_> = conns.iter().filter(|c| c.0 == server && c.1 != control).collect();
    let data_ports: Vec<u16> = server_side.iter().map(|c| c.1).collect();
    let rank_side: Vec<_> = conns.iter().filter(|c| c.0 != server && data_ports.contains(&c.2)).collect();
    assert!(!server_side.is_empty() && !rank_side.is_empty(), "no data connections found: {conns:?}");
    for c in server_side.iter().chain(rank_side.iter()) {
        assert!(c.3 < 100.0, "a data connection kept the kernel's floor (rto {} ms): {c:?} of {conns:?}", c.3);
    }
}
