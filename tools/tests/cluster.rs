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

/// Runs `cmd` (a `--json` run), which must succeed, and parses its one JSON document.
fn json_of(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    // Not a terminal: no progress line.
    assert!(!stderr.contains('\r'), "progress drawn into a pipe: {stderr:?}");
    serde_json::from_str(stdout.trim()).expect("one JSON document")
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
    let v = json_of(
        tally()
            .args(["bench", "cluster", "--hosts", "2", "--rates", "1,0.5", "--sizes", "1M,4M", "--iters", "3", "--json"])
            .args(["--chunk", "256K", "--timeout", "120", "--mode", "agg,agg-plugin,ring"])
            // --min-time off; --min-bytes 8M gives 1M eight iterations, 4M the three of --iters.
            .args(["--min-time", "0", "--min-bytes", "8M"])
            .arg("--plot")
            .arg(&svg)
            .arg("--log")
            .arg(&log),
    );
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 3 * 2, "2 rates x 3 modes x 2 sizes: {v}");
    for r in rows {
        assert_eq!(r["wrong"], 0, "{r}");
        assert_eq!(r["method"], "back-to-back", "{r}");
        let bytes = r["bytes"].as_u64().unwrap();
        assert_eq!(r["iters"].as_u64(), Some(if bytes == 1 << 20 { 8 } else { 3 }), "{r}");
        let (rate, mode) = (r["link_gbit"].as_f64().unwrap(), r["mode"].as_str().unwrap());
        let link = rate / 8.0;
        let bound = if mode.starts_with("agg") { link } else { link * 2.0 / 2.0 };
        assert!((r["bound_GBps"].as_f64().unwrap() - bound).abs() < 1e-9, "{r}");
        let frac = r["fraction"].as_f64().unwrap();
        // Shaped: nothing beats the link by more than tbf's bucket (2 ms of
        // traffic, a quarter of the smallest size here) allows.
        assert!(frac > 0.0 && frac < 1.5, "fraction {frac} of the link bound: {r}");
        assert!(r["p50_us"].as_f64().unwrap() <= r["max_us"].as_f64().unwrap());
        // CPU per GB: worker 0 always did work; the servers are read from
        // /proc (in clock ticks, so a short loop may show 0 of them), and
        // per GB only where they took part.
        assert!(r["worker_cpu_s"].as_f64().is_some_and(|s| s > 0.0), "worker CPU: {r}");
        assert!(r["worker_cpu_s_per_gb"].as_f64().is_some_and(|s| s > 0.0), "worker CPU per GB: {r}");
        assert!(r["server_cpu_s"].as_f64().is_some_and(|s| s >= 0.0), "server CPU: {r}");
        assert_eq!(r["server_cpu_s_per_gb"].is_number(), mode.starts_with("agg"), "server CPU per GB: {r}");
    }
    // Over every agg row together the servers' ticks cannot all be 0.
    let served: f64 = rows.iter().filter(|r| r["mode"] == "agg").map(|r| r["server_cpu_s"].as_f64().unwrap()).sum();
    assert!(served > 0.0, "the servers' CPU time over every agg loop is 0: {v}");
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("busbw") && plot.contains("agg bound"), "{}", &plot[..plot.len().min(300)]);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("[server 0]") && logged.contains("tally server ready"), "{logged}");
    let me = format!("tly{}x", std::process::id());
    assert!(namespaces().iter().all(|n| !n.starts_with("tly") || !n.contains(&me)), "namespaces left: {:?}", namespaces());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ranks' CPU over a rate's last loop is read before any rank exits:
