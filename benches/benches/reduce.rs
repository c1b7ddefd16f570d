//! Reduction kernels through the engine's public dispatch ([`Kernels`]):
//! `sum` of n = 2 and n = 8 inputs of `f32` and `bf16`, B = 256 KiB per input
//! (in cache) and B = 16 MiB per input (out of cache), with the kernels
//! selected at start-up (`Kernels::detect`, which honours `TALLY_ISA`) and
//! with every instruction set this CPU has (`scalar`, `avx2`, `avx512`, ...).
//!
//! Unit: bytes moved per second (decimal, GB/s), a call moving (n+1) x B
//! bytes (n inputs read, one output written), the definition
//! `tally bench reduce` uses; divan also prints the time per call.
//! Buffers are page-aligned slots of one slab, as the server's are
//! (hugepages when the host has some, else whatever `Slab` falls back to).
use divan::counter::BytesCount;
use divan::{black_box, Bencher};
use std::fmt;
use tally_benches::{fill, size_name};
use tally_engine::dataplane::slab::{Slab, SlabConfig};
use tally_engine::reduce::{available_isas, DataType, Isa, Kernels, ReduceOp};

/// Bytes per input that stay in cache (3 x 256 KiB at n = 2, 2.25 MiB at n = 8: L2/L3).
const IN_CACHE: usize = 256 << 10;
/// Bytes per input that do not (3 x 16 MiB = 48 MiB at n = 2, 144 MiB at n = 8).
const OUT_OF_CACHE: usize = 16 << 20;

fn main() {
    divan::main();
}

/// One row: how many inputs, and which kernels (`None`: the ones selected
/// at start-up).
#[derive(Clone, Copy)]
struct Case {
    n: usize,
    isa: Option<Isa>,
}

impl Case {
    fn kernels(self) -> Kernels {
        match self.isa {
            None => Kernels::detect().unwrap_or_else(|e| panic!("TALLY_ISA: {e}")),
            Some(isa) => Kernels::for_isa(isa).unwrap_or_else(|e| panic!("{e}")),
        }
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.isa {
            None => write!(f, "n={} selected({})", self.n, self.kernels().isa()),
            Some(isa) => write!(f, "n={} {isa}", self.n),
        }
    }
}

/// For n = 2 and 8: the selected kernels, then each instruction set this CPU runs.
fn cases() -> Vec<Case> {
    let isas = available_isas();
    [2, 8]
        .into_iter()
        .flat_map(|n| std::iter::once(Case { n, isa: None }).chain(isas.iter().map(move |&isa| Case { n, isa: Some(isa) })))
        .collect()
}

/// Reduces `case.n` inputs of `bytes` bytes of `dtype` into an output, timed
/// per call, after checking the first and last elements against the scalar
/// kernels (so that a kernel that writes nothing cannot pass).
fn sum(bencher: Bencher, dtype: DataType, bytes: usize, case: Case) {
    let kernels = case.kernels();
    let n = case.n;
    // Slot 0 is the output, slots 1..=n the inputs.
    let mut cfg = SlabConfig::new(format!("bench reduce {dtype} {}", size_name(bytes)), bytes, n + 1);
    cfg.page_aligned_slots = true;
    let mut slab = Slab::new(&cfg).unwrap_or_else(|e| panic!("{e}"));
    for i in 1..=n {
        fill(dtype, i as u64, &mut slab.slot_mut(i)[..bytes]);
    }
    let slot = slab.slot_size();
    let (out, inputs) = slab.as_mut_slice().split_at_mut(slot);
    let out = &mut out[..bytes];
    let inputs: Vec<&[u8]> = inputs.chunks_exact(slot).map(|s| &s[..bytes]).collect();

    kernels.reduce(dtype, ReduceOp::Sum, out, &inputs).expect("reduce");
    let size = dtype.size();
    for at in [0, bytes - size] {
        let ends: Vec<&[u8]> = inputs.iter().map(|s| &s[at..at + size]).collect();
        let mut want = vec![0u8; size];
        Kernels::scalar().reduce(dtype, ReduceOp::Sum, &mut want, &ends).expect("scalar reduce");
        assert_eq!(&out[at..at + size], &want[..], "{} kernels: wrong sum at byte {at}", kernels.isa());
    }

    bencher.counter(BytesCount::new((n + 1) * bytes)).bench_local(|| {
        kernels.reduce(dtype, ReduceOp::Sum, black_box(&mut *out), black_box(&inputs)).expect("reduce");
    });
}

// In cache a call takes microseconds: divan picks the iterations per sample.
#[divan::bench(args = cases(), sample_count = 100)]
fn f32_sum_256kib(bencher: Bencher, case: Case) {
    sum(bencher, DataType::Float32, IN_CACHE, case);
}

#[divan::bench(args = cases(), sample_count = 100)]
fn bf16_sum_256kib(bencher: Bencher, case: Case) {
    sum(bencher, DataType::Bfloat16, IN_CACHE, case);
}

// Out of cache a call takes milliseconds: one call per sample, few samples.
#[divan::bench(args = cases(), sample_count = 30, sample_size = 1)]
fn f32_sum_16mib(bencher: Bencher, case: Case) {
    sum(bencher, DataType::Float32, OUT_OF_CACHE, case);
}

#[divan::bench(args = cases(), sample_count = 30, sample_size = 1)]
fn bf16_sum_16mib(bencher: Bencher, case: Case) {
    sum(bencher, DataType::Bfloat16, OUT_OF_CACHE, case);
}
