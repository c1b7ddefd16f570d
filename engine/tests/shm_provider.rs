//! libfabric 1.17 shm provider quirks that tally works around in
//! `engine/src/dataplane/fabric`, each shown on real endpoints.
use std::time::{Duration, Instant};
use tally_engine::dataplane::fabric::{Completion, Endpoint, EndpointConfig, Hints, PollError, PostError};

fn config(provider: &str) -> EndpointConfig {
    let node = if provider.starts_with("tcp") { Some("127.0.0.1") } else { None };
    EndpointConfig { hints: Hints::new(provider).with_node(node), cq_size: 0, contexts: 256, wait_object: false }
}

const NONE: Completion = Completion { context: 0, is_recv: false, len: 0, tag: 0 };
/// The server's tag layout: job(16) | slot(16) | seq(32); receives ignore the sequence.
const SEQ_BITS: u64 = 0xffff_ffff;

fn tag(slot: u64, seq: u64) -> u64 {
    0x7001 << 48 | slot << 32 | seq
}

/// Polls `ep` once, collecting its completions; an error completion fails the test.
fn poll_into(ep: &mut Endpoint, out: &mut Vec<Completion>) -> usize {
    let mut buf = [NONE; 16];
    match ep.poll(&mut buf) {
        Ok(n) => {
            out.extend_from_slice(&buf[..n]);
            n
        }
        Err(PollError::Completion(e)) => panic!("error completion: {e}"),
        Err(PollError::Fabric(e)) => panic!("{e}"),
    }
}

/// Sends from `a`, progressing both sides while the provider says "again"
/// (shm: until the peer has processed the connection request).
fn send(a: &mut Endpoint, b: &mut Endpoint, buf: &[u8], dest: u64, tag: u64, ctx: u32, seen: &mut Vec<Completion>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // SAFETY: every buffer passed here is a static or outlives the test's final drain.
        match unsafe { a.send(buf.as_ptr(), buf.len(), None, dest, tag, ctx) } {
            Ok(()) => return,
            Err(PostError::Again) => {
                assert!(Instant::now() < deadline, "send stuck in EAGAIN");
                let mut sink = Vec::new();
                poll_into(a, &mut sink);
                poll_into(b, seen);
            }
            Err(e) => panic!("send: {e}"),
        }
    }
}