/// worker 0 waits for the bench's word after each RESULT row, and the others
/// wait for worker 0 in the barrier after it. Made certain to matter with a
/// lag before the bench reads (once a rank exited after the last loop its CPU
/// could not be read, and the row said `loop -`; about one run in ten).
#[test]
fn a_rates_last_loop_is_read_before_the_ranks_exit() {
    if let Err(why) = netns_ok() {
        eprintln!("skipped the emulated cluster: {why}");
        return;
    }
    let mut run = tally();
    run.env("TALLY_BENCH_READ_LAG_MS", "500");
    run.args(["bench", "cluster", "--hosts", "2", "--rates", "1", "--sizes", "1M", "--mode", "agg", "--min-time", "200", "--json"]);
    let v = json_of(run.args(["--timeout", "120"]));
    let row = &v["rows"].as_array().expect("rows")[0];
    let ranks = row["rank_cpu_s"].as_array().unwrap_or_else(|| panic!("the last loop's ranks unread: {row}"));
    assert_eq!(ranks.len(), 2, "{row}");
    assert!(ranks.iter().all(|s| s.as_f64().is_some_and(|s| s > 0.0)), "{row}");
    assert_eq!(row["wrong"], 0, "{row}");
}

/// Every rank process's CPU over each timed loop and between loops, and
/// the kernel baseline (`--mode tcp`: plain TCP streams over the same
/// links, worker i <-> server i) in the same run, each a row.
#[test]
fn cluster_reports_every_ranks_cpu_and_the_kernels_tcp_beside_agg() {
    if let Err(why) = netns_ok() {
        eprintln!("skipped the emulated cluster: {why}");
        return;
    }
    // --min-time's default times each size for about 500 ms: enough clock
    // ticks of every process's CPU to be counted.
    let mut run = tally();
    run.args(["bench", "cluster", "--hosts", "2", "--rates", "1", "--sizes", "1M,2M", "--mode", "agg,tcp", "--json"]);
    let v = json_of(run.args(["--timeout", "120"]));
    let rows = v["rows"].as_array().unwrap();
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["agg", "agg", "tcp", "tcp"], "the streams after the all-reduces: {v}");
    let num = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
    for r in rows {
        assert_eq!(r["wrong"], 0, "{r}");
        // One figure per rank, each rank busy over its loop.
        let ranks: Vec<f64> = r["rank_cpu_s"].as_array().expect("rank_cpu_s").iter().map(|s| s.as_f64().unwrap()).collect();
        assert_eq!(ranks.len(), 2, "{r}");
        assert!(ranks.iter().all(|&s| s > 0.0), "a rank's CPU over its loop is 0: {r}");
        assert!(num(r, "loop_wall_s") > 0.0, "{r}");
        let (median, max) = (num(r, "rank_cpu_s_per_gb_median"), num(r, "rank_cpu_s_per_gb_max"));
        assert!(median > 0.0 && median <= max, "{r}");
        assert!(num(r, "server_cpu_s_per_gb") >= 0.0, "{r}");
        let frac = num(r, "fraction");
        assert!(frac > 0.0 && frac < 1.5, "fraction {frac} of the link bound: {r}");
        assert!((num(r, "bound_GBps") - 1.0 / 8.0).abs() < 1e-9, "agg's bound, R, for both: {r}");
        // The machine's cores over the loop, of them in softirqs (the links'
        // kernel path, their shapers included).
        let host = &r["host_cpu"];
        let (busy, softirq) = (num(host, "busy_cores"), num(host, "softirq_cores"));
        assert!(busy > 0.0 && (0.0..=busy + 1e-9).contains(&softirq), "{host}");
        // Each side's softirqs where the servers have cores of their own and
        // the workers are pinned (not on 2 cores); the tcp rows' server ends
        // run on the workers' cores here (the default), so they have none.
        let apart = !v["placement"].as_str().unwrap().starts_with("shared") && r["mode"] == "agg";
        for k in ["worker_cores_softirq_s_per_gb", "server_cores_softirq_s_per_gb"] {
            assert_eq!(r.get(k).is_some(), apart, "{k}: {r}");
            assert!(!apart || num(r, k) >= 0.0, "{k}: {r}");
        }
    }
    // Between loops: none before a rate's first loop; before the second,
    // a share of a core per rank and their mean.
    assert!(rows[0]["between_loops_s"].is_null() && rows[0]["between_loops_core_share"].is_null(), "{}", rows[0]);
    let gap = &rows[1];
    assert!(num(gap, "between_loops_s") > 0.0, "{gap}");
    let shares: Vec<f64> = gap["between_loops_core_share"].as_array().expect("shares").iter().map(|s| s.as_f64().unwrap()).collect();
    assert_eq!(shares.len(), 2, "{gap}");
    assert!(shares.iter().all(|&s| s >= 0.0), "{gap}");
    assert!((num(gap, "between_loops_core_share_mean") - shares.iter().sum::<f64>() / 2.0).abs() < 1e-9, "{gap}");
    // The streams moved every byte (an end that did not fails the run), as
    // many per iteration as agg's rows of the same size, and their
    // processes' CPU is theirs.
    for (r, agg) in rows[2..].iter().zip(&rows[..2]) {
        assert_eq!(r["bytes"], agg["bytes"], "{r}");
        assert!(r["iters"].as_u64().is_some_and(|i| i >= 1) && num(r, "algbw_GBps") > 0.0, "{r}");
        assert!(r["between_loops_s"].is_null(), "new processes, no loop before: {r}");
        assert!(num(r, "worker_cpu_s") > 0.0, "{r}");
    }
    // Every worker with every server (`--tcp-peers all`), two connections
    // a pair: each end's bytes split over four connections, every byte moved.
    let mut run = tally();
    run.args(["bench", "cluster", "--hosts", "2", "--rates", "1", "--sizes", "1M", "--mode", "tcp", "--json"]);
    let v = json_of(run.args(["--tcp-peers", "all", "--tcp-streams", "2", "--timeout", "120"]));
    let r = &v["rows"][0];
    assert_eq!((r["mode"].as_str(), r["bytes"].as_u64()), (Some("tcp"), Some(1 << 20)), "{v}");
    assert!(r["method"].as_str().is_some_and(|m| m.contains("every worker <-> every server, 2 connections each")), "{r}");
    assert!(num(r, "worker_cpu_s") > 0.0 && num(r, "algbw_GBps") > 0.0, "{r}");
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

