//! The kernel baseline (`--mode tcp`): plain TCP streams between the same
//! namespaces, over the same shaped links, in the same run as agg and
//! ring, timed as a loop and reported in the same row; worker i with server
//! i, or with `--tcp-peers all` every worker with every server (a worker's
//! bytes split over the servers, a server's over the workers, as agg
//! exchanges them); one connection per worker-server pair, or
//! `--tcp-streams` with the bytes split over them; every end on the
//! workers' cores, or with `--tcp-server-ends servers` each server host's
//! end on its server's cores.
//!
//! Why: CPU per GB all-reduced says what tally costs, but not how much of
//! it is the kernel's TCP, which any transport over these links pays
//! (docs/reference measuring.md: "beside it, the kernel's own cost for the
//! same bytes"). Worker i and server i each run a `tally bench tcp-stream`
//! process (`tcp_stream`), one connection between them; per iteration each
//! end sends the buffer's bytes and receives as many, at once: the bytes
//! agg moves through every host's link per all-reduce (a worker sends its
//! buffer out and receives the result; a server receives 1/n of every
//! worker's buffer and sends as much back). So the row's fraction is of
//! agg's bound R, and its CPU per GB is receive plus send: wkr the worker
//! ends' (per GB of the buffer, the ranks' figure), srv the server ends'
//! together (per GB they received, as for agg).
//!
//! Every stream warms up (`--warmup` iterations: TCP's window opens) and
//! says `READY`; this process then reads every end's CPU, the TCP counters
//! and the machine's (`loop_cpu`), tells them all `GO`, and reads again
//! when the last says `DONE`: the loop's time is that interval. The
//! servers stay up (idle) meanwhile. The ends run on the workers' cores
//! where the placement gives them, off the servers' lcores; with
//! `--tcp-server-ends servers` each server host's end runs on its server's
//! cores instead, where agg's server side runs.
use super::args::{loops_at, ClusterArgs, TcpEnds, TcpPeers};
use super::host_cpu::CoreSets;
use super::loop_cpu::{step_name, LoopTracker};
use super::netns::{addr, Iproute, Testbed};
use super::table::{ClusterOutcome, ClusterRow};
use super::workers::{spawn_on, wait_until};
use crate::bench::report::Row;
use crate::logfile;
use crate::progress::Progress;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tally_engine::host::cpuset::CoreList;
use tally_engine::host::units::parse_size;
use tally_engine::reduce::DataType;

/// The port a server host's stream end listens on (its server has 7400).
const PORT: u16 = 7500;

/// What one rate's streams share.
pub(super) struct Streams<'a> {
    pub(super) args: &'a ClusterArgs,
    pub(super) rate: f64,
    pub(super) exe: &'a Path,
    pub(super) ns: &'a dyn Fn(char, u32) -> String,
    /// The workers' cores, where the placement gives them.
    pub(super) cores: Option<&'a CoreList>,
    /// Each server's cores (its lcores' list), for `--tcp-server-ends servers`.
    pub(super) server_cores: &'a [String],
    /// The workers' and the servers' cores where apart: with the server
    /// hosts' ends on the servers' cores, each set's softirq time.
    pub(super) sets: Option<&'a CoreSets>,
}

/// A `tcp` row for every size, where `--mode` asks for them.
pub(super) fn run_tcp(bed: &mut Testbed, s: &Streams, progress: &mut Progress, out: &mut ClusterOutcome) -> Result<(), String> {
    if !s.args.mode.mode.iter().any(|m| m == "tcp") {
        return Ok(());
    }
    let dtype = DataType::parse(&s.args.dtype.dtype).ok_or_else(|| format!("--dtype: unknown type {:?}", s.args.dtype.dtype))?;
    for size in &s.args.sizes {
        progress.working_on(format!("{} Gbit/s tcp {size}", s.rate));
        // Whole elements, as the ranks cut the size, so that rows of a size line up.
        let asked = parse_size(size).map_err(|e| format!("--sizes {size}: {e}"))? as usize;
        // With every pair exchanging, each end splits its bytes evenly over
        // hosts x streams connections: whole shares, so both ends of each
        // connection move the same.
        let shares = match s.args.tcp_peers {
            TcpPeers::Own => 1,
            TcpPeers::All => s.args.hosts as usize * s.args.tcp_streams as usize,
        };
        let unit = dtype.size() * shares;
        let bytes = asked / unit * unit;
        let row = stream_loop(bed, s, bytes, dtype)?;
        out.rows.push(row);
        progress.step();
    }
    Ok(())
}

