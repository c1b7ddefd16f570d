//! Core lists: parsing, printing, checking against the affinity mask, and
//! pinning real threads.

use tally_engine::host::cpuset::{self, CoreList, CpusetError, MAX_CORES};

#[test]
fn parses_the_table() {
    let table: &[(&str, &[usize])] = &[
        ("0", &[0]),
        ("2-9,12", &[2, 3, 4, 5, 6, 7, 8, 9, 12]),
        ("12,2-4", &[12, 2, 3, 4]),
        (" 1 , 3 - 5 ,7 ", &[1, 3, 4, 5, 7]),
        ("4,2", &[4, 2]),
        ("5-5", &[5]),
        ("0-1", &[0, 1]),
        ("8191", &[8191]),
    ];
    for &(input, want) in table {
        let list = CoreList::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(list.as_slice(), want, "input {input:?}");
        assert_eq!(input.parse::<CoreList>().unwrap(), list);
        // lcore k is the k-th core as written.
        for (k, &core) in want.iter().enumerate() {
            assert_eq!(list.get(k), Some(core));
        }
        assert_eq!(list.get(want.len()), None);
    }
}

#[test]
fn refuses_bad_lists() {
    assert_eq!(CoreList::parse(""), Err(CpusetError::Empty));
    assert_eq!(CoreList::parse("  \t"), Err(CpusetError::Empty));

    let err = CoreList::parse("9-2").unwrap_err();
    assert!(matches!(err, CpusetError::Reversed { lo: 9, hi: 2, .. }));
    assert!(err.to_string().contains("9-2"), "{err}");

    for bad in ["a", "1,a", "1,,2", "1,", ",1", "1-", "-1", "1-2-3", "+1", "1 2", "0x3"] {
        let err = CoreList::parse(bad).unwrap_err();
        assert!(matches!(err, CpusetError::Invalid { .. }), "{bad:?} gave {err:?}");
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
    }

    for dup in ["1,1", "0-3,2", "2-4,1-2"] {
        let err = CoreList::parse(dup).unwrap_err();
        assert!(matches!(err, CpusetError::Duplicate { .. }), "{dup:?} gave {err:?}");
        assert!(err.to_string().contains("more than once"), "{err}");
    }

    for huge in ["8192", "0-8192", "99999999999999999999999", "18446744073709551615"] {
        let err = CoreList::parse(huge).unwrap_err();
        assert!(matches!(err, CpusetError::TooLarge { .. }), "{huge:?} gave {err:?}");
        assert!(err.to_string().contains("out of range"), "{err}");
    }

    assert!(matches!(CoreList::from_cores(vec![1, 2, 1]), Err(CpusetError::Duplicate { core: 1, .. })));
    assert!(matches!(CoreList::from_cores(vec![MAX_CORES]), Err(CpusetError::TooLarge { .. })));
}

#[test]
fn prints_back_compactly() {
    for (input, want) in
        [("2-9,12", "2-9,12"), ("2,3,4,5,6,7,8,9,12", "2-9,12"), ("4,2", "4,2"), (" 0 - 3 , 8 ", "0-3,8"), ("7,0-3,4", "7,0-4")]
    {
        let list = CoreList::parse(input).unwrap();
        assert_eq!(list.to_string(), want);
        // What is printed parses back to the same list, order included.
        assert_eq!(CoreList::parse(&list.to_string()).unwrap(), list);
    }
}

#[test]
fn checks_against_the_affinity_mask() {
    let allowed = cpuset::allowed().expect("sched_getaffinity");
    assert!(!allowed.is_empty());
    assert!(allowed.as_slice().windows(2).all(|w| w[0] < w[1]));
    allowed.validate_against_allowed().expect("allowed cores are allowed");

    let outside = CoreList::from_cores(vec![allowed.get(0).unwrap(), MAX_CORES - 1]).unwrap();
    let err = outside.validate_against(&allowed).unwrap_err();
    match &err {
        CpusetError::NotAllowed { missing, .. } => {
            assert_eq!(missing.as_slice(), &[MAX_CORES - 1])
        }
        other => panic!("wrong error {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("8191") && msg.contains("affinity"), "{msg}");
    assert!(outside.validate_against_allowed().is_err());
}

#[test]
fn pins_a_thread_to_every_allowed_core() {
    let allowed = cpuset::allowed().expect("sched_getaffinity");
    for core in &allowed {
        let (pinned_mask, ran_on) = std::thread::spawn(move || {
            cpuset::pin_current_thread(core).expect("pin");
            // Spin a little: a pinned thread must stay on its core however
            // often the scheduler looks at it.
            let mut seen = Vec::new();
            for _ in 0..1000 {
                seen.push(cpuset::current_core().expect("sched_getcpu"));
                std::hint::spin_loop();
            }
            (cpuset::allowed().unwrap(), seen)
        })
        .join()
        .unwrap();
        assert_eq!(pinned_mask.as_slice(), &[core]);
        assert!(ran_on.iter().all(|&c| c == core), "pinned to {core}, ran on {ran_on:?}");
    }
    // Pinning a spawned thread leaves the test thread's mask alone.
    assert_eq!(cpuset::allowed().unwrap(), allowed);
}

#[test]
fn refuses_to_pin_outside_the_mask() {
    let err = std::thread::spawn(|| cpuset::pin_current_thread(MAX_CORES - 1)).join().unwrap().unwrap_err();
    assert!(err.to_string().contains("8191"), "{err}");
    let err = std::thread::spawn(|| cpuset::pin_current_thread(MAX_CORES)).join().unwrap().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}
