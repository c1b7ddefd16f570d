//! Gray failures against real `tally server` processes: a server that stops
//! making progress while its connections stay open. Every rank runs a loop
//! of verified all-reduces (every element checked) over three servers on
//! tcp;ofi_rxm; one server is frozen (SIGSTOP) for longer than the ranks'
//! liveness time, then resumed (SIGCONT):
//!
//! - the ranks declare it lost from its missing heartbeats and fail over to
//!   the other two: the loop never stands still for much longer than the
//!   liveness time (default 2 s), where without heartbeats it stood still
//!   for the whole stop;
//! - resumed, the server is fenced (its stale job ended: by the ranks'
//!   closed connections, or by their rejoin Hellos, whichever it reads
//!   first) and taken back into the job at an operation boundary;
//! - no operation fails, no element is wrong;
//! - two servers frozen one after the other and resumed at once are both
//!   taken back, at the same switch, and every element stays right.
//!
//! Link cuts (a server's switch port set down in network namespaces, then
//! up) are in `tests/suites/linkcut.rs`; the same two through the plugin's
//! CollNet in `ffi-plugin/tests/plugin_drain.rs`. Each test prints one `GRAYFAIL` line with
//! its figures (see them with `--nocapture`).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally_e2e::jobloop::{check_gray_outcome, loop_job, results, server, GrayOutcome, Shape, StallMeter};
use tally_e2e::ServerProcess;

fn signal(s: &ServerProcess, sig: i32) {
    // SAFETY: signalling our own child process, not yet reaped.
    unsafe { libc::kill(s.child.id() as i32, sig) };
}

/// Freeze for this long: well past the liveness time (2 s), so a loop that
/// waited the stop out would show it.
const STOP_FOR: Duration = Duration::from_secs(8);
/// The longest the loop may stand still: the liveness time, a recovery and
/// slack for a loaded 2-core machine; well under [`STOP_FOR`].
const STALL_BOUND: Duration = Duration::from_millis(5500);

/// Rounds the ranks run on the server once it is taken back: enough to
/// show the job uses it again, then they stop (as linkcut's do).
const USED_FOR: usize = 200;

#[test]
fn a_sigstopped_server_is_declared_lost_then_fenced_and_taken_back_tcp() {
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    sigstop_one_of_three(0x9f1, None, &STOP_AT);
}

#[test]
fn a_sigstopped_server_is_declared_lost_by_ranks_with_rails_tcp() {
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    sigstop_one_of_three(0x9f2, Some(3), &STOP_AT);
}

fn sigstop_one_of_three(job: u64, rails: Option<usize>, stop_at: &'static AtomicUsize) {
    let servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    // A piece half sent when the server stops is sent whole once it runs
    // again: into no buffer given back (`Shape::keep`).
    let keep = Some((36, 48));
    let shape = Shape { pace: Some(Duration::from_millis(4)), rails, keep, stop_at: Some(stop_at), ..Shape::default() };
    let ranks = loop_job("tcp", &addrs, job, 3, usize::MAX, progress.clone(), shape);
    tally_e2e::jobloop::wait_for_round(&progress, 40, &ranks);
    let meter = StallMeter::start(progress.clone());
    let stopped_round = progress.load(Ordering::Relaxed);
    signal(&servers[1], libc::SIGSTOP);
    std::thread::sleep(STOP_FOR);
    let during = progress.load(Ordering::Relaxed) - stopped_round;
    signal(&servers[1], libc::SIGCONT);
    let resumed = Instant::now();
    let back = servers[1].wait_log("rejoined: every rank uses this server again from operation", Duration::from_secs(20));
    let took = resumed.elapsed();
    let back_round = progress.load(Ordering::Relaxed);
    let rounds = back_round + USED_FOR;
    stop_at.store(rounds, Ordering::Relaxed);
    tally_e2e::jobloop::wait_for_round(&progress, rounds, &ranks);
    let worst = meter.stop();
    let res = results(ranks);
    let fenced = if servers[1].log_contains("fencing the stale job") { "by a rejoin Hello" } else { "by the closed connections" };
    eprintln!(
        "GRAYFAIL sigstop (rails {rails:?}): server stopped {STOP_FOR:?} at round {stopped_round}; {during} rounds done while stopped; \
         longest stall {worst:?}; resumed to taken back {took:?} (round {back_round}, stopped at {rounds}); stale job fenced {fenced}; {res:?}"
    );
    let o = GrayOutcome { back, during, worst, back_round, rounds };
    check_gray_outcome(&o, &res, &servers[1], job, STALL_BOUND);
}

