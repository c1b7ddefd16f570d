//! The reduction kernels of every instruction set this CPU has, the scalar
//! one included, against an independent reference: plain per-element loops
//! that combine floats in `f64` and round to the combining precision after
//! every step (exact for +, x and / of two f32 values, since f64 has more
//! than twice f32's precision), integers in `i128`, and 16-bit floats
//! converted by the `half` crate.
//!
//! Results are compared byte for byte; the kernels promise one canonical
//! NaN per type, so there is nothing to excuse. Inputs are random, with a
//! fresh seed every run (printed; `TALLY_TEST_SEED=n` repeats one), and
//! include NaNs with payloads, infinities, signed zeros and subnormals.

use std::io::Write;
use std::sync::OnceLock;

mod reduce_model;

use reduce_model::inputs::fill;
use reduce_model::{decode, divide, encode, reference};
use tally_engine::reduce::{
    available_isas, canonical_nan, DataType, Isa, IsaError, Kernels, ReduceError, ReduceOp, MAX_INPUTS, STREAM_MIN_BYTES,
};

// ---------------------------------------------------------------------------
// Randomness

/// splitmix64: small, fast, and good enough to spread test inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let r = self.next().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
}

/// The run's seed, printed once (past the test harness's capture, so the
/// line shows even when every test passes).
fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let seed = match std::env::var("TALLY_TEST_SEED") {
            Ok(s) => s.trim().parse().expect("TALLY_TEST_SEED must be an unsigned integer"),
            Err(_) => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
                now.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
            }
        };
        let _ = writeln!(std::io::stderr(), "reduce tests: seed {seed} (TALLY_TEST_SEED={seed} repeats this run)");
        seed
    })
}

/// A generator for one test, so that tests do not depend on their order.
fn rng(test: &str) -> Rng {
    let salt = test.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    Rng(seed() ^ salt)
}

// ---------------------------------------------------------------------------
// Instruction sets

/// Every instruction set this CPU has, printed once.
fn kernel_sets() -> Vec<Kernels> {
    static PRINTED: OnceLock<()> = OnceLock::new();
    let isas = available_isas();
    PRINTED.get_or_init(|| {
        let names: Vec<&str> = isas.iter().map(|isa| isa.name()).collect();
        // One write: the harness prints the other tests' results meanwhile,
        // and a line cut in two left scripts/build/test-aarch64.sh reading
        // "isas under test: ok" (a CI run).
        let line = format!("isas under test: {} (cpu: {})\n", names.join(", "), cpu_features());
        let _ = std::io::stderr().write_all(line.as_bytes());
    });
    isas.into_iter().map(|isa| Kernels::for_isa(isa).expect("listed as available")).collect()
}

fn cpu_features() -> String {
    #[allow(unused_mut)]
    let mut found: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$( if std::is_x86_feature_detected!($f) { found.push($f); } )*};
        }
        probe!("avx2", "f16c", "fma", "avx512f", "avx512bw", "avx512vl", "avx512bf16", "avx512fp16");
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$( if std::arch::is_aarch64_feature_detected!($f) { found.push($f); } )*};
        }
        probe!("neon", "fp16", "bf16", "sve");
    }
    found.join(" ")
}

#[test]
fn every_available_isa_is_tested() {
    let isas: Vec<Isa> = kernel_sets().iter().map(|k| k.isa()).collect();
    assert_eq!(isas[0], Isa::Scalar);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
        assert!(isas.contains(&Isa::Avx2));
    }
    #[cfg(target_arch = "aarch64")]
    assert!(isas.contains(&Isa::Neon));
    assert_eq!(Kernels::best().isa(), *isas.last().unwrap());
}

// ---------------------------------------------------------------------------
// Running a case

