//! The portable kernels: plain Rust, one element at a time in the source
//! (the compiler vectorises what it can, which changes no result because
//! lanes never mix). They define the results every other instruction set
//! must reproduce byte for byte, and they also serve the SIMD tables for the
//! integer types, compiled there with the wider instruction set enabled.
//!
//! Buffers are raw addresses because the output may be the first input's own
//! slot; elements are read and written unaligned.

use core::ptr;

use super::{canonical_nan, kernel_table, wide_table, OpKind, ReduceOp, Table, WideTable};

/// How an element is stored in a buffer, and the type it is combined in.
pub(crate) trait Element: Copy {
    /// Bytes per stored element.
    const SIZE: usize;
    /// What elements are combined as: the type itself, or `f32` for 16-bit
    /// floats.
    type Acc: Arith;

    /// Reads one element.
    ///
    /// # Safety
    /// `p` is valid for reading `SIZE` bytes.
    unsafe fn load(p: *const u8) -> Self::Acc;

    /// Writes one element, rounding to the storage type.
    ///
    /// # Safety
    /// `p` is valid for writing `SIZE` bytes.
    unsafe fn store(p: *mut u8, value: Self::Acc);
}

/// The arithmetic of the combining type.
pub(crate) trait Arith: Copy + Default {
    /// `self op x`.
    fn combine<O: OpKind>(self, x: Self) -> Self;
    /// The value to write: divided by `divisor` for avg, NaN made canonical.
    fn finish<O: OpKind>(self, divisor: u32) -> Self;
}

/// `float16` storage, combined in `f32`.
#[derive(Clone, Copy)]
pub(crate) struct F16;

/// `bfloat16` storage, combined in `f32`.
#[derive(Clone, Copy)]
pub(crate) struct Bf16;

pub(crate) static TABLE: Table = kernel_table!(
    int: kernel,
    f16: kernel<F16>, f32: kernel<f32>, f64: kernel<f64>, bf16: kernel<Bf16>
);

pub(crate) static WIDE: WideTable = wide_table!(wide_fold, wide_narrow, f16: F16, bf16: Bf16);

/// # Safety
/// As for [`fold_wide`].
unsafe fn wide_fold<E: Element<Acc = f32>, O: OpKind>(acc: *mut u8, resume: bool, inputs: &[*const u8], elems: usize) {
    // SAFETY: the caller upholds `fold_wide`'s contract.
    unsafe { fold_wide::<E, O>(acc, resume, inputs, 0, elems) }
}

/// # Safety
/// As for [`narrow_wide`].
unsafe fn wide_narrow<E: Element<Acc = f32>, O: OpKind>(out: *mut u8, acc: *const u8, elems: usize, divisor: u32) {
    // SAFETY: the caller upholds `narrow_wide`'s contract.
    unsafe { narrow_wide::<E, O>(out, acc, 0, elems, divisor) }
}

/// A kernel of the portable table.
///
/// # Safety
/// As for [`super::Kernel`].
unsafe fn kernel<E: Element, O: OpKind>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    // SAFETY: the caller upholds the kernel contract, which is `reduce`'s.
    unsafe { reduce::<E, O>(out, inputs, elems, divisor) }
}

/// The portable reduction. Elements go in blocks of a fixed size, which
/// the compiler turns into vector code: a block's partial results are
/// combined with every input in turn before the block is written, which
/// keeps one pass over memory and lets `out` be `inputs[0]` (a block of the
/// first input is read before it is overwritten). The last partial block
/// goes one element at a time.
///
/// # Safety
/// As for [`super::Kernel`], without the instruction-set condition.
#[inline(always)]
pub(crate) unsafe fn reduce<E: Element, O: OpKind>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    const BLOCK: usize = 64;
    let Some((&first, rest)) = inputs.split_first() else {
        return;
    };
    let mut start = 0;
    while elems - start >= BLOCK {
        let base = start * E::SIZE;
        // SAFETY: (for the block) elements `start .. start + BLOCK` are
        // below `elems`, so they lie in every input and in `out`; every
        // input's block is read before `out`'s is written.
        unsafe {
            let mut partial: [E::Acc; BLOCK] = core::array::from_fn(|j| E::load(first.add(base + j * E::SIZE)));
            for &input in rest {
                for (j, acc) in partial.iter_mut().enumerate() {
                    *acc = acc.combine::<O>(E::load(input.add(base + j * E::SIZE)));
                }
            }
            for (j, acc) in partial.iter().enumerate() {
                E::store(out.add(base + j * E::SIZE), acc.finish::<O>(divisor));
            }
        }
        start += BLOCK;
    }
    for i in start..elems {
        let at = i * E::SIZE;
        // SAFETY: element `i` is below `elems`; it is read from every input
        // before it is written.
        unsafe {
            let mut acc = E::load(first.add(at));
            for &input in rest {
                acc = acc.combine::<O>(E::load(input.add(at)));
            }
            E::store(out.add(at), acc.finish::<O>(divisor));
        }
    }
}

