//! aarch64 Advanced SIMD (NEON) kernels, for Graviton.
//!
//! `vmaxq`/`vminq` (FMAX/FMIN) already are IEEE 754-2019 maximum and
//! minimum, so only NaN canonicalisation is added. There are no streaming
//! stores: Arm cores detect whole-line writes and skip the line fill
//! themselves.
//!
//! 16-bit floats are widened to `f32`, 8 to a 16-byte load. `f16` uses
//! FCVTL/FCVTN, which are baseline Armv8 (no FP16 extension needed) and
//! round to nearest even under the default FPCR; their intrinsics need the
//! unstable `f16` type, so they are written as inline assembly. `bf16` is
//! widened by shifts (even elements of each 32-bit pair in one register, odd
//! ones in the other) and rounded with integer arithmetic, like the scalar
//! code; the BF16 extension's conversions are not stable in Rust either.
//!
//! The integer types use the portable kernels compiled for NEON.

use core::arch::aarch64::*;
use core::arch::asm;

use super::scalar::{self, Element};
use super::simd::{self, Lanes};
use super::{canonical_nan, kernel_table, OpKind, Table};

/// Whether this CPU has NEON (every aarch64 Linux machine does).
pub(crate) fn available() -> bool {
    #[cfg(feature = "std")]
    {
        std::arch::is_aarch64_feature_detected!("neon")
    }
    #[cfg(not(feature = "std"))]
    {
        cfg!(target_feature = "neon")
    }
}

pub(crate) static TABLE: Table = kernel_table!(
    int: int_kernel,
    f16: float_kernel<F16x8>, f32: float_kernel<F32x4>,
    f64: float_kernel<F64x2>, bf16: float_kernel<Bf16x8>
);

simd::wide_kernels!("neon", "NEON", f16: F16x8, bf16: Bf16x8);

/// # Safety
/// As for [`super::Kernel`]: the CPU has NEON.
#[target_feature(enable = "neon")]
unsafe fn int_kernel<E: Element, O: OpKind>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    // SAFETY: the caller upholds the kernel contract.
    unsafe { scalar::reduce::<E, O>(out, inputs, elems, divisor) }
}

/// # Safety
/// As for [`super::Kernel`]: the CPU has NEON.
#[target_feature(enable = "neon")]
unsafe fn float_kernel<L: Lanes, O: OpKind>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    // SAFETY: the caller upholds the kernel contract and has NEON.
    unsafe { simd::reduce::<L, O, 8>(out, inputs, elems, divisor) }
}

// Every `unsafe` block below runs inside `float_kernel`, which is compiled
// with, and only called on CPUs with, NEON: that is why the intrinsics are
// sound. Memory accesses are further covered by the `Lanes` method
// contracts, which `simd` upholds; loads and stores go through bytes, which
// need no alignment.

#[derive(Clone, Copy)]
pub(crate) struct F32x4(float32x4_t);

#[inline(always)]
unsafe fn canonical_f32(v: float32x4_t) -> float32x4_t {
    // SAFETY: see the note above `F32x4`.
    unsafe {
        let nan = vreinterpretq_f32_u32(vdupq_n_u32(canonical_nan::F32));
        // A NaN is the one value unequal to itself.
        vbslq_f32(vceqq_f32(v, v), v, nan)
    }
}

impl Lanes for F32x4 {
    const LANES: usize = 4;
    const SIZE: usize = 4;
    const STREAM_ALIGN: usize = 0;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vreinterpretq_f32_u8(vld1q_u8(p))) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `F32x4`.
        unsafe { vst1q_u8(p, vreinterpretq_u8_f32(self.0)) }
    }
    #[inline(always)]
    unsafe fn add(self, x: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vaddq_f32(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn mul(self, x: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vmulq_f32(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn max(self, x: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vmaxq_f32(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vminq_f32(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn divisor(divisor: u32) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vdupq_n_f32(divisor as f32)) }
    }
    #[inline(always)]
    unsafe fn div(self, divisor: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vdivq_f32(self.0, divisor.0)) }
    }
    #[inline(always)]
    unsafe fn canonical(self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(canonical_f32(self.0)) }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct F64x2(float64x2_t);

impl Lanes for F64x2 {
    const LANES: usize = 2;
    const SIZE: usize = 8;
    const STREAM_ALIGN: usize = 0;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vreinterpretq_f64_u8(vld1q_u8(p))) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `F32x4`.
        unsafe { vst1q_u8(p, vreinterpretq_u8_f64(self.0)) }
    }
    #[inline(always)]
    unsafe fn add(self, x: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vaddq_f64(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn mul(self, x: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vmulq_f64(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn max(self, x: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vmaxq_f64(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn min(self, x: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vminq_f64(self.0, x.0)) }
    }
    #[inline(always)]
    unsafe fn divisor(divisor: u32) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vdupq_n_f64(divisor as f64)) }
    }
    #[inline(always)]
    unsafe fn div(self, divisor: Self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe { Self(vdivq_f64(self.0, divisor.0)) }
    }
    #[inline(always)]
    unsafe fn canonical(self) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe {
            let nan = vreinterpretq_f64_u64(vdupq_n_u64(canonical_nan::F64));
            Self(vbslq_f64(vceqq_f64(self.0, self.0), self.0, nan))
        }
    }
}

/// 8 widened 16-bit floats in two `f32` registers; only how they are loaded
/// and stored differs between `f16` and `bf16`.
#[derive(Clone, Copy)]
pub(crate) struct Pair {
    a: float32x4_t,
    b: float32x4_t,
}

