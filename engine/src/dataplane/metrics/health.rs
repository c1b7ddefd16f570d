//! Whether a server is alive and whether it is ready: what `/healthz` and
//! `/readyz` answer, and what `tally_server_draining` says.
//!
//! Two facts, each one atomic with one writer, read by the metrics thread
//! without a lock:
//!
//! - **Alive**: the control loop ([`crate::control::ControlPlane::run`])
//!   stamps the time of every turn (it turns at least every 20 ms). A stamp
//!   older than [`ALIVE_WITHIN`] means the loop is stuck, and a server whose
//!   control loop is stuck admits, ends and heartbeats nothing: a supervisor
//!   should restart it.
//! - **Ready**: the server's phase, which only moves forward: starting (set-up
//!   is under way), serving (the lcores are up, the control port listens and
//!   the control thread runs: `Server::start` returned), draining (it admits no new
//!   jobs), stopping. Ready is serving and alive: a load balancer or a
//!   scheduler sends new jobs only there.
//!
//! The stamps are milliseconds since the [`ServerHealth`] was made, so that
//! an `Instant` fits one `AtomicU64`.
//!
//! # Observability: metrics, job-end lines, health, systemd
//!
//! Per-lcore counters (`lcore::Counters`: polls, empty polls, completions, bytes in/out, errors,
//! sleeps; `Server::stats` reads them) and per-(lcore, job) counter blocks with a round-latency
//! histogram (`engine/src/dataplane/metrics/mod.rs`, whose module doc says how they are laid out,
//! written and read) are served as Prometheus text on `/metrics` by
//! `tally server --metrics ADDR:PORT` from its own thread; `tally stats` renders them live. A job's
//! series (`tally_job_*{job,index,lcore}`) are written only while the control plane publishes the job
//! (`JobInfo`, joining to ending): an ended job's series leave `/metrics`, the per-lcore totals keep
//! what it moved, and its job-end line (below) keeps its rounds. Per-lcore
//! gauges: operations in flight (written by the lcore), and the bytes of its slab held by job regions
//! and the slab's size (`tally_lcore_slab_used_bytes`, `tally_lcore_slab_bytes`, written by the
//! control plane, which carves the slabs). The control plane's own (`ControlCounters`, one writer:
//! the control thread): connections in their handshake (`tally_control_handshakes`) and past it
//! (`tally_control_joined`), accepted, handshakes closed at their deadline, refusals by reason
//! (`tally_control_refusals_total{reason}`: busy, unauthorized, bad_field, no_capacity, ...) and a
//! histogram of the time from a job's first join to its running
//! (`tally_control_join_to_running_seconds`). The server's own: `tally_build_info{version,target} 1`
//! (the crate version; the target from the compiler's constants, `x86_64-linux-gnu`; no git commit,
//! which would need git at build time) and `tally_server_draining` (0, then 1 from the moment the
//! control plane starts a drain).
//!
//! **A job's end** is logged with its rounds over all its lcores (`RoundSummary`: how many, the mean
//! and the histogram buckets of the median, the 99th percentile and the slowest, from a round's first
//! piece in to its results posted), and with how long the rounds waited for their last piece after
//! the one before it, summed by that last piece's rank (ranks 0-6 apart, the rest together), with
//! the longest wait, its rank and the wall-clock time it ended (`JobCounters::record_last_wait`, from `complete.rs`; a slot's first
//! round, which waits for the ranks to start, is left out). A rank that is late again and again, a
//! straggler, stands out there from a network's random tail; a rank late at every server of a job by
//! the same amount was late itself (its process, its host or its link), not one server. The lcore
//! reads the clock for a round's first piece and its last two, not for every rank's.
//!
//! **Health and readiness** (`engine/src/dataplane/metrics/health.rs`, `http.rs`: their module docs
//! are the long version, the endpoint's bounds included). The metrics port also answers `/healthz`
//! and `/readyz`, each a line of plain text read from `ServerHealth`. *Alive* (`/healthz`): 200 while
//! the control loop's last stamp is at most 5 s old, else 503 "the control loop has not turned for X
//! s"; busy lcores do not make it late (they are other threads), and a stuck lcore is the control
//! loop's watchdog's business ("Failure detection"). *Ready* (`/readyz`): 200 only while serving and
//! alive, else 503 naming the phase (serving from `Server::start`'s return, when READY=1 goes out, draining from
//! `start_drain`). A request is at most 8 KiB. Nobody who reaches the port (it takes no token) can keep
//! a probe out: every connection is served at once on the endpoint's thread, a request has 2 s from
//! its accept and an answer 2 s to go out, however slowly bytes come, and a source holds at most 8
//! connections, 256 in all, a newcomer displacing the oldest one still waiting for its request.
//!
//! **systemd** (`engine/src/host/sd_notify.rs`, whose module doc has the protocol;
//! `tools/src/cmd/server.rs`, `config/tally-server.service`, `Type=notify`). `tally server` sends
//! `READY=1` and a `STATUS=` where it prints "tally server ready on ..." (`Server::start` returned:
//! lcores up, listener bound, control thread started), `STOPPING=1` at the first signal, and
//! `STATUS=draining: N jobs left` as the drain goes. When `WATCHDOG_USEC` is set (and `WATCHDOG_PID`,
//! if set, is this process), the control loop sends `WATCHDOG=1` every half of it from its own turn
//! (`ControlPlane::feed_watchdog`), so the pings stop when the loop stops turning and systemd
//! (`WatchdogSec=10s` in the unit) kills and restarts the server; the main thread could not tell.
//! Kubernetes probes the same `/healthz` and `/readyz` over HTTP (config/k8s/).
//!
//! The release profile keeps frame pointers and line tables (`.cargo/config.toml`,
//! `Cargo.toml`) so `perf record -g` gives readable stacks: docs/profiling.md.
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// A control loop that has not turned for this long is not alive. It turns
/// at least every 20 ms (its tick); 5 s leaves room for a loaded machine
/// without letting a stuck loop look alive for long.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(5);

