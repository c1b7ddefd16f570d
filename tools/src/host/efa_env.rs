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
//! [`decide`] is a pure function from [`Facts`] to [`Setting`]s, each with a
//! one-line reason; the table-driven tests below walk every case. `check`
//! gathers the facts on this host and shows both roles' decisions; `print`
//! emits one role's settings as shell, a systemd EnvironmentFile or JSON.
//! Set these before the process's first `fi_getinfo`, and never with
//! `setenv` once other threads run (PyTorch's threads call `getenv`).
use super::table::{Align, Table};
use super::verbs::{self, ForkStatus, VerbsReport};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use std::fmt;

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
        /// server: tally itself (never forks, hugepage buffers); worker: an
        /// NCCL training process with the tally plugin (forks data loaders).
        #[arg(long, value_enum)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Server,
    Worker,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Server => "server",
            Role::Worker => "worker",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Sh,
    Systemd,
    Json,
}

/// The variables `check` reports from the current environment.
pub const WATCHED: &[&str] = &["FI_EFA_FORK_SAFE", "FI_EFA_USE_HUGE_PAGE", "RDMAV_FORK_SAFE", "IBV_FORK_SAFE", "FI_PROVIDER"];

/// A kernel release, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KernelVersion {
    /// The first kernel that copies pinned pages on fork.
    pub const COPY_ON_FORK: KernelVersion = KernelVersion { major: 5, minor: 13, patch: 0 };

    /// From a `uname -r` string: `6.1.0-18-amd64`, `5.10.205-195.807.amzn2.aarch64`.
    pub fn parse(release: &str) -> Option<KernelVersion> {
        let mut nums = release.split(|c: char| !c.is_ascii_digit()).map(|s| s.parse::<u32>());
        let major = nums.next()?.ok()?;
        let minor = nums.next()?.ok()?;
        // "5.13" alone is 5.13.0; anything not a number ends the patch.
        let patch = nums.next().and_then(Result::ok).unwrap_or(0);
        Some(KernelVersion { major, minor, patch })
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What the decision depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Facts {
    /// The running kernel, if its release string parses.
    pub kernel: Option<KernelVersion>,
    /// libibverbs could be loaded.
    pub rdma_core_present: bool,
    /// rdma-core's release, when known.
    pub rdma_core_release: Option<u32>,
    /// libibverbs has `ibv_is_fork_initialized` (rdma-core >= 35).
    pub fork_query: bool,
    /// What it returned.
    pub fork_status: Option<ForkStatus>,
    /// The kernel's RDMA core answered (`ibv_get_device_list` worked). Only
    /// then is a `IBV_FORK_DISABLED` answer the kernel's word.
    pub kernel_rdma: bool,
    /// libfabric's (major, minor).
    pub libfabric: (u32, u32),
    /// The efa provider found a device.
    pub efa_device: bool,
    /// Hugepages in the system-wide pools, all sizes.
    pub hugepage_pages: u64,
}

/// One variable's decided value: set to `value`, or unset when `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Setting {
    pub name: &'static str,
    pub value: Option<String>,
    pub reason: String,
}

impl Setting {
    fn set(name: &'static str, value: &str, reason: impl Into<String>) -> Setting {
        Setting { name, value: Some(value.to_string()), reason: reason.into() }
    }

    fn unset(name: &'static str, reason: impl Into<String>) -> Setting {
        Setting { name, value: None, reason: reason.into() }
    }

    /// `NAME=value` or `NAME unset`.
    pub fn display(&self) -> String {
        match &self.value {
            Some(v) => format!("{}={v}", self.name),
            None => format!("{} unset", self.name),
        }
    }
}

