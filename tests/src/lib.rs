//! What the end-to-end suites share (the engine's in tests/suites/, the
//! tools' in tools/tests/, the plugin's CollNet and drain suites in
//! ffi-plugin/tests/): a real `tally server` process
//! ([`ServerProcess`]), clients joined to it, its metrics, a job looping
//! under faults ([`jobloop`]) and a switch of network namespaces
//! ([`netns`]).
//!
//! The `tally` binary comes from [`tally_bin`]: this crate is not the
//! tools package, so cargo's `CARGO_BIN_EXE_tally` does not reach it.
pub mod jobloop;
pub mod netns;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tally_engine::client::{Client, ClientConfig};
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::wire;

/// The `tally` binary the suites run: the one cargo built in the same
/// profile as this test, beside its `deps/` folder (`cargo test --workspace`
/// builds it; `-p tally-e2e` alone needs `cargo build -p tally-cli` first,
/// as the plugin tests need the plugin).
pub fn tally_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let bin = exe.parent().and_then(|d| d.parent()).expect("target/<profile>/deps/..").join("tally");
    assert!(bin.exists(), "{} is missing: build it first (cargo build -p tally-cli, same profile)", bin.display());
    bin
}

pub struct ServerProcess {
    pub child: Child,
    pub addr: String,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl ServerProcess {
    /// Starts `tally server` on a free loopback port with `args` and waits
    /// until it says it is ready. Its log lines are collected.
    pub fn start(args: &[&str]) -> ServerProcess {
        Self::start_on("127.0.0.1:0", args)
    }

    /// As `start`, listening on `listen` (a restarted server takes its old port).
    pub fn start_on(listen: &str, args: &[&str]) -> ServerProcess {
        Self::start_with(listen, args, &[])
    }

    /// As `start_on`, with `env` set for the server process only.
    // The child moves into the ServerProcess, whose Drop kills and waits for
    // it; the lint does not follow it there.
    #[allow(clippy::zombie_processes)]
    pub fn start_with(listen: &str, args: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        Self::launch(Command::new(tally_bin()), listen, args, env)
    }

    /// As `start_on`, through `command` (a wrapper such as `prlimit ... --
    /// tally`), which gets `server --listen LISTEN ARGS` appended.
    #[allow(clippy::zombie_processes)]
    pub fn start_via(command: Command, listen: &str, args: &[&str]) -> ServerProcess {
        Self::launch(command, listen, args, &[])
    }

    /// As `start_on`, inside network namespace `ns` (see [`netns`]).
    pub fn start_in(ns: &str, listen: &str, args: &[&str]) -> ServerProcess {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(tally_bin());
        Self::launch(c, listen, args, &[])
    }

    #[allow(clippy::zombie_processes)]
    fn launch(mut command: Command, listen: &str, args: &[&str], env: &[(&str, &str)]) -> ServerProcess {
        let mut child = command
            .arg("server")
            .args(["--listen", listen])
            .args(args)
            .envs(env.iter().copied())
            .env("TALLY_LOG", std::env::var("TALLY_LOG").unwrap_or_else(|_| "info".into()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tally server");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var("TALLY_TEST_VERBOSE").is_ok() {
                    eprintln!("server: {line}");
                }
                log2.lock().unwrap().push(line);
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tally server did not start: {:?}", log.lock().unwrap());
            }
            if let Some(rest) = line.strip_prefix("tally server ready on ") {
                let addr = rest.split_whitespace().next().unwrap().to_string();
                std::thread::spawn(move || for _ in out.lines() {});
                return ServerProcess { child, addr, log };
            }
        }
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// How many log lines contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log.lock().unwrap().iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits (bounded) until a log line contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log_contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// A line of the process's /proc status (`Threads`, `VmRSS` in kB, ...).
    pub fn status(&self, key: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("the server's /proc status");
        let line = text.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap_or_else(|| panic!("no {key} in /proc status"));
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number")
    }

    /// Where it serves /metrics (started with `--metrics ADDR`), from its log.
    pub fn metrics_addr(&self) -> String {
        assert!(self.wait_log("metrics on http://", Duration::from_secs(10)), "the server serves no metrics");
        let log = self.log.lock().unwrap();
        let line = log.iter().find(|l| l.contains("metrics on http://")).unwrap();
        line.split("http://").nth(1).unwrap().trim_end_matches("/metrics").to_string()
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("tally server did not stop on SIGTERM: {:?}", self.log.lock().unwrap());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The clients' log (`RUST_LOG`, else info from the engine) into the test
/// harness's capture: shown with a failing test's output, where what a
/// rank noticed (a loss, a rejoin) otherwise goes nowhere.
pub fn client_log() {
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("tally_engine=info")).is_test(true).try_init();
}

/// A client of a loopback server: small chunks and window so that even small
/// all-reduces use several slots; a 30 s progress timeout (longer than any
/// error bound the tests assert).
pub fn client(provider: &str, addr: &str, job: u64, rank: u32, n: u32) -> ClientConfig {
    client_log();
    let mut c = ClientConfig::new(vec![addr.to_string()], job, rank, n);
    c.provider = Some(provider.into());
    c.chunk_bytes = 16 << 10;
    c.window = 2;
    c.timeout = Duration::from_secs(30);
    c.spin_polls = 16;
    c.rail_spin_polls = 16;
    c
}

/// A job of `n` rank threads, each running `rounds` f32 sum all-reduces of
/// `count` elements (rank r's element i is r + i mod 97 + round: sums are
/// exact), every element checked.
pub fn sum_job(
    provider: &str,
    addr: &str,
    job: u64,
    n: u32,
    count: usize,
    rounds: usize,
) -> Vec<std::thread::JoinHandle<Result<(), String>>> {
    (0..n)
        .map(|rank| {
            let cfg = client(provider, addr, job, rank, n);
            std::thread::spawn(move || {
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                for round in 0..rounds {
                    let send: Vec<f32> = (0..count).map(|i| (rank as usize + i % 97 + round) as f32).collect();
                    let mut out = vec![0f32; count];
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, ReduceOp::Sum)
                        .map_err(|e| format!("job {job} rank {rank} round {round}: {e}"))?;
                    for (i, v) in out.iter().enumerate() {
                        let want: f32 = (0..n).map(|r| (r as usize + i % 97 + round) as f32).sum();
                        if *v != want {
                            return Err(format!("job {job} rank {rank} round {round}: element {i} = {v}, want {want}"));
                        }
                    }
                }
                Ok(())
            })
        })
        .collect()
}

pub fn join_all(hs: Vec<std::thread::JoinHandle<Result<(), String>>>) {
    for h in hs {
        h.join().expect("rank thread").unwrap();
    }
}

/// One HTTP GET: (head, body).
pub fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_string(), body.to_string())
}

