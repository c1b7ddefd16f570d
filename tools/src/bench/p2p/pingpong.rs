//! `tally bench p2p` with two ends: what one stream of the transport does.
//!
//! Two endpoints on two pinned threads of this process. Latency: tagged
//! ping-pong, median half round trip. Bandwidth: one side streams messages
//! with a window in flight, the other keeps receives posted; time from the
//! first send to the receiver's final acknowledgement.
use super::args::{poll_and_policy, P2pArgs};
use serde::Serialize;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tally_engine::dataplane::fabric::{
    Completion, Endpoint, EndpointConfig, EndpointName, Hints, MemoryHandle, PeerAddr, PollError, PostError,
};
use tally_engine::dataplane::slab::{HugepagePolicy, Slab, SlabConfig};
use tally_engine::host::cpuset::{self, CoreList};
use tally_engine::host::units::{format_size, parse_size};

#[derive(Serialize, Debug, Clone)]
struct Row {
    bytes: usize,
    latency_us: f64,
    /// p99 of the round trips, halved like the median: the transport's own
    /// tail, against which an all-reduce loop's p99/p50 can be held.
    p99_latency_us: f64,
    #[serde(rename = "bandwidth_GBps")]
    bandwidth_gbps: f64,
}

#[derive(Serialize)]
struct Report {
    provider: String,
    results: Vec<Row>,
}

const TAG_PING: u64 = 1;
const TAG_PONG: u64 = 2;
const TAG_STREAM: u64 = 3;
const TAG_ACK: u64 = 4;
const MAX_IN_FLIGHT_BYTES: usize = 256 << 20;

fn default_sizes() -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = 8usize;
    while s < (16 << 20) {
        v.push(s);
        s *= 4;
    }
    v.push(16 << 20);
    v
}
/// The two-end mode: ping-pong latency, then streaming bandwidth, per size.
pub fn run(args: &P2pArgs) -> Result<(), String> {
    if args.chunk.is_some() {
        return Err("--chunk applies to the fan mode (--hubs and --leaves)".into());
    }
    let provider = tally_engine::dataplane::fabric::select_provider(args.provider.provider.as_deref(), true);
    let sizes: Vec<usize> = if args.sizes.is_empty() {
        default_sizes()
    } else {
        args.sizes.iter().map(|s| parse_size(s).map(|v| v as usize).map_err(|e| e.to_string())).collect::<Result<_, _>>()?
    };
    let max = *sizes.iter().max().ok_or("no sizes")?;
    let window = args.window.unwrap_or(16).clamp(1, 1024);
    let cores = match &args.cores.cores {
        Some(c) => CoreList::parse(c).map_err(|e| format!("--cores: {e}"))?,
        None => cpuset::allowed().map_err(|e| e.to_string())?,
    };
    let core_a = cores.get(0).ok_or("no cores")?;
    let core_b = cores.get(1).unwrap_or(core_a);
    let distinct = if core_a == core_b { 1 } else { 2 };
    let (busy, policy) = poll_and_policy(args, 2, distinct)?;
    if busy && distinct < 2 {
        return Err(format!(
            "--poll busy: the two ends would spin on one core ({core_a}); give two cores (--cores) or use --poll adaptive"
        ));
    }
    let plan = Plan {
        provider: provider.clone(),
        sizes: sizes.clone(),
        iters: args.iters.unwrap_or(1000).max(1),
        warmup: args.warmup.unwrap_or(100),
        window,
        busy,
        policy,
        max,
    };
    if !args.json.json {
        println!(
            "# tally bench p2p: provider {provider}, tagged messages, {} polling, ends pinned to cores {core_a} and {core_b}",
            if busy { "busy" } else { "adaptive" }
        );
        println!(
            "# latency: median half round trip of {} ping-pongs after {} warm-up; bandwidth: up to {} messages ({} at most) in flight, streamed, median of 3 runs",
            plan.iters, plan.warmup, window, format_size(MAX_IN_FLIGHT_BYTES as u64)
        );
    }

    let (to_b, from_a) = mpsc::channel::<EndpointName>();
    let (to_a, from_b) = mpsc::channel::<EndpointName>();
    let plan_b = plan.clone();
    let pong = std::thread::spawn(move || -> Result<Side, String> {
        cpuset::pin_current_thread(core_b).map_err(|e| format!("pin core {core_b}: {e}"))?;
        let mut side = Side::open(&plan_b, "p2p pong")?;
        to_a.send(side.ep.name().map_err(|e| e.to_string())?).map_err(|_| "ping side gone")?;
        let peer = from_a.recv().map_err(|_| "ping side gone")?;
        side.peer = side.ep.insert_peer(&peer).map_err(|e| e.to_string())?;
        side.serve(&plan_b)?;
        // Handed back, not closed here: an shm endpoint that closes while
        // the ping side still progresses its last sends to it crashes the
        // ping side (libfabric takes a lock in the closed region; seen at
        // 16 MiB with the final acknowledgement already received).
        Ok(side)
    });
    cpuset::pin_current_thread(core_a).map_err(|e| format!("pin core {core_a}: {e}"))?;
    let mut side = Side::open(&plan, "p2p ping")?;
    to_b.send(side.ep.name().map_err(|e| e.to_string())?).map_err(|_| "pong side gone")?;
    let peer = from_b.recv().map_err(|_| "pong side failed to start")?;
    side.peer = side.ep.insert_peer(&peer).map_err(|e| e.to_string())?;
    let provider_used = side.ep.provider().to_string();
    let rows = side.drive(&plan, args.json.json);
    let pong_result = pong.join().map_err(|_| "pong thread panicked".to_string())?;
    let rows = rows?;
    // Closed after the ping side is done with it (see the pong thread).
    let _pong_side = pong_result?;
    if args.json.json {
        let r = Report { provider: provider_used, results: rows };
        println!("{}", serde_json::to_string(&r).unwrap());
    }
    Ok(())
}