/// A receiver whose receives ignore the sequence bits (as tally's server
/// posts them) gets messages that arrived before the receive was posted
/// (unexpected messages), whatever their sequence number.
///
/// libfabric 1.17 shm matches an unexpected message against a new receive
/// with the mask stored in the unexpected entry, which is left over from
/// whichever receive last used that entry of the provider's receive pool
/// (zero for one never used): without tally's workaround (priming the pool
/// with the endpoint's mask) the receives below never complete.
fn unexpected_messages_match_masked_receives(provider: &str) {
    const K: usize = 8;
    static PAYLOAD: [u8; 64] = [0x5a; 64];
    let mut a = Endpoint::open(&config(provider)).expect("open a");
    let mut b = Endpoint::open(&config(provider)).expect("open b");
    let b_at_a = a.insert_peer(&b.name().unwrap()).unwrap();
    let a_at_b = b.insert_peer(&a.name().unwrap()).unwrap();
    let mut dst = vec![0u8; 64 * (K + 1)];
    let mut got = Vec::new();
    // One round as a server starts a job: receive posted first, then the message.
    // SAFETY: dst outlives every receive (all are drained before the end).
    unsafe { b.recv(dst.as_mut_ptr(), 64, None, Some(a_at_b), tag(0, 0), SEQ_BITS, 0) }.unwrap();
    send(&mut a, &mut b, &PAYLOAD, b_at_a, tag(0, 0), 100, &mut got);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.is_empty() {
        assert!(Instant::now() < deadline, "{provider}: the first (expected) message never arrived");
        poll_into(&mut a, &mut Vec::new());
        poll_into(&mut b, &mut got);
    }
    assert_eq!((got[0].context, got[0].tag), (0, tag(0, 0)));
    // Now K messages with later sequence numbers arrive before their receives.
    for k in 0..K {
        send(&mut a, &mut b, &PAYLOAD, b_at_a, tag(1 + k as u64, 7 + k as u64), 101 + k as u32, &mut got);
    }
    // Progress the receiver so they land in its unexpected queue (shm: the
    // commands are already in its queue; tcp: they may still be in flight,
    // which makes them ordinary expected messages there).
    for _ in 0..10 {
        poll_into(&mut a, &mut Vec::new());
        poll_into(&mut b, &mut got);
    }
    got.clear();
    for k in 0..K {
        // SAFETY: as above; each receive has its own 64 bytes of dst.
        let r = unsafe { b.recv(dst.as_mut_ptr().add(64 * (k + 1)), 64, None, Some(a_at_b), tag(1 + k as u64, 0), SEQ_BITS, 1 + k as u32) };
        r.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < K {
        if Instant::now() > deadline {
            let mut missing: Vec<usize> = (0..K).filter(|k| !got.iter().any(|c| c.context == 1 + *k as u32)).collect();
            missing.sort();
            panic!("{provider}: receives for unexpected messages {missing:?} never completed (got {got:?})");
        }
        poll_into(&mut a, &mut Vec::new());
        poll_into(&mut b, &mut got);
    }
    for c in &got {
        let k = (c.context - 1) as u64;
        assert!(c.is_recv && k < K as u64, "{c:?}");
        assert_eq!(c.tag, tag(1 + k, 7 + k), "the completion carries the message's own tag");
        assert_eq!(c.len, 64);
    }
    assert!(dst.iter().all(|&x| x == 0x5a), "every byte arrived");
    // Drain a's send completions before the endpoints close.
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.in_flight() > 0 {
        assert!(Instant::now() < deadline, "{provider}: sends never completed");
        poll_into(&mut a, &mut Vec::new());
        poll_into(&mut b, &mut Vec::new());
    }
}

#[test]
fn shm_unexpected_messages_match_receives_that_ignore_the_sequence() {
    unexpected_messages_match_masked_receives("shm");
}

#[test]
fn tcp_unexpected_messages_match_receives_that_ignore_the_sequence() {
    unexpected_messages_match_masked_receives("tcp");
}

/// The workaround's contract: over shm one endpoint uses one tag mask, so a
/// receive with another mask after the first masked one is refused (a
/// mixed pool would match unexpected messages with either mask); other
/// providers take any mask.
fn one_tag_mask_per_endpoint(provider: &str) {
    let mut b = Endpoint::open(&config(provider)).expect("open b");
    let mut dst = [0u8; 64];
    // SAFETY: dst outlives both receives (canceled and drained below).
    unsafe { b.recv(dst.as_mut_ptr(), 32, None, None, tag(0, 0), SEQ_BITS, 0) }.unwrap();
    // SAFETY: as above, the other half of dst.
    let r = unsafe { b.recv(dst.as_mut_ptr().add(32), 32, None, None, tag(1, 0), 0, 1) };
    if provider == "shm" {
        match r {
            Err(PostError::Fabric(e)) => {
                assert_eq!(e.code, libc::EINVAL, "{e}");
                assert!(e.to_string().contains("one tag mask per endpoint"), "{e}");
            }
            other => panic!("shm: a receive with a second tag mask was not refused: {other:?}"),
        }
    } else {
        r.unwrap();
    }
    b.cancel_all();
    assert_eq!(b.in_flight(), 0, "{provider}: canceled receives drained");
}

#[test]
fn shm_one_tag_mask_per_endpoint() {
    one_tag_mask_per_endpoint("shm");
}

#[test]
fn tcp_any_tag_mask() {
    one_tag_mask_per_endpoint("tcp");
}

/// shm completes an endpoint's sends in order, so a send its receiver never
/// takes holds up every later one: once its owner abandons it, the endpoint
/// refuses sends (FI_EIO) instead of letting them hang. A 64 KiB send goes
/// by the copy protocol (a response-queue entry); the receiver is simply
/// never progressed while the sender gives up on it.
#[test]
fn shm_an_abandoned_send_blocks_further_sends() {
    static BIG: [u8; 64 << 10] = [7; 64 << 10];
    let mut a = Endpoint::open(&config("shm")).expect("open a");
    let mut b = Endpoint::open(&config("shm")).expect("open b");
    let b_at_a = a.insert_peer(&b.name().unwrap()).unwrap();
    let a_at_b = b.insert_peer(&a.name().unwrap()).unwrap();
    let mut seen = Vec::new();
    send(&mut a, &mut b, &BIG, b_at_a, tag(0, 1), 10, &mut seen);
    for _ in 0..10 {
        poll_into(&mut a, &mut seen);
    }
    assert!(a.is_in_flight(10) && seen.is_empty(), "the send cannot complete: its receiver never ran");
    assert!(!a.sends_blocked());
    assert_eq!(a.abandon(0..5), 0, "nothing in flight there");
    assert!(!a.sends_blocked());
    assert_eq!(a.abandon(10..11), 1);
    assert!(a.sends_blocked(), "an abandoned shm send blocks the endpoint's sends");
    // SAFETY: BIG is static (and this send is refused anyway).
    let r = unsafe { a.send(BIG.as_ptr(), 100, None, b_at_a, tag(0, 2), 11) };
    match r {
        Err(PostError::Fabric(e)) => {
            assert_eq!(e.code, libc::EIO, "{e}");
            assert!(e.to_string().contains("completes an endpoint's sends in order"), "{e}");
        }
        other => panic!("a send after an abandoned one was not refused: {other:?}"),
    }
    assert!(!a.is_in_flight(11));
    // Receives still work, and the abandoned send completes if its receiver
    // takes it after all (its buffer is the provider's until then).
    let mut dst = vec![0u8; 64 << 10];
    // SAFETY: dst outlives the receive, drained below.
    unsafe { b.recv(dst.as_mut_ptr(), dst.len(), None, Some(a_at_b), tag(0, 1), 0, 1) }.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while got.is_empty() || a.in_flight() > 0 {
        assert!(Instant::now() < deadline, "the late receive or the abandoned send never completed");
        poll_into(&mut b, &mut got);
        poll_into(&mut a, &mut seen);
    }
    assert_eq!((got[0].context, got[0].len), (1, 64 << 10));
    assert!(dst.iter().all(|&x| x == 7));
    assert_eq!(seen.iter().map(|c| c.context).collect::<Vec<_>>(), vec![10]);
}

/// Other providers do not complete sends in order: abandoning one changes nothing.
#[test]
fn tcp_an_abandoned_send_does_not_block_further_sends() {
    let mut a = Endpoint::open(&config("tcp")).expect("open a");
    let b = Endpoint::open(&config("tcp")).expect("open b");
    let b_at_a = a.insert_peer(&b.name().unwrap()).unwrap();
    static BIG: [u8; 64 << 10] = [7; 64 << 10];
    // SAFETY: BIG is static.
    match unsafe { a.send(BIG.as_ptr(), BIG.len(), None, b_at_a, tag(0, 1), 10) } {
        Ok(()) | Err(PostError::Again) => {}
        Err(e) => panic!("{e}"),
    }
    let n = a.abandon(0..64);
    assert!(n <= 1);
    assert!(!a.sends_blocked());
    a.cancel_all();
}
