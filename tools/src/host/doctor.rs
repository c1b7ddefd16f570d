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
//! The host is read once into [`HostFacts`]; [`evaluate`] is a pure function
//! from the target configuration and those facts to the rows, so the tests
//! can describe an EFA host, a VM without cpufreq or a misconfigured NUMA
//! layout without owning one.
use super::table::{Align, Table};
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use tally_engine::host::config::{ServerConfig, ServerFile};
use tally_engine::host::cpuset::{self, CoreList};
use tally_engine::host::hugepages::{self, PoolState};
use tally_engine::host::units::{format_size, format_size_arg};

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

/// A row's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Info,
    Warn,
    Fail,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Info => "info",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    /// What was found, one line.
    pub detail: String,
    /// What to do about it, one line (warn and fail rows).
    pub fix: Option<String>,
}

fn row(name: &str, status: Status, detail: impl Into<String>, fix: Option<String>) -> Check {
    Check { name: name.to_string(), status, detail: detail.into(), fix }
}

/// What the host is checked against: a configuration file's settings, or
/// the built-in defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub config: ServerConfig,
}

impl Target {
    fn provider(&self) -> Option<String> {
        self.config.provider.as_deref().map(tally_engine::dataplane::fabric::canonical_provider)
    }

    fn busy(&self) -> bool {
        self.config.poll == "busy"
    }
}

/// One RDMA device from /sys/class/infiniband.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicFact {
    pub name: String,
    pub driver: Option<String>,
    pub numa_node: Option<u32>,
}

/// An interrupt line whose name mentions the NIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IrqFact {
    pub irq: u32,
    pub name: String,
    /// `/proc/irq/N/smp_affinity_list`, when readable.
    pub affinity: Option<Vec<usize>>,
}

/// Everything doctor reads from the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// (provider, available) for efa, shm, tcp;ofi_rxm.
    pub providers: Vec<(String, bool)>,
    pub libfabric: (u32, u32),
    pub nics: Vec<NicFact>,
    /// CPU -> NUMA node.
    pub cpu_node: BTreeMap<usize, u32>,
    /// The system-wide hugepage pools.
    pub pools: Vec<PoolState>,
    /// Cores isolated from the scheduler: /sys/devices/system/cpu/isolated,
    /// nohz_full, and the same from /proc/cmdline.
    pub isolated: Vec<usize>,
    /// The kernel command line.
    pub cmdline: String,
    /// Per lcore core: its scaling governor (`None`: no cpufreq).
    pub governors: BTreeMap<usize, Option<String>>,
    pub thp: Option<String>,
    /// RLIMIT_MEMLOCK soft limit in bytes; `None` = unlimited.
    pub memlock: Option<u64>,
    /// This process may lock memory regardless of the limit.
    pub cap_ipc_lock: bool,
    pub nic_irqs: Vec<IrqFact>,
    /// The process's allowed CPUs.
    pub allowed: Vec<usize>,
}

/// Parse a sysfs/cmdline CPU list ("2-5,8"); an empty string is no CPUs.
/// Unparseable text is treated as no CPUs: it is only ever advisory input.
pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let s = s.trim();
    if s.is_empty() {
        return Vec::new();
    }
    CoreList::parse(s).map(|c| c.as_slice().to_vec()).unwrap_or_default()
}

/// The CPUs named by `isolcpus=` and `nohz_full=` on a kernel command line.
/// `isolcpus` may lead with flags (`isolcpus=managed_irq,domain,2-63`).
pub fn cmdline_isolated(cmdline: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for word in cmdline.split_whitespace() {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        if key != "isolcpus" && key != "nohz_full" {
            continue;
        }
        let cpus: Vec<&str> = value.split(',').filter(|p| p.starts_with(|c: char| c.is_ascii_digit())).collect();
        out.extend(parse_cpu_list(&cpus.join(",")));
    }
    out
}