/// A buffer placed at a chosen byte offset from a 64-byte boundary, with
/// guard bytes around it that must survive.
struct Placed {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

const GUARD: u8 = 0xa5;

impl Placed {
    fn new(len: usize, offset: usize) -> Placed {
        let storage = vec![GUARD; len + offset + 192];
        let start = storage.as_ptr().align_offset(64) + 64 + offset;
        Placed { storage, start, len }
    }
    fn get(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
    fn guards_intact(&self) -> bool {
        let (before, rest) = self.storage.split_at(self.start);
        before.iter().chain(&rest[self.len..]).all(|&b| b == GUARD)
    }
}

struct Case<'a> {
    dtype: DataType,
    op: ReduceOp,
    inputs: &'a [Placed],
    test: &'a str,
}

impl Case<'_> {
    /// Runs every kernel set on this case and compares with `expected`.
    fn check(&self, kernels: &[Kernels], expected: &[u8], rng: &mut Rng) {
        let inputs: Vec<&[u8]> = self.inputs.iter().map(Placed::get).collect();
        for k in kernels {
            let offset = rng.below(8);
            let mut out = Placed::new(expected.len(), offset);
            rng.bytes(out.get_mut());
            k.reduce(self.dtype, self.op, out.get_mut(), &inputs).unwrap();
            self.compare(k.isa(), &format!("out offset {offset}"), out.get(), expected, &inputs);
            assert!(out.guards_intact(), "{}: {} wrote outside its output ({})", self.test, k.isa(), self.describe());
        }
    }

    fn describe(&self) -> String {
        let offsets: Vec<usize> = self.inputs.iter().map(|p| p.start % 64).collect();
        format!(
            "{} {} n={} bytes={} input offsets {:?}, seed {}",
            self.dtype,
            self.op,
            self.inputs.len(),
            self.inputs[0].len,
            &offsets[..offsets.len().min(8)],
            seed()
        )
    }

    fn compare(&self, isa: Isa, what: &str, got: &[u8], expected: &[u8], inputs: &[&[u8]]) {
        if got == expected {
            return;
        }
        let size = self.dtype.size();
        let i = (0..expected.len() / size).find(|&i| got[i * size..][..size] != expected[i * size..][..size]).unwrap();
        let hex = |b: &[u8]| -> String { b[i * size..][..size].iter().rev().map(|x| format!("{x:02x}")).collect() };
        let shown: Vec<String> = inputs.iter().take(8).map(|b| hex(b)).collect();
        panic!(
            "{}: {isa} differs from the reference at element {i} of {} ({}; {what}):\n  \
             inputs {shown:?}{}\n  got      {}\n  expected {}",
            self.test,
            expected.len() / size,
            self.describe(),
            if inputs.len() > 8 { " ..." } else { "" },
            hex(got),
            hex(expected),
        );
    }
}

fn random_inputs(rng: &mut Rng, dtype: DataType, op: ReduceOp, n: usize, bytes: usize) -> Vec<Placed> {
    let special = (1.0 / n as f64).min(0.25);
    (0..n)
        .map(|_| {
            let mut p = Placed::new(bytes, rng.below(8));
            fill(rng, dtype, op, special, p.get_mut());
            p
        })
        .collect()
}

/// Lengths (in elements) that cover empty, short, every tail of the widest
/// registers and blocks (up to 4 registers of 32 elements), and longer runs.
fn lengths() -> Vec<usize> {
    let mut lengths: Vec<usize> = (0..=140).collect();
    lengths.extend([191, 255, 256, 257, 300, 383, 384, 385, 511, 513, 1000, 1025, 2049, 4099]);
    lengths
}

const INPUT_COUNTS: [usize; 6] = [1, 2, 3, 4, 8, 64];

fn matrix(dtype: DataType) {
    let test = format!("matrix_{dtype}");
    let mut rng = rng(&test);
    let kernels = kernel_sets();
    for op in ReduceOp::ALL {
        for n in INPUT_COUNTS {
            for len in lengths() {
                // The long ones with many inputs add time, not coverage.
                if n == 64 && len > 513 {
                    continue;
                }
                let (inputs, expected) = random_case(&mut rng, dtype, op, n, len);
                Case { dtype, op, inputs: &inputs, test: &test }.check(&kernels, &expected, &mut rng);
            }
        }
    }
}

#[test]
fn matrix_f32() {
    matrix(DataType::Float32);
}
#[test]
fn matrix_bf16() {
    matrix(DataType::Bfloat16);
}
#[test]
fn matrix_f16() {
    matrix(DataType::Float16);
}
#[test]
fn matrix_f64() {
    matrix(DataType::Float64);
}
#[test]
fn matrix_i8() {
    matrix(DataType::Int8);
}
#[test]
fn matrix_u8() {
    matrix(DataType::Uint8);
}
#[test]
fn matrix_i32() {
    matrix(DataType::Int32);
}
#[test]
fn matrix_u32() {
    matrix(DataType::Uint32);
}
#[test]
fn matrix_i64() {
    matrix(DataType::Int64);
}
#[test]
fn matrix_u64() {
    matrix(DataType::Uint64);
}

