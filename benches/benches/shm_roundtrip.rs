//! One round trip over libfabric's `shm` provider through tally's fabric
//! layer (`fabric::Endpoint`: the post, poll and EAGAIN-retry calls the
//! dataplane makes). Two endpoints of this process, both driven by one
//! thread: A sends a tagged ping into a receive B posted, B echoes the bytes
//! back into a receive A posted, for messages of 8 B and 4 KiB. Every round
//! trip checks both receives' length and tag, and a stamp that changes each
//! round in the first and last byte of what arrived at B and back at A.
//!
//! Unit: time per round trip (us); half of it is the one-way latency.
//! (`tally bench p2p --provider shm` reports that half, measured between two
//! pinned threads, each polling only its own endpoint.) Where shm cannot be
//! opened or does not carry a first message, this prints why and measures
//! nothing. The two endpoints are never closed (see `PAIR` for why).
use divan::Bencher;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tally_engine::dataplane::fabric::{shm, Completion, Endpoint, EndpointConfig, Hints, MemoryHandle, PeerAddr, PostError};
use tally_engine::dataplane::slab::{HugepagePolicy, Slab, SlabConfig};

/// The two endpoints, for the life of the process.
///
/// Deliberately never dropped (a `static` is not): two shm endpoints of one
/// process that talked to each other must not be closed while the other
/// still runs (ARCHITECTURE.md, "Provider facts": shm unmaps a region under
/// its peer), so neither endpoint, nor the slabs registered with them, is
/// ever closed; the process's exit ends both at once.
static PAIR: OnceLock<Mutex<Pair>> = OnceLock::new();

fn main() {
    match Pair::open() {
        Ok(pair) => {
            if PAIR.set(Mutex::new(pair)).is_err() {
                unreachable!("the pair is opened once");
            }
            divan::main();
        }
        Err(why) => println!("shm_roundtrip: skipped: {why}"),
    }
    remove_own_regions();
}

/// Unlinks this process's shm region files (`/dev/shm/PID:UID:N`), which
/// shm removes only when an endpoint closes and these never do. Our own
/// mappings stay valid; no endpoint opens a connection after the benchmarks.
/// (A later process's first shm endpoint would sweep them anyway, as those
/// of a PID that no longer runs.)
fn remove_own_regions() {
    // The real uid, as shm writes it in region names: /proc/self/status "Uid: real effective ...".
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().next()?.parse::<u32>().ok()));
    let Some(uid) = uid else { return };
    for s in shm::sweep(Path::new("/dev/shm"), std::process::id(), uid, shm::SweepMode::OwnPid, |_| true) {
        if let Some(e) = s.error {
            eprintln!("shm_roundtrip: could not remove {}: {e}", s.path.display());
        }
    }
}

#[divan::bench(args = [8, 4096])]
fn round_trip(bencher: Bencher, len: usize) {
    let mut pair = PAIR.get().expect("opened in main").lock().unwrap_or_else(|p| p.into_inner());
    bencher.bench_local(|| pair.round_trip(len).unwrap_or_else(|e| panic!("shm round trip of {len} B: {e}")));
}

/// The largest message, and the slot size of each end's slab.
const MAX_LEN: usize = 4096;
/// A: slot 0 sends the ping, slot 1 receives the pong. B: slot 0 receives
/// the ping and sends it back from there.
const A_TX: usize = 0;
const A_RX: usize = 1;
const B_BUF: usize = 0;
const SEND_CTX: u32 = 0;
const RECV_CTX: u32 = 1;
const TAG_PING: u64 = 0x7a11_0001;
const TAG_PONG: u64 = 0x7a11_0002;
/// How long one post or wait may take before the round trip is declared stuck.
const STUCK_AFTER: Duration = Duration::from_secs(10);

/// One end: its endpoint, a slab of two page-aligned 4 KiB slots in normal
/// pages (registered once), the other end's address, and what completed.
struct Side {
    ep: Endpoint,
    slab: Slab,
    mh: MemoryHandle,
    peer: PeerAddr,
    sends_done: u32,
    received: Option<Completion>,
}

