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
//!
//! [`plan`]: the run; [`pieces`]: cutting, tags and patterns; [`gate`]:
//! what threads share; [`node`]: an endpoint; [`hub`] and [`leaf`]: the
//! two kinds of thread.
pub mod gate;
pub mod hub;
pub mod leaf;
pub mod node;
pub mod pieces;
pub mod plan;

use super::args::{poll_and_policy, P2pArgs};
use gate::{FailOnPanic, Gate, RepTimes, Shared};
use hub::run_hub;
use leaf::run_leaf;
use node::Node;
use pieces::{Cut, MAX_PEERS, MAX_PIECES};
use plan::FanPlan;
use serde::Serialize;
use std::sync::Mutex;
use tally_engine::client::ClientConfig;
use tally_engine::host::cpuset::{self, CoreList};
use tally_engine::host::units::{format_size, parse_size};

/// The context table bounds the operations in flight.
const MAX_WINDOW: usize = 1024;

const DEFAULT_CHUNK: usize = 256 << 10;

const DEFAULT_ITERS: usize = 10;

const DEFAULT_WARMUP: usize = 2;

/// As `tally bench allreduce --window`, so that the two compare.
const DEFAULT_WINDOW: usize = 4;

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