/// Issue 55: servers frozen past the liveness time and resumed, one after
/// another under a running job (servers 1, 2, 1 of three). Every freeze is
/// one recovery and one rejoin of the same process, and only of the server
/// frozen: the recovery's leader forgets a lost set once its round is over
/// (kept, the next freeze had every rank lose the servers taken back
/// before it once more: on the device's soak each fault cost a rejoin per
/// earlier one). Each rejoin gets places of its own (`failover::rejoin`'s
/// `take_back` says why: a stream more per cycle) but not memory of its
/// own: each new place takes the staging slots of a place lost for good
/// once the provider gave their receives back (before, every freeze or
/// cut grew a rank by its staging area).
#[test]
fn servers_frozen_and_taken_back_one_after_another_cost_the_ranks_no_memory() {
    const FROZEN: [usize; 3] = [1, 2, 1];
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    let servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    // Two rails: the lost streams' receives are settled on rail threads, as
    // on a many-core host.
    let shape = Shape { pace: Some(Duration::from_millis(2)), stop_at: Some(&STOP_AT), rails: Some(2), ..Shape::default() };
    let ranks = loop_job("tcp", &addrs, 0x9f5, 2, usize::MAX, progress.clone(), shape);
    tally_e2e::jobloop::wait_for_round(&progress, 20, &ranks);
    let t0 = Instant::now();
    let back_line = "rejoined: every rank uses this server again from operation";
    for (cycle, &si) in FROZEN.iter().enumerate() {
        let before = servers[si].log_count(back_line);
        signal(&servers[si], libc::SIGSTOP);
        // Well past the liveness time (2 s): declared lost, the job goes on.
        std::thread::sleep(Duration::from_secs(5));
        signal(&servers[si], libc::SIGCONT);
        let deadline = Instant::now() + Duration::from_secs(20);
        while servers[si].log_count(back_line) == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let logs = servers[si].log.lock().unwrap().join("\n");
        assert!(servers[si].log_count(back_line) > before, "cycle {cycle}: the resumed server {si} was not taken back:\n{logs}");
        let at = progress.load(Ordering::Relaxed);
        tally_e2e::jobloop::wait_for_round(&progress, at + 20, &ranks);
    }
    STOP_AT.store(progress.load(Ordering::Relaxed) + 10, Ordering::Relaxed);
    let res = results(ranks);
    eprintln!("FROZEN CYCLES: servers {FROZEN:?} frozen and taken back in {:?}; {res:?}", t0.elapsed());
    let n = FROZEN.len() as u32;
    // One lcore per server: 2 x window slots of a 64 KiB piece per stream
    // that carries operations, three of them at any time.
    let window = tally_e2e::jobloop::multi("tcp", &addrs, 0, 0, 2).window as u64;
    for r in &res {
        let r = r.as_ref().expect("no operation fails");
        assert_eq!((r.recoveries, r.rejoins), (n, n), "a server taken back was lost again at a later freeze: {r:?}");
        assert_eq!(r.streams, 3 + n, "a place of its own per rejoin of the same process: {r:?}");
        assert_eq!(r.staging_bytes, 3 * 2 * window * (64 << 10), "the staging area grew: {r:?}");
    }
}

