//! How a client reaches its servers and cuts its work ([`ClientConfig`]):
//! the fields, their defaults and the environment variables that set them.
use super::{servers, watchdog};
use crate::client::error::ClientError;
use crate::wire::{self, JobSecret};
use std::time::Duration;

/// The smallest piece an all-reduce is cut into when it is spread over
/// streams: below this, a piece's fixed costs outweigh the parallelism.
pub const MIN_SPREAD_PIECE: usize = 4096;

/// The largest `min_piece` (TALLY_MIN_PIECE) a client takes; the servers
/// refuse a Hello above it alike. `op_chunk_bytes` (`state.rs`) never cuts past the
/// job's chunk, so a minimum above every chunk a server grants (at most its
/// `max_chunk`, 1 MiB by default, within its slab per lcore) means "never
/// spread" and nothing more; 1 GiB is past any of them. The bound keeps the
/// rounding up to a multiple of `min_piece` far from overflow (a wrapped
/// share would cut an all-reduce into single elements) and the value within
/// the Hello's u32.
pub const MAX_MIN_PIECE: usize = wire::MAX_MIN_PIECE as usize;

/// How to reach the servers and cut the work.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Control addresses (`host:port`) of the servers, each once, in the
    /// same order on every rank (see [`servers`]), at most
    /// [`servers::MAX_SERVERS`].
    pub servers: Vec<String>,
    /// The same on every rank of the job.
    pub job_id: u64,
    pub rank: u32,
    pub nranks: u32,
    /// Shared token (TALLY_TOKEN), at most 32 bytes.
    pub token: String,
    /// The job's secret, the same on every rank of the job and known to no
    /// one else (`wire::auth`): the servers hold every rank, and a rejoin
    /// that would fence the job, to it. Draw it once per job
    /// ([`ClientConfig::draw_job_secret`]) and give it to every rank as the
    /// job id is given (the plugin carries it in rank 0's CollNet handle).
    /// The default is derived from the job id, so anyone who knows the id
    /// (it is on the servers' `/metrics`) can compute it: fine for a job
    /// whose ranks share a process or a test, not for a shared server.
    pub job_secret: JobSecret,
    /// Bytes per shard piece (rounded down to whole elements per type).
    /// Default from TALLY_CHUNK (K/M suffixes), else 256 KiB. Over
    /// tcp;ofi_rxm a chunk at or below the eager limit (32 KiB, see
    /// `fabric::defaults`) avoids a rendezvous round trip per chunk.
    pub chunk_bytes: usize,
    /// Chunks in flight per (server, lcore). 0: [`auto_window`] of
    /// `chunk_bytes`, resolved when the client connects. Default from
    /// TALLY_WINDOW, else 0.
    pub window: u32,
    /// Lcores to use per server (0: all of them).
    pub shards: u32,
    /// Fabric provider (None: TALLY_PROVIDER or tally's default).
    pub provider: Option<String>,
    /// Local address for the fabric endpoint (tcp), e.g. this host's address on the servers' network.
    pub fabric_addr: Option<String>,
    /// Bound on an all-reduce making no progress.
    pub timeout: Duration,
    /// Bound on joining: all ranks must arrive, and a server that says
    /// `busy` (a join storm) is tried again with jittered backoff until
    /// then. Default from TALLY_JOIN_TIMEOUT_S, else 120 s: the ranks of a
    /// thousand-node job start over a minute or more. (The server has its
    /// own, `join_timeout_s`, for all ranks to arrive.)
    pub join_timeout: Duration,
    /// Spin this many empty polls before sleeping on the CQ, where the
    /// caller's thread waits (`Client::wait`). Default from
    /// TALLY_SPIN_POLLS, else 2048.
    pub spin_polls: u32,
    /// The same for each rail thread and the copier, which the CQ's
    /// descriptor or the client's bell wakes. Default from
    /// TALLY_RAIL_SPIN_POLLS, else [`RAIL_SPIN_POLLS`].
    pub rail_spin_polls: u32,
    /// Longest sleep on the CQ (ms) before polling again. Traffic wakes the
    /// client through the CQ's descriptor (tcp), so this bounds only a
    /// missed wake-up; shm and EFA nap 50 us whatever it says. Hundreds of
    /// clients on a few cores (a load generator) raise it: each wake-up of
    /// an idle client costs system calls. Default 1.
    pub sleep_ms: u32,
    /// Sends in flight per server (0: as many as the windows allow).
    /// Default from TALLY_SEND_CREDITS, else 0.
    pub send_credits: u32,
    /// Smallest piece an all-reduce is cut into to spread it over streams
    /// (see [`op_chunk_bytes`]). Must be the same on every rank. Default
    /// from TALLY_MIN_PIECE, else [`MIN_SPREAD_PIECE`]; at most
    /// [`MAX_MIN_PIECE`] (a larger one is refused by [`Client::connect`]).
    pub min_piece: usize,
    /// Later jobs (dtype, op pairs after the first) the servers keep room
    /// for from the first job's admission, so that none is refused for
    /// capacity mid-run: a server without the room refuses the first job
    /// instead ([`wire::JobSpec::reserve`]). 0 to [`wire::MAX_RESERVE`];
    /// the same on every rank. Default from TALLY_COMM_JOBS (the jobs of a
    /// communicator in all, so this is one less), else 0; the plugin's
    /// default is 1 (f32 at init and one more, such as bf16).
    pub reserve: u8,
    /// Order each operation's stream set lcore-major (lcore 0 of every
    /// server, then lcore 1 of every server, ...) instead of server-major,
    /// so that an operation of fewer chunks than streams (NCCL's CollNet
    /// steps: four 128 KiB pieces of a 512 KiB step) spreads over every
    /// server and rail instead of filling one server's lcores first. Must
    /// be the same on every rank: the Hello carries it
    /// ([`crate::wire::Hello::INTERLEAVE`]) and a server refuses a rank that
    /// differs. Default from TALLY_INTERLEAVE=1, else off: not yet measured
    /// against server-major on the device.
    pub interleave: bool,
    /// Survive the loss of a server when the job has others (see
    /// [`failover`]): every result lands in a staging area first and is
    /// copied out, so that a rank keeps what another may still need and no
    /// receive the provider cannot cancel writes into a buffer given back.
    /// Default on; TALLY_FAILOVER=0
    /// turns it off (a lost server then fails the job, as before).
    pub failover: bool,
    /// Fault injection, for tests of failover: results from server
    /// `.0` (its index in `servers`) of operations from index `.1` on are
    /// dropped as they arrive, as if lost in flight. None in real use.
    pub fault_drop_results: Option<(usize, u64)>,
    /// Fault injection, for tests of rejoins: this rank puts off its first
    /// taking back of a lost server, as though an operation posted to that
    /// server before the loss were still with the provider (it lets that
    /// rejoin go after waiting for it, and tries again). False in real use.
    pub fault_rejoin_put_off: bool,
    /// Fault injection, for tests of failover with several sub-jobs: this
    /// rank reads nothing on sub-job 0's control connections until it has
    /// heard a later sub-job's verdict, as though the leader's word of
    /// sub-job 0's recovery were still on its way when the later one's
    /// came (they come on different connections). False in real use.
    pub fault_late_news: bool,
    /// A two-rank job on one server asks it to relay its pieces of at most
    /// [`wire::RELAY_MAX`] bytes (each rank gets the other's piece and
    /// reduces the two itself: one hop through the server for the last
    /// piece in, instead of a reduce and two sends in a row). Must be the
    /// same on both ranks. Default on; TALLY_RELAY=0 turns it off (needed
    /// to join servers older than the relay, which refuse the flag).
    pub relay: bool,
    /// A job of 4 to 64 ranks on one server asks it to split its pieces of
    /// at most [`wire::SPLIT_MAX`] bytes by rank over its lcores (see
    /// `wire`'s module doc): each rank sends to its group's lcore, so no
    /// lcore copies every rank's piece in and the result out to every rank.
    /// Must be the same on every rank. Default on; TALLY_SPLIT=0 turns it
    /// off (needed to join servers older than the split, which refuse the
    /// flag).
    pub split: bool,
    /// Endpoints the client moves bytes through, each driven by its own
    /// thread, server `si` on rail `si mod rails`, or on its lanes with more
    /// rails than servers (see [`rails`]). 1: one endpoint on the caller's
    /// thread, no thread of its own. 0: auto ([`rails::auto_rails`]: over
    /// tcp, for 2+ servers on hosts of 8 or more cores, as few as carry
    /// [`ClientConfig::link_gbits`], or one per server but at least 4 where
    /// that is unknown). Default from TALLY_RAILS, else 0.
    pub rails: usize,
    /// The rate (Gbit/s each way) this rank's share of the link gives it, 0
    /// if unknown: auto rails run no more threads than carry it. Default
    /// from TALLY_LINK_GBITS, else 0 (`tally bench cluster` sets it to its
    /// links' rate for the commands it runs).
    pub link_gbits: f64,
    /// What auto rails count on each rail to carry (Gbit/s each way) where
    /// `link_gbits` is known: [`super::rails::RAIL_GBITS`], the NCCL plugin's
    /// [`super::rails::plugin_rail_gbits`].
    pub rail_gbits: f64,
    /// Cores to pin the rail threads to, one each in order, then one for
    /// the copier (empty: they keep the affinity of the thread that
    /// connects). From TALLY_RAIL_CORES.
    pub rail_cores: Vec<usize>,
    /// With rails, the caller's thread drives the first rail's endpoint
    /// itself, between its other work, and only the others get a thread
    /// each (`rails`'s module doc says why). Default on; TALLY_CALLER_RAIL=0
    /// gives every rail a thread.
    pub caller_rail: bool,
    /// With rail threads and failover on, one more thread copies staged
    /// results into the caller's buffers, off the rails' path (see
    /// [`rails`]'s `copier`). Default off (the rails copy): on the device
    /// it gave real NCCL +10% on one host and -10% on another
    /// (docs/measurements.md, "The copier"); TALLY_COPIER=1 turns it on.
    pub copier: bool,
    /// A server of a job that can fail over, heard once, then silent this
    /// long (no heartbeat, no message) is lost (see [`liveness`]). Default
    /// from TALLY_LIVENESS_MS, else 2 s; zero: never.
    pub liveness: Duration,
    /// A provider call on one of the client's endpoints that has not
    /// returned for this long is reported (see [`watchdog`]). Default from
    /// TALLY_PROVIDER_WATCHDOG_S, else 10 s; zero: not watched.
    pub provider_watchdog: Duration,
    /// Over tcp, the floor this client sets on its connections' TCP timers
    /// (ms; `host::tcp_rto_min`; 0: none, the kernel's 200 ms). Default from
    /// TALLY_TCP_RTO_MIN_MS, else `tcp_rto_min::DEFAULT_FLOOR_MS` (5).
    pub tcp_rto_min_ms: u32,
    /// Time one piece in 16 from its send to its result, and the copies of
    /// staged results (see [`super::piece_times`]); logged when the client
    /// closes. Default from TALLY_PIECE_TIMES (`1`), else off.
    pub piece_times: bool,
}

