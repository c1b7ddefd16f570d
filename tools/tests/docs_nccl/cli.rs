//! The `tally` CLI as the page uses it: invocations found in a line,
//! checked by clap through `--help`, and the harmless ones run for real.

use super::*;

pub(crate) fn tally() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tally"));
    // The decisions read these; the test's own environment must not leak in.
    for v in
        ["FI_EFA_FORK_SAFE", "FI_EFA_USE_HUGE_PAGE", "RDMAV_FORK_SAFE", "IBV_FORK_SAFE", "FI_PROVIDER", "TALLY_PROVIDER", "TALLY_TOKEN"]
    {
        c.env_remove(v);
    }
    c.env("TALLY_LOG", "warn").current_dir(repo());
    c
}

/// The `tally` invocations of a line: its command (after `VAR=value`
/// words), and any inside `$(...)`, each up to the first shell operator.
pub(crate) fn tally_invocations(line: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut w = words(line);
    while w.first().is_some_and(|x| is_assignment(x)) {
        w.remove(0);
    }
    if w.first().is_some_and(|x| x == "tally") {
        found.push(w);
    }
    let mut rest = line;
    while let Some(a) = rest.find("$(tally ") {
        rest = &rest[a + 2..];
        let end = rest.find(')').expect("closing parenthesis");
        found.push(words(&rest[..end]));
        rest = &rest[end..];
    }
    for f in &mut found {
        if let Some(k) = f.iter().position(|x| [">", ">>", "|", "&&", ";", "2>&1", "||"].contains(&x.as_str()) || x.starts_with('>')) {
            f.truncate(k);
        }
    }
    found
}

pub(crate) fn is_assignment(w: &str) -> bool {
    w.split_once('=').is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
}

/// What `--help` says about a subcommand: its path and what it requires.
pub(crate) struct Usage {
    pub(crate) path: Vec<String>,
    pub(crate) required_flags: Vec<String>,
    pub(crate) required_args: usize,
    pub(crate) takes_value: BTreeSet<String>,
}

pub(crate) fn parse_help(help: &str) -> Usage {
    let usage = help.lines().find_map(|l| l.strip_prefix("Usage: ")).expect("a Usage: line");
    let toks: Vec<&str> = usage.split_whitespace().collect();
    let path: Vec<String> = toks.iter().skip(1).take_while(|t| !t.starts_with(['[', '<', '-'])).map(|t| t.to_string()).collect();
    let (mut required_flags, mut required_args) = (Vec::new(), 0);
    let mut i = 1 + path.len();
    while i < toks.len() {
        let t = toks[i];
        if t.starts_with("--") {
            required_flags.push(t.to_string());
            if toks.get(i + 1).is_some_and(|n| n.starts_with('<')) {
                i += 1;
            }
        } else if t.starts_with('<') {
            required_args += 1;
        }
        i += 1;
    }
    let mut takes_value = BTreeSet::new();
    for l in help.lines().map(str::trim_start) {
        let l = l.strip_prefix("-h, ").unwrap_or(l);
        if let Some(rest) = l.strip_prefix("--") {
            let mut it = rest.split_whitespace();
            let name = it.next().unwrap_or_default();
            if it.next().is_some_and(|v| v.starts_with('<')) {
                takes_value.insert(format!("--{name}"));
            }
        }
    }
    Usage { path, required_flags, required_args, takes_value }
}

