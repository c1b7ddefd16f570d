//! Inputs whose every partial sum is exact, and the exact check of every
//! element of a result against them (whatever the association order).
use tally_engine::reduce::{DataType, ReduceOp};

/// Rank r's input element i: a small integer (|v| <= 2), so every partial
/// sum is exact in f32 and f64; 16-bit types accumulate in f32 and round once,
/// as the reference does (bf16 holds the sums of up to 64 ranks exactly, and
/// rounds larger ones the same way on both sides).
fn value(op: ReduceOp, rank: u32, i: usize) -> i64 {
    match op {
        // Products stay within ±2^6: at most one 2 per element across ranks.
        ReduceOp::Prod => {
            let sign = if (i + rank as usize).is_multiple_of(5) { -1 } else { 1 };
            if (i % 7) as u32 == rank % 7 && rank < 7 {
                2 * sign
            } else {
                sign
            }
        }
        _ => ((i.wrapping_mul(7) + rank as usize * 13) % 5) as i64 - 2,
    }
}

fn put(dtype: DataType, out: &mut [u8], v: f64) {
    match dtype {
        DataType::Float32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::Float64 => out.copy_from_slice(&v.to_le_bytes()),
        DataType::Float16 => out.copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
        DataType::Bfloat16 => out.copy_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
        _ => out.copy_from_slice(&(v as i64).to_le_bytes()[..dtype.size()]),
    }
}

pub(super) fn fill(dtype: DataType, op: ReduceOp, rank: u32, buf: &mut [u8]) {
    let unsigned = matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
    for (i, e) in buf.chunks_exact_mut(dtype.size()).enumerate() {
        let mut v = value(op, rank, i);
        if unsigned {
            v = v.abs();
        }
        put(dtype, e, v as f64);
    }
}

/// [`value`] repeats every `PERIOD` elements (it depends on i mod 5 and,
/// for products, i mod 7), so the reference of element i is that of i mod
/// PERIOD: computed once per check over every rank, then each element is
/// compared. (Over n ranks per element, 512 rank threads checking 64 KiB
/// each would take 4 billion steps.)
const PERIOD: usize = 35;

/// Counts elements of `out` that differ from the exact reference.
pub(super) fn check(dtype: DataType, op: ReduceOp, n: u32, out: &[u8]) -> u64 {
    let size = dtype.size();
    let mut want = vec![0u8; PERIOD * size];
    for (i, w) in want.chunks_exact_mut(size).enumerate() {
        reference(dtype, op, n, i, w);
    }
    out.chunks_exact(size).enumerate().filter(|(i, got)| *got != &want[(i % PERIOD) * size..][..size]).count() as u64
}

/// The exact result of element `i` over `n` ranks, in `dtype`, into `want`.
fn reference(dtype: DataType, op: ReduceOp, n: u32, i: usize, want: &mut [u8]) {
    let unsigned = matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
    let vals = (0..n).map(|r| {
        let v = value(op, r, i);
        if unsigned {
            v.abs()
        } else {
            v
        }
    });
    let exact: i64 = match op {
        ReduceOp::Sum | ReduceOp::Avg => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Max => vals.max().unwrap(),
        ReduceOp::Min => vals.min().unwrap(),
    };
    match (op, dtype) {
        // Averages divide once, in the type the kernels divide in.
        (ReduceOp::Avg, DataType::Float64) => put(dtype, want, exact as f64 / n as f64),
        (ReduceOp::Avg, DataType::Float32 | DataType::Float16 | DataType::Bfloat16) => put(dtype, want, (exact as f32 / n as f32) as f64),
        (ReduceOp::Avg, _) => put(dtype, want, (exact / n as i64) as f64),
        _ => put(dtype, want, exact as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_repeat_every_period() {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg] {
            for rank in [0, 1, 6, 7, 63, 1023] {
                for i in 0..3 * PERIOD {
                    assert_eq!(value(op, rank, i), value(op, rank, i % PERIOD), "{op:?} rank {rank} element {i}");
                }
            }
        }
    }

    #[test]
    fn the_check_finds_each_wrong_element() {
        let (n, count) = (5u32, 1000usize);
        let mut out = vec![0u8; count * 4];
        for (i, e) in out.chunks_exact_mut(4).enumerate() {
            reference(DataType::Float32, ReduceOp::Sum, n, i, e);
        }
        assert_eq!(check(DataType::Float32, ReduceOp::Sum, n, &out), 0);
        out[4 * 777] ^= 1;
        out[4 * 3 + 2] ^= 4;
        assert_eq!(check(DataType::Float32, ReduceOp::Sum, n, &out), 2);
    }
}
