//! Reduction kernels: the elementwise sum (or product, maximum, minimum, mean)
//! of n equally long buffers, for the ten NCCL data types.
//!
//! A reduction server receives the same chunk from every rank into raw slab
//! slots and combines them into one result that goes back to every rank. This
//! module is that combining step. It works on byte slices (slab slots carry no
//! type) and offers two forms:
//!
//! - the one-pass form, [`Kernels::reduce`] (and [`Kernels::reduce_raw`] for
//!   reducing into the first input's own slot):
//!   `out[i] = op(in_0[i], ..., in_{n-1}[i])`, combined in rank order,
//!   `((in_0 op in_1) op in_2) ...`. Every input is read once and the output
//!   written once; the partial result of a block of elements stays in
//!   registers across all inputs.
//! - the accumulate form, [`Kernels::accumulate`]: `acc = op(acc, in)`, for
//!   when inputs arrive one at a time.
//!
//! # Semantics
//!
//! The result depends only on the inputs and their rank order, never on the
//! instruction set or the host: every kernel gives the bytes the scalar kernel
//! gives, on x86-64 and on aarch64 alike.
//!
//! - `float16` and `bfloat16` are widened to `f32`, combined in `f32` and
//!   rounded to 16 bits once, at the end (round to nearest, ties to even;
//!   overflow gives infinity, subnormals are kept). `float32` combines in
//!   `f32`, `float64` in `f64`. There are no fused multiply-adds and no
//!   flush-to-zero: the kernels assume the default floating-point environment
//!   (round to nearest, no FTZ/DAZ), which is what Rust programs run with.
//! - Integer sum and product wrap around in the element type, as NCCL's do.
//! - `avg` is the sum divided by n. Floats use a true division (not a
//!   multiplication by 1/n, which would round differently); integers divide
//!   the wrapped sum by n, truncating toward zero, as NCCL does.
//! - `max` and `min` are IEEE 754-2019 `maximum` and `minimum`: the result is
//!   NaN if any operand is NaN, and `-0.0 < +0.0`. (C's `fmax`, which returns
//!   the other operand when one is NaN, would hide a diverged rank; a sum
//!   propagates NaN, so max and min do as well.)
//! - Every NaN a kernel writes is the canonical quiet NaN of its type:
//!   sign clear, quiet bit set, payload zero (`f32` `0x7fc0_0000`, `f64`
//!   `0x7ff8_0000_0000_0000`, `f16` `0x7e00`, `bf16` `0x7fc0`). Hardware
//!   chooses NaN payloads by different rules (x86 returns the first operand's,
//!   Arm prefers a signalling NaN's, and compilers may swap the operands of
//!   an addition), so this is what makes NaN results byte-identical too.
//!
//! # The accumulate form and `avg`
//!
//! `accumulate` with [`ReduceOp::Avg`] adds, like `Sum`; after the last input,
//! [`Kernels::finish_avg`] divides by the number of inputs. For 32-bit and
//! 64-bit types `accumulate` from the first input on, followed by
//! `finish_avg`, gives exactly what `reduce` gives. For 16-bit floats the
//! accumulator is the 16-bit buffer itself, so every step rounds: use the
//! one-pass form when all inputs are at hand, or the staged form.
//!
//! # The staged form
//!
//! A server that cannot hold every rank's piece at once folds them in as
//! they come, a few at a time ([`Kernels::fold`], then
//! [`Kernels::finish_fold`] after the last). The accumulator holds
//! [`DataType::accumulator_size`] bytes per element: the element type
//! itself, except `f32` partials for 16-bit floats, rounded once at the end.
//! Either way every element sees the one pass's operations in the same
//! order, so the result is the one pass's, byte for byte.
//!
//! # Choosing an instruction set
//!
//! A [`Kernels`] value is a table of function pointers, one per data type and
//! operation, filled once at start-up: [`Kernels::detect`] takes the best
//! instruction set the CPU has, or the one named by the `TALLY_ISA`
//! environment variable (`scalar`, `avx2`, `avx512`, `avx512bf16`, `neon`,
//! `auto`), for tests and figures. Naming one the CPU lacks is an error, not
//! a silent fallback. Without the standard library, [`Kernels::for_isa`] checks the
//! CPU itself (x86-64: `cpuid`).
//!
//! | instruction set | needs | kernels |
//! |---|---|---|
//! | `scalar` | nothing | portable Rust (what the compiler makes of it) |
//! | `avx2` | AVX2, F16C | hand-written for floats; integers auto-vectorised |
//! | `avx512` | AVX-512 F, BW, VL | as `avx2`, 512-bit, masked tails, streaming stores |
//! | `avx512bf16` | `avx512`, DQ, BF16 | as `avx512`; `bf16` rounded by `vcvtne2ps2bf16` |
//! | `neon` | NEON (aarch64) | hand-written for floats; integers auto-vectorised |
//!
//! The 16-bit conversions are exact everywhere: `f16` uses the hardware
//! conversions (F16C, `fcvtl`/`fcvtn`, which are baseline Armv8 and round to
//! nearest even like the scalar code); `bf16` is widened and rounded with
//! integer shifts, except that `avx512bf16` rounds with the AVX512-BF16
//! conversion, which rounds to nearest even like the shifts do but flushes
//! subnormals to zero: a register holding a subnormal takes the shifts
//! instead. Half-precision *arithmetic* (Arm FP16, AVX512-FP16) is never
//! used: combining in 16 bits would not be the f32 accumulation specified
//! above.
//!
//! Large outputs (at least [`STREAM_MIN_BYTES`]) are written with
//! non-temporal stores on x86-64: the result is not read again by this core,
//! and skipping the read-for-ownership of every output line is what lets a
//! reduction move bytes as fast as `memcpy` does out of cache.
#![allow(clippy::needless_range_loop)]

