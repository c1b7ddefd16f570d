//! The start-up commands of config/k8s/tally-server.yaml and
//! config/slurm/, run with this build's `tally` under `taskset` on two of
//! this host's CPUs (see main.rs for what is asserted and why).
use super::*;
use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tally_engine::host::cpuset;

/// A scratch folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("tally-manifests-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two CPUs this test may run on: the commands get both, so the first runs
/// the control plane and the second is the one lcore.
fn two_cpus() -> (usize, usize) {
    let allowed = cpuset::allowed().unwrap();
    assert!(allowed.len() >= 2, "these tests need two CPUs, this process has {allowed}");
    (allowed.as_slice()[0], allowed.as_slice()[1])
}

/// `toml` with each `key = value` of `set` replacing the file's line for
/// that key (or added; the last of a key in `set` wins), and `drop` keys removed.
fn toml_with(toml: &str, set: &[(&str, &str)], drop: &[&str]) -> String {
    let key = |l: &str| l.split('=').next().unwrap().trim().to_string();
    let mut out: Vec<String> = toml
        .lines()
        .filter(|l| !l.contains('=') || !(set.iter().any(|(k, _)| key(l) == *k) || drop.contains(&key(l).as_str())))
        .map(str::to_string)
        .collect();
    for (i, (k, v)) in set.iter().enumerate() {
        if !set[i + 1..].iter().any(|(later, _)| later == k) {
            out.push(format!("{k} = {v}"));
        }
    }
    out.join("\n") + "\n"
}

/// Settings that let a production configuration run on this host: tcp on
/// loopback, adaptive polling, small slabs that need no hugepage pool.
const RUN_HERE: &[(&str, &str)] = &[
    ("listen", "\"127.0.0.1:0\""),
    ("metrics", "\"127.0.0.1:0\""),
    ("provider", "\"tcp\""),
    ("poll", "\"adaptive\""),
    ("hugepages", "\"prefer\""),
    ("slab_size", "\"16M\""),
    ("max_chunk", "\"1M\""),
];

