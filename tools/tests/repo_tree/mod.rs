//! The repository's files as the documentation and rules tests read them:
//! paths from the root with `/` separators, build outputs (`target*`),
//! git's own files and Python caches left out.
use std::path::{Path, PathBuf};

/// The repository's root (the folder above `tools/`).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tools/ has a parent").to_path_buf()
}

/// Every file under `dir` (a path from the root; "" for all of it), sorted.
pub fn files_under(root: &Path, dir: &str) -> Vec<String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("readable folder") {
            let e = e.expect("folder entry");
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("target") || name == ".git" || name == "__pycache__" {
                continue;
            }
            let path = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
            if e.file_type().expect("file type").is_dir() {
                walk(&e.path(), &path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root.join(dir), dir.trim_end_matches('/'), &mut out);
    out.sort();
    out
}
