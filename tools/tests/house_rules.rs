//! The rules of the house that the code keeps by itself, checked on every
//! `make test` (they read files only: no build, no network, milliseconds).
//!
//! - **No source file over [`MAX_LINES`] lines**, outside the short list of
//!   [`LONG_FILES`] (SIMD kernels and generated bindings, each with its
//!   reason). A file that grows past it holds two concepts: split it.
//!   (`engine/src/client/rails.rs` grew from 697 to 843 lines in four
//!   commits before its queue types moved out.)
//! - **No `use super::*` in `engine/src`** outside `#[cfg(test)]` modules: a
//!   file names what it takes from its parent, so a reader (or a tool)
//!   following a name knows where it comes from.
//! - **The layer table of ARCHITECTURE.md is the code's**: the table under
//!   "Layers and what may call what" says, for each folder of `engine/src`,
//!   which others it may use; every `crate::` path in the code (its `use`
//!   lines and inline paths, comments left out) must be one of them. A new
//!   folder must get a row.
//! - **The client is a tree** (`engine/src/client`, issue 58): a type's
//!   `impl` blocks live in the file that defines the type (no file adds
//!   methods to another's `Client`: a call then shows as an import of the
//!   callee's file), and the files' imports (`use` lines and inline
//!   `crate::client::`, `super::`, `self::` and child-module paths,
//!   comments and test modules left out) have no cycle: no two files that
//!   use each other, no loop through several.
//!
//! Each failure names the file and line, and the rule's own parsing is
//! checked on small examples at the end, so a parser that finds nothing
//! cannot pass everything.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

mod repo_tree;
use repo_tree::{files_under, repo};

/// The most lines a source file may have.
const MAX_LINES: usize = 700;

/// Files allowed past [`MAX_LINES`], each with its reason: only SIMD kernels
/// (one body per ISA, long by nature and read as a table) and generated
/// bindings. Empty today: the kernels fit (`engine/src/reduce/avx512.rs` is
/// the longest) and the libfabric bindings are generated into the build
/// directory (`dataplane/fabric/sys.rs` only includes them). An entry that
/// no longer needs its place is reported, so the list cannot go stale.
const LONG_FILES: &[(&str, &str)] = &[];

/// The source files the size rule covers, by extension.
const SOURCE_EXTENSIONS: &[&str] = &["rs", "py", "sh", "c", "h"];

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn no_source_file_is_over_700_lines() {
    let root = repo();
    let mut long = Vec::new();
    let mut checked = 0;
    for rel in files_under(&root, "") {
        if !rel.rsplit('.').next().is_some_and(|x| SOURCE_EXTENSIONS.contains(&x)) || rel.contains("/.") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join(&rel)) else { continue };
        checked += 1;
        let lines = text.lines().count();
        let excused = LONG_FILES.iter().any(|(p, _)| *p == rel);
        if lines > MAX_LINES && !excused {
            long.push(format!("{rel}: {lines} lines"));
        }
        if excused && lines <= MAX_LINES {
            long.push(format!("{rel}: {lines} lines, no longer needs its place in LONG_FILES"));
        }
    }
    for (p, _) in LONG_FILES {
        assert!(root.join(p).exists(), "LONG_FILES names {p}, which does not exist");
    }
    assert!(checked > 250, "only {checked} source files found");
    assert!(long.is_empty(), "source files over {MAX_LINES} lines (split them by concept):\n  {}", long.join("\n  "));
}

/// Whether `line` is a `#[cfg(...)]` that holds only under test:
/// `#[cfg(test)]`, `#[cfg(all(test, target_arch = "x86_64"))]`.
fn is_test_cfg(line: &str) -> bool {
    let t = line.trim();
    t == "#[cfg(test)]" || (t.starts_with("#[cfg(all(") && t.contains("(test,"))
}

/// The line ranges (0-based, inclusive start, exclusive end) of a file's
/// `#[cfg(test)]` inline modules.
fn test_regions(lines: &[&str]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if is_test_cfg(lines[i]) {
            let indent = lines[i].len() - lines[i].trim_start().len();
            if let Some(open) = lines.get(i + 1).filter(|l| l.trim_start().starts_with("mod ") && l.trim_end().ends_with('{')) {
                let _ = open;
                let close = format!("{}}}", " ".repeat(indent));
                let end = (i + 2..lines.len()).find(|&k| lines[k] == close).unwrap_or(lines.len());
                out.push((i, end + 1));
                i = end;
            }
        }
        i += 1;
    }
    out
}