impl ClientConfig {
    /// Whether a client of `rails` rails runs the copier thread: asked
    /// for, with failover on (only it stages results) and rail threads.
    pub fn runs_copier(&self, rails: usize) -> bool {
        self.copier && self.failover && rails > 1
    }

    /// Whether this client asks its servers for heartbeats: only jobs that
    /// can fail over act on them (a server older than heartbeats refuses
    /// the flag, so single-server jobs do not send it).
    pub(super) fn wants_heartbeats(&self) -> bool {
        !self.liveness.is_zero() && self.failover && self.servers.len() > 1
    }

    /// A secret for a new job from the kernel's random source, to hand to
    /// every rank as [`ClientConfig::job_secret`].
    pub fn draw_job_secret() -> Result<JobSecret, ClientError> {
        crate::host::random::bytes().map_err(|e| ClientError::Config(format!("no job secret: {e}")))
    }

    /// What [`Client::connect`] refuses before opening anything: no
    /// servers, a server listed twice or more than
    /// [`servers::MAX_SERVERS`] of them, a rank outside the job, a
    /// `min_piece` above [`MAX_MIN_PIECE`], a `reserve` above
    /// [`wire::MAX_RESERVE`] or TALLY_COMM_JOBS outside 1 to 8.
    pub fn check(&self) -> Result<(), ClientError> {
        if self.servers.is_empty() {
            return Err(ClientError::Config("no servers given (TALLY_SERVERS)".into()));
        }
        servers::check(&self.servers).map_err(|e| ClientError::Config(e.to_string()))?;
        if self.rank >= self.nranks {
            return Err(ClientError::Config(format!("rank {} is not below nranks {}", self.rank, self.nranks)));
        }
        if self.min_piece > MAX_MIN_PIECE {
            return Err(ClientError::Config(format!(
                "min_piece (TALLY_MIN_PIECE) of {} bytes is above {}: past the chunk size (TALLY_CHUNK) a larger one changes nothing",
                self.min_piece,
                crate::host::units::format_size(MAX_MIN_PIECE as u64)
            )));
        }
        if self.reserve > wire::MAX_RESERVE {
            return Err(ClientError::Config(format!(
                "room for {} later jobs of a communicator: at most {}",
                self.reserve,
                wire::MAX_RESERVE
            )));
        }
        if let Ok(v) = std::env::var("TALLY_COMM_JOBS") {
            if comm_jobs_from_env().is_none() {
                return Err(ClientError::Config(format!(
                    "TALLY_COMM_JOBS={v:?}: the jobs (dtype, op pairs) a communicator reserves room for, 1 to {}",
                    wire::MAX_RESERVE + 1
                )));
            }
        }
        Ok(())
    }

