//! Network link faults in an emulated cluster, against real `tally` processes.
//!
//! Topology, made by the test out of network namespaces (prefix `nf<pid>`) and
//! deleted when it ends, panics included: a switch namespace `nf<pid>sw` with a
//! bridge, and three hosts linked to it by one veth pair each (`eth0` in the
//! host, `nf<pid><host>` on the switch), MTU 9000 as in
//! scripts/bench/cluster.sh, unshaped:
//!
//! - `s0`, 198.18.1.10: one `tally server` (provider tcp;ofi_rxm, adaptive
//!   polling, op timeout [`OP_TIMEOUT_S`]) that serves every job of the test;
//! - `w0`, `w1`, 198.18.1.50 and .51: the two rank processes of each job,
//!   `tally bench allreduce` (agg, 4 MiB f32 sums, every element checked,
//!   client timeout [`CLIENT_TIMEOUT_S`]).
//!
//! A healthy job first checks the topology and measures how long one
//! all-reduce takes. Then one fault after another is injected on worker 1's
//! link about a second into a run of about [`RUN_FOR`] (sized from the latest
//! healthy job):
//!
//! - link down: worker 1's switch port is set down (the cable pulled at the
//!   switch: worker 1 sees carrier loss, nothing is delivered either way);
//! - lossy: 30% loss and 10 ms delay in both directions, lifted after
//!   [`LOSS_HOLD`] (long enough for a stall to reach the op timeout);
//! - blackhole: 100% loss in both directions, carrier up.
//!
//! Loss and delay come from `tc qdisc ... netem` on both ends of the link
//! (the host's `eth0` and its switch port). Where the kernel has no netem
//! (some VM kernels), loss comes from a tc filter instead, on the egress of
//! the same two devices: a classic BPF program that matches a random share
//! of the frames (`ld rand`) and `mirred` redirecting them into a sink (a veth
//! pair with no address, whose far end discards them); there is no delay then,
//! and the summary line says so.
//!
//! The faulted runs are all warm-up iterations (`--warmup N --iters 1`):
//! back-to-back all-reduces with nothing in between, as a training loop
//! issues them. (Timed iterations start with a barrier on the ranks'
//! bootstrap TCP connections, bounded by `--timeout` + 30 s: longer than the
//! bounds asserted here.)
//!
//! Link down and blackhole: both ranks exit with an error (`tally: error:`,
//! not a crash) within [`ERROR_BOUND`] of the fault; the server stays up and
//! ends the job (logs `job ... ended`) within [`SERVER_END_BOUND`]. Lossy:
//! either the job completes with no wrong element, or it fails as above
//! (within [`LOSSY_BOUND`]). After each fault is lifted, a new job on the same
//! server runs to completion with no wrong element. No rank may ever report
//! a wrong element. At the end, how many job slots the server quarantined
//! (jobs ended with sends to an unreachable rank still in flight) is printed.
//!
//! Each scenario prints one `netfault:` summary line (see it with
//! `--nocapture`). Needs root, `ip` and `tc`; skipped with a message otherwise.
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SERVER_ADDR: &str = "198.18.1.10";
const WORKER_ADDRS: [&str; 2] = ["198.18.1.50", "198.18.1.51"];
const CONTROL_PORT: u16 = 7400;
const MTU: &str = "9000";
/// The host whose link takes the faults.
const FAULTY: &str = "w1";
/// Server: how long a slot's first piece waits for the other rank's before the job fails.
const OP_TIMEOUT_S: u64 = 3;
/// Server: a job that moves no bytes this long is ended (covers a fault that
/// hits while no piece is waiting in a slot, e.g. between two all-reduces).
const IDLE_TIMEOUT_S: u64 = 8;
/// Client: how long an all-reduce may make no progress before the rank gives up.
const CLIENT_TIMEOUT_S: u64 = 5;
/// Every rank's error must come within this of a fault: both timeouts plus
/// slack for a loaded 2-core machine. (The ranks' bootstrap timeout is
/// 120 s, so a rank left waiting on it fails this bound.)
const ERROR_BOUND: Duration = Duration::from_secs(20);
/// How long a job that runs through a fault would take unhindered: long
/// enough to be running at the fault even if the machine got several times
/// faster since the calibration, short enough that a job that survives the
/// lossy link finishes soon after.
const RUN_FOR: Duration = Duration::from_secs(5);
/// How long the lossy link stays lossy.
const LOSS_HOLD: Duration = Duration::from_secs(5);
/// The lossy job must be decided (completed or every rank failed) within
/// this of the fault: the hold, then the rest of the run (on a machine that
/// may have got several times slower since the calibration) or the error bound.
const LOSSY_BOUND: Duration = Duration::from_secs(45);
/// After the ranks failed, the server ends the job within this (its lcores
/// give up draining operations to an unreachable rank after 5 s).
const SERVER_END_BOUND: Duration = Duration::from_secs(15);
/// A healthy job (start, join, a few all-reduces) ends within this.
const JOB_BOUND: Duration = Duration::from_secs(60);
/// Iterations of a healthy job after a fault.
const NEW_JOB_ITERS: usize = 5;

