//! A job looping over all-reduces against several real `tally server`
//! processes, every element checked: what the drain and failover tests
//! run while they stop or kill servers under it.
use crate::{client, ServerProcess};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally_engine::client::failover::FailoverStats;
use tally_engine::client::{Client, ClientConfig};
use tally_engine::reduce::{DataType, ReduceOp};

/// A server on one lcore (core 0) unless `extra` names its lcores.
pub fn server(provider: &str, extra: &[&str]) -> ServerProcess {
    server_on("127.0.0.1:0", provider, extra)
}

/// As [`server`], listening on `listen`.
pub fn server_on(listen: &str, provider: &str, extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--provider", provider, "--poll", "adaptive"];
    if !extra.contains(&"--slab-size") {
        args.extend(["--slab-size", "16M"]);
    }
    if !extra.contains(&"--lcores") {
        args.extend(["--lcores", "0"]);
    }
    args.extend_from_slice(extra);
    ServerProcess::start_on(listen, &args)
}

pub fn sigterm(s: &ServerProcess) {
    // SAFETY: signalling our own child process, not yet reaped.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
}

/// Waits (bounded) for the server process to exit; its status and when.
pub fn wait_exit(s: &mut ServerProcess, bound: Duration) -> Option<(std::process::ExitStatus, Instant)> {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if let Some(st) = s.child.try_wait().unwrap() {
            return Some((st, Instant::now()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

pub fn multi(provider: &str, addrs: &[String], job: u64, rank: u32, n: u32) -> ClientConfig {
    let mut c = client(provider, &addrs[0], job, rank, n);
    c.servers = addrs.to_vec();
    c.chunk_bytes = 64 << 10;
    c
}

/// Bytes of round `round`'s all-reduce: 4 KiB to 1 MiB, odd sizes included.
pub fn round_bytes(round: usize) -> usize {
    const SIZES: [usize; 6] = [4 << 10, 12 << 10, 64 << 10, (256 << 10) + 12, 1 << 20, 100_000];
    SIZES[round % SIZES.len()]
}

/// How the ranks of [`loop_job`] run.
#[derive(Clone, Copy, Default)]
pub struct Shape {
    /// Odd rounds are f32 max instead of sum: a second sub-job (server job).
    pub mixed: bool,
    /// Every rank sleeps this long after this round (idle between all-reduces).
    pub pause: Option<(usize, Duration)>,
    /// Two lcores per server instead of one (six streams, four after the drain).
    pub two_lcores: bool,
    /// Every rank sleeps this long after every round: a floor under the
    /// loop's length, for tests that need it to outlast something timed.
    pub pace: Option<Duration>,
    /// Fault injection: rank `.0` drops the results server `.1` sends for
    /// operations from index `.2` on (see `ClientConfig::fault_drop_results`).
    pub drop_results: Option<(u32, usize, u64)>,
    /// Fault injection: the ranks in this mask put off their first taking
    /// back of a lost server (see `ClientConfig::fault_rejoin_put_off`).
    pub put_off: u32,
    /// Fault injection: the ranks in this mask hear of sub-job 0's recovery
    /// only after a later sub-job's verdict (see `ClientConfig::fault_late_news`).
    pub late_news: u32,
    /// Rails per rank (`ClientConfig::rails`); None: the default (one on
    /// this 2-core machine).
    pub rails: Option<usize>,
    /// The copier copies staged results off the rails (`ClientConfig::copier`).
    pub copier: bool,
    /// The caller's thread drives rail 0 (`ClientConfig::caller_rail`).
    pub caller_rail: bool,
    /// The ranks' fabric address (`ClientConfig::fabric_addr`): where the
    /// servers sit in network namespaces (see `netns`).
    pub fabric_addr: Option<&'static str>,
    /// Every third round (0, 3, ...) is [`LARGE_ROUND`] bytes instead.
    pub large: bool,
    /// The ranks stop before this round (`usize::MAX` until the test sets
    /// it, a few rounds past rank 0's progress: no rank is more than one
    /// round ahead of another): a loop as long as what the test does under
    /// it, however fast or slow the host.
    pub stop_at: Option<&'static AtomicUsize>,
    /// Each rank keeps the buffers of these rounds once their results are
    /// checked, fills them with [`REUSED`] as a caller reusing them would,
    /// and checks once the loop is over that nothing wrote there since: a
    /// receive the client gave up on at a fault and that the provider
    /// still completed later (its server's data came after all) would. A
    /// kept buffer shows such a write whenever it lands, where a reused one
    /// shows it only if it lands after the new result and before its check.
    pub keep: Option<(usize, usize)>,
}

/// What a kept buffer holds once its round is over (`Shape::keep`): no
/// all-reduce of the loop sums to it.
pub const REUSED: f32 = -1.5;

/// A large round: 2 MiB and 12 bytes, 33 pieces of 64 KiB, 11 a stream over
/// three: more than a window in flight on every stream.
pub const LARGE_ROUND: usize = (2 << 20) + 12;

/// A job of `n` rank threads over `addrs`, each running `rounds` f32 sums
/// (or maxima) of `round_bytes(round)` (or [`LARGE_ROUND`]: `Shape::large`) (rank r's element i is r + i mod 97 +
/// round: exact), every element checked; `progress` counts rank 0's rounds done;
/// `shape` the servers' and ranks' settings (`Shape::default()`: the plain job).
pub fn loop_job(
    provider: &str,
    addrs: &[String],
    job: u64,
    n: u32,
    rounds: usize,
    progress: Arc<AtomicUsize>,
    shape: Shape,
) -> Vec<std::thread::JoinHandle<Result<FailoverStats, String>>> {
    (0..n)
        .map(|rank| {
            let mut cfg = multi(provider, addrs, job, rank, n);
            if let Some(r) = shape.rails {
                cfg.rails = r;
            }
            cfg.copier = shape.copier;
            cfg.caller_rail = shape.caller_rail;
            cfg.fabric_addr = shape.fabric_addr.map(String::from);
            if let Some((r, si, from)) = shape.drop_results {
                if r == rank {
                    cfg.fault_drop_results = Some((si, from));
                }
            }
            cfg.fault_rejoin_put_off = shape.put_off & (1 << rank) != 0;
            cfg.fault_late_news = shape.late_news & (1 << rank) != 0;
            let progress = progress.clone();
            std::thread::spawn(move || {
                let mut kept: Vec<(usize, Vec<f32>)> = Vec::new();
                let mut c = Client::connect(cfg).map_err(|e| e.to_string())?;
                if shape.mixed {
                    // Both sub-jobs from the start (a join is collective).
                    c.join(DataType::Float32, ReduceOp::Sum).map_err(|e| e.to_string())?;
                    c.join(DataType::Float32, ReduceOp::Max).map_err(|e| e.to_string())?;
                }
                for round in 0..rounds {
                    if shape.stop_at.is_some_and(|s| round >= s.load(Ordering::Relaxed)) {
                        break;
                    }
                    let bytes = if shape.large && round % 3 == 0 { LARGE_ROUND } else { round_bytes(round) };
                    let count = bytes / 4;
                    let max = shape.mixed && round % 2 == 1;
                    let op = if max { ReduceOp::Max } else { ReduceOp::Sum };
                    let send: Vec<f32> = (0..count).map(|i| (rank as usize + i % 97 + round) as f32).collect();
                    let mut out = vec![0f32; count];
                    c.allreduce(bytemuck::cast_slice(&send), bytemuck::cast_slice_mut(&mut out), DataType::Float32, op)
                        .map_err(|e| format!("rank {rank} round {round}: {e}"))?;
                    if let Some(damage) = wrong(&out, expected(n, round, max)) {
                        return Err(format!("rank {rank} round {round}: {damage}"));
                    }
                    if shape.keep.is_some_and(|(from, to)| (from..to).contains(&round)) {
                        out.fill(REUSED);
                        kept.push((round, out));
                    }
                    if rank == 0 {
                        progress.store(round + 1, Ordering::Relaxed);
                    }
                    if let Some((at, pause)) = shape.pause {
                        if round + 1 == at {
                            std::thread::sleep(pause);
                        }
                    }
                    if let Some(pace) = shape.pace {
                        std::thread::sleep(pace);
                    }
                }
                let stats = c.failover_stats();
                drop(c);
                for (round, out) in &kept {
                    if let Some(damage) = wrong(out, |_| REUSED) {
                        return Err(format!("rank {rank}: round {round}'s buffer was written after its all-reduce returned: {damage}"));
                    }
                }
                Ok(stats)
            })
        })
        .collect()
}

/// Element i of round `round`'s result over `n` ranks (rank r's input is
/// r + i mod 97 + round): their sum, or with `max` their maximum.
fn expected(n: u32, round: usize, max: bool) -> impl Fn(usize) -> f32 {
    move |i| {
        if max {
            (n as usize - 1 + i % 97 + round) as f32
        } else {
            (0..n).map(|r| (r as usize + i % 97 + round) as f32).sum()
        }
    }
}

/// Where `out` differs from `want`, for diagnosis: the first element, how
/// many, their range, the buffer's address and the first few values.
fn wrong(out: &[f32], want: impl Fn(usize) -> f32) -> Option<String> {
    let i = out.iter().enumerate().position(|(i, v)| *v != want(i))?;
    let bad: Vec<usize> = (i..out.len()).filter(|&j| out[j] != want(j)).collect();
    let few: Vec<String> = bad.iter().take(6).map(|&j| format!("{j}: {} (want {})", out[j], want(j))).collect();
    Some(format!(
        "element {i} = {}, want {}; {} of {} elements wrong, from {i} to {} (buffer at {:p}); {}",
        out[i],
        want(i),
        bad.len(),
        out.len(),
        bad.last().copied().unwrap_or(i),
        out.as_ptr(),
        few.join(", ")
    ))
}

pub fn results(hs: Vec<std::thread::JoinHandle<Result<FailoverStats, String>>>) -> Vec<Result<FailoverStats, String>> {
    hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

/// Waits until the loop job reached round `round` (bounded), or a rank
/// ended early (its result is checked by the caller).
pub fn wait_for_round<T>(progress: &AtomicUsize, round: usize, ranks: &[std::thread::JoinHandle<T>]) {
    let t0 = Instant::now();
    while progress.load(Ordering::Relaxed) < round {
        assert!(t0.elapsed() < Duration::from_secs(60), "the loop did not reach round {round}");
        if ranks.iter().any(|h| h.is_finished()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Measures the longest time rank 0's round counter stood still, from now
/// until [`StallMeter::stop`].
pub struct StallMeter {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Duration>,
}

impl StallMeter {
    pub fn start(progress: Arc<AtomicUsize>) -> StallMeter {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut last, mut since, mut worst) = (progress.load(Ordering::Relaxed), Instant::now(), Duration::ZERO);
            while !s2.load(Ordering::Relaxed) {
                let now = progress.load(Ordering::Relaxed);
                if now != last {
                    (last, since) = (now, Instant::now());
                }
                worst = worst.max(since.elapsed());
                std::thread::sleep(Duration::from_millis(1));
            }
            worst
        });
        StallMeter { stop, thread }
    }

    pub fn stop(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("stall meter")
    }
}

/// What a gray-failure loop test saw (see `grayfail.rs`, `linkcut.rs`).
pub struct GrayOutcome {
    /// The server was taken back after the fault ended.
    pub back: bool,
    /// Rounds done while the fault lasted.
    pub during: usize,
    /// The longest the loop stood still.
    pub worst: Duration,
    /// Rank 0's round when it was taken back, of `rounds`.
    pub back_round: usize,
    pub rounds: usize,
}

/// Checks a gray-failure loop: every operation right, the job failed over
/// (the loop moved during the fault and never stood still for `bound`), and
/// took the server back in time to use it to the end of the job.
pub fn check_gray_outcome(o: &GrayOutcome, res: &[Result<FailoverStats, String>], server: &ServerProcess, job: u64, bound: Duration) {
    let logs = server.log.lock().unwrap().join("\n");
    for r in res {
        assert!(r.is_ok(), "an operation failed: {r:?}\n{logs}");
    }
    assert!(o.back, "the server was not taken back after the fault:\n{logs}");
    assert!(o.during > 0, "the loop made no progress during the fault");
    assert!(o.worst < bound, "the loop stood still for {:?} (bound {bound:?})", o.worst);
    assert!(o.back_round + 100 < o.rounds, "taken back too late (round {}) to show the job used it", o.back_round);
    for r in res.iter().flatten() {
        assert_eq!((r.recoveries, r.rejoins), (1, 1), "{r:?}");
    }
    // It carried the rest of the loop with the others: the job ends cleanly there.
    assert!(server.wait_log(&format!("job {job:#x}: every rank finished"), Duration::from_secs(5)), "{logs}");
}