/// Outputs large enough for streaming stores, with the output 64-byte
/// aligned, element-aligned only (the kernel first writes a partial
/// register), and not even element-aligned (no streaming).
#[test]
fn large_outputs_stream_and_stay_exact() {
    let test = "large_outputs";
    let mut rng = rng(test);
    let kernels = kernel_sets();
    for dtype in [DataType::Float32, DataType::Bfloat16, DataType::Float16, DataType::Float64] {
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let len = STREAM_MIN_BYTES / dtype.size() + 2 * 64 + 13;
            let (inputs, expected) = random_case(&mut rng, dtype, op, 3, len);
            let views = views_of(&inputs);
            let case = Case { dtype, op, inputs: &inputs, test };
            for k in &kernels {
                for offset in [0, dtype.size(), 1] {
                    check_out_of_place(k, &case, &views, &expected, offset, &format!("out offset {offset}"));
                }
            }
        }
    }
}

/// `n` random inputs of `len` elements for (dtype, op), and what the
/// reference makes of them.
fn random_case(rng: &mut Rng, dtype: DataType, op: ReduceOp, n: usize, len: usize) -> (Vec<Placed>, Vec<u8>) {
    let bytes = len * dtype.size();
    let inputs = random_inputs(rng, dtype, op, n, bytes);
    let mut expected = vec![0u8; bytes];
    reference(dtype, op, &views_of(&inputs), &mut expected);
    (inputs, expected)
}

fn views_of(inputs: &[Placed]) -> Vec<&[u8]> {
    inputs.iter().map(Placed::get).collect()
}

/// `reduce` of `views` into an output `offset` bytes past an alignment,
/// compared with `expected`, its guard bytes untouched.
fn check_out_of_place(k: &Kernels, case: &Case, views: &[&[u8]], expected: &[u8], offset: usize, what: &str) {
    let mut out = Placed::new(expected.len(), offset);
    k.reduce(case.dtype, case.op, out.get_mut(), views).unwrap();
    case.compare(k.isa(), what, out.get(), expected, views);
    assert!(out.guards_intact(), "{}: {} wrote outside its output", case.test, k.isa());
}

/// `reduce_raw` of `views` into a copy of the first input (the server
/// reduces into the first rank's own piece), compared with `expected`.
fn check_in_place(k: &Kernels, case: &Case, views: &[&[u8]], len: usize, expected: &[u8], what: &str) {
    let mut first = Placed::new(views[0].len(), case.inputs[0].start % 64);
    first.get_mut().copy_from_slice(views[0]);
    let out = first.get_mut().as_mut_ptr();
    let mut addrs: Vec<*const u8> = views.iter().map(|v| v.as_ptr()).collect();
    addrs[0] = out;
    // SAFETY: every address is valid for `len` elements for the call, and
    // `out` is exactly `addrs[0]`, which `reduce_raw` allows.
    unsafe { k.reduce_raw(case.dtype, case.op, out, &addrs, len) }.unwrap();
    case.compare(k.isa(), what, first.get(), expected, views);
}

/// `reduce_raw` into the first input's own buffer gives what `reduce` gives.
#[test]
fn reduce_raw_in_place_matches() {
    let test = "in_place";
    let mut rng = rng(test);
    let kernels = kernel_sets();
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            for n in [1, 2, 5] {
                for len in [0, 1, 33, 200, 1029, STREAM_MIN_BYTES / dtype.size() + 7] {
                    // One streaming-size case per type is plenty.
                    if len > 1029 && (op != ReduceOp::Sum || n != 2) {
                        continue;
                    }
                    let (inputs, expected) = random_case(&mut rng, dtype, op, n, len);
                    let views = views_of(&inputs);
                    let case = Case { dtype, op, inputs: &inputs, test };
                    for k in &kernels {
                        check_in_place(k, &case, &views, len, &expected, "in place");
                    }
                }
            }
        }
    }
}

