//! `tally bench p2p --hubs L --leaves R`: the fan mode, the transport
//! ceiling that a server's core scaling is held against.
//!
//! An agg all-reduce of S bytes over R ranks and one server of L lcores
//! moves, each way, R x L concurrent streams of S/L bytes: every rank sends
//! its chunk `c` to lcore `c mod L` (`engine::client`), each lcore on its
//! own core with its own endpoint, and every lcore sends each rank the same
//! bytes back. How the server's input rate (R x S / time) grows with L says
//! little until it is compared with what the transport itself does with the
//! same streams on the same cores; this mode measures that, through the
//! same fabric calls, with the reduce left out.
//!
//! L hub threads and R leaf threads, each pinned to its core (hubs take the
//! first L cores of `--cores`, leaves the next R) with its own endpoint and
//! one slab registered once. A repetition: every leaf cuts its S bytes as
//! the client does (pieces of `--chunk` bytes, smaller when S is too small
//! to give every hub a full one: `client::op_chunk_bytes`), piece `c` goes
//! to hub `c mod L`, with up to `--window` pieces in flight per (leaf, hub)
//! pair, each posted as the client posts a chunk: the receive for its
//! return straight into the leaf's output buffer, then the send from its
//! input buffer. A hub keeps `--window` receives posted per leaf, as an
//! lcore keeps its slots, and sends each piece back from the buffer it
//! arrived in as soon as it arrived (an echo: the server's traffic without
//! the reduce); a slot takes the next piece once its echo has completed.
//! Tags carry the direction, the leaf, the hub and the chunk index, so a
//! piece can only land at its own place.
//!
//! Timing: all threads (and the coordinating main thread) meet at a gate
//! before each repetition; the repetition's time runs from the earliest
//! release to the last leaf's final completion. Reported per size: the
//! median and best of `--iters` repetitions after `--warmup` untimed ones,
//! as hub input GB/s (R x S / time, the all-reduce's "server input"; the
//! same bytes flow back, so each way), and per hub (that divided by L).
//!
//! Every repetition, warm-up included, is checked: leaves fill their input
//! with a pattern derived from (leaf, hub, offset), clear their output, and
//! after the repetition compare every returned byte with what was sent. A
//! difference, a piece of the wrong length, an error completion or 60 s
//! without progress ends the run with an error; the gate then releases
//! every other thread instead of leaving it waiting for the failed one.
use super::args::{poll_and_policy, P2pArgs};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tally_engine::client::{op_chunk_bytes, ClientConfig};
use tally_engine::dataplane::fabric::{
    Completion, Endpoint, EndpointConfig, EndpointName, Hints, MemoryHandle, PeerAddr, PollError, PostError,
};
use tally_engine::dataplane::slab::{HugepagePolicy, Slab, SlabConfig};
use tally_engine::host::cpuset::{self, CoreList};
use tally_engine::host::units::{format_size, parse_size};

/// Leaf to hub.
const DIR_UP: u64 = 1;
/// Hub to leaf (the echo).
const DIR_DOWN: u64 = 2;
/// Leaves and hubs each have 14 bits of the tag (see `tag`).
const MAX_PEERS: usize = 1 << 14;
/// Pieces per leaf: the chunk index has 32 bits of the tag.
const MAX_PIECES: usize = 1 << 32;
/// The context table bounds the operations in flight.
const MAX_WINDOW: usize = 1024;
/// A peer that completes nothing for this long has failed.
const STALL: Duration = Duration::from_secs(60);
/// Empty polls between looks at the clock and the failure flag.
const CHECK_EVERY: u32 = 256;
const DEFAULT_CHUNK: usize = 256 << 10;
const DEFAULT_ITERS: usize = 10;
const DEFAULT_WARMUP: usize = 2;
/// As `tally bench allreduce --window`, so that the two compare.
const DEFAULT_WINDOW: usize = 4;
const ABORTED: &str = "stopped: another thread failed";

#[derive(Serialize, Debug, Clone)]
struct FanRow {
    mode: &'static str,
    hubs: usize,
    leaves: usize,
    /// Bytes per leaf (S).
    bytes: usize,
    chunk: usize,
    /// The piece size used at this S (`chunk`, or less when S is small).
    piece: usize,
    window: usize,
    iters: usize,
    /// Median repetition.
    time_us: f64,
    best_time_us: f64,
    /// leaves x bytes / time: what the hubs take in (and send back).
    #[serde(rename = "hub_input_GBps")]
    hub_input_gbps: f64,
    #[serde(rename = "best_hub_input_GBps")]
    best_hub_input_gbps: f64,
    #[serde(rename = "per_hub_GBps")]
    per_hub_gbps: f64,
}

