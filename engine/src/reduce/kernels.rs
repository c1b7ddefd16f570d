//! The kernels' entry points, [`Kernels`]' methods: choosing a table for
//! the CPU (or `TALLY_ISA`), then checking a call (counts, lengths, whole
//! elements) and dispatching it to the chosen table's kernel, in each form:
//! one-pass (`reduce`, `reduce_raw`), partials (`reduce_partials`),
//! accumulate, and staged (`fold`, `finish_fold`).
#[cfg(target_arch = "x86_64")]
use super::avx2;
#[cfg(target_arch = "x86_64")]
use super::avx512;
#[cfg(target_arch = "aarch64")]
use super::neon;
use super::{
    scalar, DataType, Isa, IsaError, Kernel, Kernels, ReduceError, ReduceOp, Table, WideTable, MAX_INPUTS, TILE_BYTES, TILE_GROUP,
};

impl Kernels {
    /// The best kernels for this CPU, or those `TALLY_ISA` names
    /// (an [`Isa::name`]; `auto` or unset: the best).
    #[cfg(feature = "std")]
    pub fn detect() -> Result<Kernels, IsaError> {
        match std::env::var("TALLY_ISA") {
            Ok(name) => Kernels::for_name(&name),
            Err(std::env::VarError::NotPresent) => Ok(Kernels::best()),
            Err(std::env::VarError::NotUnicode(_)) => Err(IsaError::UnknownName),
        }
    }

    /// The kernels for an instruction set named as `TALLY_ISA` takes it:
    /// an [`Isa::name`], or `auto` (or nothing) for the best.
    pub fn for_name(name: &str) -> Result<Kernels, IsaError> {
        let name = name.trim();
        if name.is_empty() || name.eq_ignore_ascii_case("auto") {
            return Ok(Kernels::best());
        }
        Kernels::for_isa(Isa::parse(name).ok_or(IsaError::UnknownName)?)
    }

    /// The best kernels for this CPU.
    pub fn best() -> Kernels {
        Kernels::for_isa(Isa::best()).unwrap_or_else(|_| Kernels::scalar())
    }

    /// The kernels for `isa`, if this CPU can run them.
    pub fn for_isa(isa: Isa) -> Result<Kernels, IsaError> {
        if !isa.is_available() {
            return Err(IsaError::Unavailable(isa));
        }
        let (table, wide): (&'static Table, &'static WideTable) = match isa {
            Isa::Scalar => (&scalar::TABLE, &scalar::WIDE),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => (&avx2::TABLE, &avx2::WIDE),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => (&avx512::TABLE, &avx512::WIDE),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => (&avx512::TABLE_BF16, &avx512::WIDE),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => (&neon::TABLE, &neon::WIDE),
            #[allow(unreachable_patterns)]
            _ => return Err(IsaError::Unavailable(isa)),
        };
        Ok(Kernels { isa, table, wide })
    }

    /// The portable kernels; they run anywhere.
    pub fn scalar() -> Kernels {
        Kernels { isa: Isa::Scalar, table: &scalar::TABLE, wide: &scalar::WIDE }
    }

