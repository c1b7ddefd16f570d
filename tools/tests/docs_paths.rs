//! Every repository path the documentation names exists.
//!
//! ARCHITECTURE.md is the map a newcomer reads first, and README.md,
//! scripts/README.md and docs/ point into the tree as well: a file moved or
//! renamed without its mentions leaves the map pointing nowhere (a stale
//! `server/budget.rs` lived on for weeks that way). Two kinds of mention are
//! checked, in every line of those pages:
//!
//! - a path from the repository root (`engine/...`, `tools/...`,
//!   `scripts/...`, ...), in code spans or prose: it must exist, after
//!   expanding `{a,b}` alternatives; a `*` pattern is left alone;
//! - a relative path in a code span (`shard/chunk.rs`, `rails/rail_loop.rs`:
//!   two or more components, ending in a file name with an extension): some
//!   file of the repository must end with those components;
//! - a file name alone (`doctor.rs`, `cluster_proof.sh`), in a code span with
//!   a known extension or anywhere as a `.rs` name: some file of the
//!   repository must have that name. (Three such names outlived their files
//!   in ARCHITECTURE.md while this check skipped them.) Names of other
//!   projects' files in prose (`platform.md`, `efa_installer.sh`) are left
//!   alone; a Rust file named in the docs is always ours.
//!
//! Paths outside the repository (absolute ones, `$VARS`, `~`, URLs), build
//! outputs (`target/`) and placeholders (a component in capitals, as in
//! `parts/NAME.sh`, other than the usual README-style names) are skipped.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

mod repo_tree;
use repo_tree::{files_under, repo};

/// The top-level folders a path from the root starts with.
const ROOTS: &[&str] =
    &["engine/", "ffi-plugin/", "tools/", "benches/", "scripts/", "tests/", "config/", "docs/", "docker/", "fuzz/", ".ci/", "python/"];

/// File name extensions that make a relative code span a path.
const EXTENSIONS: &[&str] = &["rs", "sh", "py", "md", "toml", "yaml", "yml", "json", "service", "sbatch", "c", "h"];

/// The pages checked: the root's Markdown files, scripts/README.md and docs/.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        ["ARCHITECTURE.md", "README.md", "scripts/README.md"].iter().map(|p| root.join(p)).filter(|p| p.exists()).collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

/// `a/{b,c}.rs` -> `a/b.rs`, `a/c.rs` (nested alternatives too).
fn expand(p: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (p.find('{'), p.find('}')) else { return vec![p.to_string()] };
    if close < open {
        return vec![p.to_string()];
    }
    p[open + 1..close].split(',').flat_map(|alt| expand(&format!("{}{alt}{}", &p[..open], &p[close + 1..]))).collect()
}

/// `parts/NAME.sh`: a component whose stem is in capitals stands for any
/// name (README.md and its kind are real files).
fn is_placeholder(p: &str) -> bool {
    p.split('/').any(|c| {
        let stem = c.split('.').next().unwrap_or(c);
        !stem.is_empty()
            && stem.chars().all(|ch| ch.is_ascii_uppercase() || ch == '_')
            && !["README", "ARCHITECTURE", "LICENSE", "CHANGELOG"].contains(&stem)
    })
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-./{},*".contains(c)
}

/// Paths from the root mentioned anywhere in `line`.
fn rooted_mentions(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in line.char_indices() {
        let before = line[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || "_/.-$~".contains(c)) {
            continue;
        }
        let rest = &line[i..];
        if !ROOTS.iter().any(|r| rest.starts_with(r)) {
            continue;
        }
        let end = rest.find(|c: char| !is_path_char(c)).unwrap_or(rest.len());
        // A sentence's full stop or comma is not part of the path.
        let p = rest[..end].trim_end_matches(['.', ',']);
        out.push(p.to_string());
    }
    out
}

/// Relative paths in the code spans of `line`: two or more components,
/// ending in a file name with a known extension.
fn relative_mentions(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (k, span) in line.split('`').enumerate() {
        if k % 2 == 0 || !span.chars().all(is_path_char) || ROOTS.iter().any(|r| span.starts_with(r)) {
            continue;
        }
        if span.starts_with(['.', '/']) || span.starts_with("target/") || !span.contains('/') {
            continue;
        }
        let ext_ok = span.rsplit('.').next().is_some_and(|x| EXTENSIONS.contains(&x.trim_end_matches('}')));
        if ext_ok && span.rsplit('/').next().is_some_and(|f| f.contains('.')) {
            out.push(span.to_string());
        }
    }
    out
}