/// Many inputs over several output tiles (`Kernels::run` takes the inputs
/// a group at a time per tile past a few): still the rank-order result of
/// the reference, byte for byte, out of place and in place, for every type
/// and op, including input counts that leave a short last group and
/// lengths that leave a short last tile (the tile is 16 KiB of output).
#[test]
fn many_inputs_over_several_tiles_match_the_reference() {
    let test = "many_inputs";
    let mut rng = rng(test);
    let kernels = kernel_sets();
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            let tile = (16 << 10) / dtype.size();
            for (n, len) in [(9, 2 * tile + 3), (17, tile), (100, tile + 1), (MAX_INPUTS, tile + 77)] {
                // The widest count for a float and an integer sum (it is the
                // slow one to check, and runs under qemu too).
                if n == MAX_INPUTS && (op != ReduceOp::Sum || !matches!(dtype, DataType::Float32 | DataType::Int8)) {
                    continue;
                }
                let (inputs, expected) = random_case(&mut rng, dtype, op, n, len);
                let views = views_of(&inputs);
                let case = Case { dtype, op, inputs: &inputs, test };
                for k in &kernels {
                    check_out_of_place(k, &case, &views, &expected, rng.below(8), &format!("{n} inputs"));
                    check_in_place(k, &case, &views, len, &expected, &format!("{n} inputs in place"));
                }
            }
        }
    }
}

/// The accumulate form: the same as a two-input reduction, and for `avg`,
/// accumulated sums finished by `finish_avg`.
#[test]
fn accumulate_matches_reduce_and_finish_avg_divides() {
    let test = "accumulate";
    let mut rng = rng(test);
    let kernels = kernel_sets();
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            for len in [0, 1, 7, 64, 100, 513] {
                let n = 5;
                let bytes = len * dtype.size();
                let inputs = random_inputs(&mut rng, dtype, op, n, bytes);
                let views: Vec<&[u8]> = inputs.iter().map(Placed::get).collect();
                let case = Case { dtype, op, inputs: &inputs, test };
                // What accumulating step by step must give: each step is a
                // two-input reduction (`avg` adds), rounded to the type.
                let step_op = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
                let mut expected = views[0].to_vec();
                for input in &views[1..] {
                    let acc = expected.clone();
                    reference(dtype, step_op, &[&acc, input], &mut expected);
                }
                if op == ReduceOp::Avg {
                    let size = dtype.size();
                    for chunk in expected.chunks_exact_mut(size) {
                        let v = divide(dtype, decode(dtype, chunk), n);
                        encode(dtype, v, chunk);
                    }
                }
                for k in &kernels {
                    let mut acc = Placed::new(bytes, rng.below(8));
                    acc.get_mut().copy_from_slice(views[0]);
                    for input in &views[1..] {
                        k.accumulate(dtype, op, acc.get_mut(), input).unwrap();
                    }
                    if op == ReduceOp::Avg {
                        k.finish_avg(dtype, acc.get_mut(), n).unwrap();
                    }
                    case.compare(k.isa(), "accumulate", acc.get(), &expected, &views);
                    // Wider types lose nothing by accumulating: the one-pass
                    // form gives the same bytes.
                    if dtype.size() >= 4 {
                        let mut out = vec![0u8; bytes];
                        k.reduce(dtype, op, &mut out, &views).unwrap();
                        case.compare(k.isa(), "reduce vs accumulate", &out, acc.get(), &views);
                    }
                }
            }
        }
    }
}