#[derive(Serialize)]
struct FanReport {
    provider: String,
    mode: &'static str,
    hubs: usize,
    leaves: usize,
    hub_cores: Vec<usize>,
    leaf_cores: Vec<usize>,
    poll: &'static str,
    results: Vec<FanRow>,
}

#[derive(Clone)]
struct FanPlan {
    provider: String,
    hubs: usize,
    leaves: usize,
    sizes: Vec<usize>,
    chunk: usize,
    window: usize,
    iters: usize,
    warmup: usize,
    busy: bool,
    /// Empty polls before an adaptive poller sleeps (as an lcore does).
    spin: u32,
    policy: HugepagePolicy,
    /// Largest S: the leaves' buffers are sized for it.
    max: usize,
    /// The client's smallest spreading piece (`ClientConfig::min_piece`).
    min_piece: usize,
}

pub fn run(args: &P2pArgs) -> Result<(), String> {
    let (hubs, leaves) = (args.hubs, args.leaves);
    if hubs == 0 || leaves == 0 {
        return Err(format!("fan mode needs both --hubs and --leaves above 0 (got --hubs {hubs} --leaves {leaves})"));
    }
    if hubs > MAX_PEERS || leaves > MAX_PEERS {
        return Err(format!("--hubs and --leaves: at most {MAX_PEERS} each"));
    }
    let provider = tally_engine::dataplane::fabric::select_provider(args.provider.provider.as_deref(), true);
    let sizes: Vec<usize> = if args.sizes.is_empty() {
        vec![256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    } else {
        args.sizes.iter().map(|s| parse_size(s).map(|v| v as usize).map_err(|e| format!("--sizes: {e}"))).collect::<Result<_, _>>()?
    };
    if sizes.contains(&0) {
        return Err("--sizes: fan mode needs at least 1 byte per leaf".into());
    }
    let max = *sizes.iter().max().ok_or("--sizes: no sizes")?;
    let chunk = match &args.chunk {
        Some(c) => parse_size(c).map_err(|e| format!("--chunk: {e}"))? as usize,
        None => DEFAULT_CHUNK,
    };
    if chunk == 0 {
        return Err("--chunk: must be at least 1 byte".into());
    }
    if max.div_ceil(chunk) > MAX_PIECES {
        return Err(format!("--chunk {}: {} per leaf would be more than 2^32 pieces", format_size(chunk as u64), format_size(max as u64)));
    }
    let window = args.window.unwrap_or(DEFAULT_WINDOW);
    if window == 0 || window > MAX_WINDOW {
        return Err(format!("--window: pieces in flight per (leaf, hub) pair, 1 to {MAX_WINDOW} (got {window})"));
    }
    let cores = match &args.cores.cores {
        Some(c) => {
            let l = CoreList::parse(c).map_err(|e| format!("--cores: {e}"))?;
            l.validate_against_allowed().map_err(|e| format!("--cores: {e}"))?;
            l
        }
        None => cpuset::allowed().map_err(|e| e.to_string())?,
    };
    if cores.is_empty() {
        return Err("--cores: no cores".into());
    }
    let threads = hubs + leaves;
    let (busy, policy) = poll_and_policy(args, threads, cores.len())?;
    // Busy pollers that share a core take turns by the scheduler's
    // timeslice: the figure would measure that, not the transport.
    if cores.len() < threads && busy {
        return Err(format!(
            "--cores: {hubs} hubs + {leaves} leaves need {threads} cores with busy polling, {} given ({cores}); \
             give more cores or use --poll adaptive (threads then share cores)",
            cores.len()
        ));
    }
    let core_of: Vec<usize> = (0..threads).map(|i| cores.as_slice()[i % cores.len()]).collect();
    let plan = FanPlan {
        provider: provider.clone(),
        hubs,
        leaves,
        sizes,
        chunk,
        window,
        iters: args.iters.unwrap_or(DEFAULT_ITERS).max(1),
        warmup: args.warmup.unwrap_or(DEFAULT_WARMUP),
        busy,
        spin: if busy { u32::MAX } else { tally_engine::dataplane::lcore::adaptive_spin() },
        policy,
        max,
        // The client's default (TALLY_MIN_PIECE, else MIN_SPREAD_PIECE), so
        // that small sizes are cut as `tally bench allreduce` cuts them.
        min_piece: ClientConfig::new(Vec::new(), 0, 0, 1).min_piece,
    };
    let poll = if busy { "busy" } else { "adaptive" };
    if !args.json.json {
        let shared =
            if cores.len() < threads { format!(" (cores shared: {threads} threads on {} cores)", cores.len()) } else { String::new() };
        println!(
            "# tally bench p2p fan: provider {provider}, {poll} polling; hubs ({hubs}) on cores {}, leaves ({leaves}) on cores {}{shared}",
            list(&core_of[..hubs]),
            list(&core_of[hubs..])
        );
        println!(
            "# every leaf sends its bytes to the hubs in pieces of up to {} (piece c to hub c mod {hubs}), {window} in flight per (leaf, hub) pair; \
             hubs echo every piece back (an all-reduce's traffic without the reduce); every returned byte checked",
            format_size(chunk as u64)
        );
        println!(
            "# hub input = leaves x bytes / time, each way (the all-reduce's server input); median and best of {} repetitions after {} warm-up",
            plan.iters, plan.warmup
        );
        println!(
            "{:>12} {:>10} {:>12} {:>16} {:>14} {:>16}",
            "bytes/leaf", "piece", "time(us)", "hub in(GB/s)", "best(GB/s)", "per hub(GB/s)"
        );
    }

    let shared = Shared {
        gate: Gate::new(threads + 1),
        names: Mutex::new(vec![None; threads]),
        provider_used: Mutex::new(None),
        times: Mutex::new(RepTimes { starts: vec![None; threads], ends: vec![None; leaves] }),
    };
    let mut rows = Vec::new();
    let coordinated = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (plan, shared, core) = (&plan, &shared, core_of[i]);
                let who = if i < hubs { format!("hub {i}") } else { format!("leaf {}", i - hubs) };
                std::thread::Builder::new()
                    .name(format!("p2p-{}", who.replace(' ', "")))
                    .spawn_scoped(s, move || {
                        let _guard = FailOnPanic { gate: &shared.gate, who: &who };
                        let mut node = None;
                        let r = if i < hubs {
                            run_hub(plan, shared, i, core, &mut node)
                        } else {
                            run_leaf(plan, shared, i - hubs, core, &mut node)
                        };
                        if let Err(e) = r {
                            shared.gate.fail(format!("{who} (core {core}): {e}"));
                            if let Some(n) = &mut node {
                                n.ep.cancel_all();
                            }
                        }
                        node
                    })
                    .map_err(|e| format!("cannot start a thread: {e}"))
            })
            .collect();
        let mut result = Ok(());
        if handles.iter().any(|h| h.is_err()) {
            shared.gate.fail("cannot start every thread".into());
        } else {
            result = coordinate(&plan, &shared, args.json.json, &mut rows);
        }
        if let Err(e) = &result {
            shared.gate.fail(e.clone());
        }
        // Errors are on record in the gate (FailOnPanic, or the closure).
        let nodes: Vec<Node> = handles.into_iter().flatten().filter_map(|h| h.join().ok().flatten()).collect();
        // Endpoints close only once every thread has stopped: an shm
        // endpoint closing while a peer of this process still progresses
        // sends to it crashes that peer (in libfabric, on the closed
        // region), which a failed run would otherwise do.
        nodes.into_iter().for_each(Node::close);
        result
    });
    if let Some(f) = shared.gate.failure() {
        return Err(f);
    }
    coordinated?;
    if args.json.json {
        let provider = shared.provider_used.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or(provider);
        let r = FanReport {
            provider,
            mode: "fan",
            hubs,
            leaves,
            hub_cores: core_of[..hubs].to_vec(),
            leaf_cores: core_of[hubs..].to_vec(),
            poll,
            results: rows,
        };
        println!("{}", serde_json::to_string(&r).unwrap());
    }
    Ok(())
}

