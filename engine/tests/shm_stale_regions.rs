//! shm regions left in /dev/shm by a process that was SIGKILLed.
//!
//! libfabric's shm provider names an endpoint's region `/dev/shm/PID:UID:N`
//! (N counts the process's endpoints from 0) and unlinks it on close or on
//! SIGTERM/SIGINT, never on SIGKILL. A later process that gets the same PID
//! finds the stale file, sees a live process of that PID (itself) and
//! `fi_enable` fails with EBUSY. tally removes, before the first shm
//! endpoint of a process, the region files named for its own PID (they
//! cannot be its own yet) and those of PIDs that no longer run.
//!
//! One test in this file: it needs a process that has opened no shm
//! endpoint yet, which is what an integration test binary of its own is.
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use tally_engine::dataplane::fabric::{Endpoint, EndpointConfig};

/// A region header as shm 1.17 writes it: version 4 at byte 0, the owner's
/// pid at byte 4; dated a minute back, as a killed process's region is.
fn fake_region(path: &PathBuf, pid: u32) {
    let mut header = vec![0u8; 4096];
    header[0] = 4;
    header[4..8].copy_from_slice(&(pid as i32).to_ne_bytes());
    std::fs::write(path, header).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    std::fs::File::options().write(true).open(path).unwrap().set_modified(then).unwrap();
}

/// A PID that ran and exited (reaped): no process has it now, unless the
/// system reused it meanwhile, which `alive` rules out before it is relied on.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

#[test]
fn stale_regions_of_this_pid_and_of_dead_pids_are_removed_before_the_first_endpoint() {
    let me = std::process::id();
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let dir = PathBuf::from("/dev/shm");
    // What a killed process with this PID left: its first two endpoints.
    let own: Vec<PathBuf> = (0..2).map(|n| dir.join(format!("{me}:{uid}:{n}"))).collect();
    for p in &own {
        fake_region(p, me);
    }
    let dead = dead_pid();
    let dead_region = dir.join(format!("{dead}:{uid}:0"));
    fake_region(&dead_region, dead);
    // Not stale, or not shm's: left alone. PID 1 always runs; the other
    // names do not follow shm's PID:UID:N scheme.
    let keep = [
        dir.join(format!("1:{uid}:9{me}")),
        dir.join(format!("tally-test-{me}")),
        dir.join(format!("{me}:{uid}:x")),
        dir.join(format!("{me}:{uid}")),
    ];
    for p in &keep {
        fake_region(p, me);
    }

    let opened = Endpoint::open(&EndpointConfig::new("shm"));

    let own_left: Vec<&PathBuf> = own.iter().filter(|p| p.exists()).collect();
    let kept: Vec<bool> = keep.iter().map(|p| p.exists()).collect();
    let dead_left = dead_region.exists();
    for p in keep.iter().chain(&own).chain([&dead_region]) {
        let _ = std::fs::remove_file(p);
    }
    let ep = opened.expect("an shm endpoint opens although a stale region had its name");
    assert_eq!(ep.provider(), "shm");
    // The endpoint took name N = 0 and created a fresh region there; N = 1 is gone.
    let name = String::from_utf8_lossy(ep.name().unwrap().as_bytes()).trim_end_matches('\0').to_string();
    assert!(name.ends_with(&format!("{me}:{uid}:0")), "endpoint name {name}");
    assert_eq!(own_left, vec![&own[0]], "the stale region of endpoint 1 of this pid was removed, 0 is the new endpoint's own");
    let live = std::fs::metadata(&own[0]);
    assert!(live.is_err() || live.unwrap().uid() == uid);
    assert_eq!(kept, vec![true; keep.len()], "files that are not stale shm regions are untouched: {keep:?}");
    if !alive(dead) {
        assert!(!dead_left, "the region of pid {dead}, which no longer runs, was removed");
    }
    drop(ep);
    assert!(!own[0].exists(), "closing the endpoint unlinks its region");
}
