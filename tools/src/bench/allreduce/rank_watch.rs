//! The launcher's watch over its rank processes: a rank that dies does not
//! leave the others waiting.
//!
//! Ranks learn that a peer died through the servers: a rank's closed
//! control connection fails its job, and the others exit with an error
//! within a second or two (`scripts/bench/soak.sh`: 136 of 138 SIGKILLs).
//! But a rank killed before it reached the servers is a rank they never
//! saw: the others wait to join a job that cannot form, silently, until
//! the join timeout (120 s; the soak's other 2). torchrun's agent and Slurm
//! stop a job's other processes when one fails; this launcher now does
//! too, after a grace of [`GRACE`] in which the others may notice by
//! themselves (so a run still shows how the servers report a death, and a
//! rank that errors on its own is told apart from one this stopped).
//!
//! The watch thread owns the children and is the only one that reaps them;
//! the launcher reads rank 0's output meanwhile and collects the statuses
//! from [`RankWatch::finish`].
use std::process::{Child, ExitStatus};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the other ranks have to exit by themselves after one died:
/// the servers' liveness (2 s) and a recovery, several times over.
pub const GRACE: Duration = Duration::from_secs(10);

/// How often the watch looks.
const TURN: Duration = Duration::from_millis(50);

/// What the watch saw: each child's status, in order, and what it did.
pub struct Ended {
    pub statuses: Vec<std::io::Result<ExitStatus>>,
    /// Set once it stopped ranks: "rank 1 died (...); ranks 0, 2 had not
    /// exited 10s later ...: stopped them".
    pub stopped: Option<String>,
}

/// A thread that owns the rank processes until they all ended.
pub struct RankWatch(JoinHandle<Ended>);

impl RankWatch {
    /// Watches `children`, labelled by `labels` ("rank 3", "ranks 64-127"),
    /// stopping the others `grace` ([`GRACE`]) after one failed.
    pub fn start(children: Vec<Child>, labels: Vec<String>, grace: Duration) -> std::io::Result<RankWatch> {
        std::thread::Builder::new().name("rank-watch".into()).spawn(move || watch(children, &labels, grace)).map(RankWatch)
    }

    /// Waits for every child to end.
    pub fn finish(self) -> Ended {
        self.0.join().unwrap_or_else(|_| Ended { statuses: Vec::new(), stopped: Some("the rank watch panicked".into()) })
    }
}

fn watch(mut children: Vec<Child>, labels: &[String], grace: Duration) -> Ended {
    let mut statuses: Vec<Option<std::io::Result<ExitStatus>>> = children.iter().map(|_| None).collect();
    let mut died: Option<(usize, Instant)> = None;
    let mut stopped = None;
    while statuses.iter().any(|s| s.is_none()) {
        for (k, c) in children.iter_mut().enumerate() {
            if statuses[k].is_none() {
                match c.try_wait() {
                    Ok(None) => {}
                    Ok(Some(st)) => statuses[k] = Some(Ok(st)),
                    Err(e) => statuses[k] = Some(Err(e)),
                }
                if died.is_none() && statuses[k].as_ref().is_some_and(|s| !s.as_ref().is_ok_and(|s| s.success())) {
                    died = Some((k, Instant::now()));
                }
            }
        }
        if let Some((k, at)) = died {
            let running: Vec<usize> = (0..children.len()).filter(|&i| statuses[i].is_none()).collect();
            if stopped.is_none() && !running.is_empty() && at.elapsed() >= grace {
                for &i in &running {
                    let _ = children[i].kill();
                }
                let how = match &statuses[k] {
                    Some(Ok(st)) => st.to_string(),
                    Some(Err(e)) => e.to_string(),
                    None => String::new(),
                };
                let names: Vec<&str> = running.iter().map(|&i| labels[i].as_str()).collect();
                let line = format!(
                    "{} died ({how}); {} had not exited {grace:?} later (a rank that dies before it reaches the servers \
                     leaves the others waiting to join until the join timeout): stopped them",
                    labels[k],
                    names.join(", ")
                );
                stopped = Some(line);
            }
        }
        std::thread::sleep(TURN);
    }
    Ended { statuses: statuses.into_iter().flatten().collect(), stopped }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    #[test]
    fn a_death_stops_the_others_after_the_grace_and_says_so() {
        let dies = Command::new("sh").args(["-c", "kill -9 $$"]).spawn().unwrap();
        let waits = Command::new("sleep").arg("60").spawn().unwrap();
        let t0 = Instant::now();
        let grace = Duration::from_millis(500);
        let w = RankWatch::start(vec![dies, waits], vec!["rank 0".into(), "rank 1".into()], grace).unwrap();
        let ended = w.finish();
        let took = t0.elapsed();
        assert!(took >= grace && took < Duration::from_secs(30), "{took:?}");
        let st: Vec<ExitStatus> = ended.statuses.into_iter().map(|s| s.unwrap()).collect();
        assert_eq!(st.iter().map(|s| s.signal()).collect::<Vec<_>>(), [Some(libc::SIGKILL), Some(libc::SIGKILL)]);
        let line = ended.stopped.expect("the watch says what it did");
        assert!(line.starts_with("rank 0 died (signal: 9 (SIGKILL)); rank 1 had not exited 500ms later"), "{line}");
    }

    #[test]
    fn ranks_that_end_well_or_fail_together_are_left_alone() {
        let ok = Command::new("true").spawn().unwrap();
        let fails = Command::new("sh").args(["-c", "sleep 0.2; exit 3"]).spawn().unwrap();
        let ended = RankWatch::start(vec![ok, fails], vec!["rank 0".into(), "rank 1".into()], GRACE).unwrap().finish();
        let codes: Vec<Option<i32>> = ended.statuses.iter().map(|s| s.as_ref().unwrap().code()).collect();
        assert_eq!(codes, [Some(0), Some(3)]);
        assert_eq!(ended.stopped, None, "nothing was left to stop");
    }
}