/// The main thread's part: release and collect every repetition, report.
fn coordinate(plan: &FanPlan, shared: &Shared, json: bool, rows: &mut Vec<FanRow>) -> Result<(), String> {
    shared.gate.wait()?; // endpoints open, names published
    shared.gate.wait()?; // peers inserted
    for &size in &plan.sizes {
        let cut = Cut::new(size, plan.chunk, plan.hubs, plan.min_piece);
        let mut times = Vec::with_capacity(plan.iters);
        for rep in 0..plan.warmup + plan.iters {
            shared.gate.wait()?; // start
            shared.gate.wait()?; // every leaf has all its bytes back, every hub its echoes sent
            let t = shared.times.lock().unwrap_or_else(|e| e.into_inner());
            let start = t.starts.iter().flatten().min().copied().ok_or("no start times")?;
            let end = t.ends.iter().flatten().max().copied().ok_or("no end times")?;
            if rep >= plan.warmup {
                times.push(end.saturating_duration_since(start));
            }
        }
        times.sort();
        let (median, best) = (times[times.len() / 2].as_secs_f64(), times[0].as_secs_f64());
        let input = (plan.leaves * size) as f64;
        let row = FanRow {
            mode: "fan",
            hubs: plan.hubs,
            leaves: plan.leaves,
            bytes: size,
            chunk: plan.chunk,
            piece: cut.piece,
            window: plan.window,
            iters: plan.iters,
            time_us: median * 1e6,
            best_time_us: best * 1e6,
            hub_input_gbps: input / median / 1e9,
            best_hub_input_gbps: input / best / 1e9,
            per_hub_gbps: input / median / 1e9 / plan.hubs as f64,
        };
        if !json {
            println!(
                "{:>12} {:>10} {:>12.1} {:>16.3} {:>14.3} {:>16.3}",
                format_size(size as u64),
                format_size(cut.piece as u64),
                row.time_us,
                row.hub_input_gbps,
                row.best_hub_input_gbps,
                row.per_hub_gbps
            );
        }
        rows.push(row);
    }
    // The leaves check the last repetition after its end gate.
    shared.gate.wait()
}

