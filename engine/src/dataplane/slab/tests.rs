//! Tests of slabs: the hugepage policy's parsing, the 1 GiB page rule,
//! the shortfall message, invalid configurations and slot addressing.
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
fn one_gig_rule() {
    assert!(!wants_1g(0));
    assert!(!wants_1g(64 << 20));
    assert!(!wants_1g(767 << 20));
    assert!(wants_1g(768 << 20));
    assert!(wants_1g(1 << 30));
    assert!(!wants_1g((1 << 30) + 1));
    assert!(wants_1g(3 << 29)); // 1.5 GiB in 2 pages: 75 %
    assert!(wants_1g(8 << 30));
}

#[test]
fn shortfall_message() {
    let e = SlabError::HugepagesUnavailable {
        label: "lcore 3".into(),
        need_pages: 8,
        page_size: SIZE_2M,
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
    assert_eq!(slab.mapped_len(), base_page_size());
    assert_eq!(slab.slot_of(slab.slot_ptr(2)), Some(2));
    assert_eq!(slab.slot_of(slab.slot_ptr(1).wrapping_add(127)), Some(1));
    assert_eq!(slab.slot_of(slab.as_ptr().wrapping_add(384)), None);
    assert_eq!(slab.slot_of(slab.as_ptr().wrapping_sub(1)), None);

    cfg.page_aligned_slots = true;
    let slab = Slab::new(&cfg).unwrap();
    assert_eq!(slab.slot_size(), base_page_size().max(4096));
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