/// The lines of a /proc/interrupts text whose device names mention `efa`:
/// (irq number, name).
pub fn parse_interrupts(text: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((num, rest)) = line.trim_start().split_once(':') else {
            continue;
        };
        let Ok(irq) = num.trim().parse::<u32>() else {
            continue;
        };
        // The name is the last field: `efa-comp0@pci:0000:00:06.0` and kin.
        let Some(name) = rest.split_whitespace().last() else {
            continue;
        };
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("efa") || lower.contains("-efa") || lower.contains("efa-") {
            out.push((irq, name.to_string()));
        }
    }
    out
}

fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// CPU -> node from /sys/devices/system/node/nodeN/cpulist.
fn cpu_nodes() -> BTreeMap<usize, u32> {
    let mut map = BTreeMap::new();
    for node in hugepages::numa_nodes().unwrap_or_default() {
        if let Some(list) = read_trim(format!("/sys/devices/system/node/node{node}/cpulist")) {
            for cpu in parse_cpu_list(&list) {
                map.insert(cpu, node);
            }
        }
    }
    map
}

fn rdma_nics() -> Vec<NicFact> {
    let Ok(entries) = fs::read_dir("/sys/class/infiniband") else {
        return Vec::new();
    };
    let mut out: Vec<NicFact> = entries
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let driver =
                fs::read_link(e.path().join("device/driver")).ok().and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()));
            NicFact { numa_node: super::verbs::device_numa_node(&name), driver, name }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether CAP_IPC_LOCK (bit 14) is in this process's effective set.