    /// Which instruction set these kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    fn kernel(&self, dtype: DataType, op: ReduceOp) -> Kernel {
        self.table[dtype as usize][op as usize]
    }

    /// `out = op(inputs[0], ..., inputs[n-1])` elementwise, combined in rank
    /// order. All slices have the same length, a whole number of elements;
    /// none needs any alignment.
    pub fn reduce(&self, dtype: DataType, op: ReduceOp, out: &mut [u8], inputs: &[&[u8]]) -> Result<(), ReduceError> {
        let elems = elements(dtype, out.len())?;
        check_count(inputs.len())?;
        if inputs.iter().any(|input| input.len() != out.len()) {
            return Err(ReduceError::LengthMismatch);
        }
        with_addresses(inputs, |addrs| {
            // SAFETY: the slices are `elems` elements long (checked above),
            // `out` is a `&mut` so it overlaps no input, there is at least
            // one input, and the table suits this CPU.
            unsafe { self.run(dtype, op, out.as_mut_ptr(), addrs, elems) }
        });
        Ok(())
    }

    /// [`Kernels::reduce`] over raw addresses, for reducing in place:
    /// `out` may be exactly `inputs[0]` (the server reduces into the first
    /// rank's receive slot). No alignment is needed.
    ///
    /// # Safety
    /// Every input must be valid for reading `elems * dtype.size()` bytes
    /// and `out` for writing as many, for the whole call. `out` must overlap
    /// no input, except that it may equal `inputs[0]` exactly.
    pub unsafe fn reduce_raw(
        &self,
        dtype: DataType,
        op: ReduceOp,
        out: *mut u8,
        inputs: &[*const u8],
        elems: usize,
    ) -> Result<(), ReduceError> {
        check_count(inputs.len())?;
        // SAFETY: the caller vouches for the buffers and the aliasing; the
        // count is checked above and the table suits this CPU.
        unsafe { self.run(dtype, op, out, inputs, elems) };
        Ok(())
    }

    /// The last step of a split round (see `dataplane::split`): `out =
    /// op(partials[0], ..)` in group order, where each partial is one group
    /// of ranks' pieces combined in rank order with `op` (an average's:
    /// summed); an average is divided by `nranks`, all the groups' ranks.
    /// Not for 16-bit floats, whose partials would be rounded twice.
    ///
    /// # Safety
    /// As for [`Kernels::reduce_raw`].
    pub unsafe fn reduce_partials(
        &self,
        dtype: DataType,
        op: ReduceOp,
        out: *mut u8,
        partials: &[*const u8],
        elems: usize,
        nranks: usize,
    ) -> Result<(), ReduceError> {
        check_count(partials.len())?;
        if partials.len() > TILE_GROUP || dtype.is_half() {
            return Err(ReduceError::BadCount);
        }
        let divisor = u32::try_from(nranks).ok().filter(|&d| d > 0).ok_or(ReduceError::BadCount)?;
        // SAFETY: the caller vouches for the buffers and the aliasing; one
        // untiled pass of at most TILE_GROUP inputs, which the kernels take.
        unsafe { self.kernel(dtype, op)(out, partials, elems, divisor) };
        Ok(())
    }

    /// The kernel for (dtype, op) over `inputs`, tiled when there are many.
    ///
    /// One pass reads a block of every input in turn; with a thousand
    /// inputs that is a thousand concurrent streams, far more than the
    /// hardware prefetchers follow, and the kernel waits on memory. So past
    /// [`TILE_GROUP`] inputs the output is cut into tiles
    /// of [`TILE_BYTES`], and each tile takes the inputs a group at a time,
    /// its running result (in L1) as the first input of the next group.
    /// Every element still sees the same operations in the same rank order,
    /// so the result is bit-identical to one pass; an average divides only
    /// in the last group. Half types combine in f32, which storing between
    /// groups would round: their running result is a tile of f32 partials
    /// on the stack instead (the staged form's kernels, [`Kernels::fold`]),
    /// rounded once into the output.
    ///
    /// # Safety
    /// As for [`Kernels::reduce_raw`], with `inputs` non-empty and at most
    /// [`MAX_INPUTS`] long.
    unsafe fn run(&self, dtype: DataType, op: ReduceOp, out: *mut u8, inputs: &[*const u8], elems: usize) {
        let n = inputs.len();
        let last = self.kernel(dtype, op);
        if n <= TILE_GROUP {
            // SAFETY: the caller's contract is the kernel's.
            unsafe { last(out, inputs, elems, n as u32) };
            return;
        }
        if let Some(half) = half_index(dtype) {
            // SAFETY: the caller's contract, with more than one group.
            unsafe { self.run_wide(half, op, out, inputs, elems) };
            return;
        }
        let partial = self.kernel(dtype, if op == ReduceOp::Avg { ReduceOp::Sum } else { op });
        let size = dtype.size();
        let tile = (TILE_BYTES / size).max(1);
        let mut addrs = [core::ptr::null::<u8>(); TILE_GROUP];
        let mut start = 0;
        while start < elems {
            let len = tile.min(elems - start);
            let off = start * size;
            // SAFETY: (for the tile) elements `start .. start + len` lie
            // inside every buffer. The first group reads inputs[0..G] and
            // writes the tile of `out`, which may be exactly that of
            // inputs[0]; each later group reads that tile of `out` as its
            // exactly-aliased first input and G - 1 further inputs.
            unsafe {
                let o = out.add(off);
                let mut next = 0;
                while next < n {
                    let mut m = 0;
                    if next > 0 {
                        addrs[0] = o;
                        m = 1;
                    }
                    let take = (TILE_GROUP - m).min(n - next);
                    for input in &inputs[next..next + take] {
                        addrs[m] = input.add(off);
                        m += 1;
                    }
                    next += take;
                    let kernel = if next == n { last } else { partial };
                    kernel(o, &addrs[..m], len, n as u32);
                }
            }
            start += len;
        }
    }

    /// [`Kernels::run`] for 16-bit floats (`half`: their [`WideTable`] row):
    /// per tile, the inputs a group at a time into `f32` partials on the
    /// stack, then rounded once into the output.
    ///
    /// # Safety
    /// As for [`Kernels::run`].
    unsafe fn run_wide(&self, half: usize, op: ReduceOp, out: *mut u8, inputs: &[*const u8], elems: usize) {
        const TILE: usize = TILE_BYTES / 4;
        let (fold, narrow) = (self.wide.fold[half][op as usize], self.wide.narrow[half][op as usize]);
        let mut partials = [0f32; TILE];
        let acc = partials.as_mut_ptr().cast::<u8>();
        let mut addrs = [core::ptr::null::<u8>(); TILE_GROUP];
        let mut start = 0;
        while start < elems {
            let len = TILE.min(elems - start);
            let off = start * 2;
            let mut next = 0;
            // SAFETY: (for the tile) elements `start .. start + len` lie in
            // every buffer, and `len` partials fit the stack tile, which
            // overlaps no buffer. The output's tile is written only after
            // every input's was read, so it may be that of inputs[0].
            unsafe {
                while next < inputs.len() {
                    let take = TILE_GROUP.min(inputs.len() - next);
                    for (a, input) in addrs.iter_mut().zip(&inputs[next..next + take]) {
                        *a = input.add(off);
                    }
                    fold(acc, next > 0, &addrs[..take], len);
                    next += take;
                }
                narrow(out.add(off), acc, len, inputs.len() as u32);
            }
            start += len;
        }
    }

    /// `acc = op(acc, input)` elementwise. With [`ReduceOp::Avg`] this adds;
    /// call [`Kernels::finish_avg`] after the last input.
    pub fn accumulate(&self, dtype: DataType, op: ReduceOp, acc: &mut [u8], input: &[u8]) -> Result<(), ReduceError> {
        let elems = elements(dtype, acc.len())?;
        if input.len() != acc.len() {
            return Err(ReduceError::LengthMismatch);
        }
        let op = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let out = acc.as_mut_ptr();
        let addrs = [out as *const u8, input.as_ptr()];
        // SAFETY: both buffers are `elems` elements long; `out` is exactly
        // the first input, which kernels allow; `input` is a shared borrow,
        // so it cannot overlap the `&mut` accumulator.
        unsafe { self.kernel(dtype, op)(out, &addrs, elems, 2) };
        Ok(())
    }

    /// Finishes an average accumulated with [`Kernels::accumulate`]:
    /// `buf = buf / n` elementwise (integers: truncating division; 16-bit
    /// floats: widened, divided in `f32`, rounded).
    pub fn finish_avg(&self, dtype: DataType, buf: &mut [u8], n: usize) -> Result<(), ReduceError> {
        let elems = elements(dtype, buf.len())?;
        let divisor = u32::try_from(n).ok().filter(|&d| d > 0).ok_or(ReduceError::BadCount)?;
        let out = buf.as_mut_ptr();
        let addrs = [out as *const u8];
        // SAFETY: one input, exactly `out`, `elems` elements long.
        unsafe { self.kernel(dtype, ReduceOp::Avg)(out, &addrs, elems, divisor) };
        Ok(())
    }

    /// The staged form: folds `inputs` (the next ranks, in rank order) into
    /// the accumulator `acc`, [`DataType::accumulator_size`] bytes per
    /// element. With `resume` false the accumulator starts from
    /// `inputs[0]`; otherwise it holds the ranks folded so far. After the
    /// last rank, [`Kernels::finish_fold`] leaves the result at `acc`.
    ///
    /// # Safety
    /// `acc` is valid for reading and writing `elems` accumulator elements
    /// and overlaps no input; every input is valid for reading `elems`
    /// elements for the whole call.
    pub unsafe fn fold(
        &self,
        dtype: DataType,
        op: ReduceOp,
        acc: *mut u8,
        resume: bool,
        inputs: &[*const u8],
        elems: usize,
    ) -> Result<(), ReduceError> {
        check_count(inputs.len())?;
        if let Some(half) = half_index(dtype) {
            // SAFETY: the caller's contract is the kernel's; the table suits this CPU.
            unsafe { self.wide.fold[half][op as usize](acc, resume, inputs, elems) };
            return Ok(());
        }
        let op = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let kernel = self.kernel(dtype, op);
        let mut addrs = [acc as *const u8; TILE_GROUP];
        let mut rest = inputs;
        if !resume {
            // (One input is a copy that also makes a NaN canonical.)
            let take = TILE_GROUP.min(inputs.len());
            // SAFETY: as for the kernel; `acc` overlaps none of the inputs.
            unsafe { kernel(acc, &inputs[..take], elems, 0) };
            rest = &inputs[take..];
        }
        // Then groups with the accumulator first, which kernels allow
        // (`out` exactly `inputs[0]`).
        while !rest.is_empty() {
            let take = (TILE_GROUP - 1).min(rest.len());
            addrs[1..=take].copy_from_slice(&rest[..take]);
            // SAFETY: as above.
            unsafe { kernel(acc, &addrs[..=take], elems, 0) };
            rest = &rest[take..];
        }
        Ok(())
    }

    /// Ends a staged fold over `n` ranks: an average is divided, 16-bit
    /// partials are rounded, in place. The result is then the first
    /// `elems * dtype.size()` bytes at `acc`, what [`Kernels::reduce`] of
    /// the same inputs gives.
    ///
    /// # Safety
    /// `acc` is valid for reading and writing `elems` accumulator elements.
    pub unsafe fn finish_fold(&self, dtype: DataType, op: ReduceOp, acc: *mut u8, elems: usize, n: usize) -> Result<(), ReduceError> {
        let divisor = u32::try_from(n).ok().filter(|&d| d > 0).ok_or(ReduceError::BadCount)?;
        if let Some(half) = half_index(dtype) {
            // SAFETY: narrowing in place is what the kernel allows (out == acc).
            unsafe { self.wide.narrow[half][op as usize](acc, acc, elems, divisor) };
        } else if op == ReduceOp::Avg {
            // SAFETY: one input, exactly `out`, `elems` elements long.
            unsafe { self.kernel(dtype, ReduceOp::Avg)(acc, &[acc as *const u8], elems, divisor) };
        }
        Ok(())
    }
}

