//! The host commands, run for real: the built `tally` binary against this
//! machine's hugepage pools, hugetlbfs, rdma-core and libfabric, and every
//! shipped configuration file loaded the way its consumer loads it.
//!
//! Tests that change the global hugepage pools or mounts take [`POOLS`], so
//! they never interleave with each other, and hold a [`Restore`] guard that
//! puts the pools (and any mount they made) back even when an assertion
//! fails. They need root; as another user they check that changes are
//! refused with a clear message instead.
//!
//! This build host has no EFA and no RDMA device: the efa-env and doctor
//! tests assert that the commands say so in plain words (and what the exit
//! code is), and switch to the general assertions on a host that has one.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use tally_engine::host::config::ServerFile;
use tally_engine::host::hugepages::{self, SIZE_2M};

static POOLS: Mutex<()> = Mutex::new(());

fn tally() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tally"));
    // The decisions read these; the test's own environment must not leak in.
    for v in
        ["FI_EFA_FORK_SAFE", "FI_EFA_USE_HUGE_PAGE", "RDMAV_FORK_SAFE", "IBV_FORK_SAFE", "FI_PROVIDER", "TALLY_PROVIDER", "TALLY_TOKEN"]
    {
        c.env_remove(v);
    }
    c.env("TALLY_LOG", "warn");
    c
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Run {
    finish(tally().args(args).output().expect("run tally"))
}