/// Two servers of three frozen one after the other, then resumed at the
/// same moment: their rejoins run at once. Each is the same process back,
/// so each gets places of its own, added at its switch; every rank must
/// add them in the same order (the order of a rejoin's streams decides
/// which server gets which piece), whichever switch it reads first.
#[test]
fn two_frozen_servers_resumed_at_once_are_both_taken_back_and_every_element_is_right() {
    static STOP_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
    let servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let shape = Shape { pace: Some(Duration::from_millis(2)), stop_at: Some(&STOP_AT), ..Shape::default() };
    let ranks = loop_job("tcp", &addrs, 0x9f6, 3, usize::MAX, progress.clone(), shape);
    tally_e2e::jobloop::wait_for_round(&progress, 20, &ranks);
    let t0 = Instant::now();
    // The second freeze once the first server is lost (its recovery over),
    // so that neither loss lands inside the other's recovery.
    signal(&servers[1], libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(4));
    signal(&servers[2], libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(4));
    let back_line = "rejoined: every rank uses this server again from operation";
    signal(&servers[1], libc::SIGCONT);
    signal(&servers[2], libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(20);
    while (servers[1].log_count(back_line) == 0 || servers[2].log_count(back_line) == 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let back = (servers[1].log_count(back_line), servers[2].log_count(back_line));
    let at = progress.load(Ordering::Relaxed);
    if back == (1, 1) {
        tally_e2e::jobloop::wait_for_round(&progress, at + USED_FOR, &ranks);
    }
    STOP_AT.store(progress.load(Ordering::Relaxed) + 10, Ordering::Relaxed);
    let res = results(ranks);
    eprintln!("GRAYFAIL two frozen, resumed at once: taken back {back:?} in {:?}; {res:?}", t0.elapsed());
    let logs = |si: usize| servers[si].log.lock().unwrap().join("\n");
    assert_eq!(back, (1, 1), "not both taken back:\n{}\n---\n{}", logs(1), logs(2));
    for r in &res {
        let r = r.as_ref().expect("no operation fails, no element is wrong");
        assert_eq!((r.recoveries, r.rejoins), (2, 2), "{r:?}");
        assert_eq!(r.streams, 5, "a place of its own per rejoin of the same process: {r:?}");
    }
    for si in [1, 2] {
        assert!(servers[si].wait_log("job 0x9f6: every rank finished", Duration::from_secs(5)), "{}", logs(si));
    }
}

/// A rank's Hello for job `spec`, as raw bytes on a new connection.
fn raw_hello(addr: &str, spec: &tally_engine::wire::JobSpec, rank: u32, flags: u8) -> std::net::TcpStream {
    raw_hello_from(addr, spec, rank, flags, 9)
}

/// As [`raw_hello`], naming the endpoint 127.0.0.1:`port`.
fn raw_hello_from(addr: &str, spec: &tally_engine::wire::JobSpec, rank: u32, flags: u8, port: u8) -> std::net::TcpStream {
    // A tcp endpoint name (a sockaddr_in, 127.0.0.1:port): the lcores can
    // insert it into their address vectors; nothing is ever sent there.
    let name = [2u8, 0, 0, port, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    // The job's secret as its real ranks (tally_e2e::client) hold it.
    let secret = tally_e2e::default_secret(spec.job_id);
    let mut m = tally_engine::wire::HelloMessage::new(spec, rank, &secret, &[&name[..]]).unwrap();
    m.hello.flags |= flags;
    tally_e2e::answered_hello(addr, &m, &[0; 32])
}

fn spec(job_id: u64, nranks: u32) -> tally_engine::wire::JobSpec {
    tally_e2e::f32_sum_spec(job_id, nranks, 4096)
}

/// Connects and joins the f32 sum sub-job (a collective: it waits for every rank).
fn join_f32_sum(cfg: tally_engine::client::ClientConfig) -> Result<(), String> {
    let mut c = tally_engine::client::Client::connect(cfg).map_err(|e| e.to_string())?;
    c.join(tally_engine::reduce::DataType::Float32, tally_engine::reduce::ReduceOp::Sum).map(|_| ()).map_err(|e| e.to_string())
}

#[test]
fn a_rank_that_dies_during_the_join_fails_it_for_the_others_at_once() {
    let srv = server("tcp", &["--join-timeout", "60", "--metrics", "127.0.0.1:0"]);
    let job = 0x9f4;
    // Rank 2 says Hello and dies while rank 0, a real client, waits for
    // rank 1; rank 1 comes after.
    let joiner = |rank: u32| {
        let cfg = tally_e2e::client("tcp", &srv.addr, job, rank, 3);
        std::thread::spawn(move || {
            let t = Instant::now();
            (join_f32_sum(cfg).err(), t.elapsed())
        })
    };
    let dying = raw_hello(&srv.addr, &spec(job, 3), 2, 0);
    std::thread::sleep(Duration::from_millis(300));
    let rank0 = joiner(0);
    std::thread::sleep(Duration::from_millis(700));
    drop(dying);
    let outcomes = vec![rank0.join().unwrap()];
    let late = joiner(1);
    let late = late.join().unwrap();
    let m = tally_e2e::scrape(&srv.metrics_addr());
    eprintln!("GRAYFAIL join: a rank died during the join: the others' errors {outcomes:?}; a later rank's {late:?}");
    for (err, took) in outcomes.iter().chain([&late]) {
        let err = err.as_deref().expect("the join must fail");
        assert!(err.contains("rank 2 left"), "{err}");
        assert!(*took < Duration::from_secs(10), "the join failed only after {took:?}");
    }
    assert_eq!(tally_e2e::sum(&m, "tally_control_joins_failed_total", ""), 1.0);
    // The server carries on.
    tally_e2e::join_all(tally_e2e::sum_job("tcp", &srv.addr, 0x9f5, 2, 10_000, 3));
}

#[test]
fn a_rejoin_hello_for_a_job_still_running_here_fences_it() {
    use std::io::Read;
    let srv = server("tcp", &["--metrics", "127.0.0.1:0"]);
    let job = 0x9f6;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = Arc::new(std::sync::Mutex::new(rx));
    // Two ranks run the job here and stay connected (their connections
    // open, as a partitioned server sees them), then try once more.
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let cfg = tally_e2e::client("tcp", &srv.addr, job, rank, 2);
            let rx = rx.clone();
            std::thread::spawn(move || -> Result<String, String> {
                let mut c = tally_engine::client::Client::connect(cfg).map_err(|e| e.to_string())?;
                let send = vec![1f32; 1000];
                let mut out = vec![0f32; 1000];
                let (dt, op) = (tally_engine::reduce::DataType::Float32, tally_engine::reduce::ReduceOp::Sum);
                c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), dt, op).map_err(|e| e.to_string())?;
                assert!(out.iter().all(|&v| v == 2.0));
                let _ = rx.lock().unwrap().recv();
                let r = c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), dt, op);
                Ok(r.err().map(|e| e.to_string()).unwrap_or_default())
            })
        })
        .collect();
    assert!(srv.wait_log("job 0x9f6: running", Duration::from_secs(20)));
    std::thread::sleep(Duration::from_millis(300));
    // The job's ranks, having declared this server lost elsewhere, take it back.
    let mut rejoins: Vec<_> = (0..2).map(|r| raw_hello(&srv.addr, &spec(job, 2), r, tally_engine::wire::Hello::REJOIN)).collect();
    assert!(srv.wait_log("fencing the stale job", Duration::from_secs(10)), "{:?}", srv.log.lock().unwrap());
    // Fencing ends the job on the lcores asynchronously: until they have, a
    // round of the stale job may still complete. Its next one after that is
    // refused.
    assert!(srv.wait_log("job 0x9f6 ended", Duration::from_secs(10)), "{:?}", srv.log.lock().unwrap());
    tx.send(()).unwrap();
    tx.send(()).unwrap();
    let errs: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    // The rejoin is admitted as a new job: its first message is an Accept (or,
    // with these made-up endpoint names, a reject from the lcore; never
    // "already running").
    let mut first = [0u8; 8];
    rejoins[0].set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let got = rejoins[0].read_exact(&mut first).is_ok();
    let kind = tally_engine::wire::read::<tally_engine::wire::Header>(&first).ok().and_then(|h| h.check().ok());
    let m = tally_e2e::scrape(&srv.metrics_addr());
    eprintln!("GRAYFAIL fence: the stale job's ranks then saw {errs:?}; the rejoin got {kind:?}");
    assert!(got && kind == Some(tally_engine::wire::Kind::Accept), "the rejoin was not admitted: {kind:?}\n{:?}", srv.log.lock().unwrap());
    for e in &errs {
        let e = e.as_ref().expect("rank thread");
        assert!(e.contains("fenced"), "the stale job's rank was not told it was fenced: {e:?}");
    }
    assert_eq!(tally_e2e::sum(&m, "tally_control_jobs_fenced_total", ""), 1.0);
    assert!(srv.wait_log("job 0x9f6 ended; its slab regions are free", Duration::from_secs(10)), "the stale job's memory was not freed");
}