/// The row of a [`WideTable`] for a 16-bit float type.
fn half_index(dtype: DataType) -> Option<usize> {
    match dtype {
        DataType::Float16 => Some(0),
        DataType::Bfloat16 => Some(1),
        _ => None,
    }
}

/// The number of elements in `len` bytes, if that is a whole number.
fn elements(dtype: DataType, len: usize) -> Result<usize, ReduceError> {
    if !len.is_multiple_of(dtype.size()) {
        return Err(ReduceError::PartialElement);
    }
    Ok(len / dtype.size())
}

/// Calls `f` with the start addresses of `inputs` (at most [`MAX_INPUTS`]),
/// gathered on the stack; the common few-input case fills a small array.
fn with_addresses<R>(inputs: &[&[u8]], f: impl FnOnce(&[*const u8]) -> R) -> R {
    fn gather<'a, const N: usize>(inputs: &[&[u8]], addrs: &'a mut [*const u8; N]) -> &'a [*const u8] {
        for (addr, input) in addrs.iter_mut().zip(inputs) {
            *addr = input.as_ptr();
        }
        &addrs[..inputs.len()]
    }
    const FEW: usize = 16;
    if inputs.len() <= FEW {
        f(gather(inputs, &mut [core::ptr::null(); FEW]))
    } else {
        f(gather(inputs, &mut [core::ptr::null(); MAX_INPUTS]))
    }
}

fn check_count(n: usize) -> Result<(), ReduceError> {
    match n {
        0 => Err(ReduceError::NoInputs),
        n if n > MAX_INPUTS => Err(ReduceError::TooManyInputs),
        _ => Ok(()),
    }
}