/// Every sample of a scrape, keyed by the series text (`name{labels}`).
pub fn scrape(addr: &str) -> HashMap<String, f64> {
    let (head, body) = get(addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse::<f64>().unwrap_or_else(|_| panic!("bad value in {l:?}")))
        })
        .collect()
}

/// Sum of every series of metric `name` whose labels contain `with`.
pub fn sum(m: &HashMap<String, f64>, name: &str, with: &str) -> f64 {
    m.iter().filter(|(k, _)| k.split('{').next() == Some(name) && k.contains(with)).map(|(_, v)| v).sum()
}

/// Runs `tally bench allreduce --servers ADDR --mode agg --json ARGS` to its
/// end and returns its rows, after checking that it succeeded and that no
/// element of any all-reduce was wrong.
pub fn bench(addr: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(tally_bin())
        .args(["bench", "allreduce", "--servers", addr, "--provider", "tcp", "--mode", "agg", "--json", "--timeout", "60"])
        .args(args)
        .env("TALLY_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run tally bench allreduce");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tally bench allreduce {}: {}\n{stderr}", args.join(" "), out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("the JSON report");
    let rows = report["results"].as_array().expect("results").clone();
    for r in &rows {
        assert_eq!(r["wrong"], 0, "{r}");
    }
    rows
}

/// A finished command's exit status and both outputs, for assertion messages.
pub fn show_output(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Reads a server's challenge, the first message on every control
/// connection (`wire::auth`), for tests that play a rank by hand.
pub fn read_challenge(s: &mut TcpStream) -> wire::Challenge {
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut b = [0u8; core::mem::size_of::<wire::Challenge>()];
    s.read_exact(&mut b).expect("the server's challenge");
    let c: wire::Challenge = wire::read(&b).unwrap();
    c.check().expect("a well-formed challenge");
    c
}

/// A new control connection on which `msg` was sent answered to the
/// server's challenge with `token` (the bytes as a rank sends them).
pub fn answered_hello(addr: &str, msg: &wire::HelloMessage, token: &[u8; wire::TOKEN_BYTES]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let c = read_challenge(&mut s);
    let mut m = *msg;
    m.answer(&c, token);
    s.write_all(m.as_bytes()).unwrap();
    s
}

/// A new control connection on which `bytes` were sent as they are, after
/// the server's challenge was read.
pub fn raw_after_challenge(addr: &str, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    read_challenge(&mut s);
    s.write_all(bytes).unwrap();
    s
}

/// The server's reject on `s` (after the challenge was read).
pub fn read_reject(s: &mut TcpStream) -> wire::Reject {
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut b = vec![0u8; core::mem::size_of::<wire::Reject>()];
    s.read_exact(&mut b).expect("a reject");
    wire::read::<wire::Reject>(&b).unwrap()
}

/// The job secret the ranks of `job` use when nobody set one
/// (`ClientConfig::job_secret`'s default), as [`client`]'s configurations do.
pub fn default_secret(job: u64) -> wire::JobSecret {
    ClientConfig::new(Vec::new(), job, 0, 1).job_secret
}

/// The reject a server sent on `s`, past the challenge that comes first on
/// a connection it took into its handshake (one refused at its accept, as
/// busy, gets the reject alone). An I/O error if none came (closed).
pub fn reject_after_any_challenge(s: &mut TcpStream) -> std::io::Result<wire::Reject> {
    let bad = |e: wire::WireError| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string());
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr)?;
    if wire::read::<wire::Header>(&hdr).map_err(bad)?.check() == Ok(wire::Kind::Challenge) {
        let mut rest = [0u8; core::mem::size_of::<wire::Challenge>() - 8];
        s.read_exact(&mut rest)?;
        s.read_exact(&mut hdr)?;
    }
    let mut b = [0u8; core::mem::size_of::<wire::Reject>()];
    b[..8].copy_from_slice(&hdr);
    s.read_exact(&mut b[8..])?;
    wire::read::<wire::Reject>(&b).map_err(bad)
}

/// An f32 sum job's spec of `nranks` ranks (window 2, every lcore, no relay,
/// split, seals, failover or interleave) with pieces of `chunk_elems`, for tests that
/// play ranks by hand.
pub fn f32_sum_spec(job_id: u64, nranks: u32, chunk_elems: u32) -> wire::JobSpec {
    wire::JobSpec::new(job_id, nranks, DataType::Float32, ReduceOp::Sum, chunk_elems, 2, 0)
}
