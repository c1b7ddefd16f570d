//! The loop every SIMD float kernel shares. An instruction set supplies, per
//! storage type, a [`Lanes`]: a register (or a few) of widened elements and
//! how to load, combine and store it; the loop is written once, here.
//!
//! The loop takes `U` registers' worth of elements of the first input, folds
//! each further input into them in rank order while they stay in registers,
//! then finishes (avg, canonical NaN) and writes them: one read of every
//! input and one write of the output per element. What is left after the
//! full blocks goes one register at a time, then as one partial register, so
//! no length needs a scalar tail. Large outputs are written with streaming
//! stores, after a partial register that brings the output to alignment.

use core::ptr;

use super::scalar::{self, Element};
use super::{OpKind, ReduceOp, STREAM_MIN_BYTES};

/// A SIMD register's worth of elements of one storage type, widened to the
/// type they are combined in (`f32` for 16-bit floats).
///
/// Values exist only inside kernels compiled for the instruction set that
/// implements the trait: every method may assume the CPU has it.
pub(crate) trait Lanes: Copy {
    /// Elements per value.
    const LANES: usize;
    /// Bytes per stored element.
    const SIZE: usize;
    /// The alignment, in bytes, that [`Lanes::stream`] needs; 0 when this
    /// instruction set has no streaming store worth using.
    const STREAM_ALIGN: usize;

    /// Loads `LANES` elements.
    ///
    /// # Safety
    /// `p` is readable for `LANES * SIZE` bytes; the CPU has the instruction set.
    unsafe fn load(p: *const u8) -> Self;

    /// Stores `LANES` elements, rounded to the storage type.
    ///
    /// # Safety
    /// `p` is writable for `LANES * SIZE` bytes; the CPU has the instruction set.
    unsafe fn store(self, p: *mut u8);

    /// Loads `count` (< `LANES`) elements; the other lanes hold anything.
    ///
    /// # Safety
    /// `p` is readable for `count * SIZE` bytes; the CPU has the instruction set.
    #[inline(always)]
    unsafe fn load_part(p: *const u8, count: usize) -> Self {
        const { assert!(Self::LANES * Self::SIZE <= 64) };
        let mut buf = [0u8; 64];
        // SAFETY: the caller makes `count * SIZE` bytes readable at `p`, and
        // `buf` holds a whole value (asserted above).
        unsafe {
            ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), count * Self::SIZE);
            Self::load(buf.as_ptr())
        }
    }

    /// Stores the first `count` (< `LANES`) elements.
    ///
    /// # Safety
    /// `p` is writable for `count * SIZE` bytes; the CPU has the instruction set.
    #[inline(always)]
    unsafe fn store_part(self, p: *mut u8, count: usize) {
        const { assert!(Self::LANES * Self::SIZE <= 64) };
        let mut buf = [0u8; 64];
        // SAFETY: `buf` holds a whole value; the caller makes `count * SIZE`
        // bytes writable at `p`.
        unsafe {
            self.store(buf.as_mut_ptr());
            ptr::copy_nonoverlapping(buf.as_ptr(), p, count * Self::SIZE);
        }
    }

    /// Stores `LANES` elements bypassing the caches.
    ///
    /// # Safety
    /// As [`Lanes::store`], and `p` is aligned to `STREAM_ALIGN`.
    #[inline(always)]
    unsafe fn stream(self, p: *mut u8) {
        // SAFETY: the caller's guarantee covers a plain store.
        unsafe { self.store(p) }
    }

    /// Orders streaming stores before whatever follows (sending the result).
    ///
    /// # Safety
    /// The CPU has the instruction set.
    #[inline(always)]
    unsafe fn stream_fence() {}

    /// # Safety
    /// The CPU has the instruction set (so for every arithmetic method).
    unsafe fn add(self, x: Self) -> Self;
    unsafe fn mul(self, x: Self) -> Self;
    /// IEEE 754-2019 maximum: NaN if either is NaN, `-0 < +0`.
    unsafe fn max(self, x: Self) -> Self;
    /// IEEE 754-2019 minimum: NaN if either is NaN, `-0 < +0`.
    unsafe fn min(self, x: Self) -> Self;
    /// `divisor` in every lane, converted as the scalar code converts it.
    unsafe fn divisor(divisor: u32) -> Self;
    /// Correctly rounded division.
    unsafe fn div(self, divisor: Self) -> Self;
    /// Every NaN lane replaced by the canonical NaN.
    unsafe fn canonical(self) -> Self;
}

