//! The ring tests' inputs and reference: rank r's element i of each type
//! and operation (`input_value`, `fill`), the exact expected result
//! (`expected`) and the check of every element (`check`).

use half::{bf16, f16};
use tally_engine::reduce::{DataType, ReduceOp};

pub fn is_unsigned(d: DataType) -> bool {
    matches!(d, DataType::Uint8 | DataType::Uint32 | DataType::Uint64)
}

/// Rank r's input element i: a small integer, chosen so that every partial
/// result of n <= 4 inputs is exact in every type.
pub fn input_value(d: DataType, op: ReduceOp, r: usize, i: usize) -> f64 {
    let h = i.wrapping_mul(7).wrapping_add(r.wrapping_mul(5)).wrapping_add(3);
    match (op, is_unsigned(d)) {
        (ReduceOp::Prod, false) => [1.0, 2.0, -1.0, -2.0, 0.0][(i + 3 * r) % 5],
        (ReduceOp::Prod, true) => [1.0, 2.0, 1.0, 0.0][(i + r) % 4],
        (_, false) => (h % 17) as f64 - 8.0,
        (_, true) => (h % 16) as f64,
    }
}

/// Writes `v` (exactly representable, or to be rounded once) as element i.
pub fn encode(d: DataType, v: f64, out: &mut [u8]) {
    match d {
        DataType::Int8 => out.copy_from_slice(&(v as i8).to_le_bytes()),
        DataType::Uint8 => out.copy_from_slice(&(v as u8).to_le_bytes()),
        DataType::Int32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
        DataType::Uint32 => out.copy_from_slice(&(v as u32).to_le_bytes()),
        DataType::Int64 => out.copy_from_slice(&(v as i64).to_le_bytes()),
        DataType::Uint64 => out.copy_from_slice(&(v as u64).to_le_bytes()),
        DataType::Float16 => out.copy_from_slice(&f16::from_f64(v).to_bits().to_le_bytes()),
        DataType::Bfloat16 => out.copy_from_slice(&bf16::from_f64(v).to_bits().to_le_bytes()),
        DataType::Float32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::Float64 => out.copy_from_slice(&v.to_le_bytes()),
    }
}

pub fn decode(d: DataType, b: &[u8]) -> f64 {
    match d {
        DataType::Int8 => i8::from_le_bytes([b[0]]) as f64,
        DataType::Uint8 => b[0] as f64,
        DataType::Int32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::Uint32 => u32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::Int64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::Uint64 => u64::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::Float16 => f16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).to_f64(),
        DataType::Bfloat16 => bf16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).to_f64(),
        DataType::Float32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::Float64 => f64::from_le_bytes(b.try_into().unwrap()),
    }
}

pub fn fill(d: DataType, op: ReduceOp, rank: usize, count: usize) -> Vec<u8> {
    let es = d.size();
    let mut buf = vec![0u8; count * es];
    for (i, e) in buf.chunks_exact_mut(es).enumerate() {
        encode(d, input_value(d, op, rank, i), e);
    }
    buf
}

/// The expected element i, combined in rank order in f64 (exact for these
/// inputs) and rounded once to the type. Integer avg divides the sum,
/// truncating, as the kernels define it.
pub fn expected(d: DataType, op: ReduceOp, n: usize, i: usize) -> f64 {
    let mut acc = input_value(d, op, 0, i);
    for r in 1..n {
        let x = input_value(d, op, r, i);
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc + x,
            ReduceOp::Prod => acc * x,
            ReduceOp::Max => acc.max(x),
            ReduceOp::Min => acc.min(x),
        };
    }
    if op == ReduceOp::Avg {
        acc = if d.is_float() { acc / n as f64 } else { (acc as i64 / n as i64) as f64 };
    }
    acc
}

/// Compares every element bit for bit; panics with the first few mismatches.
pub fn check(what: &str, d: DataType, op: ReduceOp, n: usize, got: &[u8]) {
    let es = d.size();
    let mut want = [0u8; 8];
    let mut bad = Vec::new();
    let mut wrong = 0usize;
    for (i, g) in got.chunks_exact(es).enumerate() {
        let v = expected(d, op, n, i);
        encode(d, v, &mut want[..es]);
        if g != &want[..es] {
            wrong += 1;
            if bad.len() < 5 {
                bad.push(format!("[{i}] got {} ({g:02x?}) want {v} ({:02x?})", decode(d, g), &want[..es]));
            }
        }
    }
    assert!(wrong == 0, "{what}: {wrong} of {} elements wrong: {}", got.len() / es, bad.join("; "));
}