fn has_cap_ipc_lock() -> bool {
    let Some(status) = fs::read_to_string("/proc/self/status").ok() else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid out-parameter for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Some(0);
    }
    (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Read everything [`evaluate`] needs; `lcores` picks which cores' governors
/// to read.
pub fn gather(lcores: &CoreList) -> HostFacts {
    use tally_engine::dataplane::fabric;
    let providers = ["efa", "shm", "tcp;ofi_rxm"].iter().map(|p| (p.to_string(), fabric::provider_available(p))).collect();
    let cmdline = read_trim("/proc/cmdline").unwrap_or_default();
    let mut isolated = parse_cpu_list(&read_trim("/sys/devices/system/cpu/isolated").unwrap_or_default());
    isolated.extend(parse_cpu_list(&read_trim("/sys/devices/system/cpu/nohz_full").unwrap_or_default()));
    isolated.extend(cmdline_isolated(&cmdline));
    isolated.sort_unstable();
    isolated.dedup();
    let governors = lcores.iter().map(|c| (c, read_trim(format!("/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor")))).collect();
    let pools = hugepages::pools().unwrap_or_default().into_iter().filter(|p| p.node.is_none()).collect();
    let nic_irqs = parse_interrupts(&fs::read_to_string("/proc/interrupts").unwrap_or_default())
        .into_iter()
        .map(|(irq, name)| IrqFact {
            irq,
            name,
            affinity: read_trim(format!("/proc/irq/{irq}/smp_affinity_list")).map(|s| parse_cpu_list(&s)),
        })
        .collect();
    HostFacts {
        providers,
        libfabric: fabric::library_version(),
        nics: rdma_nics(),
        cpu_node: cpu_nodes(),
        pools,
        isolated,
        cmdline,
        governors,
        thp: hugepages::thp_mode().ok().map(|m| m.to_string()),
        memlock: memlock_limit(),
        cap_ipc_lock: has_cap_ipc_lock(),
        nic_irqs,
        allowed: cpuset::allowed().map(|c| c.as_slice().to_vec()).unwrap_or_default(),
    }
}

fn list(cores: &[usize]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    CoreList::from_cores(sorted).map(|c| c.to_string()).unwrap_or_default()
}

fn check_providers(t: &Target, h: &HostFacts) -> Vec<Check> {
    let wanted = t.provider();
    let any = h.providers.iter().any(|(_, ok)| *ok);
    let mut out = Vec::new();
    for (name, ok) in &h.providers {
        let label = format!("provider {}", if name == "tcp;ofi_rxm" { "tcp" } else { name });
        let configured = wanted.as_deref() == Some(name.as_str());
        let c = match (ok, name.as_str()) {
            (true, "efa") => row(&label, Status::Pass, "efa finds an EFA device", None),
            (true, _) => row(&label, Status::Pass, format!("{name} available"), None),
            (false, "efa") if configured => row(
                &label,
                Status::Fail,
                "no EFA device, and the configuration asks for provider efa",
                Some("run on an EFA-enabled instance (efa driver loaded, security group allows all traffic to itself), or set provider = \"tcp\"".into()),
            ),
            (false, "efa") => row(
                &label,
                Status::Warn,
                "no EFA device; shm/tcp only (fine for development)",
                Some("production servers need an EFA-enabled instance (c7gn, p5, ...) with the efa driver".into()),
            ),
            (false, _) if configured || !any => row(
                &label,
                Status::Fail,
                format!("libfabric {}.{} does not offer {name}", h.libfabric.0, h.libfabric.1),
                Some("install a libfabric with this provider (Debian: libfabric1; AWS: the EFA installer)".into()),
            ),
            (false, _) => row(
                &label,
                Status::Warn,
                format!("libfabric {}.{} does not offer {name}", h.libfabric.0, h.libfabric.1),
                Some("install a libfabric with this provider (Debian: libfabric1; AWS: the EFA installer)".into()),
            ),
        };
        out.push(c);
    }
    out
}

fn check_lcores(t: &Target, h: &HostFacts) -> Check {
    let lcores = t.config.lcores.as_slice();
    let missing: Vec<usize> = lcores.iter().copied().filter(|c| !h.allowed.contains(c)).collect();
    if !missing.is_empty() {
        return row(
            "lcores",
            Status::Fail,
            if missing.len() == lcores.len() {
                format!("lcores {} are all outside this host's allowed CPUs ({})", t.config.lcores, list(&h.allowed))
            } else {
                format!(
                    "lcores {} include cores {} outside this host's allowed CPUs ({})",
                    t.config.lcores,
                    list(&missing),
                    list(&h.allowed)
                )
            },
            Some(format!("choose lcores within {} (or run on the host this configuration is for)", list(&h.allowed))),
        );
    }
    if lcores.contains(&0) {
        let status = if t.busy() { Status::Warn } else { Status::Info };
        return row(
            "lcores",
            status,
            format!("{} lcores on {}, including core 0 (the kernel's housekeeping core)", lcores.len(), t.config.lcores),
            Some("leave core 0 (and the NIC's interrupt cores) out of lcores".into()),
        );
    }
    row("lcores", Status::Pass, format!("{} lcores on {}", lcores.len(), t.config.lcores), None)
}

fn check_nic_numa(t: &Target, h: &HostFacts) -> Check {
    let efa: Vec<&NicFact> = h.nics.iter().filter(|n| n.driver.as_deref() == Some("efa")).collect();
    if efa.is_empty() {
        let others = if h.nics.is_empty() {
            "no RDMA devices in /sys/class/infiniband".to_string()
        } else {
            format!("RDMA devices {} but none with the efa driver", h.nics.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", "))
        };
        return row("EFA NUMA", Status::Info, format!("{others}: nothing to place"), None);
    }
    let mut lcore_nodes: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for c in t.config.lcores.iter() {
        if let Some(&n) = h.cpu_node.get(&c) {
            lcore_nodes.entry(n).or_default().push(c);
        }
    }
    let mut parts = Vec::new();
    let mut far: Vec<usize> = Vec::new();
    for nic in &efa {
        match nic.numa_node {
            None => parts.push(format!("{}: NUMA node unknown", nic.name)),
            Some(n) => {
                parts.push(format!("{} on node {n}", nic.name));
                for (node, cores) in &lcore_nodes {
                    if *node != n && efa.len() == 1 {
                        far.extend(cores);
                    }
                }
            }
        }
    }
    if !far.is_empty() {
        return row(
            "EFA NUMA",
            Status::Warn,
            format!("{}; lcores {} are on another node (cross-socket DMA)", parts.join(", "), list(&far)),
            Some("pick lcores on the NIC's node (lscpu, /sys/class/infiniband/*/device/numa_node)".into()),
        );
    }
    row("EFA NUMA", Status::Pass, format!("{}; lcores on the same node", parts.join(", ")), None)
}