/// A command under test and what it printed.
struct Running {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Running {
    fn log(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// The log once it holds every one of `needles` (or after 10 s): the
    /// ready line comes on stdout, and a thread of its own reads stderr, so
    /// lines written before the ready line may not have been read yet.
    fn log_with(&self, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if needles.iter().all(|n| log.contains(n)) || Instant::now() > deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` and waits for a server's ready line on its stdout; `Err`
/// with what it printed if it exits first.
fn start_server(mut cmd: Command) -> Result<(Running, String), (Option<i32>, String)> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let (err, sink) = (child.stderr.take().unwrap(), stderr.clone());
    std::thread::spawn(move || BufReader::new(err).lines().map_while(Result::ok).for_each(|l| sink.lock().unwrap().push(l)));
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || BufReader::new(out).lines().map_while(Result::ok).for_each(|l| drop(tx.send(l))));
    let mut running = Running { child, stderr };
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.starts_with("tally server ready on ") => return Ok((running, line)),
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let code = running.child.wait().unwrap().code();
                std::thread::sleep(Duration::from_millis(100)); // the stderr reader's last lines
                return Err((code, running.log()));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("no ready line and no exit:\n{}", running.log()),
        }
    }
}

/// SIGTERM drains a server with no jobs: it must exit 0.
fn stop(mut r: Running) {
    // SAFETY: kill(2) on our own child's pid, which has not been waited for.
    assert_eq!(unsafe { libc::kill(r.child.id() as i32, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + HANG_GUARD;
    let status = loop {
        if let Some(s) = r.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the server did not stop on SIGTERM:\n{}", r.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status} after SIGTERM:\n{}", r.log());
}

/// The container's command under `taskset -c cpus`, with `tally` on PATH and
/// the ConfigMap's configuration, made to run here, where the pod reads it.
fn container_command(m: &ServerManifest, dir: &Path, cpus: &str, cpu_limit: &str) -> Command {
    // The ConfigMap is mounted at /etc/tally: the command's path is its key there.
    let mount =
        &m.container()["volumeMounts"].as_vec().unwrap().iter().find(|v| v["name"].as_str() == Some("config")).unwrap()["mountPath"];
    let config_path = format!("{}/server.toml", text(mount));
    let script = m.script();
    assert_eq!(script.matches(&config_path).count(), 1, "the command reads {config_path}:\n{script}");
    let here = dir.join("server.toml");
    std::fs::write(&here, toml_with(&m.toml, RUN_HERE, &[])).unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let _ = std::fs::remove_file(bin.join("tally"));
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tally"), bin.join("tally")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut c = Command::new("taskset");
    c.args(["-c", cpus, "/bin/bash", "-c", &script.replace(&config_path, here.to_str().unwrap())]);
    c.env("PATH", path).env("CPU_LIMIT", cpu_limit).env("TALLY_TOKEN", "manifest-test-token").env("TALLY_LOG", "info");
    c
}

#[test]
fn server_container_command_runs_a_server_on_the_granted_cores() {
    let m = ServerManifest::load();
    let dir = Scratch::new("k8s-run");
    let (a, b) = two_cpus();
    let (running, ready) =
        start_server(container_command(&m, &dir.0, &format!("{a},{b}"), "2")).unwrap_or_else(|(code, log)| panic!("exit {code:?}:\n{log}"));
    assert!(ready.contains("(1 lcores"), "{ready}");
    let lcore_line = format!("lcore 0 on core {b}:");
    let log = running.log_with(&["control plane on ", &lcore_line]);
    assert!(log.contains(&format!("control plane on {a}, lcores {b}")), "{log}");
    assert!(log.contains(&lcore_line), "{log}");
    stop(running);
}

#[test]
fn server_container_command_refuses_cores_it_cannot_use() {
    let m = ServerManifest::load();
    let dir = Scratch::new("k8s-refuse");
    let (a, b) = two_cpus();
    // The CPUs are not the container's own (no static CPU manager): the mask
    // is larger than the CPU limit.
    let (code, log) = start_server(container_command(&m, &dir.0, &format!("{a},{b}"), "61")).err().expect("started a server");
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("the kubelet's CPU manager does not pin it"), "{log}");
    // One CPU: the control plane's, none left for lcores.
    let (code, log) = start_server(container_command(&m, &dir.0, &b.to_string(), "1")).err().expect("started a server");
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("none is left for lcores"), "{log}");
}

/// The shell function `name` of `script`, from its `name() {` line to the
/// `}` at the same indentation.
fn shell_function(script: &str, name: &str) -> String {
    let lines: Vec<&str> = script.lines().collect();
    let start = lines.iter().position(|l| l.trim_start().starts_with(&format!("{name}() {{"))).unwrap_or_else(|| panic!("no {name}()"));
    let indent = lines[start].len() - lines[start].trim_start().len();
    let end = (start..lines.len()).find(|&i| lines[i].len() > indent && &lines[i][indent..] == "}").unwrap();
    lines[start..=end].iter().map(|l| l.get(indent..).unwrap_or("").trim_start()).collect::<Vec<_>>().join("\n")
}

#[test]
fn cpu_lists_lose_their_first_cpu_and_are_counted() {
    let k8s = ServerManifest::load().script();
    let step = read(SERVER_STEP);
    // One rule, in both places.
    assert_eq!(shell_function(&k8s, "without_first_cpu"), shell_function(&step, "without_first_cpu"));
    let cases = [
        ("2-62", "3-62"),
        ("1-63", "2-63"),
        ("0-1", "1"),
        ("1-2", "2"),
        ("5", ""),
        ("3,5", "5"),
        ("0,2-5,9", "2-5,9"),
        ("2-3,7-9", "3,7-9"),
        ("4-6,8", "5-6,8"),
    ];
    for (what, script) in [(SERVER_YAML, &k8s), (SERVER_STEP, &step)] {
        let f = shell_function(script, "without_first_cpu");
        for (list, want) in cases {
            let o = Command::new("bash").args(["-c", &format!("{f}\nwithout_first_cpu \"$1\""), "t", list]).output().unwrap();
            assert_eq!(String::from_utf8_lossy(&o.stdout).trim_end(), want, "{what}: without_first_cpu {list}");
        }
    }
    let count = shell_function(&k8s, "cpu_count");
    for (list, want) in [("2-62", "61"), ("0-63", "64"), ("7", "1"), ("0,2-5,9", "6"), ("3,5", "2")] {
        let o = Command::new("bash").args(["-c", &format!("{count}\ncpu_count \"$1\""), "t", list]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim_end(), want, "cpu_count {list}");
    }
}

// ---- Slurm --------------------------------------------------------------------

/// The server step, run as srun runs it: bash on the step's text, here under
/// `taskset -c cpus`, with this build's tally and `config`.
fn server_step(dir: &Path, cpus: &str, config: &str) -> Command {
    let path = dir.join("server.toml");
    std::fs::write(&path, config).unwrap();
    let mut c = Command::new("taskset");
    c.args(["-c", cpus, "bash", "-c", &read(SERVER_STEP), "tally-server-step"]);
    c.env("TALLY", env!("CARGO_BIN_EXE_tally")).env("TALLY_CONFIG", &path).env("TALLY_PORT", "0").env("TMPDIR", dir);
    c.env("SLURM_JOB_ID", "4242").env("SLURMD_NODENAME", "node1").env("TALLY_TOKEN", "manifest-test-token").env("TALLY_LOG", "info");
    c
}

#[test]
fn slurm_server_step_starts_a_server_on_the_step_cpus() {
    let dir = Scratch::new("slurm-run");
    let (a, b) = two_cpus();
    let c7gn = read("config/c7gn.16xlarge.toml");
    // The production file made to run here (its token comes from TALLY_TOKEN);
    // its lcores (2-63) give way to the step's.
    let config = toml_with(&c7gn, RUN_HERE, &["token_file"]);
    let (running, ready) =
        start_server(server_step(&dir.0, &format!("{a},{b}"), &config)).unwrap_or_else(|(code, log)| panic!("exit {code:?}:\n{log}"));
    assert!(ready.contains("(1 lcores"), "{ready}");
    let lcore_line = format!("lcore 0 on core {b}:");
    let log = running.log_with(&["node1: CPUs ", "tally doctor: checking against", &lcore_line]);
    assert!(log.contains("node1: CPUs ") && log.contains(&format!("control plane on {a}, lcores {b}")), "{log}");
    assert!(log.contains("tally doctor: checking against"), "doctor ran first:\n{log}");
    assert!(log.contains(&lcore_line), "{log}");
    // What ran: the configuration with the step's lcores and nothing else changed.
    let ran = std::fs::read_to_string(dir.0.join("tally-server-4242-node1.toml")).unwrap();
    let ran = ServerFile::parse(&ran).and_then(|f| f.resolve()).unwrap_or_else(|e| panic!("{e}:\n{ran}"));
    let given = ServerFile::parse(&config).and_then(|f| f.resolve()).unwrap();
    assert_eq!(ran.lcores.to_string(), b.to_string());
    assert_eq!(ServerConfig { lcores: given.lcores.clone(), ..ran }, given);
    stop(running);
}

#[test]
fn slurm_server_step_stops_when_doctor_fails() {
    let dir = Scratch::new("slurm-doctor");
    let (a, b) = two_cpus();
    // Required hugepages no host here has: doctor's hugepages check fails.
    let config =
        toml_with(&read("config/local.toml"), &[RUN_HERE, &[("hugepages", "\"require\""), ("slab_size", "\"1024G\"")]].concat(), &[]);
    let (code, log) = start_server(server_step(&dir.0, &format!("{a},{b}"), &config)).err().expect("the step started a server");
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("tally doctor found a failed check"), "{log}");
    assert!(log.lines().any(|l| l.starts_with("hugepages") && l.contains("fail")), "doctor's report is in the output:\n{log}");
    // One CPU: nothing left for lcores, and nothing started.
    let (code, log) = start_server(server_step(&dir.0, &b.to_string(), &config)).err().expect("the step started a server");
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("none is left for lcores"), "{log}");
}