/// One loop of `bytes` per iteration over every worker-server pair.
fn stream_loop(bed: &mut Testbed, s: &Streams, bytes: usize, dtype: DataType) -> Result<ClusterRow, String> {
    let (args, n) = (s.args, s.args.hosts as usize);
    let iters = loops_at(args, s.rate).iters_for(bytes);
    let first = bed.children.len();
    let (tx, rx) = mpsc::channel();
    // Ends 0..n listen (server i), n..2n connect (worker i to server i).
    let names: Vec<String> = (0..2 * n).map(|k| (s.ns)(if k < n { 's' } else { 'w' }, (k % n) as u32)).collect();
    let end = End { args, exe: s.exe, bytes, iters };
    if args.tcp_server_ends == TcpEnds::Servers {
        // Each server's end on its own cores, the workers' on theirs.
        for (k, name) in names[..n].iter().enumerate() {
            let own = s.server_cores.get(k).and_then(|l| CoreList::parse(l).ok());
            spawn_on(bed, own.as_ref(), 1, |tools, _| end.spawn(tools, name, k, tx.clone()))?;
        }
        spawn_on(bed, s.cores, n, |tools, i| end.spawn(tools, &names[n + i], n + i, tx.clone()))?;
    } else {
        spawn_on(bed, s.cores, 2 * n, |tools, k| end.spawn(tools, &names[k], k, tx.clone()))?;
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let pids: Vec<u32> = bed.children[first..].iter().map(Child::id).collect();
    let sets = s.sets.filter(|_| args.tcp_server_ends == TcpEnds::Servers).cloned();
    let mut tracker = LoopTracker::new(pids[..n].to_vec(), pids[n..].to_vec(), sets);
    await_all(bed, first, &rx, "READY", deadline)?;
    let step = step_name("tcp", bytes);
    tracker.start(&step);
    let t0 = Instant::now();
    for c in &mut bed.children[first..] {
        let told = c.stdin.as_mut().map(|i| writeln!(i, "GO").and_then(|()| i.flush()));
        told.unwrap_or(Ok(())).map_err(|e| format!("tcp streams: cannot start an end: {e}"))?;
    }
    await_all(bed, first, &rx, "DONE", deadline)?;
    let secs = t0.elapsed().as_secs_f64();
    let over = tracker.finish(&step);
    // Their stdin closed, the ends exit.
    for c in &mut bed.children[first..] {
        drop(c.stdin.take());
    }
    for (k, c) in bed.children[first..].iter_mut().enumerate() {
        match wait_until(c, deadline) {
            Some(st) if st.success() => {}
            st => {
                return Err(format!("tcp stream end {}: {}", end_name(k, n), st.map_or("did not exit in time".into(), |s| s.to_string())))
            }
        }
    }
    let rank0_cpu_s = over.ranks.as_ref().and_then(|r| r.cpu_s.first().copied()).unwrap_or(0.0);
    let mut row = stream_row(bytes, iters, secs, args.hosts, dtype, rank0_cpu_s, args.tcp_streams, args.tcp_peers);
    if args.tcp_server_ends == TcpEnds::Servers {
        row.method.push_str(", each server's end on its server's cores");
    }
    Ok(ClusterRow::new(s.rate, args.hosts, row, &over))
}

/// `server 2` or `worker 2` for end `k` of `2n`.
fn end_name(k: usize, n: usize) -> String {
    if k < n {
        format!("server {k}")
    } else {
        format!("worker {}", k - n)
    }
}

/// What every end of one loop is started with.
struct End<'a> {
    args: &'a ClusterArgs,
    exe: &'a Path,
    bytes: usize,
    iters: usize,
}