    pub fn new(servers: Vec<String>, job_id: u64, rank: u32, nranks: u32) -> ClientConfig {
        ClientConfig {
            servers,
            job_id,
            rank,
            nranks,
            token: std::env::var("TALLY_TOKEN").unwrap_or_default(),
            job_secret: id_secret(job_id),
            chunk_bytes: env_size("TALLY_CHUNK").unwrap_or(256 << 10),
            window: env_size("TALLY_WINDOW").map_or(0, |w| w.clamp(1, 64) as u32),
            shards: 0,
            provider: None,
            fabric_addr: None,
            timeout: Duration::from_secs(30),
            join_timeout: Duration::from_secs(
                std::env::var("TALLY_JOIN_TIMEOUT_S").ok().and_then(|v| v.trim().parse().ok()).filter(|&s| s > 0).unwrap_or(120),
            ),
            spin_polls: std::env::var("TALLY_SPIN_POLLS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(2048),
            rail_spin_polls: std::env::var("TALLY_RAIL_SPIN_POLLS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(RAIL_SPIN_POLLS),
            sleep_ms: 1,
            send_credits: send_credits_from_env(),
            min_piece: env_size("TALLY_MIN_PIECE").unwrap_or(MIN_SPREAD_PIECE),
            reserve: comm_jobs_from_env().map_or(0, |n| n - 1),
            interleave: std::env::var("TALLY_INTERLEAVE").is_ok_and(|v| v.trim() == "1"),
            failover: std::env::var("TALLY_FAILOVER").map_or(true, |v| v != "0"),
            fault_drop_results: None,
            fault_rejoin_put_off: false,
            fault_late_news: false,
            relay: std::env::var("TALLY_RELAY").map_or(true, |v| v != "0"),
            split: std::env::var("TALLY_SPLIT").map_or(true, |v| v != "0"),
            rails: std::env::var("TALLY_RAILS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0),
            link_gbits: link_gbits_from_env(),
            rail_gbits: super::rails::RAIL_GBITS,
            rail_cores: std::env::var("TALLY_RAIL_CORES")
                .ok()
                .and_then(|v| crate::host::cpuset::CoreList::parse(&v).ok())
                .map_or_else(Vec::new, |l| l.as_slice().to_vec()),
            caller_rail: caller_rail_from_env(),
            copier: std::env::var("TALLY_COPIER").is_ok_and(|v| v.trim() == "1"),
            liveness: Duration::from_millis(
                std::env::var("TALLY_LIVENESS_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(DEFAULT_LIVENESS_MS),
            ),
            provider_watchdog: watchdog::limit_from_env(),
            tcp_rto_min_ms: crate::host::tcp_rto_min::env_floor_ms(),
            piece_times: std::env::var("TALLY_PIECE_TIMES").is_ok_and(|v| v.trim() == "1"),
        }
    }
}

/// TALLY_COMM_JOBS, when it is a number of jobs from 1 to 8.
pub fn comm_jobs_from_env() -> Option<u8> {
    std::env::var("TALLY_COMM_JOBS").ok()?.trim().parse::<u8>().ok().filter(|n| (1..=wire::MAX_RESERVE + 1).contains(n))
}

/// TALLY_CALLER_RAIL: on where it is unset or `1`, off for anything else
/// (`0`). The library's client and the NCCL plugin alike (`rails`'s module
/// doc says why).
pub fn caller_rail_from_env() -> bool {
    std::env::var("TALLY_CALLER_RAIL").map_or(true, |v| v.trim() == "1")
}

/// TALLY_SEND_CREDITS, else 0 (as many sends as the windows allow).
pub fn send_credits_from_env() -> u32 {
    std::env::var("TALLY_SEND_CREDITS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// TALLY_LINK_GBITS, when it is a positive, finite rate; else 0 (unknown).
pub fn link_gbits_from_env() -> f64 {
    std::env::var("TALLY_LINK_GBITS").ok().and_then(|v| v.trim().parse::<f64>().ok()).filter(|g| g.is_finite() && *g > 0.0).unwrap_or(0.0)
}

/// A rank's default liveness time (ms): eight of the server's default heartbeats.
pub const DEFAULT_LIVENESS_MS: u64 = 2000;

/// Empty turns a rail thread or the copier makes before it sleeps, unless
/// TALLY_RAIL_SPIN_POLLS says otherwise. Four rails spinning 2,048 turns
/// after each piece cost a CollNet rank under real NCCL 8.8-9.7 CPU s/GB
/// (the NCCL Socket ring's: 2.0-4.3); with 128, 3.6-4.4 at 4 Gbit/s and 1.6-1.7
/// against 2.3-2.6 at 16 Gbit/s, the link held alike (0.87-0.98 of the
/// bound against 0.73-0.97, alternated twice; nvidia-h200, G=2 on one GPU,
/// `tests/nccl/cluster_proof.sh`). With 16 (what `tally bench` already gave
/// the library's rails under adaptive polling), on nvidia-h200-x2 alternated
/// twice: a CollNet rank under real NCCL (G=4, 16 Gbit/s) 1.96-2.03 CPU
/// s/GB against 2.60-2.62 at 16 MiB, reaching 0.87-0.91 of the bound against
/// 0.67-0.74, and 1.97-2.01 against 2.19-2.34 at 64 MiB (0.95-0.96 against
/// 0.93-0.97); `bench cluster --mode agg-plugin` 1.73-1.89 against
/// 2.33-2.71 at 16 Gbit/s and 2.36-2.44 against 2.81-2.94 at 8, the link
/// held alike. A rail that sleeps is woken by its CQ's descriptor or the
/// client's bell, so a short spin costs a wake-up, not the link.
pub const RAIL_SPIN_POLLS: u32 = 16;

/// A positive size from the environment (K/M/G suffixes), if set and valid.
pub(super) fn env_size(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| crate::host::units::parse_size(&v).ok()).map(|v| v as usize).filter(|&v| v > 0)
}

/// Bytes a stream keeps in flight at most where the window is left to
/// [`auto_window`].
pub const AUTO_IN_FLIGHT: usize = 1 << 20;

/// The window where none is set: 4 chunks, or fewer where chunks are large,
/// so that a stream keeps at most [`AUTO_IN_FLIGHT`] in flight, but never
/// fewer than 2 (one chunk's result comes back while the next goes up).
/// At 32 Gbit/s with 512 KiB chunks (`tally bench cluster`, 4 + 4 hosts on
/// the device, four rounds alternated) a window of 2 gave 0.88-0.97 of the
/// link at 16 MiB against 0.80-0.87 with 4, and 0.95-0.98 at 64 MiB against
/// 0.92-0.98: fewer bytes in flight per server lcore, so less of the servers'
/// slabs and of the staging area in use, and no more than the link needs.
pub fn auto_window(chunk_bytes: usize) -> u32 {
    (AUTO_IN_FLIGHT / chunk_bytes.max(1)).clamp(2, 4) as u32
}

/// The default job secret: a function of the job id alone (see
/// [`ClientConfig::job_secret`]), the same on every rank that has the id.
fn id_secret(job_id: u64) -> JobSecret {
    let mut s = [0u8; wire::JOB_SECRET_BYTES];
    s[..8].copy_from_slice(&job_id.to_le_bytes());
    s[8..24].copy_from_slice(b"tally id secret\0");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_auto_window_keeps_a_stream_within_a_mebibyte_but_two_chunks() {
        assert_eq!(auto_window(32 << 10), 4);
        assert_eq!(auto_window(256 << 10), 4);
        assert_eq!(auto_window(300 << 10), 3);
        assert_eq!(auto_window(512 << 10), 2);
        assert_eq!(auto_window(4 << 20), 2);
        assert_eq!(auto_window(0), 4);
    }

    #[test]
    fn min_piece_is_bounded_at_config_time() {
        let mut cfg = ClientConfig::new(vec!["127.0.0.1:7400".into()], 1, 0, 2);
        cfg.min_piece = MAX_MIN_PIECE;
        assert!(cfg.check().is_ok());
        for too_big in [MAX_MIN_PIECE + 1, 0xffff_ffff, usize::MAX] {
            cfg.min_piece = too_big;
            let e = cfg.check().unwrap_err();
            assert!(
                matches!(&e, ClientError::Config(m) if m.starts_with("min_piece (TALLY_MIN_PIECE)") && m.contains("is above 1 GiB")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_server_listed_twice_is_refused_at_config_time() {
        let cfg = ClientConfig::new(vec!["127.0.0.1:7400".into(), "127.0.0.1:7401".into(), "127.0.0.1:7400".into()], 1, 0, 2);
        let e = cfg.check().unwrap_err();
        assert!(matches!(&e, ClientError::Config(m) if m.starts_with("server 127.0.0.1:7400 is listed twice")), "{e}");
        let cfg = ClientConfig::new(vec!["127.0.0.1:7400".into(); 1000], 1, 0, 2);
        assert!(matches!(cfg.check(), Err(ClientError::Config(m)) if m.starts_with("1000 servers given, at most 256")));
    }
}
