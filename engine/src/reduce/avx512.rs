//! AVX-512 (F, BW, VL) kernels: 512-bit registers, masked loads and stores
//! for the last partial register, streaming stores for large outputs.
//!
//! 16-bit floats travel 32 to a 64-byte load, in two registers of 16 `f32`:
//! `f16` through the hardware conversions (`vcvtph2ps`, and `vcvtps2ph` with
//! round-to-nearest-even encoded in the instruction, so MXCSR does not
//! matter); `bf16` by shifts: the even elements of each 32-bit pair shifted
//! up, the odd ones masked in place. Lanes are thus in a different order
//! than in memory, the same for every input, and the store puts them back.
//!
//! With AVX512-BF16 (the `avx512bf16` table) `bf16` results are rounded by
//! `vcvtne2ps2bf16`, which rounds to nearest even exactly as the shifts do,
//! except that it flushes subnormals to zero and keeps NaN payloads; the rare
//! register holding either goes through the shifts instead, so the bytes
//! are the same. (This one instruction replaces ten: in cache, bf16 sums of
//! two inputs run about a third faster.)
//!
//! The integer types use the portable kernels compiled with AVX-512 enabled.

// The AVX-512 intrinsics and feature names are stable from Rust 1.89 on,
// which is therefore this crate's real minimum on x86-64.
#![allow(clippy::incompatible_msrv)]

use core::arch::x86_64::*;

use super::scalar::{self, Element};
use super::simd::{self, Lanes};
use super::{canonical_nan, kernel_table, OpKind, Table};

pub(crate) static TABLE: Table = kernel_table!(
    int: int_kernel,
    f16: float_kernel<F16x32>, f32: float_kernel<F32x16>,
    f64: float_kernel<F64x8>, bf16: float_kernel<Bf16x32<false>>
);

pub(crate) static TABLE_BF16: Table = kernel_table!(
    int: int_kernel,
    f16: float_kernel<F16x32>, f32: float_kernel<F32x16>,
    f64: float_kernel<F64x8>, bf16: bf16_kernel<Bf16x32<true>>
);

simd::wide_kernels!("avx512f,avx512bw,avx512vl,avx2,f16c", "AVX-512 F, BW and VL", f16: F16x32, bf16: Bf16x32<false>);

/// # Safety
/// As for [`super::Kernel`]: the CPU has AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn int_kernel<E: Element, O: OpKind>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    // SAFETY: the caller upholds the kernel contract.
    unsafe { scalar::reduce::<E, O>(out, inputs, elems, divisor) }
}

/// # Safety
/// As for [`super::Kernel`]: the CPU has AVX-512 F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn float_kernel<L: Lanes, O: OpKind>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    // SAFETY: the caller upholds the kernel contract and has the
    // instruction set the `Lanes` types below need.
    unsafe { simd::reduce::<L, O, 4>(out, inputs, elems, divisor) }
}

/// # Safety
/// As for [`super::Kernel`]: the CPU has AVX-512 F, BW, VL, DQ and BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c")]
unsafe fn bf16_kernel<L: Lanes, O: OpKind>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    // SAFETY: the caller upholds the kernel contract and has the
    // instruction set `Bf16x32<true>` needs.
    unsafe { simd::reduce::<L, O, 4>(out, inputs, elems, divisor) }
}

// Every `unsafe` block below runs inside `float_kernel` or `bf16_kernel`,
// which are compiled with, and only called on CPUs with, AVX-512 F/BW/VL
// (and DQ and BF16 for `bf16_kernel`, the only user of `Bf16x32<true>`):
// that is why the intrinsics are sound. Memory accesses are further covered by the `Lanes`
// method contracts, which `simd` upholds.

/// A mask of the first `count` (< 32) lanes.
#[inline(always)]
fn first(count: usize) -> u32 {
    (1u32 << count) - 1
}

/// The rounding immediate for `vcvtps2ph`: nearest-even, whatever MXCSR says.
const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

#[derive(Clone, Copy)]
pub(crate) struct F32x16(__m512);