/// The module files a parent declares under `#[cfg(test)]` (`mod tests;`):
/// `dir/name.rs` and `dir/name/mod.rs`.
fn test_module_files(root: &Path, files: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for rel in files.iter().filter(|f| f.ends_with(".rs")) {
        let text = read(root, rel);
        let lines: Vec<&str> = text.lines().collect();
        let dir = match rel.rsplit_once('/') {
            Some((d, f)) if f == "mod.rs" || f == "lib.rs" => d.to_string(),
            _ => rel.trim_end_matches(".rs").to_string(),
        };
        for w in lines.windows(2) {
            if !is_test_cfg(w[0]) {
                continue;
            }
            let decl = w[1].trim().trim_start_matches("pub ").trim_start_matches("pub(crate) ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
                out.insert(format!("{dir}/{name}.rs"));
                out.insert(format!("{dir}/{name}/mod.rs"));
            }
        }
    }
    out
}

/// `use super::*;` lines of `engine/src` outside test modules, as `file:line`.
fn glob_imports(root: &Path) -> Vec<String> {
    let files = files_under(root, "engine/src");
    let test_files = test_module_files(root, &files);
    let mut found = Vec::new();
    for rel in files.iter().filter(|f| f.ends_with(".rs") && !test_files.contains(*f)) {
        let text = read(root, rel);
        let lines: Vec<&str> = text.lines().collect();
        let tests = test_regions(&lines);
        for (n, line) in lines.iter().enumerate() {
            let t = line.trim();
            let glob = t.starts_with("use super::*") || (t.starts_with("pub") && t.contains(" use super::*"));
            if glob && !tests.iter().any(|&(a, b)| (a..b).contains(&n)) {
                found.push(format!("{rel}:{}: {t}", n + 1));
            }
        }
    }
    found
}

#[test]
fn engine_files_name_what_they_import() {
    let found = glob_imports(&repo());
    assert!(found.is_empty(), "`use super::*` outside a #[cfg(test)] module (name each import):\n  {}", found.join("\n  "));
}

/// One row of the layer table: a module (`ring::bootstrap`) and the paths
/// of the crate it may use (`dataplane::fabric`, `host`).
#[derive(Debug, PartialEq)]
struct Row {
    module: Vec<String>,
    may_use: Vec<Vec<String>>,
}

/// The code spans of a Markdown table cell.
fn spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The layer table: the Markdown table under "## Layers and what may call
/// what" whose header is `| module | may use |`. In a row's second cell,
/// the code spans that name a top-level module of the crate, alone or as a
/// path (`dataplane::fabric`), are what it may use; spans after the word
/// "never", and spans that are not module paths (item names in brackets),
/// are prose.
fn layer_table(architecture: &str, top: &BTreeSet<String>) -> Vec<Row> {
    let section = architecture
        .split("\n## ")
        .find(|s| s.starts_with("Layers and what may call what"))
        .expect("ARCHITECTURE.md has the layers section");
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in section.lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() == 2 && cells[0] == "module" && cells[1] == "may use" {
            in_table = true;
            continue;
        }
        if !in_table || !line.starts_with('|') {
            if in_table {
                break;
            }
            continue;
        }
        if cells[0].starts_with("---") {
            continue;
        }
        let allowed = cells.get(1).map_or("", |c| c.split(" never ").next().unwrap_or(""));
        let may_use: Vec<Vec<String>> = spans(allowed)
            .into_iter()
            .map(|s| s.split("::").map(str::to_string).collect::<Vec<_>>())
            .filter(|p| top.contains(&p[0]) && p.iter().all(|c| c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_')))
            .collect();
        for m in spans(cells[0]) {
            rows.push(Row { module: m.split("::").map(str::to_string).collect(), may_use: may_use.clone() });
        }
    }
    rows
}

/// The top-level modules `engine/src/lib.rs` declares.
fn top_modules(lib: &str) -> BTreeSet<String> {
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")))
        .filter_map(|l| l.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

/// `engine/src/ring/bootstrap.rs` -> `ring::bootstrap` (a `mod.rs` is its folder).
fn module_of(rel: &str) -> Vec<String> {
    let p = rel.trim_start_matches("engine/src/").trim_end_matches(".rs");
    let mut m: Vec<String> = p.split('/').map(str::to_string).collect();
    if m.last().is_some_and(|l| l == "mod") {
        m.pop();
    }
    m
}

/// `a::{b, c::{d, e}}` -> `a::b`, `a::c::d`, `a::c::e`.
fn expand_use(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else { return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_string()] };
    let head = tree[..open].trim_end_matches("::");
    let body = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for c in body.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    parts
        .iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| expand_use(p))
        .map(|p| if p == "self" { head.to_string() } else { format!("{head}::{p}") })
        .collect()
}

/// Every path into the crate a file names, with its line: `use crate::...`
/// statements (expanded) and inline `crate::a::b` paths, comments left out.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut n = 0;
    while n < lines.len() {
        let code = lines[n].split(" //").next().unwrap_or("");
        let t = code.trim();
        if t.starts_with("//") {
            n += 1;
            continue;
        }
        let stmt_start = t.find("use crate::").filter(|&i| t[..i].trim().is_empty() || t[..i].trim().starts_with("pub"));
        if let Some(i) = stmt_start {
            let mut stmt = t[i + "use crate::".len()..].to_string();
            let first = n;
            while !stmt.trim_end().ends_with(';') && n + 1 < lines.len() {
                n += 1;
                stmt.push_str(lines[n].trim());
            }
            for p in expand_use(stmt.trim_end().trim_end_matches(';')) {
                out.push((first + 1, p));
            }
        } else {
            for (i, _) in code.match_indices("crate::") {
                let before = code[..i].chars().next_back();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == ':') {
                    continue;
                }
                let rest = &code[i + "crate::".len()..];
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
                out.push((n + 1, rest[..end].trim_end_matches(':').to_string()));
            }
        }
        n += 1;
    }
    out
}

