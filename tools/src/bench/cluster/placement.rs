//! Where the servers' lcores and the workers run on this machine's cores,
//! and how many rails each worker gets in its share.

/// Where servers' lcores and workers go when the fastest link is
/// `top_rate` Gbit/s: (server i's core list, worker cores list or None,
/// placement text).
pub(super) fn place(hosts: u32, cores: usize, want: Option<u32>, top_rate: f64) -> (Vec<String>, Option<String>, String) {
    let h = hosts as usize;
    let per = match want {
        Some(w) => w as usize,
        // At 8 Gbit/s and below one lcore a server holds the link for less
        // CPU per byte than more: every lcore beyond what the link needs
        // wakes for less work each (nvidia-h200, 4 + 4 at 8 Gbit/s, three
        // rounds: 0.99 of the bound either way, agg's servers 0.48-0.67
        // s/GB of input against 0.58-0.65, agg-plugin's 0.74-0.87 against
        // 0.88-1.09; docs/sizing.md). One takes about 16 Gbit/s at its edge.
        None if top_rate <= 8.0 && cores >= 2 * h => 1,
        // 64 cores for 4 + 4 hosts: 4 lcores a server, so that at 32 Gbit/s
        // (4 GB/s each way per server) no lcore's endpoint carries more
        // than 1 GB/s each way, and 12 cores a worker for its rails.
        None if cores >= 16 * h => 4,
        // Above 16 Gbit/s, 4 lcores where the workers keep 4 cores each for
        // their rails: on x2 (32 cores, 4 + 4) agg at 32 Gbit/s gave
        // 0.89-0.92 of the bound on 4 lcores against 0.76-0.81 on 2; at 16,
        // 2 hold the link at less CPU per byte (docs/sizing.md).
        None if cores >= 8 * h && top_rate > 16.0 => 4,
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
    // Each worker's share of the list (`bench::allreduce::pinning`).
    let share = match (cores - first_worker) / h {
        0 => "fewer than one each, taken in turn".to_string(),
        1 => "one each".to_string(),
        n => format!("{n} each"),
    };
    let text = format!(
        "server i on {per} core{} of its own (cores 0-{}), {} lcore{} each; workers pinned to cores {}",
        if per == 1 { "" } else { "s" },
        first_worker - 1,
        per,
        if per == 1 { "" } else { "s" },
        workers.as_deref().map_or("(none left: scheduler)".to_string(), |w| format!("{w} ({share})"))
    );
    (lists, workers, text)
}

/// The rails each worker runs at links of `rate` Gbit/s: for agg and for
/// agg-plugin (whose rails are counted on as the plugin counts on them,
/// `client::rails::plugin_rail_gbits`), and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct WorkerRails {
    pub agg: usize,
    pub plugin: usize,
    /// TALLY_RAILS (the user's, for both), "auto" (each mode's own, from
    /// the links' rate: the ranks are given TALLY_LINK_GBITS), or auto but
    /// fit to each worker's cores (then both are given that many).
    pub why: &'static str,
}

impl WorkerRails {
    /// The most rail threads a worker runs in any mode.
    pub fn most(&self) -> usize {
        self.agg.max(self.plugin)
    }

    /// The most threads a worker runs in any mode: its own, and one per
    /// rail but the one its own thread drives (one rail; with the caller's
    /// rail, on unless `TALLY_CALLER_RAIL=0`, rail 0).
    pub fn most_threads(&self, caller_rail: bool) -> usize {
        let threads = |rails: usize| if rails > 1 { 1 + rails - usize::from(caller_rail) } else { 1 };
        threads(self.agg).max(threads(self.plugin))
    }

    /// The `--rails` a rank is given: none where each mode resolves its own.
    pub fn forced(&self) -> Option<usize> {
        (self.why != "auto").then_some(self.most())
    }
}