#[inline(always)]
unsafe fn combine<L: Lanes, O: OpKind>(acc: L, x: L) -> L {
    // SAFETY: `L` values exist only where the CPU has its instruction set.
    unsafe {
        match O::OP {
            ReduceOp::Sum | ReduceOp::Avg => acc.add(x),
            ReduceOp::Prod => acc.mul(x),
            ReduceOp::Max => acc.max(x),
            ReduceOp::Min => acc.min(x),
        }
    }
}

#[inline(always)]
unsafe fn finish<L: Lanes, O: OpKind>(acc: L, divisor: L) -> L {
    // SAFETY: as in `combine`.
    unsafe {
        let value = if O::OP == ReduceOp::Avg { acc.div(divisor) } else { acc };
        value.canonical()
    }
}

/// Where one reduction reads and writes.
#[derive(Clone, Copy)]
struct Buffers<'a> {
    out: *mut u8,
    first: *const u8,
    rest: &'a [*const u8],
}

/// The SIMD reduction, `U` registers per block.
///
/// # Safety
/// As for [`super::Kernel`]; `L`'s instruction set is enabled in the caller.
#[inline(always)]
pub(crate) unsafe fn reduce<L: Lanes, O: OpKind, const U: usize>(out: *mut u8, inputs: &[*const u8], elems: usize, divisor: u32) {
    let Some((&first, rest)) = inputs.split_first() else {
        return;
    };
    let buffers = Buffers { out, first, rest };
    // SAFETY: (for the whole body) the caller makes every buffer valid for
    // `elems` elements and has the instruction set; each helper below is
    // given element ranges inside `0..elems` only.
    unsafe {
        let divisor = L::divisor(divisor);
        let stream = L::STREAM_ALIGN != 0 && elems.saturating_mul(L::SIZE) >= STREAM_MIN_BYTES && (out as usize).is_multiple_of(L::SIZE);
        let mut done = 0;
        if stream {
            let misaligned = (out as usize) % L::STREAM_ALIGN;
            if misaligned != 0 {
                // Fewer than `LANES`: STREAM_ALIGN is at most a register.
                let head = (L::STREAM_ALIGN - misaligned) / L::SIZE;
                done = partial::<L, O>(buffers, 0, head.min(elems), divisor);
            }
            done = blocks::<L, O, U, true>(buffers, done, elems, divisor);
            done = blocks::<L, O, 1, true>(buffers, done, elems, divisor);
        } else {
            done = blocks::<L, O, U, false>(buffers, done, elems, divisor);
            done = blocks::<L, O, 1, false>(buffers, done, elems, divisor);
        }
        if done < elems {
            partial::<L, O>(buffers, done, elems - done, divisor);
        }
        if stream {
            L::stream_fence();
        }
    }
}

/// Reduces whole blocks of `U` registers from element `done` on, while a
/// whole block fits before `elems`; returns where it stopped.
///
/// # Safety
/// As for [`reduce`]; with `STREAM`, `out + done` is aligned to `STREAM_ALIGN`.
#[inline(always)]
unsafe fn blocks<L: Lanes, O: OpKind, const U: usize, const STREAM: bool>(
    buffers: Buffers<'_>,
    mut done: usize,
    elems: usize,
    divisor: L,
) -> usize {
    let step = L::LANES * L::SIZE;
    while elems - done >= U * L::LANES {
        let base = done * L::SIZE;
        // SAFETY: elements `done .. done + U * LANES` lie below `elems`, in
        // every buffer; the whole block of every input is read before any
        // of `out` is written, so `out` may be the first input.
        unsafe {
            let mut acc: [L; U] = core::array::from_fn(|u| L::load(buffers.first.add(base + u * step)));
            for &input in buffers.rest {
                for u in 0..U {
                    acc[u] = combine::<L, O>(acc[u], L::load(input.add(base + u * step)));
                }
            }
            for u in 0..U {
                let value = finish::<L, O>(acc[u], divisor);
                let p = buffers.out.add(base + u * step);
                if STREAM {
                    value.stream(p);
                } else {
                    value.store(p);
                }
            }
        }
        done += U * L::LANES;
    }
    done
}