impl Pair {
    #[inline(always)]
    fn map(self, x: Self, f: impl Fn(float32x4_t, float32x4_t) -> float32x4_t) -> Self {
        Pair { a: f(self.a, x.a), b: f(self.b, x.b) }
    }
}

/// Arithmetic shared by the two 16-bit storage types.
macro_rules! pair_arith {
    () => {
        #[inline(always)]
        unsafe fn add(self, x: Self) -> Self {
            // SAFETY: see the note above `F32x4`.
            unsafe { Self(self.0.map(x.0, |a, b| vaddq_f32(a, b))) }
        }
        #[inline(always)]
        unsafe fn mul(self, x: Self) -> Self {
            // SAFETY: see the note above `F32x4`.
            unsafe { Self(self.0.map(x.0, |a, b| vmulq_f32(a, b))) }
        }
        #[inline(always)]
        unsafe fn max(self, x: Self) -> Self {
            // SAFETY: see the note above `F32x4`.
            unsafe { Self(self.0.map(x.0, |a, b| vmaxq_f32(a, b))) }
        }
        #[inline(always)]
        unsafe fn min(self, x: Self) -> Self {
            // SAFETY: see the note above `F32x4`.
            unsafe { Self(self.0.map(x.0, |a, b| vminq_f32(a, b))) }
        }
        #[inline(always)]
        unsafe fn divisor(divisor: u32) -> Self {
            // SAFETY: see the note above `F32x4`.
            let d = unsafe { vdupq_n_f32(divisor as f32) };
            Self(Pair { a: d, b: d })
        }
        #[inline(always)]
        unsafe fn div(self, divisor: Self) -> Self {
            // SAFETY: see the note above `F32x4`.
            unsafe { Self(self.0.map(divisor.0, |a, b| vdivq_f32(a, b))) }
        }
        #[inline(always)]
        unsafe fn canonical(self) -> Self {
            // SAFETY: see the note above `F32x4`.
            unsafe { Self(Pair { a: canonical_f32(self.0.a), b: canonical_f32(self.0.b) }) }
        }
    };
}

/// 8 `f16` elements: `a` holds elements 0-3, `b` 4-7.
#[derive(Clone, Copy)]
pub(crate) struct F16x8(Pair);

impl Lanes for F16x8 {
    const LANES: usize = 8;
    const SIZE: usize = 2;
    const STREAM_ALIGN: usize = 0;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        let a: float32x4_t;
        let b: float32x4_t;
        // SAFETY: see the note above `F32x4`. FCVTL/FCVTL2 only read and
        // write the named vector registers; `a` is an `out` operand, so it
        // is not allocated to `h`, which the second instruction still reads.
        unsafe {
            let h = vld1q_u8(p);
            asm!(
                "fcvtl {a:v}.4s, {h:v}.4h",
                "fcvtl2 {b:v}.4s, {h:v}.8h",
                h = in(vreg) h,
                a = out(vreg) a,
                b = lateout(vreg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        Self(Pair { a, b })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        let h: uint8x16_t;
        // SAFETY: see the note above `F32x4`. FCVTN writes the low half of
        // `h`, FCVTN2 the high half; `h` is an `out` operand, so it is not
        // allocated to `b`, which the second instruction still reads.
        unsafe {
            asm!(
                "fcvtn {h:v}.4h, {a:v}.4s",
                "fcvtn2 {h:v}.8h, {b:v}.4s",
                a = in(vreg) self.0.a,
                b = in(vreg) self.0.b,
                h = out(vreg) h,
                options(pure, nomem, nostack, preserves_flags),
            );
            vst1q_u8(p, h);
        }
    }
    pair_arith!();
}

/// 8 `bf16` elements: `a` holds the even ones, `b` the odd ones.
#[derive(Clone, Copy)]
pub(crate) struct Bf16x8(Pair);

/// Rounds each `f32` lane to bf16 (nearest, ties to even), leaving the
/// result in the upper 16 bits; NaNs must already be canonical, which keeps
/// them NaN. Same arithmetic as `scalar::f32_to_bf16`.
#[inline(always)]
unsafe fn round_bf16(v: float32x4_t) -> uint32x4_t {
    // SAFETY: see the note above `F32x4`.
    unsafe {
        let bits = vreinterpretq_u32_f32(v);
        let lowest_kept = vandq_u32(vshrq_n_u32::<16>(bits), vdupq_n_u32(1));
        vaddq_u32(vaddq_u32(bits, vdupq_n_u32(0x7fff)), lowest_kept)
    }
}

impl Lanes for Bf16x8 {
    const LANES: usize = 8;
    const SIZE: usize = 2;
    const STREAM_ALIGN: usize = 0;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: see the note above `F32x4`.
        unsafe {
            let h = vreinterpretq_u32_u8(vld1q_u8(p));
            Self(Pair { a: vreinterpretq_f32_u32(vshlq_n_u32::<16>(h)), b: vreinterpretq_f32_u32(vandq_u32(h, vdupq_n_u32(0xffff_0000))) })
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: see the note above `F32x4`.
        unsafe {
            // Shift the even results down into the odd results' low halves.
            let h = vsriq_n_u32::<16>(round_bf16(self.0.b), round_bf16(self.0.a));
            vst1q_u8(p, vreinterpretq_u8_u32(h));
        }
    }
    pair_arith!();
}

simd::wide_pair!(F16x8, scalar::F16, vld1q_f32, vst1q_f32, 16);
simd::wide_pair!(Bf16x8, scalar::Bf16, vld1q_f32, vst1q_f32, 16);
