//! Jobs of hundreds of ranks against a real `tally server` process, over
//! tcp on loopback (shm 1.17 reaches at most 256 peers per endpoint): the
//! ranks join at once and every element of every all-reduce is right; a job
//! whose region would not fit the server's slab budget at the piece it asks
//! for gets smaller pieces (`control::budget`), and one that cannot fit even
//! at the smallest piece is refused with the rank count and window that
//! would fit.
//!
//! A job whose pieces would have to shrink may instead be staged (the
//! server receives its ranks `stage_buffers` at a time and folds them in rank
//! order): it keeps its piece, and its results are bit for bit the rank-order
//! fold, whatever order the pieces arrive in.
//!
//! The ranks are `tally bench allreduce` processes of 64 rank threads each,
//! every thread with its own client and endpoint (the load generator the
//! issue asks for), which checks every element and reports wrong ones in
//! its JSON.
use std::time::{Duration, Instant};
use tally_e2e::{bench, ServerProcess};
use tally_engine::client::{Client, ClientError};
use tally_engine::reduce::{DataType, ReduceOp};

/// A server of two lcores; its op timeout (the wait for a straggling rank)
/// raised from 30 s to 120: these tests are about joins and pieces, and on
/// CI's 2 busy cores, beside the other suites, one of 1024 rank threads
/// once sat 32 s inside a provider call, and the job failed as a straggler.
fn server(slab: &str) -> ServerProcess {
    ServerProcess::start(&["--lcores", "0-1", "--provider", "tcp", "--poll", "adaptive", "--slab-size", slab, "--op-timeout", "120"])
}

#[test]
fn five_hundred_twelve_ranks_join_at_once_and_every_element_is_right() {
    // 512 ranks x window 4 x 4 KiB = 8 MiB: a quarter of the slab, as asked.
    let srv = server("32M");
    let rows = bench(&srv.addr, &["--ranks", "512", "--sizes", "4K,64K", "--chunk", "4K", "--iters", "5", "--warmup", "1"]);
    assert_eq!(rows.len(), 2);
    assert!(srv.log_contains("512 ranks, f32 sum, 1024 elements per piece, window 4"), "{:?}", srv.log.lock().unwrap());
    assert!(srv.stop().success());
}

#[test]
fn a_thousand_ranks_asking_for_large_pieces_get_pieces_that_fit() {
    // 1024 ranks x window 2 x 1 MiB = 2 GiB per lcore asked; a quarter of a
    // 64 MiB slab is 16 MiB: 8 KiB pieces, so a 64 KiB all-reduce is cut
    // into 8 chunks over both lcores. (Window 2: 2048 receives per lcore,
    // what tcp;ofi_rxm queues; more are retried until some complete, which
    // works but slowly.)
    let srv = server("64M");
    let rows =
        bench(&srv.addr, &["--ranks", "1024", "--sizes", "4K,64K", "--chunk", "1M", "--window", "2", "--iters", "3", "--warmup", "1"]);
    assert_eq!(rows.len(), 2);
    assert_started(&srv, "1024 ranks, f32 sum, 2048 elements per piece (asked 262144");
    assert!(srv.stop().success());
}