/// Reduces `count` (< `LANES`) elements from element `start` on; returns
/// the element after them.
///
/// # Safety
/// As for [`reduce`], with `start + count <= elems`.
#[inline(always)]
unsafe fn partial<L: Lanes, O: OpKind>(buffers: Buffers<'_>, start: usize, count: usize, divisor: L) -> usize {
    let base = start * L::SIZE;
    // SAFETY: elements `start .. start + count` lie in every buffer.
    unsafe {
        let mut acc = L::load_part(buffers.first.add(base), count);
        for &input in buffers.rest {
            acc = combine::<L, O>(acc, L::load_part(input.add(base), count));
        }
        finish::<L, O>(acc, divisor).store_part(buffers.out.add(base), count);
    }
    start + count
}

/// A [`Lanes`] of 16-bit floats whose widened `f32`s can wait in memory
/// between folds (the staged form): `LANES` of them, `4 * LANES` bytes, in
/// whatever order the registers hold them. Only `load_wide` reads what
/// `store_wide` wrote, always at the same register boundaries (multiples of
/// `LANES` elements), so the order never shows.
pub(crate) trait WideLanes: Lanes {
    /// The scalar element, for what is left after whole registers.
    type Scalar: Element<Acc = f32>;

    /// Loads `LANES` partials that `store_wide` wrote.
    ///
    /// # Safety
    /// `p` is readable for `4 * LANES` bytes; the CPU has the instruction set.
    unsafe fn load_wide(p: *const u8) -> Self;

    /// Stores `LANES` partials, unrounded.
    ///
    /// # Safety
    /// `p` is writable for `4 * LANES` bytes; the CPU has the instruction set.
    unsafe fn store_wide(self, p: *mut u8);
}

/// The staged form's fold (see `scalar::fold_wide`), whole registers here,
/// `U` at a time then one at a time, the rest in scalar code.
///
/// # Safety
/// As for `scalar::fold_wide` from element 0; `L`'s instruction set is
/// enabled in the caller.
#[inline(always)]
pub(crate) unsafe fn fold_wide<L: WideLanes, O: OpKind, const U: usize>(acc: *mut u8, resume: bool, inputs: &[*const u8], elems: usize) {
    // SAFETY: the caller makes every buffer valid for `elems` elements (the
    // accumulator for `elems` f32s); each step covers elements below `elems`.
    unsafe {
        let done = fold_blocks::<L, O, U>(acc, resume, inputs, 0, elems);
        let done = fold_blocks::<L, O, 1>(acc, resume, inputs, done, elems);
        scalar::fold_wide::<L::Scalar, O>(acc, resume, inputs, done, elems);
    }
}

/// # Safety
/// As for [`fold_wide`], with `done <= elems`.
#[inline(always)]
unsafe fn fold_blocks<L: WideLanes, O: OpKind, const U: usize>(
    acc: *mut u8,
    resume: bool,
    inputs: &[*const u8],
    mut done: usize,
    elems: usize,
) -> usize {
    let rest = if resume { inputs } else { &inputs[1..] };
    let (step, wide) = (L::LANES * L::SIZE, L::LANES * 4);
    while elems - done >= U * L::LANES {
        let (base, wbase) = (done * L::SIZE, done * 4);
        // SAFETY: elements `done .. done + U * LANES` lie below `elems`, in
        // every input and in the accumulator.
        unsafe {
            // (A loop, not `array::from_fn`: that calls the closure from std
            // code built without this instruction set, where it cannot be
            // inlined; the loads became calls, a fifth of a staged bf16
            // job's lcore time.)
            let load = |u: usize| if resume { L::load_wide(acc.add(wbase + u * wide)) } else { L::load(inputs[0].add(base + u * step)) };
            let mut a = [load(0); U];
            for u in 1..U {
                a[u] = load(u);
            }
            for &input in rest {
                for u in 0..U {
                    a[u] = combine::<L, O>(a[u], L::load(input.add(base + u * step)));
                }
            }
            for u in 0..U {
                a[u].store_wide(acc.add(wbase + u * wide));
            }
        }
        done += U * L::LANES;
    }
    done
}