/// Imports the layer table does not allow, as `file:line: path (rule)`.
fn layer_breaches(root: &Path) -> Vec<String> {
    let top = top_modules(&read(root, "engine/src/lib.rs"));
    let rows = layer_table(&read(root, "ARCHITECTURE.md"), &top);
    let mut out = Vec::new();
    for t in &top {
        if !rows.iter().any(|r| &r.module[0] == t) {
            out.push(format!("engine/src/{t}: module `{t}` has no row in ARCHITECTURE.md's layer table"));
        }
    }
    for rel in files_under(root, "engine/src").iter().filter(|f| f.ends_with(".rs") && *f != "engine/src/lib.rs") {
        let module = module_of(rel);
        // The most specific row: `ring::bootstrap` before `ring`.
        let Some(row) = rows.iter().filter(|r| module.starts_with(&r.module)).max_by_key(|r| r.module.len()) else {
            continue;
        };
        for (line, path) in crate_paths(&read(root, rel)) {
            let p: Vec<String> = path.split("::").map(str::to_string).collect();
            if p.starts_with(&row.module) || row.may_use.iter().any(|a| p.starts_with(a)) {
                continue;
            }
            let allowed: Vec<String> = row.may_use.iter().map(|a| a.join("::")).collect();
            out.push(format!(
                "{rel}:{line}: crate::{path} (`{}` may use {} only)",
                row.module.join("::"),
                if allowed.is_empty() { "nothing of the crate".to_string() } else { allowed.join(", ") }
            ));
        }
    }
    out
}

#[test]
fn imports_keep_the_layer_table() {
    let breaches = layer_breaches(&repo());
    assert!(
        breaches.is_empty(),
        "imports the layer table of ARCHITECTURE.md does not allow (move the code, or change the table if the design changed):\n  {}",
        breaches.join("\n  ")
    );
}

