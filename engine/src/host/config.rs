//! Server configuration: a TOML file, overridden by command-line flags.
//!
//! Every key has a default that suits a development box (two lcores, adaptive
//! polling, hugepages preferred); production files (config/) pin lcores,
//! choose `efa`, busy polling and required hugepages. Unknown keys are
//! rejected by name so that a typo never silently becomes a default.
use crate::host::cpuset::CoreList;
use crate::host::units::parse_size;
use serde::Deserialize;
use std::fmt;
use std::path::Path;

/// `tally server` settings, as read from a file (all optional there).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    /// Control-plane listen address, `ADDR:PORT`.
    pub listen: Option<String>,
    /// Cores for the lcores, DPDK syntax (`2-9,12`). Lcore k serves shard k.
    pub lcores: Option<String>,
    /// libfabric provider: `efa`, `shm`, `tcp` (= `tcp;ofi_rxm`).
    pub provider: Option<String>,
    /// Local address the fabric endpoints bind to (tcp); default: the listen address's host.
    pub fabric_addr: Option<String>,
    /// `busy` or `adaptive`.
    pub poll: Option<String>,
    /// `require`, `prefer` or `off`.
    pub hugepages: Option<String>,
    /// Slab size per lcore (K/M/G), e.g. "1G".
    pub slab_size: Option<String>,
    /// Largest chunk shard a job may ask for (bytes per lcore per chunk), e.g. "4M".
    pub max_chunk: Option<String>,
    /// Most chunks in flight per lcore a job may ask for.
    pub max_window: Option<u32>,
    /// Most jobs served at once.
    pub max_jobs: Option<u32>,
    /// Most ranks in one job (default and ceiling: the wire's 1024). A job's
    /// pieces shrink with its ranks so that its slab region fits (control::budget).
    pub max_ranks: Option<u32>,
    /// File holding the shared job token (else TALLY_TOKEN; else no token required).
    pub token_file: Option<String>,
    /// Seconds a client may take to finish its handshake.
    pub handshake_timeout_s: Option<u64>,
    /// Seconds a job's operation may wait for a straggling rank before the job fails.
    pub op_timeout_s: Option<u64>,
    /// Milliseconds between the heartbeats the server sends the ranks that ask
    /// for them (default 250; 0: none). Withheld for a job while one of its
    /// lcores stops polling, so that its ranks fail over.
    pub heartbeat_ms: Option<u64>,
    /// Seconds all ranks of a job have to join, counted from the first (default 120:
    /// a thousand-node job's ranks start over a minute or more).
    pub join_timeout_s: Option<u64>,
    /// Most connections in their handshake at once, from everywhere (default 16384).
    /// When full, the oldest handshake of the address holding the most is evicted.
    pub max_handshakes: Option<u32>,
    /// Most connections in their handshake at once from one address (default 256);
    /// more are told `busy` at once.
    pub max_handshakes_per_source: Option<u32>,
    /// Seconds a running job may go without any traffic before the server ends it
    /// and frees its slots (0: never).
    pub idle_timeout_s: Option<u64>,
    /// Seconds a draining server (SIGTERM) waits for its jobs to move to other
    /// servers or end before it ends them and exits (0: end them at once).
    pub drain_timeout_s: Option<u64>,
    /// Prometheus metrics listen address (`ADDR:PORT`), off when absent.
    pub metrics: Option<String>,
    /// NIC (libfabric domain name) per lcore, for multi-rail hosts. Empty: the provider's first.
    pub nics: Option<Vec<String>>,
    /// Lcores (the first of `lcores`) that take only small operations, so that
    /// a latency-critical all-reduce never waits behind a bulk job's pieces
    /// (default 0: every lcore takes everything). Needs at least one lcore left.
    pub latency_lcores: Option<u32>,
    /// The largest operation the latency lcores take (a power of two, 1K to 1G;
    /// default 64K). Larger ones go to the other lcores.
    pub latency_max: Option<String>,
    /// Receive buffers per slot for a job whose ranks' pieces do not all fit
    /// its slab budget (default 64; 0: such jobs get smaller pieces instead).
    /// See ARCHITECTURE.md, "Many ranks".
    pub stage_buffers: Option<u32>,
}

/// Milliseconds between heartbeats (`heartbeat_ms`): a rank's default
/// liveness time (2 s, `TALLY_LIVENESS_MS`) covers eight of them.
pub const DEFAULT_HEARTBEAT_MS: u64 = 250;

/// Receive buffers per slot of a staged job (`stage_buffers`).
pub const DEFAULT_STAGE_BUFFERS: u32 = 64;

