//! `efa-env check`: the facts read from this host, the variables set in
//! this environment, and how they differ from what each role needs.
use super::decision::{decide, Facts, KernelVersion, Role, Setting};
use super::render::SettingJson;
use crate::host::cpu::CpuFacts;
use crate::host::table::{Align, Table};
use crate::host::verbs::{self, ForkStatus, VerbsReport};
use serde::Serialize;

/// The variables `check` reports from the current environment.
pub const WATCHED: &[&str] = &["FI_EFA_FORK_SAFE", "FI_EFA_USE_HUGE_PAGE", "RDMAV_FORK_SAFE", "IBV_FORK_SAFE", "FI_PROVIDER"];

/// Everything `check` looked at, beyond the facts the decision needs.
#[derive(Debug, Serialize)]
pub struct HostReport {
    pub kernel_release: String,
    /// The CPU: on a Graviton, its Neoverse core names the generation.
    pub cpu: CpuFacts,
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

pub(super) fn kernel_release() -> String {
    // SAFETY: an all-zero utsname is a valid out-parameter for uname.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: uname fills `release` with a NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy().into_owned()
}

pub(super) fn hugepage_pages() -> u64 {
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
        cpu: crate::host::cpu::read(),
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
    t.row(["CPU".to_string(), r.cpu.describe()]);
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
pub(super) struct CheckJson<'a> {
    pub(super) host: &'a HostReport,
    pub(super) server: Vec<SettingJson<'a>>,
    pub(super) worker: Vec<SettingJson<'a>>,
}
