//! The settings table (`tally_engine::settings`) against what it describes.
//!
//! - Every `TALLY_*` name the code uses (a string literal in the Rust
//!   sources: engine, plugin, tools, benches, fuzz, their tests) or the
//!   scripts use (scripts/, tests/nccl/, config/, docker/, the Makefile) is a
//!   row; no name is built at run time from a `"TALLY_"` prefix; and every
//!   row's name is used somewhere. Adding a `TALLY_*` read without a row
//!   fails here.
//! - The server's configuration keys are exactly the ones `ServerFile`
//!   accepts, and the flags named are exactly `tally server`'s.
//! - The defaults written in the table are the code's where the code can be
//!   asked: `ClientConfig::new` with the variables unset (and set to the
//!   written default, which must change nothing), the named constants, and
//!   `ServerFile::resolve` of an empty file against one that sets each key
//!   to its written default, and a script's `${NAME:-DEFAULT}`.
//! - README.md and docs/nccl.md hold exactly the tables `tally settings
//!   --markdown` prints (the real binary), each after its marker line: no
//!   row missing, none stale, none edited by hand.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use tally_engine::host::config::ServerFile;
use tally_engine::settings::{self, Table, CONFIG_KEYS, ENV};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Files under `rel` (recursively, build output skipped) whose name ends in
/// one of `exts` (empty: every file), as repository-relative paths.
fn files(rel: &str, exts: &[&str]) -> Vec<String> {
    fn walk(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                if !name.starts_with('.') && !name.starts_with("target") && name != "__pycache__" {
                    walk(&p, exts, out);
                }
            } else if exts.is_empty() || exts.iter().any(|x| name.ends_with(x)) {
                out.push(p);
            }
        }
    }
    let root = repo();
    let start = root.join(rel);
    let mut out = Vec::new();
    if start.is_file() {
        out.push(start);
    } else {
        walk(&start, exts, &mut out);
    }
    let mut rels: Vec<String> = out.iter().map(|p| p.strip_prefix(&root).unwrap().to_string_lossy().to_string()).collect();
    rels.sort();
    rels
}

/// The table's rows, and the module around them: the one place a name may
/// appear without being read.
const TABLE_SOURCE: &str = "engine/src/settings/rows.rs";

/// Where the Rust sources are; `tests` marks the test suites.
const RUST_DIRS: &[&str] = &["engine", "ffi-plugin", "tools", "tests/src", "tests/suites", "benches", "fuzz"];

/// Where the scripts and shipped configurations are.
const SCRIPT_PATHS: &[&str] = &["scripts", "tests/nccl", "config", "docker", "Makefile"];

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'
}

/// String literals of a Rust file that start with a `TALLY_` name: (name,
/// byte offset). The literal may end after the name (`"TALLY_CHUNK"`) or
/// go on as a message (`"TALLY_ISA: {e}"`); one that goes on into a format
/// argument or ends in `_` (`"TALLY_{x}"`, `"TALLY_RING_"`) is a name put
/// together at run time, returned with an empty name.
fn tally_literals(text: &str) -> Vec<(String, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("\"TALLY_") {
        let start = from + i + 1;
        let mut end = start;
        while end < b.len() && is_name_byte(b[end]) {
            end += 1;
        }
        let built = b[end - 1] == b'_' || b.get(end) == Some(&b'{');
        out.push((if built { String::new() } else { text[start..end].to_string() }, start));
        from = end;
    }
    out
}

/// Whole `TALLY_X` words of a text (not the `TALLY_` of a longer name's
/// prefix such as `TALLY_CLUSTER_` in `TALLY_CLUSTER_RANK/_WORLD`).
fn tally_words(text: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("TALLY_") {
        let start = from + i;
        let mut end = start + 6;
        while end < b.len() && is_name_byte(b[end]) {
            end += 1;
        }
        let whole_start = start == 0 || !(is_name_byte(b[start - 1]) || b[start - 1].is_ascii_lowercase());
        let word = &text[start..end];
        if whole_start && end > start + 6 && !word.ends_with('_') {
            out.insert(word.to_string());
        }
        from = end;
    }
    out
}

