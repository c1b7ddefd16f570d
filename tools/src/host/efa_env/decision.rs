//! The decision: which variables a role (server or worker) needs, from
//! [`Facts`] about the kernel, rdma-core, libfabric and the devices, each
//! setting with its one-line reason. Pure: the tests walk every case.
use crate::host::verbs::ForkStatus;
use clap::ValueEnum;
use serde::Serialize;
use std::fmt;

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
    pub(super) fn set(name: &'static str, value: &str, reason: impl Into<String>) -> Setting {
        Setting { name, value: Some(value.to_string()), reason: reason.into() }
    }

    pub(super) fn unset(name: &'static str, reason: impl Into<String>) -> Setting {
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
pub(super) fn fork_support_needed(f: &Facts) -> (bool, String) {
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
pub(super) fn has_fi_efa_fork_safe(f: &Facts) -> bool {
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
