//! `tally hugepages`: the kernel's hugepage pools and hugetlbfs mounts.
//!
//! A reduction server's slabs want hugetlb pages (one TLB entry per 2 MiB or
//! 1 GiB of buffer, never swapped, physically contiguous for the NIC). Those
//! come from per-size pools that the kernel fills only when told to, and
//! filling them late can fall short when physical memory is fragmented. This
//! command does what `dpdk-hugepages.py` does for DPDK, plus the two things
//! operators keep getting wrong: it says when the kernel gave fewer pages than
//! asked, and it prints the sysctl or kernel command-line line that makes a
//! reservation survive a reboot.
//!
//! `reserve SIZE` *adds* SIZE worth of pages to a pool (`--total` sets the
//! pool to SIZE instead, like `dpdk-hugepages.py --reserve`). Adding is the
//! default because that is what every hint in tally asks for: a slab that
//! cannot get its pages says "run `tally hugepages reserve <shortfall>`", and
//! doctor does the same, and neither may shrink a pool that another process
//! is using. `setup SIZE` clears the pool first, so there the two meanings
//! agree. Every change prints the pool's total before and after.
//!
//! Reading needs nothing; changing pools and mounts needs root, and a
//! non-root change fails up front with a message saying so.
use super::cpu::{self, CpuFacts};
use super::table::{Align, Table};
use clap::{Args, Subcommand};
use serde::Serialize;
use std::io;
use std::path::{Path, PathBuf};
use tally_engine::dataplane::slab::PageGeometry;
use tally_engine::host::hugepages::{self, HugetlbfsMount, PoolState, ThpMode};
use tally_engine::host::units::{format_size, format_size_arg, parse_size};

/// Where `mount` and `setup` mount hugetlbfs unless told otherwise (DPDK's
/// default too, and where systemd's dev-hugepages.mount puts it).
pub const DEFAULT_MOUNT_DIR: &str = "/dev/hugepages";

#[derive(Args, Debug)]
pub struct HugepagesArgs {
    #[command(subcommand)]
    pub cmd: HugepagesCmd,
}

