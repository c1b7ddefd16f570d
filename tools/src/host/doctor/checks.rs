//! The checks of `tally doctor`: pure functions from a [`Target`] (the
//! configuration checked against) and [`HostFacts`] to rows of
//! [`Check`], each with its one-line fix; [`evaluate`] runs them all,
//! [`start_blockers`] only those a server start would fail on.
use super::facts::{HostFacts, NicFact};
use serde::Serialize;
use std::collections::BTreeMap;
use tally_engine::host::config::ServerConfig;
use tally_engine::host::cpuset::CoreList;
use tally_engine::host::hugepages::{self};
use tally_engine::host::units::{format_size, format_size_arg};

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

pub(super) fn row(name: &str, status: Status, detail: impl Into<String>, fix: Option<String>) -> Check {
    Check { name: name.to_string(), status, detail: detail.into(), fix }
}

/// What the host is checked against: a configuration file's settings, or
/// the built-in defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub config: ServerConfig,
}

impl Target {
    pub(super) fn provider(&self) -> Option<String> {
        self.config.provider.as_deref().map(tally_engine::dataplane::fabric::canonical_provider)
    }

    pub(super) fn busy(&self) -> bool {
        self.config.poll == "busy"
    }
}

pub(super) fn list(cores: &[usize]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    CoreList::from_cores(sorted).map(|c| c.to_string()).unwrap_or_default()
}

