//! The server's TOML file: arbitrary text parsed and, where it parses,
//! resolved. Proves no panic (sizes, core lists, addresses), and that a
//! configuration that resolves is within its documented bounds.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tally_engine::host::config::ServerFile;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = ServerFile::parse(text) else {
        return;
    };
    let Ok(cfg) = file.clone().resolve() else {
        return;
    };
    assert!(!cfg.lcores.as_slice().is_empty());
    assert!(cfg.max_chunk >= 1 && cfg.max_chunk <= cfg.slab_size);
    assert!((1..=1024).contains(&cfg.max_window));
    assert!((1..=4096).contains(&cfg.max_jobs));
    assert!((1..=1024).contains(&cfg.max_ranks));
    assert!(cfg.nics.is_empty() || cfg.nics.len() == cfg.lcores.len());
    assert_eq!(file.clone().overlay(file).resolve().unwrap(), cfg);
});
