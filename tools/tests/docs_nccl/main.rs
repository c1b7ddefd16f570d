//! docs/nccl.md, the guide for NCCL/PyTorch users: every command it shows is
//! one that something runs.
//!
//! The page's ```sh blocks are parsed into command lines (continuations
//! joined, comments dropped). Then:
//!
//! - Every `tally` invocation (a line's command, or inside `$(...)`) is checked
//!   against the built CLI: `tally ARGS --help` makes clap parse every
//!   subcommand, flag and value and stop before running anything (exit 2 on
//!   an unknown flag or a bad value), and the usage line it prints gives the
//!   required flags and arguments, which must be there too. The same check
//!   covers inline code in the prose that starts with `tally `.
//! - The ones that change nothing and end by themselves (`server --check`,
//!   `efa-env`, `doctor`, `bench reduce`, `hugepages show`) are run for real,
//!   from the repository root, with the paths the page's `install` lines put
//!   files at mapped back to the repository's files (`/etc/tally/server.toml`
//!   is config/c7gn.16xlarge.toml). `doctor` may fail its checks on a host
//!   without EFA; it must still print its report.
//! - Every other line must appear in a script, test or shipped configuration
//!   that runs it or prescribes it (the unit's and manifests' install
//!   procedures), word for word except for placeholders: a doc word holding
//!   `<NAME>` matches any word there, and an expression in a Rust test's
//!   argument array (`&["hugepages", "setup", "6M", ..., d]`) matches any
//!   doc word. `make TARGET` needs the target in the Makefile; a line
//!   starting a repository script (`tests/nccl/torchrun_example.sh`) needs
//!   the script executable, `bash -n` clean and reading every variable the
//!   line sets.
//! - Files the page names exist and load; placeholders are defined in the
//!   page's table; the figures it quotes from the code still hold.
//!
//! Nothing here needs a GPU, EFA or root, and nothing changes the host.
mod cli;
mod page;
mod sources;

use cli::*;
use page::*;
use sources::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use tally_e2e::show_output as show;
use tally_engine::host::config::ServerFile;

const DOC: &str = "docs/nccl.md";

/// The page's placeholders, with the value a CLI check puts in their place.
const PLACEHOLDERS: &[(&str, &str)] = &[
    ("SERVERS", "10.0.1.11:7400,10.0.1.12:7400"),
    ("TOKEN", "0123456789abcdef0123456789abcdef"),
    ("LIBDIR", "/usr/local/lib"),
    ("SIZE", "31G"),
    ("HOST", "10.0.1.11"),
    ("LOG", "train.log"),
    ("NNODES", "2"),
    ("NODE_RANK", "0"),
    ("NPROC", "8"),
    ("MASTER_ADDR", "10.0.2.21"),
    ("MASTER_PORT", "29500"),
];

/// Where a doc line may be found, and what that file is to it.
const SOURCES: &[(&str, Kind)] = &[
    ("tests/nccl/torchrun_example.sh", Kind::Script),
    ("tests/nccl/gpu_proof.sh", Kind::Script),
    ("config/slurm/tally-train.sbatch", Kind::Procedure),
    ("config/tally-server.service", Kind::Procedure),
    ("config/hugepages.conf", Kind::Procedure),
    ("config/k8s/tally-server.yaml", Kind::Procedure),
    ("config/k8s/worker.yaml", Kind::Procedure),
    ("scripts/build/image.sh", Kind::Procedure),
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// A script: its code lines run (comments do not count).
    Script,
    /// A shipped file whose header (comments) lists the commands that install
    /// or start it, and whose code lines run (systemd's Exec lines).
    Procedure,
    /// A Rust integration test's argument arrays for the `tally` binary.
    Tests,
}

/// A word of a source command; `None` is an expression (matches any word).
type SrcWord = Option<String>;