#[test]
fn the_rules_parse_what_they_rely_on() {
    let top: BTreeSet<String> = ["reduce", "wire", "client", "control", "dataplane"].iter().map(|s| s.to_string()).collect();
    let table = "\n## Layers and what may call what\n\n| module | may use |\n|---|---|\n\
                 | `reduce`, `ring::bootstrap` | nothing of the crate |\n\
                 | `client` | `dataplane::fabric` (`precise_naps`), `wire`; never `control` |\n\n## Next\n| module | may use |\n";
    let rows = layer_table(table, &top);
    let path = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[1], Row { module: path("ring::bootstrap"), may_use: vec![] });
    assert_eq!(rows[2], Row { module: path("client"), may_use: vec![path("dataplane::fabric"), path("wire")] });
    assert_eq!(
        expand_use("wire::{self, Kind, join::{Hello as H, Accept}}"),
        ["wire", "wire::Kind", "wire::join::Hello", "wire::join::Accept"]
    );
    let code = "use crate::wire::{self,\n    Kind};\n// crate::server in a comment\nlet x = crate::host::units::parse(s); // crate::control\n$crate::x; pub(crate) fn f() {}\n";
    assert_eq!(crate_paths(code), [(1, "wire".to_string()), (1, "wire::Kind".to_string()), (4, "host::units::parse".to_string())]);
    assert_eq!(module_of("engine/src/ring/bootstrap.rs"), path("ring::bootstrap"));
    assert_eq!(module_of("engine/src/control/conn/mod.rs"), path("control::conn"));
    let lines = ["use super::*;", "#[cfg(test)]", "mod tests {", "    use super::*;", "}", "fn f() {}"];
    assert_eq!(test_regions(&lines), [(1, 5)]);
    assert!(is_test_cfg("#[cfg(all(test, target_arch = \"x86_64\"))]") && !is_test_cfg("#[cfg(feature = \"std\")]"));
}

/// The folder the tree rule covers.
const TREE: &str = "engine/src/client";

/// The module declarations (`mod x;`, `pub(super) mod x;`) of a file,
/// outside test modules: its child modules.
fn child_modules(lines: &[&str], tests: &[(usize, usize)]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (n, line) in lines.iter().enumerate() {
        if tests.iter().any(|&(a, b)| (a..b).contains(&n)) || n.checked_sub(1).is_some_and(|p| is_test_cfg(lines[p])) {
            continue;
        }
        let mut t = line.trim();
        if let Some(rest) = t.strip_prefix("pub") {
            t = rest.trim_start();
            if t.starts_with('(') {
                t = t[t.find(')').map_or(t.len(), |i| i + 1)..].trim_start();
            }
        }
        if let Some(name) = t.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
            out.insert(name.trim().to_string());
        }
    }
    out
}

/// The paths a line of code names, as written: each `use` tree expanded,
/// and inline paths (`a::b::c`) outside `use` lines. Comments are left out
/// by the caller.
fn code_paths(code: &str, in_use: bool) -> Vec<String> {
    if in_use {
        return expand_use(code);
    }
    // A visibility (`pub(in crate::client)`) names a module, not an import.
    let mut code = code.to_string();
    while let Some(i) = code.find("pub(in ") {
        let end = code[i..].find(')').map_or(code.len(), |j| i + j + 1);
        code.replace_range(i..end, "pub");
    }
    let code = code.as_str();
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let start_ok = ident(bytes[i]) && (i == 0 || !(ident(bytes[i - 1]) || bytes[i - 1] == b':' || bytes[i - 1] == b'$'));
        if !start_ok {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (ident(bytes[j]) || (bytes[j] == b':' && bytes.get(j + 1) == Some(&b':') && j + 2 < bytes.len())) {
            j += if bytes[j] == b':' { 2 } else { 1 };
        }
        let path = &code[i..j];
        if path.contains("::") {
            out.push(path.trim_end_matches(':').to_string());
        }
        i = j.max(i + 1);
    }
    out
}

/// One import between two files of the tree: where it is written.
#[derive(Debug, Clone, PartialEq)]
struct Import {
    from: String,
    to: String,
    line: usize,
    path: String,
}

