//! A shared server against wrong and hostile peers, each attack beside a
//! legitimate job, against a real `tally server` process: the server lives,
//! the legitimate job finishes with every element right, and the log says
//! what happened.
//!
//! - a rank of another provider (shm names sent to a tcp server), and
//!   crafted endpoint names: that join is refused, naming the provider;
//!   every job after it runs (it once left the address vector refusing
//!   every later insert);
//! - a token holder outside a job: a `REJOIN` with the running job's id
//!   (from `/metrics`) but not its secret is refused and the job goes on;
//!   so is a join into a gathering job with another secret;
//! - the control plane captured: the token is nowhere in a Hello, and a
//!   captured Hello replayed on a new connection is refused;
//! - a REJOIN's backoff check: none without the job's secret, only the
//!   connection's address for a job not running here (not the hosts its
//!   names give), and a flood of them gets a few looks, not one each;
//! - a storm of malformed handshakes logs a few lines a second, not one each;
//! - a flood of messages for no receive is discarded and counted, at a
//!   server's lcore and at a rank (`hostile/floods.rs`);
//! - a job's own ranks flooding their recovery leader with `Lost` reports:
//!   that job is ended after its budget of rounds, the job beside goes on;
//! - a server that asks for no token gets no secret from a rank that holds one.
use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally_e2e::{answered_hello, client, join_all, raw_after_challenge, read_challenge, read_reject, sum_job, tally_bin, ServerProcess};
use tally_engine::client::{Client, ClientConfig};
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::wire::{self, Hello, HelloMessage, JobSecret, JobSpec, RejectCode, TOKEN_BYTES};

#[path = "hostile/floods.rs"]
mod floods;

const TOKEN: &str = "hostile-suite-token-0123456789ab";

fn token_bytes() -> [u8; TOKEN_BYTES] {
    wire::token_bytes(TOKEN).unwrap()
}

/// A tcp server on one lcore with the suite's token and a metrics port.
fn server(provider: &str) -> ServerProcess {
    ServerProcess::start_with(
        "127.0.0.1:0",
        &["--lcores", "0", "--provider", provider, "--poll", "adaptive", "--slab-size", "16M", "--metrics", "127.0.0.1:0"],
        &[("TALLY_TOKEN", TOKEN)],
    )
}

/// Rank configurations of a job holding the token and `secret`.
fn rank_cfg(addr: &str, job: u64, rank: u32, n: u32, secret: JobSecret) -> ClientConfig {
    let mut c = client("tcp", addr, job, rank, n);
    c.token = TOKEN.into();
    c.job_secret = secret;
    c
}

