//! Slab slot arithmetic and job-region allocation, on a slab of normal
//! (4 KiB) pages so that it runs on any host: `Slab::slot_ptr` (slot index
//! to address, what the data path posts receives at), `Slab::slot_of` (a
//! completion's buffer address back to its slot), and the control plane's
//! first-fit `RangeAlloc` taking and returning job regions of
//! `window x nranks x piece` bytes, `REGION_ALIGN`-aligned, as `control.rs`
//! sizes them. Also what mapping and touching a 4 MiB slab costs.
//!
//! Units: time per slot for `slot_ptr` and `slot_of` (256 slots per
//! iteration), time per region (taken and returned) for `region_alloc_release`,
//! time per slab for `slab_map_4k_pages`.
use divan::counter::ItemsCount;
use divan::{black_box, Bencher};
use tally_engine::control::alloc::RangeAlloc;
use tally_engine::control::alloc::REGION_ALIGN;
use tally_engine::dataplane::slab::{HugepagePolicy, Slab, SlabConfig};

fn main() {
    divan::main();
}

const SLOT_BYTES: usize = 64 << 10;
const SLOTS: usize = 256;

/// 256 slots of 64 KiB (16 MiB) in normal pages: no hugepages needed.
fn slab() -> Slab {
    let mut cfg = SlabConfig::new("bench slab", SLOT_BYTES, SLOTS);
    cfg.policy = HugepagePolicy::Off;
    Slab::new(&cfg).unwrap_or_else(|e| panic!("{e}"))
}

/// Slot index to address, for every slot.
#[divan::bench]
fn slot_ptr(bencher: Bencher) {
    let slab = slab();
    bencher.counter(ItemsCount::new(SLOTS)).bench_local(|| {
        let mut acc = 0usize;
        for i in 0..SLOTS {
            acc ^= slab.slot_ptr(black_box(i)) as usize;
        }
        acc
    });
}

/// Address (somewhere inside a slot, as a completion reports it) to slot
/// index, for every slot.
#[divan::bench]
fn slot_of(bencher: Bencher) {
    let slab = slab();
    let addrs: Vec<*const u8> = (0..SLOTS).map(|i| slab.slot_ptr(i).wrapping_add(i * 61 % SLOT_BYTES).cast_const()).collect();
    for (i, &p) in addrs.iter().enumerate() {
        assert_eq!(slab.slot_of(p), Some(i));
    }
    assert_eq!(slab.slot_of(slab.as_ptr().wrapping_add(slab.len())), None);
    bencher.counter(ItemsCount::new(SLOTS)).bench_local(|| {
        let mut acc = 0usize;
        for &p in black_box(&addrs) {
            acc += slab.slot_of(p).unwrap_or(usize::MAX);
        }
        acc
    });
}

/// A job's region as the control plane sizes it: pieces rounded up to a
/// cache line, `window x nranks` of them.
fn region_bytes(window: usize, nranks: usize, piece: usize) -> usize {
    window * nranks * piece.div_ceil(64) * 64
}

/// Eight jobs of mixed shapes take regions from a 256 MiB slab (the default
/// `slab_size`) in which two regions are already held, then return them in
/// an interleaved order, so that releases merge with both neighbours.
#[divan::bench]
fn region_alloc_release(bencher: Bencher) {
    const JOBS: usize = 8;
    let lens: [usize; JOBS] = [
        region_bytes(4, 8, 512 << 10),
        region_bytes(4, 2, 1 << 20),
        region_bytes(16, 4, 64 << 10),
        region_bytes(2, 16, 100_000),
        region_bytes(4, 8, 256 << 10),
        region_bytes(8, 1, 4 << 10),
        region_bytes(1, 64, 128 << 10),
        region_bytes(4, 4, 1 << 20),
    ];
    let mut alloc = RangeAlloc::new(256 << 20, REGION_ALIGN);
    let held = [alloc.alloc(8 << 20).expect("fits"), alloc.alloc(3 << 20).expect("fits")];
    alloc.release(held[0], 8 << 20);
    let free_before = alloc.free_bytes();
    const ORDER: [usize; JOBS] = [1, 3, 5, 7, 0, 2, 4, 6];
    let mut offs = [0usize; JOBS];
    bencher.counter(ItemsCount::new(JOBS)).bench_local(|| {
        for (off, &len) in offs.iter_mut().zip(black_box(&lens)) {
            *off = alloc.alloc(len).expect("the regions fit");
        }
        for &j in &ORDER {
            alloc.release(offs[j], lens[j]);
        }
        assert_eq!(alloc.free_bytes(), free_before);
    });
}

/// Maps, touches and locks a 4 MiB slab of normal pages: what an lcore pays
/// once at start-up (hugepages make it cheaper). The unmapping, when divan
/// drops the returned slab after the sample, is not timed.
#[divan::bench(sample_count = 20, sample_size = 1)]
fn slab_map_4k_pages() -> Slab {
    let mut cfg = SlabConfig::new("bench slab map", 64 << 10, 64);
    cfg.policy = HugepagePolicy::Off;
    Slab::new(black_box(&cfg)).unwrap_or_else(|e| panic!("{e}"))
}
