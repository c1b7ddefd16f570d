//! Server-side time limits, against a real `tally server` process over
//! tcp;ofi_rxm on loopback:
//! - a straggler: one rank joins but never sends; the others wait up to the
//!   server's op timeout, then every rank gets an error naming the straggler;
//! - an idle job: a job that moves no bytes for the idle timeout is ended
//!   and its slots freed; its ranks hear why on their next call;
//! - a rank that finishes early: it says Bye while the others start another
//!   all-reduce; they fail at once (not at the op timeout), naming it;
//! - after any of these, a new job on the same server succeeds.
//!
//! The bounds asserted are loose (the box may be busy) but finite: a hang or
//! a missing error fails the test.

use std::sync::mpsc;
use std::time::{Duration, Instant};
use tally_e2e::{client, join_all, sum_job, ServerProcess};
use tally_engine::client::Client;
use tally_engine::reduce::{DataType, ReduceOp};

const PROVIDER: &str = "tcp";

fn server(extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--lcores", "0-1", "--provider", PROVIDER, "--poll", "adaptive", "--slab-size", "32M"];
    args.extend_from_slice(extra);
    ServerProcess::start(&args)
}

#[test]
fn a_straggler_fails_its_job_after_the_op_timeout_naming_the_rank() {
    let srv = server(&["--op-timeout", "2"]);
    let addr = srv.addr.clone();
    let job = 0x5742_0001;
    // Rank 1 joins (the join is collective) and then sends nothing until it
    // hears from the server; rank 0 starts an all-reduce and must error.
    let (joined_tx, joined_rx) = mpsc::channel();
    let straggler = {
        let cfg = client(PROVIDER, &addr, job, 1, 2);
        std::thread::spawn(move || -> Result<String, String> {
            let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
            c.join(DataType::Float32, ReduceOp::Sum).map_err(|e| e.to_string())?;
            joined_tx.send(()).unwrap();
            // Stay silent well past the op timeout, then try: the job is gone.
            std::thread::sleep(Duration::from_secs(6));
            let mut buf = vec![0u8; 4096];
            match c.allreduce_in_place(&mut buf, DataType::Float32, ReduceOp::Sum) {
                Ok(()) => Err("the straggler's late all-reduce succeeded on an ended job".into()),
                Err(e) => Ok(e.to_string()),
            }
        })
    };
    let mut c = Client::connect(client(PROVIDER, &addr, job, 0, 2)).unwrap();
    c.join(DataType::Float32, ReduceOp::Sum).unwrap();
    joined_rx.recv_timeout(Duration::from_secs(30)).expect("rank 1 joined");
    let send = vec![1.0f32; 100_000];
    let mut out = vec![0f32; send.len()];
    let t0 = Instant::now();
    let err = c
        .allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
        .expect_err("an all-reduce with a silent rank must fail");
    let waited = t0.elapsed();
    let msg = err.to_string();
    eprintln!("straggler: rank 0 got an error after {waited:.2?}: {msg}");
    assert!(msg.contains("straggler") && msg.contains("rank 1"), "error does not name the straggler: {msg}");
    assert!(waited >= Duration::from_millis(1900), "failed before the op timeout: {waited:?}");
    assert!(waited < Duration::from_secs(15), "took {waited:?} (op timeout 2 s)");
    assert!(srv.wait_log("straggler: rank 1", Duration::from_secs(5)), "server did not log the straggler");
    let late = straggler.join().unwrap().unwrap();
    eprintln!("straggler: rank 1's late call: {late}");
    drop(c);
    // The job's slots are free again: a new job runs to the end, verified.
    assert!(srv.wait_log(&format!("job {job:#x} ended"), Duration::from_secs(10)), "the failed job was not freed");
    join_all(sum_job(PROVIDER, &addr, 0x5742_0002, 2, 50_000, 3));
}