/// A job of `n` rank threads, `rounds` f32 sums of 64 KiB each (every
/// element checked); `progress` counts rank 0's rounds.
fn job(
    addr: &str,
    job: u64,
    n: u32,
    rounds: usize,
    secret: JobSecret,
    progress: Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<Result<(), String>>> {
    ranks_of(addr, job, n, 0..n, rounds, secret, progress)
}

/// Ranks `which` of [`job`].
fn ranks_of(
    addr: &str,
    job: u64,
    n: u32,
    which: std::ops::Range<u32>,
    rounds: usize,
    secret: JobSecret,
    progress: Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<Result<(), String>>> {
    which
        .map(|rank| {
            let cfg = rank_cfg(addr, job, rank, n, secret);
            let progress = progress.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                for round in 0..rounds {
                    let count = 16 << 10;
                    let send: Vec<f32> = (0..count).map(|i| (rank as usize + i % 97 + round) as f32).collect();
                    let mut out = vec![0f32; count];
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                        .map_err(|e| format!("rank {rank} round {round}: {e}"))?;
                    for (i, v) in out.iter().enumerate() {
                        let want: f32 = (0..n).map(|r| (r as usize + i % 97 + round) as f32).sum();
                        if *v != want {
                            return Err(format!("rank {rank} round {round}: element {i} = {v}, want {want}"));
                        }
                    }
                    if rank == 0 {
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            })
        })
        .collect()
}

fn wait_rounds(progress: &AtomicUsize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while progress.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "the job did not reach round {n}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn spec(job_id: u64, nranks: u32) -> JobSpec {
    tally_e2e::f32_sum_spec(job_id, nranks, 4096)
}

/// `tally bench allreduce --mode agg` against `addr` over `provider`: its
/// exit status and output.
fn bench(addr: &str, provider: &str) -> (bool, String) {
    let out = Command::new(tally_bin())
        .args(["bench", "allreduce", "--mode", "agg", "--servers", addr, "--ranks", "2", "--provider", provider])
        .args(["--sizes", "64K", "--iters", "3", "--warmup", "1", "--timeout", "30", "--json"])
        .env("TALLY_TOKEN", TOKEN)
        .env("TALLY_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run tally bench allreduce");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Joins a rank by hand (its Hello `m`, for `ep`'s name): the control
/// connection, kept open (the rank stays in its job), the Accept, and the
/// first lcore's address in `ep`'s address vector.
fn join_by_hand(
    addr: &str,
    ep: &mut tally_engine::dataplane::fabric::Endpoint,
    m: &HelloMessage,
) -> (TcpStream, wire::Accept, tally_engine::dataplane::fabric::PeerAddr) {
    let mut conn = answered_hello(addr, m, &token_bytes());
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut b = [0u8; core::mem::size_of::<wire::Accept>()];
    std::io::Read::read_exact(&mut conn, &mut b).unwrap();
    let accept: wire::Accept = wire::read(&b).unwrap();
    assert_eq!(accept.header.check(), Ok(wire::Kind::Accept), "rank {} admitted", m.hello.rank);
    let mut rec = [0u8; core::mem::size_of::<wire::NameRecord>()];
    std::io::Read::read_exact(&mut conn, &mut rec).unwrap();
    let lcore = wire::read::<wire::NameRecord>(&rec).unwrap();
    let at = ep.insert_peer(&tally_engine::dataplane::fabric::EndpointName::from_bytes(lcore.name().unwrap()).unwrap()).unwrap();
    (conn, accept, at)
}

#[test]
fn a_rank_of_another_provider_is_refused_and_every_later_job_runs() {
    let srv = server("tcp");
    // The sequence that once disabled the server: an shm job at a tcp server.
    let (ok, out) = bench(&srv.addr, "shm");
    assert!(!ok, "an shm job on a tcp server cannot run: {out}");
    assert!(out.contains("looks like shm's") && out.contains("TALLY_PROVIDER"), "the client is told why: {out}");
    assert!(srv.wait_log("looks like shm's", Duration::from_secs(5)), "the server logs it");
    let (ok, out) = bench(&srv.addr, "tcp");
    assert!(ok, "the tcp job after it runs: {out}");
    // Crafted names: each refused for its own join; a job runs after them all.
    let sockaddr = |family: u16, port: u16, len: usize| {
        let mut b = vec![0u8; len];
        b[..2].copy_from_slice(&family.to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b
    };
    let crafted: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", vec![0xff; 16]),
        ("no port", sockaddr(libc::AF_INET as u16, 0, 16)),
        ("inet, inet6's length", sockaddr(libc::AF_INET as u16, 9, 28)),
        ("a unix family", sockaddr(libc::AF_UNIX as u16, 9, 16)),
        ("inet6 at an inet server", sockaddr(libc::AF_INET6 as u16, 9, 28)),
        ("efa-like", vec![0xfe; 32]),
    ];
    for (what, name) in &crafted {
        let m = HelloMessage::new(&spec(0x4001, 1), 0, &[1; 32], &[&name[..]]).unwrap();
        let r = read_reject(&mut answered_hello(&srv.addr, &m, &token_bytes()));
        assert_eq!((r.code(), r.field()), (Some(RejectCode::BadField), "name"), "{what}: {r}");
    }
    join_all(job(&srv.addr, 0x4002, 2, 5, [2; 32], Arc::default()));
    assert!(srv.stop().success());
}

#[test]
fn a_token_holder_without_the_jobs_secret_cannot_act_on_it() {
    let srv = server("tcp");
    let secret: JobSecret = ClientConfig::draw_job_secret().unwrap();
    let id = 0x5e_c8e7;
    let progress = Arc::new(AtomicUsize::new(0));
    let ranks = job(&srv.addr, id, 2, 300, secret, progress.clone());
    wait_rounds(&progress, 5);
    // The job's id is on /metrics, as an attacker finds it.
    let (_, body) = tally_e2e::get(&srv.metrics_addr(), "/metrics");
    assert!(body.contains(&format!("{id:#x}")) || body.contains(&id.to_string()), "the id is on /metrics");
    let mut rejoin = HelloMessage::new(&spec(id, 2), 0, &[0x77; 32], &[&[2u8, 0, 0, 9, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0][..]]).unwrap();
    rejoin.hello.flags |= Hello::REJOIN;
    for rank in 0..2 {
        rejoin.hello.rank = rank;
        let r = read_reject(&mut answered_hello(&srv.addr, &rejoin, &token_bytes()));
        assert_eq!((r.code(), r.field()), (Some(RejectCode::Unauthorized), "secret"), "{r}");
    }
    // Without REJOIN it is told the job runs; nothing else happens either.
    rejoin.hello.flags &= !Hello::REJOIN;
    let r = read_reject(&mut answered_hello(&srv.addr, &rejoin, &token_bytes()));
    assert_eq!(r.code(), Some(RejectCode::JobMismatch), "{r}");
    let done = progress.load(Ordering::Relaxed);
    for r in ranks {
        r.join().unwrap().expect("the job finishes, every element right");
    }
    assert!(done < 300, "the attack ran while the job did ({done} rounds)");
    assert!(srv.log_contains("not the job's secret; the job goes on"), "{:?}", srv.log.lock().unwrap());
    assert!(!srv.log_contains("fencing"), "nothing was fenced");

    // A join into a gathering job with another secret: refused alone, and
    // the job's own rank 1 completes it after.
    let first = ranks_of(&srv.addr, 0x5e_c8e8, 2, 0..1, 3, secret, Arc::default());
    std::thread::sleep(Duration::from_millis(500));
    let intruder =
        HelloMessage::new(&spec(0x5e_c8e8, 2), 1, &[0x66; 32], &[&[2u8, 0, 0, 9, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0][..]]).unwrap();
    let r = read_reject(&mut answered_hello(&srv.addr, &intruder, &token_bytes()));
    assert_eq!((r.code(), r.field()), (Some(RejectCode::Unauthorized), "secret"), "{r}");
    let second = ranks_of(&srv.addr, 0x5e_c8e8, 2, 1..2, 3, secret, Arc::default());
    join_all(first);
    join_all(second);
    assert!(srv.stop().success());
}

/// A rank that asks another window than the rest of its job (as a rank
/// given another TALLY_LINK_GBITS would, through the plugin's
/// `collnet::tcp_window`) is refused by name, the field its job disagrees
/// on; the job's own rank 1 completes it after, and a job beside it never
/// notices.
#[test]
fn a_rank_asking_another_window_than_its_job_is_refused_and_nothing_else_breaks() {
    let srv = server("tcp");
    let progress = Arc::new(AtomicUsize::new(0));
    let beside = job(&srv.addr, 0x3d_0001, 2, 200, [4; 32], progress.clone());
    wait_rounds(&progress, 5);
    let first = ranks_of(&srv.addr, 0x3d_0002, 2, 0..1, 3, [5; 32], Arc::default());
    std::thread::sleep(Duration::from_millis(500));
    let mut odd = rank_cfg(&srv.addr, 0x3d_0002, 1, 2, [5; 32]);
    odd.window = 12;
    // The join goes with the first all-reduce.
    let (send, mut out) = (vec![1f32; 16 << 10], vec![0f32; 16 << 10]);
    let joined = Client::connect(odd)
        .and_then(|mut c| c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum));
    let e = joined.err().map(|e| e.to_string()).expect("a rank asking window 12 beside its job's was taken");
    assert!(e.contains("job mismatch") && e.contains("window"), "{e}");
    let second = ranks_of(&srv.addr, 0x3d_0002, 2, 1..2, 3, [5; 32], Arc::default());
    join_all(first);
    join_all(second);
    join_all(beside);
    assert!(srv.log_contains("disagrees with the other ranks on window"), "{:?}", srv.log.lock().unwrap());
    assert!(srv.stop().success());
}

/// Issue 55: a rejoin's backoff check (`ControlPlane::backed_off_towards`)
/// looks at the server's own connections. A REJOIN without the job's secret
/// gets no look at all; one for a job not running here (a restarted server)
/// gets a look at its connection's address only, not at the foreign host its
/// endpoint name gives; and a flood of them gets at most one look per
/// `backoff_gate::REUSE_FOR` (100 ms) for that address, not one each.
#[test]
fn rejoin_hellos_look_only_at_their_own_address_and_a_flood_gets_few_looks() {
    let srv = server("tcp");
    let secret: JobSecret = ClientConfig::draw_job_secret().unwrap();
    let progress = Arc::new(AtomicUsize::new(0));
    let ranks = job(&srv.addr, 0x5e_c8f0, 2, 300, secret, progress.clone());
    wait_rounds(&progress, 5);
    let looks = || {
        let m = tally_e2e::scrape(&srv.metrics_addr());
        (tally_e2e::sum(&m, "tally_control_backoff_looks_total", ""), tally_e2e::sum(&m, "tally_control_backoff_look_addresses_total", ""))
    };
    // Its endpoint is said to be on 192.0.2.7 (TEST-NET-1, nobody's): the
    // server may look at its own sockets to that host, never at that host.
    let foreign = [2u8, 0, 0, 9, 192, 0, 2, 7, 0, 0, 0, 0, 0, 0, 0, 0];
    let hello = |id: u64, secret: &JobSecret| {
        let mut m = HelloMessage::new(&spec(id, 2), 0, secret, &[&foreign[..]]).unwrap();
        m.hello.flags |= Hello::REJOIN;
        m
    };
    let before = looks();
    let r = read_reject(&mut answered_hello(&srv.addr, &hello(0x5e_c8f0, &[0x77; 32]), &token_bytes()));
    assert_eq!((r.code(), r.field()), (Some(RejectCode::Unauthorized), "secret"), "{r}");
    assert_eq!(looks(), before, "a REJOIN without the job's secret got a look");
    // A job not running here: unproven, so its connection's address alone.
    drop(answered_hello(&srv.addr, &hello(0x5e_c8f1, &[0x78; 32]), &token_bytes()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while looks().0 == before.0 {
        assert!(Instant::now() < deadline, "the REJOIN for a job not running here got no look");
        std::thread::sleep(Duration::from_millis(20));
    }
    let one = looks();
    assert_eq!((one.0 - before.0, one.1 - before.1), (1.0, 1.0), "one look, at one address (the connection's, not 192.0.2.7)");
    // A flood from the same address, after that look's verdict ran out.
    std::thread::sleep(Duration::from_millis(150));
    let t = Instant::now();
    const FLOOD: usize = 200;
    for _ in 0..FLOOD {
        drop(answered_hello(&srv.addr, &hello(0x5e_c8f1, &[0x78; 32]), &token_bytes()));
    }
    // Let the server read the last of them.
    std::thread::sleep(Duration::from_millis(300));
    let spells = (t.elapsed().as_millis() / 100) as f64 + 1.0;
    let after = looks();
    let (n, addrs) = (after.0 - one.0, after.1 - one.1);
    eprintln!("REJOIN FLOOD: {FLOOD} REJOIN Hellos in {:?}: {n} backoff looks, {addrs} addresses", t.elapsed());
    assert!(n >= 1.0 && n <= spells, "{n} looks for {FLOOD} Hellos in {spells} spells of 100 ms");
    assert_eq!(addrs, n, "each look at the connection's address only");
    // Each look found nothing backed off, so it renewed BBR where a model
    // read a policer: the job beside the flood, over the same address and
    // moving data, has measured models, and none of its connections is
    // restarted however many Hellos come. (Where the host's default is
    // bbr; renewing every connection, as first written, restarted 4 here.)
    let m = tally_e2e::scrape(&srv.metrics_addr());
    let renewals = tally_e2e::sum(&m, "tally_control_cc_renewals_total", "");
    assert_eq!(renewals, 0.0, "the flood restarted the congestion control of {renewals} connections of the job beside it");
    for r in ranks {
        r.join().unwrap().expect("the job finishes, every element right");
    }
    assert!(srv.stop().success());
}

#[test]
fn the_token_never_crosses_the_wire_and_a_captured_hello_does_not_replay() {
    let srv = server("tcp");
    let name = [2u8, 0, 0, 9, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    let m = HelloMessage::new(&spec(0x7e57, 2), 0, &[3; 32], &[&name[..]]).unwrap();
    // What a rank sends, as a capture of the control plane sees it.
    let mut s = TcpStream::connect(&srv.addr).unwrap();
    let c = read_challenge(&mut s);
    let mut captured = m;
    captured.answer(&c, &token_bytes());
    let bytes = captured.as_bytes().to_vec();
    assert!(!bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()), "the token is not in the Hello");
    assert!(!bytes.windows(32).any(|w| w == [3; 32]), "nor the job's secret");
    s.write_all(&bytes).unwrap();
    // The capture replayed on a connection of its own: another challenge.
    let r = read_reject(&mut raw_after_challenge(&srv.addr, &bytes));
    assert_eq!((r.code(), r.field()), (Some(RejectCode::Unauthorized), "token"), "{r}");
    // Without the token, or with another: refused the same way.
    for token in [[0u8; TOKEN_BYTES], wire::token_bytes("guess").unwrap()] {
        let r = read_reject(&mut answered_hello(&srv.addr, &m, &token));
        assert_eq!(r.code(), Some(RejectCode::Unauthorized), "{r}");
    }
    drop(s);
    join_all(job(&srv.addr, 0x7e58, 2, 3, [4; 32], Arc::default()));
    assert!(srv.wait_log("wrong or missing token", Duration::from_secs(5)));
    assert!(srv.stop().success());
}

#[test]
fn a_storm_of_bad_handshakes_logs_a_few_lines_a_second() {
    let srv = ServerProcess::start(&["--lcores", "0", "--provider", "shm", "--poll", "adaptive", "--slab-size", "8M"]);
    let t0 = Instant::now();
    let storm = 2000;
    let mut open = Vec::new();
    for k in 0..storm {
        let mut s = TcpStream::connect(&srv.addr).unwrap();
        // Bad magic, then a truncated Hello: refused, and closed early.
        if k % 2 == 0 {
            let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
        } else {
            let _ = s.write_all(bytemuck::bytes_of(&wire::Header::new(wire::Kind::Hello)));
        }
        open.push(s);
        if open.len() >= 64 {
            open.clear();
        }
    }
    drop(open);
    let took = t0.elapsed();
    // The server still serves.
    join_all(sum_job("shm", &srv.addr, 0x5707, 2, 10_000, 2));
    std::thread::sleep(Duration::from_millis(1200));
    let lines = srv.log_count("refused handshake") + srv.log_count("bytes of a handshake");
    let summaries = srv.log_count("more handshakes refused");
    let secs = t0.elapsed().as_secs_f64().ceil() as usize;
    eprintln!("HOSTILE storm: {storm} bad handshakes in {took:.2?}: {lines} full lines, {summaries} summaries over {secs} s");
    assert!(lines <= 4 * (secs + 1), "{lines} lines for {storm} bad handshakes in {secs} s");
    assert!(summaries >= 1, "the rest are counted in a summary");
    assert!(srv.stop().success());
}

/// Rank 1 played by hand over its own tcp endpoint: what a third party that
/// took over its fabric address (rxm trusts the address a connection
/// claims) can send. A piece of the job's tag, slot and round but without
/// the job's sequence key is dropped and counted; the rank's real piece
/// after it is summed, and rank 0 (a real client) gets every element right.
#[test]
fn a_blind_piece_with_the_jobs_tag_is_dropped_and_the_job_goes_on() {
    use tally_engine::dataplane::fabric::{Completion, Endpoint, EndpointConfig, Hints, PostError};
    let srv = server("tcp");
    let (id, count) = (0xb11d, 1024usize);
    let secret = [9u8; 32];
    let rank0 = {
        let mut cfg = rank_cfg(&srv.addr, id, 0, 2, secret);
        cfg.relay = false;
        std::thread::spawn(move || -> Result<Vec<f32>, String> {
            let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
            let send: Vec<f32> = (0..count).map(|i| i as f32).collect();
            let mut out = vec![0f32; count];
            c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            Ok(out)
        })
    };
    let ecfg = EndpointConfig { hints: Hints::new("tcp").with_node(Some("127.0.0.1")), cq_size: 0, contexts: 16, wait_object: false };
    let mut ep = Endpoint::open(&ecfg).unwrap();
    let name = ep.name().unwrap();
    // Rank 0's spec, as its client cuts it (tally_e2e::client's settings).
    let s = JobSpec { chunk_elems: (16 << 10) / 4, ..spec(id, 2) };
    let (conn, accept, at) = join_by_hand(&srv.addr, &mut ep, &HelloMessage::new(&s, 1, &secret, &[name.as_bytes()]).unwrap());
    let job = accept.job();
    let forged = vec![1.0e9f32; count];
    let real: Vec<f32> = (0..count).map(|i| 2.0 * i as f32).collect();
    let mut result = vec![0f32; count];
    let poll = |ep: &mut Endpoint, want: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut done = 0;
        let mut buf = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 8];
        while done < want {
            assert!(Instant::now() < deadline, "rank 1: {done} of {want} completions");
            done += ep.poll(&mut buf).expect("poll");
        }
    };
    let send = |ep: &mut Endpoint, data: &[f32], tag: u64, ctx: u32| loop {
        // SAFETY: `data` outlives the send, which is polled to completion below.
        match unsafe { ep.send(data.as_ptr().cast(), data.len() * 4, None, at, tag, ctx) } {
            Ok(()) => return,
            Err(PostError::Again) => {
                let mut buf = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 8];
                let _ = ep.poll(&mut buf);
            }
            Err(e) => panic!("send: {e}"),
        }
    };
    // SAFETY: `result` outlives the receive, polled to completion below.
    unsafe { ep.recv(result.as_mut_ptr().cast(), count * 4, None, Some(at), job.tag(0, 0).0, 0, 0) }.unwrap();
    // The forgery: slot 0, round 0, the job's tag; its key guessed wrong.
    send(&mut ep, &forged, wire::JobTag { key: job.key ^ 0x0bad_5eed, ..job }.tag(0, 0).0, 1);
    send(&mut ep, &real, job.tag(0, 0).0, 2);
    poll(&mut ep, 3);
    let out = rank0.join().unwrap().expect("rank 0's all-reduce");
    let wrong = (0..count).filter(|&i| out[i] != 3.0 * i as f32 || result[i] != 3.0 * i as f32).count();
    assert_eq!(wrong, 0, "every element of both ranks' results: {:?}", &out[..4]);
    let foreign = tally_e2e::sum(&tally_e2e::scrape(&srv.metrics_addr()), "tally_lcore_foreign_pieces_total", "");
    eprintln!("HOSTILE blind piece: dropped and counted {foreign}, 0 wrong of {count} on both ranks");
    assert_eq!(foreign, 1.0, "the forged piece is counted");
    drop(conn);
    assert!(srv.stop().success());
}

/// Whatever answers at a server's address and asks for no token (a server
/// started without one, or one posing as it) gets nothing from a rank that
/// holds a token: the rank refuses, saying why, and sends no Hello, whose
/// job secret would go sealed with a key of zeros (`wire::auth`).
#[test]
fn a_rank_with_a_token_sends_no_secret_to_a_server_that_asks_for_none() {
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap().to_string();
    let impostor = std::thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        s.write_all(bytemuck::bytes_of(&wire::Challenge::new([7; 32], false))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut got);
        got.len()
    });
    let secret = [6u8; 32];
    let err = Client::connect(rank_cfg(&addr, 0x5ec, 0, 1, secret))
        .and_then(|mut c| c.allreduce(&[0u8; 64], &mut [0u8; 64], DataType::Float32, ReduceOp::Sum))
        .unwrap_err()
        .to_string();
    assert!(err.contains("the server asks for no token and this rank holds one (TALLY_TOKEN)"), "{err}");
    assert_eq!(impostor.join().unwrap(), 0, "the rank sent nothing to the impostor");
}

