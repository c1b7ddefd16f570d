//! Helpers shared by the `cargo bench` targets in `benches/benches/`
//! (`cargo bench -p tally-benches`, or `make bench`).
//!
//! The benchmarks themselves are divan harnesses, one file per subject:
//! `reduce.rs` (kernels), `wire.rs` (handshake codec, tags), `slab.rs` (slot
//! and region arithmetic) and `shm_roundtrip.rs` (the fabric layer over shm).
use tally_engine::reduce::DataType;

/// A small deterministic generator (xorshift64*), so that every run reduces
/// the same values.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Any non-zero state works; mix the seed so that 0, 1, 2... differ a lot.
        Rng((seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A gradient-like `f32`: finite, either sign, magnitude in [2^-4, 2^4)
    /// (normal in f32, f16 and bf16 alike, so no kernel takes a subnormal
    /// slow path).
    pub fn gradient(&mut self) -> f32 {
        let r = self.next_u64();
        let sign = ((r >> 63) as u32) << 31;
        let exponent = (127 - 4 + (r >> 32) as u32 % 8) << 23;
        let mantissa = (r as u32) & 0x007f_ffff;
        f32::from_bits(sign | exponent | mantissa)
    }
}

/// Fills `buf` (a whole number of `dtype` elements) with gradient-like
/// values of `dtype`, from the stream `seed`. Integer types get random bits.
pub fn fill(dtype: DataType, seed: u64, buf: &mut [u8]) {
    let mut rng = Rng::new(seed);
    match dtype {
        DataType::Float32 => buf.chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&rng.gradient().to_le_bytes())),
        DataType::Float64 => buf.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&f64::from(rng.gradient()).to_le_bytes())),
        DataType::Bfloat16 => {
            buf.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&half::bf16::from_f32(rng.gradient()).to_bits().to_le_bytes()))
        }
        DataType::Float16 => {
            buf.chunks_exact_mut(2).for_each(|c| c.copy_from_slice(&half::f16::from_f32(rng.gradient()).to_bits().to_le_bytes()))
        }
        _ => buf.chunks_mut(8).for_each(|c| {
            let r = rng.next_u64().to_le_bytes();
            c.copy_from_slice(&r[..c.len()])
        }),
    }
}

/// `bytes` in binary units, as the benchmark names show sizes: `256KiB`, `16MiB`, `8B`.
pub fn size_name(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradients_are_normal_in_every_float_type() {
        let mut rng = Rng::new(3);
        for _ in 0..10_000 {
            let g = rng.gradient();
            assert!(g.is_normal() && g.abs() >= 1.0 / 16.0 && g.abs() < 16.0, "{g}");
            assert!(half::f16::from_f32(g).is_normal() && half::bf16::from_f32(g).is_normal());
        }
    }

    #[test]
    fn sizes_are_named_in_binary_units() {
        assert_eq!(size_name(8), "8B");
        assert_eq!(size_name(4096), "4KiB");
        assert_eq!(size_name(256 << 10), "256KiB");
        assert_eq!(size_name(16 << 20), "16MiB");
        assert_eq!(size_name(1000), "1000B");
    }
}