/// [`WorkerRails`]: TALLY_RAILS, else auto (over tcp on 8+ cores, as few as
/// carry the link, `client::rails::auto_rails`), but no more than fit the
/// worker's share of the workers' cores (`bench::allreduce::pinning`): one
/// rail a core, and under busy polling (`busy`) one core kept for the
/// worker's own thread, which spins there; under adaptive polling it
/// sleeps while its rails work, and shares a core with one. Every worker
/// sees the whole host: shares that wrap put two busy pollers on one core
/// (on 16 cores, 3 workers of 1 + 3 threads on cores 6-15 stalled
/// operations for 1.3 s), while keeping a core for a sleeping thread left
/// each 8 + 8 worker on x2 one rail on one of its two cores (agg 0.49-0.69
/// of 16 Gbit/s against 0.73-0.95 on two rails, docs/measurements.md).
pub(super) fn worker_rails(hosts: u32, worker_cores: Option<&str>, rate: f64, busy: bool) -> WorkerRails {
    use tally_engine::client::{caller_rail_from_env, rails::plugin_rail_gbits, rails::resolve_rails, rails::RAIL_GBITS};
    let asked = std::env::var("TALLY_RAILS").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(0);
    let link = link_gbits(rate);
    let agg = resolve_rails(asked, "tcp", hosts as usize, link, RAIL_GBITS);
    let plugin = resolve_rails(asked, "tcp", hosts as usize, link, plugin_rail_gbits(caller_rail_from_env(), link));
    if asked != 0 {
        return WorkerRails { agg, plugin, why: "TALLY_RAILS" };
    }
    let block = worker_cores.and_then(|w| tally_engine::host::cpuset::CoreList::parse(w).ok()).map(|l| l.len() / hosts.max(1) as usize);
    match block.and_then(|b| fit_rails(agg.max(plugin), b, busy)) {
        Some(n) => WorkerRails { agg: n, plugin: n, why: "auto, fit to each worker's cores" },
        None => WorkerRails { agg, plugin, why: "auto" },
    }
}

/// The rails a worker of `share` cores runs when it would run `most`
/// (`worker_rails` says why), or None where they fit as they are.
fn fit_rails(most: usize, share: usize, busy: bool) -> Option<usize> {
    let room = if busy { share.saturating_sub(1) } else { share };
    (most > 1 && room < most).then_some(room.max(1))
}

/// The link rate the ranks are told (TALLY_LINK_GBITS): the caller's where
/// set, else the links' own.
pub(super) fn link_gbits(rate: f64) -> f64 {
    match tally_engine::client::link_gbits_from_env() {
        g if g > 0.0 => g,
        _ => rate,
    }
}

/// The pollers the emulated cluster runs on this machine: every server's
/// lcores, and per worker its `threads` (`WorkerRails::most_threads`).
pub(super) fn pollers(hosts: u32, server_lcores: &[String], threads: usize) -> usize {
    let lcores: usize = server_lcores.iter().map(|l| tally_engine::host::cpuset::CoreList::parse(l).map_or(1, |c| c.len())).sum();
    lcores + hosts as usize * threads
}

