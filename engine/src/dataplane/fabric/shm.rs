//! Stale shm regions: the files a SIGKILLed process leaves in /dev/shm.
//!
//! libfabric's shm provider (1.17) keeps each endpoint's queues in a file
//! `/dev/shm/PID:UID:N` (its process id, user id, and the process's endpoint
//! count, from 0), created by `smr_create` in `fi_enable` and unlinked when
//! the endpoint closes or the process gets SIGTERM, SIGINT, SIGSEGV or
//! SIGBUS (the provider's signal handlers). SIGKILL leaves the file. When a
//! later process is given the same PID, its endpoint N finds the file, and
//! `smr_retry_map` (prov/util/src/util_shm.c) sees that a process with the
//! recorded PID is alive (itself) and fails with EBUSY: `fi_enable` fails.
//!
//! So before the first shm endpoint of a process opens (once, every thread
//! waiting for it), [`sweep_before_first_endpoint`] removes region files
//! - named for this process's own PID: this process has created none yet,
//!   so they can only be stale;
//! - named for a PID that no longer runs (`kill(pid, 0)` says ESRCH) and
//!   last modified before the sweep began (less [`FRESH`]): a region that
//!   a new process with a reused PID creates while the sweep runs is not
//!   taken for its predecessor's.
//!
//! Only regular files owned by this user whose names are exactly
//! `digits:UID:digits` with this user's uid are considered: shm's names.
//! Each removal is logged at info level. Unlinking a region that a live peer
//! still has mapped is harmless for it (its mapping stays).
//!
//! PIDs are judged in this process's PID namespace: where processes of
//! different PID namespaces share one /dev/shm, a live region of another
//! namespace can look stale; `TALLY_SHM_SWEEP=own` limits the sweep to this
//! process's own PID there, and `TALLY_SHM_SWEEP=off` turns it off.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, SystemTime};

/// A dead PID's region file modified this recently (before the sweep began)
/// is left alone; tmpfs stamps files with a coarse clock, hence the margin.
pub const FRESH: Duration = Duration::from_secs(2);

/// Why a region file was judged stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stale {
    /// Named for this process's PID before it created any shm region.
    OwnPid,
    /// Named for a PID that no process has.
    DeadPid,
}

/// One region file the sweep removed (or failed to remove).
#[derive(Debug)]
pub struct Swept {
    pub path: PathBuf,
    pub pid: u32,
    pub why: Stale,
    /// The removal's error, if it failed.
    pub error: Option<std::io::Error>,
}

/// Which files a sweep may remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepMode {
    Off,
    /// Only files named for this process's own PID.
    OwnPid,
    /// Those, and files of PIDs that no longer run (the default).
    OwnAndDead,
}

impl SweepMode {
    /// From `TALLY_SHM_SWEEP` (`off`, `own`; anything else or unset: both).
    pub fn from_env() -> SweepMode {
        match std::env::var("TALLY_SHM_SWEEP").as_deref() {
            Ok("off") => SweepMode::Off,
            Ok("own") => SweepMode::OwnPid,
            _ => SweepMode::OwnAndDead,
        }
    }
}

/// The PID in an shm region name `PID:UID:N` of user `uid`; `None` for any
/// other name.
pub fn region_pid(name: &str, uid: u32) -> Option<u32> {
    let mut parts = name.split(':');
    let (pid, user, n) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
    if parts.next().is_some() || !digits(pid) || !digits(user) || !digits(n) {
        return None;
    }
    if user.parse::<u32>().ok()? != uid {
        return None;
    }
    pid.parse::<u32>().ok().filter(|&p| p > 0)
}

/// Whether a process with this PID exists (in this PID namespace).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(p) = i32::try_from(pid) else { return true };
    if p <= 0 {
        return true;
    }
    // SAFETY: signal 0 sends nothing; it only checks that the process exists.
    let ret = unsafe { libc::kill(p, 0) };
    // EPERM: it exists but belongs to someone else.
    ret == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes the stale shm region files of user `uid` in `dir` (see the module
/// doc); `me` is this process's PID, `alive` says whether a PID runs.
pub fn sweep(dir: &Path, me: u32, uid: u32, mode: SweepMode, alive: impl Fn(u32) -> bool) -> Vec<Swept> {
    let mut out = Vec::new();
    if mode == SweepMode::Off {
        return out;
    }
    let started = SystemTime::now();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| region_pid(n, uid)) else { continue };
        let why = if pid == me {
            Stale::OwnPid
        } else if mode == SweepMode::OwnAndDead && !alive(pid) {
            Stale::DeadPid
        } else {
            continue;
        };
        let path = entry.path();
        // A regular file of ours (not a link, not another user's); a dead
        // PID's only if it is not brand new.
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_file() && m.uid() == uid => {
                let fresh = m.modified().map_or(true, |t| t + FRESH >= started);
                if why == Stale::DeadPid && fresh {
                    continue;
                }
            }
            _ => continue,
        }
        let error = std::fs::remove_file(&path).err();
        out.push(Swept { path, pid, why, error });
    }
    out
}

