//! A rank process: its rank, or `--ranks-per-process` rank threads, each
//! joining the job, then timing and checking every mode and size, rank 0
//! printing a `RESULT` row for each (see [`crate::bench::report`]).
use super::launched::{self, RankSummary};
use super::overlap;
use super::pinning;
use super::plan::{check_busy, parse_secret, plan, pollers_per_rank, ranks_per_process, resolve_poll, AllreduceArgs};
use super::timing::{last_rank_times, mono_ns, OpTimes, GATHER_STAMPS};
use super::verify::{check, fill};
use crate::bench::report::{format_row, Row, LOOP_LINES_ENV};
use crate::collnet_driver;
use std::time::{Duration, Instant};
use tally_engine::client::{Client, ClientConfig};
use tally_engine::host::limits;
use tally_engine::host::units::parse_size;
use tally_engine::ring::bootstrap::Bootstrap;
use tally_engine::ring::{Ring, RingConfig};

/// How long an adaptive rank sleeps on its CQ at most, unless `--sleep-ms`.
/// A sleeping rank wakes on traffic (tcp: the CQ's descriptor), so this only
/// paces the wake-ups of ranks with nothing to do: at 1 ms, 128 rank threads
/// on 2 cores woke 128,000 times a second, a few system calls each, and the
/// server's lcores got what was left: a 4 KiB all-reduce took 31 ms, 4.6 ms
/// at 20 ms (and 4.5 at 100).
const THREAD_SLEEP_MS: u32 = 20;

/// Descriptors a rank needs at most: its endpoint (tcp;ofi_rxm: a listening
/// socket, an epoll set, wait fds, a connection per server lcore), its
/// control and bootstrap connections. Measured: about 15 per rank thread
/// over tcp to one server of 2 lcores; this leaves room for more lcores.
const FDS_PER_RANK: u64 = 24;

/// Raises this process's soft descriptor limit to `need` when it is lower
/// (up to the hard limit; the default soft limit is often 1024): a process
/// of many rank threads, or rank 0 with its bootstrap connection to every
/// rank, needs more.
pub(super) fn ensure_fds(need: u64) -> Result<(), String> {
    let before = limits::open_files().map_err(|e| format!("getrlimit(RLIMIT_NOFILE): {e}"))?;
    let now = limits::raise_open_files(need).map_err(|e| format!("setrlimit(RLIMIT_NOFILE, {need}): {e}"))?;
    if now.soft < need {
        return Err(format!(
            "this needs about {need} file descriptors, above the hard limit of {} (ulimit -Hn): raise it, or use fewer ranks",
            now.hard
        ));
    }
    if now.soft > before.soft {
        log::info!("raised the open file limit from {} to {} (ranks' endpoints and connections)", before.soft, now.soft);
    }
    Ok(())
}