fn list(cores: &[usize]) -> String {
    match CoreList::from_cores(cores.to_vec()) {
        Ok(l) => l.to_string(),
        Err(_) => cores.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
    }
}

/// What the threads share.
struct Shared {
    gate: Gate,
    /// Endpoint names, hubs first, then leaves.
    names: Mutex<Vec<Option<EndpointName>>>,
    provider_used: Mutex<Option<String>>,
    times: Mutex<RepTimes>,
}

/// One repetition's clock readings.
struct RepTimes {
    /// Per thread (hubs, then leaves): when the start gate let it go.
    starts: Vec<Option<Instant>>,
    /// Per leaf: its last completion.
    ends: Vec<Option<Instant>>,
}

/// A barrier that a failing thread can open for everyone: with
/// `std::sync::Barrier` the others would wait for it forever.
struct Gate {
    n: usize,
    state: Mutex<GateState>,
    cv: Condvar,
    /// Mirrors `state.failure.is_some()`, for the data loops to look at without locking.
    failed: AtomicBool,
}

struct GateState {
    arrived: usize,
    generation: u64,
    /// The first failure; later ones are its consequences.
    failure: Option<String>,
}

impl Gate {
    fn new(n: usize) -> Gate {
        Gate {
            n,
            state: Mutex::new(GateState { arrived: 0, generation: 0, failure: None }),
            cv: Condvar::new(),
            failed: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until all `n` parties have arrived, or until one has failed.
    fn wait(&self) -> Result<(), String> {
        let mut s = self.lock();
        if s.failure.is_some() {
            return Err(ABORTED.into());
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.n {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while s.generation == generation && s.failure.is_none() {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.generation != generation {
            Ok(())
        } else {
            Err(ABORTED.into())
        }
    }

    fn fail(&self, why: String) {
        let mut s = self.lock();
        if s.failure.is_none() {
            s.failure = Some(why);
        }
        self.failed.store(true, Ordering::Relaxed);
        self.cv.notify_all();
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }
}

/// Opens the gate for the others if its thread panics.
struct FailOnPanic<'a> {
    gate: &'a Gate,
    who: &'a str,
}

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.gate.fail(format!("{} panicked", self.who));
        }
    }
}

/// How a leaf's S bytes are cut, as `engine::client` cuts an all-reduce.
#[derive(Clone, Copy)]
struct Cut {
    bytes: usize,
    piece: usize,
    pieces: usize,
    hubs: usize,
}

impl Cut {
    fn new(bytes: usize, chunk: usize, hubs: usize, min_piece: usize) -> Cut {
        let piece = op_chunk_bytes(bytes, chunk, hubs, 1, min_piece);
        Cut { bytes, piece, pieces: bytes.div_ceil(piece), hubs }
    }

