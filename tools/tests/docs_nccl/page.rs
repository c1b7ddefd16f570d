//! Parsing the page: its sh blocks into command lines, inline code, words
//! and placeholders, and matching a doc line against a source line.

use super::*;

/// A command line of an sh block: 1-based line number in the page, text.
#[derive(Clone, Debug)]
pub(crate) struct DocCmd {
    pub(crate) line: usize,
    pub(crate) text: String,
}

/// The text without a trailing `# comment` (a `#` that starts a word outside quotes).
pub(crate) fn strip_comment(s: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in s.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return &s[..i],
            _ => {}
        }
        prev = c;
    }
    s
}

pub(crate) fn sh_commands(md: &str) -> Vec<DocCmd> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<DocCmd> = None;
    for (i, raw) in md.lines().enumerate() {
        let t = raw.trim();
        if t.starts_with("```") {
            assert!(pending.is_none() || !in_sh, "{DOC}:{}: a continuation runs into the end of the block", i + 1);
            in_sh = !in_sh && t == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let body = strip_comment(t).trim_end();
        let (body, continues) = match body.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (body, false),
        };
        let cmd = match pending.take() {
            Some(mut p) => {
                p.text.push(' ');
                p.text.push_str(body.trim());
                p
            }
            None => DocCmd { line: i + 1, text: body.trim().to_string() },
        };
        if continues {
            pending = Some(cmd);
        } else if !cmd.text.is_empty() {
            out.push(cmd);
        }
    }
    assert!(!in_sh, "{DOC}: an sh block is not closed");
    out
}

/// Inline code spans of the prose (outside fenced blocks), newlines as spaces.
pub(crate) fn inline_code(md: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for l in md.lines() {
        if l.trim().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            prose.push_str(l);
            prose.push(' ');
        }
    }
    prose.split('`').skip(1).step_by(2).map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
}

/// Shell words: whitespace outside quotes and `$(...)` separates them; quotes stay in the word.
pub(crate) fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut single, mut double, mut depth) = (false, false, 0usize);
    let chars: Vec<char> = s.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '(' if !single && i > 0 && chars[i - 1] == '$' => depth += 1,
            ')' if !single && depth > 0 => depth -= 1,
            c if c.is_whitespace() && !single && !double && depth == 0 => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `<NAME>` placeholders in a text.
pub(crate) fn placeholders_in(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(a) = rest.find('<') {
        let after = &rest[a + 1..];
        match after.find('>') {
            Some(b) if b > 0 && after[..b].chars().all(|c| c.is_ascii_uppercase() || c == '_') => {
                out.push(after[..b].to_string());
                rest = &after[b + 1..];
            }
            _ => rest = after,
        }
    }
    out
}

pub(crate) fn substitute(s: &str) -> String {
    let mut s = s.to_string();
    for name in placeholders_in(&s.clone()) {
        let value = PLACEHOLDERS.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("placeholder <{name}> has no test value"));
        s = s.replace(&format!("<{name}>"), value.1);
    }
    s
}

/// Does a doc word (with `<NAME>` wildcards) match a source word?
pub(crate) fn word_matches(doc: &str, src: &SrcWord) -> bool {
    let Some(src) = src else { return true };
    let mut parts = Vec::new();
    let mut rest = doc;
    while let Some(a) = rest.find('<') {
        match rest[a..].find('>') {
            Some(b) if placeholders_in(&rest[a..a + b + 1]).len() == 1 => {
                parts.push(&rest[..a]);
                rest = &rest[a + b + 1..];
            }
            _ => break,
        }
    }
    if parts.is_empty() {
        return doc == src;
    }
    parts.push(rest);
    glob(&parts, src)
}

/// `parts` joined by "one or more characters" match all of `s`.
pub(crate) fn glob(parts: &[&str], s: &str) -> bool {
    let Some(rest) = s.strip_prefix(parts[0]) else { return false };
    if parts.len() == 1 {
        return rest.is_empty();
    }
    (1..=rest.len()).filter(|&k| rest.is_char_boundary(k)).any(|k| glob(&parts[1..], &rest[k..]))
}

pub(crate) fn line_matches(doc: &[String], src: &[SrcWord]) -> bool {
    doc.len() == src.len() && doc.iter().zip(src).all(|(d, s)| word_matches(d, s))
}