#[derive(Clone)]
struct Plan {
    provider: String,
    sizes: Vec<usize>,
    iters: usize,
    warmup: usize,
    window: usize,
    busy: bool,
    policy: HugepagePolicy,
    max: usize,
}

/// One end: its endpoint, its slab of message buffers (registered once),
/// the peer's address.
struct Side {
    ep: Endpoint,
    slab: Slab,
    mh: MemoryHandle,
    peer: PeerAddr,
    busy: bool,
    sends_done: usize,
    recvs_done: usize,
}

impl Side {
    fn open(plan: &Plan, label: &str) -> Result<Side, String> {
        let node = if plan.provider.starts_with("tcp") { Some("127.0.0.1") } else { None };
        let cfg = EndpointConfig {
            hints: Hints::new(&plan.provider).with_node(node),
            cq_size: 0,
            contexts: (plan.window + 4) as u32,
            wait_object: !plan.busy,
        };
        let mut ep = Endpoint::open(&cfg).map_err(|e| format!("{}: {e}", plan.provider))?;
        // slots 0..window for streaming; slot window: ping-pong send; window+1: ping-pong receive
        let mut scfg = SlabConfig::new(label, plan.max.max(64), stream_slots(plan) + 2);
        scfg.policy = plan.policy;
        scfg.page_aligned_slots = true;
        let slab = Slab::new(&scfg).map_err(|e| e.to_string())?;
        // SAFETY: the slab is dropped after the endpoint (field order in
        // `Side` does not matter: Drop of Endpoint closes the registration
        // and `Side` drops `ep` first, as declared).
        let mh = unsafe { ep.register(slab.as_ptr(), slab.len()) }.map_err(|e| e.to_string())?;
        Ok(Side { ep, slab, mh, peer: 0, busy: plan.busy, sends_done: 0, recvs_done: 0 })
    }

    fn progress(&mut self) -> Result<usize, String> {
        let mut c = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
        match self.ep.poll(&mut c) {
            Ok(n) => {
                for x in &c[..n] {
                    if x.is_recv {
                        self.recvs_done += 1
                    } else {
                        self.sends_done += 1
                    }
                }
                if n == 0 && !self.busy {
                    self.ep.wait(1).map_err(|e| e.to_string())?;
                }
                Ok(n)
            }
            Err(PollError::Completion(e)) => Err(e.to_string()),
            Err(PollError::Fabric(e)) => Err(e.to_string()),
        }
    }

    /// Where streamed message `m` of `size` bytes lives: the first
    /// `stream_slots` slots are one region, cut into `size`-byte pieces.
    fn stream_at(&self, plan: &Plan, size: usize, m: usize) -> *mut u8 {
        let w = stream_window(plan, size);
        // SAFETY: (m % w) * size + size <= stream_slots * slot_size, inside the slab.
        unsafe { self.slab.as_ptr().add((m % w) * size) }
    }

    fn send(&mut self, slot: usize, len: usize, tag: u64, ctx: u32) -> Result<(), String> {
        self.send_at(self.slab.slot_ptr(slot), len, tag, ctx)
    }

