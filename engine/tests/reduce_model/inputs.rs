//! Random inputs for the kernel tests: ordinary values sized to the
//! operation, and the bit patterns that make kernels slip.

use crate::Rng;
use tally_engine::reduce::{DataType, ReduceOp};

/// Bit patterns that make kernels slip: NaNs with payloads (quiet,
/// signalling, negative), infinities, signed zeros, subnormals, extremes.
pub fn special_f32(rng: &mut Rng) -> f32 {
    const BITS: [u32; 16] = [
        0x7fc0_0000,
        0xffc0_0000,
        0x7f80_0001,
        0x7fa5_a5a5,
        0xffff_ffff,
        0x7f80_0000,
        0xff80_0000,
        0x0000_0000,
        0x8000_0000,
        0x0000_0001,
        0x8000_0001,
        0x007f_ffff,
        0x0080_0000,
        0x7f7f_ffff,
        0xff7f_ffff,
        0x3380_0000,
    ];
    match rng.below(3) {
        0 => f32::from_bits(BITS[rng.below(BITS.len())]),
        1 => f32::from_bits(rng.next() as u32),
        // f16-subnormal territory, or around the f16 overflow threshold.
        _ => {
            let sign = rng.next() as u32 & 0x8000_0000;
            let magnitude =
                if rng.chance(0.5) { 0x3300_0000 + rng.below(0x0600_0000) as u32 } else { 0x477f_0000 + rng.below(0x0002_0000) as u32 };
            f32::from_bits(sign | magnitude)
        }
    }
}

/// An ordinary value whose size suits the operation (products of many
/// inputs must not always overflow).
pub fn ordinary(rng: &mut Rng, op: ReduceOp) -> f64 {
    let mantissa = 1.0 + (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
    let sign = if rng.chance(0.5) { -1.0 } else { 1.0 };
    let exponent = match op {
        ReduceOp::Prod => rng.below(3) as i32 - 1,
        _ => rng.below(16) as i32 - 8,
    };
    sign * mantissa * 2f64.powi(exponent)
}

/// `len` random elements of `dtype` into `out`; about `special` of the float
/// elements are special values.
pub fn fill(rng: &mut Rng, dtype: DataType, op: ReduceOp, special: f64, out: &mut [u8]) {
    use DataType::*;
    if !dtype.is_float() {
        return rng.bytes(out);
    }
    let size = dtype.size();
    for element in out.chunks_exact_mut(size) {
        let f = if rng.chance(special) {
            match dtype {
                // Any 16-bit pattern is fair game, as are the f32 ones rounded.
                Float16 | Bfloat16 if rng.chance(0.5) => {
                    element.copy_from_slice(&(rng.next() as u16).to_ne_bytes());
                    continue;
                }
                Float64 if rng.chance(0.5) => {
                    element.copy_from_slice(&rng.next().to_ne_bytes());
                    continue;
                }
                _ => f64::from(special_f32(rng)),
            }
        } else {
            ordinary(rng, op)
        };
        let bits: Vec<u8> = match dtype {
            Float16 => half::f16::from_f64(f).to_bits().to_ne_bytes().to_vec(),
            Bfloat16 => half::bf16::from_f64(f).to_bits().to_ne_bytes().to_vec(),
            Float32 => (f as f32).to_ne_bytes().to_vec(),
            _ => f.to_ne_bytes().to_vec(),
        };
        element.copy_from_slice(&bits);
    }
}