/// The first message on `s` (bounded wait): its kind, None if it closed.
fn first_kind(s: &mut std::net::TcpStream) -> Option<tally_engine::wire::Kind> {
    use std::io::Read;
    let mut b = [0u8; 8];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.read_exact(&mut b).ok()?;
    tally_engine::wire::read::<tally_engine::wire::Header>(&b).ok().and_then(|h| h.check().ok())
}

#[test]
fn a_rank_that_joins_again_replaces_its_broken_join_and_another_claiming_its_rank_is_refused() {
    let srv = server("tcp", &[]);
    let s = spec(0x9f7, 2);
    // Rank 0's first connection "broke" (as a keepalive that gave up on a
    // cut link leaves it: still open on the server's side); it joins again
    // from the same endpoint.
    let mut first = raw_hello_from(&srv.addr, &s, 0, 0, 9);
    std::thread::sleep(Duration::from_millis(200));
    let mut again = raw_hello_from(&srv.addr, &s, 0, 0, 9);
    assert!(srv.wait_log("rank 0 joined again", Duration::from_secs(10)), "{:?}", srv.log.lock().unwrap());
    // Another endpoint claiming rank 0 is a misconfigured job: refused.
    let mut other = raw_hello_from(&srv.addr, &s, 0, 0, 10);
    assert_eq!(first_kind(&mut other), Some(tally_engine::wire::Kind::Reject));
    let _rank1 = raw_hello_from(&srv.addr, &s, 1, 0, 11);
    let (got_first, got_again) = (first_kind(&mut first), first_kind(&mut again));
    eprintln!("GRAYFAIL join again: the first connection got {got_first:?}, the second {got_again:?}");
    assert_eq!(got_again, Some(tally_engine::wire::Kind::Accept), "{:?}", srv.log.lock().unwrap());
    assert_eq!(got_first, None, "the dropped connection must be closed, not answered");
}

