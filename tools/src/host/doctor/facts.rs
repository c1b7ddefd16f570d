//! What `tally doctor` reads from the machine, as plain structs of facts
//! ([`HostFacts`]) that the checks decide on, and the parsers of the host
//! files those facts come from.
use crate::host::cpu::{self, CpuFacts};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use tally_engine::dataplane::slab::PageGeometry;
use tally_engine::host::cpuset::{self, CoreList};
use tally_engine::host::hugepages::{self, PoolState};

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
    /// net.ipv4.tcp_autocorking of this network namespace (`None`: unreadable).
    pub tcp_autocorking: Option<bool>,
    /// net.ipv4.tcp_congestion_control of this network namespace (`None`: unreadable).
    pub tcp_congestion_control: Option<String>,
    /// The floor of TCP's timers: whether a process may set its own
    /// connections' (Linux 6.15+), and the namespace's default
    /// (net.ipv4.tcp_rto_min_us, Linux 6.11+; `None`: unreadable).
    pub tcp_rto_floor_per_socket: bool,
    pub tcp_rto_min_us: Option<u64>,
    /// The floor tally's processes would set (`TALLY_TCP_RTO_MIN_MS`, ms; 0: none).
    pub tally_rto_floor_ms: u32,
    /// The CPU model and its SIMD, from /proc/cpuinfo.
    pub cpu: CpuFacts,
    /// The base page size in bytes (0: unknown, taken as 4 KiB).
    pub base_page: usize,
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

pub(super) fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// CPU -> node from /sys/devices/system/node/nodeN/cpulist.
pub(super) fn cpu_nodes() -> BTreeMap<usize, u32> {
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

pub(super) fn rdma_nics() -> Vec<NicFact> {
    let Ok(entries) = fs::read_dir("/sys/class/infiniband") else {
        return Vec::new();
    };
    let mut out: Vec<NicFact> = entries
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let driver =
                fs::read_link(e.path().join("device/driver")).ok().and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()));
            NicFact { numa_node: crate::host::verbs::device_numa_node(&name), driver, name }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether CAP_IPC_LOCK (bit 14) is in this process's effective set.
pub(super) fn has_cap_ipc_lock() -> bool {
    let Some(status) = fs::read_to_string("/proc/self/status").ok() else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

pub(super) fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid out-parameter for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Some(0);
    }
    (r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

impl HostFacts {
    /// The page sizes a slab on this host would use: its base page, and the
    /// hugetlb sizes of its pools.
    pub fn geometry(&self) -> PageGeometry {
        PageGeometry::for_base(self.base_page.max(4096), self.pools.iter().map(|p| p.page_size).collect())
    }
}

/// Read everything [`evaluate`](super::checks::evaluate) needs; `lcores` picks which cores' governors
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
        tcp_autocorking: std::fs::read_to_string("/proc/sys/net/ipv4/tcp_autocorking").ok().map(|v| v.trim() != "0"),
        tcp_congestion_control: read_trim("/proc/sys/net/ipv4/tcp_congestion_control"),
        tcp_rto_floor_per_socket: tally_engine::host::tcp_rto_min::kernel_has_option(),
        tcp_rto_min_us: read_trim("/proc/sys/net/ipv4/tcp_rto_min_us").and_then(|v| v.parse().ok()),
        tally_rto_floor_ms: tally_engine::host::tcp_rto_min::env_floor_ms(),
        cpu: cpu::read(),
        base_page: PageGeometry::detect().base,
    }
}