fn check_hugepages(t: &Target, h: &HostFacts) -> Check {
    let c = &t.config;
    let slab = c.slab_size.div_ceil(hugepages::SIZE_2M) * hugepages::SIZE_2M;
    let need = slab * c.lcores.len() as u64;
    let have: u64 = h.pools.iter().map(|p| p.available() * p.page_size).sum();
    let total: u64 = h.pools.iter().map(|p| p.total * p.page_size).sum();
    let detail = format!(
        "need {} ({} lcores x {} slab), pools have {} free of {}",
        format_size(need),
        c.lcores.len(),
        format_size(c.slab_size),
        format_size(have),
        format_size(total)
    );
    if c.hugepages == "off" {
        return row("hugepages", Status::Info, format!("off in the configuration; slabs use normal pages ({detail})"), None);
    }
    if h.pools.is_empty() {
        let status = if c.hugepages == "require" { Status::Fail } else { Status::Warn };
        return row(
            "hugepages",
            status,
            "this kernel has no hugetlb pools",
            Some("use a kernel with CONFIG_HUGETLBFS, or hugepages = \"off\"".into()),
        );
    }
    if have >= need {
        return row("hugepages", Status::Pass, detail, None);
    }
    let fix = Some(format!("tally hugepages reserve {} (a running server's pages count as used)", format_size_arg(need - have)));
    if c.hugepages == "require" {
        row("hugepages", Status::Fail, format!("{detail}: the server will refuse to start"), fix)
    } else {
        row("hugepages", Status::Warn, format!("{detail}: slabs fall back to transparent huge pages or normal pages"), fix)
    }
}

fn check_isolation(t: &Target, h: &HostFacts) -> Check {
    let lcores = t.config.lcores.as_slice();
    let not: Vec<usize> = lcores.iter().copied().filter(|c| !h.isolated.contains(c)).collect();
    if !not.is_empty() {
        let all = list(lcores);
        let fix = Some(format!("kernel command line: isolcpus=managed_irq,domain,{all} nohz_full={all} rcu_nocbs={all}"));
        let what = if h.isolated.is_empty() {
            "no isolated cores (isolcpus/nohz_full)".to_string()
        } else {
            format!("isolated cores are {}", list(&h.isolated))
        };
        return if t.busy() {
            row("isolated cores", Status::Warn, format!("{what}; lcores {} share their cores with the scheduler", list(&not)), fix)
        } else {
            row("isolated cores", Status::Info, format!("{what}; fine for adaptive polling"), fix)
        };
    }
    row("isolated cores", Status::Pass, format!("lcores {} are isolated", list(lcores)), None)
}