impl Lanes for F32x16 {
    const LANES: usize = 16;
    const SIZE: usize = 4;
    const STREAM_ALIGN: usize = 64;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_loadu_ps(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `first`.
        unsafe { _mm512_storeu_ps(p.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const u8, count: usize) -> Self {
        // SAFETY: masked-off lanes are not accessed, so only `count` elements
        // need be readable.
        unsafe { Self(_mm512_maskz_loadu_ps(first(count) as __mmask16, p.cast())) }
    }
    #[inline(always)]
    unsafe fn store_part(self, p: *mut u8, count: usize) {
        // SAFETY: masked-off lanes are not accessed.
        unsafe { _mm512_mask_storeu_ps(p.cast(), first(count) as __mmask16, self.0) }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut u8) {
        // SAFETY: the caller aligns `p` to 64 bytes.
        unsafe { _mm512_stream_ps(p.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn stream_fence() {
        // SAFETY: see the note above `first`.
        unsafe { _mm_sfence() }
    }
    #[inline(always)]
    unsafe fn add(self, x: Self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_add_ps(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn mul(self, x: Self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_mul_ps(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn max(self, x: Self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(max_ps(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(min_ps(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn divisor(divisor: u32) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_set1_ps(divisor as f32)) }
    }
    #[inline(always)]
    unsafe fn div(self, divisor: Self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_div_ps(self.0, divisor.0)) }
    }
    #[inline(always)]
    unsafe fn canonical(self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(canonical_ps(self.0)) }
    }
}

// `vmaxps`/`vminps` return the second operand when the two compare equal
// (so for +0 against -0) or when either is NaN. Equal operands are fixed by
// combining their bits (AND keeps +0 for max, OR keeps -0 for min); a NaN in
// the first operand is put back. A NaN in the second comes out by itself.

#[inline(always)]
unsafe fn max_ps(a: __m512, b: __m512) -> __m512 {
    // SAFETY: see the note above `first`.
    unsafe {
        let m = _mm512_castps_si512(_mm512_max_ps(a, b));
        let equal = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b);
        let (ai, bi) = (_mm512_castps_si512(a), _mm512_castps_si512(b));
        let m = _mm512_castsi512_ps(_mm512_mask_and_epi32(m, equal, ai, bi));
        _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a), a)
    }
}

#[inline(always)]
unsafe fn min_ps(a: __m512, b: __m512) -> __m512 {
    // SAFETY: see the note above `first`.
    unsafe {
        let m = _mm512_castps_si512(_mm512_min_ps(a, b));
        let equal = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b);
        let (ai, bi) = (_mm512_castps_si512(a), _mm512_castps_si512(b));
        let m = _mm512_castsi512_ps(_mm512_mask_or_epi32(m, equal, ai, bi));
        _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a), a)
    }
}

/// `v` with every NaN lane replaced by the canonical NaN. NaNs are rare, so
/// the replacement sits out of line behind one well-predicted branch.
#[inline(always)]
unsafe fn canonical_ps(v: __m512) -> __m512 {
    // SAFETY: see the note above `first`.
    unsafe {
        let is_nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        if is_nan == 0 {
            v
        } else {
            replace_nans_ps(v, is_nan)
        }
    }
}

/// # Safety
/// The CPU has AVX-512 F.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn replace_nans_ps(v: __m512, is_nan: __mmask16) -> __m512 {
    let nan = _mm512_castsi512_ps(_mm512_set1_epi32(canonical_nan::F32 as i32));
    _mm512_mask_mov_ps(v, is_nan, nan)
}

#[derive(Clone, Copy)]
pub(crate) struct F64x8(__m512d);

impl Lanes for F64x8 {
    const LANES: usize = 8;
    const SIZE: usize = 8;
    const STREAM_ALIGN: usize = 64;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_loadu_pd(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `first`.
        unsafe { _mm512_storeu_pd(p.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const u8, count: usize) -> Self {
        // SAFETY: masked-off lanes are not accessed.
        unsafe { Self(_mm512_maskz_loadu_pd(first(count) as __mmask8, p.cast())) }
    }
    #[inline(always)]
    unsafe fn store_part(self, p: *mut u8, count: usize) {
        // SAFETY: masked-off lanes are not accessed.
        unsafe { _mm512_mask_storeu_pd(p.cast(), first(count) as __mmask8, self.0) }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut u8) {
        // SAFETY: the caller aligns `p` to 64 bytes.
        unsafe { _mm512_stream_pd(p.cast(), self.0) }
    }
    #[inline(always)]
    unsafe fn stream_fence() {
        // SAFETY: see the note above `first`.
        unsafe { _mm_sfence() }
    }
    #[inline(always)]
    unsafe fn add(self, x: Self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_add_pd(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn mul(self, x: Self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_mul_pd(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn max(self, x: Self) -> Self {
        // SAFETY: see the note above `first`; as `max_ps`, for doubles.
        unsafe {
            let (a, b) = (self.0, x.0);
            let m = _mm512_castpd_si512(_mm512_max_pd(a, b));
            let equal = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(a, b);
            let (ai, bi) = (_mm512_castpd_si512(a), _mm512_castpd_si512(b));
            let m = _mm512_castsi512_pd(_mm512_mask_and_epi64(m, equal, ai, bi));
            Self(_mm512_mask_mov_pd(m, _mm512_cmp_pd_mask::<_CMP_UNORD_Q>(a, a), a))
        }
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        // SAFETY: see the note above `first`; as `min_ps`, for doubles.
        unsafe {
            let (a, b) = (self.0, x.0);
            let m = _mm512_castpd_si512(_mm512_min_pd(a, b));
            let equal = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(a, b);
            let (ai, bi) = (_mm512_castpd_si512(a), _mm512_castpd_si512(b));
            let m = _mm512_castsi512_pd(_mm512_mask_or_epi64(m, equal, ai, bi));
            Self(_mm512_mask_mov_pd(m, _mm512_cmp_pd_mask::<_CMP_UNORD_Q>(a, a), a))
        }
    }
    #[inline(always)]
    unsafe fn divisor(divisor: u32) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_set1_pd(divisor as f64)) }
    }
    #[inline(always)]
    unsafe fn div(self, divisor: Self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(_mm512_div_pd(self.0, divisor.0)) }
    }
    #[inline(always)]
    unsafe fn canonical(self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe {
            let is_nan = _mm512_cmp_pd_mask::<_CMP_UNORD_Q>(self.0, self.0);
            if is_nan == 0 {
                self
            } else {
                Self(replace_nans_pd(self.0, is_nan))
            }
        }
    }
}

/// # Safety
/// The CPU has AVX-512 F.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn replace_nans_pd(v: __m512d, is_nan: __mmask8) -> __m512d {
    let nan = _mm512_castsi512_pd(_mm512_set1_epi64(canonical_nan::F64 as i64));
    _mm512_mask_mov_pd(v, is_nan, nan)
}

/// 32 widened 16-bit floats in two `f32` registers; only how they are
/// loaded and stored differs between `f16` and `bf16`.
#[derive(Clone, Copy)]
pub(crate) struct Pair {
    a: __m512,
    b: __m512,
}

impl Pair {
    #[inline(always)]
    fn map(self, x: Self, f: impl Fn(__m512, __m512) -> __m512) -> Self {
        Pair { a: f(self.a, x.a), b: f(self.b, x.b) }
    }