/// Where a server is in its life; it only moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum ServerPhase {
    Starting = 0,
    Serving = 1,
    Draining = 2,
    Stopping = 3,
}

impl ServerPhase {
    fn from_u8(v: u8) -> ServerPhase {
        match v {
            0 => ServerPhase::Starting,
            1 => ServerPhase::Serving,
            2 => ServerPhase::Draining,
            _ => ServerPhase::Stopping,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ServerPhase::Starting => "starting",
            ServerPhase::Serving => "serving",
            ServerPhase::Draining => "draining",
            ServerPhase::Stopping => "stopping",
        }
    }
}

/// A server's liveness and readiness, shared by the control loop (writer)
/// and the metrics thread (reader).
pub struct ServerHealth {
    born: Instant,
    phase: AtomicU8,
    /// Milliseconds from `born` to the control loop's last turn.
    turned_ms: AtomicU64,
}

impl Default for ServerHealth {
    fn default() -> Self {
        ServerHealth::new()
    }
}

impl ServerHealth {
    /// Starting, and counted as turned now (the control loop gets
    /// [`ALIVE_WITHIN`] to begin).
    pub fn new() -> ServerHealth {
        ServerHealth { born: Instant::now(), phase: AtomicU8::new(ServerPhase::Starting as u8), turned_ms: AtomicU64::new(0) }
    }

    /// Moves the phase forward to `to` (never back: a drain that began
    /// stays a drain whoever says "serving" late).
    pub fn advance(&self, to: ServerPhase) {
        self.phase.fetch_max(to as u8, Ordering::Relaxed);
    }

    pub fn phase(&self) -> ServerPhase {
        ServerPhase::from_u8(self.phase.load(Ordering::Relaxed))
    }

    /// 1 while the server drains or stops (`tally_server_draining`).
    pub fn draining(&self) -> bool {
        self.phase() >= ServerPhase::Draining
    }

    /// The control loop turned at `now`. One store; called once per turn.
    #[inline]
    pub fn control_turned(&self, now: Instant) {
        self.turned_ms.store(now.saturating_duration_since(self.born).as_millis() as u64, Ordering::Relaxed);
    }

