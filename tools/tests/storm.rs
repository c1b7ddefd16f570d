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

/// Connections that send nothing, enough to fill the handshake table.
fn junk(addr: &str) -> Vec<TcpStream> {
    let v: Vec<TcpStream> = (0..MAX_HANDSHAKES + 20).map(|_| TcpStream::connect(addr).expect("junk connection")).collect();
    // Let the server take them all in before the ranks arrive.
    std::thread::sleep(Duration::from_millis(300));
    v
}

#[test]
fn busy_ranks_retry_until_the_storm_times_out() {
    let srv = ServerProcess::start(&["--lcores", "0", "--provider", "tcp", "--poll", "adaptive", "--handshake-timeout", "2"]);
    let held = junk(&srv.addr);
    let t0 = Instant::now();
    // The first Hellos are refused (busy); the ranks get in once the junk
    // reaches its 2 s handshake deadline and is closed.
    common::join_all(common::sum_job("tcp", &srv.addr, 0x5707, 2, 10_000, 3));
    assert!(t0.elapsed() >= Duration::from_millis(1200), "joined in {:?}: the storm did not hold them off", t0.elapsed());
    assert!(srv.log_contains("handshake"), "the server said nothing about the refused connections");
    drop(held);
    assert!(srv.stop().success());
}

#[test]
fn a_busy_rank_gives_up_at_its_join_deadline_and_says_so() {
    let srv = ServerProcess::start(&["--lcores", "0", "--provider", "tcp", "--poll", "adaptive", "--handshake-timeout", "30"]);
    let held = junk(&srv.addr);
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