/// The settings a server runs with, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: String,
    pub lcores: CoreList,
    pub provider: Option<String>,
    pub fabric_addr: Option<String>,
    pub poll: String,
    pub hugepages: String,
    pub slab_size: u64,
    pub max_chunk: u64,
    pub max_window: u32,
    pub max_jobs: u32,
    pub max_ranks: u32,
    pub token_file: Option<String>,
    pub handshake_timeout_s: u64,
    pub op_timeout_s: u64,
    pub heartbeat_ms: u64,
    pub join_timeout_s: u64,
    pub max_handshakes: u32,
    pub max_handshakes_per_source: u32,
    pub idle_timeout_s: u64,
    pub drain_timeout_s: u64,
    pub metrics: Option<String>,
    pub nics: Vec<String>,
    pub latency_lcores: u32,
    /// Bytes, a power of two.
    pub latency_max: u64,
    pub stage_buffers: u32,
}

#[derive(Debug)]
pub enum ConfigError {
    Read { path: String, error: std::io::Error },
    Parse { path: String, message: String },
    Invalid { key: &'static str, message: String },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read { path, error } => write!(f, "cannot read {path}: {error}"),
            ConfigError::Parse { path, message } => write!(f, "{path}: {message}"),
            ConfigError::Invalid { key, message } => write!(f, "{key}: {message}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ServerFile {
    pub fn load(path: &Path) -> Result<ServerFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.display().to_string(), error })?;
        Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse { path: path.display().to_string(), message },
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<ServerFile, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse { path: "<config>".into(), message: e.to_string().trim().to_string() })
    }

    /// `other`'s keys win where set (flags over file).
    pub fn overlay(self, other: ServerFile) -> ServerFile {
        macro_rules! pick {
            ($($f:ident),*) => { ServerFile { $($f: other.$f.or(self.$f)),* } };
        }
        pick!(
            listen,
            lcores,
            provider,
            fabric_addr,
            poll,
            hugepages,
            slab_size,
            max_chunk,
            max_window,
            max_jobs,
            max_ranks,
            token_file,
            handshake_timeout_s,
            op_timeout_s,
            heartbeat_ms,
            join_timeout_s,
            max_handshakes,
            max_handshakes_per_source,
            idle_timeout_s,
            drain_timeout_s,
            metrics,
            nics,
            latency_lcores,
            latency_max,
            stage_buffers
        )
    }

    /// Fills defaults and checks every value.
    pub fn resolve(self) -> Result<ServerConfig, ConfigError> {
        let size = |key: &'static str, v: Option<String>, default: u64| -> Result<u64, ConfigError> {
            match v {
                None => Ok(default),
                Some(s) => parse_size(&s).map_err(|e| ConfigError::Invalid { key, message: e.to_string() }),
            }
        };
        let lcores_text = self.lcores.unwrap_or_else(|| "0-1".into());
        let lcores = CoreList::parse(&lcores_text).map_err(|e| ConfigError::Invalid { key: "lcores", message: e.to_string() })?;
        let poll = self.poll.unwrap_or_else(|| "adaptive".into());
        if !matches!(poll.as_str(), "busy" | "adaptive") {
            return Err(ConfigError::Invalid { key: "poll", message: format!("expected busy or adaptive, got {poll:?}") });
        }
        let hugepages = self.hugepages.unwrap_or_else(|| "prefer".into());
        if !matches!(hugepages.as_str(), "require" | "prefer" | "off") {
            return Err(ConfigError::Invalid { key: "hugepages", message: format!("expected require, prefer or off, got {hugepages:?}") });
        }
        let listen = self.listen.unwrap_or_else(|| "127.0.0.1:7400".into());
        if listen.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_none() {
            return Err(ConfigError::Invalid { key: "listen", message: format!("expected ADDR:PORT, got {listen:?}") });
        }
        let slab_size = size("slab_size", self.slab_size, 256 << 20)?;
        let max_chunk = size("max_chunk", self.max_chunk, 1 << 20)?;
        if max_chunk == 0 || max_chunk > slab_size {
            return Err(ConfigError::Invalid { key: "max_chunk", message: format!("must be between 1 and slab_size ({slab_size})") });
        }
        let positive = |key: &'static str, v: Option<u32>, default: u32, max: u32| -> Result<u32, ConfigError> {
            let v = v.unwrap_or(default);
            if v == 0 || v > max {
                return Err(ConfigError::Invalid { key, message: format!("must be between 1 and {max}, got {v}") });
            }
            Ok(v)
        };
        let nics = self.nics.unwrap_or_default();
        if !nics.is_empty() && nics.len() != lcores.len() {
            return Err(ConfigError::Invalid {
                key: "nics",
                message: format!("{} NICs for {} lcores: give one per lcore", nics.len(), lcores.len()),
            });
        }
        let latency_lcores = self.latency_lcores.unwrap_or(0);
        if latency_lcores > 0 && (latency_lcores as usize >= lcores.len() || latency_lcores > 255) {
            return Err(ConfigError::Invalid {
                key: "latency_lcores",
                message: format!("{latency_lcores} of {} lcores: leave at least one for bulk operations (and at most 255)", lcores.len()),
            });
        }
        let latency_max = size("latency_max", self.latency_max, 64 << 10)?;
        if !latency_max.is_power_of_two() || !(1 << 10..=1 << crate::wire::Accept::MAX_LATENCY_LOG2).contains(&latency_max) {
            return Err(ConfigError::Invalid {
                key: "latency_max",
                message: format!("must be a power of two from 1K to 1G, got {latency_max}"),
            });
        }
        if let Some(m) = &self.metrics {
            if m.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_none() {
                return Err(ConfigError::Invalid { key: "metrics", message: format!("expected ADDR:PORT, got {m:?}") });
            }
        }
        Ok(ServerConfig {
            listen,
            lcores,
            provider: self.provider,
            fabric_addr: self.fabric_addr,
            poll,
            hugepages,
            slab_size,
            max_chunk,
            max_window: positive("max_window", self.max_window, 16, 1024)?,
            max_jobs: positive("max_jobs", self.max_jobs, 16, 4096)?,
            max_ranks: positive("max_ranks", self.max_ranks, crate::wire::MAX_RANKS, crate::wire::MAX_RANKS)?,
            token_file: self.token_file,
            handshake_timeout_s: match self.handshake_timeout_s.unwrap_or(10) {
                0 => return Err(ConfigError::Invalid { key: "handshake_timeout_s", message: "must be at least 1".into() }),
                v => v,
            },
            op_timeout_s: match self.op_timeout_s.unwrap_or(30) {
                0 => return Err(ConfigError::Invalid { key: "op_timeout_s", message: "must be at least 1".into() }),
                v => v,
            },
            heartbeat_ms: match self.heartbeat_ms.unwrap_or(DEFAULT_HEARTBEAT_MS) {
                v if v > 10_000 => {
                    return Err(ConfigError::Invalid { key: "heartbeat_ms", message: "at most 10000 (0: no heartbeats)".into() })
                }
                v => v,
            },
            join_timeout_s: match self.join_timeout_s.unwrap_or(120) {
                0 => return Err(ConfigError::Invalid { key: "join_timeout_s", message: "must be at least 1".into() }),
                v => v,
            },
            max_handshakes: positive("max_handshakes", self.max_handshakes, 16384, 1 << 20)?,
            max_handshakes_per_source: positive("max_handshakes_per_source", self.max_handshakes_per_source, 256, 1 << 20)?,
            idle_timeout_s: self.idle_timeout_s.unwrap_or(3600),
            drain_timeout_s: match self.drain_timeout_s.unwrap_or(60) {
                v if v > u32::MAX as u64 => {
                    return Err(ConfigError::Invalid { key: "drain_timeout_s", message: format!("at most {} seconds", u32::MAX) })
                }
                v => v,
            },
            metrics: self.metrics,
            nics,
            latency_lcores,
            latency_max,
            stage_buffers: match self.stage_buffers.unwrap_or(DEFAULT_STAGE_BUFFERS) {
                v if v > crate::wire::MAX_RANKS => {
                    return Err(ConfigError::Invalid { key: "stage_buffers", message: format!("at most {}", crate::wire::MAX_RANKS) })
                }
                v => v,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_resolve() {
        let c = ServerFile::parse("").unwrap().resolve().unwrap();
        assert_eq!(c.poll, "adaptive");
        assert_eq!(c.lcores.as_slice(), &[0, 1]);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = ServerFile::parse("lcore = \"1\"\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `lcore`"), "{e}");
    }

    #[test]
    fn flags_override_file() {
        let file = ServerFile::parse("poll = \"busy\"\nlcores = \"2-3\"\n").unwrap();
        let flags = ServerFile { poll: Some("adaptive".into()), ..Default::default() };
        let c = file.overlay(flags).resolve().unwrap();
        assert_eq!(c.poll, "adaptive");
        assert_eq!(c.lcores.as_slice(), &[2, 3]);
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("poll = \"spin\"", "poll"),
            ("hugepages = \"yes\"", "hugepages"),
            ("slab_size = \"lots\"", "slab_size"),
            ("max_chunk = \"2G\"", "max_chunk"),
            ("max_jobs = 0", "max_jobs"),
            ("listen = \"nowhere\"", "listen"),
            ("lcores = \"3-1\"", "lcores"),
            ("lcores = \"0-1\"\nnics = [\"a\"]", "nics"),
            ("lcores = \"0-1\"\nlatency_lcores = 2", "latency_lcores"),
            ("latency_max = \"48K\"", "latency_max"),
            ("latency_max = \"512\"", "latency_max"),
            ("stage_buffers = 5000", "stage_buffers"),
        ] {
            let e = ServerFile::parse(text).unwrap().resolve().unwrap_err().to_string();
            assert!(e.starts_with(key), "{text}: {e}");
        }
    }
}
