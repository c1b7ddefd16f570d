//! The workers of one link rate: `tally bench allreduce` ranks in every
//! worker namespace (or the caller's `--workers-run` command), worker 0's
//! rows read back with the servers' and every rank's CPU time over each
//! timed loop and between loops, every wait bounded, and the TCP counters
//! and the machine's CPU over each loop (`loop_cpu`).
use super::args::{loops_at, ClusterArgs};
use super::host_cpu::CoreSets;
use super::loop_cpu::{step_name, LoopTracker};
use super::netns::{addr, Iproute, Testbed};
use super::placement::{link_gbits, worker_rails};
use super::shaping::chunk_for;
use super::table::{ClusterOutcome, ClusterRow};
use crate::bench::report::{format_row, Row, LOOP_LINES_ENV};
use crate::logfile;
use crate::progress::Progress;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tally_engine::host::cpuset::{restrict_current_thread, CoreList};

/// The running servers: their addresses and their processes' pids.
pub(super) struct Servers<'a> {
    pub(super) addrs: &'a [String],
    pub(super) pids: &'a [u32],
    /// Their cores and the workers', where the placement keeps them apart.
    pub(super) sets: Option<&'a CoreSets>,
}

/// The all-reduce modes of `--mode`: those the ranks run (not the kernel
/// baseline's `tcp`, which `tcp_baseline` runs after them).
pub(super) fn allreduce_modes(args: &ClusterArgs) -> Vec<String> {
    args.mode.mode.iter().filter(|m| *m != "tcp").cloned().collect()
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_rate(
    bed: &mut Testbed,
    args: &ClusterArgs,
    rate: f64,
    servers: &Servers,
    worker_cores: Option<&str>,
    poll: &str,
    exe: &Path,
    ns: &dyn Fn(char, u32) -> String,
    progress: &mut Progress,
    out: &mut ClusterOutcome,
) -> Result<(), String> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let job = (nanos ^ u64::from(std::process::id()).rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let boot = format!("{}:{}", addr('w', 0), 29000 + nanos % 1000);
    let log_level = if logfile::redirected() { "info" } else { "warn" };
    let modes = allreduce_modes(args);
    if modes.is_empty() {
        return Ok(());
    }
    let first_child = bed.children.len();
    let mut results = None;
    for i in 0..args.hosts {
        let mut c = bed.tools.exec_in(&ns('w', i), exe);
        c.args(["bench", "allreduce", "--rank", &i.to_string(), "--ranks", &args.hosts.to_string(), "--bootstrap", &boot]);
        c.args([
            "--job-id",
            &job.to_string(),
            "--servers",
            &servers.addrs.join(","),
            "--provider",
            &args.provider,
            "--fabric-addr",
            &addr('w', i),
        ]);
        c.args(["--mode", &modes.join(","), "--sizes", &args.sizes.join(","), "--iters", &args.loops.iters.to_string()]);
        c.args(["--min-bytes", &loops_at(args, rate).min_bytes.to_string()]);
        c.args([
            "--warmup",
            &args.loops.warmup.to_string(),
            "--dtype",
            &args.dtype.dtype,
            "--chunk",
            &chunk_for(args, rate),
            "--window",
            &args.window.window.to_string(),
        ]);
        c.args(["--send-credits", &args.agg_send_credits().to_string(), "--timeout", &args.timeout.min(120).to_string()]);
        c.args(["--agg-in-flight", &args.agg_in_flight.to_string()]);
        if let Some(wc) = worker_cores {
            c.args(["--cores", wc]);
        }
        // Each mode's client sizes its rails by the link's rate, unless
        // the user's TALLY_RAILS or the workers' cores say how many.
        if let Some(n) = worker_rails(args.hosts, worker_cores, rate, args.busy_polling()).forced() {
            c.args(["--rails", &n.to_string()]);
        }
        c.env("TALLY_LINK_GBITS", link_gbits(rate).to_string());
        c.args(["--poll", poll]);
        // agg-plugin: the plugin's own client reads its pacing from the
        // environment; where none was asked for, it keeps its default.
        if let Some(credits) = args.send_credits {
            c.env("TALLY_SEND_CREDITS", credits.to_string());
        }
        // Worker 0 waits after each RESULT row for this process's word that
        // it read the loop's end (`loop_cpu`), on its standard input.
        c.env("TALLY_LOG", log_level).stdin(if i == 0 { Stdio::piped() } else { Stdio::null() }).stderr(Stdio::piped());
        c.stdout(if i == 0 { Stdio::piped() } else { Stdio::null() });
        if i == 0 {
            // LOOP lines: the servers' and ranks' CPU time is read over each timed loop.
            c.env(LOOP_LINES_ENV, "1");
        }
        let mut child = c.spawn().map_err(|e| format!("cannot start worker {i}: {e}"))?;
        logfile::forward(child.stderr.take().expect("piped"), format!("[worker {i}]"));
        if let Some(o) = child.stdout.take() {
            results = Some(o);
        }
        bed.children.push(child);
    }
    let steps: Vec<String> = modes.iter().flat_map(|m| args.sizes.iter().map(move |s| format!("{rate} Gbit/s {m} {s}"))).collect();
    progress.working_on(steps[0].clone());
    // Rank 0's RESULT lines arrive on a thread so that the wait is bounded.
    let (tx, rx) = mpsc::channel();
    let reader = results.expect("worker 0 stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut got = 0;
    // The servers and ranks, one process in each host's namespace.
    let rank_pids = bed.children[first_child..].iter().map(|c| c.id()).collect();
    let mut tracker = LoopTracker::new(servers.pids.to_vec(), rank_pids, servers.sets.cloned());
    while got < steps.len() {
        let line = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => l,
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(format!("link rate {rate} Gbit/s: no result within {} s", args.timeout)),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if let Some(step) = line.strip_prefix("LOOP ") {
            tracker.start(step);
            continue;
        }
        let Some(j) = line.strip_prefix("RESULT ") else { continue };
        let row: Row = serde_json::from_str(j).map_err(|e| e.to_string())?;
        if let Some(lag) = read_lag() {
            std::thread::sleep(lag);
        }
        let over = tracker.finish(&step_name(&row.mode, row.bytes));
        // Worker 0 waits for this before the barrier after its loop: no rank
        // exits before its CPU over the last loop was read.
        if let Some(i) = bed.children[first_child].stdin.as_mut() {
            let _ = writeln!(i, "READ").and_then(|()| i.flush());
        }
        log::debug!("cluster {rate} Gbit/s: {}", format_row(&row));
        out.rows.push(ClusterRow::new(rate, args.hosts, row, &over));
        got += 1;
        progress.step();
        if let Some(s) = steps.get(got) {
            progress.working_on(s.clone());
        }
    }
    let mut failed = Vec::new();
    for (i, c) in bed.children[first_child..].iter_mut().enumerate() {
        let st = wait_until(c, deadline);
        if !matches!(st, Some(s) if s.success()) {
            failed.push(format!("worker {i} {}", st.map_or("did not finish in time".into(), |s| format!("exited with {s}"))));
        }
    }
    if !failed.is_empty() || got < steps.len() {
        return Err(format!("link rate {rate} Gbit/s: {} ({got} of {} results)", failed.join("; "), steps.len()));
    }
    Ok(())
}

/// TALLY_BENCH_READ_LAG_MS (tests only): how long to wait after each
/// RESULT row before reading the loop's end, so that a rank that exits
/// without waiting for the word to go on is certain to be gone by then.
fn read_lag() -> Option<Duration> {
    std::env::var("TALLY_BENCH_READ_LAG_MS").ok()?.parse().ok().map(Duration::from_millis)
}

/// `--workers-run`: the caller's command in every worker namespace, with the
/// job's environment; bounded by `--timeout`. Where the placement left the
/// workers cores of their own, the commands run there (started from a
/// thread restricted to them, whose mask they inherit), as tally's own
/// workers do: on one machine, a process that floats onto a server's core
/// makes that server's pinned lcore wait for its CPU, which hosts of
/// their own would not.
pub(super) fn run_command(
    bed: &mut Testbed,
    args: &ClusterArgs,
    rate: f64,
    cmd: &str,
    servers: &[String],
    ns: &dyn Fn(char, u32) -> String,
    cores: Option<&CoreList>,
) -> Result<(), String> {
    let first_child = bed.children.len();
    let names: Vec<String> = (0..args.hosts).map(|i| ns('w', i)).collect();
    spawn_on(bed, cores, names.len(), |tools, i| spawn_command(tools, args, rate, cmd, servers, &names[i], i as u32))?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut failed = Vec::new();
    for (i, c) in bed.children[first_child..].iter_mut().enumerate() {
        let st = wait_until(c, deadline);
        if !matches!(st, Some(s) if s.success()) {
            failed.push(format!("worker {i} {}", st.map_or("did not finish in time".into(), |s| format!("exited with {s}"))));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("link rate {rate} Gbit/s: {}", failed.join("; ")))
    }
}

/// Starts `count` processes, `spawn(tools, i)` each, from a thread
/// restricted to `cores` where given (the children inherit its mask), and
/// hands them to the testbed, those started before a failure too (it
/// kills them).
pub(super) fn spawn_on<F>(bed: &mut Testbed, cores: Option<&CoreList>, count: usize, spawn: F) -> Result<(), String>
where
    F: Fn(&Iproute, usize) -> Result<Child, String> + Sync,
{
    let tools = &bed.tools;
    let (spawned, error) = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut children = Vec::new();
                if let Some(list) = cores {
                    if let Err(e) = restrict_current_thread(list) {
                        return (children, Some(e.to_string()));
                    }
                }
                for i in 0..count {
                    match spawn(tools, i) {
                        Ok(c) => children.push(c),
                        Err(e) => return (children, Some(e)),
                    }
                }
                (children, None)
            })
            .join()
            .unwrap_or_else(|_| (Vec::new(), Some("the thread starting the processes panicked".into())))
    });
    bed.children.extend(spawned);
    error.map_or(Ok(()), Err)
}