fn finish(o: Output) -> Run {
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n--- stdout\n{}--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn has_2m_pages() -> bool {
    hugepages::page_sizes().unwrap_or_default().contains(&SIZE_2M)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Puts the system-wide pools back as they were, and unmounts what the test
/// mounted, when dropped (also on panic).
struct Restore {
    pools: Vec<(u64, u64)>,
    mount: Option<PathBuf>,
}

impl Restore {
    fn new() -> Restore {
        let pools = hugepages::pools().unwrap().into_iter().filter(|p| p.node.is_none()).map(|p| (p.page_size, p.total)).collect();
        Restore { pools, mount: None }
    }

    fn total_2m(&self) -> u64 {
        self.pools.iter().find(|(s, _)| *s == SIZE_2M).map_or(0, |(_, n)| *n)
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(dir) = &self.mount {
            if is_mounted(dir) {
                let _ = hugepages::unmount(dir);
            }
            let _ = std::fs::remove_dir(dir);
        }
        for &(size, total) in &self.pools {
            let _ = hugepages::set_pages(size, None, total);
        }
    }
}

fn is_mounted(dir: &Path) -> bool {
    hugepages::mounts().unwrap().iter().any(|m| m.mount_point == dir)
}

fn total_2m() -> u64 {
    hugepages::pool(SIZE_2M, None).unwrap().total
}

/// Pages of the 2 MiB pool that some process has mapped now. Nothing here
/// maps any, but the machine may be shared with another test run (a slab
/// test), and the kernel cannot shrink a pool below its pages in use.
fn in_use_2m() -> u64 {
    let p = hugepages::pool(SIZE_2M, None).unwrap();
    p.total.saturating_sub(p.free)
}

/// What the pool holds after being set to `target` pages.
fn after_set(target: u64) -> u64 {
    target.max(in_use_2m())
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tally-host-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.canonicalize().unwrap()
}

#[test]
fn hugepages_show_table_and_json() {
    let r = run(&["hugepages", "show"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.starts_with("Pool "), "{r:?}");
    assert!(r.stdout.contains("Transparent huge pages: "), "{r:?}");
    let r = run(&["hugepages", "show", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(j["pools"].is_array() && j["mounts"].is_array(), "{j}");
    assert!(["always", "madvise", "never"].contains(&j["thp"].as_str().unwrap()), "{j}");
    if has_2m_pages() {
        assert!(j["pools"].as_array().unwrap().iter().any(|p| p["page_size"] == SIZE_2M && p["node"].is_null()));
    }
}

#[test]
fn hugepages_reserve_adds_sets_and_clears() {
    if !is_root() || !has_2m_pages() {
        println!("skipped: needs root and 2 MiB hugepages (see changes_need_root for the non-root case)");
        return;
    }
    let _lock = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    let restore = Restore::new();
    let before = restore.total_2m();

    // reserve adds: 8 MiB more is 4 more pages, whatever the pool held.
    let r = run(&["hugepages", "reserve", "8M", "--pagesize", "2M"]);
    assert_eq!(r.code, 0, "{r:?}");
    let want = before + 4;
    assert_eq!(total_2m(), want, "{r:?}");
    assert!(r.stdout.contains(&format!("system pool of 2 MiB pages: {before} -> {want} pages")), "{r:?}");
    assert!(r.stdout.contains(&format!("vm.nr_hugepages = {want}")), "{r:?}");
    assert!(r.stdout.contains(&format!("hugepagesz=2M hugepages={want}")), "{r:?}");

    // A size that is not whole pages rounds up: 3 MiB is 2 pages.
    let r = run(&["hugepages", "reserve", "3M"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(total_2m(), want + 2, "{r:?}");

    // --total sets the pool.
    let r = run(&["hugepages", "reserve", "4M", "--total"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(total_2m(), after_set(2), "{r:?}");

    let r = run(&["hugepages", "clear", "--pagesize", "2M"]);
    assert_eq!(r.code, 0, "{r:?}");
    let now = total_2m();
    assert_eq!(now, after_set(0), "{r:?}");
    assert!(r.stdout.contains(&format!("system pool of 2 MiB pages: {} -> {now} page", after_set(2))), "{r:?}");
    if now > 0 {
        assert!(r.stdout.contains("still in use"), "{r:?}");
    }

    // Bad input names itself.
    let r = run(&["hugepages", "reserve", "4M", "--pagesize", "3M"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("not a page size"), "{r:?}");
    let r = run(&["hugepages", "reserve", "lots"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("invalid size"), "{r:?}");
    drop(restore);
    assert_eq!(total_2m(), after_set(before));
}

#[test]
fn hugepages_mount_and_unmount_in_a_temporary_directory() {
    if !is_root() || !has_2m_pages() {
        println!("skipped: needs root and 2 MiB hugepages");
        return;
    }
    let _lock = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    let mut restore = Restore::new();
    let dir = temp_dir("mount");
    restore.mount = Some(dir.clone());
    let d = dir.to_str().unwrap();

    let r = run(&["hugepages", "mount", "--directory", d, "--pagesize", "2M"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(is_mounted(&dir), "{r:?}");
    assert!(r.stdout.contains(&format!("mounted hugetlbfs (2 MiB pages) on {d}")), "{r:?}");
    // Mounting again is not an error.
    let r = run(&["hugepages", "mount", "--directory", d]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("already mounted"), "{r:?}");
    let r = run(&["hugepages", "show"]);
    assert!(r.stdout.contains(d), "{r:?}");

    let r = run(&["hugepages", "unmount", "--directory", d]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!is_mounted(&dir));
    let r = run(&["hugepages", "unmount", "--directory", d]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("is not a hugetlbfs mount"), "{r:?}");
}

#[test]
fn hugepages_setup_clears_reserves_and_mounts() {
    if !is_root() || !has_2m_pages() {
        println!("skipped: needs root and 2 MiB hugepages");
        return;
    }
    let _lock = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    let mut restore = Restore::new();
    let dir = temp_dir("setup").join("huge");
    restore.mount = Some(dir.clone());
    let d = dir.to_str().unwrap();
    // setup creates the directory, and leaves the pool at exactly SIZE.
    let r = run(&["hugepages", "setup", "6M", "--pagesize", "2M", "--directory", d]);
    assert_eq!(r.code, 0, "{r:?}");
    // Cleared to the pages in use (none, unless the machine is shared), plus 3.
    assert_eq!(total_2m(), in_use_2m() + 3, "{r:?}");
    assert!(is_mounted(&dir), "{r:?}");
    let r = run(&["hugepages", "setup", "4M", "--directory", d]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(total_2m(), in_use_2m() + 2, "{r:?}");
    assert!(r.stdout.contains(&format!("unmounted {d}")), "{r:?}");
    drop(restore);
    assert!(!is_mounted(&dir));
    let _ = std::fs::remove_dir(dir.parent().unwrap());
}

/// As a user other than root, changes fail up front and say why; `show`
/// still works.
#[test]
fn changes_need_root() {
    let mut cmd = tally();
    if is_root() {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec only async-signal-safe calls run:
        // setgid/setuid to nobody (65534), which fail cleanly if refused.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let output = match cmd.args(["hugepages", "reserve", "2M"]).output() {
        Ok(o) => o,
        // A root without CAP_SETUID (some containers) cannot become nobody.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            println!("skipped: cannot switch to an unprivileged user: {e}");
            return;
        }
        Err(e) => panic!("run tally: {e}"),
    };
    let r = finish(output);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("needs root: run it with sudo"), "{r:?}");
    assert!(r.stdout.is_empty(), "{r:?}");
    // Reading needs nothing.
    if is_root() {
        use std::os::unix::process::CommandExt;
        let mut show = tally();
        // SAFETY: as above.
        unsafe {
            show.pre_exec(|| {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let r = finish(show.args(["hugepages", "show"]).output().unwrap());
        assert_eq!(r.code, 0, "{r:?}");
        assert!(r.stdout.starts_with("Pool "), "{r:?}");
    }
}

#[test]
fn efa_env_check_says_plainly_what_is_missing() {
    let r = run(&["efa-env", "check"]);
    assert_eq!(r.code, 0, "{r:?}");
    for word in [
        "kernel",
        "rdma-core",
        "fork status",
        "libfabric",
        "RDMA devices",
        "FI_EFA_FORK_SAFE",
        "FI_EFA_USE_HUGE_PAGE",
        "RDMAV_FORK_SAFE",
        "FI_PROVIDER",
    ] {
        assert!(r.stdout.contains(word), "{word}: {r:?}");
    }
    assert!(r.stdout.contains("Role server (") && r.stdout.contains("Role worker ("), "{r:?}");
    if !Path::new("/sys/class/infiniband").exists() {
        // This build host: no RDMA device, and it must read that way.
        assert!(r.stdout.contains("RDMA devices          none: no RDMA devices"), "{r:?}");
        assert!(r.stdout.contains("EFA devices           none: shm/tcp only (fine for development)"), "{r:?}");
        assert!(r.stdout.contains("efa provider finds no device"), "{r:?}");
    }
    let r = run(&["efa-env", "check", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(j["host"]["facts"]["libfabric"].is_array(), "{j}");
    assert_eq!(j["server"][0]["name"], "FI_EFA_FORK_SAFE");
    assert_eq!(j["server"][0]["value"], "0");
}

#[test]
fn efa_env_print_formats() {
    // sh: what `eval` gives a shell.
    let r = run(&["efa-env", "print", "--role", "worker", "--format", "sh", "--assume-efa"]);
    assert_eq!(r.code, 0, "{r:?}");
    let script = format!("export RDMAV_FORK_SAFE=1\n{}\nenv", r.stdout);
    let path = std::env::var("PATH").unwrap_or_default();
    let out = Command::new("bash").arg("-c").arg(&script).env_clear().env("PATH", path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let env = String::from_utf8(out.stdout).unwrap();
    assert!(env.lines().any(|l| l == "FI_EFA_USE_HUGE_PAGE=0"), "{env}");
    assert!(env.lines().any(|l| l == "FI_PROVIDER=efa"), "{env}");
    // Either fork support is needed here (and set), or RDMAV_FORK_SAFE is gone.
    assert!(env.lines().any(|l| l == "FI_EFA_FORK_SAFE=1") || !env.contains("RDMAV_FORK_SAFE"), "{env}");

    // systemd: NAME=value lines and comments only.
    let r = run(&["efa-env", "print", "--role", "server", "--format", "systemd"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.lines().any(|l| l == "FI_EFA_FORK_SAFE=0"), "{r:?}");
    assert!(r.stdout.lines().any(|l| l == "FI_EFA_USE_HUGE_PAGE=1"), "{r:?}");
    for line in r.stdout.lines().filter(|l| !l.starts_with('#')) {
        let (name, _) = line.split_once('=').unwrap_or_else(|| panic!("{line}"));
        assert!(name.chars().all(|c| c.is_ascii_uppercase() || c == '_'), "{line}");
    }

    // json: settings with a reason each.
    let r = run(&["efa-env", "print", "--role", "worker", "--format", "json"]);
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(j["role"], "worker");
    for s in j["settings"].as_array().unwrap() {
        assert!(!s["reason"].as_str().unwrap().is_empty(), "{s}");
        assert!(s["action"] == "set" || s["action"] == "unset", "{s}");
    }
}

fn efa_absent() -> bool {
    run(&["efa-env", "check"]).stdout.contains("efa provider finds no device")
}

#[test]
fn doctor_on_this_host() {
    let no_efa = efa_absent();
    // The defaults describe a development box: a host without EFA warns but passes.
    let r = run(&["doctor"]);
    assert!(r.stdout.contains("tally doctor: checking against the built-in defaults"), "{r:?}");
    for row in [
        "provider efa",
        "provider shm",
        "provider tcp",
        "EFA NUMA",
        "lcores",
        "hugepages",
        "isolated cores",
        "CPU governor",
        "THP",
        "memlock",
        "NIC interrupts",
    ] {
        assert!(r.stdout.lines().any(|l| l.starts_with(row)), "{row}: {r:?}");
    }
    // tally runs no real-time threads: no advice about RT throttling.
    assert!(!r.stdout.contains("sched_rt_runtime_us"), "{r:?}");
    if no_efa {
        assert!(r.stdout.contains("warn    no EFA device; shm/tcp only (fine for development)"), "{r:?}");
        // This build host: shm and tcp work, so nothing fails for a dev config.
        assert_eq!(r.code, 0, "{r:?}");
        assert!(r.stdout.contains(" warnings, 0 failed"), "{r:?}");
    }

    // JSON agrees with the exit status: 1 exactly when a check fails.
    let r = run(&["doctor", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let checks = j["checks"].as_array().unwrap();
    let any_fail = checks.iter().any(|c| c["status"] == "fail");
    assert_eq!(r.code, i32::from(any_fail), "{r:?}");
    assert_eq!(j["exit_code"].as_i64().unwrap(), i64::from(r.code), "{r:?}");
    for c in checks {
        assert!(["pass", "info", "warn", "fail"].contains(&c["status"].as_str().unwrap()), "{c}");
        if c["status"] == "warn" || c["status"] == "fail" {
            assert!(c["fix"].is_string(), "a warning without a fix: {c}");
        }
    }
    if no_efa {
        let r = run(&["doctor", "--config", repo().join("config/local.toml").to_str().unwrap()]);
        assert_eq!(r.code, 0, "{r:?}");
    }
}

#[test]
fn doctor_with_the_production_config_fails_without_efa() {
    let path = repo().join("config/c7gn.16xlarge.toml");
    let r = run(&["doctor", "--config", path.to_str().unwrap()]);
    let efa_here = r.stdout.lines().any(|l| l.starts_with("provider efa") && l.contains(" pass "));
    if efa_here {
        println!("this host has EFA: only the general shape is checked");
        assert!(r.stdout.contains("lcores"), "{r:?}");
        return;
    }
    assert_eq!(r.code, 1, "{r:?}");
    let line = |name: &str| r.stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {r:?}")).to_string();
    assert!(line("provider efa").contains("fail    no EFA device, and the configuration asks for provider efa"), "{r:?}");
    assert!(line("hugepages").contains("fail"), "{r:?}");
    assert!(r.stdout.contains("fix: tally hugepages reserve "), "{r:?}");
    // A configuration that does not load is an error, not a report.
    let r = run(&["doctor", "--config", "/nonexistent/tally.toml"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("cannot read /nonexistent/tally.toml"), "{r:?}");
}

/// `tally server --check` refuses what a start would refuse, with the
/// reason, and exits 1; the real start fails on the same configurations.
#[test]
fn server_check_refuses_what_a_start_would() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = busy.local_addr().unwrap().to_string();
    let outside = format!("{}-{}", 1000, 1001);
    let cases: [(&[&str], &str); 3] = [
        (&["--lcores", &outside, "--listen", "127.0.0.1:0"], "outside this host's allowed CPUs"),
        (&["--provider", "verbs", "--lcores", "0", "--listen", "127.0.0.1:0"], "offers no verbs endpoint"),
        (&["--lcores", "0", "--listen", &taken], "cannot bind"),
    ];
    for (args, why) in cases {
        let r = run(&[&["server", "--check"], args].concat());
        assert_eq!(r.code, 1, "{args:?}: {r:?}");
        assert!(r.stderr.contains("a start would fail") && r.stderr.contains(why), "{args:?}: {r:?}");
        // The start itself fails on the same configuration.
        let started = run(&[&["server", "--slab-size", "8M"], args].concat());
        assert_ne!(started.code, 0, "{args:?}: a start succeeded where --check refused: {started:?}");
    }
    let ok = run(&["server", "--check", "--lcores", "0", "--provider", "tcp", "--listen", "127.0.0.1:0"]);
    assert_eq!(ok.code, 0, "{ok:?}");
    assert!(ok.stdout.contains("configuration ok") && ok.stdout.contains("checked on this host"), "{ok:?}");
}

/// An empty token would read as none and admit anyone, without the warning:
/// `--check` and the start refuse it alike, with the same words (the two
/// call the same reader), from a file or from `TALLY_TOKEN`.
#[test]
fn server_check_and_start_refuse_an_empty_token() {
    let dir = std::env::temp_dir().join(format!("tally-empty-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, " \n").unwrap();
    let cfg = dir.join("server.toml");
    std::fs::write(&cfg, format!("token_file = \"{}\"\n", token.display())).unwrap();
    let here = ["--lcores", "0", "--provider", "tcp", "--listen", "127.0.0.1:0", "--slab-size", "8M"];
    let with_file = [&["--config", cfg.to_str().unwrap()][..], &here].concat();
    let want = format!("token_file {} is empty: write a token (e.g. `openssl rand -hex 16`) or remove token_file", token.display());
    let check = run(&[&["server", "--check"][..], &with_file].concat());
    assert_eq!(check.code, 1, "{check:?}");
    assert!(check.stderr.contains("a start would fail") && check.stderr.contains(&want), "{check:?}");
    let started = run(&[&["server"][..], &with_file].concat());
    assert_eq!(started.code, 1, "{started:?}");
    assert!(started.stderr.contains(&want), "{started:?}");
    // TALLY_TOKEN set but empty (no token_file): refused the same way.
    for sub in [&["server", "--check"][..], &["server"]] {
        let r = finish(tally().env("TALLY_TOKEN", "").args(sub).args(here).output().expect("run tally"));
        assert_eq!(r.code, 1, "{sub:?}: {r:?}");
        assert!(r.stderr.contains("TALLY_TOKEN is set but empty: set a token"), "{sub:?}: {r:?}");
    }
    // A token too long or a file unreadable: --check fails as the start would.
    std::fs::write(&token, "x".repeat(33)).unwrap();
    let check = run(&[&["server", "--check"][..], &with_file].concat());
    assert!(check.code == 1 && check.stderr.contains("the token is longer than 32 bytes"), "{check:?}");
    std::fs::remove_file(&token).unwrap();
    let check = run(&[&["server", "--check"][..], &with_file].concat());
    assert!(check.code == 1 && check.stderr.contains(&format!("token: token_file {}:", token.display())), "{check:?}");
    // With a token written, the check passes and says where it read it.
    std::fs::write(&token, "s3cret\n").unwrap();
    let ok = run(&[&["server", "--check"][..], &with_file].concat());
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(ok.code, 0, "{ok:?}");
    assert!(ok.stdout.contains(&format!("token read from {}", token.display())), "{ok:?}");
}

// ---- shipped configuration files ----

#[test]
fn server_configs_load() {
    let local = ServerFile::load(&repo().join("config/local.toml")).unwrap().resolve().unwrap();
    assert_eq!(local.lcores.len(), 2);
    assert_eq!(local.poll, "adaptive");
    assert!(matches!(local.provider.as_deref(), Some("shm" | "tcp")));

    let c7gn = ServerFile::load(&repo().join("config/c7gn.16xlarge.toml")).unwrap().resolve().unwrap();
    assert_eq!(c7gn.provider.as_deref(), Some("efa"));
    assert_eq!(c7gn.poll, "busy");
    assert_eq!(c7gn.hugepages, "require");
    assert!(!c7gn.lcores.contains(0) && !c7gn.lcores.contains(1), "core 0 and the IRQ core stay free");
    assert!(c7gn.lcores.iter().all(|c| c < 64));
    assert_eq!(c7gn.lcores.len(), 62);

    // The sysctl file reserves exactly what the c7gn configuration needs.
    let need_pages = c7gn.lcores.len() as u64 * c7gn.slab_size.div_ceil(SIZE_2M);
    let conf = std::fs::read_to_string(repo().join("config/hugepages.conf")).unwrap();
    let line = conf.lines().find(|l| l.starts_with("vm.nr_hugepages")).expect("vm.nr_hugepages line");
    let pages: u64 = line.split('=').nth(1).unwrap().trim().parse().unwrap();
    assert_eq!(pages, need_pages, "{line}");
}

/// A systemd unit as (section, key, value) triples.
fn unit_entries(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("not key=value: {line}"));
        out.push((section.clone(), k.to_string(), v.to_string()));
    }
    out
}

#[test]
fn systemd_unit() {
    let text = std::fs::read_to_string(repo().join("config/tally-server.service")).unwrap();
    let e = unit_entries(&text);
    let get = |k: &str| e.iter().find(|(s, key, _)| s == "Service" && key == k).map(|(_, _, v)| v.as_str());
    assert_eq!(get("LimitMEMLOCK"), Some("infinity"));
    assert_eq!(get("ExecStart"), Some("/usr/local/bin/tally server --config /etc/tally/server.toml"));
    assert!(get("EnvironmentFile").is_some_and(|f| f.trim_start_matches('-').starts_with('/')));
    assert!(text.contains("tally efa-env print --role server --format systemd"));
    // The unit's CPUs cover every c7gn lcore and leave core 0 to the kernel.
    let cpus = tally_engine::host::cpuset::CoreList::parse(get("CPUAffinity").unwrap()).unwrap();
    assert!(!cpus.contains(0));
    let c7gn = ServerFile::load(&repo().join("config/c7gn.16xlarge.toml")).unwrap().resolve().unwrap();
    assert!(c7gn.lcores.iter().all(|c| cpus.contains(c)));
    for (s, _, _) in &e {
        assert!(["Unit", "Service", "Install"].contains(&s.as_str()), "{s}");
    }
    // Documentation= names files the header installs from the tarball, which dist.sh packs.
    let doc = e.iter().find(|(s, k, _)| s == "Unit" && k == "Documentation").map(|(_, _, v)| v.clone()).unwrap();
    let dist = std::fs::read_to_string(repo().join("scripts/build/dist.sh")).unwrap();
    for uri in doc.split_whitespace() {
        let file = uri.strip_prefix("file:///usr/local/share/doc/tally/").unwrap_or_else(|| panic!("{uri}: not an installed doc"));
        assert!(text.contains(&format!("share/doc/tally/{file}")), "the unit's header does not install {file}");
        let packed = if file == "README.md" { "\"$ROOT/README.md\"".to_string() } else { format!("\"$ROOT/docs/{file}\"") };
        assert!(dist.contains(&packed) && dist.contains("share/doc/tally"), "dist.sh does not pack {file}");
    }
}

// config/k8s/ and config/slurm/ are checked, and run, by tests/manifests/.
