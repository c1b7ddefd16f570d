//! Page geometry: the base page and the huge page sizes a slab can be
//! backed with, which differ by architecture and by kernel build.
//!
//! x86-64 has 4 KiB base pages, 2 MiB pages at the page-middle-directory
//! (PMD) level, the size of hugetlb's default pool and of a transparent huge
//! page, and 1 GiB pages a level up. arm64 kernels are built with 4 KiB,
//! 16 KiB or 64 KiB base pages (Amazon Linux and Ubuntu ship 4 KiB; 64 KiB
//! kernels exist for RHEL and HPC distributions). A page-table page holds
//! base / 8 entries, so the PMD page is base² / 8: 2 MiB, 32 MiB or 512 MiB,
//! and with it the THP size and the default hugetlb size. arm64 also offers
//! contiguous-bit sizes (64 KiB and 32 MiB beside 4 KiB pages; 2 MiB and
//! 16 GiB beside 64 KiB pages). So the slab asks the kernel which hugetlb
//! sizes it offers instead of assuming x86's two.
//!
//! The rules are pure functions of a [`PageGeometry`], so a test injects a
//! 64 KiB kernel with 512 MiB huge pages on this 4 KiB host:
//! - slots, where page-aligned, start on base pages (at least 4 KiB);
//! - hugetlb: the offered sizes of 2 MiB and up, largest first, each only
//!   where the slab fills at least three quarters of the pages it would take
//!   (a smaller slab would waste most of a scarce page), then the smallest
//!   of them whatever the slab's size, as 2 MiB always was tried;
//! - transparent huge pages: PMD-sized and aligned, taken up to 2 MiB
//!   whatever the slab (as on x86), larger ones only under the same three
//!   quarters rule: on a 64 KiB kernel a 256 MiB slab would otherwise map
//!   512 MiB.
use crate::host::hugepages::{self, SIZE_2M};

/// The base page size and the huge page sizes of a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageGeometry {
    /// Base page bytes (`sysconf(_SC_PAGESIZE)`).
    pub base: usize,
    /// PMD page bytes: a transparent huge page (`hpage_pmd_size`).
    pub pmd: u64,
    /// The hugetlb sizes the kernel offers, ascending (/sys/kernel/mm/hugepages).
    pub hugetlb: Vec<u64>,
}

const THP_PMD_SIZE: &str = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size";

impl PageGeometry {
    /// This kernel's geometry.
    pub fn detect() -> PageGeometry {
        // SAFETY: sysconf reads a constant of the running system.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let base = usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096);
        let pmd = std::fs::read_to_string(THP_PMD_SIZE)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|p| p.is_power_of_two())
            .unwrap_or_else(|| pmd_for(base));
        PageGeometry { base, pmd, hugetlb: hugepages::page_sizes().unwrap_or_default() }
    }

    /// A kernel of `base` pages offering these hugetlb sizes, its PMD size
    /// derived from `base` (tests).
    pub fn for_base(base: usize, mut hugetlb: Vec<u64>) -> PageGeometry {
        hugetlb.sort_unstable();
        PageGeometry { base, pmd: pmd_for(base), hugetlb }
    }

    /// What page-aligned slots align to: the base page, at least 4 KiB.
    pub fn page_align(&self) -> usize {
        self.base.max(4096)
    }

    /// The hugetlb sizes to try for a slab of `len` bytes, in order (see the
    /// module documentation). Without any offered size of 2 MiB and up, the
    /// PMD size, whose mmap then says why not.
    pub fn hugetlb_candidates(&self, len: usize) -> Vec<u64> {
        let sizes: Vec<u64> = self.hugetlb.iter().copied().filter(|&s| s >= SIZE_2M).collect();
        let Some(&smallest) = sizes.first() else {
            return vec![self.pmd];
        };
        let mut out: Vec<u64> = sizes.iter().rev().copied().filter(|&s| s != smallest && fills_three_quarters(len as u64, s)).collect();
        out.push(smallest);
        out
    }

    /// Whether transparent huge pages are worth their rounding up for a
    /// slab of `len` bytes.
    pub fn thp_fits(&self, len: usize) -> bool {
        self.pmd <= SIZE_2M || fills_three_quarters(len as u64, self.pmd)
    }
}