#[test]
fn a_server_lcore_stuck_in_the_provider_withholds_heartbeats_and_the_ranks_fail_over() {
    // Server 1's lcore blocks for good 3 s after it starts, as inside a
    // provider call that does not return (fault injection: TALLY_FAULT_STALL).
    let job = 0x9f8;
    let mut servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let args = ["--provider", "tcp", "--poll", "adaptive", "--slab-size", "16M", "--lcores", "0"];
    servers[1] = ServerProcess::start_with("127.0.0.1:0", &args, &[("TALLY_FAULT_STALL", "0@3")]);
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let shape = Shape { pace: Some(Duration::from_millis(4)), ..Shape::default() };
    const ROUNDS: usize = 1500;
    let ranks = loop_job("tcp", &addrs, job, 3, ROUNDS, progress.clone(), shape);
    tally_e2e::jobloop::wait_for_round(&progress, 10, &ranks);
    let meter = StallMeter::start(progress.clone());
    let stalled = servers[1].wait_log("fault injection (TALLY_FAULT_STALL)", Duration::from_secs(20));
    let res = results(ranks);
    let worst = meter.stop();
    let logs = servers[1].log.lock().unwrap().join("\n");
    eprintln!("GRAYFAIL stuck lcore: longest stall {worst:?}; {res:?}");
    assert!(stalled, "the lcore never stalled:\n{logs}");
    for r in &res {
        assert!(r.is_ok(), "an operation failed: {r:?}\n{logs}");
    }
    for r in res.iter().flatten() {
        assert_eq!(r.recoveries, 1, "{r:?}");
    }
    assert!(worst < STALL_BOUND, "the loop stood still for {worst:?} (bound {STALL_BOUND:?})");
    assert!(logs.contains("heartbeats withheld: lcore 0 has not polled"), "{logs}");
    assert!(
        servers[1].wait_log("lcore 0 has not polled for 5s: it is stuck inside the fabric provider", Duration::from_secs(10)),
        "the server did not leave its jobs:\n{logs}"
    );
}

