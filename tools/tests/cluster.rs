//! The emulated cluster (`tally bench cluster`) and `tally demo`, run as a
//! user runs them: real network namespaces, veth links shaped with tc tbf,
//! real servers and ranks over tcp;ofi_rxm, every element checked by the
//! ranks. Needs root and iproute2 (as CI has); without them the tests say
//! so and check that the commands refuse with that reason instead.
use std::process::Command;

fn tally() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tally"));
    c.env("TALLY_LOG", "warn");
    c
}

fn netns_ok() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).into_owned()),
        Err(e) => Err(format!("ip: {e}")),
    }
}

fn namespaces() -> Vec<String> {
    let o = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| l.split_whitespace().next().map(str::to_string)).collect()
}

#[test]
fn cluster_bench_verifies_every_element_plots_logs_and_cleans_up() {
    if let Err(why) = netns_ok() {
        let out = tally().args(["bench", "cluster", "--hosts", "2", "--rates", "1", "--sizes", "64K"]).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot run here"), "{err}");
        eprintln!("skipped the emulated cluster: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("tally-cluster-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (svg, log) = (dir.join("c.svg"), dir.join("c.log"));
    let out = tally()
        .args(["bench", "cluster", "--hosts", "2", "--rates", "1,0.5", "--sizes", "1M,4M", "--iters", "3", "--json"])
        .args(["--chunk", "256K", "--timeout", "120", "--mode", "agg,agg-plugin,ring"])
        .arg("--plot")
        .arg(&svg)
        .arg("--log")
        .arg(&log)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    // Not a terminal: no progress line.
    assert!(!stderr.contains('\r'), "progress drawn into a pipe: {stderr:?}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON document");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 3 * 2, "2 rates x 3 modes x 2 sizes: {v}");
    for r in rows {
        assert_eq!(r["wrong"], 0, "{r}");
        assert_eq!(r["method"], "back-to-back", "{r}");
        let (rate, mode) = (r["link_gbit"].as_f64().unwrap(), r["mode"].as_str().unwrap());
        let link = rate / 8.0;
        let bound = if mode.starts_with("agg") { link } else { link * 2.0 / 2.0 };
        assert!((r["bound_GBps"].as_f64().unwrap() - bound).abs() < 1e-9, "{r}");
        let frac = r["fraction"].as_f64().unwrap();
        // Shaped: nothing beats the link by more than tbf's bucket (2 ms of
        // traffic, a quarter of the smallest size here) allows.
        assert!(frac > 0.0 && frac < 1.5, "fraction {frac} of the link bound: {r}");
        assert!(r["p50_us"].as_f64().unwrap() <= r["max_us"].as_f64().unwrap());
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("busbw") && plot.contains("agg bound"), "{}", &plot[..plot.len().min(300)]);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("[server 0]") && logged.contains("tally server ready"), "{logged}");
    let me = format!("tly{}x", std::process::id());
    assert!(namespaces().iter().all(|n| !n.starts_with("tly") || !n.contains(&me)), "namespaces left: {:?}", namespaces());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_json_has_both_parts_and_every_result_verified() {
    let dir = std::env::temp_dir().join(format!("tally-demo-test-{}", std::process::id()));
    let out = tally().args(["demo", "--json", "--out"]).arg(&dir).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON document");
    let loopback = v["results"].as_array().unwrap();
    assert_eq!(loopback.len(), 10, "agg and ring at 5 sizes: {v}");
    assert!(loopback.iter().all(|r| r["wrong"] == 0 && r["p99_us"].as_f64().unwrap() > 0.0), "{v}");
    match netns_ok() {
        Ok(()) => {
            let rows = v["cluster"]["rows"].as_array().expect("the cluster part ran");
            assert_eq!(rows.len(), 6, "{v}");
            assert!(rows.iter().all(|r| r["wrong"] == 0), "{v}");
            assert!(v["cluster_skipped"].is_null());
            assert!(std::fs::read_to_string(dir.join("cluster.svg")).unwrap().starts_with("<svg"));
        }
        Err(why) => {
            assert!(v["cluster"].is_null() && v["cluster_skipped"].is_string(), "{why}: {v}");
        }
    }
    assert!(std::fs::read_to_string(dir.join("loopback.svg")).unwrap().contains("busbw"));
    // Log lines went to the file, not into the JSON or the terminal.
    let log = std::fs::read_to_string(dir.join("demo.log")).unwrap();
    assert!(log.contains("INFO"), "{log}");
    assert!(!stderr.contains(" INFO "), "info lines reached the terminal: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