impl Side {
    fn open(label: &str) -> Result<Side, String> {
        let cfg = EndpointConfig { hints: Hints::new("shm"), cq_size: 0, contexts: 2, wait_object: false };
        let mut ep = Endpoint::open(&cfg).map_err(|e| format!("cannot open an shm endpoint: {e}"))?;
        if ep.provider() != "shm" {
            return Err(format!("asked for shm, libfabric gave {}", ep.provider()));
        }
        let mut scfg = SlabConfig::new(label, MAX_LEN, 2);
        scfg.policy = HugepagePolicy::Off;
        scfg.page_aligned_slots = true;
        let slab = Slab::new(&scfg).map_err(|e| e.to_string())?;
        // SAFETY: the registration needs the slab mapped as long as the
        // endpoint may use it. Both live in this `Side`: it either ends in
        // the never-dropped `PAIR`, or is dropped whole before any operation
        // was posted, the endpoint (first field) closed before the slab.
        let mh = unsafe { ep.register(slab.as_ptr(), slab.len()) }.map_err(|e| format!("registering the slab: {e}"))?;
        Ok(Side { ep, slab, mh, peer: 0, sends_done: 0, received: None })
    }

    /// Reads completions (which also drives this end's progress).
    fn poll(&mut self) -> Result<usize, String> {
        let mut done = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 4];
        let n = self.ep.poll(&mut done).map_err(|e| e.to_string())?;
        for c in &done[..n] {
            if c.is_recv {
                self.received = Some(*c);
            } else {
                self.sends_done += 1;
            }
        }
        Ok(n)
    }

    /// Sets the first and last byte of `slot`'s first `len` bytes. Only
    /// between round trips: then no operation is in flight on this end.
    fn mark(&mut self, slot: usize, len: usize, first: u8, last: u8) {
        let s = self.slab.slot_mut(slot);
        s[0] = first;
        s[len - 1] = last;
    }

    /// The first and last byte of `slot`'s first `len` bytes.
    fn ends(&self, slot: usize, len: usize) -> (u8, u8) {
        let s = self.slab.slot(slot);
        (s[0], s[len - 1])
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    A,
    B,
}

#[derive(Clone, Copy)]
enum Op {
    Send,
    Recv,
}

struct Pair {
    a: Side,
    b: Side,
    round: u64,
}

impl Pair {
    /// Opens both ends, makes each reachable from the other, and does one
    /// round trip of each size (shm's connection set-up happens there).
    fn open() -> Result<Pair, String> {
        let mut a = Side::open("bench shm a")?;
        let mut b = Side::open("bench shm b")?;
        let (name_a, name_b) = (a.ep.name().map_err(|e| e.to_string())?, b.ep.name().map_err(|e| e.to_string())?);
        a.peer = a.ep.insert_peer(&name_b).map_err(|e| e.to_string())?;
        b.peer = b.ep.insert_peer(&name_a).map_err(|e| e.to_string())?;
        let mut pair = Pair { a, b, round: 0 };
        for len in [8, MAX_LEN] {
            if let Err(e) = pair.round_trip(len) {
                // The ends may have talked: closing them now is what the
                // static avoids, so they are leaked here too.
                std::mem::forget(pair);
                return Err(format!("first round trip of {len} B: {e}"));
            }
        }
        Ok(pair)
    }

    fn end(&mut self, end: End) -> &mut Side {
        match end {
            End::A => &mut self.a,
            End::B => &mut self.b,
        }
    }

    /// Polls both ends: with manual progress each moves only when polled.
    fn progress(&mut self) -> Result<usize, String> {
        Ok(self.a.poll()? + self.b.poll()?)
    }