use core::fmt;

mod scalar;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod simd;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "aarch64")]
mod neon;

mod kernels;

/// Most inputs one reduction takes. [`Kernels::reduce`] gathers the input
/// addresses in an array of this size on the stack (kernels never allocate).
pub const MAX_INPUTS: usize = 1024;

/// Inputs per pass over a tile when a reduce has more ([`Kernels::reduce_raw`]).
/// Chosen with `tally bench reduce --dtype f32 --sizes 256K` (AVX2, the
/// 2-core dev VM), GB/s before -> after tiling: 16 inputs 44.5 -> 67.7, 64
/// inputs 15.6 -> 57.8-62.7, 1024 inputs 9.0 -> 25.8-27.4; 12 inputs and
/// 64 MiB inputs (memory-bound either way) unchanged. Groups of 16 or 32 and
/// tiles of 4 or 32 KiB were slower.
const TILE_GROUP: usize = 8;
/// Output bytes per tile: small enough that the running result stays in L1.
const TILE_BYTES: usize = 16 << 10;

/// Outputs at least this large are written with non-temporal (streaming)
/// stores where the instruction set has them: with the inputs they no longer
/// fit a core's L2, and streaming saves reading every output line before
/// writing it. (Measured on Zen 5: from 1 MiB on streaming is as fast or
/// faster; at 256 KiB it halves the speed, the output being in cache.)
pub const STREAM_MIN_BYTES: usize = 1 << 20;

/// Element types, numbered as NCCL's `ncclDataType_t`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
}

impl DataType {
    /// Every type, in NCCL code order.
    pub const ALL: [DataType; 10] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
    ];

    /// The type with NCCL code `code`, if there is one.
    pub fn from_nccl(code: i32) -> Option<Self> {
        usize::try_from(code).ok().and_then(|i| Self::ALL.get(i).copied())
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// Bytes per element of a staged accumulator ([`Kernels::fold`]):
    /// 4 for the 16-bit floats, which the one pass combines in `f32`; the
    /// element size for every other type.
    pub const fn accumulator_size(self) -> usize {
        match self {
            DataType::Float16 | DataType::Bfloat16 => 4,
            t => t.size(),
        }
    }

    /// Whether this is a 16-bit float, which the server combines in `f32`
    /// and rounds once.
    pub const fn is_half(self) -> bool {
        matches!(self, DataType::Float16 | DataType::Bfloat16)
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DataType::Float16 | DataType::Float32 | DataType::Float64 | DataType::Bfloat16)
    }

    /// The short name: `i8`, `u8`, `i32`, `u32`, `i64`, `u64`, `f16`, `f32`,
    /// `f64`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "i8",
            DataType::Uint8 => "u8",
            DataType::Int32 => "i32",
            DataType::Uint32 => "u32",
            DataType::Int64 => "i64",
            DataType::Uint64 => "u64",
            DataType::Float16 => "f16",
            DataType::Float32 => "f32",
            DataType::Float64 => "f64",
            DataType::Bfloat16 => "bf16",
        }
    }

    /// Parses a short name (`bf16`) or an NCCL-style long one (`bfloat16`,
    /// `float32`, `int8`, `half`, `float`, `double`), ignoring ASCII case.
    pub fn parse(s: &str) -> Option<Self> {
        const ALIASES: [(&str, DataType); 14] = [
            ("int8", DataType::Int8),
            ("char", DataType::Int8),
            ("uint8", DataType::Uint8),
            ("int32", DataType::Int32),
            ("int", DataType::Int32),
            ("uint32", DataType::Uint32),
            ("int64", DataType::Int64),
            ("uint64", DataType::Uint64),
            ("float16", DataType::Float16),
            ("half", DataType::Float16),
            ("float32", DataType::Float32),
            ("float", DataType::Float32),
            ("float64", DataType::Float64),
            ("double", DataType::Float64),
        ];
        let s = s.trim();
        Self::ALL
            .iter()
            .map(|&t| (t.name(), t))
            .chain(ALIASES)
            .chain([("bfloat16", DataType::Bfloat16)])
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
            .map(|(_, t)| t)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reduction operations, numbered as NCCL's `ncclRedOp_t`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl ReduceOp {
    /// Every operation, in NCCL code order.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];

    /// The operation with NCCL code `code`, if there is one. (NCCL's
    /// user-defined operations, codes from `ncclNumOps` on, are not.)
    pub fn from_nccl(code: i32) -> Option<Self> {
        usize::try_from(code).ok().and_then(|i| Self::ALL.get(i).copied())
    }

    /// `sum`, `prod`, `max`, `min` or `avg`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }

    /// Parses a name as [`ReduceOp::name`] writes it, ignoring ASCII case.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        Self::ALL.into_iter().find(|op| op.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Instruction sets that have their own kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, on any target.
    Scalar,
    /// x86-64 AVX2 with F16C.
    Avx2,
    /// x86-64 AVX-512 F, BW and VL.
    Avx512,
    /// `Avx512`, with `bf16` results narrowed by the AVX512-BF16 conversion
    /// (Zen 4 and later, Sapphire Rapids and later): the same bytes, fewer
    /// instructions.
    Avx512Bf16,
    /// aarch64 Advanced SIMD.
    Neon,
}