/// `tally bench allreduce` as rank `rank` of an agg job over `servers`.
fn rank_process(servers: &str, boot: &str, job: u64, rank: u32, n: u32) -> std::process::Child {
    std::process::Command::new(tally_e2e::tally_bin())
        .args(["bench", "allreduce", "--rank", &rank.to_string(), "--ranks", &n.to_string(), "--bootstrap", boot])
        .args(["--job-id", &job.to_string(), "--servers", servers, "--provider", "tcp", "--mode", "agg"])
        .args(["--sizes", "1M", "--iters", "1000", "--warmup", "0"])
        .env("TALLY_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn a rank process")
}

#[test]
fn a_rank_killed_while_a_frozen_server_holds_the_join_fails_the_others_at_once_tcp() {
    // Server 1 is frozen while the job forms: the ranks reach servers 0 and
    // 2, which admit the job, and wait for server 1's answer. Rank 2 is then
    // SIGKILLed: servers 0 and 2 fail the job at once. The other ranks must
    // hear it from them and leave, not sit in server 1's join until it
    // resumes (here 40 s; in the soak, a link cut during the join left them
    // waiting out the 120 s join timeout).
    let job = 0x9fa;
    let servers: Vec<ServerProcess> = (0..3).map(|_| server("tcp", &[])).collect();
    let addrs = servers.iter().map(|s| s.addr.clone()).collect::<Vec<_>>().join(",");
    signal(&servers[1], libc::SIGSTOP);
    let boot = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut ranks: Vec<std::process::Child> = (0..3).map(|r| rank_process(&addrs, &boot, job, r, 3)).collect();
    let admitted = [0, 2].iter().all(|&s| servers[s].wait_log(&format!("job {job:#x}: running"), Duration::from_secs(30)));
    // SAFETY: signalling our own child process, not yet reaped.
    unsafe { libc::kill(ranks[2].id() as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let mut ended: [Option<(std::process::ExitStatus, Duration)>; 2] = [None, None];
    while ended.iter().any(|e| e.is_none()) && killed.elapsed() < Duration::from_secs(40) {
        for r in 0..2 {
            if ended[r].is_none() {
                if let Some(st) = ranks[r].try_wait().unwrap() {
                    ended[r] = Some((st, killed.elapsed()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&servers[1], libc::SIGCONT);
    let _ = ranks[2].wait();
    let mut said = Vec::new();
    for (r, child) in ranks.iter_mut().enumerate().take(2) {
        if ended[r].is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut e = String::new();
        let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut e);
        said.push(e);
    }
    eprintln!("GRAYFAIL rank killed during a join held by a frozen server: survivors ended {ended:?} after the kill");
    assert!(admitted, "servers 0 and 2 did not admit the job");
    for r in 0..2 {
        let (st, after) = ended[r].unwrap_or_else(|| panic!("rank {r} still waited 40 s after the kill:\n{}", said[r]));
        assert!(!st.success(), "rank {r} succeeded although rank 2 was killed:\n{}", said[r]);
        assert!(after < Duration::from_secs(10), "rank {r} left {after:?} after the kill (bound 10 s):\n{}", said[r]);
        assert!(said[r].contains("ended the job"), "rank {r}'s error does not say the job ended:\n{}", said[r]);
    }
    // Server 1, resumed, serves the next job. It never heard of this one:
    // the ranks answer a server's challenge, which a frozen server does not
    // send, so no Hello of theirs waited in its socket buffers.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!servers[1].log_contains(&format!("job {job:#x}")), "server 1 heard of the job: {:?}", servers[1].log.lock().unwrap());
    let next = tally_e2e::jobloop::loop_job(
        "tcp",
        &servers.iter().map(|s| s.addr.clone()).collect::<Vec<_>>(),
        job + 1,
        3,
        20,
        Arc::new(AtomicUsize::new(0)),
        Shape::default(),
    );
    for r in results(next) {
        assert!(r.is_ok(), "the next job failed: {r:?}");
    }
}