    /// How long ago, at `now`, the control loop last turned.
    pub fn since_turn(&self, now: Instant) -> Duration {
        let turned = self.born + Duration::from_millis(self.turned_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(turned)
    }

    /// `/healthz` at `now`: Ok with a line saying so, or Err with the reason.
    pub fn alive_at(&self, now: Instant) -> Result<Healthy, Unhealthy> {
        let since = self.since_turn(now);
        if since <= ALIVE_WITHIN {
            return Ok(Healthy::Alive { since });
        }
        let started = self.phase() != ServerPhase::Starting;
        Err(Unhealthy::NotAlive { started, since })
    }

    /// `/readyz` at `now`: Ok when it serves and is alive, else Err with
    /// the reason (starting, draining, stopping, or not alive).
    pub fn ready_at(&self, now: Instant) -> Result<Healthy, Unhealthy> {
        match self.phase() {
            ServerPhase::Starting => Err(Unhealthy::Starting),
            ServerPhase::Draining => Err(Unhealthy::Draining),
            ServerPhase::Stopping => Err(Unhealthy::Stopping),
            ServerPhase::Serving => self.alive_at(now).map(|_| Healthy::Ready),
        }
    }
}

/// A probe that passes; its `Display` is the line the probe serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Healthy {
    /// `/healthz`: the control loop turned `since` ago.
    Alive { since: Duration },
    /// `/readyz`: serving and alive.
    Ready,
}

impl fmt::Display for Healthy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Healthy::Alive { since } => writeln!(f, "alive: the control loop turned {} ms ago", since.as_millis()),
            Healthy::Ready => writeln!(f, "ready"),
        }
    }
}

/// Why a probe fails; its `Display` is the line the probe serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unhealthy {
    /// The control loop has not turned within [`ALIVE_WITHIN`] (`started`:
    /// it had turned before, so it is stuck rather than not started).
    NotAlive {
        started: bool,
        since: Duration,
    },
    Starting,
    Draining,
    Stopping,
}

impl fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unhealthy::NotAlive { started, since } => {
                let what = if *started { "has not turned" } else { "has not started" };
                writeln!(f, "not alive: the control loop {what} for {:.1} s (limit {} s)", since.as_secs_f64(), ALIVE_WITHIN.as_secs())
            }
            Unhealthy::Starting => writeln!(f, "starting: the lcores, listener and control loop are not all up yet"),
            Unhealthy::Draining => writeln!(f, "draining: admitting no new jobs, moving running ones to their other servers"),
            Unhealthy::Stopping => writeln!(f, "stopping"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alive_while_the_control_loop_turns_and_not_after() {
        let h = ServerHealth::new();
        let t0 = h.born;
        assert!(h.alive_at(t0 + Duration::from_secs(1)).is_ok());
        // Never turned past the limit: "has not started".
        let e = h.alive_at(t0 + Duration::from_secs(6)).unwrap_err().to_string();
        assert!(e.starts_with("not alive: the control loop has not started for 6.0 s"), "{e}");
        h.advance(ServerPhase::Serving);
        h.control_turned(t0 + Duration::from_secs(10));
        assert!(h.alive_at(t0 + Duration::from_secs(12)).unwrap().to_string().starts_with("alive: the control loop turned 2000 ms ago"));
        let e = h.alive_at(t0 + Duration::from_secs(16)).unwrap_err().to_string();
        assert!(e.starts_with("not alive: the control loop has not turned for 6.0 s"), "{e}");
    }

    #[test]
    fn ready_only_while_serving_and_alive() {
        let h = ServerHealth::new();
        let t0 = h.born;
        assert!(h.ready_at(t0).unwrap_err().to_string().starts_with("starting"));
        assert!(!h.draining());
        h.advance(ServerPhase::Serving);
        h.control_turned(t0);
        assert_eq!(h.ready_at(t0 + Duration::from_millis(100)).unwrap().to_string(), "ready\n");
        // Serving but stuck: not ready either.
        assert!(h.ready_at(t0 + Duration::from_secs(6)).unwrap_err().to_string().starts_with("not alive"));
        h.advance(ServerPhase::Draining);
        assert!(h.draining());
        assert!(h.ready_at(t0).unwrap_err().to_string().starts_with("draining"));
        // The phase never goes back.
        h.advance(ServerPhase::Serving);
        assert_eq!(h.phase(), ServerPhase::Draining);
        h.advance(ServerPhase::Stopping);
        assert!(h.ready_at(t0).unwrap_err().to_string().starts_with("stopping"));
        assert!(h.draining());
    }
}
