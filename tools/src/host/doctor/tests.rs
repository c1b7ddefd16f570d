//! `tally doctor` against made-up hosts (a dev box, an EFA host, misplaced lcores and IRQs).
use super::checks::*;
use super::facts::*;
use super::*;
use tally_engine::host::hugepages::{PoolState, SIZE_2M};

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

#[test]
fn autocorking_is_a_note_where_jobs_go_over_tcp() {
    // Chosen at start on a host without EFA: tcp, so the row shows.
    let on = HostFacts { tcp_autocorking: Some(true), ..dev_host() };
    let c = evaluate(&target(""), &on);
    assert_eq!(status(&c, "TCP autocork"), Status::Info);
    assert!(detail(&c, "TCP autocork").contains("sysctl -w net.ipv4.tcp_autocorking=0"), "{c:#?}");
    let off = HostFacts { tcp_autocorking: Some(false), ..dev_host() };
    assert_eq!(status(&evaluate(&target("provider = \"tcp\"\n"), &off), "TCP autocork"), Status::Pass);
    // Over EFA or shm it says nothing.
    let efa = HostFacts { tcp_autocorking: Some(true), ..efa_host() };
    assert!(evaluate(&target(C7GN), &efa).iter().all(|c| c.name != "TCP autocork"));
    assert!(evaluate(&target(""), &efa).iter().all(|c| c.name != "TCP autocork"));
    assert!(evaluate(&target("provider = \"shm\"\n"), &on).iter().all(|c| c.name != "TCP autocork"));
}

#[test]
fn bbr_is_a_note_where_jobs_go_over_tcp() {
    const ROW: &str = "TCP congestion control";
    let bbr = HostFacts { tcp_congestion_control: Some("bbr".into()), ..dev_host() };
    let c = evaluate(&target(""), &bbr);
    assert_eq!(status(&c, ROW), Status::Info);
    assert!(detail(&c, ROW).contains("sysctl -w net.ipv4.tcp_congestion_control=cubic"), "{c:#?}");
    let cubic = HostFacts { tcp_congestion_control: Some("cubic".into()), ..dev_host() };
    assert_eq!(status(&evaluate(&target("provider = \"tcp\"\n"), &cubic), ROW), Status::Pass);
    let other = HostFacts { tcp_congestion_control: Some("dctcp".into()), ..dev_host() };
    assert!(detail(&evaluate(&target(""), &other), ROW).starts_with("dctcp: not measured"));
    // Over EFA it says nothing: no job byte goes through TCP.
    let efa = HostFacts { tcp_congestion_control: Some("bbr".into()), ..efa_host() };
    assert!(evaluate(&target(C7GN), &efa).iter().all(|c| c.name != ROW));
}

#[test]
fn the_tcp_timer_floor_is_set_by_tally_where_the_kernel_lets_it_else_a_note_with_the_hosts_ways() {
    const ROW: &str = "TCP timer floor";
    let new = HostFacts { tcp_rto_floor_per_socket: true, tcp_rto_min_us: Some(200_000), tally_rto_floor_ms: 5, ..dev_host() };
    let c = evaluate(&target(""), &new);
    assert_eq!(status(&c, ROW), Status::Pass);
    assert!(detail(&c, ROW).contains("TCP_RTO_MIN_US"), "{c:#?}");
    // Not asked for (the default): a note that says how.
    let unasked = HostFacts { tally_rto_floor_ms: 0, ..new.clone() };
    let c = evaluate(&target(""), &unasked);
    assert_eq!(status(&c, ROW), Status::Info);
    assert!(detail(&c, ROW).contains("TALLY_TCP_RTO_MIN_MS=5"), "{c:#?}");
    let old = HostFacts { tcp_rto_floor_per_socket: false, tcp_rto_min_us: None, ..dev_host() };
    let c = evaluate(&target("provider = \"tcp\"\n"), &old);
    assert_eq!(status(&c, ROW), Status::Info);
    assert!(detail(&c, ROW).contains("rto_min 5ms") && detail(&c, ROW).contains("before Linux 6.15"), "{c:#?}");
    let host_set = HostFacts { tcp_rto_floor_per_socket: false, tcp_rto_min_us: Some(5000), ..dev_host() };
    assert_eq!(status(&evaluate(&target(""), &host_set), ROW), Status::Pass);
    // Over EFA it says nothing.
    assert!(evaluate(&target(C7GN), &HostFacts { ..efa_host() }).iter().all(|c| c.name != ROW));
}

/// A Graviton host on a kernel of 64 KiB pages: its CPU row names the core,
/// the instances and the SIMD; a 512 MiB slab per lcore is counted in the
/// kernel's 512 MiB huge pages (2 MiB contiguous ones offered too), and THP
/// falls back to 64 KiB pages.
#[test]
fn graviton_with_64k_pages() {
    const MIB: u64 = 1 << 20;
    let mut h = efa_host();
    h.cpu = crate::host::cpu::parse("processor\t: 0\nFeatures\t: fp asimd asimdhp sve bf16\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n");
    h.base_page = 64 << 10;
    h.thp = Some("never".into());
    h.pools = vec![
        PoolState { page_size: SIZE_2M, node: None, total: 0, free: 0, reserved: Some(0), surplus: 0 },
        PoolState { page_size: 512 * MIB, node: None, total: 62, free: 62, reserved: Some(0), surplus: 0 },
    ];
    let c = evaluate(&target(C7GN), &h);
    let cpu = detail(&c, "CPU");
    assert!(cpu.starts_with("Neoverse V1 (Graviton3/3E: c7g, c7gn), 1 CPUs; SIMD: NEON, FP16, BF16, SVE; the kernels use "), "{cpu}");
    assert_eq!(status(&c, "hugepages"), Status::Pass, "{c:#?}");
    assert_eq!(detail(&c, "hugepages"), "need 31 GiB (62 lcores x 512 MiB slab), pools have 31 GiB free of 31 GiB");
    assert!(detail(&c, "THP").ends_with("falls back to 64 KiB pages"), "{c:#?}");
    // 200 MiB slabs would waste most of a 512 MiB page: they take 2 MiB pages, which are empty.
    let c = evaluate(&target(&C7GN.replace("512M", "200M")), &h);
    assert_eq!(status(&c, "hugepages"), Status::Fail);
    assert!(detail(&c, "hugepages").contains("(62 lcores x 200 MiB slab), pools have 0 B free of 0 B"), "{c:#?}");
}