pub(super) fn check_providers(t: &Target, h: &HostFacts) -> Vec<Check> {
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

pub(super) fn check_lcores(t: &Target, h: &HostFacts) -> Check {
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

pub(super) fn check_nic_numa(t: &Target, h: &HostFacts) -> Check {
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

pub(super) fn check_hugepages(t: &Target, h: &HostFacts) -> Check {
    let c = &t.config;
    // The pool a slab falls back to, whose shortfall the slab reports: 2 MiB
    // on x86-64 (and arm64 with 4 KiB pages), the smallest size of 2 MiB
    // and up on other kernels.
    // Only the pools of sizes the slab would take count (a 200 MiB slab
    // takes no 512 MiB page).
    let sizes = h.geometry().hugetlb_candidates(c.slab_size as usize);
    let page = sizes.last().copied().unwrap_or(hugepages::SIZE_2M);
    let slab = c.slab_size.div_ceil(page) * page;
    let need = slab * c.lcores.len() as u64;
    let pools = || h.pools.iter().filter(|p| sizes.contains(&p.page_size));
    let have: u64 = pools().map(|p| p.available() * p.page_size).sum();
    let total: u64 = pools().map(|p| p.total * p.page_size).sum();
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

pub(super) fn check_isolation(t: &Target, h: &HostFacts) -> Check {
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

pub(super) fn check_governor(h: &HostFacts) -> Check {
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

pub(super) fn check_thp(h: &HostFacts) -> Check {
    match h.thp.as_deref() {
        Some("madvise") => row("THP", Status::Pass, "madvise: slabs ask for transparent huge pages when hugetlb pools fall short", None),
        Some("always") => row("THP", Status::Pass, "always: slabs get transparent huge pages when hugetlb pools fall short", None),
        Some(m) => row(
            "THP",
            Status::Warn,
            format!("{m}: a slab without hugetlb pages falls back to {} pages", format_size(h.geometry().base as u64)),
            Some("echo madvise > /sys/kernel/mm/transparent_hugepage/enabled".into()),
        ),
        None => row("THP", Status::Info, "mode unreadable", None),
    }
}

/// TCP autocorking, where the job traffic may go over tcp (the provider set
/// to tcp, or chosen at start on a host without EFA). A note, not a
/// warning: its 200 ms tails were measured over veths (the emulated
/// cluster, docs/measurements.md "Tails of 200 ms"), not on a real NIC
/// (AWS's Graviton performance runbook recommends it off for servers whose
/// latency matters).
pub(super) fn check_autocork(t: &Target, h: &HostFacts) -> Option<Check> {
    if !jobs_may_use_tcp(t, h) {
        return None;
    }
    Some(match h.tcp_autocorking {
        Some(false) => row("TCP autocork", Status::Pass, "off: a message's last segment leaves with the rest", None),
        Some(true) => row(
            "TCP autocork",
            Status::Info,
            "on (the kernel's default): holds a message's last segment while earlier data waits to leave; over veths \
             that cost tcp jobs tails of about 200 ms. If a job's rounds (the server's job-end line) reach p99 near 200 ms, \
             try: sysctl -w net.ipv4.tcp_autocorking=0",
            None,
        ),
        None => row("TCP autocork", Status::Info, "net.ipv4.tcp_autocorking unreadable", None),
    })
}

/// The provider set to tcp, or chosen at start on a host without EFA.
fn jobs_may_use_tcp(t: &Target, h: &HostFacts) -> bool {
    let efa = h.providers.iter().any(|(p, ok)| p == "efa" && *ok);
    match t.provider() {
        Some(p) => p.starts_with("tcp"),
        None => !efa,
    }
}

/// The floor of TCP's timers, where the job traffic may go over tcp: a lost
/// last packet waits for it (200 ms by default; `host::tcp_rto_min` in the
/// engine says why that hit agg, measured with `bench cluster --loss`).
/// tally lowers it on its own connections (by default) where the kernel
/// lets it; else a note with the ways there are.
pub(super) fn check_rto_floor(t: &Target, h: &HostFacts) -> Option<Check> {
    const NAME: &str = "TCP timer floor";
    if !jobs_may_use_tcp(t, h) {
        return None;
    }
    let floor = h.tally_rto_floor_ms;
    Some(match (h.tcp_rto_floor_per_socket, h.tcp_rto_min_us) {
        (true, _) if floor > 0 => row(
            NAME,
            Status::Pass,
            format!("tally sets {floor} ms on its own connections (TCP_RTO_MIN_US; TALLY_TCP_RTO_MIN_MS): a lost last packet costs about that, not 200 ms"),
            None,
        ),
        (_, Some(us)) if us < 200_000 => row(NAME, Status::Pass, format!("net.ipv4.tcp_rto_min_us = {us}: every connection's floor"), None),
        (per_socket, _) => row(
            NAME,
            Status::Info,
            format!(
                "200 ms (the kernel's): where the fabric loses packets each lost last packet of a piece costs an all-reduce about \
                 that (agg at 0.1% loss kept 0.23 of its rate at 200 ms, 0.5-0.7 at 5 ms). Try: {}",
                if per_socket {
                    "TALLY_TCP_RTO_MIN_MS=5 on the servers and workers (tally's default, which TALLY_TCP_RTO_MIN_MS=0 turned off; tally's connections only), or"
                } else {
                    "(this kernel, before Linux 6.15, does not let tally set its own)"
                }
            ) + " ip route change <the fabric's route> rto_min 5ms, or sysctl -w net.ipv4.tcp_rto_min_us=5000 (Linux 6.11+)",
            None,
        ),
    })
}

/// TCP's congestion control, where the job traffic may go over tcp. BBR is
/// a note with what it was measured to cost, not a warning, for the reason
/// autocorking is: measured over veths (the emulated cluster,
/// docs/measurements.md "BBR's pacing"), not yet on a real NIC.
pub(super) fn check_congestion_control(t: &Target, h: &HostFacts) -> Option<Check> {
    const NAME: &str = "TCP congestion control";
    if !jobs_may_use_tcp(t, h) {
        return None;
    }
    Some(match h.tcp_congestion_control.as_deref() {
        Some("bbr") => row(
            NAME,
            Status::Info,
            "bbr: paces each socket itself; on emulated links carrying all-reduces its sockets were caught holding a \
             megabyte unsent for 100-240 ms with the window open and nothing in flight, and real NCCL's slowest \
             all-reduces took 2-4 times the median where cubic's took 1.1-1.2 (NCCL's ring was slower too). If a job's \
             rounds (the server's job-end line) have such tails, try: sysctl -w net.ipv4.tcp_congestion_control=cubic",
            None,
        ),
        Some(cc @ "cubic") => row(NAME, Status::Pass, format!("{cc}: what tally's emulated cluster runs"), None),
        Some(cc) => row(NAME, Status::Info, format!("{cc}: not measured with tally (its emulated cluster runs cubic)"), None),
        None => row(NAME, Status::Info, "net.ipv4.tcp_congestion_control unreadable", None),
    })
}

pub(super) fn check_memlock(t: &Target, h: &HostFacts) -> Check {
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

pub(super) fn check_irqs(t: &Target, h: &HostFacts) -> Check {
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

/// The instruction set the reduction kernels choose on this host, as a
/// server would (`TALLY_ISA` honoured). On Arm it is NEON: SVE, where the
/// core has it, is not used.
fn kernels_isa() -> String {
    match tally_engine::reduce::Kernels::detect() {
        Ok(k) => k.isa().name().to_string(),
        Err(e) => format!("none ({e})"),
    }
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
    out.push(row("CPU", Status::Info, format!("{}; the kernels use {}", h.cpu.describe(), kernels_isa()), None));
    out.extend(check_providers(t, h));
    out.push(check_nic_numa(t, h));
    out.push(check_lcores(t, h));
    out.push(check_hugepages(t, h));
    out.push(check_isolation(t, h));
    out.push(check_governor(h));
    out.push(check_thp(h));
    out.extend(check_autocork(t, h));
    out.extend(check_congestion_control(t, h));
    out.extend(check_rto_floor(t, h));
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