#[derive(Subcommand, Debug)]
pub enum HugepagesCmd {
    /// Pools per page size and NUMA node (total, free, reserved, surplus),
    /// hugetlbfs mounts and the transparent huge page mode.
    Show {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Add SIZE worth of hugepages to a pool (rounded up to whole pages).
    ///
    /// SIZE takes K/M/G suffixes (binary). By default the pool GROWS by SIZE,
    /// so the hint a slab or `tally doctor` prints (`reserve <shortfall>`) is
    /// right whatever the pool holds already; --total sets the pool to exactly
    /// SIZE instead (what dpdk-hugepages.py --reserve does). Prints the pool's
    /// total before and after, warns when the kernel gave fewer pages than
    /// asked (fragmented memory), and prints the line that keeps the
    /// reservation across reboots. Needs root.
    Reserve(ReserveArgs),
    /// Empty the hugepage pools (all page sizes, or --pagesize). Pages still
    /// mapped or held by files in a hugetlbfs mount stay until freed. Needs root.
    Clear {
        /// Only this page size (2M or 1G).
        #[arg(long, value_parser = parse_page_size)]
        pagesize: Option<u64>,
    },
    /// Mount hugetlbfs (creating the directory if missing). Needs root.
    Mount(MountArgs),
    /// Unmount hugetlbfs: every hugetlbfs mount, or only --directory. Needs root.
    Unmount {
        /// Only this mount point.
        #[arg(long)]
        directory: Option<PathBuf>,
    },
    /// Clear the pool of one page size, unmount DIR, reserve SIZE, mount DIR:
    /// afterwards the pool holds exactly SIZE worth of pages. Needs root.
    Setup(SetupArgs),
}

#[derive(Args, Debug)]
pub struct ReserveArgs {
    /// How much memory: K/M/G suffixes, e.g. 512M, 16G.
    #[arg(value_parser = parse_size_arg)]
    pub size: u64,
    /// Page size: 2M or 1G (512M on arm64 kernels of 64 KiB pages). Default: the kernel's default hugepage size.
    #[arg(long, value_parser = parse_page_size)]
    pub pagesize: Option<u64>,
    /// Change only this NUMA node's pool (default: the system-wide pool,
    /// which the kernel spreads over the nodes).
    #[arg(long)]
    pub node: Option<u32>,
    /// Set the pool to SIZE instead of adding SIZE to it.
    #[arg(long)]
    pub total: bool,
}

#[derive(Args, Debug)]
pub struct MountArgs {
    /// Mount point.
    #[arg(long, default_value = DEFAULT_MOUNT_DIR)]
    pub directory: PathBuf,
    /// Page size of the mount: 2M or 1G (512M on arm64 kernels of 64 KiB pages). Default: the kernel's default.
    #[arg(long, value_parser = parse_page_size)]
    pub pagesize: Option<u64>,
}

#[derive(Args, Debug)]
pub struct SetupArgs {
    /// How much memory the pool should hold: K/M/G suffixes.
    #[arg(value_parser = parse_size_arg)]
    pub size: u64,
    /// Page size: 2M or 1G (512M on arm64 kernels of 64 KiB pages). Default: the kernel's default hugepage size.
    #[arg(long, value_parser = parse_page_size)]
    pub pagesize: Option<u64>,
    /// Use only this NUMA node's pool.
    #[arg(long)]
    pub node: Option<u32>,
    /// Mount point.
    #[arg(long, default_value = DEFAULT_MOUNT_DIR)]
    pub directory: PathBuf,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// A page size argument: any size the units module takes, checked later
/// against what this kernel offers.
fn parse_page_size(s: &str) -> Result<u64, String> {
    let size = parse_size(s).map_err(|e| e.to_string())?;
    if !size.is_power_of_two() || size < 4096 {
        return Err(format!("{s:?} is not a page size (expected 2M or 1G)"));
    }
    Ok(size)
}

pub fn run(args: &HugepagesArgs) -> Result<(), String> {
    match &args.cmd {
        HugepagesCmd::Show { json } => show(*json),
        HugepagesCmd::Reserve(a) => {
            need_root("reserve")?;
            let page_size = checked_page_size(a.pagesize)?;
            reserve(page_size, a.node, a.size, a.total)
        }
        HugepagesCmd::Clear { pagesize } => {
            need_root("clear")?;
            let sizes = match pagesize {
                Some(p) => vec![checked_page_size(Some(*p))?],
                None => hugepages::page_sizes().map_err(|e| e.to_string())?,
            };
            clear(&sizes, None)
        }
        HugepagesCmd::Mount(a) => {
            need_root("mount")?;
            let page_size = checked_page_size(a.pagesize)?;
            mount(&a.directory, page_size)
        }
        HugepagesCmd::Unmount { directory } => {
            need_root("unmount")?;
            unmount(directory.as_deref())
        }
        HugepagesCmd::Setup(a) => {
            need_root("setup")?;
            let page_size = checked_page_size(a.pagesize)?;
            clear(&[page_size], a.node)?;
            if find_mount(&a.directory)?.is_some() {
                unmount(Some(&a.directory))?;
            }
            reserve(page_size, a.node, a.size, false)?;
            mount(&a.directory, page_size)
        }
    }
}

/// Changing pools or mounts needs root; say so before touching anything,
/// rather than with a bare "Permission denied" from sysfs.
fn need_root(what: &str) -> Result<(), String> {
    if super::is_root() {
        return Ok(());
    }
    Err(format!(
        "`tally hugepages {what}` changes the kernel's hugepage pools or mounts and needs root: \
         run it with sudo (`tally hugepages show` works without)"
    ))
}

/// The page size to use: the one asked for if this kernel has it, else the
/// kernel's default.
fn checked_page_size(requested: Option<u64>) -> Result<u64, String> {
    let sizes = hugepages::page_sizes().map_err(|e| e.to_string())?;
    if sizes.is_empty() {
        return Err("this kernel has no hugetlb support (no /sys/kernel/mm/hugepages)".into());
    }
    let size = match requested {
        Some(s) => s,
        None => hugepages::default_page_size().map_err(|e| e.to_string())?,
    };
    if !sizes.contains(&size) {
        let offered: Vec<String> = sizes.iter().map(|&s| format_size_arg(s)).collect();
        return Err(format!("this kernel has no {} hugepages (it offers {})", format_size(size), offered.join(", ")));
    }
    Ok(size)
}

fn pool_name(node: Option<u32>) -> String {
    match node {
        None => "system".to_string(),
        Some(n) => format!("node {n}"),
    }
}

/// What `show --json` prints.
#[derive(Serialize, Debug)]
pub struct ShowReport {
    pub default_page_size: Option<u64>,
    pub pools: Vec<PoolJson>,
    pub mounts: Vec<MountJson>,
    pub thp: String,
    /// The base page and the transparent huge page, in bytes.
    pub base_page: usize,
    pub thp_page: u64,
}

#[derive(Serialize, Debug)]
pub struct PoolJson {
    /// `node` is `null` for the system-wide pool, `reserved` for per-node
    /// pools (the kernel keeps reservations system-wide only).
    #[serde(flatten)]
    pub pool: PoolState,
    pub total_bytes: u64,
}

#[derive(Serialize, Debug)]
pub struct MountJson {
    pub path: String,
    pub page_size: u64,
}

fn show(json: bool) -> Result<(), String> {
    let pools = hugepages::pools().map_err(|e| format!("cannot read hugepage pools: {e}"))?;
    let mounts = hugepages::mounts().map_err(|e| format!("cannot read /proc/mounts: {e}"))?;
    let thp = hugepages::thp_mode().map_err(|e| e.to_string())?;
    let default = hugepages::default_page_size().ok();
    let geometry = PageGeometry::detect();
    if json {
        let report = ShowReport {
            default_page_size: default,
            pools: pools.iter().map(|p| PoolJson { pool: *p, total_bytes: p.total * p.page_size }).collect(),
            mounts: mounts.iter().map(|m| MountJson { path: m.mount_point.display().to_string(), page_size: m.page_size }).collect(),
            thp: thp.to_string(),
            base_page: geometry.base,
            thp_page: geometry.pmd,
        };
        super::out(&(serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n"))?;
        return Ok(());
    }
    super::out(&(render_show(&pools, &mounts, thp, default) + &render_pages(&geometry, &cpu::read())))?;
    Ok(())
}

/// The human-readable `show` output.
pub fn render_show(pools: &[PoolState], mounts: &[HugetlbfsMount], thp: ThpMode, default_page_size: Option<u64>) -> String {
    let mut out = String::new();
    if pools.is_empty() {
        out.push_str("No hugepage pools: this kernel has no hugetlb support.\n");
    } else {
        let mut t = Table::new(&[
            ("Pool", Align::Left),
            ("Page size", Align::Right),
            ("Total", Align::Right),
            ("Free", Align::Right),
            ("Reserved", Align::Right),
            ("Surplus", Align::Right),
            ("Memory", Align::Right),
        ]);
        for p in pools {
            t.row([
                pool_name(p.node),
                format_size(p.page_size),
                p.total.to_string(),
                p.free.to_string(),
                p.reserved.map_or("-".to_string(), |r| r.to_string()),
                p.surplus.to_string(),
                format_size(p.total * p.page_size),
            ]);
        }
        out.push_str(&t.render());
        if let Some(d) = default_page_size {
            out.push_str(&format!("Default hugepage size: {}\n", format_size(d)));
        }
    }
    out.push('\n');
    if mounts.is_empty() {
        out.push_str("Hugetlbfs: not mounted (tally hugepages mount)\n");
    } else {
        let mut t = Table::new(&[("Hugetlbfs mount", Align::Left), ("Page size", Align::Right)]);
        for m in mounts {
            t.row([m.mount_point.display().to_string(), format_size(m.page_size)]);
        }
        out.push_str(&t.render());
    }
    out.push('\n');
    let meaning = match thp {
        ThpMode::Always => "every anonymous mapping may get huge pages",
        ThpMode::Madvise => "regions that ask with madvise get huge pages; tally's slabs ask",
        ThpMode::Never => "off; slabs without hugetlb pages get normal pages",
    };
    out.push_str(&format!("Transparent huge pages: {thp} ({meaning})\n"));
    out
}

/// The lines under `show`'s tables: the page sizes slabs work with (an
/// arm64 kernel may have 64 KiB base pages and 512 MiB huge ones) and the CPU.
pub fn render_pages(geometry: &PageGeometry, cpu: &CpuFacts) -> String {
    format!(
        "Base pages: {}; a transparent huge page: {}\nCPU: {}\n",
        format_size(geometry.base as u64),
        format_size(geometry.pmd),
        cpu.describe()
    )
}

/// What a reservation did, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveOutcome {
    pub page_size: u64,
    pub node: Option<u32>,
    /// Pages in the pool before.
    pub before: u64,
    /// Pages asked for in the pool after.
    pub target: u64,
    /// Pages the kernel reports after.
    pub got: u64,
    /// The kernel's default hugepage size (what `vm.nr_hugepages` counts).
    pub default_page_size: Option<u64>,
}

impl ReserveOutcome {
    /// The kernel gave fewer pages than asked.
    pub fn short(&self) -> bool {
        self.got < self.target
    }
}

/// `1 page`, `8 pages`.
fn count(pages: u64) -> String {
    if pages == 1 {
        "1 page".to_string()
    } else {
        format!("{pages} pages")
    }
}

/// Pages needed to hold `bytes`, rounded up.
pub fn pages_for(bytes: u64, page_size: u64) -> u64 {
    bytes.div_ceil(page_size)
}

/// The report of a reservation: before and after, a warning if the kernel
/// gave fewer pages than asked, and how to keep the pool after a reboot.
pub fn render_reserve(o: &ReserveOutcome) -> String {
    let ps = format_size(o.page_size);
    let mut out = format!(
        "{} pool of {ps} pages: {} -> {} ({} -> {})\n",
        pool_name(o.node),
        o.before,
        count(o.got),
        format_size(o.before * o.page_size),
        format_size(o.got * o.page_size),
    );
    if o.short() {
        out.push_str(&format!(
            "warning: asked for {} pages, the kernel gave {} ({} short): physical memory is too \
             fragmented for contiguous {ps} runs, or too little is free. Try again after \
             `echo 3 > /proc/sys/vm/drop_caches; echo 1 > /proc/sys/vm/compact_memory`, or \
             reserve at boot (below), where memory is not fragmented yet.\n",
            o.target,
            o.got,
            o.target - o.got
        ));
    } else if o.got < o.before {
        out.push_str(&format!("note: the pool shrank by {} pages\n", o.before - o.got));
    }
    let wanted = o.target.max(o.got);
    out.push_str(&format!("To keep {} after a reboot:\n", count(wanted)));
    for line in persistence_lines(o.page_size, o.node, wanted, o.default_page_size) {
        out.push_str("  ");
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The configuration lines that recreate a pool of `pages` at boot.
///
/// `vm.nr_hugepages` counts pages of the default size only and is applied
/// late in boot (fine for 2 MiB pages); 1 GiB pages should come from the
/// kernel command line, before memory fragments. A per-node pool has no
/// sysctl, only the command line's node form.
pub fn persistence_lines(page_size: u64, node: Option<u32>, pages: u64, default_page_size: Option<u64>) -> Vec<String> {
    let size_arg = format_size_arg(page_size);
    let mut lines = Vec::new();
    match node {
        None => {
            if Some(page_size) == default_page_size && page_size < hugepages::SIZE_1G {
                lines.push(format!(
                    "sysctl: vm.nr_hugepages = {pages}   (in /etc/sysctl.d/80-tally-hugepages.conf; see config/hugepages.conf)"
                ));
            }
            lines.push(format!("kernel command line: hugepagesz={size_arg} hugepages={pages}"));
        }
        Some(n) => {
            lines.push(format!("kernel command line: hugepagesz={size_arg} hugepages={n}:{pages}   (per-node form)"));
            lines.push(format!(
                "or at boot: echo {pages} > /sys/devices/system/node/node{n}/hugepages/hugepages-{}kB/nr_hugepages",
                page_size / 1024
            ));
        }
    }
    lines
}

/// Make `e` from a sysfs write readable, and name root where it matters.
fn change_error(e: io::Error) -> String {
    match e.kind() {
        io::ErrorKind::PermissionDenied => format!("{e} (needs root, and a writable /sys)"),
        _ => e.to_string(),
    }
}

fn reserve(page_size: u64, node: Option<u32>, size: u64, set_total: bool) -> Result<(), String> {
    let before = hugepages::pool(page_size, node).map_err(|e| e.to_string())?.total;
    let pages = pages_for(size, page_size);
    let target = if set_total { pages } else { before.saturating_add(pages) };
    let got = hugepages::set_pages(page_size, node, target).map_err(change_error)?;
    let outcome = ReserveOutcome { page_size, node, before, target, got, default_page_size: hugepages::default_page_size().ok() };
    super::out(&render_reserve(&outcome))?;
    if outcome.short() {
        return Err(format!("the kernel gave {} of the {} {} pages asked for", got, target, format_size(page_size)));
    }
    Ok(())
}

fn clear(sizes: &[u64], node: Option<u32>) -> Result<(), String> {
    for &page_size in sizes {
        let before = hugepages::pool(page_size, node).map_err(|e| e.to_string())?;
        let got = hugepages::set_pages(page_size, node, 0).map_err(change_error)?;
        let now = hugepages::pool(page_size, node).map_err(|e| e.to_string())?;
        super::out(&format!("{} pool of {} pages: {} -> {}\n", pool_name(node), format_size(page_size), before.total, count(got)))?;
        if now.surplus > 0 || got > 0 {
            super::out(&format!(
                "  {} pages are still in use (mapped by a process, or files in a hugetlbfs mount): \
                 they leave the pool when freed; `tally hugepages unmount` releases hugetlbfs files\n",
                now.surplus.max(got)
            ))?;
        }
    }
    Ok(())
}

fn find_mount(dir: &Path) -> Result<Option<HugetlbfsMount>, String> {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mounts = hugepages::mounts().map_err(|e| e.to_string())?;
    Ok(mounts.into_iter().find(|m| m.mount_point == canonical || m.mount_point == dir))
}

fn mount(dir: &Path, page_size: u64) -> Result<(), String> {
    if let Some(m) = find_mount(dir)? {
        if m.page_size == page_size {
            super::out(&format!("hugetlbfs ({} pages) is already mounted on {}\n", format_size(page_size), dir.display()))?;
            return Ok(());
        }
        return Err(format!(
            "{} already has a hugetlbfs of {} pages mounted; `tally hugepages unmount --directory {}` first",
            dir.display(),
            format_size(m.page_size),
            dir.display()
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    hugepages::mount(dir, page_size).map_err(change_error)?;
    super::out(&format!("mounted hugetlbfs ({} pages) on {}\n", format_size(page_size), dir.display()))?;
    Ok(())
}

fn unmount(dir: Option<&Path>) -> Result<(), String> {
    let targets: Vec<PathBuf> = match dir {
        Some(d) => match find_mount(d)? {
            Some(m) => vec![m.mount_point],
            None => return Err(format!("{} is not a hugetlbfs mount", d.display())),
        },
        None => hugepages::mounts().map_err(|e| e.to_string())?.into_iter().map(|m| m.mount_point).collect(),
    };
    if targets.is_empty() {
        super::out("no hugetlbfs mounts\n")?;
        return Ok(());
    }
    for t in targets {
        hugepages::unmount(&t).map_err(change_error)?;
        super::out(&format!("unmounted {}\n", t.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_engine::host::hugepages::{SIZE_1G, SIZE_2M};

    #[test]
    fn page_size_arguments() {
        assert_eq!(parse_page_size("2M"), Ok(SIZE_2M));
        assert_eq!(parse_page_size("1G"), Ok(SIZE_1G));
        assert!(parse_page_size("3M").is_err());
        assert!(parse_page_size("lots").is_err());
    }

    #[test]
    fn rounds_up_to_whole_pages() {
        assert_eq!(pages_for(16 << 20, SIZE_2M), 8);
        assert_eq!(pages_for((16 << 20) + 1, SIZE_2M), 9);
        assert_eq!(pages_for(1, SIZE_1G), 1);
        assert_eq!(pages_for(0, SIZE_2M), 0);
    }

    #[test]
    fn reports_a_full_reservation() {
        let o = ReserveOutcome { page_size: SIZE_2M, node: None, before: 4, target: 12, got: 12, default_page_size: Some(SIZE_2M) };
        let text = render_reserve(&o);
        assert!(text.starts_with("system pool of 2 MiB pages: 4 -> 12 pages (8 MiB -> 24 MiB)\n"), "{text}");
        assert!(!text.contains("warning"), "{text}");
        assert!(text.contains("vm.nr_hugepages = 12"), "{text}");
        assert!(text.contains("hugepagesz=2M hugepages=12"), "{text}");
    }

    #[test]
    fn reports_a_short_reservation() {
        let o = ReserveOutcome { page_size: SIZE_1G, node: None, before: 0, target: 8, got: 3, default_page_size: Some(SIZE_2M) };
        let text = render_reserve(&o);
        assert!(o.short());
        assert!(text.contains("asked for 8 pages, the kernel gave 3 (5 short)"), "{text}");
        assert!(text.contains("fragmented"), "{text}");
        // 1 GiB pages are not the default size: no sysctl, the command line.
        assert!(!text.contains("vm.nr_hugepages"), "{text}");
        assert!(text.contains("hugepagesz=1G hugepages=8"), "{text}");
    }

    #[test]
    fn per_node_persistence() {
        let lines = persistence_lines(SIZE_2M, Some(1), 64, Some(SIZE_2M));
        assert!(lines[0].contains("hugepagesz=2M hugepages=1:64"), "{lines:?}");
        assert!(lines[1].contains("node1/hugepages/hugepages-2048kB/nr_hugepages"), "{lines:?}");
    }

    #[test]
    fn show_table_is_aligned() {
        let pools = [
            PoolState { page_size: SIZE_2M, node: None, total: 512, free: 500, reserved: Some(2), surplus: 0 },
            PoolState { page_size: SIZE_1G, node: Some(0), total: 0, free: 0, reserved: None, surplus: 0 },
        ];
        let mounts = [HugetlbfsMount { mount_point: "/dev/hugepages".into(), page_size: SIZE_2M }];
        let text = render_show(&pools, &mounts, ThpMode::Madvise, Some(SIZE_2M));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Pool    Page size  Total  Free  Reserved  Surplus  Memory");
        assert_eq!(lines[1], "system      2 MiB    512   500         2        0   1 GiB");
        assert_eq!(lines[2], "node 0      1 GiB      0     0         -        0     0 B");
        assert!(lines.iter().any(|l| l.starts_with("/dev/hugepages ") && l.ends_with(" 2 MiB")), "{text}");
        assert!(text.contains("Transparent huge pages: madvise"), "{text}");
    }

    #[test]
    fn pages_line_of_a_64k_graviton() {
        let g = PageGeometry::for_base(64 << 10, vec![512 << 20]);
        let cpu = crate::host::cpu::parse("processor\t: 0\nFeatures\t: fp asimd sve2 sve\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n");
        assert_eq!(
            render_pages(&g, &cpu),
            "Base pages: 64 KiB; a transparent huge page: 512 MiB\nCPU: Neoverse V2 (Graviton4: c8g, c8gn), 1 CPUs; SIMD: NEON, SVE, SVE2\n"
        );
    }
}