    /// Pieces hub `h` gets from each leaf: chunks h, h + hubs, h + 2 hubs...
    fn per_hub(&self, h: usize) -> usize {
        if h < self.pieces {
            (self.pieces - h).div_ceil(self.hubs)
        } else {
            0
        }
    }

    /// The chunk index of hub `h`'s `p`-th piece.
    fn chunk_of(&self, h: usize, p: usize) -> usize {
        h + p * self.hubs
    }

    /// Offset and length of chunk `c` in a leaf's buffers.
    fn span(&self, c: usize) -> (usize, usize) {
        let off = c * self.piece;
        (off, self.piece.min(self.bytes - off))
    }

    fn hub_at(&self, off: usize) -> usize {
        (off / self.piece) % self.hubs
    }
}

/// direction (4 bits) | leaf (14) | hub (14) | chunk index (32). Receives
/// match it exactly (no ignored bits: shm 1.17 wants one mask per
/// endpoint, see `fabric::endpoint`), so a piece lands only in its own place.
fn tag(dir: u64, leaf: usize, hub: usize, c: usize) -> u64 {
    (dir << 60) | ((leaf as u64) << 46) | ((hub as u64) << 32) | c as u64
}

/// The word a leaf sends at byte offset `off` (a multiple of 8) of its
/// input: a hash of (leaf, hub, offset). Odd, so that it never equals the
/// zeroed output it must replace.
fn pattern(leaf: usize, hub: usize, off: usize) -> u64 {
    let mut x = ((leaf as u64) << 50) ^ ((hub as u64) << 36) ^ off as u64;
    // splitmix64's finalizer: neighbouring offsets differ in every byte.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) | 1
}

fn fill(buf: &mut [u8], cut: &Cut, leaf: usize) {
    for (i, w) in buf.chunks_mut(8).enumerate() {
        let off = i * 8;
        let n = w.len();
        w.copy_from_slice(&pattern(leaf, cut.hub_at(off), off).to_le_bytes()[..n]);
    }
}

/// Bytes of `got` that differ from `sent`, and the first such offset.
fn compare(sent: &[u8], got: &[u8]) -> (usize, Option<usize>) {
    const BLOCK: usize = 4096;
    let (mut bad, mut first) = (0, None);
    for (b, (s, g)) in sent.chunks(BLOCK).zip(got.chunks(BLOCK)).enumerate() {
        if s != g {
            for (i, (x, y)) in s.iter().zip(g).enumerate() {
                if x != y {
                    bad += 1;
                    first.get_or_insert(b * BLOCK + i);
                }
            }
        }
    }
    (bad, first)
}

/// One thread's endpoint, its slab (registered once) and its peers.
struct Node {
    // Declared (and so dropped) before the slab it has registered.
    ep: Endpoint,
    slab: Slab,
    mh: MemoryHandle,
    peers: Vec<PeerAddr>,
    busy: bool,
    spin: u32,
    idle: u32,
    last_progress: Instant,
}

impl Node {
    fn open(plan: &FanPlan, label: &str, slot_size: usize, slots: usize, contexts: usize) -> Result<Node, String> {
        let node = if plan.provider.starts_with("tcp") { Some("127.0.0.1") } else { None };
        let cfg = EndpointConfig {
            hints: Hints::new(&plan.provider).with_node(node),
            cq_size: 0,
            contexts: contexts as u32,
            wait_object: !plan.busy,
        };
        let mut ep = Endpoint::open(&cfg).map_err(|e| format!("{}: {e}", plan.provider))?;
        let mut scfg = SlabConfig::new(label, slot_size.max(64), slots);
        scfg.policy = plan.policy;
        scfg.page_aligned_slots = true;
        let slab = Slab::new(&scfg).map_err(|e| e.to_string())?;
        // SAFETY: the slab outlives the registration: `Node` drops `ep`
        // (which closes it) before `slab`, and `close` leaks the slab if
        // the provider may still hold some of it.
        let mh = unsafe { ep.register(slab.as_ptr(), slab.len()) }.map_err(|e| e.to_string())?;
        Ok(Node { ep, slab, mh, peers: Vec::new(), busy: plan.busy, spin: plan.spin, idle: 0, last_progress: Instant::now() })
    }

