//! `tally bench p2p` as a user runs it: the fan mode (`--hubs`/`--leaves`)
//! over shm and tcp;ofi_rxm, and the two-end mode it sits beside.
//!
//! The fan mode checks every returned byte against what its leaf sent and
//! fails the run on any difference, so a zero exit with sane figures means
//! the data went out and came back right. Adaptive polling throughout: the
//! test box may have two cores, and busy pollers must not outnumber them.
//! The runs take a lock so that they never share the cores with each other.
use serde_json::Value;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `tally bench p2p ARGS`, killed if it takes over two minutes (a hang
/// is a failure, not a stuck test).
fn p2p(args: &[&str]) -> Output {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(["bench", "p2p"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tally bench p2p");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("tally bench p2p {args:?} hung; stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn fan(provider: &str) {
    let args = [
        "--hubs",
        "2",
        "--leaves",
        "2",
        "--sizes",
        "1M,100001",
        "--chunk",
        "64K",
        "--iters",
        "2",
        "--poll",
        "adaptive",
        "--provider",
        provider,
        "--json",
    ];
    let out = p2p(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{provider}: exit {:?}; stderr: {stderr}", out.status);
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{provider}: not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v["mode"], "fan");
    assert_eq!(v["hubs"], 2);
    assert_eq!(v["leaves"], 2);
    assert!(v["provider"].as_str().unwrap().starts_with(provider), "{v}");
    let rows = v["results"].as_array().expect("results");
    assert_eq!(rows.len(), 2, "one row per size: {v}");
    for (row, bytes) in rows.iter().zip([1u64 << 20, 100001]) {
        assert_eq!(row["mode"], "fan");
        assert_eq!(row["hubs"], 2);
        assert_eq!(row["leaves"], 2);
        assert_eq!(row["bytes"], bytes);
        assert_eq!(row["chunk"], 64 << 10);
        assert_eq!(row["window"], 4, "the default window is tally bench allreduce's");
        for f in ["time_us", "hub_input_GBps", "best_hub_input_GBps", "per_hub_GBps"] {
            let x = row[f].as_f64().unwrap_or_else(|| panic!("{f} missing: {row}"));
            assert!(x > 0.0 && x.is_finite(), "{f} = {x}: {row}");
        }
        let (input, per_hub) = (row["hub_input_GBps"].as_f64().unwrap(), row["per_hub_GBps"].as_f64().unwrap());
        assert!((input / 2.0 - per_hub).abs() <= 1e-9 * input, "per hub is the hub input over 2 hubs: {row}");
        let (t, gbps) = (row["time_us"].as_f64().unwrap(), input);
        assert!((2.0 * bytes as f64 / (t * 1e3) - gbps).abs() <= 1e-6 * gbps, "hub input = leaves x bytes / time: {row}");
    }
    // 100001 bytes over 2 hubs: the client's cut gives two pieces of 52 KiB (whole 4 KiB), not one 64 KiB and a rest.
    assert_eq!(rows[1]["piece"], 53248, "{v}");
}

#[test]
fn fan_over_shm_moves_every_byte_back_and_reports_one_row_per_size() {
    fan("shm");
}

#[test]
fn fan_over_tcp_moves_every_byte_back_and_reports_one_row_per_size() {
    fan("tcp");
}

#[test]
fn fan_refuses_bad_arguments_with_a_message() {
    for (args, says) in [
        (&["--hubs", "2", "--leaves", "2", "--window", "0", "--poll", "adaptive"][..], "--window"),
        (&["--hubs", "2", "--leaves", "2", "--poll", "busy", "--cores", "0"][..], "--poll adaptive"),
        (&["--hubs", "2", "--poll", "adaptive"][..], "--leaves"),
        (&["--hubs", "1", "--leaves", "1", "--chunk", "0", "--poll", "adaptive"][..], "--chunk"),
        (&["--sizes", "4K", "--chunk", "64K"][..], "fan mode"),
    ] {
        let out = p2p(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("tally: error:") && stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn two_end_mode_is_unchanged_by_the_fan_options() {
    let out = p2p(&["--sizes", "4K", "--iters", "50", "--warmup", "5", "--poll", "adaptive", "--provider", "shm", "--json"]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = v["results"].as_array().expect("results");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["bytes"], 4096);
    assert!(rows[0]["latency_us"].as_f64().unwrap() > 0.0 && rows[0]["bandwidth_GBps"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v.get("mode").is_none(), "the two-end report keeps its shape: {v}");
}