/// `--poll auto` in the emulated cluster: adaptive. Every emulated host
/// shares this machine's cores with the kernel's TCP work of every link
/// (softirq runs on whichever core the packet lands), so no poller's core
/// is its own, and busy polling bought no link in the later comparisons
/// while it cost CPU: on nvidia-h200-x2, 4 + 4 hosts, both 0.99 of the bound
/// at 8 Gbit/s (workers 1.03-1.07 s/GB adaptive against 3.16-3.28 with two
/// busy rails) and at 16 (adaptive 40% less CPU), 0.72-0.87 either way at 32
/// (one earlier machine gave busy 0.95 against 0.80-0.84 there); on 64 cores
/// 8 + 8 at 16 busy ran 64 of 64 cores and reached 0.35, the ring 0.63
/// (docs/measurements.md). `--poll busy` stays for who wants it.
pub(super) fn auto_poll() -> crate::cli_args::PollMode {
    crate::cli_args::PollMode::Adaptive
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli_args::PollMode;

    #[test]
    fn auto_rails_are_left_to_each_mode_and_forced_only_when_asked_or_fit_to_cores() {
        let auto = WorkerRails { agg: 2, plugin: 4, why: "auto" };
        assert_eq!((auto.most(), auto.forced()), (4, None));
        let fit = WorkerRails { agg: 2, plugin: 2, why: "auto, fit to each worker's cores" };
        assert_eq!(fit.forced(), Some(2));
        let asked = WorkerRails { agg: 3, plugin: 3, why: "TALLY_RAILS" };
        assert_eq!(asked.forced(), Some(3));
    }

    #[test]
    fn rails_fit_a_workers_share_one_a_core_and_a_core_more_for_a_busy_workers_own_thread() {
        // 8 + 8 on 32 cores: 2 cores a worker, 2 or 4 rails wanted.
        assert_eq!(fit_rails(2, 2, false), None);
        assert_eq!(fit_rails(4, 2, false), Some(2));
        assert_eq!(fit_rails(2, 2, true), Some(1));
        assert_eq!(fit_rails(4, 2, true), Some(1));
        // 4 + 4 on 32 cores: 6 cores a worker hold 4 rails either way.
        assert_eq!(fit_rails(4, 6, false), None);
        assert_eq!(fit_rails(4, 6, true), None);
        // One rail, or a share of one core: one rail.
        assert_eq!(fit_rails(1, 1, true), None);
        assert_eq!(fit_rails(4, 1, false), Some(1));
        assert_eq!(fit_rails(4, 0, true), Some(1));
    }

    #[test]
    fn pollers_count_every_lcore_and_each_workers_thread_and_rails() {
        // x2: 4 + 4 hosts, 2 lcores a server, 4 rails a worker.
        let lists: Vec<String> = ["0-1", "2-3", "4-5", "6-7"].iter().map(|s| s.to_string()).collect();
        let four = WorkerRails { agg: 2, plugin: 4, why: "auto" };
        assert_eq!(pollers(4, &lists, four.most_threads(false)), 8 + 4 * 5);
        // The caller's rail: rail 0 on the worker's own thread.
        assert_eq!(four.most_threads(true), 4);
        // One rail: the worker's own thread drives it.
        let one = WorkerRails { agg: 1, plugin: 1, why: "auto" };
        assert_eq!(pollers(4, &lists, one.most_threads(true)), 8 + 4);
        assert_eq!(auto_poll(), PollMode::Adaptive);
    }

    #[test]
    fn placement_gives_servers_cores_of_their_own_when_it_can() {
        let (l, w, _) = place(4, 16, None, 32.0);
        assert_eq!(l, ["0-1", "2-3", "4-5", "6-7"]);
        assert_eq!(w.as_deref(), Some("8-15"));
        let (l, w, _) = place(8, 16, None, 16.0);
        assert_eq!(l[7], "7");
        assert_eq!(w.as_deref(), Some("8-15"));
        // 32 cores, 4 + 4: 4 lcores a server above 16 Gbit/s, else 2.
        let (l, w, t) = place(4, 32, None, 32.0);
        assert_eq!((l[3].as_str(), w.as_deref()), ("12-15", Some("16-31")));
        assert!(t.ends_with("workers pinned to cores 16-31 (4 each)"), "{t}");
        let (l, w, _) = place(4, 32, None, 16.0);
        assert_eq!((l[3].as_str(), w.as_deref()), ("6-7", Some("8-31")));
        let (l, _, _) = place(8, 32, None, 32.0);
        assert_eq!(l[7], "14-15");
        // At 8 Gbit/s and below one lcore a server, wherever the cores allow.
        let (l, w, t) = place(4, 16, None, 8.0);
        assert_eq!(l, ["0", "1", "2", "3"]);
        assert_eq!(w.as_deref(), Some("4-15"));
        assert!(t.ends_with("workers pinned to cores 4-15 (3 each)"), "{t}");
        let (l, _, _) = place(4, 64, None, 4.0);
        assert_eq!(l[3], "3");
        let (l, _, _) = place(4, 16, Some(2), 8.0);
        assert_eq!(l[3], "6-7", "--server-lcores wins");
        let (l, w, t) = place(4, 2, None, 32.0);
        assert!(l.iter().all(|x| x == "0-1") && w.is_none() && t.starts_with("shared"), "{t}");
    }
}