/// Puts this thread, and the threads it starts afterwards, in SCHED_IDLE
/// (no privilege needed to lower one's own priority).
fn idle_priority() -> Result<(), String> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; one sched_param we own.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(format!("sched_setscheduler(SCHED_IDLE): {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// This process's ranks: one, or `--ranks-per-process` threads from `--rank`.
pub(super) fn run_rank(args: &AllreduceArgs) -> Result<(), String> {
    let first = args.rank.unwrap();
    let per = ranks_per_process(args);
    let last = (first + per).min(args.ranks);
    if first >= args.ranks {
        return Err(format!("--rank {first}: there are {} ranks", args.ranks));
    }
    // A rank started by hand may leave `--poll auto`; the launcher passes busy or adaptive.
    let mut resolved = args.clone();
    let provider = plan(args)?.provider;
    resolved.poll.poll = resolve_poll(args, (last - first) as usize * pollers_per_rank(args, &provider))?;
    let args = &resolved;
    check_busy(args, (last - first) as usize, &format!("{} rank threads", last - first))?;
    // Rank 0 also holds a bootstrap connection to every other rank.
    let star = if first == 0 { args.ranks as u64 } else { 0 };
    ensure_fds((last - first) as u64 * FDS_PER_RANK + star + 64)?;
    if last - first == 1 {
        return run_one(args, first);
    }
    // The rank threads stand in for other hosts: they must not take the
    // server's cores. At normal priority 1024 of them, spinning while their
    // connections to an lcore were set up, left that lcore 1.5% of a core:
    // it did not poll for 5 s and the watchdog failed the job. In SCHED_IDLE
    // they run only when the server's lcores (and anything else) wait.
    idle_priority()?;
    let threads: Vec<_> = (first..last)
        .map(|rank| {
            let args = args.clone();
            std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn(move || run_one(&args, rank).map_err(|e| format!("rank {rank}: {e}")))
                .map_err(|e| format!("cannot start the thread of rank {rank}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let errors: Vec<String> = threads
        .into_iter()
        .filter_map(|t| match t.join() {
            Ok(r) => r.err(),
            Err(_) => Some("a rank thread panicked".into()),
        })
        .collect();
    match errors.len() {
        0 => Ok(()),
        n => {
            // One rank's error is the cause, the others mostly its echo (the
            // server failed the job for every rank): show one that is not an echo.
            let cause = errors.iter().find(|e| !e.contains("job failed")).unwrap_or(&errors[0]);
            Err(format!("{n} of {} ranks failed; {}: {cause}", last - first, if n > 1 { "cause" } else { "error" }))
        }
    }
}

/// The rails a rank's client runs in `mode`: --rails, else TALLY_RAILS,
/// else auto (with TALLY_LINK_GBITS, the link's rate, where set; agg-plugin
/// counts on each of the plugin's rails carrying what the plugin does).
pub(super) fn mode_rails(args: &AllreduceArgs, provider: &str, mode: &str) -> usize {
    use tally_engine::client::{caller_rail_from_env, rails::plugin_rail_gbits};
    let env = ClientConfig::new(Vec::new(), 0, 0, 1);
    let asked = args.rails.unwrap_or(env.rails);
    let per_rail = if mode == "agg-plugin" { plugin_rail_gbits(caller_rail_from_env(), env.link_gbits) } else { env.rail_gbits };
    tally_engine::client::rails::resolve_rails(asked, provider, args.servers.len(), env.link_gbits, per_rail)
}

/// The most rails the rank's client runs in any of its modes: the block of
/// cores it is given.
pub(super) fn rails_of(args: &AllreduceArgs, provider: &str) -> usize {
    rails_by_mode(args, provider).into_iter().map(|(_, r)| r).max().unwrap_or(1)
}

/// Each of the rank's modes with its rails, read once before the rank pins
/// its thread to one core (which auto rails would then see).
fn rails_by_mode(args: &AllreduceArgs, provider: &str) -> Vec<(String, usize)> {
    args.mode.mode.iter().map(|m| (m.clone(), mode_rails(args, provider, m))).collect()
}

/// Warm-up all-reduces of `bytes` for an agg job of `streams` streams:
/// `asked`, but at least enough to reach every stream once when an
/// operation is too small to spread over all of them (`min_piece` apiece).
/// rxm connects to a peer on its first message, so without this the first
/// timed operations of a small size paid a connection set-up each (4 KiB
/// over 16 streams, 10 timed: a p50 of 13-29 ms on the device, against 60 us
/// once connected). `--warmup 0` stays 0.
pub fn warmup_ops(asked: usize, streams: usize, bytes: usize, min_piece: usize) -> usize {
    if asked == 0 || streams == 0 {
        return asked;
    }
    let spread = bytes.div_ceil(min_piece.max(1)).clamp(1, streams);
    asked.max(streams.div_ceil(spread))
}

/// One rank: join, then for every mode and size time and check.
fn run_one(args: &AllreduceArgs, rank: u32) -> Result<(), String> {
    let p = plan(args)?;
    let by_mode = rails_by_mode(args, &p.provider);
    let rails = by_mode.iter().map(|&(_, n)| n).max().unwrap_or(1);
    let rails_in = |mode: &str| by_mode.iter().find(|(m, _)| m == mode).map_or(rails, |&(_, n)| n);
    let mut rail_cores = Vec::new();
    if let Some(rc) = &args.cores.cores {
        let cores = tally_engine::host::cpuset::CoreList::parse(rc).map_err(|e| format!("--cores: {e}"))?;
        let cores = cores.as_slice();
        // The rank's own core, then its rails', then its copier's
        // (TALLY_COPIER=1) where its share of the list still has room for
        // one (`pinning`). Where it does not, the copier keeps the
        // connecting thread's core (as unlisted rails do) and shares it
        // with the rank: said, since two pollers on one core stall each other.
        let share = cores.len() / (args.ranks as usize).max(1);
        let wants_copier = ClientConfig::new(Vec::new(), 0, 0, 1).runs_copier(rails);
        let copier = wants_copier && rails + 2 <= share;
        if wants_copier && !copier && rank == 0 {
            eprintln!(
                "warning: {} cores for {} ranks of 1 + {rails} rails + a copier: the copier shares each rank's core",
                cores.len(),
                args.ranks
            );
        }
        // One rail has a thread too over shm with TALLY_SHM_RAIL=1
        // (`wants_rail_threads`): left unlisted it would spin on the rank's
        // own core (4 KiB agg p50 8 ms on a 16-core host).
        let threads = tally_engine::client::rails::wants_rail_threads(&p.provider, rails);
        let block = if threads { 1 + rails + copier as usize } else { 1 };
        if pinning::shares_a_core(cores.len(), args.ranks as usize, block) && rank == 0 {
            eprintln!(
                "warning: {} cores for {} ranks of {block} polling threads each (the rank's and its rails'): some share a core, and two pollers on one core take turns",
                cores.len(),
                args.ranks
            );
        }
        let mine = pinning::thread_cores(cores, args.ranks as usize, rank as usize, block);
        rail_cores = mine[1..].to_vec();
        let core = mine[0];
        tally_engine::host::cpuset::pin_current_thread(core).map_err(|e| format!("rank {rank}: cannot pin to core {core}: {e}"))?;
    }
    let n = args.ranks;
    let addr = args.bootstrap.as_deref().ok_or("--rank needs --bootstrap")?;
    // Barriers wait for the slowest rank's all-reduce, so they are bounded
    // by the same --timeout (plus start-up slack), never longer.
    let boot_timeout = Duration::from_secs(args.timeout.max(1) + 30);
    let mut boot = Bootstrap::new(addr, rank, n, boot_timeout).map_err(|e| e.to_string())?;
    // --launched: the job's id and secret come from rank 0, over the bootstrap.
    let shared;
    let args = if args.launched {
        shared = launched::share_job(args, &mut boot)?;
        &shared
    } else {
        args
    };
    let mut summary = RankSummary { rank, ranks: n, servers: args.servers.len(), ..Default::default() };
    if args.launched && rank == 0 && !args.json.json {
        super::launch::print_header(&p, args);
    }
    let max = *p.sizes.iter().max().unwrap_or(&0);
    let dsize = p.dtype.size();
    let max_count = max / dsize;
    let mut send = vec![0u8; max_count * dsize];
    fill(p.dtype, p.op, rank, &mut send);
    let mut recv = vec![0u8; max_count * dsize];
    // --agg-in-flight K: K result buffers for agg's overlapping all-reduces.
    let agg_k = if args.mode.mode.iter().any(|m| m == "agg") { args.agg_in_flight } else { 1 };
    let mut recvs: Vec<Vec<u8>> = if agg_k > 1 { (0..agg_k).map(|_| vec![0u8; max_count * dsize]).collect() } else { Vec::new() };
    let busy = args.poll.poll.is_busy();
    let loop_lines = rank == 0 && loop_lines_wanted();
    for mode in &args.mode.mode {
        let mut agg = None;
        let mut min_piece = dsize;
        let mut ring = None;
        let mut plugin = None;
        if mode == "agg-plugin" {
            let lib = args.plugin.clone().unwrap_or_else(collnet_driver::default_library);
            // The plugin's client reads its rails from the environment; this
            // thread may be pinned to one core already, which auto would see.
            // Set before the plugin's first client, as NCCL's user would.
            std::env::set_var("TALLY_RAILS", rails_in(mode).to_string());
            if !rail_cores.is_empty() {
                std::env::set_var("TALLY_RAIL_CORES", rail_cores.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","));
            }
            let d = collnet_driver::CollNetDriver::open(
                &lib,
                &args.servers,
                &p.provider,
                args.fabric_addr.as_deref(),
                &mut boot,
                args.job_id ^ 0x706c_7567,
                auto_or_size(&args.plugin_piece).map_err(|e| format!("--plugin-piece: {e}"))?,
                args.plugin_in_flight,
                auto_or_size(&args.plugin_chunk).map_err(|e| format!("--plugin-chunk: {e}"))?,
                Duration::from_secs(args.timeout.max(1)),
            )?;
            plugin = Some(d);
        } else if mode == "agg" {
            let mut cfg = ClientConfig::new(args.servers.clone(), args.job_id, rank, n);
            if let Some(hex) = &args.job_secret {
                cfg.job_secret = parse_secret(hex)?;
            }
            cfg.provider = Some(p.provider.clone());
            cfg.chunk_bytes = p.chunk;
            cfg.window = args.window.agg(p.chunk);
            cfg.fabric_addr = args.fabric_addr.clone();
            cfg.timeout = Duration::from_secs(args.timeout.max(1));
            cfg.send_credits = args.send_credits;
            cfg.rails = rails_in(mode);
            cfg.rail_cores = rail_cores.clone();
            cfg.spin_polls = if busy { u32::MAX } else { tally_engine::dataplane::lcore::adaptive_spin() };
            cfg.rail_spin_polls = cfg.spin_polls;
            cfg.sleep_ms = args.sleep_ms.unwrap_or(if ranks_per_process(args) > 1 { THREAD_SLEEP_MS } else { cfg.sleep_ms });
            min_piece = cfg.min_piece.max(dsize);
            let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
            c.join(p.dtype, p.op).map_err(|e| e.to_string())?;
            // What scripts/bench/soak.sh waits for before it kills a rank.
            log::debug!("rank {rank}: joined");
            agg = Some(c);
        } else {
            let mut cfg = RingConfig::new(&p.provider);
            cfg.chunk_bytes = p.chunk;
            cfg.window = args.window.ring() as usize;
            cfg.poll_busy = busy;
            cfg.node = args.fabric_addr.clone().or_else(|| p.provider.starts_with("tcp").then(|| "127.0.0.1".to_string()));
            ring = Some(Ring::new(&cfg, &mut boot).map_err(|e| e.to_string())?);
        }
        for &size in &p.sizes {
            let count = size / dsize;
            let bytes = count * dsize;
            let warm = match &agg {
                Some(c) => warmup_ops(args.loops.warmup, c.streams(), bytes, min_piece),
                None => args.loops.warmup,
            };
            // agg with --agg-in-flight above 1: its timed loop overlaps.
            let overlapping = agg.is_some() && !recvs.is_empty();
            // --launched: every result checked, into a buffer overwritten first.
            let check_each = args.launched;
            let (mut ops, mut each_wrong) = (0u64, 0u64);
            let mut one = |recv: &mut [u8]| -> Result<(), String> {
                if check_each {
                    recv.fill(launched::POISON);
                }
                match (&mut agg, &mut ring, &mut plugin) {
                    (Some(c), _, _) => c.allreduce(&send[..bytes], recv, p.dtype, p.op).map_err(|e| e.to_string()),
                    (_, Some(r), _) => r.allreduce(&send[..bytes], recv, p.dtype, p.op).map_err(|e| e.to_string()),
                    (_, _, Some(d)) => d.allreduce(&send[..bytes], recv, p.dtype, p.op),
                    _ => unreachable!("one mode is set"),
                }?;
                if check_each {
                    ops += 1;
                    each_wrong += check(p.dtype, p.op, n, recv);
                }
                Ok(())
            };
            for _ in 0..warm {
                one(&mut recv[..bytes])?;
            }
            let iters = args.loops.iters_for(bytes);
            let mut times = Vec::with_capacity(iters);
            let mut stamps: Vec<u8> = Vec::with_capacity(8 * (iters + 1));
            let mean;
            // The process's CPU time over the timed loop only (with --sync
            // its barriers too), read after any LOOP line is out.
            let cpu0;
            if args.sync {
                announce_loop(loop_lines, mode, bytes);
                cpu0 = process_cpu_s();
                for _ in 0..iters {
                    boot.barrier().map_err(|e| e.to_string())?;
                    let t0 = Instant::now();
                    one(&mut recv[..bytes])?;
                    times.push(t0.elapsed().as_secs_f64());
                }
                mean = times.iter().sum::<f64>() / iters as f64;
            } else {
                // Back to back: the barrier only before the loop; each
                // operation's time runs from the previous one's completion.
                boot.barrier().map_err(|e| e.to_string())?;
                announce_loop(loop_lines, mode, bytes);
                cpu0 = process_cpu_s();
                let t0 = Instant::now();
                let mut prev = t0;
                stamps.extend_from_slice(&mono_ns().to_le_bytes());
                let mut completed = || {
                    let now = Instant::now();
                    stamps.extend_from_slice(&mono_ns().to_le_bytes());
                    times.push((now - prev).as_secs_f64());
                    prev = now;
                };
                if overlapping {
                    let c = agg.as_mut().expect("agg's client");
                    overlap::pipelined(c, &send[..bytes], &mut recvs, iters, p.dtype, p.op, &mut completed)?;
                } else {
                    for _ in 0..iters {
                        one(&mut recv[..bytes])?;
                        completed();
                    }
                }
                mean = (prev - t0).as_secs_f64() / iters as f64;
            }
            let cpu_s = process_cpu_s() - cpu0;
            let rank0 = OpTimes::of(&mut times);
            // Every rank takes the same branch (same arguments).
            let gathered = !args.sync && n as usize * (iters + 1) <= GATHER_STAMPS;
            let stats = match gathered {
                true => {
                    let parts = boot.allgather(&stamps).map_err(|e| e.to_string())?;
                    OpTimes::of(&mut last_rank_times(&parts, iters)?)
                }
                false => rank0,
            };
            let t = if args.sync { stats.p50 } else { mean };
            // Every result buffer the loop wrote (overlapping agg), else the one.
            let wrong = if check_each {
                each_wrong
            } else if overlapping {
                recvs.iter().take(iters).map(|r| check(p.dtype, p.op, n, &r[..bytes])).sum()
            } else {
                check(p.dtype, p.op, n, &recv[..bytes])
            };
            let total_wrong = boot.reduce_sum_u64(wrong).map_err(|e| e.to_string())?;
            summary.allreduces += ops;
            summary.elements += ops * count as u64;
            summary.wrong += wrong;
            summary.job_wrong += total_wrong;
            if rank == 0 {
                let algbw = bytes as f64 / t / 1e9;
                let row = Row {
                    mode: mode.clone(),
                    bytes,
                    count,
                    dtype: p.dtype.name().into(),
                    op: p.op.name().into(),
                    time_us: t * 1e6,
                    method: match (args.sync, overlapping) {
                        (true, _) => "sync".into(),
                        (false, true) => format!("back-to-back, {agg_k} in flight"),
                        (false, false) => "back-to-back".into(),
                    },
                    iters,
                    mean_us: mean * 1e6,
                    p50_us: stats.p50 * 1e6,
                    p99_us: stats.p99 * 1e6,
                    max_us: stats.max * 1e6,
                    per_op: if gathered { "every rank" } else { "rank 0" }.into(),
                    rank0_p50_us: rank0.p50 * 1e6,
                    algbw_gbps: algbw,
                    busbw_gbps: algbw * 2.0 * (n as f64 - 1.0) / n as f64,
                    wrong: total_wrong,
                    cpu_s,
                };
                if !args.launched {
                    println!("RESULT {}", serde_json::to_string(&row).unwrap());
                    await_reader(loop_lines);
                } else if !args.json.json {
                    println!("{}", format_row(&row));
                }
            }
        }
        // What faults cost this rank (the soak reads it beside its RSS).
        if let Some(f) = agg.as_ref().map(|c| c.failover_stats()).filter(|f| f.recoveries + f.rejoins > 0) {
            log::info!(
                "rank {rank}: {} recoveries, {} rejoins; {} streams, staging area {} bytes, {} late receives, {} messages for no receive discarded",
                f.recoveries,
                f.rejoins,
                f.streams,
                f.staging_bytes,
                f.late_receives,
                f.discarded
            );
        }
        boot.barrier().map_err(|e| e.to_string())?;
    }
    if args.launched {
        return summary.finish(args.json.json);
    }
    Ok(())
}

/// Whether [`LOOP_LINES_ENV`] asks for `LOOP` lines; read once per rank,
/// so that the usual output is unchanged without it.
fn loop_lines_wanted() -> bool {
    std::env::var_os(LOOP_LINES_ENV).is_some_and(|v| v == "1")
}

/// Prints `LOOP <mode> <bytes>` (stdout is line-buffered: it leaves now)
/// when `enabled`; called after the barrier, before the loop's clocks start.
fn announce_loop(enabled: bool, mode: &str, bytes: usize) {
    if enabled {
        println!("LOOP {mode} {bytes}");
    }
}

/// Waits, when `enabled`, for the line with which the reader of the
/// `LOOP` and `RESULT` lines (`tally bench cluster`) says it has read the
/// loop's end: every rank's CPU from /proc. Until then this rank stays out
/// of the barrier that follows, so that no rank exits after the last loop
/// before it was read (an exited rank's CPU can no longer be read). The end
/// of the input (a reader gone) lets it go on.
fn await_reader(enabled: bool) {
    if enabled {
        let _ = std::io::stdin().read_line(&mut String::new());
    }
}

/// This process's CPU seconds so far, user + system, every thread (its
/// client's rail threads included), by getrusage(RUSAGE_SELF); 0 if that
/// fails (it cannot with these arguments). Read only outside timed loops.
fn process_cpu_s() -> f64 {
    // SAFETY: rusage is plain data; getrusage writes one into the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF and a valid pointer to an rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// `auto` (None) or a size (`512K`).
fn auto_or_size(s: &str) -> Result<Option<usize>, String> {
    if s == "auto" {
        Ok(None)
    } else {
        parse_size(s).map(|v| Some(v as usize)).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_sizes_warm_up_every_stream() {
        // 4 KiB pieces: a 4 KiB all-reduce reaches one of 16 streams, 16 KiB four.
        assert_eq!(warmup_ops(3, 16, 4096, 4096), 16);
        assert_eq!(warmup_ops(3, 16, 16384, 4096), 4);
        // Large ones reach every stream each: the warm-up asked for.
        assert_eq!(warmup_ops(3, 16, 64 << 20, 4096), 3);
        // None asked, none done; a job without streams (ring) as asked.
        assert_eq!(warmup_ops(0, 16, 4096, 4096), 0);
        assert_eq!(warmup_ops(2, 0, 4096, 4096), 2);
    }
}
