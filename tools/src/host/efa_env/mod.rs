//! `tally efa-env`: FI_EFA_FORK_SAFE, FI_EFA_USE_HUGE_PAGE, RDMAV_FORK_SAFE
//! and FI_PROVIDER, decided from facts rather than guessed.
//!
//! The problem these variables solve: memory registered with an RDMA NIC is
//! pinned, and after `fork()` the parent and child share it copy-on-write.
//! On kernels before 5.13 the first write after a fork gives the *parent* a
//! new copy of a pinned page while the NIC keeps using the old one: silent
//! data corruption. rdma-core's answer was `ibv_fork_init()` (madvise
//! DONTFORK on every registration), switched on by `RDMAV_FORK_SAFE` in
//! libibverbs and, since libfabric 1.13, by `FI_EFA_FORK_SAFE=1`. Since Linux
//! 5.13 the kernel copies pinned pages into the child at fork time instead
//! (copy-on-fork), rdma-core >= 35 reports that as `IBV_FORK_UNNEEDED`, and
//! libfabric then skips fork support.
//!
//! Two catches, both from the fi_efa man page and the EFA provider:
//! fork support cannot be combined with regions backed by huge pages (the
//! provider turns its huge-page buffers off when fork support is on), and
//! with copy-on-fork every fork copies the pinned *huge* pages of EFA's
//! internal buffers into the child, so a process that forks a few data
//! loaders can exhaust the hugepage pool and die with "Cannot allocate
//! memory". `FI_EFA_USE_HUGE_PAGE=0` is the documented fix.
//!
//! So the answer depends on the role:
//! - `server`: tally itself never forks and registers hugepage slabs. Fork
//!   support must be off (and `RDMAV_FORK_SAFE`/`IBV_FORK_SAFE`, which
//!   libibverbs honours whatever their value, unset); EFA may keep its
//!   packet buffers on huge pages.
//! - `worker`: an NCCL training process with the tally plugin, which forks
//!   data loaders. Fork support only where the kernel cannot copy pinned
//!   pages (or libfabric cannot learn that it does); EFA's buffers off huge
//!   pages.
//!
//! [`decide`] is a pure function from [`Facts`](decision::Facts) to [`Setting`](decision::Setting)s, each with a
//! one-line reason; the table-driven tests (tests.rs) walk every case. `check`
//! gathers the facts on this host and shows both roles' decisions; `print`
//! emits one role's settings as shell, a systemd EnvironmentFile or JSON.
//! Set these before the process's first `fi_getinfo`, and never with
//! `setenv` once other threads run (PyTorch's threads call `getenv`).
//!
//! [`decision`]: what each role needs; [`render`]: `print`'s formats;
//! [`check`]: `check`'s facts and report; this file: the command.
pub mod check;
pub mod decision;
pub mod render;
#[cfg(test)]
mod tests;

use check::{gather, render_check, CheckJson};
use clap::{Args, Subcommand, ValueEnum};
use decision::{decide, Role};
use render::{render_sh, render_systemd, settings_json, PrintJson};

#[derive(Args, Debug)]
pub struct EfaEnvArgs {
    #[command(subcommand)]
    pub cmd: EfaEnvCmd,
}

#[derive(Subcommand, Debug)]
pub enum EfaEnvCmd {
    /// Report kernel, rdma-core, libfabric, EFA devices and the current
    /// variables, then the settings each role needs here, with reasons.
    Check {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Print the settings one role needs on this host.
    Print {
        /// server: tally itself (never forks, hugepage buffers); worker
        /// (the default): an NCCL training process with the tally plugin
        /// (forks data loaders). The output's first line names the role.
        #[arg(long, value_enum, default_value_t = Role::Worker)]
        role: Role,
        /// sh: export/unset lines for `eval`; systemd: an EnvironmentFile;
        /// json: settings with reasons.
        #[arg(long, value_enum, default_value_t = Format::Sh)]
        format: Format,
        /// Decide as if this host had an EFA device (to generate settings for
        /// EFA nodes from a login or build node).
        #[arg(long)]
        assume_efa: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Sh,
    Systemd,
    Json,
}

pub fn run(args: &EfaEnvArgs) -> Result<(), String> {
    match &args.cmd {
        EfaEnvCmd::Check { json } => {
            let r = gather();
            if *json {
                let server = decide(Role::Server, &r.facts);
                let worker = decide(Role::Worker, &r.facts);
                let j = CheckJson { host: &r, server: settings_json(&server), worker: settings_json(&worker) };
                super::out(&(serde_json::to_string_pretty(&j).map_err(|e| e.to_string())? + "\n"))?;
            } else {
                super::out(&render_check(&r))?;
            }
            Ok(())
        }
        EfaEnvCmd::Print { role, format, assume_efa } => {
            let mut facts = gather().facts;
            facts.efa_device |= *assume_efa;
            let settings = decide(*role, &facts);
            match format {
                Format::Sh => super::out(&render_sh(*role, &facts, &settings))?,
                Format::Systemd => super::out(&render_systemd(*role, &facts, &settings))?,
                Format::Json => {
                    let j = PrintJson { role: *role, facts: &facts, settings: settings_json(&settings) };
                    super::out(&(serde_json::to_string_pretty(&j).map_err(|e| e.to_string())? + "\n"))?;
                }
            }
            Ok(())
        }
    }
}
