//! Failover against real `tally server` processes: a server SIGKILLed under
//! a running job. Every rank notices, they agree through a surviving
//! server on what to redo, the interrupted all-reduces are redone on the
//! survivors, and the loop goes on there: no operation fails, every
//! element of every all-reduce is right (the redo is bit-identical).
//!
//! - three servers, three ranks looping over 4 KiB - 1 MiB all-reduces:
//!   SIGKILL one mid-run (tcp; with two sub-jobs; with two lcores per
//!   server; 12 ranks under a staged job); the time from the kill to rank 0's next completed
//!   all-reduce is printed (the target: 2 s over tcp);
//! - two of three servers killed one after the other: the job ends up on
//!   the last one, still right;
//! - the killed server restarted on its port: the job takes it back at an
//!   operation boundary all ranks agree on (rejoin) and runs on all three
//!   again (the restarted server ends the job cleanly at the loop's end);
//!   killed and restarted six times over, the ranks hold no more streams
//!   and staging than at the start; a rejoin two ranks put off and the
//!   server fails is tried again by every rank, and the rank that had
//!   come goes on meanwhile;
//! - every server killed: each rank fails with an error saying no server
//!   is left, and nothing hangs;
//! - with failover off (TALLY_FAILOVER=0 / `ClientConfig::failover`) a kill
//!   fails the job as before; over shm failover is always off (checked
//!   without a kill: see the test).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally_e2e::jobloop::{loop_job, multi, results, server, server_on, wait_for_round, Shape};
use tally_e2e::ServerProcess;
use tally_engine::client::failover::FailoverStats;
use tally_engine::client::Client;
use tally_engine::reduce::{DataType, ReduceOp};

fn sigkill(s: &mut ServerProcess) {
    let _ = s.child.kill();
    let _ = s.child.wait();
}