/// The CLI accepts `args` (after `tally`): every word parses, and nothing
/// required is missing (unless `args` only names the subcommand, as prose
/// does: "`tally stats` shows ..."). Returns the subcommand path.
pub(crate) fn check_cli(args: &[String], what: &str) -> Vec<String> {
    let args: Vec<String> = args.iter().map(|a| substitute(a)).collect();
    let o = tally().args(&args[1..]).arg("--help").output().unwrap();
    assert!(o.status.success(), "{what}: the tally CLI refuses `{}`:\n{}", args.join(" "), show(&o));
    let u = parse_help(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(&args[1..1 + u.path.len()], &u.path[..], "{what}: subcommand path");
    let (mut flags, mut positional) = (BTreeSet::new(), 0);
    let mut i = 1 + u.path.len();
    while i < args.len() {
        let a = &args[i];
        if let Some(name) = a.strip_prefix("--").map(|n| format!("--{}", n.split('=').next().unwrap())) {
            if !a.contains('=') && u.takes_value.contains(&name) {
                i += 1;
            }
            flags.insert(name);
        } else {
            positional += 1;
        }
        i += 1;
    }
    if args.len() == 1 + u.path.len() && what.contains("inline") {
        return u.path;
    }
    for f in &u.required_flags {
        assert!(flags.contains(f), "{what}: `{}` lacks the required {f}", args.join(" "));
    }
    assert!(positional >= u.required_args, "{what}: `{}` lacks a required argument", args.join(" "));
    u.path
}

/// Subcommands that change nothing and end by themselves: run for real.
pub(crate) fn runs_here(path: &[String], args: &[String]) -> bool {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    matches!(p.as_slice(), ["efa-env", _] | ["doctor"] | ["bench", "reduce"] | ["hugepages", "show"])
        || (p == ["server"] && args.iter().any(|a| a == "--check"))
}

/// Installed path -> repository file, from the page's `install [-D] -m MODE SRC DEST` lines.
pub(crate) fn installed_files(cmds: &[DocCmd]) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for c in cmds {
        for part in c.text.split(" && ") {
            let w = words(part);
            if w.first().map(String::as_str) != Some("install") || w.len() < 3 {
                continue;
            }
            let (src, dest) = (&w[w.len() - 2], &w[w.len() - 1]);
            if repo().join(src).is_file() && dest.starts_with('/') {
                let dest = if dest.ends_with('/') {
                    format!("{dest}{}", Path::new(src).file_name().unwrap().to_str().unwrap())
                } else {
                    dest.clone()
                };
                map.insert(dest, src.clone());
            }
        }
    }
    map
}

pub(crate) fn run_for_real(args: &[String], path: &[String], installed: &BTreeMap<String, String>, what: &str) {
    let args: Vec<String> = args.iter().map(|a| installed.get(a.as_str()).cloned().unwrap_or_else(|| substitute(a))).collect();
    for a in &args {
        assert!(!a.starts_with("/etc/"), "{what}: {a} is not a file the page installs from the repository");
    }
    let o = tally().args(&args[1..]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match p.as_slice() {
        ["doctor"] => {
            // A host without EFA, hugepages or those cores fails checks: the
            // report must still be there, and the exit code says so.
            assert!(matches!(o.status.code(), Some(0 | 1)), "{what}:\n{}", show(&o));
            assert!(out.starts_with("tally doctor: checking against"), "{what}:\n{}", show(&o));
            assert!(out.lines().any(|l| l.contains(" passed, ") && l.contains(" failed")), "{what}:\n{}", show(&o));
        }
        ["server"] => {
            // --check also checks this host (lcores, provider, hugepages,
            // ports): a configuration for another host is refused with the
            // reasons a start there would not meet, never a parse error.
            let err = String::from_utf8_lossy(&o.stderr);
            let refused_here = o.status.code() == Some(1) && err.contains("a start would fail:");
            assert!(refused_here || (o.status.success() && out.starts_with("configuration ok: ")), "{what}:\n{}", show(&o));
        }
        ["efa-env", "print"] => {
            assert!(o.status.success(), "{what}:\n{}", show(&o));
            let systemd = args.windows(2).any(|w| w[0] == "--format" && w[1] == "systemd");
            for l in out.lines().filter(|l| !l.starts_with('#')) {
                let ok = if systemd { l.split_once('=').is_some() } else { l.starts_with("export ") || l.starts_with("unset ") };
                assert!(ok, "{what}: line {l:?}:\n{}", show(&o));
            }
            assert!(out.contains("FI_EFA_FORK_SAFE"), "{what}:\n{}", show(&o));
        }
        ["bench", "reduce"] => {
            assert!(o.status.success(), "{what}:\n{}", show(&o));
            assert!(out.contains("GB/s") && out.contains("roofline"), "{what}:\n{}", show(&o));
        }
        ["hugepages", "show"] => {
            assert!(o.status.success(), "{what}:\n{}", show(&o));
            assert!(out.starts_with("Pool "), "{what}:\n{}", show(&o));
        }
        _ => assert!(o.status.success(), "{what}:\n{}", show(&o)),
    }
}
