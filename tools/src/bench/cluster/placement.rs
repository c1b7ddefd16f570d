//! Where the servers' lcores and the workers run on this machine's cores,
//! and how many rails each worker gets in its share.

/// Where servers' lcores and workers go: (lcores per server, placement text,
/// server i's core list, worker cores list or None).
pub(super) fn place(hosts: u32, cores: usize, want: Option<u32>) -> (Vec<String>, Option<String>, String) {
    let h = hosts as usize;
    let per = match want {
        Some(w) => w as usize,
        // 64 cores for 4 + 4 hosts: 4 lcores a server, so that at 32 Gbit/s
        // (4 GB/s each way per server) no lcore's endpoint carries more
        // than 1 GB/s each way, and 12 cores a worker for its rails.
        None if cores >= 16 * h => 4,
        None if cores >= 4 * h => 2,
        None if cores >= 2 * h => 1,
        None => 0,
    };
    if per == 0 || cores < per * h + 1 {
        let n = cores.clamp(1, 2);
        let list = if n == 1 { "0".to_string() } else { "0-1".to_string() };
        let lists = vec![list.clone(); h];
        return (
            lists,
            None,
            format!(
                "shared: {} cores for {h} servers + {h} workers, every server's lcores on cores {list}, workers placed by the scheduler",
                cores
            ),
        );
    }
    let lists: Vec<String> = (0..h).map(|i| if per == 1 { format!("{i}") } else { format!("{}-{}", per * i, per * i + per - 1) }).collect();
    let first_worker = per * h;
    let workers = if cores > first_worker { Some(format!("{first_worker}-{}", cores - 1)) } else { None };
    let text = format!(
        "server i on {per} core{} of its own (cores 0-{}), {} lcore{} each; workers pinned to cores {}",
        if per == 1 { "" } else { "s" },
        first_worker - 1,
        per,
        if per == 1 { "" } else { "s" },
        workers.as_deref().unwrap_or("(none left: scheduler)")
    );
    (lists, workers, text)
}

/// The rails each worker runs, and why: TALLY_RAILS, else auto (one per
/// server, at least 4, over tcp on 8+ cores), but no more than fit the worker's block of
/// the workers' cores with its own thread: every worker sees the whole host,
/// and blocks that wrap put two busy pollers on one core (on 16 cores, 3
/// workers of 1 + 3 threads on cores 6-15 stalled operations for 1.3 s).
pub(super) fn worker_rails(hosts: u32, worker_cores: Option<&str>) -> (usize, &'static str) {
    let asked = std::env::var("TALLY_RAILS").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(0);
    let n = tally_engine::client::rails::resolve_rails(asked, "tcp", hosts as usize);
    if asked != 0 {
        return (n, "TALLY_RAILS");
    }
    let block = worker_cores.and_then(|w| tally_engine::host::cpuset::CoreList::parse(w).ok()).map(|l| l.len() / hosts.max(1) as usize);
    match block {
        Some(b) if n > 1 && b < n + 1 => ((b.saturating_sub(1)).max(1), "auto, fit to each worker's cores"),
        _ => (n, "auto"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_gives_servers_cores_of_their_own_when_it_can() {
        let (l, w, _) = place(4, 16, None);
        assert_eq!(l, ["0-1", "2-3", "4-5", "6-7"]);
        assert_eq!(w.as_deref(), Some("8-15"));
        let (l, w, _) = place(8, 16, None);
        assert_eq!(l[7], "7");
        assert_eq!(w.as_deref(), Some("8-15"));
        let (l, w, t) = place(4, 2, None);
        assert!(l.iter().all(|x| x == "0-1") && w.is_none() && t.starts_with("shared"), "{t}");
    }
}