/// The widening fold of 16-bit floats, for inputs that arrive a few at a
/// time (staged receives), over elements `from..elems`: `acc` holds `f32`
/// partials, element `i` at byte `4i`. With `resume` false they start from
/// `inputs[0]` widened; otherwise from what `acc` holds. Each further input
/// is combined in, in order, exactly as [`reduce`] combines it, and the
/// partials are stored unrounded, so a fold over groups followed by
/// [`narrow_wide`] gives the one pass's bytes. (The SIMD kernels keep their
/// whole registers' partials in their own order and leave the tail here.)
///
/// # Safety
/// `acc` is valid for reading and writing `elems` `f32`s and overlaps no
/// input; every input is valid for reading `elems` elements; `inputs` is not
/// empty unless `resume` is set.
#[inline(always)]
pub(crate) unsafe fn fold_wide<E: Element<Acc = f32>, O: OpKind>(
    acc: *mut u8,
    resume: bool,
    inputs: &[*const u8],
    from: usize,
    elems: usize,
) {
    let rest = if resume { inputs } else { &inputs[1..] };
    wide_blocks(from, elems, |start, partial| {
        // SAFETY: (for the block) elements `start .. start + partial.len()`
        // are below `elems`, so they lie in every input and in `acc`.
        unsafe {
            for (j, p) in partial.iter_mut().enumerate() {
                let i = start + j;
                *p = if resume { ptr::read_unaligned(acc.add(i * 4).cast::<f32>()) } else { E::load(inputs[0].add(i * E::SIZE)) };
            }
            for &input in rest {
                for (j, p) in partial.iter_mut().enumerate() {
                    *p = p.combine::<O>(E::load(input.add((start + j) * E::SIZE)));
                }
            }
            for (j, p) in partial.iter().enumerate() {
                ptr::write_unaligned(acc.add((start + j) * 4).cast::<f32>(), *p);
            }
        }
    });
}

/// Rounds the `f32` partials of a widening fold, elements `from..elems`, to
/// the 16-bit type, with what the one pass does last (avg's division, the
/// canonical NaN). `out` may be `acc` itself: element `i` is written to
/// bytes `2i..2i + 2` only after elements up to `i` were read, and no later
/// element lies below.
///
/// # Safety
/// `acc` is valid for reading `elems` `f32`s and `out` for writing `elems`
/// 16-bit elements; they overlap only if `out == acc`.
#[inline(always)]
pub(crate) unsafe fn narrow_wide<E: Element<Acc = f32>, O: OpKind>(out: *mut u8, acc: *const u8, from: usize, elems: usize, divisor: u32) {
    wide_blocks(from, elems, |start, partial| {
        // SAFETY: (for the block) elements `start .. start + partial.len()`
        // are below `elems`; the whole block is read before any of it is
        // written, and it is written below every later block (2i < 4i).
        unsafe {
            for (j, p) in partial.iter_mut().enumerate() {
                *p = ptr::read_unaligned(acc.add((start + j) * 4).cast::<f32>());
            }
            for (j, p) in partial.iter().enumerate() {
                E::store(out.add((start + j) * E::SIZE), p.finish::<O>(divisor));
            }
        }
    });
}

/// Calls `f(start, partials)` for blocks of up to 64 elements covering
/// `from..elems`, with a block's worth of scratch `f32`s (which the
/// compiler keeps in vector registers).
#[inline(always)]
fn wide_blocks(from: usize, elems: usize, mut f: impl FnMut(usize, &mut [f32])) {
    const BLOCK: usize = 64;
    let mut partial = [0f32; BLOCK];
    let mut start = from;
    while start < elems {
        let len = BLOCK.min(elems - start);
        f(start, &mut partial[..len]);
        start += len;
    }
}