/// Whether fork support is needed for a process that forks, and why.
fn fork_support_needed(f: &Facts) -> (bool, String) {
    let rdma = match f.rdma_core_release {
        Some(r) => format!("rdma-core {r}"),
        None => "rdma-core".to_string(),
    };
    if f.fork_status == Some(ForkStatus::Unneeded) {
        return (false, format!("{rdma} reports IBV_FORK_UNNEEDED: the kernel copies pinned pages on fork"));
    }
    if f.kernel_rdma && f.fork_query {
        if let Some(s) = f.fork_status {
            return (true, format!("{rdma} reports {} from the kernel's RDMA core: pinned pages are not copied on fork", s.name()));
        }
    }
    let k = match f.kernel {
        None => return (true, "kernel version unknown: cannot rule out forks corrupting registered memory".to_string()),
        Some(k) => k,
    };
    if k < KernelVersion::COPY_ON_FORK {
        return (true, format!("kernel {k} predates copy-on-fork for pinned pages (5.13): a fork would corrupt registered memory"));
    }
    if f.rdma_core_present && !f.fork_query {
        return (
            true,
            format!(
                "kernel {k} copies pinned pages on fork, but {rdma} (< 35) lacks ibv_is_fork_initialized, \
                 so libfabric cannot tell and treats forks as unsafe"
            ),
        );
    }
    let note = if f.rdma_core_present { "" } else { "; rdma-core not installed here (EFA hosts need >= 35)" };
    (false, format!("kernel {k} >= 5.13 copies pinned pages on fork (IBV_FORK_UNNEEDED where RDMA is loaded){note}"))
}

/// libfabric < 1.13 knows no FI_EFA_FORK_SAFE; libibverbs' RDMAV_FORK_SAFE
/// is the switch there.
fn has_fi_efa_fork_safe(f: &Facts) -> bool {
    f.libfabric >= (1, 13)
}

/// The settings `role` needs on a host described by `f`, each with its reason.
pub fn decide(role: Role, f: &Facts) -> Vec<Setting> {
    let mut out = Vec::new();
    match role {
        Role::Server => {
            out.push(Setting::set(
                "FI_EFA_FORK_SAFE",
                "0",
                "tally never forks, and fork support cannot be combined with its hugepage-backed registrations (fi_efa)",
            ));
            out.push(Setting::unset(
                "RDMAV_FORK_SAFE",
                "libibverbs calls ibv_fork_init whenever it is set, whatever its value: the server must not have it",
            ));
            out.push(Setting::unset("IBV_FORK_SAFE", "libibverbs' other name for RDMAV_FORK_SAFE: same reason"));
            out.push(Setting::set(
                "FI_EFA_USE_HUGE_PAGE",
                "1",
                "tally never forks, so nothing copies EFA's huge-page packet buffers; they save TLB misses \
                 (and fall back to normal pages when the pool is empty: size the pool with room beyond the slabs)",
            ));
            out.push(Setting::unset(
                "FI_PROVIDER",
                "tally names its provider itself (config `provider`, else efa where present); an inherited FI_PROVIDER would hide the others",
            ));
        }
        Role::Worker => {
            let (needed, why) = fork_support_needed(f);
            if needed {
                if has_fi_efa_fork_safe(f) {
                    out.push(Setting::set("FI_EFA_FORK_SAFE", "1", format!("data loaders fork: {why}")));
                } else {
                    out.push(Setting::set(
                        "RDMAV_FORK_SAFE",
                        "1",
                        format!(
                            "data loaders fork: {why}; libfabric {}.{} predates FI_EFA_FORK_SAFE (1.13), libibverbs reads this",
                            f.libfabric.0, f.libfabric.1
                        ),
                    ));
                }
                out.push(Setting::set(
                    "FI_EFA_USE_HUGE_PAGE",
                    "0",
                    "fork support and huge-page-backed buffers do not mix (fi_efa): EFA's buffers go on normal pages",
                ));
            } else {
                if has_fi_efa_fork_safe(f) {
                    out.push(Setting::set("FI_EFA_FORK_SAFE", "0", format!("not needed: {why}")));
                }
                let see = if has_fi_efa_fork_safe(f) { "see FI_EFA_FORK_SAFE".to_string() } else { why };
                out.push(Setting::unset(
                    "RDMAV_FORK_SAFE",
                    format!("not needed ({see}); if set, libibverbs would madvise every registration and EFA would drop huge pages"),
                ));
                let pool = if f.hugepage_pages > 0 {
                    format!("a few forks can exhaust this host's pool of {} pages", f.hugepage_pages)
                } else {
                    "the pool is empty here, but one reserved later (or a pod's hugepages request) would run out the same way".to_string()
                };
                out.push(Setting::set(
                    "FI_EFA_USE_HUGE_PAGE",
                    "0",
                    format!(
                        "copy-on-fork copies EFA's pinned huge-page buffers into every forked data loader: {pool} \
                         (\"Cannot allocate memory\")"
                    ),
                ));
            }
            if f.efa_device {
                out.push(Setting::set(
                    "FI_PROVIDER",
                    "efa",
                    "this host has EFA: NCCL and the tally plugin must use it, never fall back to tcp",
                ));
            } else {
                out.push(Setting::unset(
                    "FI_PROVIDER",
                    "no EFA device here: libfabric picks shm/tcp (use --assume-efa for an EFA host's settings)",
                ));
            }
        }
    }
    out
}

