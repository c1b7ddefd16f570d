//! AVX2 (+F16C) kernels: 256-bit registers, streaming stores for large
//! outputs; the last partial register goes through a small stack buffer
//! (AVX2 has no masked 16-bit loads).
//!
//! 16-bit floats travel 16 to a 32-byte load, in two registers of 8 `f32`:
//! `f16` through F16C (`vcvtph2ps`, and `vcvtps2ph` with round-to-nearest-even
//! encoded in the instruction); `bf16` by shifts, even elements of each
//! 32-bit pair in one register, odd ones in the other, put back on store.
//!
//! The integer types use the portable kernels compiled with AVX2 enabled.

use core::arch::x86_64::*;

use super::scalar::{self, Element};
use super::simd::{self, Lanes};
use super::{canonical_nan, kernel_table, OpKind, Table};

pub(crate) static TABLE: Table = kernel_table!(
    int: int_kernel,
    f16: float_kernel<F16x16>, f32: float_kernel<F32x8>,
    f64: float_kernel<F64x4>, bf16: float_kernel<Bf16x16>
);

simd::wide_kernels!("avx2,f16c", "AVX2 and F16C", f16: F16x16, bf16: Bf16x16);

/// # Safety
/// As for [`super::Kernel`]: the CPU has AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn int_kernel<E: Element, O: OpKind>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    // SAFETY: the caller upholds the kernel contract.
    unsafe { scalar::reduce::<E, O>(out, inputs, elems, divisor) }
}

/// # Safety
/// As for [`super::Kernel`]: the CPU has AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn float_kernel<L: Lanes, O: OpKind>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    // SAFETY: the caller upholds the kernel contract and has the
    // instruction set the `Lanes` types below need.
    unsafe { simd::reduce::<L, O, 4>(out, inputs, elems, divisor) }
}

// Every `unsafe` block below runs inside `float_kernel`, which is compiled
// with, and only called on CPUs with, AVX2 and F16C: that is why the
// intrinsics are sound. Memory accesses are further covered by the `Lanes`
// method contracts, which `simd` upholds.

/// The rounding immediate for `vcvtps2ph`: nearest-even, whatever MXCSR says.
const RNE: i32 = _MM_FROUND_TO_NEAREST_INT;

#[derive(Clone, Copy)]
pub(crate) struct F32x8(__m256);

