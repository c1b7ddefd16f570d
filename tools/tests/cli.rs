//! The `tally` command as scripts and operators meet it: its exit statuses
//! (0 success, 1 an error tally reports, 2 a usage error), the flags shared
//! across commands (one name, old names still taken), and a server start
//! that warns about the open files limit only when its configuration can
//! really run past it.
use std::process::{Command, Output};
use tally_e2e::ServerProcess;

fn tally(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tally")).args(args).output().expect("run tally")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["no-such-command"][..],
        &["bench", "p2p", "--no-such-flag"],
        &["bench", "p2p", "--poll", "spin"],
        &["bench", "allreduce", "--iters", "many"],
    ] {
        let o = tally(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        assert!(stderr(&o).starts_with("error: "), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn refused_configurations_exit_1_with_the_reason_on_stderr() {
    // Busy pollers never outnumber cores: four spinning threads on one core are refused.
    let o = tally(&["bench", "p2p", "--hubs", "2", "--leaves", "2", "--poll", "busy", "--cores", "0"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = stderr(&o);
    assert!(err.starts_with("tally: error: --cores: 2 hubs + 2 leaves need 4 cores with busy polling"), "{err}");
    // The two ends of the point-to-point mode likewise.
    let o = tally(&["bench", "p2p", "--poll", "busy", "--cores", "0", "--sizes", "8"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr(&o).contains("--poll busy: the two ends would spin on one core (0)"), "{}", stderr(&o));
    // A server configuration that cannot be served.
    let o = tally(&["server", "--listen", "127.0.0.1:0", "--lcores", "0", "--latency-lcores", "1"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr(&o).starts_with("tally: error: latency_lcores"), "{}", stderr(&o));
}

/// `--provider efa` where libfabric finds no EFA device (this machine; on an
/// EFA host both start, and only the help texts below are checked): the
/// error says so in doctor's words, for the server and the bench alike.
#[test]
fn efa_without_an_efa_device_names_the_cause() {
    // A server that starts serves until stopped: run it only where it cannot.
    let efa_here =
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("efa")));
    if !efa_here {
        let o =
            tally(&["server", "--listen", "127.0.0.1:0", "--lcores", "0", "--provider", "efa", "--slab-size", "8M", "--hugepages", "off"]);
        assert!(stderr(&o).contains("fi_getinfo (no EFA device on this host: see `tally doctor`)"), "{}", stderr(&o));
    }
    let o = tally(&["bench", "p2p", "--provider", "efa", "--sizes", "8", "--cores", "0,1"]);
    if !o.status.success() {
        assert!(
            stderr(&o).contains("efa: fi_getinfo (no EFA device on this host: see `tally doctor`) failed: No data available (-61)"),
            "{}",
            stderr(&o)
        );
    }
    // Help texts in users' words: no internal names.
    for sub in [&["bench", "cluster", "--help"][..], &["bench", "allreduce", "--help"]] {
        let help = String::from_utf8_lossy(&tally(sub).stdout).into_owned();
        for internal in ["default_rate", "iters_for", "MAX_LOOP_ITERS", "auto_chunk", "LoopArgs"] {
            assert!(!help.contains(internal), "tally {sub:?} names {internal}: {help}");
        }
    }
}

#[test]
fn help_documents_exit_statuses_and_every_bench() {
    let o = tally(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = String::from_utf8_lossy(&o.stdout);
    let at = help.find("Exit status:").unwrap_or_else(|| panic!("no exit statuses in tally --help: {help}"));
    let statuses: Vec<&str> = help[at..].lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    for code in ["0", "1", "2"] {
        assert!(statuses.contains(&code), "{code}: {help}");
    }
    let o = tally(&["bench", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    for sub in ["reduce", "p2p", "allreduce", "cluster"] {
        assert!(help.lines().any(|l| l.trim_start().starts_with(&format!("{sub} "))), "{sub}: {help}");
    }
}

#[test]
fn shared_flags_read_the_same_and_old_names_still_parse() {
    // --poll: one default and one help text in every benchmark.
    let mut poll_help = Vec::new();
    for cmd in [&["bench", "p2p"][..], &["bench", "allreduce"], &["bench", "cluster"]] {
        let o = tally(&[cmd, &["--help"]].concat());
        let help = String::from_utf8_lossy(&o.stdout).into_owned();
        let at = help.find("--poll <POLL>").unwrap_or_else(|| panic!("{cmd:?}: no --poll: {help}"));
        let end = help[at + 2..].find("\n      --").map_or(help.len(), |e| at + 2 + e);
        // Layouts differ (one column or two); the words must not.
        let text = help[at..end].split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            text.contains("auto (busy when every poller gets a core of its own, else adaptive; `bench cluster`: adaptive"),
            "{cmd:?}: {text}"
        );
        assert!(text.contains("[default: auto]"), "{cmd:?}: {text}");
        poll_help.push(text);
    }
    assert!(poll_help.windows(2).all(|w| w[0] == w[1]), "{poll_help:#?}");
    // --cores is the name in bench allreduce too; --rank-cores, hidden, still parses
    // (clap checks it before --help prints; a bad flag would exit 2).
    let o = tally(&["bench", "allreduce", "--rank-cores", "0", "--help"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("--cores <CORES>") && !help.contains("--rank-cores"), "{help}");
}

/// `args` run under an open files limit of `limit` (soft and hard), so that
/// the server cannot raise it.
fn server_under_limit(limit: u64, args: &[&str]) -> ServerProcess {
    let mut c = Command::new("prlimit");
    c.arg(format!("--nofile={limit}:{limit}")).arg("--").arg(env!("CARGO_BIN_EXE_tally"));
    ServerProcess::start_via(c, "127.0.0.1:0", args)
}

const WARNING: &str = "open files limit is";

#[test]
fn open_files_warning_only_when_admitted_ranks_can_exceed_the_limit() {
    // The defaults on loopback (shm: a control connection per rank, 16 jobs
    // of 1024 ranks) fit under this machine's usual limit: not a word.
    let have = tally_engine::host::limits::open_files().unwrap();
    let defaults = ServerProcess::start(&["--lcores", "0", "--provider", "shm"]);
    if have.hard >= 16 * 1024 + 256 {
        assert!(!defaults.log_contains(WARNING), "{:?}", defaults.log.lock().unwrap());
    }
    drop(defaults);

    // Under 2048 the same defaults can run out, and the server says so once.
    let low = server_under_limit(2048, &["--lcores", "0", "--provider", "shm"]);
    assert_eq!(low.log_count(WARNING), 1, "{:?}", low.log.lock().unwrap());
    assert!(low.log_contains("open files limit is 2048, and 16 jobs of 1024 ranks can need 16640 descriptors"));
    drop(low);

    // One job of 1024 ranks fits under 2048: no warning.
    let dir = std::env::temp_dir().join(format!("tally-cli-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("one-job.toml");
    std::fs::write(&config, "max_jobs = 1\nmax_ranks = 1024\n").unwrap();
    let fits = server_under_limit(2048, &["--lcores", "0", "--provider", "shm", "--config", config.to_str().unwrap()]);
    assert!(!fits.log_contains(WARNING), "{:?}", fits.log.lock().unwrap());
    drop(fits);
    let _ = std::fs::remove_dir_all(&dir);
}