type Lines = Arc<Mutex<Vec<String>>>;

/// Collects a child's output lines on a thread (so its pipe never fills);
/// the thread ends at the end of the stream.
fn collect(stream: impl Read + Send + 'static) -> (Lines, JoinHandle<()>) {
    let lines = Lines::default();
    let l2 = lines.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            l2.lock().unwrap().push(line);
        }
    });
    (lines, reader)
}

/// Runs an `ip` or `tc` command; panics with its stderr if it fails.
fn sh(cmd: &[&str]) {
    let out = Command::new(cmd[0]).args(&cmd[1..]).output().unwrap_or_else(|e| panic!("{}: {e}", cmd.join(" ")));
    assert!(out.status.success(), "{} failed: {}", cmd.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}

/// Polls `cond` every 20 ms until it holds (true) or `timeout` passes (false).
fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The namespaces and the server. Drop kills the server and deletes every
/// namespace made so far (the veth pairs go with them).
struct Cluster {
    prefix: String,
    namespaces: Vec<String>,
    server: Option<Child>,
    server_log: Lines,
    /// Loss with netem (else with the tc filter, into sinks made in the
    /// switch and in [`FAULTY`]).
    netem: bool,
}

impl Cluster {
    fn new() -> Cluster {
        let mut c = Cluster {
            prefix: format!("nf{}", std::process::id()),
            namespaces: Vec::new(),
            server: None,
            server_log: Lines::default(),
            netem: false,
        };
        let sw = c.add_namespace("sw");
        sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"]);
        sh(&["ip", "-n", &sw, "link", "set", "br0", "mtu", MTU, "up"]);
        sh(&["ip", "-n", &sw, "link", "set", "lo", "up"]);
        for (host, addr) in [("s0", SERVER_ADDR), ("w0", WORKER_ADDRS[0]), ("w1", WORKER_ADDRS[1])] {
            let ns = c.add_namespace(host);
            let port = c.switch_port(host);
            sh(&["ip", "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            sh(&["ip", "-n", &sw, "link", "set", &port, "master", "br0", "mtu", MTU, "up"]);
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "mtu", MTU, "up"]);
            sh(&["ip", "-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        let probe = Command::new("tc").args(["-n", &sw, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]).output();
        c.netem = probe.is_ok_and(|o| o.status.success());
        if c.netem {
            sh(&["tc", "-n", &sw, "qdisc", "del", "dev", "lo", "root"]);
        } else {
            for ns in [sw, c.namespace(FAULTY)] {
                sh(&["ip", "-n", &ns, "link", "add", "sink0", "type", "veth", "peer", "name", "sink1"]);
                sh(&["ip", "-n", &ns, "link", "set", "sink0", "up"]);
                sh(&["ip", "-n", &ns, "link", "set", "sink1", "up"]);
            }
        }
        c
    }

    fn add_namespace(&mut self, host: &str) -> String {
        let ns = self.namespace(host);
        sh(&["ip", "netns", "add", &ns]);
        self.namespaces.push(ns.clone());
        ns
    }

    fn namespace(&self, host: &str) -> String {
        format!("{}{host}", self.prefix)
    }

    /// The switch end of `host`'s link (at most 11 characters: fits IFNAMSIZ).
    fn switch_port(&self, host: &str) -> String {
        format!("{}{host}", self.prefix)
    }

    /// The `tally` binary, to be run inside `host`'s namespace.
    fn tally(&self, host: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespace(host)]).arg(tally_e2e::tally_bin());
        c
    }

    fn start_server(&mut self) {
        let mut child = self
            .tally("s0")
            .args(["server", "--listen", &format!("{SERVER_ADDR}:{CONTROL_PORT}"), "--lcores", "0-1", "--provider", "tcp"])
            .args(["--poll", "adaptive", "--slab-size", "64M", "--op-timeout", &OP_TIMEOUT_S.to_string()])
            .args(["--idle-timeout", &IDLE_TIMEOUT_S.to_string()])
            .env("TALLY_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tally server");
        self.server_log = collect(child.stderr.take().unwrap()).0;
        let stdout = collect(child.stdout.take().unwrap()).0;
        self.server = Some(child);
        let ready = wait_for(Duration::from_secs(30), || {
            stdout.lock().unwrap().iter().any(|l| l.starts_with("tally server ready on ")) || !self.server_running()
        });
        assert!(ready && self.server_running(), "tally server did not start: {:?}", self.server_log.lock().unwrap());
    }

    fn server_running(&mut self) -> bool {
        self.server.as_mut().is_some_and(|s| s.try_wait().unwrap().is_none())
    }

    /// The first server log line containing every one of `needles`.
    fn server_line(&self, needles: &[&str]) -> Option<String> {
        self.server_log.lock().unwrap().iter().find(|l| needles.iter().all(|n| l.contains(n))).cloned()
    }

    /// Starts the two rank processes of agg job `id`: `iters` timed 4 MiB
    /// all-reduces after `warmup` untimed ones.
    fn start_job(&self, id: u64, warmup: usize, iters: usize) -> Job {
        // A bootstrap port of its own per job: no lingering socket of an
        // earlier job's rank 0 is in the way.
        let boot = format!("{}:{}", WORKER_ADDRS[0], 29000 + id % 1000);
        let ranks = (0..2)
            .map(|rank| {
                let mut child = self
                    .tally(&format!("w{rank}"))
                    .args(["bench", "allreduce", "--rank", &rank.to_string(), "--ranks", "2", "--bootstrap", &boot])
                    .args(["--job-id", &id.to_string(), "--servers", &format!("{SERVER_ADDR}:{CONTROL_PORT}")])
                    .args(["--provider", "tcp", "--fabric-addr", WORKER_ADDRS[rank], "--mode", "agg", "--sizes", "4M"])
                    .args(["--iters", &iters.to_string(), "--warmup", &warmup.to_string(), "--chunk", "256K", "--window", "4"])
                    .args(["--timeout", &CLIENT_TIMEOUT_S.to_string()])
                    .env("TALLY_LOG", "warn")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn a rank");
                let (stdout, out_reader) = collect(child.stdout.take().unwrap());
                let (stderr, err_reader) = collect(child.stderr.take().unwrap());
                Rank { child, stdout, stderr, readers: vec![out_reader, err_reader], exit: None }
            })
            .collect();
        Job { ranks }
    }

    /// Runs a job of `iters` iterations, which must succeed within
    /// [`JOB_BOUND`] with no wrong element; returns its wall time and result.
    fn healthy_job(&self, id: u64, iters: usize) -> Result<(Duration, serde_json::Value), String> {
        let t0 = Instant::now();
        let mut job = self.start_job(id, 1, iters);
        if !job.wait(t0 + JOB_BOUND) {
            return Err(format!("healthy job {id:#x} still running after {JOB_BOUND:?}:{}", job.describe(t0)));
        }
        if job.ranks.iter().any(|r| !r.exit.unwrap().0.success()) {
            return Err(format!("healthy job {id:#x} failed:{}", job.describe(t0)));
        }
        match &job.results()[..] {
            [row] if row["wrong"] == 0 => Ok((t0.elapsed(), row.clone())),
            rows => Err(format!("healthy job {id:#x}: rank 0 reported {rows:?}")),
        }
    }

    /// Injects `fault` on [`FAULTY`]'s link, or (`lift`) removes it.
    fn fault(&self, fault: Fault, lift: bool) {
        let (sw, ns, port) = (self.namespace("sw"), self.namespace(FAULTY), self.switch_port(FAULTY));
        // Both directions: the egress of the host's eth0 and of its switch port.
        let ends = [(ns, "eth0".to_string()), (sw.clone(), port.clone())];
        let words = |c: String| c.split_whitespace().map(String::from).collect::<Vec<_>>();
        let commands: Vec<Vec<String>> = match fault {
            Fault::LinkDown => vec![words(format!("ip -n {sw} link set {port} {}", if lift { "up" } else { "down" }))],
            Fault::Loss { .. } if lift => {
                let qdisc = if self.netem { "root" } else { "clsact" };
                ends.iter().map(|(n, d)| words(format!("tc -n {n} qdisc del dev {d} {qdisc}"))).collect()
            }
            Fault::Loss { percent, delay_ms } if self.netem => ends
                .iter()
                .map(|(n, d)| words(format!("tc -n {n} qdisc add dev {d} root netem delay {delay_ms}ms loss {percent}%")))
                .collect(),
            Fault::Loss { percent, .. } => {
                // Classic BPF, as "count,code jt jf k,...": load a random u32
                // (SKF_AD_OFF + SKF_AD_RANDOM); below the threshold return -1
                // (match: the action runs), else 0 (no match).
                let program = if percent >= 100 {
                    "1,6 0 0 4294967295".to_string()
                } else {
                    let threshold = (u32::MAX as u64 + 1) * percent as u64 / 100;
                    format!("4,32 0 0 4294963256,53 1 0 {threshold},6 0 0 4294967295,6 0 0 0")
                };
                let mut v = Vec::new();
                for (n, d) in &ends {
                    v.push(words(format!("tc -n {n} qdisc add dev {d} clsact")));
                    let mut filter = words(format!("tc -n {n} filter add dev {d} egress bpf bytecode"));
                    filter.push(program.clone());
                    filter.extend(words("action mirred egress redirect dev sink0".into()));
                    v.push(filter);
                }
                v
            }
        };
        for c in commands {
            sh(&c.iter().map(String::as_str).collect::<Vec<_>>());
        }
    }

    /// How `fault` is made here, for the summary line.
    fn describe_fault(&self, fault: Fault) -> String {
        match fault {
            Fault::LinkDown => "switch port down".into(),
            Fault::Loss { percent, delay_ms } if self.netem => format!("netem loss {percent}% delay {delay_ms}ms"),
            Fault::Loss { percent, .. } => format!("tc bpf random drop {percent}%, no delay (kernel without netem)"),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(s) = &mut self.server {
            let _ = s.kill();
            let _ = s.wait();
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// What is done to a link.
#[derive(Clone, Copy)]
enum Fault {
    /// The switch port set down.
    LinkDown,
    /// Frames lost at random, and (with netem) delayed, in both directions.
    Loss { percent: u32, delay_ms: u32 },
}

struct Rank {
    child: Child,
    stdout: Lines,
    stderr: Lines,
    /// The threads collecting stdout and stderr, joined at exit.
    readers: Vec<JoinHandle<()>>,
    /// Exit status and when it was seen.
    exit: Option<(ExitStatus, Instant)>,
}

impl Rank {
    /// Its error message (`tally: error: MESSAGE`), if it printed one.
    fn error(&self) -> Option<String> {
        let err = self.stderr.lock().unwrap();
        err.iter().rev().find_map(|l| l.strip_prefix("tally: error: ")).map(String::from)
    }

    /// The line of the crash report that names the signal, if it crashed
    /// (libfabric's providers print one from their signal handler).
    fn crash(&self) -> Option<String> {
        self.stderr.lock().unwrap().iter().find(|l| l.contains("terminated with signal")).cloned()
    }
}

/// The rank processes of one job. Drop kills those still running.
struct Job {
    ranks: Vec<Rank>,
}

impl Job {
    /// Waits until every rank exited (true) or `deadline` passed (false).
    fn wait(&mut self, deadline: Instant) -> bool {
        wait_for(deadline.saturating_duration_since(Instant::now()), || {
            for r in &mut self.ranks {
                if r.exit.is_none() {
                    if let Some(st) = r.child.try_wait().unwrap() {
                        r.exit = Some((st, Instant::now()));
                        // Its output is complete once the readers saw the end.
                        r.readers.drain(..).for_each(|h| h.join().unwrap());
                    }
                }
            }
            self.ranks.iter().all(|r| r.exit.is_some())
        })
    }

    /// Rank 0's `RESULT` rows.
    fn results(&self) -> Vec<serde_json::Value> {
        let out = self.ranks[0].stdout.lock().unwrap();
        out.iter().filter_map(|l| l.strip_prefix("RESULT ")).map(|j| serde_json::from_str(j).expect("a RESULT row")).collect()
    }

    /// Every rank's state and stderr, for assertion messages.
    fn describe(&self, since: Instant) -> String {
        let mut s = String::new();
        for (r, rank) in self.ranks.iter().enumerate() {
            let state = match rank.exit {
                Some((st, at)) => format!("{st} after {:.1}s", at.duration_since(since).as_secs_f64()),
                None => "still running".into(),
            };
            s += &format!("\n  rank {r}: {state}; stderr: {:?}", rank.stderr.lock().unwrap());
        }
        s
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for r in &mut self.ranks {
            if r.exit.is_none() {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
        }
    }
}

/// One fault injected into a running job.
struct Scenario {
    name: &'static str,
    fault: Fault,
    /// Lift the fault after this long whatever the job does (else once every
    /// rank exited).
    lift_after: Option<Duration>,
    /// The job may also complete (else every rank must fail).
    may_complete: bool,
}

/// Runs job `id` of `iters` back-to-back all-reduces, injects the scenario's
/// fault on [`FAULTY`]'s link a second into it, checks the outcome, lifts the
/// fault and checks that new job `next_id` succeeds. Returns the summary line,
/// what went against the expectations (collected, so that every scenario
/// runs and prints its figures before the test fails) and the new job's result.
fn run_scenario(c: &mut Cluster, s: &Scenario, id: u64, next_id: u64, iters: usize) -> (String, Vec<String>, Option<serde_json::Value>) {
    let mut bad = Vec::new();
    let mut job = c.start_job(id, iters, 1);
    let running = format!("job {id:#x}: running");
    assert!(wait_for(JOB_BOUND, || c.server_line(&[&running]).is_some()), "{}: job {id:#x} did not start", s.name);
    // Into the loop, data flowing.
    std::thread::sleep(Duration::from_secs(1));
    assert!(job.ranks.iter_mut().all(|r| r.child.try_wait().unwrap().is_none()), "{}: the job ended before the fault", s.name);

    let t0 = Instant::now();
    c.fault(s.fault, false);
    let bound = if s.may_complete { LOSSY_BOUND } else { ERROR_BOUND };
    let ended = match s.lift_after {
        Some(hold) => {
            job.wait(t0 + hold);
            c.fault(s.fault, true);
            job.wait(t0 + bound)
        }
        None => {
            let ended = job.wait(t0 + bound);
            c.fault(s.fault, true);
            ended
        }
    };
    if !ended {
        bad.push(format!("not every rank exited within {bound:?} of the fault:{}", job.describe(t0)));
    }

    // Never a wrong element, whatever the outcome.
    let results = job.results();
    if results.iter().any(|r| r["wrong"] != 0) {
        bad.push(format!("wrong elements: {results:?}"));
    }
    let mut ranks = Vec::new();
    for (r, rank) in job.ranks.iter().enumerate() {
        let Some((st, at)) = rank.exit else {
            ranks.push(format!("worker{r} still running after {bound:?}"));
            continue;
        };
        let after = at.duration_since(t0).as_secs_f64();
        if st.success() {
            ranks.push(format!("worker{r} done after {after:.1}s"));
        } else if let Some(crash) = rank.crash() {
            // A rank must fail with an error of its own, not a crash.
            bad.push(format!("rank {r} crashed:{}", job.describe(t0)));
            ranks.push(format!("worker{r} CRASHED after {after:.1}s {crash:?}"));
        } else if let (Some(1), Some(e)) = (st.code(), rank.error()) {
            ranks.push(format!("worker{r} error after {after:.1}s {e:?}"));
        } else {
            bad.push(format!("rank {r} failed without an error message:{}", job.describe(t0)));
            ranks.push(format!("worker{r} {st} after {after:.1}s"));
        }
    }
    let done = job.ranks.iter().filter(|r| r.exit.is_some_and(|(st, _)| st.success())).count();
    let outcome = match done {
        0 => "errors",
        2 if s.may_complete && results.len() == 1 => "completed 0 wrong",
        2 => {
            bad.push(format!("the job completed through the fault; rank 0 reported {results:?}"));
            "completed"
        }
        _ => {
            bad.push(format!("one rank completed, the other did not:{}", job.describe(t0)));
            "mixed"
        }
    };
    // A failed job: the server ends it (frees or quarantines its regions
    // once its lcores drained it, at most their drain timeout later).
    let mut server_says = String::new();
    if done < 2 {
        let job_name = format!("job {id:#x}");
        if !wait_for(SERVER_END_BOUND, || c.server_line(&[&format!("{job_name} ended")]).is_some()) {
            bad.push(format!("the server did not end {job_name} within {SERVER_END_BOUND:?} of the ranks' exit"));
        }
        let log = c.server_log.lock().unwrap();
        let lines: Vec<&str> = log
            .iter()
            .filter_map(|l| l.split_once(&job_name).map(|(_, rest)| rest.trim_start_matches(':').trim()))
            .filter(|l| !l.starts_with("running") && !l.contains("starting (tag"))
            .collect();
        server_says = format!(", server: {:?}", lines.join(" | "));
    }
    assert!(c.server_running(), "{}: the server exited: {:?}", s.name, c.server_log.lock().unwrap());
    drop(job);

    let (new_job, row) = match c.healthy_job(next_id, NEW_JOB_ITERS) {
        Ok((took, row)) => (format!("new job ok ({:.1}s)", took.as_secs_f64()), Some(row)),
        Err(e) => {
            bad.push(format!("after the fault was lifted, {e}"));
            ("new job FAILED".into(), None)
        }
    };
    let summary = format!(
        "netfault: {} {FAULTY} ({}): outcome={outcome}, {}{server_says}, {new_job}",
        s.name,
        c.describe_fault(s.fault),
        ranks.join(", ")
    );
    (summary, bad.into_iter().map(|b| format!("{}: {b}", s.name)).collect(), row)
}

#[test]
fn link_faults_mid_run() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["ip", "tc"].iter().all(|t| Command::new(t).arg("-V").output().is_ok_and(|o| o.status.success()));
    if !root || !tools {
        eprintln!("netfault: SKIPPED: needs root and iproute2 (ip, tc) for network namespaces (root: {root}, ip/tc: {tools})");
        return;
    }
    let t_all = Instant::now();
    let mut c = Cluster::new();
    c.start_server();
    // Job ids: distinct per run (a running id is refused) and per test
    // process; the low bits also pick the bootstrap port.
    let base = 0x7a11_0000u64 + ((std::process::id() as u64 & 0xff) << 8);
    let mut ids = (1..).map(|n| base + n);

    // Healthy first: the topology works, and how long one all-reduce takes.
    let (took, mut row) = c.healthy_job(ids.next().unwrap(), 5).unwrap_or_else(|e| panic!("before any fault: {e}"));
    eprintln!(
        "netfault: baseline: ok in {:.1}s, 4 MiB all-reduce {:.1} ms ({:.2} GB/s algbw)",
        took.as_secs_f64(),
        row["time_us"].as_f64().unwrap() / 1e3,
        row["algbw_GBps"].as_f64().unwrap()
    );

    let scenarios = [
        Scenario { name: "link down", fault: Fault::LinkDown, lift_after: None, may_complete: false },
        Scenario { name: "lossy", fault: Fault::Loss { percent: 30, delay_ms: 10 }, lift_after: Some(LOSS_HOLD), may_complete: true },
        Scenario { name: "blackhole", fault: Fault::Loss { percent: 100, delay_ms: 0 }, lift_after: None, may_complete: false },
    ];
    let mut bad = Vec::new();
    for s in &scenarios {
        // Sized from the latest healthy job: this machine's speed varies a lot
        // with its load.
        let iters = (RUN_FOR.as_secs_f64() * 1e6 / row["time_us"].as_f64().unwrap()).ceil().clamp(20.0, 100_000.0) as usize;
        let (id, next) = (ids.next().unwrap(), ids.next().unwrap());
        let (summary, mut b, new_row) = run_scenario(&mut c, s, id, next, iters);
        eprintln!("{summary} [{iters} all-reduces]");
        bad.append(&mut b);
        row = new_row.unwrap_or(row);
    }
    let quarantined = c.server_log.lock().unwrap().iter().filter(|l| l.contains("quarantined")).cloned().collect::<Vec<_>>();
    eprintln!(
        "netfault: all scenarios in {:.1}s; server quarantined {} job slot(s){}",
        t_all.elapsed().as_secs_f64(),
        quarantined.len(),
        quarantined.last().and_then(|l| l.rsplit_once(" stay ")).map_or(String::new(), |(_, rest)| format!(", last: {rest}"))
    );
    assert!(bad.is_empty(), "{} expectation(s) failed:\n{}", bad.len(), bad.join("\n"));
}
