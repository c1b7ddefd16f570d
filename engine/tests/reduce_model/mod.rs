//! The reference the kernels are compared with: elements decoded into
//! `i128` or `f64`, combined one step at a time and rounded to the type's
//! combining precision after each (`reference`), and the random inputs that
//! exercise it (`inputs`). Written independently of the kernels.

pub mod inputs;

use tally_engine::reduce::{canonical_nan, DataType, ReduceOp};

/// A decoded element: integers as `i128`, floats as `f64` (exact for every
/// type here).
#[derive(Clone, Copy, Debug)]
pub enum Value {
    Int(i128),
    Float(f64),
}

pub fn decode(dtype: DataType, b: &[u8]) -> Value {
    use DataType::*;
    let a2 = || [b[0], b[1]];
    let a4 = || [b[0], b[1], b[2], b[3]];
    let a8 = || b[..8].try_into().unwrap();
    match dtype {
        Int8 => Value::Int(i128::from(b[0] as i8)),
        Uint8 => Value::Int(i128::from(b[0])),
        Int32 => Value::Int(i128::from(i32::from_ne_bytes(a4()))),
        Uint32 => Value::Int(i128::from(u32::from_ne_bytes(a4()))),
        Int64 => Value::Int(i128::from(i64::from_ne_bytes(a8()))),
        Uint64 => Value::Int(i128::from(u64::from_ne_bytes(a8()))),
        Float16 => Value::Float(f64::from(half::f16::from_bits(u16::from_ne_bytes(a2())).to_f32())),
        Bfloat16 => Value::Float(f64::from(half::bf16::from_bits(u16::from_ne_bytes(a2())).to_f32())),
        Float32 => Value::Float(f64::from(f32::from_ne_bytes(a4()))),
        Float64 => Value::Float(f64::from_ne_bytes(a8())),
    }
}

pub fn encode(dtype: DataType, v: Value, out: &mut [u8]) {
    use DataType::*;
    match (dtype, v) {
        (Int8 | Uint8, Value::Int(i)) => out[0] = i as u8,
        (Int32 | Uint32, Value::Int(i)) => out.copy_from_slice(&(i as u32).to_ne_bytes()),
        (Int64 | Uint64, Value::Int(i)) => out.copy_from_slice(&(i as u64).to_ne_bytes()),
        (Float16, Value::Float(f)) => {
            let h = if f.is_nan() { canonical_nan::F16 } else { half::f16::from_f32(f as f32).to_bits() };
            out.copy_from_slice(&h.to_ne_bytes())
        }
        (Bfloat16, Value::Float(f)) => {
            let h = if f.is_nan() { canonical_nan::BF16 } else { half::bf16::from_f32(f as f32).to_bits() };
            out.copy_from_slice(&h.to_ne_bytes())
        }
        (Float32, Value::Float(f)) => {
            let x = if f.is_nan() { canonical_nan::F32 } else { (f as f32).to_bits() };
            out.copy_from_slice(&x.to_ne_bytes())
        }
        (Float64, Value::Float(f)) => {
            let x = if f.is_nan() { canonical_nan::F64 } else { f.to_bits() };
            out.copy_from_slice(&x.to_ne_bytes())
        }
        _ => unreachable!("{dtype} with {v:?}"),
    }
}

/// Wraps an integer to the element type's range, as the hardware would.
pub fn wrap(dtype: DataType, i: i128) -> i128 {
    use DataType::*;
    match dtype {
        Int8 => i128::from(i as i8),
        Uint8 => i128::from(i as u8),
        Int32 => i128::from(i as i32),
        Uint32 => i128::from(i as u32),
        Int64 => i128::from(i as i64),
        Uint64 => i128::from(i as u64),
        _ => unreachable!(),
    }
}

/// Rounds to the precision floats of this type are combined in.
pub fn round_combining(dtype: DataType, f: f64) -> f64 {
    if dtype == DataType::Float64 {
        f
    } else {
        f64::from(f as f32)
    }
}

/// IEEE 754-2019 maximum (`greater`) or minimum, written independently of
/// the kernels: NaN wins, then zeros by sign, then by value.
pub fn extreme(a: f64, b: f64, greater: bool) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == 0.0 && b == 0.0 {
        let positive = if greater { a.is_sign_positive() || b.is_sign_positive() } else { a.is_sign_positive() && b.is_sign_positive() };
        if positive {
            0.0
        } else {
            -0.0
        }
    } else if greater {
        a.max(b)
    } else {
        a.min(b)
    }
}

pub fn combine(dtype: DataType, op: ReduceOp, acc: Value, x: Value) -> Value {
    match (acc, x) {
        (Value::Int(a), Value::Int(x)) => Value::Int(wrap(
            dtype,
            match op {
                ReduceOp::Sum | ReduceOp::Avg => a + x,
                ReduceOp::Prod => a.wrapping_mul(x),
                ReduceOp::Max => a.max(x),
                ReduceOp::Min => a.min(x),
            },
        )),
        (Value::Float(a), Value::Float(x)) => Value::Float(round_combining(
            dtype,
            match op {
                ReduceOp::Sum | ReduceOp::Avg => a + x,
                ReduceOp::Prod => a * x,
                ReduceOp::Max => extreme(a, x, true),
                ReduceOp::Min => extreme(a, x, false),
            },
        )),
        _ => unreachable!(),
    }
}

pub fn divide(dtype: DataType, v: Value, n: usize) -> Value {
    match v {
        Value::Int(i) => Value::Int(wrap(dtype, i / n as i128)),
        Value::Float(f) => Value::Float(round_combining(dtype, f / n as f64)),
    }
}

/// The expected bytes of `op` over `inputs`, element by element.
pub fn reference(dtype: DataType, op: ReduceOp, inputs: &[&[u8]], out: &mut [u8]) {
    let size = dtype.size();
    for (i, out) in out.chunks_exact_mut(size).enumerate() {
        let element = |input: &&[u8]| decode(dtype, &input[i * size..]);
        let mut acc = element(&inputs[0]);
        for input in &inputs[1..] {
            acc = combine(dtype, op, acc, element(input));
        }
        if op == ReduceOp::Avg {
            acc = divide(dtype, acc, inputs.len());
        }
        encode(dtype, acc, out);
    }
}