/// `export`/`unset` lines with the reasons as comments, for `eval`.
pub fn render_sh(role: Role, f: &Facts, settings: &[Setting]) -> String {
    let mut out = format!("# tally efa-env print --role {role} ({})\n", facts_summary(f));
    for s in settings {
        out.push_str(&format!("# {}: {}\n", s.name, s.reason));
        match &s.value {
            Some(v) => out.push_str(&format!("export {}={}\n", s.name, sh_quote(v))),
            None => out.push_str(&format!("unset {}\n", s.name)),
        }
    }
    out
}

/// A systemd EnvironmentFile: `NAME=value` lines. A file cannot unset a
/// variable, so those become comments naming the unit directive that does.
pub fn render_systemd(role: Role, f: &Facts, settings: &[Setting]) -> String {
    let mut out = format!("# EnvironmentFile: tally efa-env print --role {role} --format systemd ({})\n", facts_summary(f));
    for s in settings {
        match &s.value {
            Some(v) => {
                out.push_str(&format!("# {}\n", s.reason));
                out.push_str(&format!("{}={v}\n", s.name));
            }
            None => out.push_str(&format!("# {} must stay unset (UnsetEnvironment={} in the unit): {}\n", s.name, s.name, s.reason)),
        }
    }
    out
}

#[derive(Serialize)]
struct PrintJson<'a> {
    role: Role,
    facts: &'a Facts,
    settings: Vec<SettingJson<'a>>,
}

#[derive(Serialize)]
struct SettingJson<'a> {
    name: &'a str,
    action: &'a str,
    value: Option<&'a str>,
    reason: &'a str,
}

fn settings_json(settings: &[Setting]) -> Vec<SettingJson<'_>> {
    settings
        .iter()
        .map(|s| SettingJson {
            name: s.name,
            action: if s.value.is_some() { "set" } else { "unset" },
            value: s.value.as_deref(),
            reason: &s.reason,
        })
        .collect()
}

fn sh_quote(v: &str) -> String {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.,:/".contains(&b)) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', "'\\''"))
    }
}

fn facts_summary(f: &Facts) -> String {
    let kernel = f.kernel.map_or("kernel unknown".to_string(), |k| format!("kernel {k}"));
    let rdma = match (f.rdma_core_present, f.rdma_core_release) {
        (false, _) => "no rdma-core".to_string(),
        (true, Some(r)) => format!("rdma-core {r}"),
        (true, None) => "rdma-core".to_string(),
    };
    let efa = if f.efa_device { "EFA present" } else { "no EFA device" };
    format!("{kernel}, {rdma}, libfabric {}.{}, {efa}", f.libfabric.0, f.libfabric.1)
}

/// Everything `check` looked at, beyond the facts the decision needs.
#[derive(Debug, Serialize)]
pub struct HostReport {
    pub kernel_release: String,
    pub facts: Facts,
    pub verbs: VerbsReport,
    pub libfabric_headers: (u32, u32),
    /// The domains (NICs) the efa provider offers.
    pub efa_domains: Vec<String>,
    /// Why the efa provider offered none (`fi_getinfo`'s error).
    pub efa_provider_error: Option<String>,
    pub env: Vec<EnvVar>,
}