    /// Both registers with NaNs made canonical.
    #[inline(always)]
    unsafe fn canonical(self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe {
            // One comparison answers for both registers: NaNs are rare.
            if _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self.a, self.b) == 0 {
                return self;
            }
            Pair { a: canonical_ps(self.a), b: canonical_ps(self.b) }
        }
    }
}

/// Arithmetic shared by the two 16-bit storage types.
macro_rules! pair_arith {
    () => {
        #[inline(always)]
        unsafe fn add(self, x: Self) -> Self {
            // SAFETY: see the note above `first`.
            unsafe { Self(self.0.map(x.0, |a, b| _mm512_add_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn mul(self, x: Self) -> Self {
            // SAFETY: see the note above `first`.
            unsafe { Self(self.0.map(x.0, |a, b| _mm512_mul_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn max(self, x: Self) -> Self {
            // SAFETY: see the note above `first`.
            unsafe { Self(self.0.map(x.0, |a, b| max_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn min(self, x: Self) -> Self {
            // SAFETY: see the note above `first`.
            unsafe { Self(self.0.map(x.0, |a, b| min_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn divisor(divisor: u32) -> Self {
            // SAFETY: see the note above `first`.
            let d = unsafe { _mm512_set1_ps(divisor as f32) };
            Self(Pair { a: d, b: d })
        }
        #[inline(always)]
        unsafe fn div(self, divisor: Self) -> Self {
            // SAFETY: see the note above `first`.
            unsafe { Self(self.0.map(divisor.0, |a, b| _mm512_div_ps(a, b))) }
        }
        #[inline(always)]
        unsafe fn stream_fence() {
            // SAFETY: see the note above `first`.
            unsafe { _mm_sfence() }
        }
    };
}

/// 32 `f16` elements: `a` holds elements 0-15, `b` 16-31.
#[derive(Clone, Copy)]
pub(crate) struct F16x32(Pair);

impl F16x32 {
    #[inline(always)]
    unsafe fn from_bits(h: __m512i) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(Pair { a: _mm512_cvtph_ps(_mm512_castsi512_si256(h)), b: _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h)) }) }
    }

    #[inline(always)]
    unsafe fn to_bits(self) -> __m512i {
        // SAFETY: see the note above `first`.
        unsafe {
            let a = _mm512_cvtps_ph::<RNE>(self.0.a);
            let b = _mm512_cvtps_ph::<RNE>(self.0.b);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
        }
    }
}

impl Lanes for F16x32 {
    const LANES: usize = 32;
    const SIZE: usize = 2;
    const STREAM_ALIGN: usize = 64;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `first`; 64 bytes are readable.
        unsafe { Self(Pair { a: _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())), b: _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32).cast())) }) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `first`; 64 bytes are writable.
        unsafe {
            _mm256_storeu_si256(p.cast(), _mm512_cvtps_ph::<RNE>(self.0.a));
            _mm256_storeu_si256(p.add(32).cast(), _mm512_cvtps_ph::<RNE>(self.0.b));
        }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const u8, count: usize) -> Self {
        // SAFETY: masked-off lanes are not accessed.
        unsafe { Self::from_bits(_mm512_maskz_loadu_epi16(first(count), p.cast())) }
    }
    #[inline(always)]
    unsafe fn store_part(self, p: *mut u8, count: usize) {
        // SAFETY: masked-off lanes are not accessed.
        unsafe { _mm512_mask_storeu_epi16(p.cast(), first(count), self.to_bits()) }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut u8) {
        // SAFETY: the caller aligns `p` to 64 bytes.
        unsafe { _mm512_stream_si512(p.cast(), self.to_bits()) }
    }
    #[inline(always)]
    unsafe fn canonical(self) -> Self {
        // SAFETY: see the note above `first`.
        unsafe { Self(self.0.canonical()) }
    }
    pair_arith!();
}

/// 32 `bf16` elements: `a` holds the even ones, `b` the odd ones. With
/// `NATIVE`, results are rounded by the AVX512-BF16 conversion.
#[derive(Clone, Copy)]
pub(crate) struct Bf16x32<const NATIVE: bool>(Pair);

impl<const NATIVE: bool> Bf16x32<NATIVE> {
    #[inline(always)]
    unsafe fn from_bits(h: __m512i) -> Self {
        // SAFETY: see the note above `first`.
        unsafe {
            let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
            Self(Pair { a: _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h)), b: _mm512_castsi512_ps(_mm512_and_si512(h, high)) })
        }
    }

    /// Rounds to bf16 and packs back into memory order. NaNs must already
    /// be canonical, except with `NATIVE`, where this makes them so.
    #[inline(always)]
    unsafe fn to_bits(self) -> __m512i {
        if NATIVE {
            // SAFETY: see the note above `first`: `NATIVE` values exist only
            // in `bf16_kernel`, which has DQ and BF16. The transmute
            // reinterprets 512 bits as 512 bits.
            unsafe {
                // One test for the two things the conversion gets wrong:
                // NaN payloads and subnormals (it flushes them to zero).
                const NAN_OR_SUBNORMAL: i32 = 0x01 | 0x80 | 0x20;
                let (a, b) = (self.0.a, self.0.b);
                let awkward = _mm512_fpclass_ps_mask::<NAN_OR_SUBNORMAL>(a) | _mm512_fpclass_ps_mask::<NAN_OR_SUBNORMAL>(b);
                if awkward != 0 {
                    return bf16_bits_by_shifts(self.0.canonical());
                }
                // Evens in the low 16 lanes, odds in the high 16: interleave.
                let packed: __m512i = core::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
                let interleave = _mm512_set_epi16(
                    31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0,
                );
                _mm512_permutexvar_epi16(interleave, packed)
            }
        } else {
            // SAFETY: see the note above `first`.
            unsafe { round_and_pack_bf16(self.0) }
        }
    }
}

/// The rare registers the AVX512-BF16 conversion would get wrong, kept out
/// of line so that the common path runs straight through.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn bf16_bits_by_shifts(pair: Pair) -> __m512i {
    // SAFETY: the caller has AVX-512 F.
    unsafe { round_and_pack_bf16(pair) }
}

/// Rounds even and odd elements to bf16 and packs them back into memory
/// order; NaNs must already be canonical.
#[inline(always)]
unsafe fn round_and_pack_bf16(pair: Pair) -> __m512i {
    // SAFETY: see the note above `first`.
    unsafe {
        let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
        let even = _mm512_srli_epi32::<16>(round_bf16(pair.a));
        let odd = round_bf16(pair.b);
        // even | (odd & high)
        _mm512_ternarylogic_epi32::<0xf8>(even, odd, high)
    }
}

/// Rounds each `f32` lane to bf16 (nearest, ties to even), leaving the
/// result in the upper 16 bits; NaNs must already be canonical, which keeps
/// them NaN. Same arithmetic as `scalar::f32_to_bf16`.
#[inline(always)]
unsafe fn round_bf16(v: __m512) -> __m512i {
    // SAFETY: see the note above `first`.
    unsafe {
        let bits = _mm512_castps_si512(v);
        let lowest_kept = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
        _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lowest_kept)
    }
}

impl<const NATIVE: bool> Lanes for Bf16x32<NATIVE> {
    const LANES: usize = 32;
    const SIZE: usize = 2;
    const STREAM_ALIGN: usize = 64;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `first`; 64 bytes are readable.
        unsafe { Self::from_bits(_mm512_loadu_si512(p.cast())) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `first`; 64 bytes are writable.
        unsafe { _mm512_storeu_si512(p.cast(), self.to_bits()) }
    }
    #[inline(always)]
    unsafe fn load_part(p: *const u8, count: usize) -> Self {
        // SAFETY: masked-off lanes are not accessed.
        unsafe { Self::from_bits(_mm512_maskz_loadu_epi16(first(count), p.cast())) }
    }
    #[inline(always)]
    unsafe fn store_part(self, p: *mut u8, count: usize) {
        // SAFETY: masked-off lanes are not accessed.
        unsafe { _mm512_mask_storeu_epi16(p.cast(), first(count), self.to_bits()) }
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut u8) {
        // SAFETY: the caller aligns `p` to 64 bytes.
        unsafe { _mm512_stream_si512(p.cast(), self.to_bits()) }
    }
    #[inline(always)]
    unsafe fn canonical(self) -> Self {
        if NATIVE {
            // `to_bits` deals with NaNs along with subnormals, in one test.
            self
        } else {
            // SAFETY: see the note above `first`.
            unsafe { Self(self.0.canonical()) }
        }
    }
    pair_arith!();
}

simd::wide_pair!(F16x32, scalar::F16, _mm512_loadu_ps, _mm512_storeu_ps, 64);
simd::wide_pair!(Bf16x32<false>, scalar::Bf16, _mm512_loadu_ps, _mm512_storeu_ps, 64);