/// The Hello's FAILOVER flag (`JobSpec::failover`), from a rank that holds
/// the job's secret but claims the other setting (a misconfigured
/// TALLY_FAILOVER, or a hostile member): refused by name while its job
/// gathers, the job's own rank then completes that job, and a job running
/// beside it all along never notices. One that claims it for a job of its
/// own is only that job's business: the server runs it like any other.
#[test]
fn a_rank_claiming_the_other_failover_setting_is_refused_and_harms_no_job() {
    let srv = server("tcp");
    let secret: JobSecret = ClientConfig::draw_job_secret().unwrap();
    let progress = Arc::new(AtomicUsize::new(0));
    let beside = job(&srv.addr, 0xfa_11, 2, 150, secret, progress.clone());
    wait_rounds(&progress, 5);
    let name = [2u8, 0, 0, 9, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    let id = 0xfa_12;
    let first = HelloMessage::new(&spec(id, 2), 0, &secret, &[&name[..]]).unwrap();
    let mut held = answered_hello(&srv.addr, &first, &token_bytes());
    let mut wrong = HelloMessage::new(&JobSpec { failover: true, ..spec(id, 2) }, 1, &secret, &[&name[..]]).unwrap();
    assert_ne!(wrong.hello.flags & Hello::FAILOVER, 0);
    let r = read_reject(&mut answered_hello(&srv.addr, &wrong, &token_bytes()));
    assert_eq!((r.code(), r.field()), (Some(RejectCode::JobMismatch), "failover"), "{r}");
    // The job's own rank 1 completes the join: rank 0 is admitted.
    wrong.hello.flags &= !Hello::FAILOVER;
    let _second = answered_hello(&srv.addr, &wrong, &token_bytes());
    held.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut b = [0u8; core::mem::size_of::<wire::Accept>()];
    std::io::Read::read_exact(&mut held, &mut b).unwrap();
    assert_eq!(wire::read::<wire::Accept>(&b).unwrap().header.check(), Ok(wire::Kind::Accept));
    // Its own job with the flag: admitted like any other.
    let own = HelloMessage::new(&JobSpec { failover: true, ..spec(0xfa_13, 1) }, 0, &secret, &[&name[..]]).unwrap();
    let mut c = answered_hello(&srv.addr, &own, &token_bytes());
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    std::io::Read::read_exact(&mut c, &mut b).unwrap();
    assert_eq!(wire::read::<wire::Accept>(&b).unwrap().header.check(), Ok(wire::Kind::Accept));
    drop((held, c));
    let done = progress.load(Ordering::Relaxed);
    join_all(beside);
    assert!(done < 150, "the refusals came while the job beside ran ({done} rounds)");
}

/// Issue 55: a job's own ranks (two, by hand) report losing a server in
/// lock step with the largest reports, each pair a recovery round (a
/// Failover and a Recover of both reports to each), beside a failover job
/// on that server and another. The job beside never loses the server; the
/// flooding job gets its budget of rounds (`round_budget`) and is ended by
/// name, with a few log lines, not two a round.
#[test]
fn a_flood_of_lost_reports_ends_that_job_and_not_the_one_beside_it() {
    use tally_e2e::jobloop::{loop_job, results, server as plain_server, Shape};
    use tally_engine::control::round_budget::{ROUND_BURST, ROUND_EVERY};
    let servers: Vec<ServerProcess> = (0..2).map(|_| plain_server("tcp", &[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let beside =
        loop_job("tcp", &addrs, 0x1057_0001, 2, 400, progress.clone(), Shape { pace: Some(Duration::from_millis(10)), ..Shape::default() });
    wait_rounds(&progress, 5);
    // Job 0x1057_0002, both ranks by hand, on the first server only.
    let id = 0x1057_0002;
    let secret = [0x42u8; 32];
    let name = [2u8, 0, 0, 9, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    let mut conns: Vec<TcpStream> = (0..2)
        .map(|rank| answered_hello(&addrs[0], &HelloMessage::new(&spec(id, 2), rank, &secret, &[&name[..]]).unwrap(), &[0; TOKEN_BYTES]))
        .collect();
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut b = [0u8; core::mem::size_of::<wire::Accept>()];
        std::io::Read::read_exact(c, &mut b).unwrap();
        let accept: wire::Accept = wire::read(&b).unwrap();
        assert_eq!(accept.header.check(), Ok(wire::Kind::Accept));
        // Its lcores' names follow.
        let mut names = vec![0u8; accept.lcores as usize * core::mem::size_of::<wire::NameRecord>()];
        std::io::Read::read_exact(c, &mut names).unwrap();
    }
    let mut lost = bytemuck::bytes_of(&wire::Lost::new(1, 0, wire::MAX_REPORT)).to_vec();
    lost.resize(lost.len() + wire::MAX_REPORT as usize, 0x5a);
    let t = Instant::now();
    let mut rounds = 0u32;
    'flood: loop {
        assert!(t.elapsed() < Duration::from_secs(30), "the flooding job was never ended ({rounds} rounds)");
        for c in &mut conns {
            if c.write_all(&lost).is_err() {
                break 'flood;
            }
        }
        // Each rank hears the round's Failover, then its Recover.
        for c in &mut conns {
            for want in [wire::Kind::Failover, wire::Kind::Recover] {
                match next_message(c) {
                    Some(k) if k == want => {}
                    _ => break 'flood,
                }
            }
        }
        rounds += 1;
    }
    let took = t.elapsed();
    drop(conns);
    let res = results(beside);
    let lines = servers[0].log_count(&format!("{id:#x}"));
    eprintln!(
        "LOST FLOOD: {rounds} rounds in {took:?}, then ended; {lines} log lines name the job; the job beside: {:?}",
        res.iter().map(|r| r.as_ref().ok()).collect::<Vec<_>>()
    );
    for r in &res {
        let r = r.as_ref().expect("the job beside finishes, every element right");
        assert_eq!(r.recoveries, 0, "the job beside declared a server lost: {r:?}");
    }
    let earned = (took.as_secs_f64() / ROUND_EVERY.as_secs_f64()).ceil() as u32;
    assert!(
        (ROUND_BURST..=ROUND_BURST + earned).contains(&rounds),
        "{rounds} rounds in {took:?}: its budget is {ROUND_BURST} and one every {ROUND_EVERY:?}"
    );
    let tail = |s: &ServerProcess| s.log.lock().unwrap().iter().rev().take(12).cloned().collect::<Vec<_>>();
    assert!(
        servers[0].log_contains("more recovery rounds than servers can be lost"),
        "the flooding job is ended by name: {:?}",
        tail(&servers[0])
    );
    assert!(lines <= 20, "{lines} log lines for one flooding job: {:?}", tail(&servers[0]));
    // The server still admits and serves.
    join_all(sum_job("tcp", &addrs[0], 0x1057_0003, 2, 16 << 10, 3));
    for s in servers {
        assert!(s.stop().success());
    }
}

/// The kind of the next Failover or Recover (read whole) sent to a rank
/// joined by hand; None at anything else (the Reject that ends the job).
fn next_message(c: &mut TcpStream) -> Option<wire::Kind> {
    use std::io::Read;
    let mut head = [0u8; 32];
    let kind = loop {
        c.read_exact(&mut head[..8]).ok()?;
        match wire::read::<wire::Header>(&head).ok()?.check() {
            Ok(wire::Kind::Alive) => continue, // a heartbeat, a bare header
            Ok(k) => break k,
            Err(e) => panic!("the server sent {e:?}"),
        }
    };
    match kind {
        wire::Kind::Failover => c.read_exact(&mut head[8..core::mem::size_of::<wire::Failover>()]).ok()?,
        wire::Kind::Recover => {
            c.read_exact(&mut head[8..core::mem::size_of::<wire::Recover>()]).ok()?;
            let r: wire::Recover = wire::read(&head).ok()?;
            let mut reports = vec![0u8; r.nranks as usize * r.report_len as usize];
            c.read_exact(&mut reports).ok()?;
        }
        _ => return None,
    }
    Some(kind)
}