/// Waits (bounded) until rank 0 completed a round after `round`; how long that took.
fn next_round_after(progress: &AtomicUsize, round: usize, since: Instant) -> Option<Duration> {
    while since.elapsed() < Duration::from_secs(30) {
        if progress.load(Ordering::Relaxed) > round {
            return Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

fn kill_one_of_three(provider: &str, shape: Shape) {
    kill_one_of_three_with(provider, shape, 3, &[]);
}

/// As [`kill_one_of_three`], with `n` ranks and `extra` server flags.
fn kill_one_of_three_with(provider: &str, shape: Shape, n: u32, extra: &[&str]) {
    kill_server_of_three(provider, shape, n, extra, 1);
}

/// As [`kill_one_of_three_with`], killing server `victim` (the recovery's
/// leader is then the first other one).
fn kill_server_of_three(provider: &str, shape: Shape, n: u32, extra: &[&str], victim: usize) {
    const ROUNDS: usize = 300;
    // An even round is a sum: with `late_news`, rank 0 is past it and in the
    // next round, a max, when the server dies (see the test).
    let kill_at: usize = if shape.late_news != 0 { 61 } else { 60 };
    let lcores: &[&str] = if shape.two_lcores { &["--lcores", "0-1"] } else { &[] };
    let mut servers: Vec<ServerProcess> = (0..3).map(|_| server(provider, &[lcores, extra].concat())).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let ranks = loop_job(provider, &addrs, 0xf1, n, ROUNDS, progress.clone(), shape);
    wait_for_round(&progress, kill_at, &ranks);
    let killed_round = progress.load(Ordering::Relaxed);
    let killed = Instant::now();
    sigkill(&mut servers[victim]);
    let recovered = next_round_after(&progress, killed_round, killed);
    let res = results(ranks);
    let logs: String = servers.iter().map(|s| s.log.lock().unwrap().join("\n")).collect::<Vec<_>>().join("\n---\n");
    eprintln!(
        "FAILOVER ({provider}): SIGKILL at round {killed_round}; kill to rank 0's next completed all-reduce: {:?}; loop {:?}; rank stats {:?}",
        recovered,
        t0.elapsed(),
        res.iter().map(|r| r.as_ref().ok()).collect::<Vec<_>>()
    );
    for r in &res {
        assert!(r.is_ok(), "an operation failed: {r:?}\nservers:\n{logs}");
    }
    for r in res.iter().flatten() {
        assert!(r.recoveries >= 1, "the rank did not recover: {r:?}");
    }
    assert!(recovered.is_some(), "no all-reduce completed after the kill");
    let survivors: Vec<&ServerProcess> = servers.iter().enumerate().filter(|&(i, _)| i != victim).map(|(_, s)| s).collect();
    let lost = format!("every rank reported losing servers {:#x}", 1 << victim);
    assert!(survivors[0].log_contains(&lost), "{logs}");
    assert!(progress.load(Ordering::Relaxed) == ROUNDS);
    for s in survivors {
        assert!(s.wait_log("job 0xf1: every rank finished", Duration::from_secs(5)), "{logs}");
        assert!(!s.log_contains(", relay (pieces"), "{logs}");
        if extra.contains(&"--stage-buffers") {
            // The job and the survivors' redo job, both staged.
            let staged = s.log.lock().unwrap().iter().filter(|l| l.contains("elements per piece (received")).count();
            assert_eq!(staged, 2, "{logs}");
        }
    }
}

#[test]
fn sigkill_one_of_three_servers_mid_loop_every_operation_completes_right_tcp() {
    kill_one_of_three("tcp", Shape::default());
}

#[test]
fn sigkill_one_of_three_servers_under_a_staged_job_tcp() {
    // 12 ranks x window 2 x 64 KiB = 1.5 MiB per lcore, over the 1 MiB a
    // job may take of a 4 MiB slab: staged, 2 ranks a slot at a time. The
    // survivors' redo job (window 4: 3 MiB a piece per rank) is staged too,
    // 768 KiB: a redo job must keep the job's piece, and without staging it
    // would get smaller pieces and be refused by the ranks.
    kill_one_of_three_with("tcp", Shape::default(), 12, &["--slab-size", "4M", "--stage-buffers", "2"]);
}

#[test]
fn sigkill_one_of_three_servers_under_a_two_rank_job_tcp() {
    // Two ranks: a job on several servers is not relayed (the relay is
    // for one server; see ARCHITECTURE "Small all-reduces").
    kill_one_of_three_with("tcp", Shape::default(), 2, &[]);
}

#[test]
fn sigkill_mid_loop_with_two_sub_jobs_tcp() {
    kill_one_of_three("tcp", Shape { mixed: true, ..Shape::default() });
}

#[test]
fn sigkill_mid_loop_with_two_sub_jobs_one_rank_hearing_late_tcp() {
    // Rank 0 hears nothing on the sum job's control connections until a
    // later sub-job's verdict, as when the leader's word of the sum job's
    // recovery is still on its way while the max job's verdict came; it is
    // in a max round when the server dies, the others wait in the sum job's
    // recovery for its report. Taking the max job's verdict first, it
    // waited in that job's redo join for them until both timed out (seen
    // once in CI); it must lose the server in the sum job first.
    kill_one_of_three("tcp", Shape { mixed: true, late_news: 1, ..Shape::default() });
}

#[test]
fn sigkill_one_of_three_servers_with_two_lcores_each_tcp() {
    kill_one_of_three("tcp", Shape { two_lcores: true, ..Shape::default() });
}

#[test]
fn sigkill_one_of_three_servers_under_ranks_with_rails_tcp() {
    // Two rails over three servers: server 0 and 2 share rail 0, server 1
    // (killed) has rail 1 to itself. Results are staged and copied out by
    // the copier (the rails answer the recovery's cancels only once their
    // copies are back); the redo job's Hellos name each survivor's rail.
    kill_one_of_three("tcp", Shape { two_lcores: true, rails: Some(2), copier: true, ..Shape::default() });
}

#[test]
fn sigkill_the_server_on_the_callers_rail_tcp() {
    // Two rails, the first the caller's own (`ClientConfig::caller_rail`):
    // servers 0 (killed) and 2 on the caller's endpoint, server 1 on the
    // rail thread. The recovery cancels the lost server's flights on the
    // caller's endpoint, whose staged results the caller copies out.
    kill_server_of_three("tcp", Shape { two_lcores: true, rails: Some(2), caller_rail: true, ..Shape::default() }, 3, &[], 0);
}

#[test]
fn sigkill_one_of_three_servers_under_large_all_reduces_tcp() {
    // Most results of the 2 MiB rounds go straight into the ranks' buffers
    // (more pieces a stream than a window): the kill lands in one of them
    // about one time in two.
    kill_one_of_three("tcp", Shape { large: true, ..Shape::default() });
}

#[test]
fn sigkill_one_of_three_servers_under_ranks_with_lanes_tcp() {
    // Five rails over three servers of two lcores: servers 0 and 1 have two
    // lanes (rails 0, 3 and 1, 4: a rail per lcore), server 2 one (rail 2).
    // The rails copy staged results themselves. The redo job's Hellos name
    // each survivor's lane 0.
    kill_one_of_three("tcp", Shape { two_lcores: true, rails: Some(5), ..Shape::default() });
}

/// A server dies after one rank got a result and completed its
/// all-reduce, before another got it (here forced: rank 1 drops server 1's
/// results from operation 30 on). Rank 0 gave its buffer back long ago, so
/// only its staged copy is left: the recovery relays it (through a Sum
/// with -0.0 from the others) and rank 1 gets exactly that result.
#[test]
fn a_result_one_rank_lacks_is_relayed_from_a_rank_that_has_it() {
    relay_what_one_rank_lacks(false);
}

/// As above, in a 2 MiB all-reduce: rank 0 holds the first window of server
/// 1's results (later pieces of the same all-reduce follow on that stream)
/// and is still inside that all-reduce, waiting for the pieces rank 1's
/// stall holds back. The recovery relays them from rank 0's staging slots.
#[test]
fn a_result_of_an_all_reduce_in_progress_that_one_rank_lacks_is_relayed() {
    relay_what_one_rank_lacks(true);
}

/// `large`: 2 MiB rounds too, not only the small ones.
fn relay_what_one_rank_lacks(large: bool) {
    let mut servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let shape = Shape { drop_results: Some((1, 1, 30)), large, ..Shape::default() };
    let ranks = loop_job("tcp", &addrs, 0xf5, 3, 80, progress.clone(), shape);
    // Rank 1 waits in the first operation from 30 on with a piece on server
    // 1, for the result it dropped; rank 0 completed that one and waits in
    // the next for rank 1. Wait until the loop stands still.
    wait_for_round(&progress, 30, &ranks);
    let mut last = (progress.load(Ordering::Relaxed), Instant::now());
    while last.1.elapsed() < Duration::from_millis(300) {
        std::thread::sleep(Duration::from_millis(20));
        let now = progress.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    assert!(last.0 < 40, "the loop did not stall at operation {}", last.0);
    sigkill(&mut servers[1]);
    let res = results(ranks);
    let logs = servers[0].log.lock().unwrap().join("\n");
    eprintln!("RELAY: {res:?}");
    for r in &res {
        assert!(r.is_ok(), "an operation failed: {r:?}\n{logs}");
    }
    for r in res.iter().flatten() {
        assert_eq!(r.recoveries, 1, "{r:?}");
        assert!(r.relayed >= 1, "nothing was relayed: {r:?}");
        assert!(r.recomputed >= 1, "operation 31 had to be recomputed: {r:?}");
    }
}

#[test]
fn two_servers_killed_one_after_the_other_leave_the_job_on_the_last() {
    let mut servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let ranks = loop_job("tcp", &addrs, 0xf2, 3, 240, progress.clone(), Shape::default());
    wait_for_round(&progress, 40, &ranks);
    let first = progress.load(Ordering::Relaxed);
    sigkill(&mut servers[0]); // the first server: the leader changes too
    assert!(next_round_after(&progress, first, Instant::now()).is_some(), "no progress after the first kill");
    wait_for_round(&progress, first + 60, &ranks);
    let second = progress.load(Ordering::Relaxed);
    sigkill(&mut servers[2]);
    let took = next_round_after(&progress, second, Instant::now());
    let res = results(ranks);
    let logs = servers[1].log.lock().unwrap().join("\n");
    eprintln!("TWO KILLS: at rounds {first} and {second}; second recovery {took:?}; stats {res:?}");
    for r in &res {
        assert!(r.is_ok(), "an operation failed: {r:?}\n{logs}");
    }
    for r in res.iter().flatten() {
        assert_eq!(r.recoveries, 2, "{r:?}");
    }
    assert!(servers[1].wait_log("job 0xf2: every rank finished", Duration::from_secs(5)), "{logs}");
}

#[test]
fn a_killed_server_restarted_on_its_port_is_taken_back_into_the_job() {
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    restarted_server_is_taken_back(0xf6, false, None, 0, &STOP_AT);
}

#[test]
fn a_restarted_server_that_answers_busy_is_taken_back_once_it_has_room() {
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    restarted_server_is_taken_back(0xf7, true, None, 0, &STOP_AT);
}

#[test]
fn a_restarted_server_is_taken_back_by_ranks_with_rails() {
    // Three rails: the rejoin's Hello names the restarted server's rail,
    // whose thread adds the new lcores' addresses.
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    restarted_server_is_taken_back(0xf8, false, Some(3), 0, &STOP_AT);
}

#[test]
fn a_restarted_server_is_taken_back_on_the_callers_rail() {
    // Two rails, the first the caller's own: server 0, killed and
    // restarted, is on the caller's endpoint, which settles the lost
    // streams' receives before the rejoin takes their places.
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    let shape = Shape { rails: Some(2), caller_rail: true, ..Shape::default() };
    restarted_server_of_three_is_taken_back(0xf5, false, shape, 0, &STOP_AT);
}

#[test]
fn a_rejoin_two_ranks_put_off_is_tried_again_and_the_rank_that_came_goes_on() {
    // Ranks 0 and 1 put off their first taking back of the restarted
    // server (as when their provider still holds an operation posted to it
    // before the loss) and let that rejoin go after 5 s; rank 2 came,
    // answered the server's question and held its operations for the
    // switch. The server fails that rejoin: rank 2 cuts what it held
    // without the server, as the others did, and every rank comes again.
    // Before, rank 2 kept its operations held for good (the job stalled),
    // had taken the new streams already, and gave the server up.
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    restarted_server_is_taken_back(0xf9, false, None, 0b011, &STOP_AT);
}

/// Kills one of three servers mid-loop and restarts it on its port. With
/// `storm`, the restarted server takes one handshake per address and a
/// silent connection from the ranks' address holds that place for its 2 s
/// deadline (a reconnect storm in miniature): the ranks' rejoins are told
/// busy, their watchers come back every 0.5 s, and they get in after it.
/// The ranks in mask `put_off` put off their first rejoin (see
/// `ClientConfig::fault_rejoin_put_off`).
fn restarted_server_is_taken_back(job: u64, storm: bool, rails: Option<usize>, put_off: u32, stop_at: &'static AtomicUsize) {
    restarted_server_of_three_is_taken_back(job, storm, Shape { rails, put_off, ..Shape::default() }, 1, stop_at);
}

/// As [`restarted_server_is_taken_back`], with the ranks' `shape` (its
/// rails, put-off and caller's rail) and server `victim` killed and
/// restarted.
fn restarted_server_of_three_is_taken_back(job: u64, storm: bool, shape: Shape, victim: usize, stop_at: &'static AtomicUsize) {
    let mut servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    // The loop runs until the server is taken back and 200 rounds on it (a
    // fixed length once ended, on an idle fast host, within the 2 s the
    // storm holds the restarted server busy, before any rank could rejoin).
    let shape = Shape { pace: Some(Duration::from_millis(4)), stop_at: Some(stop_at), ..shape };
    let ranks = loop_job("tcp", &addrs, job, 3, usize::MAX, progress.clone(), shape);
    wait_for_round(&progress, 40, &ranks);
    sigkill(&mut servers[victim]);
    let killed_round = progress.load(Ordering::Relaxed);
    assert!(next_round_after(&progress, killed_round + 20, Instant::now()).is_some(), "no progress after the kill");
    let t = Instant::now();
    let stormy = ["--max-handshakes-per-source", "1", "--handshake-timeout", "2", "--metrics", "127.0.0.1:0"];
    servers[victim] = server_on(&addrs[victim], "tcp", if storm { &stormy } else { &[] });
    let junk = storm.then(|| std::net::TcpStream::connect(&addrs[victim]).expect("a silent connection"));
    let back = servers[victim].wait_log("rejoined: every rank uses this server again from operation", Duration::from_secs(20));
    if storm {
        let m = tally_e2e::scrape(&servers[victim].metrics_addr());
        let busy = tally_e2e::sum(&m, "tally_control_refusals_total", "reason=\"busy\"");
        eprintln!("REJOIN through a busy server: {busy} rejoin attempts told busy");
        assert!(busy > 0.0, "no rank was told busy: the silent connection did not hold the place");
        drop(junk);
    }
    let took = t.elapsed();
    let rejoin_round = progress.load(Ordering::Relaxed);
    // Rounds on the server taken back, then the ranks stop.
    let rounds = rejoin_round + 200;
    stop_at.store(rounds, Ordering::Relaxed);
    if back {
        wait_for_round(&progress, rounds, &ranks);
    }
    let res = results(ranks);
    let logs = servers[victim].log.lock().unwrap().join("\n");
    eprintln!(
        "REJOIN: killed at round {killed_round}; restarted and taken back after {took:?} (at round {rejoin_round}, stopped at {rounds}); {res:?}"
    );
    assert!(back, "the restarted server was not taken back:\n{logs}");
    for r in &res {
        assert!(r.is_ok(), "an operation failed: {r:?}\n{logs}");
    }
    for r in res.iter().flatten() {
        assert_eq!((r.recoveries, r.rejoins), (1, 1), "{r:?}");
    }
    // It carried the rest of the loop with the others: the job ends cleanly there.
    assert!(servers[victim].wait_log(&format!("job {job:#x}: every rank finished"), Duration::from_secs(5)), "{logs}");
}

/// Issue 55: a server of two killed and restarted [`CYCLES`] times under a
/// running job. Every cycle is a recovery and a rejoin, every element
/// right, and the ranks end holding what they held at the start: the
/// restarted server's streams take the places (and the staging slots) of
/// the ones it lost, rather than being added beside them (before, each
/// rejoin added a stream and its 2 x window staging slots: +6 streams here).
#[test]
fn a_server_killed_and_taken_back_again_and_again_costs_the_ranks_nothing_more() {
    const CYCLES: u32 = 6;
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    let mut servers: Vec<ServerProcess> = (0..2).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let shape = Shape { pace: Some(Duration::from_millis(2)), stop_at: Some(&STOP_AT), ..Shape::default() };
    let ranks = loop_job("tcp", &addrs, 0xfb, 2, usize::MAX, progress.clone(), shape);
    wait_for_round(&progress, 20, &ranks);
    let t0 = Instant::now();
    for cycle in 0..CYCLES {
        sigkill(&mut servers[1]);
        let at = progress.load(Ordering::Relaxed);
        assert!(next_round_after(&progress, at + 5, Instant::now()).is_some(), "cycle {cycle}: no progress after the kill");
        servers[1] = server_on(&addrs[1], "tcp", &[]);
        let back = servers[1].wait_log("rejoined: every rank uses this server again from operation", Duration::from_secs(20));
        let logs = servers[1].log.lock().unwrap().join("\n");
        assert!(back, "cycle {cycle}: the restarted server was not taken back:\n{logs}");
        let at = progress.load(Ordering::Relaxed);
        assert!(next_round_after(&progress, at + 5, Instant::now()).is_some(), "cycle {cycle}: no progress after the rejoin");
    }
    STOP_AT.store(progress.load(Ordering::Relaxed) + 10, Ordering::Relaxed);
    let res = results(ranks);
    eprintln!("REJOIN CYCLES: {CYCLES} kills and rejoins in {:?}; {res:?}", t0.elapsed());
    // One lcore per server: a stream each, and 2 x window slots of a 64 KiB piece each.
    let window = multi("tcp", &addrs, 0, 0, 2).window as u64;
    for r in &res {
        let r = r.as_ref().expect("no operation fails");
        assert_eq!((r.recoveries, r.rejoins), (CYCLES, CYCLES), "{r:?}");
        assert_eq!((r.streams, r.staging_bytes), (2, 2 * 2 * window * (64 << 10)), "what the rank holds grew: {r:?}");
    }
}

#[test]
fn every_server_killed_fails_each_rank_with_a_clear_error_and_no_hang() {
    let mut servers: Vec<ServerProcess> = (0..2).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let ranks = loop_job("tcp", &addrs, 0xf3, 2, 1_000_000, progress.clone(), Shape::default());
    wait_for_round(&progress, 20, &ranks);
    let t = Instant::now();
    for s in &mut servers {
        sigkill(s);
    }
    let res = results(ranks);
    eprintln!("ALL KILLED: ranks ended after {:?}: {res:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(20), "the ranks took {:?} to give up", t.elapsed());
    for r in &res {
        let e = r.as_ref().expect_err("an all-reduce cannot complete with no server");
        // Which words depend on whether the two losses were noticed at once
        // or the second during the recovery from the first.
        let clear = ["no server left", "recovery of job 0xf3", "a second loss during a recovery is not recovered"];
        assert!(clear.iter().any(|c| e.contains(c)), "unclear error: {e}");
    }
}

#[test]
fn with_failover_off_a_kill_fails_the_job_tcp() {
    failover_off_fails("tcp", false);
}

/// shm completes a rank's sends in order (one the dead server never took
/// blocks the rest), so failover is off there whatever the setting; over
/// tcp it is on. (Checked without a kill: shm 1.17 can spin forever inside
/// a call when a peer dies mid-transfer, which no client can interrupt.)
#[test]
fn failover_is_on_over_tcp_and_off_over_shm() {
    for (provider, want) in [("tcp", true), ("shm", false)] {
        let servers: Vec<ServerProcess> = (0..2).map(|_| server(provider, &[])).collect();
        let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
        let hs: Vec<_> = (0..2u32)
            .map(|rank| {
                let cfg = multi(provider, &addrs, 0xf7, rank, 2);
                std::thread::spawn(move || -> Result<bool, String> {
                    let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                    let mut buf = vec![1f32; 4096];
                    c.allreduce_in_place(bytemuck::cast_slice_mut(&mut buf), DataType::Float32, ReduceOp::Sum)
                        .map_err(|e| e.to_string())?;
                    assert!(buf.iter().all(|&v| v == 2.0));
                    Ok(c.can_fail_over())
                })
            })
            .collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), Ok(want), "{provider}");
        }
    }
}

/// Under failover every result goes through the staging area, large or
/// small, in place or not: none is received straight into the caller's
/// buffer, where a receive the provider cannot cancel (a piece half
/// received when its link was cut) could write after the all-reduce
/// returned (`failover`'s module doc; `linkcut.rs` shows it). Every
/// element of every one is checked.
#[test]
fn under_failover_every_result_goes_through_the_staging_area() {
    let servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let hs: Vec<_> = (0..2u32)
        .map(|rank| {
            let cfg = multi("tcp", &addrs, 0xf8, rank, 2);
            std::thread::spawn(move || -> Result<Vec<FailoverStats>, String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                let mut seen = Vec::new();
                // 4 MiB + 12 bytes (65 pieces of 64 KiB, the last of 12 bytes), then 64 KiB.
                for elems in [(1 << 20) + 3, 1 << 14] {
                    let input: Vec<f32> = (0..elems).map(|i| (i % 1000) as f32 + rank as f32).collect();
                    let want = |i: usize| 2.0 * (i % 1000) as f32 + 1.0;
                    let mut out = vec![0f32; elems];
                    for _ in 0..3 {
                        out.fill(0.0);
                        c.allreduce(bytemuck::cast_slice(&input), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                            .map_err(|e| e.to_string())?;
                        if let Some(i) = (0..elems).find(|&i| out[i] != want(i)) {
                            return Err(format!("{elems} elements out of place: element {i} is {}, not {}", out[i], want(i)));
                        }
                    }
                    seen.push(c.failover_stats());
                    let mut buf = input.clone();
                    c.allreduce_in_place(bytemuck::cast_slice_mut(&mut buf), DataType::Float32, ReduceOp::Sum)
                        .map_err(|e| e.to_string())?;
                    if let Some(i) = (0..elems).find(|&i| buf[i] != want(i)) {
                        return Err(format!("{elems} elements in place: element {i} is {}, not {}", buf[i], want(i)));
                    }
                    seen.push(c.failover_stats());
                }
                Ok(seen)
            })
        })
        .collect();
    for h in hs {
        let seen = h.join().unwrap().unwrap();
        let [large, large_in_place, small, small_in_place] = seen[..] else { panic!("{seen:?}") };
        assert_eq!(large.staged, 3 * 65, "three 4 MiB all-reduces out of place: {large:?}");
        assert_eq!(large_in_place.staged, 4 * 65, "and one in place: {large_in_place:?}");
        assert!(small.staged >= large_in_place.staged + 3, "three of 64 KiB: {small:?}");
        assert!(small_in_place.staged > small.staged, "and one in place: {small_in_place:?}");
    }
}

/// `TALLY_PIECE_TIMES` (`ClientConfig::piece_times`): a rank times one
/// piece in 16 from its send to its result, and the copies of staged
/// results by its copier thread (the default with rails), on its rails
/// (`copier` off) or (one endpoint, or the caller's rail) on its own
/// thread, and rail threads their turns' busy share; every result
/// of a 64 KiB all-reduce is staged with failover on. With failover off
/// nothing is copied, and unset the report is None. Every element is checked.
#[test]
fn piece_times_count_round_trips_and_the_copies_of_staged_results() {
    let servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    // (job, failover, timed, rails, copier, caller's rail): one rail is one
    // endpoint on the caller's thread, which copies; copier off: the rails
    // copy (and the caller, what its own rail received).
    for (job, failover, timed, rails, copier, caller_rail) in [
        (0xf9u64, true, true, 3, true, false),
        (0xfa, false, true, 3, true, false),
        (0xfb, true, false, 3, true, false),
        (0xfc, true, true, 1, true, false),
        (0xfe, true, true, 3, false, false),
        (0xf4, true, true, 3, false, true),
    ] {
        let hs: Vec<_> = (0..2u32)
            .map(|rank| {
                let mut cfg = multi("tcp", &addrs, job, rank, 2);
                cfg.rails = rails;
                cfg.failover = failover;
                cfg.piece_times = timed;
                cfg.copier = copier;
                cfg.caller_rail = caller_rail;
                std::thread::spawn(move || -> Result<_, String> {
                    let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                    let input: Vec<f32> = (0..16384).map(|i| (i % 100) as f32 + rank as f32).collect();
                    let mut out = vec![0f32; input.len()];
                    for _ in 0..40 {
                        out.fill(0.0);
                        c.allreduce(bytemuck::cast_slice(&input), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                            .map_err(|e| e.to_string())?;
                        if let Some(i) = (0..out.len()).find(|&i| out[i] != 2.0 * (i % 100) as f32 + 1.0) {
                            return Err(format!("element {i} is {}", out[i]));
                        }
                    }
                    Ok((c.piece_times(), c.failover_stats()))
                })
            })
            .collect();
        for h in hs {
            let (report, stats) = h.join().unwrap().unwrap();
            let Some(r) = report else {
                assert!(!timed, "timed, yet no report");
                continue;
            };
            assert!(timed, "a report though not timed: {r}");
            assert!(r.sampled > 0 && r.p50 > Duration::ZERO && r.mean > Duration::ZERO && r.p99 >= r.p50, "{r}");
            match r.rail_busy {
                // Rails that carried 40 all-reduces had busy turns, and no
                // share is above the whole.
                Some((mean, max)) => assert!(rails > 1 && mean > 0.0 && mean <= max && max <= 1.0, "{rails} rails: {r}"),
                None => assert_eq!(rails, 1, "rail threads time their turns: {r}"),
            }
            if failover {
                assert!(stats.staged > 0, "64 KiB stages its results: {stats:?}");
                assert_eq!(r.copies, stats.staged, "every staged result was copied out and timed ({rails} rails): {r}");
                assert!(r.copy_mean > Duration::ZERO, "{r}");
                // The copier takes every copy (a rail copies itself only
                // with 1024 of its results out with the copier).
                let by_copier = (rails > 1 && copier).then_some(r.copies);
                assert_eq!(r.by_copier, by_copier, "{rails} rails, copier {copier}: {r}");
                // The caller's thread copies what its endpoint received:
                // all with one rail, rail 0's share with the caller's rail
                // (one server of three), none with rail threads only.
                match (rails, caller_rail) {
                    (1, _) => assert_eq!(r.by_caller, r.copies, "{r}"),
                    (_, true) => assert!(r.by_caller > 0 && r.by_caller < r.copies, "the caller copies rail 0's results: {r}"),
                    _ => assert_eq!(r.by_caller, 0, "{r}"),
                }
            } else {
                assert_eq!((r.copies, stats.staged, r.by_copier), (0, 0, None), "failover off copies nothing, and runs no copier: {r}");
            }
        }
    }
}

/// `tally bench allreduce --agg-in-flight 4` over three servers, failover
/// on: 9 MiB, 1 MiB + 12 bytes and small all-reduces, four
/// in flight at once, each into a result buffer of its own; the bench checks
/// every element of every buffer (`tally_e2e::bench` asserts none wrong).
#[test]
fn overlapping_all_reduces_through_the_bench_are_right_large_or_small() {
    let servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs = servers.iter().map(|s| s.addr.clone()).collect::<Vec<_>>().join(",");
    let sizes = format!("4K,{},9M", (1 << 20) + 12);
    let rows = tally_e2e::bench(&addrs, &["--ranks", "2", "--agg-in-flight", "4", "--sizes", &sizes, "--iters", "6", "--warmup", "1"]);
    assert_eq!(rows.len(), 3, "{rows:?}");
    for r in &rows {
        assert_eq!(r["method"], "back-to-back, 4 in flight", "{r}");
        assert_eq!(r["iters"], 6, "{r}");
    }
}

/// Failover is part of the job's spec (`JobSpec::failover`, the Hello's
/// `FAILOVER` flag): ranks that disagree on it are refused at the join,
/// naming the field, instead of one rank leaving a recovery waiting for it.
#[test]
fn ranks_that_disagree_on_failover_are_refused_at_the_join() {
    let servers: Vec<ServerProcess> = (0..2).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let hs: Vec<_> = (0..2u32)
        .map(|rank| {
            let mut cfg = multi("tcp", &addrs, 0xf9, rank, 2);
            cfg.failover = rank == 0;
            cfg.join_timeout = Duration::from_secs(3);
            if rank == 1 {
                // Rank 0's Hellos first, so that rank 1 is the one refused.
                std::thread::sleep(Duration::from_millis(300));
            }
            std::thread::spawn(move || -> Result<(), String> {
                // Sub-jobs are joined at their first all-reduce.
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                let mut buf = vec![1f32; 1024];
                c.allreduce_in_place(bytemuck::cast_slice_mut(&mut buf), DataType::Float32, ReduceOp::Sum).map_err(|e| e.to_string())
            })
        })
        .collect();
    let res: Vec<Result<(), String>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let refused = res[1].as_ref().expect_err("rank 1 joined a job whose other rank fails over");
    assert!(refused.contains("failover") && refused.contains("TALLY_FAILOVER"), "{refused}");
    assert!(res[0].is_err(), "rank 0 joined alone");
}

fn failover_off_fails(provider: &'static str, failover: bool) {
    assert_eq!(provider, "tcp", "a kill under shm can leave a rank spinning inside the provider");
    let mut servers: Vec<ServerProcess> = (0..2).map(|_| server(provider, &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let hs: Vec<_> = (0..2u32)
        .map(|rank| {
            let mut cfg = multi(provider, &addrs, 0xf4, rank, 2);
            cfg.failover = failover;
            std::thread::spawn(move || -> Result<(), String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                let mut buf = vec![1f32; 1 << 14];
                for _ in 0..1_000_000 {
                    c.allreduce_in_place(bytemuck::cast_slice_mut(&mut buf), DataType::Float32, ReduceOp::Max)
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    sigkill(&mut servers[0]);
    for h in hs {
        let e = h.join().unwrap().expect_err("the job must fail");
        assert!(e.contains("closed the job's connection") || e.contains("job failed") || e.contains("fabric"), "{e}");
    }
}