    fn send_at(&mut self, at: *mut u8, len: usize, tag: u64, ctx: u32) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // SAFETY: slot lies in the registered slab, which outlives the
            // endpoint; the benchmark never writes a slot with a send in flight.
            match unsafe { self.ep.send(at, len, Some(self.mh), self.peer, tag, ctx) } {
                Ok(()) => return Ok(()),
                Err(PostError::Again) if Instant::now() < deadline => {
                    self.progress()?;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn recv(&mut self, slot: usize, len: usize, tag: u64, ctx: u32) -> Result<(), String> {
        self.recv_at(self.slab.slot_ptr(slot), len, tag, ctx)
    }

    fn recv_at(&mut self, at: *mut u8, len: usize, tag: u64, ctx: u32) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // SAFETY: as in send; each receive in flight owns its own slot.
            match unsafe { self.ep.recv(at, len, Some(self.mh), Some(self.peer), tag, 0, ctx) } {
                Ok(()) => return Ok(()),
                Err(PostError::Again) if Instant::now() < deadline => {
                    self.progress()?;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn wait_until(&mut self, sends: usize, recvs: usize) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.sends_done < sends || self.recvs_done < recvs {
            if self.progress()? == 0 && Instant::now() > deadline {
                return Err(format!(
                    "timed out waiting for the peer ({}/{sends} sends, {}/{recvs} receives)",
                    self.sends_done, self.recvs_done
                ));
            }
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.sends_done = 0;
        self.recvs_done = 0;
    }

    /// The measuring side: ping-pong, then streaming, for every size.
    fn drive(&mut self, plan: &Plan, json: bool) -> Result<Vec<Row>, String> {
        let (s_slot, r_slot) = (stream_slots(plan), stream_slots(plan) + 1);
        let (s_ctx, r_ctx) = (plan.window as u32, plan.window as u32 + 1);
        if !json {
            println!("{:>12} {:>14} {:>14} {:>16}", "size", "latency(us)", "p99(us)", "bandwidth(GB/s)");
        }
        let mut rows = Vec::new();
        for &size in &plan.sizes {
            let mut rtts = Vec::with_capacity(plan.iters);
            for i in 0..plan.warmup + plan.iters {
                self.reset();
                let t0 = Instant::now();
                self.recv(r_slot, size, TAG_PONG, r_ctx)?;
                self.send(s_slot, size, TAG_PING, s_ctx)?;
                self.wait_until(1, 1)?;
                if i >= plan.warmup {
                    rtts.push(t0.elapsed());
                }
            }
            rtts.sort();
            let latency_us = rtts[rtts.len() / 2].as_secs_f64() * 1e6 / 2.0;
            let p99_latency_us = rtts[(rtts.len() * 99 / 100).min(rtts.len() - 1)].as_secs_f64() * 1e6 / 2.0;
            let w = stream_window(plan, size);
            let n = stream_count(size, w);
            let mut bws = Vec::new();
            for _ in 0..3 {
                self.reset();
                self.recv(r_slot, 0, TAG_ACK, r_ctx)?;
                let t0 = Instant::now();
                for m in 0..n {
                    if m >= w {
                        self.wait_until(m - w + 1, 0)?;
                    }
                    self.send_at(self.stream_at(plan, size, m), size, TAG_STREAM, (m % w) as u32)?;
                }
                self.wait_until(n, 1)?;
                bws.push((n * size) as f64 / t0.elapsed().as_secs_f64() / 1e9);
            }
            bws.sort_by(|a, b| a.total_cmp(b));
            let row = Row { bytes: size, latency_us, p99_latency_us, bandwidth_gbps: bws[1] };
            if !json {
                println!(
                    "{:>12} {:>14.2} {:>14.2} {:>16.3}",
                    format_size(size as u64),
                    row.latency_us,
                    row.p99_latency_us,
                    row.bandwidth_gbps
                );
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// The echoing side, mirroring `drive` message for message.
    fn serve(&mut self, plan: &Plan) -> Result<(), String> {
        let (s_slot, r_slot) = (stream_slots(plan), stream_slots(plan) + 1);
        let (s_ctx, r_ctx) = (plan.window as u32, plan.window as u32 + 1);
        for &size in &plan.sizes {
            for _ in 0..plan.warmup + plan.iters {
                self.reset();
                self.recv(r_slot, size, TAG_PING, r_ctx)?;
                self.wait_until(0, 1)?;
                self.send(s_slot, size, TAG_PONG, s_ctx)?;
                self.wait_until(1, 1)?;
            }
            let w = stream_window(plan, size);
            let n = stream_count(size, w);
            for _ in 0..3 {
                self.reset();
                let mut posted = 0;
                while posted < n.min(w) {
                    self.recv_at(self.stream_at(plan, size, posted), size, TAG_STREAM, (posted % w) as u32)?;
                    posted += 1;
                }
                while self.recvs_done < n {
                    let before = self.recvs_done;
                    self.progress()?;
                    // Repost a receive for every one that completed (slots
                    // free in order: receives on one tag match in order).
                    for _ in before..self.recvs_done {
                        if posted < n {
                            self.recv_at(self.stream_at(plan, size, posted), size, TAG_STREAM, (posted % w) as u32)?;
                            posted += 1;
                        }
                    }
                }
                self.send(s_slot, 0, TAG_ACK, s_ctx)?;
                self.wait_until(1, n)?;
            }
        }
        Ok(())
    }
}

/// Slots (of the largest size) that hold the streaming window.
fn stream_slots(plan: &Plan) -> usize {
    (plan.window * plan.max).min(MAX_IN_FLIGHT_BYTES.max(plan.max)).div_ceil(plan.max.max(1))
}

/// Messages of `size` in flight while streaming: the window, unless that
/// would exceed the streaming region.
fn stream_window(plan: &Plan, size: usize) -> usize {
    plan.window.min(stream_slots(plan) * plan.max.max(64) / size.max(1)).max(1)
}

/// Messages per streaming run: enough bytes to dwarf start-up, bounded in count.
fn stream_count(size: usize, window: usize) -> usize {
    ((512usize << 20) / size.max(1)).clamp(window.max(64), 20_000)
}