/// The staged form's last step (see `scalar::narrow_wide`), in place or not.
///
/// # Safety
/// As for `scalar::narrow_wide` from element 0; `L`'s instruction set is
/// enabled in the caller.
#[inline(always)]
pub(crate) unsafe fn narrow_wide<L: WideLanes, O: OpKind, const U: usize>(out: *mut u8, acc: *const u8, elems: usize, divisor: u32) {
    // SAFETY: as for `fold_wide`. A block is read whole before it is
    // written, and written below every later block's partials (2i < 4i),
    // so `out` may be `acc`.
    unsafe {
        let d = L::divisor(divisor);
        let (step, wide) = (L::LANES * L::SIZE, L::LANES * 4);
        let mut done = 0;
        while elems - done >= U * L::LANES {
            let mut a = [L::load_wide(acc.add(done * 4)); U];
            for u in 1..U {
                a[u] = L::load_wide(acc.add(done * 4 + u * wide));
            }
            for u in 0..U {
                finish::<L, O>(a[u], d).store(out.add(done * L::SIZE + u * step));
            }
            done += U * L::LANES;
        }
        while elems - done >= L::LANES {
            finish::<L, O>(L::load_wide(acc.add(done * 4)), d).store(out.add(done * L::SIZE));
            done += L::LANES;
        }
        scalar::narrow_wide::<L::Scalar, O>(out, acc, done, elems, divisor);
    }
}

/// Implements [`WideLanes`] for a 16-bit type held as a register `Pair`
/// `{ a, b }`: the partials are `a`, then `b` (`$half` bytes further),
/// loaded and stored by the instruction set's unaligned `f32` intrinsics.
/// Expanded inside each instruction set's module, whose kernels are the
/// only callers (so the intrinsics are available).
macro_rules! wide_pair {
    ($t:ty, $scalar:ty, $load:ident, $store:ident, $half:expr) => {
        impl $crate::reduce::simd::WideLanes for $t {
            type Scalar = $scalar;

            #[inline(always)]
            unsafe fn load_wide(p: *const u8) -> Self {
                // SAFETY: the caller makes 2 x `$half` bytes readable and has
                // the instruction set.
                unsafe { Self(Pair { a: $load(p.cast()), b: $load(p.add($half).cast()) }) }
            }
            #[inline(always)]
            unsafe fn store_wide(self, p: *mut u8) {
                // SAFETY: the caller makes 2 x `$half` bytes writable and has
                // the instruction set.
                unsafe {
                    $store(p.cast(), self.0.a);
                    $store(p.add($half).cast(), self.0.b);
                }
            }
        }
    };
}
pub(crate) use wide_pair;

/// An instruction set's staged-form kernels and their table (`WIDE`):
/// [`fold_wide`] and [`narrow_wide`] over its 16-bit `Lanes` types,
/// compiled with its features.
macro_rules! wide_kernels {
    ($features:literal, $cpu:literal, f16: $f16:ty, bf16: $bf16:ty) => {
pub(crate) static WIDE: $crate::reduce::WideTable = $crate::reduce::wide_table!(wide_fold, wide_narrow, f16: $f16, bf16: $bf16);

        /// The staged form's widening fold.
        ///
        /// # Safety
        /// As for `scalar::fold_wide` from element 0; the CPU has the
        /// features named below.
        #[doc = $cpu]
        #[target_feature(enable = $features)]
        unsafe fn wide_fold<L: $crate::reduce::simd::WideLanes, O: $crate::reduce::OpKind>(
            acc: *mut u8,
            resume: bool,
            inputs: &[*const u8],
            elems: usize,
        ) {
            // SAFETY: the caller upholds the kernel contract and has the
            // instruction set the `Lanes` types need.
            unsafe { $crate::reduce::simd::fold_wide::<L, O, 4>(acc, resume, inputs, elems) }
        }

        /// The staged form's rounding to 16 bits.
        ///
        /// # Safety
        /// As for `scalar::narrow_wide` from element 0; the CPU has the
        /// features named below.
        #[doc = $cpu]
        #[target_feature(enable = $features)]
        unsafe fn wide_narrow<L: $crate::reduce::simd::WideLanes, O: $crate::reduce::OpKind>(
            out: *mut u8,
            acc: *const u8,
            elems: usize,
            divisor: u32,
        ) {
            // SAFETY: as for `wide_fold`.
            unsafe { $crate::reduce::simd::narrow_wide::<L, O, 4>(out, acc, elems, divisor) }
        }
    };
}
pub(crate) use wide_kernels;