/// `n` rank threads of one job asking for `window` and 256 KiB pieces; each
/// returns its join's error, or checks one all-reduce of 64 KiB.
fn job(addr: &str, id: u64, n: u32, window: u32) -> Vec<Result<(), ClientError>> {
    let hs: Vec<_> = (0..n)
        .map(|rank| {
            let mut cfg = tally_e2e::client("tcp", addr, id, rank, n);
            cfg.chunk_bytes = 256 << 10;
            cfg.window = window;
            std::thread::spawn(move || -> Result<(), ClientError> {
                let mut c = Client::connect(cfg)?;
                c.join(DataType::Float32, ReduceOp::Sum)?;
                let send: Vec<f32> = (0..16384).map(|i| (rank as usize + i % 13) as f32).collect();
                let mut out = vec![0f32; send.len()];
                c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)?;
                for (i, v) in out.iter().enumerate() {
                    let want: f32 = (0..n).map(|r| (r as usize + i % 13) as f32).sum();
                    assert_eq!(*v, want, "rank {rank} element {i}");
                }
                Ok(())
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

#[test]
fn a_job_that_cannot_fit_even_at_the_smallest_piece_is_told_what_would() {
    // A quarter of 1 MiB: 256 KiB a job. 8 ranks x window 16 x 4 KiB = 512 KiB.
    let srv = server("1M");
    for r in job(&srv.addr, 0x1f17, 8, 16) {
        let e = r.expect_err("admitted a job that cannot fit");
        let text = e.to_string();
        assert!(
            text.contains("no capacity")
                && text.contains("window 16 x 8 ranks x 4 KiB piece = 512 KiB per lcore")
                && text.contains("at most 4 ranks fit at window 16, or window 8 at 8 ranks"),
            "{text}"
        );
    }
    // What it named fits: 4 ranks at window 16 run, with 4 KiB pieces instead of 256 KiB.
    for r in job(&srv.addr, 0x1f18, 4, 16) {
        r.expect("the job the refusal said would fit");
    }
    assert!(srv.wait_log("4 ranks, f32 sum, 1024 elements per piece (asked 65536", Duration::from_secs(5)));
    assert!(srv.stop().success());
}

/// Rank `rank`'s element `i` in round `round`: floats of mixed signs and
/// magnitudes, so that adding them in another order would round otherwise.
fn mixed(rank: u32, i: usize, round: u32) -> f64 {
    let mut x = (rank as u64) << 40 ^ (i as u64) << 8 ^ round as u64;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let mantissa = (x % 2_000_001) as f64 / 1000.0 - 1000.0;
    mantissa * [1e-3, 1.0, 1e3, 1e6][(x >> 40) as usize % 4]
}

/// A staged job: `n` rank threads, `rounds` all-reduces of `count` elements
/// of `dtype` (f32 sum, f64 avg, or a 16-bit float sum or avg), each result
/// compared bit for bit with the fold of the ranks' inputs in rank order.
fn staged_job(addr: &str, id: u64, n: u32, dtype: DataType, op: ReduceOp, count: usize, rounds: u32) {
    let hs: Vec<_> = (0..n)
        .map(|rank| {
            let mut cfg = tally_e2e::client("tcp", addr, id, rank, n);
            cfg.chunk_bytes = 32 << 10;
            cfg.window = 2;
            std::thread::spawn(move || {
                let mut c = Client::connect(cfg).expect("connect");
                for round in 0..rounds {
                    let (send, want): (Vec<u8>, Vec<u8>) = match dtype {
                        DataType::Float32 => {
                            let send: Vec<f32> = (0..count).map(|i| mixed(rank, i, round) as f32).collect();
                            let want: Vec<f32> = (0..count)
                                .map(|i| (1..n).fold(mixed(0, i, round) as f32, |acc, r| acc + mixed(r, i, round) as f32))
                                .collect();
                            (bytemuck::cast_slice(&send).to_vec(), bytemuck::cast_slice(&want).to_vec())
                        }
                        DataType::Bfloat16 | DataType::Float16 => {
                            // The one pass: widened, combined in f32 in rank
                            // order, rounded once (a fold that rounded at
                            // every step would differ in most elements).
                            let bits = |v: f32| match dtype {
                                DataType::Float16 => half::f16::from_f32(v).to_bits(),
                                _ => half::bf16::from_f32(v).to_bits(),
                            };
                            let widen = |b: u16| match dtype {
                                DataType::Float16 => half::f16::from_bits(b).to_f32(),
                                _ => half::bf16::from_bits(b).to_f32(),
                            };
                            let input = |r: u32, i: usize| bits((mixed(r, i, round) * 1e-5) as f32);
                            let send: Vec<u16> = (0..count).map(|i| input(rank, i)).collect();
                            let want: Vec<u16> = (0..count)
                                .map(|i| {
                                    let sum = (1..n).fold(widen(input(0, i)), |acc, r| acc + widen(input(r, i)));
                                    bits(if op == ReduceOp::Avg { sum / n as f32 } else { sum })
                                })
                                .collect();
                            (bytemuck::cast_slice(&send).to_vec(), bytemuck::cast_slice(&want).to_vec())
                        }
                        _ => {
                            let send: Vec<f64> = (0..count).map(|i| mixed(rank, i, round)).collect();
                            let want: Vec<f64> =
                                (0..count).map(|i| (1..n).fold(mixed(0, i, round), |acc, r| acc + mixed(r, i, round)) / n as f64).collect();
                            (bytemuck::cast_slice(&send).to_vec(), bytemuck::cast_slice(&want).to_vec())
                        }
                    };
                    let mut out = vec![0u8; send.len()];
                    c.allreduce(&send, &mut out, dtype, op).expect("all-reduce");
                    let size = dtype.size();
                    let wrong: Vec<usize> = (0..count).filter(|&i| out[i * size..][..size] != want[i * size..][..size]).collect();
                    assert!(
                        wrong.is_empty(),
                        "rank {rank} round {round}: {} of {count} elements differ from the rank-order fold, first {:?}",
                        wrong.len(),
                        &wrong[..wrong.len().min(8)]
                    );
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("rank thread");
    }
}

/// A tcp server on lcores 0-1 with `slab` per lcore and `stage` buffers a slot.
fn staging_server(slab: &str, stage: &str) -> ServerProcess {
    ServerProcess::start(&["--lcores", "0-1", "--provider", "tcp", "--poll", "adaptive", "--slab-size", slab, "--stage-buffers", stage])
}

/// Asserts that the server started a job with this line, showing the job lines it did log.
fn assert_started(srv: &ServerProcess, line: &str) {
    assert!(
        srv.log_contains(line),
        "no job line {line:?}: {:?}",
        srv.log.lock().unwrap().iter().filter(|l| l.contains("starting")).collect::<Vec<_>>()
    );
}

#[test]
fn a_staged_job_keeps_its_piece_and_folds_in_rank_order() {
    // 48 ranks x window 2 x 32 KiB = 3 MiB per lcore, over the 1 MiB a job
    // may take of a 4 MiB slab: staged 8 ranks at a time, 2 x 9 x 32 KiB.
    let srv = staging_server("4M", "8");
    // 40,000 elements: 5 pieces, the last one short, over both lcores.
    staged_job(&srv.addr, 0x57a1, 48, DataType::Float32, ReduceOp::Sum, 40_000, 3);
    assert_started(&srv, "48 ranks, f32 sum, 8192 elements per piece (received 8 ranks at a time");
    staged_job(&srv.addr, 0x57a2, 48, DataType::Float64, ReduceOp::Avg, 12_345, 2);
    assert_started(&srv, "48 ranks, f64 avg, 4096 elements per piece (received 8 ranks at a time");
    // 16-bit floats fold f32 partials (their accumulator takes two strides)
    // and round once, as the one pass does.
    staged_job(&srv.addr, 0x57a4, 48, DataType::Bfloat16, ReduceOp::Sum, 40_001, 2);
    assert_started(&srv, "48 ranks, bf16 sum, 16384 elements per piece (received 8 ranks at a time");
    staged_job(&srv.addr, 0x57a5, 48, DataType::Float16, ReduceOp::Avg, 20_000, 2);
    assert_started(&srv, "48 ranks, f16 avg, 16384 elements per piece (received 8 ranks at a time");
    // The load generator's own check, for the other operations and integer types.
    for (dtype, op) in [("i32", "max"), ("f32", "prod"), ("u64", "min"), ("i8", "sum"), ("bf16", "max")] {
        bench(
            &srv.addr,
            &[
                "--ranks",
                "48",
                "--ranks-per-process",
                "48",
                "--dtype",
                dtype,
                "--op",
                op,
                "--sizes",
                "256K",
                "--chunk",
                "32K",
                "--window",
                "2",
                "--iters",
                "3",
                "--warmup",
                "1",
            ],
        );
    }
    // With staging off, the same job gets smaller pieces instead.
    let plain = staging_server("4M", "0");
    staged_job(&plain.addr, 0x57a3, 48, DataType::Float32, ReduceOp::Sum, 40_000, 1);
    assert_started(&plain, "48 ranks, f32 sum, 2720 elements per piece (asked 8192");
    assert!(srv.stop().success() && plain.stop().success());
}

#[test]
fn a_rank_that_vanishes_from_a_staged_job_fails_that_job_only() {
    // 12 ranks x window 2 x 16 KiB = 384 KiB per lcore, over the 256 KiB a
    // job may take of a 1 MiB slab: staged, 2 ranks a slot at a time.
    let srv = staging_server("1M", "2");
    let other = tally_e2e::sum_job("tcp", &srv.addr, 0x5b0, 2, 20_000, 20);
    let n = 12u32;
    let hs: Vec<_> = (0..n)
        .map(|rank| {
            let cfg = tally_e2e::client("tcp", &srv.addr, 0x5b1, rank, n);
            std::thread::spawn(move || -> Result<Option<(ClientError, Duration)>, String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                c.join(DataType::Float32, ReduceOp::Sum).map_err(|e| e.to_string())?;
                let send = vec![1f32; 40_000];
                let mut out = vec![0f32; 40_000];
                let ar = |c: &mut Client, out: &mut Vec<f32>| {
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(out), DataType::Float32, ReduceOp::Sum)
                };
                ar(&mut c, &mut out).map_err(|e| format!("rank {rank}, first all-reduce: {e}"))?;
                if let Some(i) = out.iter().position(|&v| v != n as f32) {
                    return Err(format!("rank {rank}: element {i} = {}", out[i]));
                }
                if rank == 9 {
                    // Rank 9, past the buffers a slot posts first, leaves
                    // without a word (no Bye: as if its process died) while
                    // the others start the next one.
                    std::thread::sleep(Duration::from_millis(200));
                    c.abort();
                    return Ok(None);
                }
                let t = Instant::now();
                match ar(&mut c, &mut out) {
                    Ok(()) => Err(format!("rank {rank}: an all-reduce without rank 9 completed")),
                    Err(e) => Ok(Some((e, t.elapsed()))),
                }
            })
        })
        .collect();
    for (rank, h) in hs.into_iter().enumerate() {
        match h.join().expect("rank thread").unwrap() {
            None => assert_eq!(rank, 9),
            Some((e, took)) => {
                assert!(matches!(&e, ClientError::Refused { reject, .. } if reject.contains("rank 9")), "rank {rank}: {e}");
                assert!(took < Duration::from_secs(5), "rank {rank}: error after {took:?}");
            }
        }
    }
    assert!(srv.wait_log("job 0x5b1 ended", Duration::from_secs(10)), "the staged job was not freed");
    // The job running meanwhile was not touched, and a new staged job is exact.
    tally_e2e::join_all(other);
    tally_e2e::join_all(tally_e2e::sum_job("tcp", &srv.addr, 0x5b2, 12, 40_000, 3));
    assert_started(&srv, "12 ranks, f32 sum, 4096 elements per piece (received 2 ranks at a time");
    assert!(srv.stop().success());
}