struct SourceCmd {
    path: String,
    kind: Kind,
    words: Vec<SrcWord>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

// ---- the tests --------------------------------------------------------------

#[test]
fn every_command_is_run_by_something() {
    let md = read(DOC);
    let cmds = sh_commands(&md);
    assert!(cmds.len() >= 20, "only {} commands found in {DOC}: is the parser right?", cmds.len());
    let installed = installed_files(&cmds);
    assert_eq!(installed.get("/etc/tally/server.toml").map(String::as_str), Some("config/c7gn.16xlarge.toml"), "{installed:?}");
    let sources = all_sources();
    let makefile = read("Makefile");
    let mut report = Vec::new();
    let mut unrun = Vec::new();
    for c in &cmds {
        let what = format!("{DOC}:{}", c.line);
        let w = words(&c.text);
        let mut ran = false;
        for inv in tally_invocations(&c.text) {
            let path = check_cli(&inv, &what);
            if runs_here(&path, &inv) {
                run_for_real(&inv, &path, &installed, &what);
                // A whole line that is this command (a redirect aside) is done.
                ran |= w.first().is_some_and(|x| x == "tally");
            }
        }
        let cmd_word = w.iter().find(|x| !is_assignment(x)).cloned().unwrap_or_default();
        let who = if ran {
            "this test runs it".to_string()
        } else if cmd_word.starts_with("tests/") || cmd_word.starts_with("scripts/") {
            check_script_invocation(&w, &cmd_word, &what);
            format!("{cmd_word} (checked: executable, bash -n)")
        } else if cmd_word == "make" && w.len() == 2 {
            assert!(makefile.lines().any(|l| l.starts_with(&format!("{}:", w[1]))), "{what}: the Makefile has no target {}", w[1]);
            format!("Makefile target {}", w[1])
        } else {
            let hits: Vec<&SourceCmd> = sources.iter().filter(|s| line_matches(&w, &s.words)).collect();
            if cmd_word == "make" {
                assert!(makefile.lines().any(|l| l.starts_with(&format!("{}:", w[1]))), "{what}: the Makefile has no target {}", w[1]);
            }
            match hits.first() {
                Some(s) => format!("{} ({:?})", s.path, s.kind),
                None => {
                    unrun.push(format!("{what}: {}", c.text));
                    continue;
                }
            }
        };
        report.push(format!("{:>4}  {:<60}  {}", c.line, c.text.chars().take(60).collect::<String>(), who));
    }
    println!("{}", report.join("\n"));
    assert!(
        unrun.is_empty(),
        "commands of {DOC} that no script, test or shipped configuration runs (or that differ from it):\n  {}",
        unrun.join("\n  ")
    );
}

/// `VAR=value ... tests/nccl/x.sh`: the script exists, is executable, parses,
/// and reads every variable the line sets.
fn check_script_invocation(w: &[String], script: &str, what: &str) {
    use std::os::unix::fs::PermissionsExt;
    let p = repo().join(script);
    let meta = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{what}: {script}: {e}"));
    assert!(meta.permissions().mode() & 0o111 != 0, "{what}: {script} is not executable");
    let o = Command::new("bash").arg("-n").arg(&p).output().unwrap();
    assert!(o.status.success(), "{what}: bash -n {script}:\n{}", show(&o));
    let text = read(script);
    for a in w.iter().take_while(|x| is_assignment(x)) {
        let name = a.split('=').next().unwrap();
        assert!(text.contains(&format!("${name}")) || text.contains(&format!("${{{name}")), "{what}: {script} never reads {name}");
    }
}

#[test]
fn inline_tally_commands_parse() {
    let md = read(DOC);
    let spans: Vec<String> = inline_code(&md).into_iter().filter(|s| s.starts_with("tally ")).collect();
    assert!(!spans.is_empty());
    for s in spans {
        let inv = tally_invocations(&s);
        assert_eq!(inv.len(), 1, "{s}");
        check_cli(&inv[0], &format!("{DOC}, inline `{s}`"));
    }
}

#[test]
fn placeholders_are_defined() {
    let md = read(DOC);
    // The page's table: rows starting with | `<NAME>` (several names per row allowed).
    let defined: BTreeSet<String> =
        md.lines().filter(|l| l.starts_with("| `<")).flat_map(|l| placeholders_in(l.split('|').nth(1).unwrap())).collect();
    let used: BTreeSet<String> = sh_commands(&md)
        .iter()
        .flat_map(|c| placeholders_in(&c.text))
        .chain(inline_code(&md).iter().flat_map(|s| placeholders_in(s)))
        .collect();
    for p in &used {
        assert!(defined.contains(p), "<{p}> is used in {DOC} but not in its placeholder table");
        assert!(PLACEHOLDERS.iter().any(|(n, _)| n == p), "<{p}> has no test value in PLACEHOLDERS");
    }
    for p in &defined {
        assert!(used.contains(p), "<{p}> is in the placeholder table of {DOC} but never used");
    }
}

/// Repository paths the page names exist, and the ones that are
/// configuration or scripts load or parse.
#[test]
fn named_files_exist_and_load() {
    let md = read(DOC);
    let prefixes = ["config/", "tests/", "docs/", "tools/", "engine/", "ffi-plugin/", "scripts/", "docker/"];
    let mut paths = BTreeSet::new();
    for w in md.split(|c: char| c.is_whitespace() || "`()[],".contains(c)) {
        let w = w.trim_end_matches(['.', ':', ';']);
        if prefixes.iter().any(|p| w.starts_with(p)) && w.len() > 8 && !w.contains('<') {
            paths.insert(w.to_string());
        }
    }
    assert!(paths.len() >= 10, "{paths:?}");
    for p in &paths {
        let f = repo().join(p);
        assert!(f.exists(), "{DOC} names {p}, which does not exist");
        let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
        match ext {
            "toml" if p.starts_with("config/") => {
                ServerFile::load(&f).and_then(|s| s.resolve()).unwrap_or_else(|e| panic!("{p}: {e}"));
            }
            "yaml" => {
                yaml_rust2::YamlLoader::load_from_str(&read(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
            }
            "sh" | "sbatch" => {
                let o = Command::new("bash").arg("-n").arg(&f).output().unwrap();
                assert!(o.status.success(), "bash -n {p}:\n{}", show(&o));
            }
            "py" => {
                // Parsed, not run (and no __pycache__ written).
                match Command::new("python3")
                    .args(["-c", "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])"])
                    .arg(&f)
                    .output()
                {
                    Ok(o) => assert!(o.status.success(), "{p} does not parse:\n{}", show(&o)),
                    Err(e) => println!("python3 not found ({e}): {p} not parsed"),
                }
            }
            "service" => {
                for l in read(p).lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('[')) {
                    assert!(l.contains('='), "{p}: not key=value: {l}");
                }
            }
            _ => {}
        }
    }
}

/// The environment variables the page names are ones the plugin, engine,
/// CLI or scripts read.
#[test]
fn tally_variables_exist() {
    let md = read(DOC);
    let mut code = String::new();
    let mut dirs: Vec<std::path::PathBuf> = ["ffi-plugin/src", "engine/src", "tools/src"].iter().map(|d| repo().join(d)).collect();
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                // The settings table lists every name: it proves nothing reads one.
                if !p.ends_with("settings") {
                    dirs.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("settings.rs") {
                code.push_str(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    code.push_str(&read("tests/nccl/torchrun_example.sh"));
    code.push_str(&read("tests/nccl/torchrun_example.py"));
    let vars: BTreeSet<&str> = md
        .split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| w.starts_with("TALLY_") && w.len() > 6)
        .collect();
    assert!(vars.len() >= 8, "{vars:?}");
    for v in vars {
        assert!(code.contains(v), "{DOC} names {v}, which nothing reads");
    }
}

/// Figures the page quotes from the code and configuration.
#[test]
fn quoted_figures_hold() {
    let md = read(DOC).split_whitespace().collect::<Vec<_>>().join(" ");
    // The plugin's clients: ClientConfig's defaults (TALLY_CHUNK, TALLY_WINDOW
    // unset; the plugin itself sets only the timeout and the smallest piece).
    let c = tally_engine::client::ClientConfig::new(vec![], 1, 0, 1);
    assert_eq!((c.chunk_bytes, c.window), (256 << 10, 0));
    assert_eq!(tally_engine::client::auto_window(c.chunk_bytes), 4, "the window auto gives 256 KiB pieces");
    assert!(md.contains("256 KiB pieces and a window of 4"), "the page's piece/window figures");
    assert_eq!(c.timeout, std::time::Duration::from_secs(30));
    assert!(md.contains("`TALLY_TIMEOUT_S` on the workers (default 30)"));
    let plugin = read("ffi-plugin/src/collnet.rs");
    assert!(plugin.contains("ClientConfig::new("));
    // Over tcp the plugin picks whole pieces of the eager limit (128 KiB on
    // libfabric 1.17, where tally sets the limit to that), a window of 16
    // (and sets the window nowhere else), and leaves its sends unpaced.
    assert_eq!(plugin.matches("cfg.window =").count(), 1, "the window is set in tcp_defaults only");
    assert!(plugin.contains("defaults::eager_limit().clamp(4 << 10, most)") && !plugin.contains("cfg.send_credits ="));
    assert!(plugin.contains("let most = if cores >= FEW_CORES { TCP_MAX_PIECE } else { FEW_CORES_PIECE };"));
    assert!(plugin.contains("pub const FEW_CORES: usize = 8;") && plugin.contains("pub const FEW_CORES_PIECE: usize = 32 << 10;"));
    assert!(md.contains("On a host of fewer than 8 cores the pieces are 32 KiB at most"), "the few-cores rule on the page");
    // The window where the link's rate is known: what the page says.
    assert!(plugin.contains("pub const TCP_IN_FLIGHT_MS: f64 = 32.0;") && plugin.contains("pub const TCP_MIN_WINDOW: u32 = 4;"));
    assert!(plugin.contains("cfg.window = tcp_window(cfg.link_gbits, cfg.servers.len(), cfg.chunk_bytes);"));
    assert!(md.contains("no more than 32 ms of it in flight"), "the link-bounded window on the page");
    assert!(plugin.contains("pub const TCP_MAX_PIECE: usize = 128 << 10;"));
    assert!(plugin.contains("cfg.min_piece = cfg.chunk_bytes;"), "whole pieces over tcp");
    let limit_1_17 = tally_engine::dataplane::fabric::defaults::PROVIDER_DEFAULTS;
    assert_eq!(limit_1_17[0], ("FI_OFI_RXM_EAGER_LIMIT", "131072"), "the eager limit the page quotes for 1.17");
    assert_eq!(c.send_credits, 0, "unset, no pacing: the page says the plugin keeps it");
    assert!(plugin.contains("pub const TCP_WINDOW: u32 = 16;"));
    assert!(
        md.contains("over `tcp`: whole pieces of the rxm eager limit tally sets (128 KiB on libfabric 1.17, 32 KiB from 1.18) and a window of 16, and no send credits"),
        "the tcp defaults on the page"
    );
    assert!(md.contains("(over `tcp` on libfabric 1.17: 128 KiB pieces and a window of 16, 2 MiB per rank)"), "the tcp memory figure");
    assert!(plugin.contains("TALLY_TIMEOUT_S"));

    // c7gn: hugepages = lcores x slab_size, the <SIZE> example and the table.
    let c7gn = ServerFile::load(&repo().join("config/c7gn.16xlarge.toml")).unwrap().resolve().unwrap();
    let total = c7gn.lcores.len() as u64 * c7gn.slab_size;
    assert_eq!(total % (1 << 30), 0);
    assert!(md.contains(&format!("`{}G` for config/c7gn.16xlarge.toml", total >> 30)), "<SIZE> example");
    assert!(md.contains(&format!("{} x {} MiB = {} GiB", c7gn.lcores.len(), c7gn.slab_size >> 20, total >> 30)));
    let row = format!("| {}M: {} node-jobs at a time |", c7gn.slab_size >> 20, (c7gn.slab_size / (256 << 10) / 4));
    assert!(md.contains(&row), "{row}");
    assert!(md.contains(&format!("| `max_jobs` | jobs at a time | {} |", c7gn.max_jobs)));
    assert!(md.contains(&format!("| `max_ranks` | ranks (nodes) per job (default and most: 1024) | {} |", c7gn.max_ranks)));
    assert!(md.contains(&format!("{}M, {} |", c7gn.max_chunk >> 20, c7gn.max_window)));
    assert!(md.contains(&format!("`op_timeout_s` ({} on c7gn)", c7gn.op_timeout_s)));

    // Log lines the page quotes from the plugin, and what gpu_proof.sh greps for.
    let ffi = read("ffi-plugin/src/ffi.rs");
    assert!(ffi.contains("TALLY_SERVERS is not set, no CollNet device") && md.contains("TALLY_SERVERS is not set, no CollNet device"));
    assert!(plugin.contains("CollNet rank {rank}/{nranks}: joined job {job_id:#x} on {} over {} ({} streams;"));
    assert!(read("ffi-plugin/src/log.rs").contains("format!(\"NET/Tally: {msg}\")"));
    let proof = read("tests/nccl/gpu_proof.sh");
    for p in ["Loaded net plugin Tally", "Loaded collnet plugin Tally", "via NET/Tally", "CollNet rank .* joined job"] {
        assert!(proof.contains(p), "gpu_proof.sh no longer greps for {p}");
        assert!(md.contains(&format!("`{p}`")), "{DOC} should list {p}");
    }
    assert!(md.contains(&format!("`idle_timeout_s` ({} on c7gn", c7gn.idle_timeout_s)));

    // Messages the page quotes, as the code writes them.
    // The control plane's texts: its job logic and its connections (handshake refusals).
    let control = ["mod.rs", "conn/mod.rs", "conn/read.rs", "error.rs", "join.rs", "jobs.rs", "drain.rs", "failover.rs", "liveness.rs"]
        .iter()
        .map(|f| read(&format!("engine/src/control/{f}")))
        .collect::<String>();
    let client = ["mod.rs", "error.rs", "join.rs", "handshake.rs", "progress/mod.rs", "control.rs"]
        .iter()
        .map(|f| read(&format!("engine/src/client/{f}")))
        .collect::<String>();
    let wire = read("engine/src/wire/mod.rs") + &read("engine/src/wire/join.rs");
    let budget = read("engine/src/control/budget.rs");
    for (file, text, quoted) in [
        (&control, "refused: wrong or missing token (job {:#x}, rank {})", "refused: wrong or missing token (job 0x..., rank 1)"),
        (&control, "job {:#x} refused: {e}", "job 0x... refused: window 32 x 1024 ranks x 4 KiB piece"),
        (&budget, "per lcore, above the {} a job may take on lcore {}: ", "per lcore, above the 64 MiB a job may take on lcore 3: "),
        (&budget, "at most {r} ranks fit at window {}, or window {w} at {} ranks", "at most 512 ranks fit at window 32, or window 16"),
        (&control, "the server already runs its limit of {} jobs", "the server already runs its limit of 4 jobs"),
        (&client, "cannot connect to {server}: {error}", "cannot connect to 127.0.0.1:7999"),
        (&client, "token longer than 32 bytes", "token longer than 32 bytes"),
        (&client, "all-reduce made no progress for {:?}", "timed out: all-reduce made no progress for 30s"),
        (&client, "timed out: {m}", "timed out: all-reduce"),
        (&wire, "\"unauthorized\"", "unauthorized: token: wrong or missing token"),
        (&wire, "\"no capacity\"", "`no capacity`"),
        (&wire, "\"too many jobs\"", "`too many jobs`"),
        (&wire, "\"job mismatch\"", "job mismatch"),
    ] {
        assert!(file.contains(text), "the code no longer says {text:?}");
        assert!(md.contains(quoted), "{DOC} should quote {quoted:?}");
    }

    // The plugin offers no all-gather or reduce-scatter, as the page says.
    let lib = read("ffi-plugin/src/lib.rs");
    assert!(lib.contains("iallgather: None") && lib.contains("ireducescatter: None"));
}

/// Section 6's capacity in training terms and section 7's failover figures:
/// the numbers the page gives are the code's defaults, the shipped
/// configurations' values and docs/measurements.md's.
#[test]
fn capacity_and_failover_claims_hold() {
    let md = read(DOC).split_whitespace().collect::<Vec<_>>().join(" ");
    // The defaults a configuration without max_jobs/max_ranks gets.
    let local = read("config/local.toml");
    let bare: String =
        local.lines().filter(|l| !l.starts_with("max_jobs") && !l.starts_with("max_ranks")).map(|l| format!("{l}\n")).collect();
    let d = ServerFile::parse(&bare).unwrap().resolve().unwrap();
    assert!(md.contains(&format!("at most `max_jobs` jobs at a time ({} by default", d.max_jobs)), "max_jobs default {}", d.max_jobs);
    assert!(md.contains(&format!("`max_ranks` ranks each ({} by default, and the most a server takes)", d.max_ranks)));
    assert_eq!(d.max_ranks, tally_engine::wire::MAX_RANKS);
    assert!(md.contains(&format!("a job is up to {} GPU nodes", d.max_ranks)));
    // The shipped production configurations, as section 2 and 6 quote them.
    for f in ["config/c7gn.16xlarge.toml", "config/tcp-ena.toml"] {
        let c = ServerFile::load(&repo().join(f)).unwrap().resolve().unwrap();
        assert_eq!((c.max_jobs, c.max_ranks), (4, 1024), "{f}: section 6 says 4 jobs of 1024 ranks");
        assert!(md.contains(f), "{f}");
    }
    assert!(md.contains("up to 4 jobs (`max_jobs`) of up to 1024 ranks (`max_ranks`;"));
    assert!(md.contains("With `max_jobs = 4`, one training job with its default process group and one more group fits"));
    // A communicator's jobs: the plugin's TALLY_COMM_JOBS default.
    assert!(read("ffi-plugin/src/collnet.rs").contains("pub const COMM_JOBS: u8 = 2;"));
    assert!(md.contains("counts as `TALLY_COMM_JOBS` jobs (the plugin's 2:"));
    // Every data type and operation the servers reduce, NCCL's codes.
    use tally_engine::reduce::{DataType, ReduceOp};
    assert!(DataType::from_nccl(10).is_none() && DataType::from_nccl(11).is_none(), "fp8 (NCCL codes 10, 11) now reduced");
    let long = |t: DataType| match t.name() {
        "i8" => "int8",
        "u8" => "uint8",
        "i32" => "int32",
        "u32" => "uint32",
        "i64" => "int64",
        "u64" => "uint64",
        n => n,
    };
    let types = DataType::ALL.iter().map(|&t| long(t)).collect::<Vec<_>>().join(", ");
    assert!(md.contains(&format!("({types})")), "the page's data types: {types}");
    let ops = ReduceOp::ALL.iter().map(|o| o.name()).collect::<Vec<_>>();
    let ops = format!("with {} and {}", ops[..ops.len() - 1].join(", "), ops[ops.len() - 1]);
    assert!(md.contains(&ops), "{ops}");
    // Failover's figures, as docs/measurements.md holds them.
    let meas = read("docs/measurements.md").split_whitespace().collect::<Vec<_>>().join(" ");
    for (there, here) in [
        (
            "kill to rank 0's next completed all-reduce 10-83 ms, every element right",
            "next completed all-reduce 10-83 ms, every element right",
        ),
        ("each recovery 33-41 ms", "each recovery 33-41 ms"),
        ("Restart to taken back: 0.5-0.9 s", "0.5-0.9 s after it serves again"),
        ("link up to taken back 0.79-1.47 s", "taken back 0.79-1.47 s after the link comes up"),
    ] {
        assert!(meas.contains(there), "docs/measurements.md no longer says {there:?}");
        assert!(md.contains(here), "{DOC} should say {here:?}");
    }
    assert!(
        read("engine/src/client/liveness.rs").contains("2 s (1.95-2.03 s measured)") && md.contains("1.95-2.03 s measured for a cut link")
    );
    // One install path for the tarball: /usr/local, as the sbatch's default.
    assert!(read("config/slurm/tally-train.sbatch").contains("TALLY_LIB=\"${TALLY_LIB:-/usr/local/lib}\""));
    assert!(!md.contains("/opt/tally"), "the tarball installs under /usr/local");
}

#[test]
fn readme_links_the_guide() {
    assert!(read("README.md").contains("docs/nccl.md"), "README.md should point NCCL/PyTorch users to docs/nccl.md");
}

// ---- the parser itself --------------------------------------------------------

#[test]
fn parser_and_matcher() {
    assert_eq!(words(r#"eval "$(tally efa-env print --role worker)""#), vec!["eval", r#""$(tally efa-env print --role worker)""#]);
    assert_eq!(words("a  'b c' \"d e\" $(f g)"), vec!["a", "'b c'", "\"d e\"", "$(f g)"]);
    assert_eq!(strip_comment("tally doctor   # check 'it'"), "tally doctor   ");
    assert_eq!(strip_comment("grep -E 'a#b' x"), "grep -E 'a#b' x");
    let doc = words("kubectl -n tally create secret generic tally-token --from-literal=token=<TOKEN>");
    let src: Vec<SrcWord> = words(r#"kubectl -n tally create secret generic tally-token --from-literal=token="$(openssl rand -hex 16)""#)
        .into_iter()
        .map(Some)
        .collect();
    assert!(line_matches(&doc, &src));
    assert!(!line_matches(&doc[..doc.len() - 1], &src));
    assert!(word_matches("<LIBDIR>${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}", &Some("$TALLY_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}".into())));
    assert!(!word_matches("<LIBDIR>${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}", &Some("${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}".into())));
    assert!(word_matches("--nnodes=<NNODES>", &Some("--nnodes=\"$NNODES\"".into())));
    assert!(word_matches("anything", &None));
    assert_eq!(tally_invocations("tally efa-env print --role server --format systemd > /etc/tally/efa.env")[0].len(), 7);
    assert_eq!(tally_invocations(r#"eval "$(tally efa-env print --role worker)""#), vec![words("tally efa-env print --role worker")]);
    assert_eq!(array_elements(r#""a", "b,c", x.y(1, 2), "d"] rest"#), vec![r#""a""#, r#""b,c""#, "x.y(1, 2)", r#""d""#]);
    let md = "x\n```sh\na \\\n  b # c\n\n# d\ne\n```\n```\nnot sh\n```\n";
    let c = sh_commands(md);
    assert_eq!(c.iter().map(|c| c.text.as_str()).collect::<Vec<_>>(), vec!["a b", "e"]);
    assert_eq!(c[0].line, 3);
    // A flag the CLI does not have is refused.
    let o = tally().args(["doctor", "--no-such-flag", "--help"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let u = parse_help("Usage: tally efa-env print [OPTIONS] --role <ROLE>\n\nOptions:\n      --role <ROLE>  x\n      --json  y\n");
    assert_eq!((u.path, u.required_flags, u.required_args), (vec!["efa-env".to_string(), "print".into()], vec!["--role".to_string()], 0));
    assert!(u.takes_value.contains("--role") && !u.takes_value.contains("--json"));
}