static SWEEP: Once = Once::new();

/// Runs the sweep of /dev/shm once per process, before its first shm
/// endpoint is created; concurrent callers wait for it to finish.
pub fn sweep_before_first_endpoint() {
    SWEEP.call_once(|| {
        // SAFETY: getuid has no preconditions. shm names carry the real uid.
        let uid = unsafe { libc::getuid() };
        for s in sweep(Path::new("/dev/shm"), std::process::id(), uid, SweepMode::from_env(), pid_alive) {
            let why = match s.why {
                Stale::OwnPid => "named for this process's pid before it opened any shm endpoint",
                Stale::DeadPid => "its process no longer runs",
            };
            match s.error {
                None => log::info!("removed stale shm region {} (pid {}: {why})", s.path.display(), s.pid),
                Some(e) => log::warn!("could not remove stale shm region {} (pid {}: {why}): {e}", s.path.display(), s.pid),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_shm_region_names_of_this_user_parse() {
        assert_eq!(region_pid("1234:0:0", 0), Some(1234));
        assert_eq!(region_pid("1234:1000:17", 1000), Some(1234));
        assert_eq!(region_pid("1234:1000:17", 0), None, "another user's");
        for other in ["1234:0", "1234:0:0:0", "127.0.0.1:0:0", "x1:0:0", "1:0:", ":0:0", "0:0:0", "sem.1:0:0", "99999999999:0:0"] {
            assert_eq!(region_pid(other, 0), None, "{other}");
        }
    }

    #[test]
    fn sweep_removes_own_and_dead_pids_only() {
        let dir = std::env::temp_dir().join(format!("tally-shm-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let me = 4242;
        let names = [
            format!("4242:{uid}:0"),
            format!("4242:{uid}:3"),
            format!("77:{uid}:0"),
            format!("88:{uid}:1"),
            format!("88:{}:1", uid + 1),
            "4242:x:0".to_string(),
            "notes.txt".to_string(),
        ];
        let old = SystemTime::now() - Duration::from_secs(60);
        let write_old = |n: &str| {
            std::fs::write(dir.join(n), b"x").unwrap();
            std::fs::File::options().write(true).open(dir.join(n)).unwrap().set_modified(old).unwrap();
        };
        for n in &names {
            write_old(n);
        }
        // A dead PID's region created just now (a reused PID's new one) stays.
        let fresh = format!("66:{uid}:0");
        std::fs::write(dir.join(&fresh), b"x").unwrap();
        std::fs::create_dir(dir.join(format!("99:{uid}:0"))).unwrap();
        let alive = |pid: u32| pid == 88;
        let mut swept: Vec<(String, u32, Stale)> = sweep(&dir, me, uid, SweepMode::OwnAndDead, alive)
            .into_iter()
            .map(|s| {
                assert!(s.error.is_none(), "{s:?}");
                (s.path.file_name().unwrap().to_string_lossy().into_owned(), s.pid, s.why)
            })
            .collect();
        swept.sort();
        let mut want =
            vec![(names[0].clone(), 4242, Stale::OwnPid), (names[1].clone(), 4242, Stale::OwnPid), (names[2].clone(), 77, Stale::DeadPid)];
        want.sort();
        assert_eq!(swept, want);
        for n in names[3..].iter().chain([&fresh]) {
            assert!(dir.join(n).exists(), "{n} kept");
        }
        assert!(dir.join(format!("99:{uid}:0")).is_dir(), "a directory is never removed");
        // Own-pid mode leaves dead pids' files; off removes nothing.
        write_old(&names[0]);
        write_old(&names[2]);
        assert!(sweep(&dir, me, uid, SweepMode::Off, alive).is_empty());
        let own: Vec<String> = sweep(&dir, me, uid, SweepMode::OwnPid, alive).iter().map(|s| s.path.display().to_string()).collect();
        assert_eq!(own, vec![dir.join(&names[0]).display().to_string()]);
        assert!(dir.join(&names[2]).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(pid_alive(std::process::id()));
        assert!(pid_alive(1));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        // Unless the PID was reused within these microseconds.
        let reused = std::fs::metadata(format!("/proc/{pid}")).is_ok();
        assert!(reused || !pid_alive(pid));
    }
}
