//! Join storms against a real `tally server` process, tcp on loopback.
//!
//! Every address in 127/8 is this host, so a test can play several hosts:
//! junk connections come from 127.0.0.2 (or 127.0.1.x), the real ranks
//! from 127.0.0.1. The server multiplexes every control connection on one
//! epoll thread, holds at most `max_handshakes_per_source` handshakes per
//! address (more are told `busy` at once) and `max_handshakes` in all (when
//! full, the noisiest address's oldest is evicted), and closes handshakes at
//! their deadline. Figures come from its `/metrics` and `/proc` status.
//! Every all-reduce checks every element.
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally_e2e::{bench, scrape, sum, ServerProcess};

fn server(args: &[&str]) -> ServerProcess {
    let mut all = vec!["--lcores", "0", "--provider", "tcp", "--poll", "adaptive", "--slab-size", "64M", "--metrics", "127.0.0.1:0"];
    all.extend_from_slice(args);
    ServerProcess::start(&all)
}

/// A connection to `addr` from loopback address `source`, that sends nothing.
fn connect_from(source: &str, addr: &str) -> TcpStream {
    let to: SocketAddr = addr.parse().unwrap();
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let from: SocketAddr = format!("{source}:0").parse().unwrap();
    s.bind(&from.into()).unwrap();
    s.connect(&to.into()).unwrap_or_else(|e| panic!("connect from {source}: {e}"));
    s.into()
}

/// A metric's value (summed over its series with labels containing `with`).
fn metric(maddr: &str, name: &str, with: &str) -> f64 {
    sum(&scrape(maddr), name, with)
}