/// A split job (4 ranks over 2 lcores, small all-reduces split by rank):
/// first rank 3 is silent, so lcore 1's group is incomplete and lcore 1
/// names it; then ranks 2 and 3 both are, so lcore 1 sees nothing and
/// lcore 0, whose group is complete, gives up waiting for the other group.
/// Either way every sending rank gets an error within bounds, and a new
/// split job afterwards is exact.
#[test]
fn a_straggler_of_a_split_job_fails_it_from_either_lcore() {
    let srv = server(&["--op-timeout", "2"]);
    let addr = srv.addr.clone();
    for (k, silent) in [vec![3u32], vec![2, 3]].into_iter().enumerate() {
        let job = 0x5742_0020 + k as u64;
        let hs: Vec<_> = (0..4u32)
            .map(|rank| {
                let cfg = client(PROVIDER, &addr, job, rank, 4);
                let quiet = silent.contains(&rank);
                std::thread::spawn(move || -> Result<Option<(String, Duration)>, String> {
                    let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                    c.join(DataType::Float32, ReduceOp::Sum).map_err(|e| e.to_string())?;
                    if quiet {
                        std::thread::sleep(Duration::from_secs(5));
                        return Ok(None);
                    }
                    let mut buf = vec![0u8; 4096];
                    let t = Instant::now();
                    match c.allreduce_in_place(&mut buf, DataType::Float32, ReduceOp::Sum) {
                        Ok(()) => Err(format!("rank {rank}: an all-reduce without the silent ranks completed")),
                        Err(e) => Ok(Some((e.to_string(), t.elapsed()))),
                    }
                })
            })
            .collect();
        for (rank, h) in hs.into_iter().enumerate() {
            let Some((e, took)) = h.join().expect("rank thread").unwrap() else { continue };
            eprintln!("silent {silent:?}: rank {rank} after {took:.2?}: {e}");
            assert!(e.contains("straggler"), "rank {rank}: {e}");
            assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(15), "rank {rank}: error after {took:?}");
        }
        let said = match k {
            0 => "straggler: rank 3 sent nothing for slot".to_string(),
            _ => "the other lcores' groups of ranks did not all send".to_string(),
        };
        assert!(srv.wait_log(&said, Duration::from_secs(5)), "the server did not log: {said}");
        assert!(srv.wait_log(&format!("job {job:#x} ended"), Duration::from_secs(10)), "the failed job was not freed");
    }
    assert!(srv.log_contains("split (pieces of at most 4096 bytes by rank over 2 lcores)"));
    let ok: Vec<_> = (0..4u32)
        .map(|rank| {
            let cfg = client(PROVIDER, &addr, 0x5742_0029, rank, 4);
            std::thread::spawn(move || -> Result<(), String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                for round in 0..50u32 {
                    let mut buf: Vec<f32> = (0..1000).map(|i| (rank * 1000 + i + round) as f32).collect();
                    c.allreduce_in_place(bytemuck::cast_slice_mut(&mut buf), DataType::Float32, ReduceOp::Sum)
                        .map_err(|e| e.to_string())?;
                    for (i, v) in buf.iter().enumerate() {
                        let want = (0..4).map(|r| (r * 1000 + i as u32 + round) as f32).sum::<f32>();
                        if *v != want {
                            return Err(format!("rank {rank} round {round}: element {i} is {v}, not {want}"));
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    join_all(ok);
    assert!(srv.stop().success());
}

#[test]
fn a_rank_that_finishes_early_fails_the_next_all_reduce_at_once_naming_it() {
    // A 30 s op timeout: the error must come from the Bye, long before.
    let srv = server(&["--op-timeout", "30"]);
    let addr = srv.addr.clone();
    let other = sum_job(PROVIDER, &addr, 0x5742_0010, 2, 50_000, 30);
    let (n, job) = (3u32, 0x5742_0011);
    let hs: Vec<_> = (0..n)
        .map(|rank| {
            let cfg = client(PROVIDER, &addr, job, rank, n);
            std::thread::spawn(move || -> Result<Option<(String, Duration)>, String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                let send = vec![1.0f32; 300_000];
                let mut out = vec![0f32; send.len()];
                let mut ar = |c: &mut Client| {
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                };
                // Rank 2 runs 3 all-reduces, the others 4: a common bug (a
                // loop bound that differs between ranks).
                for i in 0..3 {
                    ar(&mut c).map_err(|e| format!("rank {rank}, all-reduce {i}: {e}"))?;
                }
                if rank == 2 {
                    drop(c); // a clean finish: it says Bye
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(300));
                let t = Instant::now();
                match ar(&mut c) {
                    Ok(()) => Err(format!("rank {rank}: an all-reduce without rank 2 completed")),
                    Err(e) => Ok(Some((e.to_string(), t.elapsed()))),
                }
            })
        })
        .collect();
    for (rank, h) in hs.into_iter().enumerate() {
        match h.join().expect("rank thread").unwrap() {
            None => assert_eq!(rank, 2),
            Some((e, took)) => {
                assert!(e.contains("rank 2 finished"), "rank {rank}: {e}");
                assert!(took < Duration::from_secs(5), "rank {rank}: error after {took:?}");
            }
        }
    }
    assert!(srv.wait_log("rank 2 finished (said Bye)", Duration::from_secs(5)), "the server did not log why");
    // The job beside it was not touched; a new job runs.
    join_all(other);
    join_all(sum_job(PROVIDER, &addr, 0x5742_0012, 3, 50_000, 3));
    assert!(srv.stop().success());
}

#[test]
fn an_idle_job_is_ended_and_its_ranks_told_why() {
    let srv = server(&["--idle-timeout", "2"]);
    let addr = srv.addr.clone();
    let job = 0x1d1e_0001;
    let ranks: Vec<_> = (0..2u32)
        .map(|rank| {
            let cfg = client(PROVIDER, &addr, job, rank, 2);
            std::thread::spawn(move || -> Result<String, String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                let mut buf = vec![0u8; 64 << 10];
                // One all-reduce works; then the job idles past the limit.
                c.allreduce_in_place(&mut buf, DataType::Float32, ReduceOp::Sum).map_err(|e| format!("first all-reduce: {e}"))?;
                std::thread::sleep(Duration::from_secs(6));
                match c.allreduce_in_place(&mut buf, DataType::Float32, ReduceOp::Sum) {
                    Ok(()) => Err("an all-reduce on a job ended for idling succeeded".into()),
                    Err(e) => Ok(e.to_string()),
                }
            })
        })
        .collect();
    assert!(srv.wait_log("no traffic for 2s", Duration::from_secs(20)), "server did not end the idle job");
    for (rank, h) in ranks.into_iter().enumerate() {
        let msg = h.join().unwrap().unwrap();
        eprintln!("idle: rank {rank}: {msg}");
        assert!(msg.contains("no traffic"), "rank {rank} was not told the job idled out: {msg}");
    }
    assert!(srv.wait_log(&format!("job {job:#x} ended"), Duration::from_secs(10)), "the idle job was not freed");
    // A job that pauses for less than the limit between all-reduces, for
    // longer than the limit in all, is not idle: it runs through.
    let paced: Vec<_> = (0..2u32)
        .map(|rank| {
            let cfg = client(PROVIDER, &addr, 0x1d1e_0002, rank, 2);
            std::thread::spawn(move || -> Result<(), String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                for round in 0..8 {
                    let send = vec![(rank + round) as f32; 10_000];
                    let mut out = vec![0f32; send.len()];
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                        .map_err(|e| format!("rank {rank} round {round}: {e}"))?;
                    let want = (2 * round + 1) as f32;
                    if let Some(i) = out.iter().position(|v| *v != want) {
                        return Err(format!("rank {rank} round {round}: element {i} = {}, want {want}", out[i]));
                    }
                    std::thread::sleep(Duration::from_millis(600));
                }
                Ok(())
            })
        })
        .collect();
    join_all(paced);
    join_all(sum_job(PROVIDER, &addr, 0x1d1e_0003, 2, 50_000, 3));
}

/// Reads what the server says on a raw control connection (a Reject), or
/// "closed" if it closes without a word.
fn answer(s: &mut std::net::TcpStream) -> String {
    match tally_e2e::reject_after_any_challenge(s) {
        Ok(r) => r.to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => format!("unreadable answer: {e}"),
        Err(_) => "closed".into(),
    }
}

#[test]
fn silent_connections_cost_bounded_time_and_a_flood_is_refused() {
    // Long enough that every connection below is still in its handshake
    // when the last one arrives (connects past the listen backlog may wait
    // a SYN retry, about a second).
    let max = 64;
    let srv = server(&["--handshake-timeout", "5", "--max-handshakes-per-source", &max.to_string()]);
    let addr = srv.addr.clone();
    // More silent connections than the server admits to a handshake at once
    // from one address (tests/storm.rs has the storms from several).
    let t0 = Instant::now();
    let mut conns: Vec<std::net::TcpStream> = (0..max + 40)
        .map(|_| {
            let s = std::net::TcpStream::connect(&addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s
        })
        .collect();
    let answers: Vec<String> = conns.iter_mut().map(answer).collect();
    let waited = t0.elapsed();
    let busy = answers.iter().filter(|a| a.starts_with("busy")).count();
    let timed_out = answers.iter().filter(|a| a.starts_with("timeout")).count();
    eprintln!("flood: {} connections: {busy} refused busy, {timed_out} timed out, all answered in {waited:.2?}", answers.len());
    assert!(busy >= 40, "expected at least 40 busy refusals past {max}: {busy}");
    assert_eq!(busy + timed_out, answers.len(), "every connection gets a reject: {:?}", &answers[..4]);
    assert!(waited < Duration::from_secs(20), "silent connections held for {waited:?} (handshake timeout 5 s)");
    drop(conns);
    // The server still serves.
    join_all(sum_job(PROVIDER, &addr, 0xf100_0001, 2, 30_000, 2));
}