/// File names alone in `line`: code spans of one component with a known
/// extension, and `.rs` names anywhere.
fn name_mentions(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (k, span) in line.split('`').enumerate() {
        let one = span.contains('.') && !span.contains('/') && span.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if k % 2 == 1 && one && !span.starts_with('.') && span.rsplit('.').next().is_some_and(|x| EXTENSIONS.contains(&x)) {
            out.push(span.to_string());
        }
    }
    for (i, _) in line.match_indices(".rs") {
        let after = line[i + 3..].chars().next();
        if after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let start = line[..i].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).map_or(0, |j| j + 1);
        let before = line[..start].chars().next_back();
        // Part of a path (checked above) or of a longer word.
        if start == i || before.is_some_and(|c| c == '/' || c == '.') {
            continue;
        }
        let name = &line[start..i + 3];
        if !out.iter().any(|o| o == name) {
            out.push(name.to_string());
        }
    }
    out
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = repo();
    let files: BTreeSet<String> = files_under(&root, "").into_iter().collect();
    let dirs: BTreeSet<String> = files.iter().flat_map(|f| f.match_indices('/').map(move |(i, _)| f[..i].to_string())).collect();
    let exists = |p: &str| {
        let p = p.trim_end_matches('/');
        files.contains(p) || dirs.contains(p)
    };
    let names: BTreeSet<&str> = files.iter().map(|f| f.rsplit('/').next().unwrap_or(f)).collect();
    let mut stale = Vec::new();
    let mut checked = 0;
    for page in pages(&root) {
        let rel = page.strip_prefix(&root).expect("under the root").display().to_string();
        let text = std::fs::read_to_string(&page).expect("readable page");
        for (n, line) in text.lines().enumerate() {
            for m in rooted_mentions(line) {
                for p in expand(&m) {
                    if p.contains('*') || is_placeholder(&p) {
                        continue;
                    }
                    checked += 1;
                    if !exists(&p) {
                        stale.push(format!("{rel}:{}: {p}", n + 1));
                    }
                }
            }
            for m in name_mentions(line).into_iter().filter(|p| !is_placeholder(p)) {
                checked += 1;
                if !names.contains(m.as_str()) {
                    stale.push(format!("{rel}:{}: {m} (no file has that name)", n + 1));
                }
            }
            for m in relative_mentions(line) {
                for p in expand(&m).into_iter().filter(|p| !is_placeholder(p)) {
                    checked += 1;
                    let tail = format!("/{p}");
                    if !files.contains(&p) && !files.iter().any(|f| f.ends_with(&tail)) {
                        stale.push(format!("{rel}:{}: {p} (no file ends with it)", n + 1));
                    }
                }
            }
        }
    }
    // The pages do name the tree: a parser that found nothing would pass anything.
    assert!(checked > 200, "only {checked} paths found in the docs");
    assert!(stale.is_empty(), "paths the docs name that do not exist:\n  {}", stale.join("\n  "));
}

#[test]
fn the_parser_finds_what_the_check_relies_on() {
    assert_eq!(expand("engine/src/reduce/{avx2,avx512}.rs"), ["engine/src/reduce/avx2.rs", "engine/src/reduce/avx512.rs"]);
    assert_eq!(rooted_mentions("see `engine/src/ring.rs`, then scripts/device/pack.sh."), ["engine/src/ring.rs", "scripts/device/pack.sh"]);
    // Not from the root: an absolute path, a variable, a longer word.
    assert!(rooted_mentions("/opt/tally/engine/x $OUT/docs/y myengine/z").is_empty());
    assert_eq!(
        relative_mentions("in `shard/chunk.rs` and `rails/rail_loop.rs`, not `a/b` or `x.rs`"),
        ["shard/chunk.rs", "rails/rail_loop.rs"]
    );
    assert!(relative_mentions("`/etc/tally/server.toml` `target/release/tally` `./x/y.sh`").is_empty());
    assert!(is_placeholder("device/parts/NAME.sh") && !is_placeholder("scripts/README.md"));
    assert_eq!(
        name_mentions("host checks (`doctor.rs`, `efa_env.rs`), in server_cmd.rs; not `a/b.rs`, engine/x.rs, `demo.log` or measuring.md"),
        ["doctor.rs", "efa_env.rs", "server_cmd.rs"]
    );
}