fn check_governor(h: &HostFacts) -> Check {
    let known: Vec<(usize, &str)> = h.governors.iter().filter_map(|(c, g)| g.as_deref().map(|g| (*c, g))).collect();
    if known.is_empty() {
        return row("CPU governor", Status::Info, "no cpufreq in sysfs (a VM, or the firmware controls the clock)", None);
    }
    let slow: Vec<usize> = known.iter().filter(|(_, g)| *g != "performance").map(|(c, _)| *c).collect();
    if slow.is_empty() {
        return row("CPU governor", Status::Pass, "performance on every lcore", None);
    }
    let names: Vec<&str> = {
        let mut v: Vec<&str> = known.iter().filter(|(_, g)| *g != "performance").map(|(_, g)| *g).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    row(
        "CPU governor",
        Status::Warn,
        format!("{} on cores {}", names.join("/"), list(&slow)),
        Some("cpupower frequency-set -g performance (or tuned-adm profile network-latency)".into()),
    )
}

fn check_thp(h: &HostFacts) -> Check {
    match h.thp.as_deref() {
        Some("madvise") => row("THP", Status::Pass, "madvise: slabs ask for transparent huge pages when hugetlb pools fall short", None),
        Some("always") => row("THP", Status::Pass, "always: slabs get transparent huge pages when hugetlb pools fall short", None),
        Some(m) => row(
            "THP",
            Status::Warn,
            format!("{m}: a slab without hugetlb pages falls back to 4 KiB pages"),
            Some("echo madvise > /sys/kernel/mm/transparent_hugepage/enabled".into()),
        ),
        None => row("THP", Status::Info, "mode unreadable", None),
    }
}

fn check_memlock(t: &Target, h: &HostFacts) -> Check {
    let Some(limit) = h.memlock else {
        return row("memlock", Status::Pass, "unlimited", None);
    };
    let fix = Some("LimitMEMLOCK=infinity in the unit; shells: `* - memlock unlimited` in /etc/security/limits.d/".to_string());
    let efa = t.provider().as_deref() == Some("efa");
    let what = format!("limit {}: EFA pins every registered buffer and needs unlimited", format_size(limit));
    if h.cap_ipc_lock {
        return row(
            "memlock",
            Status::Warn,
            format!("{what} (not enforced here: this process has CAP_IPC_LOCK; a server without it would fail)"),
            fix,
        );
    }
    if efa {
        row("memlock", Status::Fail, what, fix)
    } else {
        row("memlock", Status::Warn, what, fix)
    }
}

fn check_irqs(t: &Target, h: &HostFacts) -> Check {
    if h.nic_irqs.is_empty() {
        return row("NIC interrupts", Status::Info, "no efa interrupts in /proc/interrupts", None);
    }
    let lcores = t.config.lcores.as_slice();
    let mut clash: Vec<u32> = Vec::new();
    let mut unknown = 0;
    let mut on: Vec<usize> = Vec::new();
    for irq in &h.nic_irqs {
        match &irq.affinity {
            None => unknown += 1,
            Some(cpus) => {
                let hit: Vec<usize> = cpus.iter().copied().filter(|c| lcores.contains(c)).collect();
                if !hit.is_empty() {
                    clash.push(irq.irq);
                    on.extend(hit);
                }
            }
        }
    }
    if !clash.is_empty() {
        let irqs: Vec<String> = clash.iter().map(|i| i.to_string()).collect();
        let housekeeping: Vec<usize> = h.allowed.iter().copied().filter(|c| !lcores.contains(c)).collect();
        let target = if housekeeping.is_empty() { "a non-lcore core".to_string() } else { list(&housekeeping) };
        return row(
            "NIC interrupts",
            Status::Warn,
            format!("efa IRQs {} may fire on lcore cores {}", irqs.join(","), list(&on)),
            Some(format!(
                "echo {target} > /proc/irq/N/smp_affinity_list for each (and ban them in irqbalance: IRQBALANCE_BANNED_CPULIST={})",
                list(lcores)
            )),
        );
    }
    let seen = h.nic_irqs.len() - unknown;
    row(
        "NIC interrupts",
        Status::Pass,
        format!("{seen} efa IRQs, none on lcore cores{}", if unknown > 0 { format!(" ({unknown} unreadable)") } else { String::new() }),
        None,
    )
}

/// Every row, in table order.
pub fn evaluate(t: &Target, h: &HostFacts) -> Vec<Check> {
    let mut out = vec![row(
        "libfabric",
        Status::Info,
        format!(
            "{}.{}; configured provider: {}",
            h.libfabric.0,
            h.libfabric.1,
            t.provider().unwrap_or_else(|| "chosen at start (efa, else shm/tcp)".into())
        ),
        None,
    )];
    out.extend(check_providers(t, h));
    out.push(check_nic_numa(t, h));
    out.push(check_lcores(t, h));
    out.push(check_hugepages(t, h));
    out.push(check_isolation(t, h));
    out.push(check_governor(h));
    out.push(check_thp(h));
    out.push(check_memlock(t, h));
    out.push(check_irqs(t, h));
    out
}

/// The rows a start with this configuration would fail on (what `tally
/// server --check` refuses): lcores outside the allowed CPUs, the configured
/// provider absent (or, chosen at start, none at all), hugepages required
/// but not enough free, EFA without the memlock it needs.
pub fn start_blockers(t: &Target, h: &HostFacts) -> Vec<Check> {
    let mut out: Vec<Check> = Vec::new();
    if let Some(p) = t.provider() {
        if !h.providers.iter().any(|(name, _)| *name == p) {
            // A provider doctor does not list (verbs, psm3, ...): ask libfabric.
            if !tally_engine::dataplane::fabric::provider_available(&p) {
                out.push(row(
                    &format!("provider {p}"),
                    Status::Fail,
                    format!("libfabric {}.{} offers no {p} endpoint here (fi_getinfo found none)", h.libfabric.0, h.libfabric.1),
                    Some("use provider efa, tcp or shm, or install a libfabric with this provider".into()),
                ));
            }
        }
    }
    out.extend(check_providers(t, h));
    out.push(check_lcores(t, h));
    out.push(check_hugepages(t, h));
    out.push(check_memlock(t, h));
    out.retain(|c| c.status == Status::Fail);
    out
}

/// 1 when any row fails, else 0.
pub fn exit_code(checks: &[Check]) -> u8 {
    u8::from(checks.iter().any(|c| c.status == Status::Fail))
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
        super::out(&(serde_json::to_string_pretty(&r).map_err(|e| e.to_string())? + "\n"))?;
    } else {
        super::out(&render(&source, &checks))?;
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_engine::host::hugepages::SIZE_2M;

    fn target(toml: &str) -> Target {
        Target { config: ServerFile::parse(toml).unwrap().resolve().unwrap() }
    }

    /// This build host: no EFA, 2 cores, no cpufreq, empty pools, THP madvise.
    fn dev_host() -> HostFacts {
        HostFacts {
            providers: vec![("efa".into(), false), ("shm".into(), true), ("tcp;ofi_rxm".into(), true)],
            libfabric: (1, 17),
            cpu_node: [(0, 0), (1, 0)].into_iter().collect(),
            pools: vec![PoolState { page_size: SIZE_2M, node: None, total: 0, free: 0, reserved: Some(0), surplus: 0 }],
            governors: [(0, None), (1, None)].into_iter().collect(),
            thp: Some("madvise".into()),
            memlock: Some(8 << 20),
            cap_ipc_lock: false,
            allowed: vec![0, 1],
            ..Default::default()
        }
    }

    /// A tuned c7gn-like host: EFA on node 0, 64 cores, isolated 2-63.
    fn efa_host() -> HostFacts {
        HostFacts {
            providers: vec![("efa".into(), true), ("shm".into(), true), ("tcp;ofi_rxm".into(), true)],
            libfabric: (1, 22),
            nics: vec![NicFact { name: "rdmap0s6".into(), driver: Some("efa".into()), numa_node: Some(0) }],
            cpu_node: (0..64).map(|c| (c, 0)).collect(),
            pools: vec![PoolState { page_size: SIZE_2M, node: None, total: 20_000, free: 20_000, reserved: Some(0), surplus: 0 }],
            isolated: (2..64).collect(),
            governors: (2..64).map(|c| (c, Some("performance".to_string()))).collect(),
            thp: Some("madvise".into()),
            memlock: None,
            nic_irqs: vec![IrqFact { irq: 40, name: "efa-comp0@pci:0000:00:06.0".into(), affinity: Some(vec![1]) }],
            allowed: (0..64).collect(),
            ..Default::default()
        }
    }

    const C7GN: &str = "lcores = \"2-63\"\nprovider = \"efa\"\npoll = \"busy\"\nhugepages = \"require\"\nslab_size = \"512M\"\n";

    fn status(checks: &[Check], name: &str) -> Status {
        checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no row {name}: {checks:#?}")).status
    }

    fn detail<'a>(checks: &'a [Check], name: &str) -> &'a str {
        &checks.iter().find(|c| c.name == name).unwrap().detail
    }

    #[test]
    fn dev_host_with_defaults_only_warns() {
        let c = evaluate(&target(""), &dev_host());
        assert_eq!(status(&c, "provider efa"), Status::Warn);
        assert_eq!(detail(&c, "provider efa"), "no EFA device; shm/tcp only (fine for development)");
        assert_eq!(status(&c, "provider shm"), Status::Pass);
        assert_eq!(status(&c, "provider tcp"), Status::Pass);
        assert_eq!(status(&c, "hugepages"), Status::Warn);
        assert_eq!(status(&c, "CPU governor"), Status::Info);
        assert_eq!(status(&c, "isolated cores"), Status::Info);
        // tally runs no real-time threads: RT throttling is not checked.
        assert!(c.iter().all(|x| x.name != "RT throttling"), "{c:#?}");
        assert_eq!(status(&c, "EFA NUMA"), Status::Info);
        assert_eq!(status(&c, "memlock"), Status::Warn);
        assert_eq!(exit_code(&c), 0);
        // Every warning carries a fix.
        assert!(c.iter().filter(|x| x.status >= Status::Warn).all(|x| x.fix.is_some()), "{c:#?}");
    }

    #[test]
    fn efa_config_on_a_dev_host_fails() {
        let c = evaluate(&target(C7GN), &dev_host());
        assert_eq!(status(&c, "provider efa"), Status::Fail);
        assert_eq!(status(&c, "lcores"), Status::Fail);
        assert_eq!(status(&c, "hugepages"), Status::Fail);
        assert_eq!(status(&c, "memlock"), Status::Fail);
        assert_eq!(status(&c, "isolated cores"), Status::Warn);
        assert!(c.iter().all(|x| !x.fix.as_deref().unwrap_or("").contains("sched_rt")), "{c:#?}");
        assert_eq!(detail(&c, "lcores"), "lcores 2-63 are all outside this host's allowed CPUs (0-1)");
        let fix = c.iter().find(|x| x.name == "hugepages").unwrap().fix.clone().unwrap();
        assert!(fix.starts_with("tally hugepages reserve 31G"), "{fix}");
        assert_eq!(exit_code(&c), 1);
    }

    #[test]
    fn tuned_efa_host_passes() {
        let c = evaluate(&target(C7GN), &efa_host());
        for x in &c {
            assert!(matches!(x.status, Status::Pass | Status::Info), "{x:?}");
        }
        assert_eq!(exit_code(&c), 0);
    }

    #[test]
    fn finds_misplaced_lcores_and_irqs() {
        let mut h = efa_host();
        for c in 32..64 {
            h.cpu_node.insert(c, 1);
        }
        h.nic_irqs.push(IrqFact { irq: 41, name: "efa-comp1".into(), affinity: Some(vec![5, 6]) });
        h.governors.insert(7, Some("powersave".into()));
        h.isolated.retain(|&c| c != 9);
        let c = evaluate(&target(C7GN), &h);
        assert_eq!(status(&c, "EFA NUMA"), Status::Warn);
        assert!(detail(&c, "EFA NUMA").contains("lcores 32-63 are on another node"), "{c:#?}");
        assert_eq!(status(&c, "NIC interrupts"), Status::Warn);
        assert!(detail(&c, "NIC interrupts").contains("IRQs 41 may fire on lcore cores 5-6"));
        assert_eq!(status(&c, "CPU governor"), Status::Warn);
        assert!(detail(&c, "CPU governor").contains("powersave on cores 7"));
        assert_eq!(status(&c, "isolated cores"), Status::Warn);
        assert!(detail(&c, "isolated cores").contains("lcores 9 share"));
        assert_eq!(exit_code(&c), 0);
    }

    #[test]
    fn policies_and_limits() {
        let mut h = dev_host();
        // hugepages off: nothing to reserve.
        let c = evaluate(&target("hugepages = \"off\""), &h);
        assert_eq!(status(&c, "hugepages"), Status::Info);
        // enough pages: pass (2 lcores x 256 MiB default slab = 256 pages).
        h.pools[0].total = 300;
        h.pools[0].free = 300;
        let c = evaluate(&target(""), &h);
        assert_eq!(status(&c, "hugepages"), Status::Pass, "{c:#?}");
        // reserved pages are promised to someone else.
        h.pools[0].reserved = Some(100);
        let c = evaluate(&target(""), &h);
        assert_eq!(status(&c, "hugepages"), Status::Warn);
        // CAP_IPC_LOCK makes a limit a warning even for efa.
        h.cap_ipc_lock = true;
        let c = evaluate(&target("provider = \"efa\""), &h);
        assert_eq!(status(&c, "memlock"), Status::Warn);
        // THP never warns; a core 0 lcore with busy polling warns.
        h.thp = Some("never".into());
        let c = evaluate(&target("poll = \"busy\""), &h);
        assert_eq!(status(&c, "THP"), Status::Warn);
        assert_eq!(status(&c, "lcores"), Status::Warn);
        // No provider at all is a failure even without a configuration.
        h.providers.iter_mut().for_each(|p| p.1 = false);
        let c = evaluate(&target(""), &h);
        assert_eq!(status(&c, "provider shm"), Status::Fail);
        assert_eq!(status(&c, "provider efa"), Status::Warn);
    }

    #[test]
    fn parses_host_files() {
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("2-4,8\n"), vec![2, 3, 4, 8]);
        assert_eq!(cmdline_isolated("quiet isolcpus=managed_irq,domain,2-5 nohz_full=2-5,9 ro"), vec![2, 3, 4, 5, 2, 3, 4, 5, 9]);
        assert_eq!(cmdline_isolated("console=ttyS0 quiet"), Vec::<usize>::new());
        let interrupts = "           CPU0       CPU1\n  \
            24:          0          0   PCI-MSI 81920-edge      ena-mgmnt@pci:0000:00:05.0\n  \
            40:        123          0   PCI-MSI 98304-edge      efa-mgmnt@pci:0000:00:06.0\n  \
            41:          5          7   PCI-MSI 98305-edge      efa-comp0@pci:0000:00:06.0\n \
            NMI:          0          0   Non-maskable interrupts\n";
        assert_eq!(
            parse_interrupts(interrupts),
            vec![(40, "efa-mgmnt@pci:0000:00:06.0".to_string()), (41, "efa-comp0@pci:0000:00:06.0".to_string())]
        );
    }

    #[test]
    fn renders_fixes_under_their_rows() {
        let c = evaluate(&target(""), &dev_host());
        let text = render("defaults", &c);
        let lines: Vec<&str> = text.lines().collect();
        let i = lines.iter().position(|l| l.starts_with("provider efa")).unwrap();
        assert!(lines[i].contains("warn") && lines[i].ends_with("no EFA device; shm/tcp only (fine for development)"), "{text}");
        assert!(lines[i + 1].trim_start().starts_with("fix: "), "{text}");
        assert!(text.contains(" failed ("), "{text}");
    }
}
