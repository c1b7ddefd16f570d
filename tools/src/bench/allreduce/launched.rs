//! `tally bench allreduce --launched`: one rank of a job whose ranks a
//! launcher started (srun, torchrun, mpirun), instead of this command
//! starting them all itself. It is what a training command is under a
//! cluster's scheduler, without a GPU: config/slurm/tally-train.sbatch runs
//! it as its `TRAIN_CMD` in tests/slurm/run.sh.
//!
//! What the launcher's variables give: the rank and the rank count (`RANK`
//! and `WORLD_SIZE`, torchrun's and the sbatch's; else `SLURM_PROCID` and
//! `SLURM_NTASKS`, srun's), where the ranks meet (`MASTER_ADDR` and
//! `MASTER_PORT`, torchrun's: rank 0 listens there), and the servers
//! (`--servers`, else `TALLY_SERVERS`). The job's id and secret are not the
//! launcher's to give: rank 0 draws them and hands them to the others over
//! that bootstrap, so two jobs of one scheduler job (or a rerun) never share
//! an id on the servers, and no one outside the job knows the secret.
//!
//! Every element of every all-reduce's result is checked, warm-up ones too,
//! each into a buffer overwritten first (a result that did not arrive cannot
//! pass for the previous one); the launcher's own mode checks the last
//! result of each size. Each rank prints one line (or one JSON object) and
//! exits non-zero when any rank of the job had a wrong element.
use super::plan::AllreduceArgs;
use serde::Serialize;
use tally_engine::ring::bootstrap::Bootstrap;

/// torchrun's default port for rank 0, which the sbatch also uses.
const DEFAULT_MASTER_PORT: u16 = 29500;

/// Written over a result buffer before each all-reduce: as f32, f64, f16
/// and bf16 a value no result of small integers is, as integers one above
/// any such sum.
pub(super) const POISON: u8 = 0xa5;

/// An environment variable as a number, `None` when unset.
fn env_num<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String> {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(format!("{name}: {e}")),
        Ok(v) => v.trim().parse().map(Some).map_err(|_| format!("{name}={v:?} is not a number")),
    }
}

/// The rank and rank count the launcher gave: `RANK`/`WORLD_SIZE`, else
/// `SLURM_PROCID`/`SLURM_NTASKS`.
fn rank_and_size() -> Result<(u32, u32), String> {
    for (r, n) in [("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")] {
        match (env_num::<u32>(r)?, env_num::<u32>(n)?) {
            (Some(rank), Some(size)) if rank < size => return Ok((rank, size)),
            (Some(rank), Some(size)) => return Err(format!("{r}={rank} is not below {n}={size}")),
            (Some(_), None) => return Err(format!("{r} is set but {n} is not")),
            (None, Some(_)) => return Err(format!("{n} is set but {r} is not")),
            (None, None) => {}
        }
    }
    Err("no rank in the environment: --launched takes RANK and WORLD_SIZE (torchrun; set them by hand otherwise) \
         or SLURM_PROCID and SLURM_NTASKS (srun)"
        .into())
}

/// `args` as one rank of the launcher's job: rank, ranks, bootstrap and
/// servers from the environment (see the module doc), one rank per process.
pub(super) fn resolve(args: &AllreduceArgs) -> Result<AllreduceArgs, String> {
    if args.rank.is_some() || args.bootstrap.is_some() {
        return Err("--launched takes the rank and rank 0's address from the environment, not --rank or --bootstrap".into());
    }
    if args.mode.mode.iter().any(|m| m != "agg") {
        return Err(format!(
            "--launched runs agg only (--mode {}: ring and agg-plugin ranks meet differently): add --mode agg",
            args.mode.mode.join(",")
        ));
    }
    if args.agg_in_flight != 1 {
        return Err("--launched checks every all-reduce's result, one at a time: --agg-in-flight 1".into());
    }
    let (rank, size) = rank_and_size()?;
    let host = std::env::var("MASTER_ADDR")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .ok_or("MASTER_ADDR is not set: --launched needs rank 0's host, where the ranks meet (torchrun's variable)")?;
    let port = env_num::<u16>("MASTER_PORT")?.unwrap_or(DEFAULT_MASTER_PORT);
    let mut out = args.clone();
    if out.servers.is_empty() {
        out.servers =
            std::env::var("TALLY_SERVERS").unwrap_or_default().split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    }
    if out.servers.is_empty() {
        return Err("no servers: --launched takes --servers or TALLY_SERVERS (host:port, comma-separated)".into());
    }
    out.rank = Some(rank);
    out.ranks = size;
    out.ranks_per_process = Some(1);
    // An IPv6 literal needs its brackets to carry a port.
    out.bootstrap = Some(if host.contains(':') && !host.starts_with('[') { format!("[{host}]:{port}") } else { format!("{host}:{port}") });
    Ok(out)
}

/// The job's id and secret: drawn by rank 0, the same on every rank after.
pub(super) fn share_job(args: &AllreduceArgs, boot: &mut Bootstrap) -> Result<AllreduceArgs, String> {
    let mut drawn = Vec::new();
    if boot.rank() == 0 {
        let secret = tally_engine::client::ClientConfig::draw_job_secret().map_err(|e| e.to_string())?;
        let id = tally_engine::host::random::bytes::<8>().map_err(|e| format!("no job id: {e}"))?;
        drawn.extend_from_slice(&id);
        drawn.extend_from_slice(&secret);
    }
    let got = boot.broadcast(0, &drawn).map_err(|e| e.to_string())?;
    if got.len() != 8 + tally_engine::wire::JOB_SECRET_BYTES {
        return Err(format!("rank 0 handed out {} bytes for the job's id and secret", got.len()));
    }
    let mut out = args.clone();
    // Odd: never 0, which the launcher's own jobs never use either.
    out.job_id = u64::from_le_bytes(got[..8].try_into().unwrap()) | 1;
    out.job_secret = Some(got[8..].iter().map(|b| format!("{b:02x}")).collect());
    Ok(out)
}

/// What one rank did, printed as its last line.
#[derive(Serialize, Default)]
pub(super) struct RankSummary {
    pub rank: u32,
    pub ranks: u32,
    pub host: String,
    pub servers: usize,
    /// All-reduces this rank ran, warm-up included, each checked.
    pub allreduces: u64,
    /// Their elements, all checked.
    pub elements: u64,
    /// Wrong elements in this rank's results.
    pub wrong: u64,
    /// Wrong elements over every rank of the job.
    pub job_wrong: u64,
}

impl RankSummary {
    /// The line, JSON with `--json`; `Err` when any rank had a wrong element.
    pub fn finish(mut self, json: bool) -> Result<(), String> {
        self.host = hostname();
        if json {
            println!("{}", serde_json::to_string(&self).unwrap());
        } else {
            println!(
                "tally bench allreduce: rank {} of {} on {}: {} all-reduces through {} servers, {} elements checked, {} wrong (job: {} wrong)",
                self.rank, self.ranks, self.host, self.allreduces, self.servers, self.elements, self.wrong, self.job_wrong
            );
        }
        if self.job_wrong > 0 {
            return Err(format!("{} wrong elements in the job ({} in rank {}'s results)", self.job_wrong, self.wrong, self.rank));
        }
        Ok(())
    }
}

/// This host's name, as the launcher's logs show it.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: a buffer we own and its length; gethostname NUL-terminates within it or truncates.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "?".into();
    }
    String::from_utf8_lossy(buf.split(|&b| b == 0).next().unwrap_or_default()).into_owned()
}