    /// Posts a send to, or a receive from, the other end of `len` bytes at
    /// `slot`, progressing both ends while shm answers EAGAIN (a sender's
    /// first messages are refused until its peer was progressed once).
    fn post(&mut self, end: End, op: Op, slot: usize, len: usize, tag: u64) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let side = self.end(end);
            let at = side.slab.slot_ptr(slot);
            let posted = match op {
                // SAFETY: `at..at+len` is inside a slot of this side's slab
                // (len <= MAX_LEN, the slot size), registered as `mh` and
                // mapped for the life of the endpoint (see `Side::open`). The
                // round trip neither writes nor reads the slot until the
                // completion for SEND_CTX has been polled.
                Op::Send => unsafe { side.ep.send(at, len, Some(side.mh), side.peer, tag, SEND_CTX) },
                // SAFETY: as for the send; nothing else touches the slot
                // until the completion for RECV_CTX has been polled, and no
                // other receive is posted into it meanwhile.
                Op::Recv => unsafe { side.ep.recv(at, len, Some(side.mh), Some(side.peer), tag, 0, RECV_CTX) },
            };
            match posted {
                Ok(()) => return Ok(()),
                Err(PostError::Again) if start.elapsed() < STUCK_AFTER => {
                    self.progress()?;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Progresses both ends until `done` holds.
    fn wait(&mut self, what: &str, done: impl Fn(&Pair) -> bool) -> Result<(), String> {
        let mut idle = 0u32;
        let mut start = None;
        while !done(self) {
            if self.progress()? == 0 {
                idle += 1;
                // Read the clock only now and then: a round trip is microseconds.
                if idle.is_multiple_of(4096) && start.get_or_insert_with(Instant::now).elapsed() > STUCK_AFTER {
                    return Err(format!("timed out waiting for {what}"));
                }
            }
        }
        Ok(())
    }

    /// Ping from A to B, pong (B echoing the ping's bytes) from B to A; then
    /// checks what arrived at each end.
    fn round_trip(&mut self, len: usize) -> Result<(), String> {
        assert!((1..=MAX_LEN).contains(&len));
        self.round += 1;
        // 1..=254, so that neither byte of the stamp is ever 0 (the cleared value).
        let first = (self.round % 254 + 1) as u8;
        let last = first + 1;
        // The previous round waited for all four completions: nothing is in
        // flight, every slot may be written.
        self.a.mark(A_TX, len, first, last);
        self.a.mark(A_RX, len, 0, 0);
        self.b.mark(B_BUF, len, 0, 0);
        for side in [&mut self.a, &mut self.b] {
            side.sends_done = 0;
            side.received = None;
        }

        self.post(End::B, Op::Recv, B_BUF, len, TAG_PING)?;
        self.post(End::A, Op::Recv, A_RX, len, TAG_PONG)?;
        self.post(End::A, Op::Send, A_TX, len, TAG_PING)?;
        self.wait("the ping", |p| p.b.received.is_some())?;
        check("ping at B", self.b.received, TAG_PING, len, self.b.ends(B_BUF, len), (first, last))?;

        self.post(End::B, Op::Send, B_BUF, len, TAG_PONG)?;
        self.wait("the pong and both send completions", |p| p.a.received.is_some() && p.a.sends_done == 1 && p.b.sends_done == 1)?;
        check("pong at A", self.a.received, TAG_PONG, len, self.a.ends(A_RX, len), (first, last))
    }
}

/// Whether a receive completed as expected: the tag and length sent, and
/// the stamp in the first and last byte.
fn check(what: &str, got: Option<Completion>, tag: u64, len: usize, ends: (u8, u8), stamp: (u8, u8)) -> Result<(), String> {
    let c = got.ok_or_else(|| format!("{what}: no receive completion"))?;
    if c.context != RECV_CTX || c.tag != tag || c.len != len {
        return Err(format!("{what}: completion {c:?}, expected context {RECV_CTX}, tag {tag:#x}, {len} B"));
    }
    if ends != stamp {
        return Err(format!("{what}: first/last byte {ends:?}, sent {stamp:?}"));
    }
    Ok(())
}