/// Starts `--workers-run`'s command as worker `i`, in its namespace `ns`.
fn spawn_command(tools: &Iproute, args: &ClusterArgs, rate: f64, cmd: &str, servers: &[String], ns: &str, i: u32) -> Result<Child, String> {
    let mut c = tools.exec_in(ns, Path::new("/bin/sh"));
    c.args(["-c", cmd]);
    c.env("TALLY_CLUSTER_RANK", i.to_string())
        .env("TALLY_CLUSTER_WORLD", args.hosts.to_string())
        .env("TALLY_CLUSTER_MASTER", addr('w', 0))
        .env("TALLY_CLUSTER_IFNAME", "eth0")
        .env("TALLY_CLUSTER_RATE_GBIT", rate.to_string())
        .env("TALLY_LINK_GBITS", link_gbits(rate).to_string())
        .env("TALLY_SERVERS", servers.join(","))
        .env("TALLY_PROVIDER", "tcp")
        .env("TALLY_FABRIC_ADDR", addr('w', i))
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    c.stdout(if i == 0 { Stdio::inherit() } else { Stdio::piped() });
    let mut child = c.spawn().map_err(|e| format!("cannot start worker {i}: {e}"))?;
    logfile::forward(child.stderr.take().expect("piped"), format!("[worker {i}]"));
    if let Some(o) = child.stdout.take() {
        logfile::forward(o, format!("[worker {i}]"));
    }
    Ok(child)
}

pub(super) fn wait_until(c: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        match c.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
        }
    }
}