/// The staged form (`fold` a few inputs at a time, then `finish_fold`)
/// gives the one pass's bytes for every type, op and instruction set,
/// whatever the grouping: 16-bit floats keep `f32` partials and round once,
/// so this holds for them too, where `accumulate` rounds at every step.
#[test]
fn staged_folds_match_the_one_pass_whatever_the_grouping() {
    let test = "staged_fold";
    let mut rng = rng(test);
    let kernels = kernel_sets();
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            for (n, len) in [(1, 33), (2, 1), (3, 130), (9, 1029), (20, 257), (70, 64)] {
                let (inputs, expected) = random_case(&mut rng, dtype, op, n, len);
                let views = views_of(&inputs);
                let case = Case { dtype, op, inputs: &inputs, test };
                for k in &kernels {
                    // The accumulator starts at an odd offset: no kernel may
                    // need alignment.
                    let mut acc = Placed::new(len * dtype.accumulator_size(), rng.below(8));
                    let out = acc.get_mut().as_mut_ptr();
                    let mut folded = 0;
                    while folded < n {
                        // Groups of 1 to 12 ranks, as they happen to arrive.
                        let take = (1 + rng.below(12)).min(n - folded);
                        let addrs: Vec<*const u8> = views[folded..folded + take].iter().map(|v| v.as_ptr()).collect();
                        // SAFETY: the accumulator holds `len` accumulator
                        // elements and overlaps no input, which hold `len`.
                        unsafe { k.fold(dtype, op, out, folded > 0, &addrs, len) }.unwrap();
                        folded += take;
                    }
                    // SAFETY: as above.
                    unsafe { k.finish_fold(dtype, op, out, len, n) }.unwrap();
                    let got = &acc.get()[..len * dtype.size()];
                    case.compare(k.isa(), &format!("staged fold of {n}"), got, &expected, &views);
                    assert!(acc.guards_intact(), "{test}: {} wrote outside its accumulator", k.isa());
                }
            }
        }
    }
    // Where the grouping shows for 16-bit floats: 1 + 2^-8 + 2^-8 in bf16
    // is 1 + 2^-7 in one pass, 1 if each step rounded.
    let one = half::bf16::from_f32(1.0).to_bits().to_ne_bytes();
    let tiny = half::bf16::from_f32(1.0 / 256.0).to_bits().to_ne_bytes();
    for k in &kernels {
        let mut acc = [0u8; 4];
        // SAFETY: one element each; the accumulator has room for an f32.
        unsafe {
            k.fold(DataType::Bfloat16, ReduceOp::Sum, acc.as_mut_ptr(), false, &[one.as_ptr()], 1).unwrap();
            k.fold(DataType::Bfloat16, ReduceOp::Sum, acc.as_mut_ptr(), true, &[tiny.as_ptr()], 1).unwrap();
            k.fold(DataType::Bfloat16, ReduceOp::Sum, acc.as_mut_ptr(), true, &[tiny.as_ptr()], 1).unwrap();
            k.finish_fold(DataType::Bfloat16, ReduceOp::Sum, acc.as_mut_ptr(), 1, 3).unwrap();
        }
        let got = u16::from_ne_bytes([acc[0], acc[1]]);
        assert_eq!(half::bf16::from_bits(got).to_f32(), 1.0 + 1.0 / 128.0, "{}", k.isa());
    }
}