    /// Publishes this endpoint's name, waits for everyone's, and inserts
    /// the peers in `range` (of the shared name table).
    fn meet(&mut self, shared: &Shared, me: usize, range: std::ops::Range<usize>) -> Result<(), String> {
        shared.names.lock().unwrap_or_else(|e| e.into_inner())[me] = Some(self.ep.name().map_err(|e| e.to_string())?);
        shared.gate.wait()?;
        let names: Vec<EndpointName> = shared.names.lock().unwrap_or_else(|e| e.into_inner())[range]
            .iter()
            .map(|n| n.clone().ok_or("a peer published no name"))
            .collect::<Result<_, _>>()?;
        for n in &names {
            self.peers.push(self.ep.insert_peer(n).map_err(|e| e.to_string())?);
        }
        shared.gate.wait()
    }

    /// Reads completions into `out`. After an empty poll an adaptive poller
    /// spins `spin` polls, then sleeps on the CQ, as an lcore does; every
    /// `CHECK_EVERY` empty polls it looks for a failed peer and a stall.
    /// `what` describes the caller's state (given the operations in flight) for a stall's error.
    fn poll(&mut self, out: &mut [Completion], shared: &Shared, what: impl Fn(u32) -> String) -> Result<usize, String> {
        match self.ep.poll(out) {
            Ok(0) => {
                self.idle = self.idle.saturating_add(1);
                if !self.busy && self.idle > self.spin {
                    self.ep.wait(1).map_err(|e| e.to_string())?;
                }
                if self.idle.is_multiple_of(CHECK_EVERY) || (!self.busy && self.idle > self.spin) {
                    if shared.gate.failed() {
                        return Err(ABORTED.into());
                    }
                    if self.last_progress.elapsed() > STALL {
                        return Err(format!("no completion for {} s: {}", STALL.as_secs(), what(self.ep.in_flight())));
                    }
                }
                Ok(0)
            }
            Ok(n) => {
                self.idle = 0;
                self.last_progress = Instant::now();
                Ok(n)
            }
            Err(PollError::Completion(e)) => Err(e.to_string()),
            Err(PollError::Fabric(e)) => Err(e.to_string()),
        }
    }