/// One watched variable as this process sees it.
#[derive(Debug, Clone, Serialize)]
pub struct EnvVar {
    pub name: String,
    pub value: Option<String>,
}

fn kernel_release() -> String {
    // SAFETY: an all-zero utsname is a valid out-parameter for uname.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: uname fills `release` with a NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy().into_owned()
}

fn hugepage_pages() -> u64 {
    let sizes = tally_engine::host::hugepages::page_sizes().unwrap_or_default();
    sizes.iter().filter_map(|&s| tally_engine::host::hugepages::pool(s, None).ok()).map(|p| p.total).sum()
}

/// Look at this host.
pub fn gather() -> HostReport {
    use tally_engine::dataplane::fabric::{self, Hints, InfoList};
    let release = kernel_release();
    let verbs = verbs::probe();
    let (efa_domains, efa_provider_error) = match InfoList::get(&Hints::new("efa")) {
        Ok(l) => (l.domains(), None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let facts = Facts {
        kernel: KernelVersion::parse(&release),
        rdma_core_present: verbs.loaded(),
        rdma_core_release: verbs.rdma_core,
        fork_query: verbs.has_fork_query,
        fork_status: verbs.fork_status,
        kernel_rdma: verbs.kernel_rdma(),
        libfabric: fabric::library_version(),
        efa_device: !efa_domains.is_empty() || verbs.efa_devices().next().is_some(),
        hugepage_pages: hugepage_pages(),
    };
    HostReport {
        kernel_release: release,
        facts,
        verbs,
        libfabric_headers: fabric::info::HEADER_VERSION,
        efa_domains,
        efa_provider_error,
        env: WATCHED.iter().map(|n| EnvVar { name: n.to_string(), value: std::env::var(n).ok() }).collect(),
    }
}

/// The `check` text: facts, then each role's decision, then how the current
/// environment differs from it.
pub fn render_check(r: &HostReport) -> String {
    let f = &r.facts;
    let mut t = Table::new(&[("Fact", Align::Left), ("Found", Align::Left)]);
    let kernel = match f.kernel {
        Some(k) if k >= KernelVersion::COPY_ON_FORK => {
            format!("{}: copies pinned pages on fork (>= 5.13)", r.kernel_release)
        }
        Some(_) => format!("{}: no copy-on-fork for pinned pages (< 5.13)", r.kernel_release),
        None => format!("{:?}: version not understood", r.kernel_release),
    };
    t.row(["kernel".to_string(), kernel]);
    let v = &r.verbs;
    let rdma = match (&v.library, v.rdma_core) {
        (None, _) => format!("not found ({}): EFA needs rdma-core >= 35", v.load_error.as_deref().unwrap_or("dlopen failed")),
        (Some(lib), Some(rel)) => format!("{rel} ({lib})"),
        (Some(lib), None) => format!("release unknown ({lib})"),
    };
    t.row(["rdma-core".to_string(), rdma]);
    let fork = match (v.loaded(), v.has_fork_query, v.fork_status) {
        (false, _, _) => "unknown (no libibverbs)".to_string(),
        (true, false, _) => "ibv_is_fork_initialized() missing: rdma-core older than 35".to_string(),
        (true, true, Some(s)) if s != ForkStatus::Unneeded && !v.kernel_rdma() => {
            format!("ibv_is_fork_initialized() = {} (not the kernel's word: no RDMA support loaded to ask)", s.name())
        }
        (true, true, Some(s)) => format!("ibv_is_fork_initialized() = {}", s.name()),
        (true, true, None) => "ibv_is_fork_initialized() returned an unknown value".to_string(),
    };
    t.row(["fork status".to_string(), fork]);
    let efa_prov = if r.efa_domains.is_empty() {
        "efa provider finds no device".to_string()
    } else {
        format!("efa provider finds {}", r.efa_domains.join(", "))
    };
    t.row([
        "libfabric".to_string(),
        format!("{}.{} (built against {}.{}); {efa_prov}", f.libfabric.0, f.libfabric.1, r.libfabric_headers.0, r.libfabric_headers.1),
    ]);
    t.row(["RDMA devices".to_string(), v.devices_line()]);
    let efa_devs: Vec<&verbs::RdmaDevice> = v.efa_devices().collect();
    if efa_devs.is_empty() {
        t.row(["EFA devices".to_string(), "none: shm/tcp only (fine for development)".to_string()]);
    }
    for d in efa_devs {
        let node = d.numa_node.map_or("NUMA node unknown".to_string(), |n| format!("NUMA node {n}"));
        let what = match (&d.efa, &d.efa_error) {
            (Some(a), _) => a.summary(),
            (None, Some(e)) => e.clone(),
            (None, None) => "libefa not loaded: capabilities unknown".to_string(),
        };
        t.row([format!("EFA {}", d.name), format!("{node}; {what}")]);
    }
    t.row(["hugepage pool".to_string(), format!("{} pages (all sizes)", f.hugepage_pages)]);
    for e in &r.env {
        t.row([e.name.clone(), e.value.clone().map_or("(unset)".to_string(), |v| format!("={v}"))]);
    }
    let mut out = t.render();
    for (role, what) in [
        (Role::Server, "tally itself: never forks, hugepage buffers"),
        (Role::Worker, "an NCCL training process with the plugin: forks data loaders"),
    ] {
        out.push_str(&format!("\nRole {role} ({what}):\n"));
        let settings = decide(role, f);
        let mut t = Table::new(&[("  Setting", Align::Left), ("Why", Align::Left)]);
        for s in &settings {
            t.row([format!("  {}", s.display()), s.reason.clone()]);
        }
        out.push_str(&t.render());
        let differs = env_differences(&settings, &r.env);
        if !differs.is_empty() {
            out.push_str(&format!("  this environment differs: {}\n", differs.join("; ")));
        }
    }
    out.push_str("\nApply with: eval \"$(tally efa-env print --role worker)\", or --format systemd for the server's unit.\n");
    out
}

/// Where the current environment disagrees with `settings`.
pub fn env_differences(settings: &[Setting], env: &[EnvVar]) -> Vec<String> {
    let mut out = Vec::new();
    for s in settings {
        let now = env.iter().find(|e| e.name == s.name).and_then(|e| e.value.as_deref());
        match (&s.value, now) {
            (Some(want), Some(have)) if want != have => out.push(format!("{} is {have}, wants {want}", s.name)),
            (Some(want), None) => out.push(format!("{} unset, wants {want}", s.name)),
            (None, Some(have)) => out.push(format!("{} is {have}, must be unset", s.name)),
            _ => {}
        }
    }
    out
}

#[derive(Serialize)]
struct CheckJson<'a> {
    host: &'a HostReport,
    server: Vec<SettingJson<'a>>,
    worker: Vec<SettingJson<'a>>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn k(major: u32, minor: u32) -> Option<KernelVersion> {
        Some(KernelVersion { major, minor, patch: 0 })
    }

    /// An EFA host on a current kernel with rdma-core 46 and libfabric 1.22:
    /// the base every case changes a little.
    fn modern() -> Facts {
        Facts {
            kernel: k(6, 1),
            rdma_core_present: true,
            rdma_core_release: Some(46),
            fork_query: true,
            fork_status: Some(ForkStatus::Unneeded),
            kernel_rdma: true,
            libfabric: (1, 22),
            efa_device: true,
            hugepage_pages: 1024,
        }
    }

    fn value<'a>(s: &'a [Setting], name: &str) -> Option<Option<&'a str>> {
        s.iter().find(|x| x.name == name).map(|x| x.value.as_deref())
    }

    fn reason<'a>(s: &'a [Setting], name: &str) -> &'a str {
        &s.iter().find(|x| x.name == name).unwrap().reason
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(KernelVersion::parse("6.1.0-18-amd64"), k(6, 1));
        assert_eq!(KernelVersion::parse("5.10.205-195.807.amzn2.aarch64"), Some(KernelVersion { major: 5, minor: 10, patch: 205 }));
        assert_eq!(KernelVersion::parse("5.13"), k(5, 13));
        assert_eq!(KernelVersion::parse("6.18.44-fc-v669").map(|v| v.patch), Some(44));
        assert_eq!(KernelVersion::parse("garbage"), None);
        assert!(KernelVersion::parse("5.12.19").unwrap() < KernelVersion::COPY_ON_FORK);
        assert!(KernelVersion::parse("5.13.0").unwrap() >= KernelVersion::COPY_ON_FORK);
    }

    /// Worker cases: (name, facts, fork variable and value, hugepage value,
    /// provider, a phrase the fork reason must contain).
    #[test]
    fn worker_decisions() {
        type Case = (&'static str, Facts, (&'static str, &'static str), &'static str, Option<&'static str>, &'static str);
        let cases: Vec<Case> = vec![
            ("rdma-core says unneeded", modern(), ("FI_EFA_FORK_SAFE", "0"), "0", Some("efa"), "IBV_FORK_UNNEEDED"),
            (
                "new kernel, no RDMA loaded here (this build host)",
                Facts { fork_status: Some(ForkStatus::Disabled), kernel_rdma: false, efa_device: false, hugepage_pages: 0, ..modern() },
                ("FI_EFA_FORK_SAFE", "0"),
                "0",
                None,
                ">= 5.13 copies pinned pages",
            ),
            (
                "old kernel",
                Facts { kernel: k(5, 10), fork_status: Some(ForkStatus::Disabled), ..modern() },
                ("FI_EFA_FORK_SAFE", "1"),
                "0",
                Some("efa"),
                "IBV_FORK_DISABLED",
            ),
            (
                "old kernel, no verdict from rdma-core",
                Facts { kernel: k(5, 4), fork_status: Some(ForkStatus::Disabled), kernel_rdma: false, ..modern() },
                ("FI_EFA_FORK_SAFE", "1"),
                "0",
                Some("efa"),
                "predates copy-on-fork",
            ),
            (
                "new kernel, rdma-core too old to ask",
                Facts { rdma_core_release: Some(32), fork_query: false, fork_status: None, ..modern() },
                ("FI_EFA_FORK_SAFE", "1"),
                "0",
                Some("efa"),
                "lacks ibv_is_fork_initialized",
            ),
            (
                "kernel RDMA core says no copy-on-fork",
                Facts { fork_status: Some(ForkStatus::Disabled), ..modern() },
                ("FI_EFA_FORK_SAFE", "1"),
                "0",
                Some("efa"),
                "not copied on fork",
            ),
            (
                "unknown kernel",
                Facts { kernel: None, fork_status: None, fork_query: false, rdma_core_present: false, kernel_rdma: false, ..modern() },
                ("FI_EFA_FORK_SAFE", "1"),
                "0",
                Some("efa"),
                "kernel version unknown",
            ),
            (
                "old libfabric, old kernel",
                Facts { kernel: k(4, 14), libfabric: (1, 11), fork_status: None, fork_query: false, ..modern() },
                ("RDMAV_FORK_SAFE", "1"),
                "0",
                Some("efa"),
                "predates FI_EFA_FORK_SAFE",
            ),
            (
                "no rdma-core installed, new kernel",
                Facts {
                    rdma_core_present: false,
                    rdma_core_release: None,
                    fork_query: false,
                    fork_status: None,
                    kernel_rdma: false,
                    ..modern()
                },
                ("FI_EFA_FORK_SAFE", "0"),
                "0",
                Some("efa"),
                "rdma-core not installed",
            ),
        ];
        for (name, facts, (fork_var, fork_val), huge, provider, phrase) in cases {
            let s = decide(Role::Worker, &facts);
            assert_eq!(value(&s, fork_var), Some(Some(fork_val)), "{name}: {s:#?}");
            assert!(reason(&s, fork_var).contains(phrase), "{name}: {:?}", reason(&s, fork_var));
            assert_eq!(value(&s, "FI_EFA_USE_HUGE_PAGE"), Some(Some(huge)), "{name}");
            assert_eq!(value(&s, "FI_PROVIDER"), Some(provider), "{name}");
            if fork_val == "1" {
                // Fork support is on: the huge-page reason is the incompatibility.
                assert!(reason(&s, "FI_EFA_USE_HUGE_PAGE").contains("do not mix"), "{name}");
                assert!(value(&s, "RDMAV_FORK_SAFE").is_none() || fork_var == "RDMAV_FORK_SAFE", "{name}");
            } else {
                // Copy-on-fork: the huge-page reason is pool exhaustion, and
                // RDMAV_FORK_SAFE must go.
                assert!(reason(&s, "FI_EFA_USE_HUGE_PAGE").contains("Cannot allocate memory"), "{name}");
                assert_eq!(value(&s, "RDMAV_FORK_SAFE"), Some(None), "{name}");
            }
            for x in &s {
                assert!(!x.reason.contains('\n'), "{name}: reasons are one line: {x:?}");
            }
        }
    }

    #[test]
    fn worker_pool_reason_names_the_pool() {
        let s = decide(Role::Worker, &modern());
        assert!(reason(&s, "FI_EFA_USE_HUGE_PAGE").contains("pool of 1024 pages"));
        let s = decide(Role::Worker, &Facts { hugepage_pages: 0, ..modern() });
        assert!(reason(&s, "FI_EFA_USE_HUGE_PAGE").contains("pool is empty here"));
    }

    /// The server's answer does not depend on the host: it never forks.
    #[test]
    fn server_decisions() {
        let hosts = [
            modern(),
            Facts { kernel: k(5, 4), fork_status: Some(ForkStatus::Disabled), ..modern() },
            Facts { libfabric: (1, 11), ..modern() },
            Facts { efa_device: false, rdma_core_present: false, ..modern() },
        ];
        for f in hosts {
            let s = decide(Role::Server, &f);
            assert_eq!(value(&s, "FI_EFA_FORK_SAFE"), Some(Some("0")));
            assert_eq!(value(&s, "RDMAV_FORK_SAFE"), Some(None));
            assert_eq!(value(&s, "IBV_FORK_SAFE"), Some(None));
            assert_eq!(value(&s, "FI_EFA_USE_HUGE_PAGE"), Some(Some("1")));
            assert_eq!(value(&s, "FI_PROVIDER"), Some(None));
            assert!(reason(&s, "FI_EFA_FORK_SAFE").contains("never forks"));
        }
    }

    #[test]
    fn formats() {
        let f = modern();
        let s = decide(Role::Worker, &f);
        let sh = render_sh(Role::Worker, &f, &s);
        assert!(sh.contains("\nexport FI_EFA_FORK_SAFE=0\n"), "{sh}");
        assert!(sh.contains("\nunset RDMAV_FORK_SAFE\n"), "{sh}");
        assert!(sh.contains("\nexport FI_PROVIDER=efa\n"), "{sh}");
        let s = decide(Role::Server, &f);
        let sd = render_systemd(Role::Server, &f, &s);
        assert!(sd.contains("\nFI_EFA_FORK_SAFE=0\n"), "{sd}");
        assert!(sd.contains("# RDMAV_FORK_SAFE must stay unset (UnsetEnvironment=RDMAV_FORK_SAFE"), "{sd}");
        // Every non-comment line of an EnvironmentFile is NAME=value.
        for line in sd.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.split_once('=').is_some_and(|(n, _)| n.chars().all(|c| c.is_ascii_uppercase() || c == '_')), "{line}");
        }
        assert_eq!(sh_quote("tcp;ofi_rxm"), "'tcp;ofi_rxm'");
        assert_eq!(sh_quote("efa"), "efa");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn environment_differences() {
        let s = decide(Role::Server, &modern());
        let var = |n: &str, v: &str| EnvVar { name: n.to_string(), value: Some(v.to_string()) };
        let env = vec![var("FI_EFA_FORK_SAFE", "1"), var("RDMAV_FORK_SAFE", "1"), var("FI_EFA_USE_HUGE_PAGE", "1")];
        let d = env_differences(&s, &env);
        assert_eq!(d, ["FI_EFA_FORK_SAFE is 1, wants 0", "RDMAV_FORK_SAFE is 1, must be unset"]);
    }
}