/// The imports between the files `files` (path, text), each resolved to
/// the file of the longest module prefix it names (`super::queue::Cmd` is
/// `queue.rs`, `super::Cmd` the parent's file). Only files under `dir`.
fn tree_imports(files: &[(String, String)], dir: &str) -> Vec<Import> {
    let modules: BTreeMap<Vec<String>, &str> = files.iter().map(|(rel, _)| (module_of(rel), rel.as_str())).collect();
    let mut out = Vec::new();
    for (rel, text) in files {
        let here = module_of(rel);
        let lines: Vec<&str> = text.lines().collect();
        let tests = test_regions(&lines);
        let children = child_modules(&lines, &tests);
        let mut n = 0;
        while n < lines.len() {
            let first = n;
            let code = lines[n].split("//").next().unwrap_or("");
            let t = code.trim();
            let use_at = t.find("use ").filter(|&i| i == 0 || t[..i].trim().starts_with("pub"));
            let mut stmt = code.to_string();
            if let Some(i) = use_at {
                stmt = t[i + 4..].to_string();
                while !stmt.trim_end().ends_with(';') && n + 1 < lines.len() {
                    n += 1;
                    stmt.push_str(lines[n].split("//").next().unwrap_or("").trim());
                }
                stmt = stmt.trim_end().trim_end_matches(';').to_string();
            }
            n += 1;
            if tests.iter().any(|&(a, b)| (a..b).contains(&first)) {
                continue;
            }
            for path in code_paths(&stmt, use_at.is_some()) {
                let segs: Vec<&str> = path.split("::").map(str::trim).collect();
                let mut abs: Vec<String> = match segs[0] {
                    "crate" => Vec::new(),
                    "self" | "super" => here.clone(),
                    s if children.contains(s) => here.clone(),
                    _ => continue,
                };
                for s in &segs {
                    match *s {
                        "crate" | "self" => {}
                        "super" => {
                            abs.pop();
                        }
                        s => abs.push(s.to_string()),
                    }
                }
                let Some(to) = (1..=abs.len()).rev().find_map(|k| modules.get(&abs[..k])) else { continue };
                if *to != rel.as_str() && to.starts_with(dir) {
                    out.push(Import { from: rel.clone(), to: to.to_string(), line: first + 1, path: path.clone() });
                }
            }
        }
    }
    out
}

