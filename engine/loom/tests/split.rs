//! The lcores of a split job meeting in a `SplitShared`, under loom: every
//! interleaving (up to a preemption bound) and every outcome of the memory
//! order the atomics allow, Arm's included.
//!
//! Each lcore thread publishes its area, then per round writes its group's
//! partial there and counts its group complete; the combiner reads every
//! area's partial through `area()`, writes the sum into its own result
//! buffer and publishes the round; the others wait for the round's `ready`
//! and read the combiner's result. The buffers are loom cells, so an access
//! the protocol's Release/Acquire pairs do not order is reported as a data
//! race, and a stale value fails the sums.
//!
//! One thing is outside `SplitShared`: the next round's pieces come only
//! after every rank had this round's result (each rank's window holds the
//! slot), an order the ranks make over the network. `acked` stands for it.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;
use tally_loom::split::SplitShared;

/// One position's area for one split slot: its group's partial and its result buffer.
struct Area {
    partial: UnsafeCell<u64>,
    result: UnsafeCell<u64>,
}

struct Job {
    shared: SplitShared,
    areas: Vec<Area>,
    /// Lcores done with a round (see the module doc).
    acked: AtomicU32,
}

/// Group `p`'s partial in `round`: distinct per group and round, so a
/// stale read changes the sum.
fn partial(round: u32, p: u32) -> u64 {
    1 << (8 * round + p)
}

fn sum(round: u32, groups: u32) -> u64 {
    (0..groups).map(|p| partial(round, p)).sum()
}

fn area_of(job: &Job, q: u32) -> &Area {
    let ptr = job.shared.area(q).expect("every lcore publishes its area before it counts a group");
    // SAFETY: the pointer was published from `job.areas[q]`, which lives as
    // long as `job`.
    unsafe { &*(ptr as *const Area) }
}

fn lcore(job: &Job, p: u32, rounds: u32) {
    let groups = job.shared.groups();
    job.shared.publish_area(p, &job.areas[p as usize] as *const Area as *mut u8);
    for round in 0..rounds {
        while job.acked.load(Ordering::Acquire) < round * groups {
            thread::yield_now();
        }
        let seq = round + 1;
        // SAFETY: loom cells: the closure's access is checked by loom.
        job.areas[p as usize].partial.with_mut(|x| unsafe { *x = partial(round, p) });
        if job.shared.group_complete(0) {
            // SAFETY: as above.
            let total: u64 = (0..groups).map(|q| area_of(job, q).partial.with(|x| unsafe { *x })).sum();
            assert_eq!(total, sum(round, groups), "combiner {p}, round {round}");
            // SAFETY: as above.
            job.areas[p as usize].result.with_mut(|x| unsafe { *x = total });
            job.shared.publish_result(0, seq, p);
        } else {
            let q = loop {
                if let Some(q) = job.shared.result_of(0, seq) {
                    break q;
                }
                thread::yield_now();
            };
            // SAFETY: as above.
            let got = area_of(job, q).result.with(|x| unsafe { *x });
            assert_eq!(got, sum(round, groups), "lcore {p} reading combiner {q}'s result, round {round}");
        }
        job.acked.fetch_add(1, Ordering::Release);
    }
}

fn model(groups: u32, rounds: u32, preemptions: usize) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    // The waits spin (as lcores poll): each turn of a spin is a branch.
    b.max_branches = 100_000;
    b.check(move || {
        let job = Arc::new(Job {
            shared: SplitShared::new(groups * 2, groups, 1),
            areas: (0..groups).map(|_| Area { partial: UnsafeCell::new(0), result: UnsafeCell::new(0) }).collect(),
            acked: AtomicU32::new(0),
        });
        let others: Vec<_> = (1..groups)
            .map(|p| {
                let job = job.clone();
                thread::spawn(move || lcore(&job, p, rounds))
            })
            .collect();
        lcore(&job, 0, rounds);
        for t in others {
            t.join().unwrap();
        }
    });
}

/// Two lcores, two rounds of the same slot: the count's reset and the
/// second round's reuse of the buffers.
#[test]
fn two_lcores_two_rounds() {
    model(2, 2, 3);
}

// Three lcores (a combiner reading two other partials) did not finish in
// minutes even at one preemption: every turn of the two waiters' spins
// branches. Two lcores cover each pairing the protocol has: one partial
// read by the combiner, one result read by a waiter, and the slot's reuse.