impl End<'_> {
    /// Starts end `k` of `2 n` (see [`stream_loop`]) in namespace `ns`; its
    /// stdout lines go to `lines`.
    fn spawn(&self, tools: &Iproute, ns: &str, k: usize, lines: mpsc::Sender<String>) -> Result<Child, String> {
        let n = self.args.hosts as usize;
        let server = |i: usize| format!("{}:{PORT}", addr('s', i as u32));
        let (to, streams) = match (self.args.tcp_peers, k < n) {
            (TcpPeers::Own, _) => (server(k % n), self.args.tcp_streams),
            // A server's end takes every worker's connections.
            (TcpPeers::All, true) => (server(k), self.args.tcp_streams * n as u32),
            (TcpPeers::All, false) => ((0..n).map(server).collect::<Vec<_>>().join(","), self.args.tcp_streams),
        };
        let mut c = tools.exec_in(ns, self.exe);
        c.args(["bench", "tcp-stream", if k < n { "--listen" } else { "--connect" }, &to]);
        c.args(["--bytes", &self.bytes.to_string(), "--iters", &self.iters.to_string()]);
        c.args(["--streams", &streams.to_string()]);
        c.args(["--warmup", &self.args.loops.warmup.to_string(), "--timeout", &self.args.timeout.min(120).to_string()]);
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let name = end_name(k, n);
        let mut child = c.spawn().map_err(|e| format!("cannot start the tcp stream of {name}: {e}"))?;
        logfile::forward(child.stderr.take().expect("piped"), format!("[tcp {name}]"));
        logfile::forward_stdout(child.stdout.take().expect("piped"), format!("[tcp {name}]"), lines);
        Ok(child)
    }
}

/// Waits until every end from `first` on has said `what`, or one has
/// exited (then it says which), or the deadline.
fn await_all(bed: &mut Testbed, first: usize, rx: &mpsc::Receiver<String>, what: &str, deadline: Instant) -> Result<(), String> {
    let (ends, mut heard) = (bed.children.len() - first, 0);
    while heard < ends {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => heard += usize::from(line.trim() == what),
            Err(_) if Instant::now() >= deadline => return Err(format!("tcp streams: {heard} of {ends} ends said {what} in time")),
            Err(_) => {
                for (k, c) in bed.children[first..].iter_mut().enumerate() {
                    if let Ok(Some(st)) = c.try_wait() {
                        return Err(format!("tcp stream end {} exited with {st} before it said {what}", end_name(k, ends / 2)));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The row of a loop of `iters` iterations of `bytes` each way over
/// `secs`: no per-operation times (streams, not operations) and nothing to
/// check but the byte counts, which the ends did.
#[allow(clippy::too_many_arguments)]
fn stream_row(bytes: usize, iters: usize, secs: f64, hosts: u32, dtype: DataType, cpu_s: f64, streams: u32, peers: TcpPeers) -> Row {
    let t = secs / iters.max(1) as f64;
    let algbw = bytes as f64 / t / 1e9;
    let n = hosts as f64;
    Row {
        mode: "tcp".into(),
        bytes,
        count: bytes / dtype.size(),
        dtype: dtype.name().into(),
        op: "-".into(),
        time_us: t * 1e6,
        method: format!(
            "tcp streams, {}{}",
            match peers {
                TcpPeers::Own => "worker i <-> server i",
                TcpPeers::All => "every worker <-> every server",
            },
            if streams > 1 { format!(", {streams} connections each") } else { String::new() }
        ),
        iters,
        mean_us: t * 1e6,
        p50_us: 0.0,
        p99_us: 0.0,
        max_us: 0.0,
        per_op: "none: streams".into(),
        rank0_p50_us: 0.0,
        algbw_gbps: algbw,
        busbw_gbps: algbw * 2.0 * (n - 1.0) / n,
        wrong: 0,
        cpu_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_row_is_timed_as_a_loop() {
        let r = stream_row(4_000_000, 10, 0.4, 4, DataType::Float32, 0.2, 1, TcpPeers::Own);
        assert_eq!((r.mode.as_str(), r.count, r.iters), ("tcp", 1_000_000, 10));
        assert!((r.time_us - 40_000.0).abs() < 1e-6 && (r.algbw_gbps - 0.1).abs() < 1e-12, "{r:?}");
        assert!((r.busbw_gbps - 0.15).abs() < 1e-12, "{r:?}");
        assert_eq!((end_name(1, 4), end_name(5, 4)), ("server 1".to_string(), "worker 1".to_string()));
    }
}
