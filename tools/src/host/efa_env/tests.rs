//! `tally efa-env` decisions and output, table-driven over made-up hosts.
use super::check::*;
use super::decision::*;
use super::render::*;
use crate::host::verbs::ForkStatus;

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
