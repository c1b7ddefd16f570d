//! Floods of messages for no receive: at a server's lcore (`shard::sweep`)
//! and at a rank (`client::sweep`), each beside a running job whose every
//! element is checked.
use super::{job, join_by_hand, rank_cfg, server, spec, wait_rounds};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally_e2e::join_all;
use tally_engine::client::{Client, ClientConfig};
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::wire::{self, HelloMessage, JobSecret};

/// Messages for no receive: a token holder who learnt an lcore's endpoint
/// name (here from a job of its own) floods it with pieces whose tags no
/// job of that lcore holds. Without the lcore's sweep they would wait in
/// the provider's queue of unexpected messages for good (2,000 of 64 KiB
/// once held 145 MB of a server's memory). Each is discarded and counted;
/// a job running beside the flood is unharmed. The server's resident memory
/// grows by what the queue held at its peak (rxm 1.17 grows its buffer pool
/// 16.9 MB at a time and never shrinks it), not by all of the flood, as
/// before (2,000 messages held 145 MB for good). Not bounded: a sender
/// faster than the lcore's discards still grows the queue (docs/security.md).
#[test]
fn a_flood_of_messages_for_no_receive_is_discarded_and_memory_comes_back() {
    use tally_engine::dataplane::fabric::{Endpoint, EndpointConfig, Hints};
    let srv = server("tcp");
    let metrics = srv.metrics_addr();
    // Warm the server up (its first job's regions, connections and pools)
    // before the baseline is read.
    let progress = Arc::new(AtomicUsize::new(0));
    join_all(job(&srv.addr, 0xf100, 2, 10, [3u8; 32], progress));
    // The attacker's own job (one rank, never sending): its Accept names the lcore.
    let ecfg = EndpointConfig { hints: Hints::new("tcp").with_node(Some("127.0.0.1")), cq_size: 0, contexts: 64, wait_object: false };
    let mut ep = Endpoint::open(&ecfg).unwrap();
    let name = ep.name().unwrap();
    let (conn, accept, at) =
        join_by_hand(&srv.addr, &mut ep, &HelloMessage::new(&spec(0xf10d, 1), 0, &[4u8; 32], &[name.as_bytes()]).unwrap());
    std::thread::sleep(Duration::from_millis(500));
    let before = srv.status("VmRSS");
    // The flood: tags of jobs this lcore does not run, and of the
    // attacker's own job at slots past its window.
    let (n, len) = (4000u32, 64usize << 10);
    // A job beside the flood, from before it to after it, every element checked.
    let progress = Arc::new(AtomicUsize::new(0));
    let beside = job(&srv.addr, 0xf101, 2, 60, [5u8; 32], progress.clone());
    wait_rounds(&progress, 2);
    let own = accept.job();
    let mut buf = send_junk(&mut ep, at, n, len, |sent| {
        if sent.is_multiple_of(2) {
            wire::Tag::new(own.job ^ 0x4000 ^ (sent as u16 & 0xff), (sent % 7) as u16, sent)
        } else {
            own.tag(1000 + (sent % 50) as u16, sent)
        }
    });
    // The server discards them as its lcore comes to them.
    let discarded = || tally_e2e::sum(&tally_e2e::scrape(&metrics), "tally_lcore_unexpected_discarded_total", "");
    let deadline = Instant::now() + Duration::from_secs(60);
    while discarded() < n as f64 {
        let _ = ep.poll(&mut buf);
        assert!(
            Instant::now() < deadline,
            "{} of {n} messages discarded; server RSS {before} kB before, {} kB now",
            discarded(),
            srv.status("VmRSS")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    join_all(beside);
    std::thread::sleep(Duration::from_millis(500));
    let after = srv.status("VmRSS");
    eprintln!(
        "HOSTILE flood: {n} messages of {} KiB for no receive: {} discarded; server RSS {} MB before, {} MB after ({:+.1}%); the job beside it 0 wrong",
        len >> 10,
        discarded(),
        before / 1024,
        after / 1024,
        (after as f64 / before as f64 - 1.0) * 100.0
    );
    assert_eq!(discarded(), n as f64, "only the flood is discarded");
    // Below three quarters of the flood (it held all of it, and more, before
    // the sweep): the peak the queue reaches depends on how the two
    // processes share a busy machine's cores, so no tighter figure holds.
    let flood_kb = (n as u64 * len as u64) >> 10;
    assert!(after < before + flood_kb * 3 / 4, "resident memory {before} kB before a flood of {flood_kb} kB, {after} kB after");
    drop(ep);
    drop(conn);
    assert!(srv.stop().success());
}

/// The same at a rank: a peer that learnt a rank's endpoint name (any
/// server of its job, or anyone on the path) floods it with messages for no
/// receive of the rank, among them tags of the rank's own job number under
/// wrong sequence keys, which is what a fenced job's server sends once it
/// runs again (`client::sweep`). The rank discards every one, and only
/// those, while its job goes on: every element of every all-reduce checked,
/// none stalled by a discarded result.
#[test]
fn a_flood_of_messages_for_no_receive_at_a_rank_is_discarded_and_its_job_goes_on() {
    flood_a_rank(1, false);
}

/// The same with the rank's endpoints on rail threads (two rails): the
/// sweep's completions come back apart from the data's.
#[test]
fn a_flood_of_messages_for_no_receive_at_a_rank_with_rails_is_discarded_and_its_job_goes_on() {
    flood_a_rank(2, false);
}

/// The same on the caller's rail (`TALLY_CALLER_RAIL`, the plugin's
/// default): the flooded endpoint is rail 0, driven by the rank's own
/// thread, whose sweep completions come back with the data's while rail 1's
/// thread keeps its own apart.
#[test]
fn a_flood_of_messages_for_no_receive_on_the_callers_rail_is_discarded_and_its_job_goes_on() {
    flood_a_rank(2, true);
}

/// Sends `n` messages of `len` junk bytes from `ep` to `at`, message `i`
/// under `tag_of(i)`, within a minute; returns the completion buffer for
/// the polls that keep the sends moving.
fn send_junk(
    ep: &mut tally_engine::dataplane::fabric::Endpoint,
    at: tally_engine::dataplane::fabric::PeerAddr,
    n: u32,
    len: usize,
    tag_of: impl Fn(u32) -> wire::Tag,
) -> [tally_engine::dataplane::fabric::Completion; 16] {
    use tally_engine::dataplane::fabric::{Completion, PostError};
    // Leaked: the provider may read a send's bytes after this returns.
    let junk: &'static [u8] = vec![0x5au8; len].leak();
    let mut buf = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
    let (mut sent, mut ctx) = (0u32, 0u32);
    let deadline = Instant::now() + Duration::from_secs(60);
    while sent < n {
        assert!(Instant::now() < deadline, "the attacker sent {sent} of {n}");
        // SAFETY: `junk` lives for the rest of the process.
        match unsafe { ep.send(junk.as_ptr(), len, None, at, tag_of(sent).0, ctx % 64) } {
            Ok(()) => {
                sent += 1;
                ctx += 1;
            }
            Err(PostError::ContextBusy(_)) => ctx += 1,
            Err(PostError::Again) => {}
            Err(e) => panic!("send: {e}"),
        }
        let _ = ep.poll(&mut buf);
    }
    buf
}

/// Rank 0 of a two-rank job on `rails` rails (rail 0 the caller's own with
/// `caller_rail`) is flooded on its first one.
fn flood_a_rank(rails: usize, caller_rail: bool) {
    use std::sync::mpsc;
    use tally_engine::dataplane::fabric::{Endpoint, EndpointConfig, Hints};
    let srv = server("tcp");
    let secret: JobSecret = ClientConfig::draw_job_secret().unwrap();
    let (n, len) = (2000u64, 64usize << 10);
    let (name_tx, name_rx) = mpsc::channel();
    let flood_sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two ranks; element 0 of rank 0's input says whether it wants another
    // round (until it has discarded the whole flood, or a deadline), so
    // both ranks run the same all-reduces.
    let ranks: Vec<_> = (0..2u32)
        .map(|rank| {
            let cfg = ClientConfig { rails, caller_rail, ..rank_cfg(&srv.addr, 0xf1a0, rank, 2, secret) };
            let (name_tx, flood_sent) = (name_tx.clone(), flood_sent.clone());
            std::thread::spawn(move || -> Result<(u64, usize), String> {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                c.join(DataType::Float32, ReduceOp::Sum).map_err(|e| e.to_string())?;
                if rank == 0 {
                    name_tx.send(c.endpoint_names()).unwrap();
                }
                let deadline = Instant::now() + Duration::from_secs(90);
                let count = 16 << 10;
                for round in 0.. {
                    let more = rank == 0
                        && Instant::now() < deadline
                        && !(flood_sent.load(Ordering::Relaxed) && c.failover_stats().discarded >= n);
                    let mut send: Vec<f32> = (0..count).map(|i| (rank as usize + i % 97 + round) as f32).collect();
                    send[0] = f32::from(u8::from(more));
                    let mut out = vec![0f32; count];
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                        .map_err(|e| format!("rank {rank} round {round}: {e}"))?;
                    for (i, v) in out.iter().enumerate().skip(1) {
                        let want = (2 * (i % 97 + round) + 1) as f32;
                        if *v != want {
                            return Err(format!("rank {rank} round {round}: element {i} = {v}, want {want}"));
                        }
                    }
                    if out[0] == 0.0 {
                        return Ok((c.failover_stats().discarded, round + 1));
                    }
                }
                unreachable!()
            })
        })
        .collect();
    let names = name_rx.recv_timeout(Duration::from_secs(60)).expect("rank 0 joined");
    let ecfg = EndpointConfig { hints: Hints::new("tcp").with_node(Some("127.0.0.1")), cq_size: 0, contexts: 64, wait_object: false };
    let mut ep = Endpoint::open(&ecfg).unwrap();
    let at = ep.insert_peer(&names[0]).unwrap();
    // Job numbers the server hands out first (the rank's own among them)
    // with sequences that carry no key of theirs, and others.
    let mut buf = send_junk(&mut ep, at, n as u32, len, |sent| {
        wire::Tag::new((sent % 5) as u16 + u16::from(sent % 3 == 0) * 0x2000, (sent % 9) as u16, sent.wrapping_mul(7919))
    });
    flood_sent.store(true, Ordering::Relaxed);
    // The attacker's endpoint keeps its sends moving until the ranks end.
    while !ranks.iter().all(|r| r.is_finished()) {
        let _ = ep.poll(&mut buf);
        std::thread::sleep(Duration::from_millis(2));
    }
    let done: Vec<_> = ranks.into_iter().map(|r| r.join().unwrap().expect("every round of both ranks")).collect();
    let (discarded, rounds) = done[0];
    eprintln!(
        "HOSTILE rank flood ({rails} rail(s), caller's rail {caller_rail}): {n} messages of {} KiB for no receive: rank 0 discarded {discarded} over {rounds} all-reduces, 0 wrong",
        len >> 10
    );
    assert_eq!(discarded, n, "rank 0 discards the flood, and nothing else");
    assert_eq!(done[1].0, 0, "rank 1, which nobody flooded, discards nothing");
    drop(ep);
    assert!(srv.stop().success());
}