/// Waits (bounded) until `cond` holds on a fresh scrape.
fn wait_metrics(maddr: &str, what: &str, cond: impl Fn(&std::collections::HashMap<String, f64>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = scrape(maddr);
        if cond(&m) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {:?}", m.iter().filter(|(k, _)| k.starts_with("tally_control")).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server's answer on a junk connection: the reject's code name, then
/// EOF ("closed" if nothing came).
fn answer(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let code = match tally_e2e::reject_after_any_challenge(s) {
        Ok(r) => r.code().map_or("unknown", |c| c.name()).to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => format!("unreadable: {e}"),
        Err(_) => return "closed".into(),
    };
    let mut rest = [0u8; 1];
    match s.read(&mut rest) {
        Ok(0) => code,
        other => format!("{code}, then {other:?} instead of the close"),
    }
}

/// Samples the server's thread count every 20 ms until dropped; `max` holds the largest.
struct ThreadWatch {
    max: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    h: Option<std::thread::JoinHandle<()>>,
}

impl ThreadWatch {
    fn new(pid: u32) -> ThreadWatch {
        let (max, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (m, s) = (max.clone(), stop.clone());
        let h = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    if let Some(n) = text.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok()) {
                        m.fetch_max(n, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        ThreadWatch { max, stop, h: Some(h) }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.h.take().unwrap().join().unwrap();
        self.max.load(Ordering::Relaxed)
    }
}

#[test]
fn a_thousand_silent_connections_do_not_keep_a_64_rank_job_out() {
    let timeout_s = 40;
    let srv = server(&["--handshake-timeout", &timeout_s.to_string()]);
    let maddr = srv.metrics_addr();
    let threads_idle = srv.status("Threads");
    let watch = ThreadWatch::new(srv.child.id());
    let t0 = Instant::now();
    let mut junk: Vec<TcpStream> = (0..1000).map(|_| connect_from("127.0.0.2", &srv.addr)).collect();
    // The default share of one address is 256 handshakes: the rest are told busy at once.
    wait_metrics(&maddr, "the storm was not taken in", |m| sum(m, "tally_control_accepted_total", "") >= 1000.0);
    let busy_storm = metric(&maddr, "tally_control_refusals_total", "reason=\"busy\"");
    assert_eq!(metric(&maddr, "tally_control_handshakes", ""), 256.0);
    assert_eq!(busy_storm, 744.0);

    // 64 ranks from another address, as 2 processes of 32 rank threads.
    let rows = bench(
        &srv.addr,
        &["--ranks", "64", "--ranks-per-process", "32", "--sizes", "4K,64K", "--chunk", "16K", "--iters", "3", "--warmup", "1"],
    );
    assert_eq!(rows.len(), 2);
    let job_done = t0.elapsed();
    let m = scrape(&maddr);
    let threads_max = watch.finish();
    eprintln!(
        "storm: 1000 silent connections from 127.0.0.2 (256 held, 744 busy); 64-rank job from 127.0.0.1 done {job_done:.2?} after the storm began; \
         server threads idle {threads_idle}, at most {threads_max} during storm and job; join to running: {:.3} s",
        sum(&m, "tally_control_join_to_running_seconds_sum", "")
    );
    assert!(job_done < Duration::from_secs(timeout_s), "the job ran only after the junk's deadline ({job_done:?})");
    // The job was never told busy, and the junk was still held while it ran.
    assert_eq!(sum(&m, "tally_control_refusals_total", "reason=\"busy\""), busy_storm, "a rank of the job was told busy");
    assert_eq!(sum(&m, "tally_control_handshakes", ""), 256.0, "the held junk went before its deadline");
    assert_eq!(sum(&m, "tally_control_join_to_running_seconds_count", ""), 1.0);
    // No thread per connection: the count never grew with the storm or the job.
    assert_eq!(threads_max, threads_idle, "the server's thread count grew from {threads_idle} to {threads_max}");
    assert!(threads_idle <= 1 + 6, "lcores + a constant: {threads_idle} threads");

    // The junk that got in is closed at its deadline, the rest was refused at once.
    let answers: Vec<String> = junk.iter_mut().map(answer).collect();
    let closed_at = t0.elapsed();
    let timeouts = answers.iter().filter(|a| *a == "timeout").count();
    let busy = answers.iter().filter(|a| *a == "busy").count();
    assert_eq!((timeouts, busy), (256, 744), "{:?}", answers.iter().find(|a| *a != "timeout" && *a != "busy"));
    assert!(
        closed_at >= Duration::from_secs(timeout_s - 1) && closed_at < Duration::from_secs(timeout_s + 15),
        "closed after {closed_at:?}"
    );
    wait_metrics(&maddr, "handshakes left", |m| sum(m, "tally_control_handshakes", "") == 0.0);
    assert_eq!(metric(&maddr, "tally_control_handshake_timeouts_total", ""), 256.0);
    assert!(srv.stop().success());
}

#[test]
fn a_full_table_evicts_the_noisiest_address_so_a_real_rank_gets_in() {
    let srv = server(&["--handshake-timeout", "60", "--max-handshakes", "64", "--max-handshakes-per-source", "64"]);
    let maddr = srv.metrics_addr();
    let mut junk: Vec<TcpStream> = (0..64).map(|_| connect_from("127.0.0.2", &srv.addr)).collect();
    wait_metrics(&maddr, "the table did not fill", |m| sum(m, "tally_control_handshakes", "") == 64.0);
    let t0 = Instant::now();
    tally_e2e::join_all(tally_e2e::sum_job("tcp", &srv.addr, 0x5709, 2, 10_000, 3));
    let took = t0.elapsed();
    // Each rank's connection took the place of the oldest junk (no waiting for the 60 s deadline).
    assert!(took < Duration::from_secs(30), "the job waited {took:?}");
    // The first rank evicts one; the second may find the place the first
    // left when its handshake ended, or evict another.
    let evicted = metric(&maddr, "tally_control_refusals_total", "reason=\"busy\"");
    assert!((1.0..=2.0).contains(&evicted), "{evicted} junk connections evicted for 2 ranks");
    assert_eq!(answer(&mut junk[0]), "busy", "the oldest junk is the one evicted");
    assert_eq!(metric(&maddr, "tally_control_handshakes", ""), 64.0 - evicted);
    assert!(srv.stop().success());
}

#[test]
fn busy_ranks_retry_until_the_storm_times_out() {
    let srv = server(&["--handshake-timeout", "3", "--max-handshakes-per-source", "16"]);
    let maddr = srv.metrics_addr();
    // The ranks' own address is full of silent connections: the ranks are
    // told busy, come back after jittered backoffs, and get in once the
    // junk reaches its 3 s deadline.
    let held: Vec<TcpStream> = (0..16).map(|_| connect_from("127.0.0.1", &srv.addr)).collect();
    wait_metrics(&maddr, "the junk was not taken in", |m| sum(m, "tally_control_handshakes", "") == 16.0);
    tally_e2e::join_all(tally_e2e::sum_job("tcp", &srv.addr, 0x5707, 2, 10_000, 3));
    assert!(metric(&maddr, "tally_control_refusals_total", "reason=\"busy\"") > 0.0, "the ranks were never told busy");
    drop(held);
    assert!(srv.stop().success());
}

#[test]
fn a_busy_rank_gives_up_at_its_join_deadline_and_says_so() {
    let srv = server(&["--handshake-timeout", "30", "--max-handshakes-per-source", "16"]);
    let maddr = srv.metrics_addr();
    let held: Vec<TcpStream> = (0..16).map(|_| connect_from("127.0.0.1", &srv.addr)).collect();
    wait_metrics(&maddr, "the junk was not taken in", |m| sum(m, "tally_control_handshakes", "") == 16.0);
    let mut cfg = tally_e2e::client("tcp", &srv.addr, 0x5708, 0, 2);
    cfg.join_timeout = Duration::from_secs(2);
    let t0 = Instant::now();
    let e = match tally_engine::client::Client::connect(cfg)
        .and_then(|mut c| c.join(tally_engine::reduce::DataType::Float32, tally_engine::reduce::ReduceOp::Sum).map(|_| ()))
    {
        Ok(()) => panic!("joined through a full handshake table"),
        Err(e) => e.to_string(),
    };
    let took = t0.elapsed();
    assert!(e.contains("busy") && e.contains("join deadline of 2 s"), "{e}");
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(6), "gave up after {took:?}: {e}");
    drop(held);
    assert!(srv.stop().success());
}

#[test]
fn ten_thousand_idle_connections_cost_little_memory_and_no_thread() {
    // This process holds the client ends: raise its open-files limit as the
    // server raises its own.
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write one struct we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    assert!(lim.rlim_max >= 10_300, "this host allows {} open files; the test needs 10,300 (ulimit -Hn)", lim.rlim_max);
    let srv = server(&["--handshake-timeout", "300"]);
    let maddr = srv.metrics_addr();
    // Let the server settle (its slab touched, its lcore polling).
    std::thread::sleep(Duration::from_millis(500));
    let (rss0, threads0) = (srv.status("VmRSS"), srv.status("Threads"));
    // 40 hosts of 250 connections each: under the per-address share of 256.
    let t0 = Instant::now();
    let conns: Vec<TcpStream> = (0..10_000).map(|i| connect_from(&format!("127.0.1.{}", 1 + i / 250), &srv.addr)).collect();
    wait_metrics(&maddr, "not every connection was taken in", |m| sum(m, "tally_control_handshakes", "") == 10_000.0);
    let took = t0.elapsed();
    let (rss1, threads1) = (srv.status("VmRSS"), srv.status("Threads"));
    let grew_mib = (rss1.saturating_sub(rss0)) as f64 / 1024.0;
    eprintln!(
        "10,000 idle connections from 40 addresses: taken in {took:.2?}; server VmRSS {:.1} -> {:.1} MiB (+{grew_mib:.1} MiB), threads {threads0} -> {threads1}",
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0
    );
    assert!(grew_mib < 100.0, "10,000 idle connections cost {grew_mib:.1} MiB");
    assert_eq!(threads1, threads0, "connections cost threads");
    assert_eq!(metric(&maddr, "tally_control_refusals_total", "reason=\"busy\""), 0.0);
    // A real job still joins beside them.
    tally_e2e::join_all(tally_e2e::sum_job("tcp", &srv.addr, 0x570a, 2, 10_000, 2));
    drop(conns);
    wait_metrics(&maddr, "closed connections still counted", |m| sum(m, "tally_control_handshakes", "") == 0.0);
    assert!(srv.stop().success());
}

#[test]
fn a_busy_answer_arrives_whole_even_after_the_hello_was_sent() {
    // The client sends its Hello right after connecting, so a server that
    // refuses at accept has unread bytes when it closes: closing then makes
    // the kernel send a reset, which can destroy the reject before the client
    // reads it. The server lingers instead (reject, FIN, then close).
    let srv = server(&["--handshake-timeout", "60", "--max-handshakes-per-source", "1"]);
    let maddr = srv.metrics_addr();
    let _held = connect_from("127.0.0.1", &srv.addr);
    wait_metrics(&maddr, "the place was not taken", |m| sum(m, "tally_control_handshakes", "") == 1.0);
    for i in 0..200 {
        let mut s = connect_from("127.0.0.1", &srv.addr);
        std::io::Write::write_all(&mut s, &[0x55u8; core::mem::size_of::<tally_engine::wire::Hello>()]).unwrap();
        let a = answer(&mut s);
        assert_eq!(a, "busy", "try {i}: {a}");
    }
    assert_eq!(metric(&maddr, "tally_control_refusals_total", "reason=\"busy\""), 200.0);
    assert!(srv.stop().success());
}