/// Each cycle among the imports (a strongly connected set of files), as
/// the imports inside it, `file:line: path -> file`.
fn import_cycles(imports: &[Import]) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for i in imports {
        next.entry(&i.from).or_default().insert(&i.to);
    }
    let reach = |a: &str| {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![a]);
        while let Some(x) = todo.pop() {
            for &y in next.get(x).into_iter().flatten() {
                if seen.insert(y) {
                    todo.push(y);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> = next.keys().map(|&a| (a, reach(a))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for (&a, r) in &reached {
        if done.contains(a) || !r.contains(a) {
            continue;
        }
        let set: BTreeSet<&str> = r.iter().copied().filter(|b| reached.get(b).is_some_and(|rb| rb.contains(a))).collect();
        done.extend(set.iter().copied());
        let mut inside: Vec<String> = imports
            .iter()
            .filter(|i| set.contains(i.from.as_str()) && set.contains(i.to.as_str()))
            .map(|i| format!("{}:{}: {} -> {}", i.from, i.line, i.path, i.to))
            .collect();
        inside.dedup();
        out.push(inside);
    }
    out
}

/// `impl` blocks of a type defined in another file of the tree, as
/// `file:line: impl ... (defined in file)`.
fn foreign_impls(files: &[(String, String)]) -> Vec<String> {
    let name_after = |t: &str, kw: &str| -> Option<String> {
        let rest = t.strip_prefix(kw)?;
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        (!name.is_empty()).then_some(name)
    };
    let mut defined: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for (rel, text) in files {
        for line in text.lines() {
            let mut t = line.trim();
            if let Some(rest) = t.strip_prefix("pub") {
                t = rest.trim_start();
                if t.starts_with('(') {
                    t = t[t.find(')').map_or(t.len(), |i| i + 1)..].trim_start();
                }
            }
            for kw in ["struct ", "enum ", "union ", "type ", "trait "] {
                if let Some(name) = name_after(t, kw) {
                    defined.entry(name).or_default().insert(rel);
                }
            }
        }
    }
    let mut out = Vec::new();
    for (rel, text) in files {
        for (n, line) in text.lines().enumerate() {
            let t = line.trim().trim_start_matches("unsafe ");
            if !(t.starts_with("impl ") || t.starts_with("impl<")) {
                continue;
            }
            // The self type: after ` for ` if a trait's, else after `impl<...>`.
            let head = t.split('{').next().unwrap_or(t).trim();
            let head = head.split(" where ").next().unwrap_or(head);
            let mut depth = 0;
            let mut generics_end = 4;
            for (i, c) in head.char_indices().skip(4) {
                match c {
                    '<' => depth += 1,
                    '>' => depth -= 1,
                    _ if depth == 0 => {
                        generics_end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let rest = head[generics_end..].trim();
            let ty = rest.rsplit(" for ").next().unwrap_or(rest).trim();
            let ty = ty.split('<').next().unwrap_or(ty).rsplit("::").next().unwrap_or(ty).trim();
            if let Some(homes) = defined.get(ty) {
                if !homes.contains(rel.as_str()) {
                    out.push(format!("{rel}:{}: {t} ({ty} is defined in {})", n + 1, homes.iter().copied().collect::<Vec<_>>().join(", ")));
                }
            }
        }
    }
    out
}

/// The tree's `.rs` files and their text.
fn tree_files(root: &Path) -> Vec<(String, String)> {
    files_under(root, TREE).into_iter().filter(|f| f.ends_with(".rs")).map(|f| (f.clone(), read(root, &f))).collect()
}

#[test]
fn the_client_is_a_tree() {
    let files = tree_files(&repo());
    assert!(files.len() > 20, "only {} files under {TREE}", files.len());
    let impls = foreign_impls(&files);
    assert!(
        impls.is_empty(),
        "impl blocks outside the file that defines their type (move the methods there, or make them a function of the file that calls them):\n  {}",
        impls.join("\n  ")
    );
    let imports = tree_imports(&files, TREE);
    assert!(imports.len() > 50, "only {} imports between the files of {TREE}", imports.len());
    let cycles = import_cycles(&imports);
    let shown: Vec<String> = cycles.iter().map(|c| c.join("\n    ")).collect();
    assert!(
        cycles.is_empty(),
        "files of {TREE} that import each other, directly or through others (move what both need into a file below both, or have the lower one return what the upper one should do):\n  {}",
        shown.join("\n  ")
    );
}

#[test]
fn the_tree_rule_parses_what_it_relies_on() {
    let file = |p: &str, t: &str| (format!("x/{p}"), t.to_string());
    let files = [
        file("mod.rs", "mod a;\npub(super) mod b;\n#[cfg(test)]\nmod tests;\nuse a::A;\nfn f() { b::g(); x::y(); } // c::z()\n"),
        file("a.rs", "use super::{b::B, Top};\n//! crate::x::c::C in a doc\npub(super) struct A;\n#[cfg(test)]\nmod tests {\n    use super::super::c::C;\n}\n"),
        file("b.rs", "use crate::x::{\n    a::A,\n};\nfn g() { let _ = crate::x::c::f(); let s = \"{v:?}\"; }\nimpl A {}\n"),
        file("c.rs", "pub struct C;\nimpl<'a> Default for C {}\nimpl Drop for Outside {}\n"),
        file("a/d.rs", "use super::super::c::C;\nuse super::Q;\nuse std::io::Read;\nimpl crate::x::c::C {}\n"),
    ];
    let got: Vec<(String, String, usize)> = tree_imports(&files, "x")
        .into_iter()
        .map(|i| (i.from.trim_start_matches("x/").into(), i.to.trim_start_matches("x/").into(), i.line))
        .collect();
    let want = [
        ("mod.rs", "a.rs", 5),
        ("mod.rs", "b.rs", 6),
        ("a.rs", "b.rs", 1),
        ("a.rs", "mod.rs", 1),
        ("b.rs", "a.rs", 1),
        ("b.rs", "c.rs", 4),
    ];
    let want2 = [("a/d.rs", "c.rs", 1), ("a/d.rs", "a.rs", 2), ("a/d.rs", "c.rs", 4)];
    let want: Vec<(String, String, usize)> = want.iter().chain(&want2).map(|&(a, b, n)| (a.into(), b.into(), n)).collect();
    let sorted = |mut v: Vec<(String, String, usize)>| {
        v.sort();
        v
    };
    assert_eq!(sorted(got), sorted(want));
    let cycles = import_cycles(&tree_imports(&files, "x"));
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].iter().any(|l| l.starts_with("x/b.rs:1: crate::x::a::A -> x/a.rs")), "{cycles:?}");
    assert!(!cycles[0].iter().any(|l| l.contains("c.rs")), "{cycles:?}");
    let impls = foreign_impls(&files);
    assert_eq!(impls.len(), 2, "{impls:?}");
    assert!(impls[0].starts_with("x/b.rs:5: impl A {}") && impls[1].starts_with("x/a/d.rs:4: impl crate::x::c::C {}"), "{impls:?}");
    assert_eq!(code_paths("let x = a::b(c::D::new()) + self::e::F;", false), ["a::b", "c::D::new", "self::e::F"]);
    assert_eq!(code_paths("pub(in crate::client) fn f(x: a::B) {}", false), ["a::B"]);
}