/// name -> the Rust files that hold it as a literal (the table's own and
/// this test's left out).
fn code_names() -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for dir in RUST_DIRS {
        for f in files(dir, &[".rs"]) {
            if f.starts_with("engine/src/settings") || f == "tools/tests/settings_table.rs" {
                continue;
            }
            let text = read(&f);
            for (name, at) in tally_literals(&text) {
                let line = text[..at].lines().count();
                // Tests match words against the prefix (`starts_with("TALLY_")`);
                // the code that reads variables must name them whole.
                let in_tests = f.contains("/tests/");
                assert!(
                    !name.is_empty() || in_tests,
                    "{f}:{line}: a TALLY_ name put together at run time: read whole names, each a row of {TABLE_SOURCE}"
                );
                if !name.is_empty() {
                    out.entry(name).or_default().insert(f.clone());
                }
            }
        }
    }
    out
}

/// name -> the scripts and configurations that use it.
fn script_names() -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in SCRIPT_PATHS {
        for f in files(p, &[]) {
            let Ok(text) = std::fs::read_to_string(repo().join(&f)) else { continue }; // binary
            for w in tally_words(&text) {
                out.entry(w).or_default().insert(f.clone());
            }
        }
    }
    out
}

#[test]
fn every_name_used_is_a_row_and_every_row_is_used() {
    let code = code_names();
    let scripts = script_names();
    assert!(code.len() >= 30 && code.contains_key("TALLY_LIVENESS_MS") && code.contains_key("TALLY_NET_LANES"), "{code:?}");
    assert!(scripts.contains_key("TALLY_BIN"), "{scripts:?}");
    let mut missing = Vec::new();
    for (name, where_) in code.iter().chain(&scripts) {
        if settings::env_var(name).is_none() {
            missing.push(format!("{name} (used in {})", where_.iter().cloned().collect::<Vec<_>>().join(", ")));
        }
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "TALLY_* names without a row in {TABLE_SOURCE}:\n  {}", missing.join("\n  "));

    for v in ENV {
        let in_code = code.get(v.name);
        assert!(in_code.is_some() || scripts.contains_key(v.name), "{}: a row that nothing reads (stale?)", v.name);
        // A reader the row names has the name in its sources, or in the
        // engine's, which every tally process links (`select_provider` reads
        // TALLY_PROVIDER for the server, the tools and the plugin alike).
        use settings::Reader::*;
        for r in v.readers {
            let dirs: &[&str] = match r {
                Server => &["engine/src/", "tools/src/"],
                Client => &["engine/src/"],
                Plugin => &["ffi-plugin/src/", "engine/src/"],
                Tools => &["tools/src/", "engine/src/"],
                Tests => &["engine/tests/", "tools/tests/", "tests/src/", "tests/suites/", "ffi-plugin/tests/"],
                Scripts => &["scripts/", "tests/nccl/", "config/", "docker/", "Makefile"],
            };
            let found = match r {
                Scripts => scripts.get(v.name).is_some_and(|fs| fs.iter().any(|f| dirs.iter().any(|d| f.starts_with(d)))),
                _ => in_code.is_some_and(|fs| fs.iter().any(|f| dirs.iter().any(|d| f.starts_with(d)))),
            };
            assert!(found, "{}: read by {} says the row, but {dirs:?} never name it", v.name, r.name());
        }
    }
}

#[test]
fn literal_scanner() {
    let t = r#"env("TALLY_A") + "TALLY_B_C" "TALLY_" format!("TALLY_{x}") "TALLY_D: {e}" "TALLY_E_" x"#;
    let names: Vec<String> = tally_literals(t).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["TALLY_A", "TALLY_B_C", "", "", "TALLY_D", ""]);
    let w = tally_words("TALLY_BIN=${TALLY_BIN:-x} $TALLY_LIB TALLY_CLUSTER_RANK/_WORLD XTALLY_NO TALLY_");
    assert_eq!(w.into_iter().collect::<Vec<_>>(), ["TALLY_BIN", "TALLY_CLUSTER_RANK", "TALLY_LIB"]);
}

