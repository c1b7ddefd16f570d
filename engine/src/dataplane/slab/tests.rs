//! Tests of slabs: the hugepage policy's parsing, the shortfall message,
//! invalid configurations, slot addressing, and a slab built for a 64 KiB-page
//! kernel (the page-size rules themselves: geometry.rs).
use super::*;

#[test]
fn policy_parses() {
    assert_eq!("require".parse(), Ok(HugepagePolicy::Require));
    assert_eq!(" Prefer ".parse(), Ok(HugepagePolicy::Prefer));
    assert_eq!("OFF".parse(), Ok(HugepagePolicy::Off));
    let err = "sometimes".parse::<HugepagePolicy>().unwrap_err();
    assert!(err.to_string().contains("\"sometimes\""));
    for p in [HugepagePolicy::Require, HugepagePolicy::Prefer, HugepagePolicy::Off] {
        assert_eq!(p.to_string().parse(), Ok(p));
    }
    assert_eq!(HugepagePolicy::default(), HugepagePolicy::Prefer);
}

#[test]
fn shortfall_message() {
    let e = SlabError::HugepagesUnavailable {
        label: "lcore 3".into(),
        need_pages: 8,
        page_size: hugepages::SIZE_2M,
        available: 0,
        source: io::Error::from_raw_os_error(libc::ENOMEM),
    };
    let msg = e.to_string();
    assert!(msg.starts_with("slab lcore 3: hugepages required"), "{msg}");
    assert!(msg.contains("need 8 x 2 MiB pages, pool has 0 free"), "{msg}");
    assert!(msg.contains("`tally hugepages reserve 16M`"), "{msg}");
    assert!(msg.contains("--hugepages prefer"), "{msg}");
    assert!(msg.contains("Cannot allocate memory"), "{msg}");
}

#[test]
fn invalid_configs() {
    for (slot_size, slots) in [(0, 1), (64, 0), (usize::MAX, 1), (1 << 40, 1 << 40)] {
        let err = Slab::new(&SlabConfig::new("t", slot_size, slots)).unwrap_err();
        assert!(matches!(err, SlabError::InvalidConfig { .. }), "{err}");
        assert!(err.to_string().starts_with("slab t: invalid"), "{err}");
    }
}

#[test]
fn rounds_slots_and_finds_them() {
    let mut cfg = SlabConfig::new("rounding", 100, 3);
    cfg.policy = HugepagePolicy::Off;
    let slab = Slab::new(&cfg).unwrap();
    assert_eq!(slab.slot_size(), 128);
    assert_eq!(slab.len(), 384);
    assert_eq!(slab.mapped_len(), PageGeometry::detect().base);
    assert_eq!(slab.slot_of(slab.slot_ptr(2)), Some(2));
    assert_eq!(slab.slot_of(slab.slot_ptr(1).wrapping_add(127)), Some(1));
    assert_eq!(slab.slot_of(slab.as_ptr().wrapping_add(384)), None);
    assert_eq!(slab.slot_of(slab.as_ptr().wrapping_sub(1)), None);

    cfg.page_aligned_slots = true;
    let slab = Slab::new(&cfg).unwrap();
    assert_eq!(slab.slot_size(), PageGeometry::detect().base.max(4096));
    for i in 0..3 {
        assert_eq!(slab.slot_ptr(i) as usize % 4096, 0);
    }
}

#[test]
#[should_panic(expected = "slot 3 out of range")]
fn slot_out_of_range_panics() {
    let mut cfg = SlabConfig::new("range", 64, 3);
    cfg.policy = HugepagePolicy::Off;
    let slab = Slab::new(&cfg).unwrap();
    let _ = slab.slot(3);
}

/// A kernel of 64 KiB base pages and 512 MiB huge pages, injected: slots
/// and mappings round to 64 KiB, and a slab too small for a 512 MiB page
/// neither takes one from hugetlb nor maps one for THP.
#[test]
fn sixty_four_k_pages() {
    const MIB: u64 = 1 << 20;
    let geometry = PageGeometry::for_base(64 << 10, vec![512 * MIB]);
    let mut cfg = SlabConfig::new("64k", 100, 3);
    cfg.policy = HugepagePolicy::Off;
    cfg.page_aligned_slots = true;
    let slab = Slab::with_geometry(&cfg, &geometry).unwrap();
    assert_eq!(slab.slot_size(), 64 << 10);
    assert_eq!(slab.mapped_len(), 192 << 10);
    assert_eq!(slab.page_size(), 64 << 10);
    for i in 0..3 {
        assert_eq!(slab.slot_ptr(i) as usize % (64 << 10), 0);
    }
    // Prefer, 16 MiB: the only hugetlb size is 512 MiB (absent on this host,
    // so its mmap fails), and 512 MiB THP would be 32 times the slab: 64 KiB pages.
    cfg.policy = HugepagePolicy::Prefer;
    cfg.page_aligned_slots = false;
    cfg.slot_size = 1 << 20;
    cfg.slots = 16;
    let slab = Slab::with_geometry(&cfg, &geometry).unwrap();
    assert_eq!(slab.backing(), Backing::Normal);
    assert_eq!(slab.mapped_len(), 16 << 20);
    assert_eq!(slab.page_size(), 64 << 10);
    assert_eq!(slab.as_ptr() as usize % (64 << 10), 0);
}