/// The PMD page of a kernel with `base` pages: base / 8 entries of `base`.
pub fn pmd_for(base: usize) -> u64 {
    let base = base as u64;
    base * (base / 8)
}

/// Whether `len` bytes fill at least three quarters of the `page`-sized
/// pages they would take (never for an empty slab).
pub fn fills_three_quarters(len: u64, page: u64) -> bool {
    let pages = len.div_ceil(page);
    pages > 0 && len.saturating_mul(4) >= pages.saturating_mul(page).saturating_mul(3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::hugepages::SIZE_1G;

    const MIB: u64 = 1 << 20;

    #[test]
    fn pmd_pages_of_each_base() {
        assert_eq!(pmd_for(4096), SIZE_2M);
        assert_eq!(pmd_for(16 << 10), 32 * MIB);
        assert_eq!(pmd_for(64 << 10), 512 * MIB);
    }

    #[test]
    fn x86_keeps_its_two_sizes() {
        let g = PageGeometry::for_base(4096, vec![SIZE_1G, SIZE_2M]);
        assert_eq!(g.hugetlb_candidates(256 << 20), [SIZE_2M]);
        assert_eq!(g.hugetlb_candidates(768 << 20), [SIZE_1G, SIZE_2M]);
        assert_eq!(g.hugetlb_candidates(1 << 20), [SIZE_2M]);
        assert!(g.thp_fits(1 << 20) && g.thp_fits(256 << 20));
        assert_eq!(g.page_align(), 4096);
    }

    #[test]
    fn arm64_4k_skips_the_64k_contiguous_size() {
        let g = PageGeometry::for_base(4096, vec![64 << 10, SIZE_2M, 32 * MIB, SIZE_1G]);
        assert_eq!(g.hugetlb_candidates(256 << 20), [32 * MIB, SIZE_2M]);
        assert_eq!(g.hugetlb_candidates(1 << 30), [SIZE_1G, 32 * MIB, SIZE_2M]);
        assert_eq!(g.hugetlb_candidates(20 << 20), [SIZE_2M]);
    }

    #[test]
    fn arm64_64k_pages_and_512m_huge_pages() {
        let g = PageGeometry::for_base(64 << 10, vec![SIZE_2M, 512 * MIB, 16 << 30]);
        assert_eq!(g.pmd, 512 * MIB);
        assert_eq!(g.page_align(), 64 << 10);
        // The default 256 MiB slab would waste half a 512 MiB page: 2 MiB ones.
        assert_eq!(g.hugetlb_candidates(256 << 20), [SIZE_2M]);
        assert_eq!(g.hugetlb_candidates(384 << 20), [512 * MIB, SIZE_2M]);
        assert_eq!(g.hugetlb_candidates(1 << 30), [512 * MIB, SIZE_2M]);
        assert!(!g.thp_fits(256 << 20));
        assert!(g.thp_fits(512 << 20) && g.thp_fits(1536 << 20));
        // A kernel offering only its default 512 MiB pool: that one, always.
        let only = PageGeometry::for_base(64 << 10, vec![512 * MIB]);
        assert_eq!(only.hugetlb_candidates(64 << 20), [512 * MIB]);
    }

    #[test]
    fn no_hugetlb_pools_tries_the_pmd_size() {
        assert_eq!(PageGeometry::for_base(64 << 10, vec![]).hugetlb_candidates(1 << 20), [512 * MIB]);
        assert_eq!(PageGeometry::for_base(4096, vec![]).hugetlb_candidates(1 << 20), [SIZE_2M]);
    }

    #[test]
    fn three_quarters_rule() {
        assert!(!fills_three_quarters(0, SIZE_1G));
        assert!(!fills_three_quarters(767 << 20, SIZE_1G));
        assert!(fills_three_quarters(768 << 20, SIZE_1G));
        assert!(!fills_three_quarters((1 << 30) + 1, SIZE_1G));
        assert!(fills_three_quarters(3 << 29, SIZE_1G));
    }

    #[test]
    fn this_host_is_consistent() {
        let g = PageGeometry::detect();
        assert!(g.base.is_power_of_two() && g.pmd.is_power_of_two() && g.pmd > g.base as u64, "{g:?}");
    }
}