/// Hand-picked cases, so the rules in the module documentation are pinned
/// down by name and not only by the random matrix.
#[test]
fn documented_rules_hold() {
    let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
    let bits = |b: &[u8]| -> Vec<u32> { b.chunks(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect() };
    for k in kernel_sets() {
        let run = |op: ReduceOp, a: &[f32], b: &[f32]| -> Vec<u32> {
            let mut out = vec![0u8; a.len() * 4];
            k.reduce(DataType::Float32, op, &mut out, &[&f32s(a), &f32s(b)]).unwrap();
            bits(&out)
        };
        let nan = canonical_nan::F32;
        let payload = f32::from_bits(0xffa5_a5a5);
        // max/min: -0 < +0 either way round; NaN from either side wins.
        assert_eq!(run(ReduceOp::Max, &[-0.0, 0.0, 1.0, payload], &[0.0, -0.0, payload, 1.0]), [0, 0, nan, nan], "{}", k.isa());
        assert_eq!(
            run(ReduceOp::Min, &[-0.0, 0.0, 1.0, payload], &[0.0, -0.0, payload, 1.0]),
            [0x8000_0000, 0x8000_0000, nan, nan],
            "{}",
            k.isa()
        );
        // Signed zeros add as IEEE says; inf - inf is the canonical NaN.
        assert_eq!(run(ReduceOp::Sum, &[-0.0, -0.0, f32::INFINITY], &[-0.0, 0.0, f32::NEG_INFINITY]), [0x8000_0000, 0, nan], "{}", k.isa());
        // avg divides (1/3 is not 1 * (1/3) rounded twice).
        let third = run(ReduceOp::Avg, &[1.0], &[0.0]);
        assert_eq!(third, [0.5f32.to_bits()]);
        let mut out = [0u8; 4];
        k.reduce(DataType::Float32, ReduceOp::Avg, &mut out, &[&f32s(&[1.0]), &f32s(&[0.0]), &f32s(&[0.0])]).unwrap();
        assert_eq!(f32::from_ne_bytes(out), 1.0f32 / 3.0);
        // bf16 rounds once, after combining in f32: 1 + 2^-8 + 2^-8 is
        // 1 + 2^-7 exactly, though either addition alone would round to 1.
        let one = half::bf16::from_f32(1.0).to_bits().to_ne_bytes();
        let tiny = half::bf16::from_f32(1.0 / 256.0).to_bits().to_ne_bytes();
        let mut out = [0u8; 2];
        k.reduce(DataType::Bfloat16, ReduceOp::Sum, &mut out, &[&one, &tiny, &tiny]).unwrap();
        assert_eq!(half::bf16::from_bits(u16::from_ne_bytes(out)).to_f32(), 1.0 + 1.0 / 128.0, "{}", k.isa());
        // Integers wrap and avg truncates toward zero.
        let mut out = [0u8; 1];
        k.reduce(DataType::Int8, ReduceOp::Sum, &mut out, &[&[100], &[100]]).unwrap();
        assert_eq!(out[0] as i8, -56);
        k.reduce(DataType::Int8, ReduceOp::Avg, &mut out, &[&[(-7i8) as u8], &[0]]).unwrap();
        assert_eq!(out[0] as i8, -3);
        // A NaN's payload and sign never reach the output.
        let mut out = [0u8; 2];
        k.reduce(DataType::Float16, ReduceOp::Sum, &mut out, &[&0xfd01u16.to_ne_bytes()]).unwrap();
        assert_eq!(u16::from_ne_bytes(out), canonical_nan::F16, "{}", k.isa());
    }
}

#[test]
fn bad_arguments_are_refused() {
    let k = Kernels::best();
    let a = [0u8; 8];
    let b = [0u8; 4];
    let mut out = [0u8; 8];
    assert_eq!(k.reduce(DataType::Float32, ReduceOp::Sum, &mut out, &[]), Err(ReduceError::NoInputs));
    assert_eq!(k.reduce(DataType::Float32, ReduceOp::Sum, &mut out, &[&a, &b]), Err(ReduceError::LengthMismatch));
    assert_eq!(k.reduce(DataType::Float64, ReduceOp::Sum, &mut out[..6], &[&a[..6]]), Err(ReduceError::PartialElement));
    let many = vec![&a[..]; MAX_INPUTS + 1];
    assert_eq!(k.reduce(DataType::Float32, ReduceOp::Sum, &mut out, &many), Err(ReduceError::TooManyInputs));
    assert_eq!(k.reduce(DataType::Float32, ReduceOp::Sum, &mut out, &many[1..]), Ok(()));
    assert_eq!(k.accumulate(DataType::Float32, ReduceOp::Sum, &mut out, &b), Err(ReduceError::LengthMismatch));
    assert_eq!(k.finish_avg(DataType::Float32, &mut out, 0), Err(ReduceError::BadCount));
    assert_eq!(k.finish_avg(DataType::Float32, &mut out[..7], 2), Err(ReduceError::PartialElement));
}

#[test]
fn names_and_codes() {
    for (code, dtype) in DataType::ALL.into_iter().enumerate() {
        assert_eq!(dtype as i32, code as i32);
        assert_eq!(DataType::from_nccl(code as i32), Some(dtype));
        assert_eq!(DataType::parse(dtype.name()), Some(dtype));
        assert_eq!(DataType::parse(&dtype.name().to_uppercase()), Some(dtype));
    }
    assert_eq!(DataType::from_nccl(10), None);
    assert_eq!(DataType::from_nccl(-1), None);
    assert_eq!(DataType::parse("bfloat16"), Some(DataType::Bfloat16));
    assert_eq!(DataType::parse("float32"), Some(DataType::Float32));
    assert_eq!(DataType::parse("f8"), None);
    let sizes: Vec<usize> = DataType::ALL.iter().map(|t| t.size()).collect();
    assert_eq!(sizes, [1, 1, 4, 4, 8, 8, 2, 4, 8, 2]);
    for (code, op) in ReduceOp::ALL.into_iter().enumerate() {
        assert_eq!(op as i32, code as i32);
        assert_eq!(ReduceOp::from_nccl(code as i32), Some(op));
        assert_eq!(ReduceOp::parse(op.name()), Some(op));
    }
    assert_eq!(ReduceOp::from_nccl(5), None);
    for isa in Isa::ALL {
        assert_eq!(Isa::parse(isa.name()), Some(isa));
    }
}

#[test]
fn choosing_kernels_by_name() {
    assert_eq!(Kernels::for_name("auto").unwrap().isa(), Kernels::best().isa());
    assert_eq!(Kernels::for_name("").unwrap().isa(), Kernels::best().isa());
    assert_eq!(Kernels::for_name("scalar").unwrap().isa(), Isa::Scalar);
    assert_eq!(Kernels::for_name("sse9").unwrap_err(), IsaError::UnknownName);
    let missing = Isa::ALL.into_iter().find(|isa| !isa.is_available()).expect("no CPU has both x86 and Arm SIMD");
    let err = Kernels::for_name(missing.name()).unwrap_err();
    assert_eq!(err, IsaError::Unavailable(missing));
    assert!(err.to_string().contains("not available"), "{err}");
    for isa in available_isas() {
        assert_eq!(Kernels::for_name(isa.name()).unwrap().isa(), isa);
    }
    // `detect` honours TALLY_ISA when it is set (as the CI may do); checked
    // without touching the environment, which other tests share.
    match std::env::var("TALLY_ISA") {
        Ok(name) => assert_eq!(Kernels::detect().map(|k| k.isa()), Kernels::for_name(&name).map(|k| k.isa())),
        Err(_) => assert_eq!(Kernels::detect().unwrap().isa(), Kernels::best().isa()),
    }
}

/// A split round's last step (`Kernels::reduce_partials`): the partials of
/// groups of ranks, combined in group order; an average is the partials'
/// sum divided by every group's ranks, as one fold of every rank's piece
/// divides. Every kernel set gives the same bits; 16-bit floats and more
/// than 8 partials are refused.
#[test]
fn partials_of_groups_combine_in_group_order() {
    let ranks: Vec<Vec<f32>> = (0..6).map(|r| (0..300).map(|i| (r * 300 + i) as f32 * 0.37 - 100.0).collect()).collect();
    let bytes = |v: &Vec<f32>| bytemuck::cast_slice::<f32, u8>(v).to_vec();
    let groups = [0..2usize, 2..4, 4..6];
    for op in ReduceOp::ALL {
        let pop = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let partials: Vec<Vec<u8>> = groups
            .iter()
            .map(|g| {
                let ins: Vec<Vec<u8>> = ranks[g.clone()].iter().map(bytes).collect();
                let refs: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
                let mut p = vec![0u8; 1200];
                Kernels::scalar().reduce(DataType::Float32, pop, &mut p, &refs).unwrap();
                p
            })
            .collect();
        // What the partials should give, element by element, in group order.
        let want: Vec<f32> = (0..300)
            .map(|i| {
                let p: Vec<f32> = partials.iter().map(|b| bytemuck::cast_slice::<u8, f32>(b)[i]).collect();
                match op {
                    ReduceOp::Sum => (p[0] + p[1]) + p[2],
                    ReduceOp::Prod => (p[0] * p[1]) * p[2],
                    ReduceOp::Max => p[0].max(p[1]).max(p[2]),
                    ReduceOp::Min => p[0].min(p[1]).min(p[2]),
                    ReduceOp::Avg => ((p[0] + p[1]) + p[2]) / 6.0,
                }
            })
            .collect();
        let ptrs: Vec<*const u8> = partials.iter().map(|p| p.as_ptr()).collect();
        for k in kernel_sets() {
            let mut out = vec![0f32; 300];
            // SAFETY: three partials and the output of 300 f32 each; no overlap.
            unsafe { k.reduce_partials(DataType::Float32, op, out.as_mut_ptr().cast(), &ptrs, 300, 6) }.unwrap();
            assert_eq!(out, want, "{op} with {:?}", k.isa());
        }
    }
    let k = Kernels::scalar();
    let mut out = [0u8; 8];
    let p = [out.as_ptr(); 9];
    // SAFETY: refused before anything is read or written.
    unsafe {
        assert!(k.reduce_partials(DataType::Bfloat16, ReduceOp::Sum, out.as_mut_ptr(), &p[..2], 4, 4).is_err());
        assert!(k.reduce_partials(DataType::Float32, ReduceOp::Sum, out.as_mut_ptr(), &p, 2, 18).is_err());
        assert!(k.reduce_partials(DataType::Float32, ReduceOp::Avg, out.as_mut_ptr(), &p[..2], 2, 0).is_err());
    }
}