impl Isa {
    /// Every instruction set, best last within each architecture.
    pub const ALL: [Isa; 5] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Neon];

    /// `scalar`, `avx2`, `avx512`, `avx512bf16` or `neon`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
            Isa::Neon => "neon",
        }
    }

    /// Parses a name as [`Isa::name`] writes it, ignoring ASCII case.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        Self::ALL.into_iter().find(|isa| isa.name().eq_ignore_ascii_case(s))
    }

    /// The CPU features this instruction set's kernels use.
    pub fn requires(self) -> &'static str {
        match self {
            Isa::Scalar => "nothing",
            Isa::Avx2 => "x86-64 with avx2 and f16c",
            Isa::Avx512 => "x86-64 with avx512f, avx512bw and avx512vl",
            Isa::Avx512Bf16 => "x86-64 with avx512f, avx512bw, avx512vl, avx512dq and avx512bf16",
            Isa::Neon => "aarch64 with neon",
        }
    }

    /// Whether this CPU can run this instruction set's kernels.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 => x86::has(self),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => neon::available(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The best instruction set this CPU has.
    pub fn best() -> Isa {
        [Isa::Avx512Bf16, Isa::Avx512, Isa::Avx2, Isa::Neon].into_iter().find(|isa| isa.is_available()).unwrap_or(Isa::Scalar)
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The instruction sets this CPU can run, scalar first and best last.
#[cfg(feature = "std")]
pub fn available_isas() -> std::vec::Vec<Isa> {
    Isa::ALL.into_iter().filter(|isa| isa.is_available()).collect()
}

/// Why a set of kernels could not be had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsaError {
    /// The name (from `TALLY_ISA`) is no instruction set tally knows.
    UnknownName,
    /// This CPU cannot run that instruction set.
    Unavailable(Isa),
}

impl fmt::Display for IsaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IsaError::UnknownName => {
                f.write_str("unknown instruction set name (TALLY_ISA takes scalar, avx2, avx512, avx512bf16, neon or auto)")
            }
            IsaError::Unavailable(isa) => write!(f, "instruction set {isa} is not available on this CPU (it needs {})", isa.requires()),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for IsaError {}

/// Why a reduction was refused. Nothing is written when one is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceError {
    /// No inputs were given.
    NoInputs,
    /// More than [`MAX_INPUTS`] inputs were given.
    TooManyInputs,
    /// The buffers are not all the same length.
    LengthMismatch,
    /// A buffer's length is not a whole number of elements.
    PartialElement,
    /// `finish_avg` was asked to divide by zero, or by more than `u32::MAX`.
    BadCount,
}

impl fmt::Display for ReduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceError::NoInputs => "no inputs to reduce",
            ReduceError::TooManyInputs => "too many inputs to reduce (more than MAX_INPUTS)",
            ReduceError::LengthMismatch => "reduction buffers differ in length",
            ReduceError::PartialElement => "reduction buffer length is not a multiple of the element size",
            ReduceError::BadCount => "average over zero inputs, or over more than u32::MAX",
        })
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ReduceError {}

/// One kernel: reduces `inputs` (each `elems` elements, none empty) into
/// `out`; `divisor` is what `avg` divides by.
///
/// # Safety
/// Every input is valid for reading `elems` elements and `out` for writing
/// them; `out` overlaps no input, except that it may be exactly `inputs[0]`;
/// `inputs` is not empty; the CPU has the kernel's instruction set.
pub(crate) type Kernel = unsafe fn(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32);

