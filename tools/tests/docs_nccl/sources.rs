//! Where a doc line may be found: the command lines of scripts, shipped
//! procedures and Rust tests' argument arrays.

use super::*;

/// The commands a line of a source stands for: the line, its `&&` parts, each
/// without a leading `exec`, and systemd's Exec values with the installed
/// binary's path shortened to `tally`.
pub(crate) fn candidates(line: &str) -> Vec<String> {
    let mut line = line.trim().to_string();
    for key in ["ExecStart=", "ExecStartPre=", "ExecStartPost=", "ExecStop="] {
        if let Some(v) = line.strip_prefix(key) {
            line = v.trim_start_matches('-').replace("/usr/local/bin/tally", "tally");
        }
    }
    let mut out = vec![line.clone()];
    out.extend(line.split(" && ").map(|p| p.trim().to_string()));
    let without_exec: Vec<String> = out.iter().filter_map(|c| c.strip_prefix("exec ").map(str::to_string)).collect();
    out.extend(without_exec);
    out.sort();
    out.dedup();
    out
}

pub(crate) fn text_sources(rel: &str, kind: Kind) -> Vec<SourceCmd> {
    let text = read(rel);
    let mut out = Vec::new();
    let mut joined = String::new();
    for raw in text.lines() {
        let t = raw.trim();
        let is_comment = t.starts_with('#');
        if is_comment && kind == Kind::Script {
            continue;
        }
        // In a header, a run of 3+ spaces starts commentary: `sysctl --system   (or reboot)`.
        let body = if is_comment { t.trim_start_matches('#').trim().split("   ").next().unwrap() } else { t };
        let (body, continues) = match body.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (body, false),
        };
        joined.push_str(body.trim());
        if continues {
            joined.push(' ');
            continue;
        }
        for c in candidates(&std::mem::take(&mut joined)) {
            out.push(SourceCmd { path: rel.to_string(), kind, words: words(&c).into_iter().map(Some).collect() });
        }
    }
    out
}

/// `&["a", "b", expr]` and `.args(["a", ...])` arrays of the Rust tests that
/// run the `tally` binary, as `tally a b *`.
pub(crate) fn rust_sources(rel: &str) -> Vec<SourceCmd> {
    let text = read(rel);
    let mut out = Vec::new();
    for open in ["run(&[", ".args(["] {
        let mut rest = text.as_str();
        while let Some(a) = rest.find(open) {
            rest = &rest[a + open.len()..];
            let mut w: Vec<SrcWord> = vec![Some("tally".into())];
            for e in array_elements(rest) {
                // A plain string literal is a word; anything else an expression.
                let lit = e.strip_prefix('"').and_then(|e| e.strip_suffix('"')).filter(|l| !l.contains(['"', '\\']));
                w.push(lit.map(str::to_string));
            }
            // Only whole commands: the first element names a subcommand.
            if w.get(1).is_some_and(|s| s.as_deref().is_some_and(|s| s.chars().all(|c| c.is_ascii_lowercase() || c == '-'))) {
                out.push(SourceCmd { path: rel.to_string(), kind: Kind::Tests, words: w });
            }
        }
    }
    out
}

/// The elements of a Rust array literal whose `[` was just passed: split at
/// commas outside strings and brackets, up to the closing `]`.
pub(crate) fn array_elements(s: &str) -> Vec<String> {
    let (mut out, mut cur) = (Vec::new(), String::new());
    let (mut in_str, mut escaped, mut depth) = (false, false, 0usize);
    for c in s.chars() {
        if in_str {
            cur.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' | '[' | '{' => depth += 1,
            ')' | '}' => depth = depth.saturating_sub(1),
            ']' if depth == 0 => break,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    let last = cur.trim().to_string();
    if !last.is_empty() {
        out.push(last);
    }
    out.retain(|e| !e.is_empty());
    out
}

pub(crate) fn all_sources() -> Vec<SourceCmd> {
    let mut out: Vec<SourceCmd> = SOURCES.iter().flat_map(|(p, k)| text_sources(p, *k)).collect();
    // The Rust tests that run the `tally` binary: the tools' own and the
    // end-to-end suites (this test's own files are in a folder, not read).
    let mut tests: Vec<PathBuf> = ["tools/tests", "tests/suites"]
        .iter()
        .flat_map(|d| std::fs::read_dir(repo().join(d)).unwrap().map(|e| e.unwrap().path()))
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    tests.sort();
    for t in tests {
        let rel = t.strip_prefix(repo()).unwrap().to_str().unwrap().to_string();
        out.extend(rust_sources(&rel));
    }
    out
}