    /// Closes the endpoint. A failed thread's endpoint may keep operations
    /// the provider never returned; `Endpoint`'s drop then leaves it open,
    /// and the slab must stay mapped with it.
    fn close(self) {
        let Node { ep, slab, .. } = self;
        let leak = ep.in_flight() > 0;
        drop(ep);
        if leak {
            std::mem::forget(slab);
        }
    }
}

/// Whether a post went out (`false`: the provider said try again).
fn posted(r: Result<(), PostError>) -> Result<bool, String> {
    match r {
        Ok(()) => Ok(true),
        Err(PostError::Again) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// A hub thread; its node is left in `keep` for the main thread to close.
fn run_hub(plan: &FanPlan, shared: &Shared, h: usize, core: usize, keep: &mut Option<Node>) -> Result<(), String> {
    cpuset::pin_current_thread(core).map_err(|e| format!("pin core {core}: {e}"))?;
    // Slot (leaf l, k) holds one piece of leaf l: receive, then echo.
    let slots = plan.leaves * plan.window;
    let node = keep.insert(Node::open(plan, &format!("p2p hub {h}"), plan.chunk, slots, 2 * slots)?);
    if h == 0 {
        *shared.provider_used.lock().unwrap_or_else(|e| e.into_inner()) = Some(node.ep.provider().to_string());
    }
    hub_loop(node, plan, shared, h)
}

#[derive(Clone, Copy)]
enum HubOp {
    Recv,
    Send,
}

fn hub_loop(node: &mut Node, plan: &FanPlan, shared: &Shared, h: usize) -> Result<(), String> {
    node.meet(shared, h, plan.hubs..plan.hubs + plan.leaves)?;
    let w = plan.window;
    let slots = plan.leaves * w;
    // Per slot: which of the leaf's pieces (for this hub) it holds, and the
    // length that arrived.
    let mut piece = vec![0usize; slots];
    let mut len = vec![0usize; slots];
    let mut queue: VecDeque<(usize, HubOp)> = VecDeque::with_capacity(2 * slots);
    let mut c = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
    for &size in &plan.sizes {
        let cut = Cut::new(size, plan.chunk, plan.hubs, plan.min_piece);
        let n = cut.per_hub(h);
        for _ in 0..plan.warmup + plan.iters {
            // Receives are posted before the start, as a server's are.
            for (s, p) in piece.iter_mut().enumerate() {
                *p = s % w;
                if *p < n {
                    queue.push_back((s, HubOp::Recv));
                }
            }
            let (mut echoed, total) = (0, plan.leaves * n);
            hub_post(node, &cut, h, w, &piece, &len, &mut queue)?;
            shared.gate.wait()?;
            shared.times.lock().unwrap_or_else(|e| e.into_inner()).starts[h] = Some(Instant::now());
            node.last_progress = Instant::now();
            while echoed < total {
                hub_post(node, &cut, h, w, &piece, &len, &mut queue)?;
                let what = |f| format!("{echoed} of {total} pieces echoed, {f} operations in flight");
                let k = node.poll(&mut c, shared, what)?;
                for x in &c[..k] {
                    let s = (x.context / 2) as usize;
                    let (l, cix) = (s / w, cut.chunk_of(h, piece[s]));
                    if x.is_recv {
                        let want = cut.span(cix).1;
                        if x.len != want {
                            return Err(format!("piece {cix} from leaf {l}: {} bytes arrived, {want} expected", x.len));
                        }
                        len[s] = x.len;
                        queue.push_back((s, HubOp::Send));
                    } else {
                        echoed += 1;
                        piece[s] += w;
                        if piece[s] < n {
                            queue.push_back((s, HubOp::Recv));
                        }
                    }
                }
            }
            shared.gate.wait()?;
        }
    }
    shared.gate.wait()
}

/// Posts what `queue` holds, in order, until the provider says try again.
fn hub_post(
    node: &mut Node,
    cut: &Cut,
    h: usize,
    w: usize,
    piece: &[usize],
    len: &[usize],
    queue: &mut VecDeque<(usize, HubOp)>,
) -> Result<(), String> {
    while let Some(&(s, op)) = queue.front() {
        let (l, cix) = (s / w, cut.chunk_of(h, piece[s]));
        let at = node.slab.slot_ptr(s);
        let ok = match op {
            // SAFETY: slot s lies in the registered slab, which outlives the
            // endpoint's use of it; only this receive, then its echo, use it
            // until the echo completes.
            HubOp::Recv => {
                // SAFETY: see above.
                posted(unsafe { node.ep.recv(at, cut.piece, Some(node.mh), Some(node.peers[l]), tag(DIR_UP, l, h, cix), 0, 2 * s as u32) })?
            }
            // SAFETY: as above: the slot holds the piece just received and
            // is not written again before this send completes.
            HubOp::Send => {
                // SAFETY: see above.
                posted(unsafe { node.ep.send(at, len[s], Some(node.mh), node.peers[l], tag(DIR_DOWN, l, h, cix), 2 * s as u32 + 1) })?
            }
        };
        if !ok {
            break;
        }
        queue.pop_front();
    }
    Ok(())
}

/// A leaf thread; its node is left in `keep` for the main thread to close.
fn run_leaf(plan: &FanPlan, shared: &Shared, l: usize, core: usize, keep: &mut Option<Node>) -> Result<(), String> {
    cpuset::pin_current_thread(core).map_err(|e| format!("pin core {core}: {e}"))?;
    // Slot 0: the input, slot 1: the output, like an all-reduce's buffers.
    let node = keep.insert(Node::open(plan, &format!("p2p leaf {l}"), plan.max, 2, 2 * plan.hubs * plan.window)?);
    leaf_loop(node, plan, shared, l)
}

/// One piece in flight between a leaf and a hub.
#[derive(Clone, Copy, Default)]
struct Flight {
    /// Which of the hub's pieces.
    piece: usize,
    recv_posted: bool,
    send_posted: bool,
    recv_done: bool,
    send_done: bool,
}

fn leaf_loop(node: &mut Node, plan: &FanPlan, shared: &Shared, l: usize) -> Result<(), String> {
    node.meet(shared, plan.hubs + l, 0..plan.hubs)?;
    let (w, hubs) = (plan.window, plan.hubs);
    let me = hubs + l;
    // Flight (hub h, k): the piece in the hub's window slot k.
    let mut fl = vec![Flight::default(); hubs * w];
    let mut next = vec![0usize; hubs];
    let mut head = vec![0usize; hubs];
    let mut stalled: VecDeque<usize> = VecDeque::new();
    let mut c = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
    for &size in &plan.sizes {
        let cut = Cut::new(size, plan.chunk, hubs, plan.min_piece);
        let n: Vec<usize> = (0..hubs).map(|h| cut.per_hub(h)).collect();
        fill(&mut node.slab.slot_mut(0)[..size], &cut, l);
        node.slab.slot_mut(1)[..size].fill(0);
        for _ in 0..plan.warmup + plan.iters {
            next.fill(0);
            head.fill(0);
            let mut left: usize = n.iter().sum();
            shared.gate.wait()?;
            shared.times.lock().unwrap_or_else(|e| e.into_inner()).starts[me] = Some(Instant::now());
            node.last_progress = Instant::now();
            loop {
                // A flight refused with EAGAIN keeps its place in chunk order.
                while let Some(&f) = stalled.front() {
                    if !leaf_post(node, &cut, l, w, &mut fl[f], f / w)? {
                        break;
                    }
                    stalled.pop_front();
                }
                // One piece per hub per pass, as the client posts: chunks go
                // out in chunk order.
                while stalled.is_empty() {
                    let mut any = false;
                    for h in 0..hubs {
                        if next[h] < n[h] && next[h] - head[h] < w {
                            let f = h * w + next[h] % w;
                            fl[f] = Flight { piece: next[h], ..Flight::default() };
                            next[h] += 1;
                            any = true;
                            if !leaf_post(node, &cut, l, w, &mut fl[f], h)? {
                                stalled.push_back(f);
                                break;
                            }
                        }
                    }
                    if !any {
                        break;
                    }
                }
                if left == 0 {
                    break;
                }
                let what = |f| format!("{left} pieces not back, {f} operations in flight");
                let k = node.poll(&mut c, shared, what)?;
                for x in &c[..k] {
                    let f = (x.context / 2) as usize;
                    let h = f / w;
                    if x.is_recv {
                        let cix = cut.chunk_of(h, fl[f].piece);
                        let want = cut.span(cix).1;
                        if x.len != want {
                            return Err(format!("piece {cix} back from hub {h}: {} bytes, {want} expected", x.len));
                        }
                        fl[f].recv_done = true;
                    } else {
                        fl[f].send_done = true;
                    }
                    // A piece is done when its send and its return are.
                    while head[h] < next[h] {
                        let g = &fl[h * w + head[h] % w];
                        if !(g.recv_done && g.send_done) {
                            break;
                        }
                        head[h] += 1;
                        left -= 1;
                    }
                }
            }
            shared.times.lock().unwrap_or_else(|e| e.into_inner()).ends[l] = Some(Instant::now());
            shared.gate.wait()?;
            // Checked after the end gate: the check's memory traffic must
            // not slow the leaves still running.
            let (bad, first) = compare(&node.slab.slot(0)[..size], &node.slab.slot(1)[..size]);
            if let Some(o) = first {
                return Err(format!(
                    "{bad} of {} returned bytes differ from those sent (first at offset {o}, chunk {}, hub {})",
                    format_size(size as u64),
                    o / cut.piece,
                    cut.hub_at(o)
                ));
            }
            node.slab.slot_mut(1)[..size].fill(0);
        }
    }
    shared.gate.wait()
}

/// Posts a piece as the client posts a chunk: the receive for its return
/// first, straight into the output, then the send from the input. Returns
/// false if the provider said try again (the flight remembers what went out).
fn leaf_post(node: &mut Node, cut: &Cut, l: usize, w: usize, f: &mut Flight, h: usize) -> Result<bool, String> {
    let cix = cut.chunk_of(h, f.piece);
    let (off, len) = cut.span(cix);
    // The context ids of flight (h, k): 2 (h w + k) for the receive, +1 for the send.
    let ctx = 2 * (h * w + f.piece % w) as u32;
    if !f.recv_posted {
        // SAFETY: off + len <= S <= the slot size: the range lies in slot 1,
        // inside the registered slab; no other operation in flight covers it.
        let at = unsafe { node.slab.slot_ptr(1).add(off) };
        // SAFETY: the slab outlives the endpoint's use of it; nothing reads
        // or writes this range until the receive completes.
        f.recv_posted = posted(unsafe { node.ep.recv(at, len, Some(node.mh), Some(node.peers[h]), tag(DIR_DOWN, l, h, cix), 0, ctx) })?;
        if !f.recv_posted {
            return Ok(false);
        }
    }
    if !f.send_posted {
        // SAFETY: as above, in slot 0.
        let at = unsafe { node.slab.slot_ptr(0).add(off) };
        // SAFETY: slot 0 is written only between repetitions, with nothing in flight.
        f.send_posted = posted(unsafe { node.ep.send(at, len, Some(node.mh), node.peers[h], tag(DIR_UP, l, h, cix), ctx + 1) })?;
    }
    Ok(f.send_posted)
}