/// The keys `ServerFile` accepts, from serde's own error for an unknown one.
fn server_file_keys() -> BTreeSet<String> {
    let e = ServerFile::parse("no_such_key = 1\n").unwrap_err().to_string();
    let list = e.split("expected one of").nth(1).unwrap_or_else(|| panic!("serde no longer lists the fields: {e}"));
    list.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn config_keys_are_the_server_files() {
    let accepted = server_file_keys();
    assert!(accepted.contains("heartbeat_ms") && accepted.len() >= 20, "{accepted:?}");
    let listed: BTreeSet<String> = CONFIG_KEYS.iter().map(|k| k.key.to_string()).collect();
    assert_eq!(listed, accepted, "keys of {TABLE_SOURCE} against ServerFile's");
}

#[test]
fn server_flags_are_the_tables() {
    let o = Command::new(env!("CARGO_BIN_EXE_tally")).args(["server", "--help"]).output().unwrap();
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    let flags: BTreeSet<String> = help
        .lines()
        .map(str::trim_start)
        .filter_map(|l| l.strip_prefix("-h, ").or(Some(l)))
        .filter(|l| l.starts_with("--"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .filter(|f| !["--config", "--check", "--help", "--version"].contains(&f.as_str()))
        .collect();
    assert!(flags.contains("--listen") && flags.contains("--heartbeat-ms"), "{help}");
    let listed: BTreeSet<String> = CONFIG_KEYS.iter().filter(|k| !k.flag.is_empty()).map(|k| k.flag.to_string()).collect();
    assert_eq!(listed, flags, "flags of {TABLE_SOURCE} against `tally server --help`");
}

/// A key's written default as a TOML value: a number bare, text quoted.
fn toml_value(v: &str) -> String {
    if v.parse::<u64>().is_ok() {
        v.to_string()
    } else {
        format!("{v:?}")
    }
}

#[test]
fn config_defaults_are_resolves() {
    let defaults = ServerFile::parse("").unwrap().resolve().unwrap();
    let mut checked = 0;
    for k in CONFIG_KEYS.iter().filter(|k| !k.default.is_empty()) {
        let text = format!("{} = {}\n", k.key, toml_value(k.default));
        let set = ServerFile::parse(&text).and_then(|f| f.resolve()).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(set, defaults, "{}: the table says the default is {}, the code resolves otherwise", k.key, k.default);
        checked += 1;
    }
    assert!(checked >= 18, "{checked}");
    // Those without a value: unset in the resolved configuration.
    assert!(defaults.provider.is_none() && defaults.fabric_addr.is_none() && defaults.token_file.is_none());
    assert!(defaults.metrics.is_none() && defaults.nics.is_empty());
    for k in ["provider", "fabric_addr", "token_file", "metrics", "nics"] {
        assert!(settings::config_key(k).unwrap().default.is_empty(), "{k}");
    }
    // The named constants.
    let row = |k: &str| settings::config_key(k).unwrap().default.parse::<u64>().unwrap();
    assert_eq!(row("heartbeat_ms"), tally_engine::host::config::DEFAULT_HEARTBEAT_MS);
    assert_eq!(row("stage_buffers"), tally_engine::host::config::DEFAULT_STAGE_BUFFERS as u64);
    assert_eq!(row("max_ranks"), tally_engine::wire::MAX_RANKS as u64);
}

fn env_default(name: &str) -> &'static str {
    let v = settings::env_var(name).unwrap_or_else(|| panic!("{name}: no row"));
    assert!(!v.default.is_empty(), "{name}: no written default");
    v.default
}

fn size(name: &str) -> usize {
    tally_engine::host::units::parse_size(env_default(name)).unwrap_or_else(|e| panic!("{name}: {e}")) as usize
}

fn number(name: &str) -> u64 {
    env_default(name).parse().unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The only test that touches this process's environment: the others run
/// the binary with the variables they need.
#[test]
fn env_defaults_are_the_codes() {
    for (k, _) in std::env::vars() {
        if k.starts_with("TALLY_") {
            std::env::remove_var(k);
        }
    }
    use tally_engine::client::{ClientConfig, DEFAULT_LIVENESS_MS, MIN_SPREAD_PIECE};
    let c = ClientConfig::new(vec![], 1, 0, 1);
    assert_eq!(c.chunk_bytes, size("TALLY_CHUNK"));
    // The window is left to the client (0: `auto_window` of the chunk, at connect).
    assert_eq!((env_default("TALLY_WINDOW"), c.window), ("auto", 0));
    assert_eq!(c.send_credits as u64, number("TALLY_SEND_CREDITS"));
    assert_eq!(c.min_piece, size("TALLY_MIN_PIECE"));
    assert_eq!(MIN_SPREAD_PIECE, size("TALLY_MIN_PIECE"));
    for (name, on) in [
        ("TALLY_FAILOVER", c.failover),
        ("TALLY_RELAY", c.relay),
        ("TALLY_SPLIT", c.split),
        ("TALLY_COPIER", c.copier),
        ("TALLY_CALLER_RAIL", c.caller_rail),
    ] {
        assert_eq!(number(name), on as u64, "{name}");
    }
    assert_eq!(c.rails as u64, number("TALLY_RAILS"));
    assert!(c.rail_cores.is_empty());
    assert_eq!(c.liveness.as_millis() as u64, number("TALLY_LIVENESS_MS"));
    assert_eq!(DEFAULT_LIVENESS_MS, number("TALLY_LIVENESS_MS"));
    assert_eq!(c.provider_watchdog.as_secs(), number("TALLY_PROVIDER_WATCHDOG_S"));
    assert_eq!(c.join_timeout.as_secs(), number("TALLY_JOIN_TIMEOUT_S"));
    // The plugin keeps ClientConfig's timeout while TALLY_TIMEOUT_S is unset.
    assert_eq!(c.timeout.as_secs(), number("TALLY_TIMEOUT_S"));
    assert!(c.token.is_empty());
    // Setting each to its written default changes nothing.
    let unset = format!("{c:?}");
    for name in [
        "TALLY_CHUNK",
        "TALLY_WINDOW",
        "TALLY_SEND_CREDITS",
        "TALLY_MIN_PIECE",
        "TALLY_FAILOVER",
        "TALLY_RELAY",
        "TALLY_SPLIT",
        "TALLY_COPIER",
        "TALLY_CALLER_RAIL",
        "TALLY_RAILS",
        "TALLY_LIVENESS_MS",
        "TALLY_PROVIDER_WATCHDOG_S",
        "TALLY_JOIN_TIMEOUT_S",
    ] {
        std::env::set_var(name, env_default(name));
        let set = format!("{:?}", ClientConfig::new(vec![], 1, 0, 1));
        std::env::remove_var(name);
        assert_eq!(set, unset, "{name}={} is not the default", env_default(name));
    }

    assert_eq!(tally_engine::dataplane::lcore::adaptive_spin() as u64, number("TALLY_ADAPTIVE_SPIN"));
    match tally_engine::dataplane::lcore::PollMode::ADAPTIVE {
        tally_engine::dataplane::lcore::PollMode::Adaptive { spin_polls, .. } => {
            assert_eq!(spin_polls as u64, number("TALLY_ADAPTIVE_SPIN"))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(tally_engine::ring::DEFAULT_CHUNK_BYTES, size("TALLY_RING_CHUNK"));
    assert_eq!(tally_engine::ring::DEFAULT_WINDOW as u64, number("TALLY_RING_WINDOW"));
    // The heartbeat and liveness times go together: eight heartbeats.
    assert_eq!(DEFAULT_LIVENESS_MS, 8 * tally_engine::host::config::DEFAULT_HEARTBEAT_MS);
}

/// `tally settings --markdown`: marker line -> the table lines after it.
fn generated() -> BTreeMap<String, String> {
    let o = Command::new(env!("CARGO_BIN_EXE_tally")).args(["settings", "--markdown"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8(o.stdout).unwrap();
    let tables = tables_after_markers(&out);
    assert_eq!(tables.len(), Table::ALL.len(), "{out}");
    for t in Table::ALL {
        assert_eq!(tables.get(&t.marker()).map(|v| v.len()), Some(1), "{}", t.marker());
        assert_eq!(tables[&t.marker()][0], t.markdown(), "the CLI prints the library's table");
    }
    tables.into_iter().map(|(k, mut v)| (k, v.remove(0))).collect()
}

/// Each marker line of a document and the `|` lines right after it (as
/// many times as the marker occurs).
fn tables_after_markers(doc: &str) -> BTreeMap<String, Vec<String>> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("<!-- tally settings --markdown") {
            let table: String = lines[i + 1..].iter().take_while(|t| t.starts_with('|')).map(|t| format!("{t}\n")).collect();
            out.entry(l.to_string()).or_default().push(table);
        }
    }
    out
}

#[test]
fn docs_hold_the_generated_tables() {
    let gen = generated();
    for (doc, wanted) in [("README.md", &[Table::Env, Table::Config, Table::Development][..]), ("docs/nccl.md", &[Table::Workers][..])] {
        let text = read(doc);
        let found = tables_after_markers(&text);
        let names: BTreeSet<&String> = found.keys().collect();
        let expected: Vec<String> = wanted.iter().map(|t| t.marker()).collect();
        assert_eq!(names, expected.iter().collect(), "{doc}: the settings tables it holds");
        for t in wanted {
            let copies = &found[&t.marker()];
            assert_eq!(copies.len(), 1, "{doc}: {} more than once", t.marker());
            let (have, want) = (&copies[0], &gen[&t.marker()]);
            if have != want {
                let have_rows: BTreeSet<&str> = have.lines().collect();
                let want_rows: BTreeSet<&str> = want.lines().collect();
                panic!(
                    "{doc}: the table after {} is not `tally settings --markdown --table {}`'s\n  stale or edited: {:?}\n  missing: {:?}\n(paste the command's output in its place)",
                    t.marker(),
                    t.name(),
                    have_rows.difference(&want_rows).collect::<Vec<_>>(),
                    want_rows.difference(&have_rows).collect::<Vec<_>>()
                );
            }
        }
    }
}

#[test]
fn one_table_and_plain_text() {
    let tally = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_tally")).args(args).output().unwrap();
    let o = tally(&["settings", "--markdown", "--table", "workers"]);
    assert!(o.status.success());
    assert_eq!(String::from_utf8(o.stdout).unwrap(), format!("{}\n{}", Table::Workers.marker(), Table::Workers.markdown()));
    // Text: every operator variable and key, no markdown.
    let o = tally(&["settings"]);
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(!text.contains('`') && !text.contains("|---"), "{text}");
    for v in ENV {
        assert!(text.lines().any(|l| l.starts_with(&format!("{} ", v.name))), "{} missing from `tally settings`", v.name);
    }
    for k in CONFIG_KEYS {
        assert!(text.lines().any(|l| l.starts_with(&format!("{} ", k.key))), "{} missing from `tally settings`", k.key);
    }
    // A table that does not exist is refused, naming the ones that do.
    let o = tally(&["settings", "--table", "nope"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown table \"nope\": expected one of env, workers, config, development"), "{err}");
}

/// A script's default is the `${NAME:-DEFAULT}` it expands, where it has one.
#[test]
fn script_defaults_are_the_scripts() {
    let scripts = script_names();
    let mut checked = 0;
    for v in ENV.iter().filter(|v| v.readers == [settings::Reader::Scripts] && !v.default.is_empty()) {
        let files = scripts.get(v.name).unwrap_or_else(|| panic!("{}: no script uses it", v.name));
        let expansion = format!("${{{}:-{}}}", v.name, v.default);
        assert!(
            files.iter().any(|f| read(f).contains(&expansion)),
            "{}: the table says the default is {}, but no script of {files:?} expands {expansion}",
            v.name,
            v.default
        );
        checked += 1;
    }
    assert!(checked >= 3, "{checked}");
}
