//! Which x86-64 instruction sets this CPU (and its operating system) offers.
//!
//! With `std` the standard library's cached detection answers. Without it,
//! `cpuid` and `xgetbv` are asked directly: a CPU feature is usable only if
//! the OS also saves the registers it uses, which `xgetbv` reports.

// The AVX-512 intrinsics and feature names are stable from Rust 1.89 on,
// which is therefore this crate's real minimum on x86-64.
#![allow(clippy::incompatible_msrv)]

use core::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};

use super::Isa;

/// Whether this CPU can run `isa`'s kernels.
pub(crate) fn has(isa: Isa) -> bool {
    #[cfg(feature = "std")]
    {
        use std::is_x86_feature_detected as detected;
        let avx2 = detected!("avx2") && detected!("f16c");
        let avx512 = avx2 && detected!("avx512f") && detected!("avx512bw") && detected!("avx512vl");
        match isa {
            Isa::Avx2 => avx2,
            Isa::Avx512 => avx512,
            Isa::Avx512Bf16 => avx512 && detected!("avx512dq") && detected!("avx512bf16"),
            _ => false,
        }
    }
    #[cfg(not(feature = "std"))]
    {
        has_by_cpuid(isa)
    }
}

/// [`has`], asking `cpuid` and `xgetbv` directly.
#[cfg_attr(feature = "std", allow(dead_code))]
pub(crate) fn has_by_cpuid(isa: Isa) -> bool {
    const OSXSAVE: u32 = 1 << 27;
    const AVX: u32 = 1 << 28;
    const F16C: u32 = 1 << 29;
    const AVX2: u32 = 1 << 5;
    const AVX512F: u32 = 1 << 16;
    const AVX512DQ: u32 = 1 << 17;
    const AVX512BW: u32 = 1 << 30;
    const AVX512VL: u32 = 1 << 31;
    // Leaf 7, sub-leaf 1, EAX.
    const AVX512_BF16: u32 = 1 << 5;
    // XCR0: SSE and AVX state; then opmask, upper ZMM0-15 and ZMM16-31.
    const YMM_STATE: u64 = 0b110;
    const ZMM_STATE: u64 = 0b1110_0000;

    if __cpuid(0).eax < 7 {
        return false;
    }
    let leaf1 = __cpuid(1).ecx;
    if leaf1 & (OSXSAVE | AVX | F16C) != (OSXSAVE | AVX | F16C) {
        return false;
    }
    // SAFETY: OSXSAVE (checked above) means the OS enabled XSAVE, which makes
    // `xgetbv` available.
    let xcr0 = unsafe { xcr0() };
    let leaf7 = __cpuid_count(7, 0);
    let all = |bits: u32| leaf7.ebx & bits == bits;
    let avx2 = xcr0 & YMM_STATE == YMM_STATE && all(AVX2);
    let avx512 = avx2 && xcr0 & ZMM_STATE == ZMM_STATE && all(AVX512F | AVX512BW | AVX512VL);
    match isa {
        Isa::Avx2 => avx2,
        Isa::Avx512 => avx512,
        Isa::Avx512Bf16 => {
            // Sub-leaf 1 exists when sub-leaf 0's EAX (the last sub-leaf) says so.
            let bf16 = leaf7.eax >= 1 && __cpuid_count(7, 1).eax & AVX512_BF16 != 0;
            avx512 && all(AVX512DQ) && bf16
        }
        _ => false,
    }
}

/// Reads XCR0, the register-state components the OS saves.
///
/// # Safety
/// The CPU supports XSAVE and the OS enabled it (CPUID.1:ECX.OSXSAVE).
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked OSXSAVE.
    unsafe { _xgetbv(0) }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    #[test]
    fn cpuid_agrees_with_std_detection() {
        for isa in [Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16] {
            assert_eq!(has_by_cpuid(isa), has(isa), "{isa}");
        }
    }
}