/// `--workers-run` gives every worker namespace the job's environment, and
/// tests/nccl/cluster_proof.sh's dry run (no GPU) uses it: ranks rendezvous
/// and reach every server through the shaped links, then tally's agg,
/// agg-plugin and ring run over the same testbed.
#[test]
fn workers_run_and_the_cluster_proof_dry_run() {
    if let Err(why) = netns_ok() {
        eprintln!("skipped the emulated cluster: {why}");
        return;
    }
    // Each worker also says what its namespace's TCP and veth were set to:
    // autocorking off and cubic (the defaults), with --rps on every CPU
    // steering, and with --tcp-rto-min the floor on the route to the servers.
    let out = tally()
        .args(["bench", "cluster", "--hosts", "2", "--rates", "1", "--timeout", "60", "--rps", "on", "--tcp-rto-min", "7"])
        .arg("--workers-run")
        .arg(r#"echo "rank=$TALLY_CLUSTER_RANK world=$TALLY_CLUSTER_WORLD master=$TALLY_CLUSTER_MASTER servers=$TALLY_SERVERS me=$TALLY_FABRIC_ADDR autocork=$(cat /proc/sys/net/ipv4/tcp_autocorking) route=[$(ip route get 198.18.0.10 | tr -s ' \n' ' ')] rps=$(cat /sys/class/net/eth0/queues/rx-0/rps_cpus)""#)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    // Worker 0's stdout comes through; worker 1's goes to the log (stderr here).
    assert!(stdout.contains("rank=0 world=2 master=198.18.1.10 servers=198.18.0.10:7400,198.18.0.11:7400 me=198.18.1.10"), "{stdout}");
    assert!(stderr.contains("rank=1 world=2") && stderr.contains("me=198.18.1.11"), "{stderr}");
    assert!(stdout.contains(" autocork=0 route=["), "{stdout}");
    assert!(stdout.contains("rto_min lock 7ms") && stdout.contains("congctl cubic"), "{stdout}");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The kernel pads the bitmap with zeros to its own CPU count: compare values.
    let line = stdout.lines().find(|l| l.starts_with("rank=0")).unwrap_or_default();
    let rps = line.split("rps=").nth(1).map(|r| r.trim().replace(',', "")).unwrap_or_default();
    let want = if cores >= 128 { u128::MAX } else { (1u128 << cores) - 1 };
    assert_eq!(u128::from_str_radix(&rps, 16).ok(), Some(want), "{stdout}");
    // A failing worker fails the run, naming it.
    let out = tally()
        .args(["bench", "cluster", "--hosts", "2", "--rates", "1", "--timeout", "60", "--workers-run"])
        .arg(r#"test "$TALLY_CLUSTER_RANK" = 0"#)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("worker 1 exited"), "{}", String::from_utf8_lossy(&out.stderr));
    // A congestion control this kernel lacks is refused before anything runs, naming those it has.
    let out = tally()
        .args(["bench", "cluster", "--hosts", "2", "--rates", "1", "--timeout", "60", "--tcp-cc", "nosuchcc", "--workers-run", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--tcp-cc nosuchcc: this kernel would not set it") && stderr.contains("it offers: "), "{stderr}");

    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped the cluster proof's dry run: no python3");
        return;
    }
    let before = namespaces();
    let dir = std::env::temp_dir().join(format!("tally-cluster-proof-{}", std::process::id()));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new("bash")
        .arg(root.join("tests/nccl/cluster_proof.sh"))
        .env("DRYRUN", "1")
        .env("RATE", "1")
        .env("G", "2")
        .env("OUT", &dir)
        .env("TALLY_BIN", env!("CARGO_BIN_EXE_tally"))
        .env("TALLY_LOG", "warn")
        .output()
        .unwrap();
    let summary = std::fs::read_to_string(dir.join("summary.txt")).unwrap_or_default();
    assert!(out.status.success(), "{summary}\n{}", String::from_utf8_lossy(&out.stderr));
    for rate in ["1", "0.5"] {
        assert!(summary.contains(&format!("testbed at {rate} Gbit/s: {{\"label\": \"dry\", \"dry_run\": true, \"world\": 2, \"ranks_reached\": 2, \"servers_reached\": 2}} rc=0")), "{summary}");
    }
    assert_eq!(summary.matches(" agg-plugin ").count(), 2, "{summary}");
    // Every namespace the runs made is gone. Another test's run may still
    // hold some: only those of processes that ended count.
    let ended = |n: &String| {
        let pid = n.strip_prefix("tly").and_then(|r| r.split('x').next()).unwrap_or("");
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    };
    let left: Vec<String> = namespaces().into_iter().filter(|n| n.starts_with("tly") && !before.contains(n) && ended(n)).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--loss 1`: the rules at each receiving host really drop packets (their
/// counters), TCP retransmits them, and every element is still right; a
/// level naming a host `--hosts` does not make is refused, naming it.
#[test]
fn cluster_loss_drops_packets_and_every_element_stays_right() {
    if let Err(why) = netns_ok() {
        eprintln!("skipped the emulated cluster: {why}");
        return;
    }
    let out = tally().args(["bench", "cluster", "--hosts", "2", "--rates", "1", "--sizes", "1M", "--loss", "0,s2:1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--loss s2:1: there is no host s2"), "{stderr}");
    let has = |tool: &str| ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().any(|d| std::path::Path::new(d).join(tool).is_file());
    if !has("nft") && !has("iptables") {
        eprintln!("skipped --loss: neither nft nor iptables is installed (make deps installs nftables)");
        return;
    }
    let mut run = tally();
    run.args(["bench", "cluster", "--hosts", "2", "--rates", "1", "--sizes", "1M", "--mode", "agg", "--iters", "10"]);
    let v = json_of(run.args(["--min-time", "0", "--loss", "1", "--timeout", "120", "--json"]));
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{v}");
    let r = &rows[0];
    assert_eq!((r["wrong"].as_u64(), r["loss_pct"].as_f64(), r["loss_link"].as_str()), (Some(0), Some(1.0), Some("every")), "{r}");
    let links = &v["links"][0];
    assert!(links["loss_by"] == "nftables" || links["loss_by"] == "iptables", "{links}");
    assert!(links["loss_drops"].as_u64().is_some_and(|d| d > 0), "the rules dropped nothing: {links}");
    assert!(links["tcp_retrans"].as_u64().is_some_and(|d| d > 0), "TCP retransmitted nothing: {links}");
}