macro_rules! native_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            type Acc = $t;

            #[inline(always)]
            unsafe fn load(p: *const u8) -> $t {
                // SAFETY: the caller makes `p` readable for `SIZE` bytes.
                unsafe { ptr::read_unaligned(p.cast::<$t>()) }
            }

            #[inline(always)]
            unsafe fn store(p: *mut u8, value: $t) {
                // SAFETY: the caller makes `p` writable for `SIZE` bytes.
                unsafe { ptr::write_unaligned(p.cast::<$t>(), value) }
            }
        }
    )*};
}
native_element!(i8, u8, i32, u32, i64, u64, f32, f64);

impl Element for F16 {
    const SIZE: usize = 2;
    type Acc = f32;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> f32 {
        // SAFETY: the caller makes `p` readable for two bytes.
        f16_to_f32(unsafe { ptr::read_unaligned(p.cast::<u16>()) })
    }

    #[inline(always)]
    unsafe fn store(p: *mut u8, value: f32) {
        // SAFETY: the caller makes `p` writable for two bytes.
        unsafe { ptr::write_unaligned(p.cast::<u16>(), f32_to_f16(value)) }
    }
}

impl Element for Bf16 {
    const SIZE: usize = 2;
    type Acc = f32;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> f32 {
        // SAFETY: the caller makes `p` readable for two bytes.
        bf16_to_f32(unsafe { ptr::read_unaligned(p.cast::<u16>()) })
    }

    #[inline(always)]
    unsafe fn store(p: *mut u8, value: f32) {
        // SAFETY: the caller makes `p` writable for two bytes.
        unsafe { ptr::write_unaligned(p.cast::<u16>(), f32_to_bf16(value)) }
    }
}

macro_rules! int_arith {
    ($($t:ty => $via:ty, $quotient:ident);*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn combine<O: OpKind>(self, x: $t) -> $t {
                match O::OP {
                    ReduceOp::Sum | ReduceOp::Avg => self.wrapping_add(x),
                    ReduceOp::Prod => self.wrapping_mul(x),
                    ReduceOp::Max => self.max(x),
                    ReduceOp::Min => self.min(x),
                }
            }

            #[inline(always)]
            fn finish<O: OpKind>(self, divisor: u32) -> $t {
                if O::OP == ReduceOp::Avg {
                    // The quotient is no larger than `self`: it fits.
                    $quotient(<$via>::from(self), divisor) as $t
                } else {
                    self
                }
            }
        }
    )*};
}
int_arith!(
    i8 => i16, quotient_i16;
    u8 => i16, quotient_i16;
    i32 => i32, quotient_i32;
    u32 => u32, quotient_u32;
    i64 => i64, quotient_i64;
    u64 => u64, quotient_u64
);

// Integer averages divide through floating point where they can, because
// that vectorises and integer division does not. It is exact: unless the
// quotient q = x / d is a whole number, it lies at least 1/d from one, while
// the rounded quotient is off by at most half an ulp of q <= |x| / d, which
// is below 1/d when |x| < 2^(p-1) for a p-bit significand (8-bit values in
// f32, 32-bit values in f64). So truncation lands where exact division
// would. The conversions back are unchecked (a saturating `as` does not
// vectorise): the quotient is finite and no larger than `x`.

/// `x / divisor`, truncated toward zero, for 8-bit values.
#[inline(always)]
fn quotient_i16(x: i16, divisor: u32) -> i16 {
    // A divisor above 2^24 rounds in f32, but then it exceeds |x| either
    // way and the quotient truncates to 0, as it should.
    let q = f32::from(x) / divisor as f32;
    // SAFETY: |q| <= |x| <= 255 fits an i16, and q is finite.
    unsafe { q.to_int_unchecked::<i16>() }
}

/// `x / divisor`, truncated toward zero.
#[inline(always)]
fn quotient_i32(x: i32, divisor: u32) -> i32 {
    let q = f64::from(x) / f64::from(divisor);
    // SAFETY: |q| <= |x| fits an i32, and q is finite.
    unsafe { q.to_int_unchecked::<i32>() }
}

/// `x / divisor`, truncated.
#[inline(always)]
fn quotient_u32(x: u32, divisor: u32) -> u32 {
    let q = f64::from(x) / f64::from(divisor);
    // SAFETY: 0 <= q <= x fits a u32, and q is finite.
    unsafe { q.to_int_unchecked::<u32>() }
}

