//! `tally doctor`: is this host ready to run a reduction server?
//!
//! A poll-mode server is only as fast as the host lets it be: the fabric
//! provider must find its NIC, the NIC should sit on the NUMA node of the
//! cores that poll it, the slabs want hugepages, the polling cores want to be
//! isolated from the scheduler, run at full clock, not throttled as real-time
//! tasks, and not share a core with the NIC's interrupts; EFA must be able to
//! pin (mlock) every registered buffer. Each of those is one row of the
//! table, `pass`, `warn` or `fail` (plus `info` for what only informs), with
//! a one-line fix.
//!
//! What counts as a failure depends on what is asked of the host. Without
//! `--config` the defaults describe a development box (adaptive polling,
//! hugepages preferred, provider chosen at run time), so a missing EFA device
//! is a warning ("shm/tcp only, fine for development"); a configuration that
//! names `provider = "efa"` makes the same finding a failure, and `busy`
//! polling turns scheduler findings (core isolation) from notes into
//! warnings. The exit status is 1 when any row fails. Only what tally uses
//! is checked: its threads are never real-time (no SCHED_FIFO/RR), so RT
//! throttling (`kernel.sched_rt_runtime_us`) is no row.
//!
//! The host is read once into [`HostFacts`](facts::HostFacts); [`evaluate`] is a pure function
//! from the target configuration and those facts to the rows, so the tests
//! can describe an EFA host, a VM without cpufreq or a misconfigured NUMA
//! layout without owning one.
//!
//! [`facts`]: what is read; [`checks`]: what is decided from it; this file:
//! the command, its table and its JSON.
pub mod checks;
pub mod facts;
#[cfg(test)]
mod tests;

use super::table::{Align, Table};
use checks::{evaluate, exit_code, Check, Status, Target};
use clap::Args;
use facts::gather;
use serde::Serialize;
use std::path::PathBuf;
use tally_engine::host::config::ServerFile;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Check against this server configuration (TOML, as `tally server
    /// --config` reads it). Default: the built-in defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The table: one line per check, its fix on the next line.
pub fn render(source: &str, checks: &[Check]) -> String {
    let mut t = Table::new(&[("Check", Align::Left), ("Status", Align::Left), ("Result", Align::Left)]);
    for c in checks {
        t.row([c.name.clone(), c.status.name().to_string(), c.detail.clone()]);
        if let Some(fix) = &c.fix {
            if c.status >= Status::Warn {
                t.row([String::new(), String::new(), format!("fix: {fix}")]);
            }
        }
    }
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    format!(
        "tally doctor: checking against {source}\n\n{}\n{} passed, {} warnings, {} failed ({} notes)\n",
        t.render(),
        count(Status::Pass),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Info)
    )
}

#[derive(Serialize)]
struct Report<'a> {
    config: &'a str,
    checks: &'a [Check],
    passed: usize,
    warnings: usize,
    failed: usize,
    exit_code: u8,
}

pub fn run(args: &DoctorArgs) -> Result<u8, String> {
    let (file, source) = match &args.config {
        Some(p) => (ServerFile::load(p).map_err(|e| e.to_string())?, p.display().to_string()),
        None => (ServerFile::default(), "the built-in defaults (no --config)".to_string()),
    };
    let config = file.resolve().map_err(|e| format!("{source}: {e}"))?;
    let target = Target { config };
    let facts = gather(&target.config.lcores);
    let checks = evaluate(&target, &facts);
    let code = exit_code(&checks);
    if args.json {
        let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
        let r = Report {
            config: &source,
            checks: &checks,
            passed: count(Status::Pass),
            warnings: count(Status::Warn),
            failed: count(Status::Fail),
            exit_code: code,
        };
        crate::host::out(&(serde_json::to_string_pretty(&r).map_err(|e| e.to_string())? + "\n"))?;
    } else {
        crate::host::out(&render(&source, &checks))?;
    }
    Ok(code)
}