impl Lanes for F32x8 {
    const LANES: usize = 8;
    const SIZE: usize = 4;
    const STREAM_ALIGN: usize = 32;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_loadu_ps(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `RNE`.
        unsafe { _mm256_storeu_ps(p.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut u8) {
        // SAFETY: the caller aligns `p` to 32 bytes.
        unsafe { _mm256_stream_ps(p.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn stream_fence() {
        // SAFETY: see the note above `RNE`.
        unsafe { _mm_sfence() }
    }
    #[inline(always)]
    unsafe fn add(self, x: Self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_add_ps(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn mul(self, x: Self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_mul_ps(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn max(self, x: Self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(max_ps(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(min_ps(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn divisor(divisor: u32) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_set1_ps(divisor as f32)) }
    }
    #[inline(always)]
    unsafe fn div(self, divisor: Self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_div_ps(self.0, divisor.0)) }
    }
    #[inline(always)]
    unsafe fn canonical(self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(canonical_ps(self.0)) }
    }
}

// `vmaxps`/`vminps` return the second operand when the two compare equal
// (so for +0 against -0) or when either is NaN. Equal operands are fixed by
// combining their bits (AND keeps +0 for max, OR keeps -0 for min); a NaN in
// the first operand is put back. A NaN in the second comes out by itself.

#[inline(always)]
unsafe fn max_ps(a: __m256, b: __m256) -> __m256 {
    // SAFETY: see the note above `RNE`.
    unsafe {
        let m = _mm256_max_ps(a, b);
        let m = _mm256_blendv_ps(m, _mm256_and_ps(a, b), _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b));
        _mm256_blendv_ps(m, a, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a))
    }
}

#[inline(always)]
unsafe fn min_ps(a: __m256, b: __m256) -> __m256 {
    // SAFETY: see the note above `RNE`.
    unsafe {
        let m = _mm256_min_ps(a, b);
        let m = _mm256_blendv_ps(m, _mm256_or_ps(a, b), _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b));
        _mm256_blendv_ps(m, a, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a))
    }
}

/// `v` with every NaN lane replaced by the canonical NaN. NaNs are rare, so
/// the replacement sits out of line behind one well-predicted branch.
#[inline(always)]
unsafe fn canonical_ps(v: __m256) -> __m256 {
    // SAFETY: see the note above `RNE`.
    unsafe {
        let is_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
        if _mm256_movemask_ps(is_nan) == 0 {
            v
        } else {
            replace_nans_ps(v, is_nan)
        }
    }
}

/// # Safety
/// The CPU has AVX2.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2,f16c")]
unsafe fn replace_nans_ps(v: __m256, is_nan: __m256) -> __m256 {
    let nan = _mm256_castsi256_ps(_mm256_set1_epi32(canonical_nan::F32 as i32));
    _mm256_blendv_ps(v, nan, is_nan)
}

#[derive(Clone, Copy)]
pub(crate) struct F64x4(__m256d);

impl Lanes for F64x4 {
    const LANES: usize = 4;
    const SIZE: usize = 8;
    const STREAM_ALIGN: usize = 32;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_loadu_pd(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `RNE`.
        unsafe { _mm256_storeu_pd(p.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut u8) {
        // SAFETY: the caller aligns `p` to 32 bytes.
        unsafe { _mm256_stream_pd(p.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn stream_fence() {
        // SAFETY: see the note above `RNE`.
        unsafe { _mm_sfence() }
    }
    #[inline(always)]
    unsafe fn add(self, x: Self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_add_pd(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn mul(self, x: Self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_mul_pd(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn max(self, x: Self) -> Self {
        // SAFETY: see the note above `RNE`; as `max_ps`, for doubles.
        unsafe {
            let (a, b) = (self.0, x.0);
            let m = _mm256_max_pd(a, b);
            let m = _mm256_blendv_pd(m, _mm256_and_pd(a, b), _mm256_cmp_pd::<_CMP_EQ_OQ>(a, b));
            Self(_mm256_blendv_pd(m, a, _mm256_cmp_pd::<_CMP_UNORD_Q>(a, a)))
        }
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        // SAFETY: see the note above `RNE`; as `min_ps`, for doubles.
        unsafe {
            let (a, b) = (self.0, x.0);
            let m = _mm256_min_pd(a, b);
            let m = _mm256_blendv_pd(m, _mm256_or_pd(a, b), _mm256_cmp_pd::<_CMP_EQ_OQ>(a, b));
            Self(_mm256_blendv_pd(m, a, _mm256_cmp_pd::<_CMP_UNORD_Q>(a, a)))
        }
    }
    #[inline(always)]
    unsafe fn divisor(divisor: u32) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_set1_pd(divisor as f64)) }
    }
    #[inline(always)]
    unsafe fn div(self, divisor: Self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe { Self(_mm256_div_pd(self.0, divisor.0)) }
    }
    #[inline(always)]
    unsafe fn canonical(self) -> Self {
        // SAFETY: see the note above `RNE`.
        unsafe {
            let is_nan = _mm256_cmp_pd::<_CMP_UNORD_Q>(self.0, self.0);
            if _mm256_movemask_pd(is_nan) == 0 {
                self
            } else {
                Self(replace_nans_pd(self.0, is_nan))
            }
        }
    }
}

/// # Safety
/// The CPU has AVX2.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2,f16c")]
unsafe fn replace_nans_pd(v: __m256d, is_nan: __m256d) -> __m256d {
    let nan = _mm256_castsi256_pd(_mm256_set1_epi64x(canonical_nan::F64 as i64));
    _mm256_blendv_pd(v, nan, is_nan)
}

/// 16 widened 16-bit floats in two `f32` registers; only how they are
/// loaded and stored differs between `f16` and `bf16`.
#[derive(Clone, Copy)]
pub(crate) struct Pair {
    a: __m256,
    b: __m256,
}

impl Pair {
    #[inline(always)]
    fn map(self, x: Self, f: impl Fn(__m256, __m256) -> __m256) -> Self {
        Pair { a: f(self.a, x.a), b: f(self.b, x.b) }
    }
}

/// Arithmetic shared by the two 16-bit storage types.
macro_rules! pair_arith {
    () => {
        #[inline(always)]
        unsafe fn add(self, x: Self) -> Self {
            // SAFETY: see the note above `RNE`.
            unsafe { Self(self.0.map(x.0, |a, b| _mm256_add_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn mul(self, x: Self) -> Self {
            // SAFETY: see the note above `RNE`.
            unsafe { Self(self.0.map(x.0, |a, b| _mm256_mul_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn max(self, x: Self) -> Self {
            // SAFETY: see the note above `RNE`.
            unsafe { Self(self.0.map(x.0, |a, b| max_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn min(self, x: Self) -> Self {
            // SAFETY: see the note above `RNE`.
            unsafe { Self(self.0.map(x.0, |a, b| min_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn divisor(divisor: u32) -> Self {
            // SAFETY: see the note above `RNE`.
            let d = unsafe { _mm256_set1_ps(divisor as f32) };
            Self(Pair { a: d, b: d })
        }
        #[inline(always)]
        unsafe fn div(self, divisor: Self) -> Self {
            // SAFETY: see the note above `RNE`.
            unsafe { Self(self.0.map(divisor.0, |a, b| _mm256_div_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn canonical(self) -> Self {
            // SAFETY: see the note above `RNE`.
            unsafe {
                // One comparison answers for both registers: NaNs are rare.
                if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(self.0.a, self.0.b)) == 0 {
                    return self;
                }
                Self(Pair { a: canonical_ps(self.0.a), b: canonical_ps(self.0.b) })
            }
        }
        #[inline(always)]
        unsafe fn stream_fence() {
            // SAFETY: see the note above `RNE`.
            unsafe { _mm_sfence() }
        }
    };
}

/// 16 `f16` elements: `a` holds elements 0-7, `b` 8-15.
#[derive(Clone, Copy)]
pub(crate) struct F16x16(Pair);

impl F16x16 {
    #[inline(always)]
    unsafe fn to_bits(self) -> __m256i {
        // SAFETY: see the note above `RNE`.
        unsafe {
            let a = _mm256_cvtps_ph::<RNE>(self.0.a);
            let b = _mm256_cvtps_ph::<RNE>(self.0.b);
            _mm256_set_m128i(b, a)
        }
    }
}

impl Lanes for F16x16 {
    const LANES: usize = 16;
    const SIZE: usize = 2;
    const STREAM_ALIGN: usize = 32;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `RNE`; 32 bytes are readable.
        unsafe { Self(Pair { a: _mm256_cvtph_ps(_mm_loadu_si128(p.cast())), b: _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())) }) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `RNE`; 32 bytes are writable.
        unsafe {
            _mm_storeu_si128(p.cast(), _mm256_cvtps_ph::<RNE>(self.0.a));
            _mm_storeu_si128(p.add(16).cast(), _mm256_cvtps_ph::<RNE>(self.0.b));
        }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut u8) {
        // SAFETY: the caller aligns `p` to 32 bytes.
        unsafe { _mm256_stream_si256(p.cast(), self.to_bits()) }
    }
    pair_arith!();
}

/// 16 `bf16` elements: `a` holds the even ones, `b` the odd ones.
#[derive(Clone, Copy)]
pub(crate) struct Bf16x16(Pair);

impl Bf16x16 {
    #[inline(always)]
    unsafe fn to_bits(self) -> __m256i {
        // SAFETY: see the note above `RNE`.
        unsafe {
            let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
            let even = _mm256_srli_epi32::<16>(round_bf16(self.0.a));
            let odd = _mm256_and_si256(round_bf16(self.0.b), high);
            _mm256_or_si256(even, odd)
        }
    }
}

/// Rounds each `f32` lane to bf16 (nearest, ties to even), leaving the
/// result in the upper 16 bits; NaNs must already be canonical, which keeps
/// them NaN. Same arithmetic as `scalar::f32_to_bf16`.
#[inline(always)]
unsafe fn round_bf16(v: __m256) -> __m256i {
    // SAFETY: see the note above `RNE`.
    unsafe {
        let bits = _mm256_castps_si256(v);
        let lowest_kept = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
        _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lowest_kept)
    }
}

impl Lanes for Bf16x16 {
    const LANES: usize = 16;
    const SIZE: usize = 2;
    const STREAM_ALIGN: usize = 32;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `RNE`; 32 bytes are readable.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
            Self(Pair { a: _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h)), b: _mm256_castsi256_ps(_mm256_and_si256(h, high)) })
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `RNE`; 32 bytes are writable.
        unsafe { _mm256_storeu_si256(p.cast(), self.to_bits()) }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut u8) {
        // SAFETY: the caller aligns `p` to 32 bytes.
        unsafe { _mm256_stream_si256(p.cast(), self.to_bits()) }
    }
    pair_arith!();
}

simd::wide_pair!(F16x16, scalar::F16, _mm256_loadu_ps, _mm256_storeu_ps, 32);
simd::wide_pair!(Bf16x16, scalar::Bf16, _mm256_loadu_ps, _mm256_storeu_ps, 32);