/// `x / divisor`, truncated toward zero (64 bits need integer division).
#[inline(always)]
fn quotient_i64(x: i64, divisor: u32) -> i64 {
    x / i64::from(divisor)
}

/// `x / divisor`, truncated (64 bits need integer division).
#[inline(always)]
fn quotient_u64(x: u64, divisor: u32) -> u64 {
    x / u64::from(divisor)
}

macro_rules! float_arith {
    ($($t:ty => $nan:expr),*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn combine<O: OpKind>(self, x: $t) -> $t {
                match O::OP {
                    ReduceOp::Sum | ReduceOp::Avg => self + x,
                    ReduceOp::Prod => self * x,
                    // IEEE 754-2019 maximum: equal operands can only differ
                    // in the sign of zero, and the AND of the sign bits
                    // prefers +0; unordered means a NaN, which the sum
                    // passes on.
                    ReduceOp::Max => {
                        if self > x {
                            self
                        } else if x > self {
                            x
                        } else if self == x {
                            <$t>::from_bits(self.to_bits() & x.to_bits())
                        } else {
                            self + x
                        }
                    }
                    ReduceOp::Min => {
                        if self < x {
                            self
                        } else if x < self {
                            x
                        } else if self == x {
                            <$t>::from_bits(self.to_bits() | x.to_bits())
                        } else {
                            self + x
                        }
                    }
                }
            }

            #[inline(always)]
            fn finish<O: OpKind>(self, divisor: u32) -> $t {
                let value = if O::OP == ReduceOp::Avg { self / divisor as $t } else { self };
                if value.is_nan() {
                    <$t>::from_bits($nan)
                } else {
                    value
                }
            }
        }
    )*};
}
float_arith!(f32 => canonical_nan::F32, f64 => canonical_nan::F64);

/// Widens IEEE binary16 bits to `f32` (exact).
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exponent = u32::from(h >> 10) & 0x1f;
    let mantissa = u32::from(h) & 0x3ff;
    match exponent {
        // Zero or subnormal: mantissa x 2^-24, exact in f32.
        0 => f32::from_bits((mantissa as f32 * f32::from_bits(0x3380_0000)).to_bits() | sign),
        // Infinity or NaN (the payload moves along; NaNs end canonical anyway).
        0x1f => f32::from_bits(sign | 0x7f80_0000 | mantissa << 13),
        _ => f32::from_bits(sign | (exponent + 127 - 15) << 23 | mantissa << 13),
    }
}

/// Rounds `f32` to IEEE binary16 bits: nearest, ties to even; too large
/// gives infinity; NaN gives the canonical NaN.
#[inline(always)]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 16) as u16 & 0x8000;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return canonical_nan::F16;
    }
    // 65520 is halfway between the largest half, 65504, and 2^16; the tie
    // goes to the even neighbour, which is 2^16: infinity.
    if abs >= 0x477f_f000 {
        return sign | 0x7c00;
    }
    if abs >= 0x3880_0000 {
        // A normal half: rebias the exponent, then drop 13 mantissa bits,
        // rounding to nearest even; a carry runs into the exponent, as it
        // should.
        let rebiased = abs - ((127 - 15) << 23);
        let rounded = (rebiased + 0xfff + ((rebiased >> 13) & 1)) >> 13;
        return sign | rounded as u16;
    }
    // Below the smallest normal half the step is 2^-24, which is the ulp of
    // f32 numbers in [0.5, 1): adding 0.5 makes the FPU round to that step,
    // ties to even, and leaves the half's bits at the bottom of the sum.
    let sum = f32::from_bits(abs) + 0.5;
    sign | (sum.to_bits() - 0x3f00_0000) as u16
}

