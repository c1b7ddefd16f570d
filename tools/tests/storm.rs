//! A join storm: more connections in their handshake than a server takes
//! (`MAX_HANDSHAKES`). A rank turned away with `busy` comes back after a
//! jittered backoff until its join deadline, and the final error says how
//! long it tried. Real server process, tcp on loopback, every element
//! checked.
mod common;
use common::ServerProcess;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tally_engine::server::control::MAX_HANDSHAKES;

/// How many connections the server turned away as busy so far.
fn refused(srv: &ServerProcess) -> usize {
    srv.log.lock().unwrap().iter().filter(|l| l.contains("already in their handshake")).count()
}

/// Connections that send nothing, 20 more than the handshake table holds;
/// returns once the server has refused those 20 (the table is full).
fn junk(srv: &ServerProcess) -> Vec<TcpStream> {
    let v: Vec<TcpStream> = (0..MAX_HANDSHAKES + 20).map(|_| TcpStream::connect(&srv.addr).expect("junk connection")).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while refused(srv) < 20 {
        assert!(Instant::now() < deadline, "the server refused {} of 20 connections over its table", refused(srv));
        std::thread::sleep(Duration::from_millis(20));
    }
    v
}

#[test]
fn busy_ranks_retry_until_the_storm_times_out() {
    let srv = ServerProcess::start(&["--lcores", "0", "--provider", "tcp", "--poll", "adaptive", "--handshake-timeout", "3"]);
    let held = junk(&srv);
    let before = refused(&srv);
    // The ranks' first Hellos are refused (busy); they come back and get in
    // once the junk reaches its 3 s handshake deadline and is closed.
    common::join_all(common::sum_job("tcp", &srv.addr, 0x5707, 2, 10_000, 3));
    assert!(refused(&srv) > before, "the ranks were never told busy: the storm did not hold them off");
    drop(held);
    assert!(srv.stop().success());
}

#[test]
fn a_busy_rank_gives_up_at_its_join_deadline_and_says_so() {
    let srv = ServerProcess::start(&["--lcores", "0", "--provider", "tcp", "--poll", "adaptive", "--handshake-timeout", "30"]);
    let held = junk(&srv);
    let mut cfg = common::client("tcp", &srv.addr, 0x5708, 0, 2);
    cfg.timeout = Duration::from_secs(2);
    let t0 = Instant::now();
    let e = match tally_engine::client::Client::connect(cfg)
        .and_then(|mut c| c.join(tally_engine::reduce::DataType::Float32, tally_engine::reduce::ReduceOp::Sum).map(|_| ()))
    {
        Ok(()) => panic!("joined a server whose handshake table is full"),
        Err(e) => e.to_string(),
    };
    let took = t0.elapsed();
    assert!(e.contains("busy") && e.contains("join deadline of 2 s"), "{e}");
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(6), "gave up after {took:?}: {e}");
    drop(held);
    assert!(srv.stop().success());
}
