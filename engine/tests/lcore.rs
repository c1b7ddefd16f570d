//! Lcores: pinned, counted, stopped cleanly; a failed set-up stops the rest.
//! Workers here own a real libfabric endpoint (shm) and poll its CQ, as the
//! server's shards do.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally_engine::dataplane::fabric::{Completion, Endpoint, EndpointConfig, Hints};
use tally_engine::dataplane::lcore::{launch, Counters, PollMode, Worker};
use tally_engine::host::cpuset::{self, CoreList};

struct Poller {
    ep: Endpoint,
    dropped: Arc<AtomicUsize>,
    shut: Arc<AtomicUsize>,
}

impl Worker for Poller {
    fn poll_once(&mut self, _stats: &Counters) -> usize {
        let mut c = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 8];
        self.ep.poll(&mut c).unwrap()
    }
    fn wait(&mut self, ms: i32) {
        self.ep.wait(ms).unwrap();
    }
    fn shutdown(&mut self) {
        self.shut.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

fn all_cores() -> CoreList {
    cpuset::allowed().unwrap()
}

#[test]
fn lcores_pin_count_sleep_and_stop() {
    let cores = all_cores();
    let (dropped, shut) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (d2, s2) = (dropped.clone(), shut.clone());
    let (set, pinned) = launch(&cores, PollMode::ADAPTIVE, move |info| {
        let ep = Endpoint::open(&EndpointConfig::new("shm")).map_err(|e| e.to_string())?;
        let on = cpuset::current_core().map_err(|e| e.to_string())?;
        Ok::<_, String>((Poller { ep, dropped: d2.clone(), shut: s2.clone() }, (info.core, on)))
    })
    .expect("launch");
    for (want, on) in &pinned {
        assert_eq!(want, on, "set-up ran on the lcore's own core");
    }
    std::thread::sleep(Duration::from_millis(300));
    let a = set.snapshot();
    std::thread::sleep(Duration::from_millis(200));
    let b = set.snapshot();
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(y.polls > x.polls, "lcore {i} keeps polling: {x:?} -> {y:?}");
        assert!(y.empty_polls >= x.empty_polls && y.sleeps > 0, "an idle adaptive lcore sleeps: {y:?}");
        assert_eq!(y.completions, 0);
    }
    let t = Instant::now();
    set.stop();
    assert!(t.elapsed() < Duration::from_secs(2), "stop took {:?}", t.elapsed());
    assert_eq!(shut.load(Ordering::SeqCst), cores.len(), "every lcore ran shutdown");
    assert_eq!(dropped.load(Ordering::SeqCst), cores.len(), "every worker (and its endpoint) was dropped on its thread");
}

#[test]
fn a_failed_setup_is_reported_and_stops_the_others() {
    let cores = all_cores();
    let dropped = Arc::new(AtomicUsize::new(0));
    let d2 = dropped.clone();
    let r = launch(&cores, PollMode::ADAPTIVE, move |info| {
        if info.id == cores_len_minus_one() {
            return Err("no such NIC".to_string());
        }
        let ep = Endpoint::open(&EndpointConfig { hints: Hints::new("shm"), cq_size: 0, contexts: 4, wait_object: false })
            .map_err(|e| e.to_string())?;
        Ok((Poller { ep, dropped: d2.clone(), shut: Arc::new(AtomicUsize::new(0)) }, ()))
    });
    let e = match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("launch succeeded with a failing lcore"),
    };
    assert!(e.contains("failed to start: no such NIC"), "{e}");
    assert_eq!(dropped.load(Ordering::SeqCst), cores.len() - 1, "the lcores that started were stopped");
}

fn cores_len_minus_one() -> usize {
    all_cores().len() - 1
}

#[test]
fn cores_outside_the_affinity_mask_are_refused() {
    let r =
        launch(&CoreList::parse("4095").unwrap(), PollMode::Busy, |_| -> Result<(Poller, ()), String> { unreachable!("no lcore starts") });
    let e = match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("pinned to a core this process may not use"),
    };
    assert!(e.contains("4095"), "{e}");
}