/// Widens bfloat16 bits to `f32` (exact: bf16 is the top half of an f32).
#[inline(always)]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Rounds `f32` to bfloat16 bits: nearest, ties to even; NaN gives the
/// canonical NaN.
#[inline(always)]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return canonical_nan::BF16;
    }
    // Adding just under half of the dropped part, plus the kept part's
    // lowest bit, carries exactly when rounding must go up.
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator; these tests need spread, not secrecy.
    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn same_f32(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn f16_widening_matches_half_for_every_value() {
        for h in 0..=u16::MAX {
            let expected = half::f16::from_bits(h).to_f32();
            assert!(same_f32(f16_to_f32(h), expected), "{h:#06x}");
        }
    }

    #[test]
    fn bf16_widening_matches_half_for_every_value() {
        for h in 0..=u16::MAX {
            let expected = half::bf16::from_bits(h).to_f32();
            assert!(same_f32(bf16_to_f32(h), expected), "{h:#06x}");
        }
    }

    /// f32 values where rounding to 16 bits is decided: each 16-bit value
    /// widened, its neighbours, and the points around halfway to the next.
    fn rounding_edges(widen: fn(u16) -> f32) -> impl Iterator<Item = u32> {
        (0..=u16::MAX).flat_map(move |h| {
            let b = widen(h).to_bits();
            let step = widen(h.wrapping_add(1)).to_bits().wrapping_sub(b);
            let mid = b.wrapping_add(step / 2);
            [b, b.wrapping_add(1), b.wrapping_sub(1), mid, mid.wrapping_add(1), mid.wrapping_sub(1)]
        })
    }

    fn check_narrowing(narrow: fn(f32) -> u16, widen: fn(u16) -> f32, reference: fn(f32) -> u16, nan: u16, seed: u64) {
        let mut state = seed;
        let random = core::iter::repeat_with(move || splitmix(&mut state) as u32).take(1_000_000);
        for bits in rounding_edges(widen).chain(random) {
            let x = f32::from_bits(bits);
            let expected = if x.is_nan() { nan } else { reference(x) };
            assert_eq!(narrow(x), expected, "{bits:#010x}");
        }
    }

    #[test]
    fn f16_rounding_matches_half() {
        let reference = |x: f32| half::f16::from_f32(x).to_bits();
        check_narrowing(f32_to_f16, f16_to_f32, reference, canonical_nan::F16, 1);
    }

    #[test]
    fn bf16_rounding_matches_half() {
        let reference = |x: f32| half::bf16::from_f32(x).to_bits();
        check_narrowing(f32_to_bf16, bf16_to_f32, reference, canonical_nan::BF16, 2);
    }

    #[test]
    fn division_through_f64_is_exact() {
        let divisors = (1..=1100).chain([65_535, 65_536, 1 << 31, u32::MAX - 1, u32::MAX]);
        for d in divisors {
            for x in i16::from(i8::MIN)..=i16::from(u8::MAX) {
                assert_eq!(quotient_i16(x, d), (i64::from(x) / i64::from(d)) as i16, "{x} / {d}");
                let x = i32::from(x);
                assert_eq!(quotient_i32(x, d), (i64::from(x) / i64::from(d)) as i32, "{x} / {d}");
            }
        }
        let mut state = 3;
        for _ in 0..2_000_000 {
            let r = splitmix(&mut state);
            // Any value, by any divisor (small ones more often).
            let d = (((r >> 32) as u32) >> (r >> 59)).max(1);
            let (x, y) = (r as i32, r as u32);
            assert_eq!(quotient_i32(x, d), (i64::from(x) / i64::from(d)) as i32, "{x} / {d}");
            assert_eq!(quotient_u32(y, d), y / d, "{y} / {d}");
        }
        for d in [1, 2, 3, 7, u32::MAX / 2, u32::MAX] {
            for x in [i32::MIN, i32::MIN + 1, -1, i32::MAX] {
                assert_eq!(quotient_i32(x, d), (i64::from(x) / i64::from(d)) as i32, "{x} / {d}");
            }
            for y in [u32::MAX, u32::MAX - 1, 1 << 31] {
                assert_eq!(quotient_u32(y, d), y / d, "{y} / {d}");
            }
        }
    }

    #[test]
    fn max_and_min_order_zeros_and_propagate_nan() {
        let max = |a: f32, b: f32| a.combine::<super::super::Max>(b).finish::<super::super::Max>(1);
        let min = |a: f32, b: f32| a.combine::<super::super::Min>(b).finish::<super::super::Min>(1);
        assert_eq!(max(-0.0, 0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(max(0.0, -0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(min(-0.0, 0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(min(0.0, -0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(max(f32::NAN, 1.0).to_bits(), canonical_nan::F32);
        assert_eq!(max(1.0, -f32::NAN).to_bits(), canonical_nan::F32);
        assert_eq!(min(f32::INFINITY, f32::NAN).to_bits(), canonical_nan::F32);
        assert_eq!(max(1.0, 2.0), 2.0);
        assert_eq!(min(1.0, 2.0), 1.0);
    }
}