/// Kernels indexed by `[DataType as usize][ReduceOp as usize]`.
pub(crate) type Table = [[Kernel; 5]; 10];

/// A widening fold of 16-bit floats into `f32` partials (`scalar::fold_wide`).
pub(crate) type FoldWide = unsafe fn(acc: *mut u8, resume: bool, inputs: &[*const u8], elems: usize);
/// Rounds `f32` partials to 16 bits (`scalar::narrow_wide`).
pub(crate) type NarrowWide = unsafe fn(out: *mut u8, acc: *const u8, elems: usize, divisor: u32);

/// The staged form's kernels for 16-bit floats, indexed by
/// `[0 for f16, 1 for bf16][ReduceOp as usize]`.
pub(crate) struct WideTable {
    pub(crate) fold: [[FoldWide; 5]; 2],
    pub(crate) narrow: [[NarrowWide; 5]; 2],
}

/// Builds a [`WideTable`] from a fold and a narrowing kernel, each generic
/// over a type for the 16-bit storage (a scalar element or a SIMD register
/// of them) and the [`OpKind`].
macro_rules! wide_table {
    ($fold:ident, $narrow:ident, f16: $f16:ty, bf16: $bf16:ty) => {{
        use $crate::reduce::{Avg, Max, Min, Prod, Sum};
        macro_rules! row {
            ($k:ident, $t:ty, $ty:ty) => {
                [$k::<$t, Sum> as $ty, $k::<$t, Prod>, $k::<$t, Max>, $k::<$t, Min>, $k::<$t, Avg>]
            };
        }
        $crate::reduce::WideTable {
            fold: [row!($fold, $f16, $crate::reduce::FoldWide), row!($fold, $bf16, $crate::reduce::FoldWide)],
            narrow: [row!($narrow, $f16, $crate::reduce::NarrowWide), row!($narrow, $bf16, $crate::reduce::NarrowWide)],
        }
    }};
}
pub(crate) use wide_table;

/// The operations as types, so each kernel is compiled for exactly one and
/// the choice costs nothing inside the loop.
pub(crate) trait OpKind {
    const OP: ReduceOp;
}

pub(crate) struct Sum;
pub(crate) struct Prod;
pub(crate) struct Max;
pub(crate) struct Min;
pub(crate) struct Avg;

impl OpKind for Sum {
    const OP: ReduceOp = ReduceOp::Sum;
}
impl OpKind for Prod {
    const OP: ReduceOp = ReduceOp::Prod;
}
impl OpKind for Max {
    const OP: ReduceOp = ReduceOp::Max;
}
impl OpKind for Min {
    const OP: ReduceOp = ReduceOp::Min;
}
impl OpKind for Avg {
    const OP: ReduceOp = ReduceOp::Avg;
}

/// Builds a [`Table`]: `$int` names the kernel for the integer rows,
/// generic over the element type and the [`OpKind`]; each float row names
/// its kernel and storage type, the kernel generic over both in that order.
macro_rules! kernel_table {
    (int: $int:ident,
     f16: $kf16:ident<$f16:ty>, f32: $kf32:ident<$f32:ty>,
     f64: $kf64:ident<$f64:ty>, bf16: $kbf16:ident<$bf16:ty>) => {{
        use $crate::reduce::{Avg, Max, Min, Prod, Sum};
        macro_rules! row {
            ($k:ident, $t:ty) => {
                [$k::<$t, Sum> as $crate::reduce::Kernel, $k::<$t, Prod>, $k::<$t, Max>, $k::<$t, Min>, $k::<$t, Avg>]
            };
        }
        [
            row!($int, i8),
            row!($int, u8),
            row!($int, i32),
            row!($int, u32),
            row!($int, i64),
            row!($int, u64),
            row!($kf16, $f16),
            row!($kf32, $f32),
            row!($kf64, $f64),
            row!($kbf16, $bf16),
        ]
    }};
}
pub(crate) use kernel_table;

/// A set of kernels for one instruction set: a table of function pointers,
/// chosen once. Cheap to copy.
#[derive(Clone, Copy)]
pub struct Kernels {
    isa: Isa,
    table: &'static Table,
    wide: &'static WideTable,
}

impl fmt::Debug for Kernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernels").field("isa", &self.isa).finish()
    }
}

/// Bit patterns of the canonical quiet NaNs every kernel writes.
pub mod canonical_nan {
    pub const F16: u16 = 0x7e00;
    pub const BF16: u16 = 0x7fc0;
    pub const F32: u32 = 0x7fc0_0000;
    pub const F64: u64 = 0x7ff8_0000_0000_0000;
}
