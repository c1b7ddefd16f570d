//! Slots that results land in before they are copied out ([`Stage`]), and
//! what each slot holds. A sub-job that can fail over stages every result
//! (failover owns that staging area: `failover`'s module doc says which
//! results are staged and why), so that a recovery can relay a result this
//! rank has and a slower one lacks; a relay job's other-rank pieces and a
//! redo job's results land in slots of the same kind.
use super::error::ClientError;
use super::rails::stream_copy;
use super::rails::Rails;
use crate::dataplane::fabric::MemoryHandle;

/// Where a sub-job's results land before they are copied out: per stream,
/// twice the window of piece-sized slots, and what each holds. One block
/// per stream, so that a server taken back adds streams without moving
/// the slots receives are posted into.
pub struct Stage {
    pub(in crate::client) blocks: Vec<Block>,
    pub(in crate::client) piece: usize,
    /// Slots per stream: twice the window.
    pub(in crate::client) slots: usize,
    pub(in crate::client) meta: Vec<Held>,
    /// Copies out with streaming stores ([`stream_copy`], as the rails and
    /// the copier do; `TALLY_STAGE_COPY=plain` turns it off).
    stream: bool,
}

/// One stream's staging slots (registered where the provider wants local
/// buffers registered, as EFA does).
pub(in crate::client) struct Block {
    pub(in crate::client) ptr: *mut u8,
    pub(in crate::client) layout: std::alloc::Layout,
    pub(in crate::client) mh: Option<MemoryHandle>,
}

impl Block {
    /// No slots: the place of a stream lost for good whose block went to
    /// another ([`Stage::hand_over`]), until a stream there needs slots again.
    fn none() -> Block {
        Block { ptr: std::ptr::null_mut(), layout: std::alloc::Layout::new::<u8>(), mh: None }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: allocated in `Stage::alloc_block` with this layout. The
        // client cancels every receive before its sub-jobs go (Client's
        // Drop), and a block moves to another stream only once the provider
        // gave back every receive posted into it (`hand_over`).
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// What a staging slot holds once its flight completed.
#[derive(Clone, Copy, Default)]
pub(in crate::client) struct Held {
    pub(in crate::client) valid: bool,
    pub(in crate::client) seq: u32,
    pub(in crate::client) len: u32,
    pub(in crate::client) chunk: u32,
    pub(in crate::client) op_index: u64,
}

/// A transparent huge page on x86-64, and on aarch64 with 4 KiB base pages.
const THP_SIZE: usize = 2 << 20;

/// The smallest page `release` drops (aarch64 kernels with 64 KiB pages
/// round an unaligned range in, which is all this needs).
const PAGE: usize = 4096;

impl Stage {
    /// Slots for `streams` streams; registered on `rails` if the provider
    /// wants local buffers registered.
    pub fn new(streams: usize, window: usize, piece: usize, rails: &mut Rails) -> Result<Stage, ClientError> {
        let mut s = Stage { blocks: Vec::new(), piece, slots: 2 * window, meta: Vec::new(), stream: stream_copy::wanted() };
        s.add(streams, rails)?;
        Ok(s)
    }

    /// Slots for `n` more streams.
    pub fn add(&mut self, n: usize, ep: &mut Rails) -> Result<(), ClientError> {
        for _ in 0..n {
            let block = self.alloc_block(ep)?;
            self.blocks.push(block);
        }
        self.meta.resize(self.blocks.len() * self.slots, Held::default());
        Ok(())
    }

    /// Places for `n` more streams, without slots yet: each gets a block
    /// handed over ([`Stage::hand_over`]) or a new one ([`Stage::equip`]).
    pub(in crate::client) fn add_places(&mut self, n: usize) {
        self.blocks.extend((0..n).map(|_| Block::none()));
        self.meta.resize(self.blocks.len() * self.slots, Held::default());
    }

    /// Whether stream `st` has slots (a stream lost for good may have given
    /// its block to another).
    pub(in crate::client) fn has_slots(&self, st: usize) -> bool {
        !self.blocks[st].ptr.is_null()
    }

    /// Gives stream `to`, which has none, the slots of stream `from`: a
    /// stream lost for good (no stream takes its place) whose receives the
    /// provider gave back, and whose results no recovery reads any more.
    /// `from` keeps none. A server taken back as the same process (a frozen
    /// or cut-off one) gets places of its own (`take_back` says why), but
    /// not memory of its own: without this every such outage grew a rank by
    /// its staging area (20 MB at 16 MiB, 4 + 4 hosts).
    pub(in crate::client) fn hand_over(&mut self, from: usize, to: usize) {
        debug_assert!(!self.has_slots(to));
        self.blocks[to] = std::mem::replace(&mut self.blocks[from], Block::none());
        self.clear(from);
        self.clear(to);
    }

    /// Gives the memory of stream `st`'s slots back to the system: a
    /// stream lost for good whose receives the provider gave back, when no
    /// stream took its slots at the rejoin (they had not settled yet:
    /// `failover::rejoin`'s `reclaim_slots`). Its pages are dropped before
    /// the block is freed, so the process's resident size falls whatever
    /// the allocator does with the range.
    pub(in crate::client) fn release(&mut self, st: usize, ep: &mut Rails) {
        let mut block = std::mem::replace(&mut self.blocks[st], Block::none());
        self.clear(st);
        if block.ptr.is_null() {
            return;
        }
        if let Some(mh) = block.mh.take() {
            let _ = ep.deregister(mh);
        }
        let start = (block.ptr as usize).next_multiple_of(PAGE);
        let end = (block.ptr as usize + block.layout.size()) / PAGE * PAGE;
        if end > start {
            // SAFETY: [start, end) lies inside this block, which nothing
            // reads or writes any more (no receive is posted into it, none
            // completes there, and no flight or recovery names it); dropping
            // private anonymous pages only zeroes them.
            let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }

    /// New slots for stream `st`, which has none.
    pub(in crate::client) fn equip(&mut self, st: usize, ep: &mut Rails) -> Result<(), ClientError> {
        self.blocks[st] = self.alloc_block(ep)?;
        self.clear(st);
        Ok(())
    }

    /// One stream's block: twice the window of pieces, prefaulted, and
    /// registered where the provider wants it.
    fn alloc_block(&self, ep: &mut Rails) -> Result<Block, ClientError> {
        let size = (self.slots * self.piece).max(64);
        // Blocks of 2 MiB or more start on a 2 MiB boundary and ask for
        // transparent huge pages: every staged result goes through the
        // kernel's receive copy and a rail's copy out, and on 4 KiB pages
        // a 2 MiB block is 512 translations. (Advice only: 4 KiB pages
        // where THP is off.)
        let huge = size >= THP_SIZE;
        let layout = std::alloc::Layout::from_size_align(size, if huge { THP_SIZE } else { 64 }).expect("staging layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        if huge {
            // SAFETY: [ptr, ptr + size rounded down to 2 MiB) lies in this
            // fresh allocation, 2 MiB aligned; advice changes no data, and
            // a kernel without THP refuses it, which changes nothing.
            let _ = unsafe { libc::madvise(ptr.cast(), size / THP_SIZE * THP_SIZE, libc::MADV_HUGEPAGE) };
        }
        prefault(ptr, layout.size());
        let mut block = Block { ptr, layout, mh: None };
        if ep.needs_local_mr() {
            // SAFETY: the block stays allocated while registered: the
            // endpoint closes its registrations before the sub-jobs'
            // stages drop (field order of Client: `core` before
            // `failover`), and redo stages are deregistered before they
            // drop (`Round::close`).
            let mh = unsafe { ep.register(ptr, layout.size()) }
                .map_err(|e| ClientError::Fabric(format!("registering the staging area: {e}")))?;
            block.mh = Some(mh);
        }
        Ok(block)
    }

    /// Stream `st`'s slots hold nothing any more (its place is taken by a
    /// stream of a server taken back, whose sequences start again).
    pub(in crate::client) fn clear(&mut self, st: usize) {
        self.meta[st * self.slots..(st + 1) * self.slots].fill(Held::default());
    }

    /// The bytes of every stream's slots.
    pub fn bytes(&self) -> usize {
        self.blocks.iter().filter(|b| !b.ptr.is_null()).map(|b| b.layout.size()).sum()
    }

    /// The registration of stream `st`'s slots, where the provider wants one.
    #[inline(always)]
    pub fn mh(&self, st: usize) -> Option<MemoryHandle> {
        self.blocks[st].mh
    }

    pub(in crate::client) fn deregister(&mut self, ep: &mut Rails) {
        for b in &mut self.blocks {
            if let Some(mh) = b.mh.take() {
                let _ = ep.deregister(mh);
            }
        }
    }

    /// The slot of sequence `seq` on stream `st`.
    #[inline(always)]
    pub fn slot(&self, st: usize, seq: u32) -> *mut u8 {
        // SAFETY: (seq mod slots) * piece lies inside the stream's block
        // (a stream that carries operations has one: only streams lost for
        // good give theirs up, `hand_over`).
        unsafe { self.blocks[st].ptr.add(seq as usize % self.slots * self.piece) }
    }

    /// A completed flight's result, `len` bytes in the slot of (`st`,
    /// `seq`), chunk `chunk` of operation `op_index`: copied into `out`
    /// where it is still to be copied (`how`), and remembered as what the
    /// slot stands for (`Op::land` is the safe call).
    ///
    /// # Safety
    /// `out` is valid for `len` bytes of writes and overlaps no slot.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(in crate::client) unsafe fn land(
        &mut self,
        st: usize,
        seq: u32,
        chunk: usize,
        op_index: u64,
        out: *mut u8,
        len: usize,
        how: Landed,
    ) {
        if how == Landed::Staged {
            // SAFETY: the slot holds the whole result (its receive
            // completed); `out` holds `len` bytes and overlaps no slot (this
            // function's contract).
            unsafe { stream_copy::copy(self.slot(st, seq), out, len, self.stream) };
        }
        self.meta[st * self.slots + seq as usize % self.slots] = Held { valid: true, seq, len: len as u32, chunk: chunk as u32, op_index };
    }
}

/// Touches every page of a fresh allocation, so that its page faults happen
/// here, at the join, and not in the provider's receives during the first
/// all-reduces (a worker's staging area is tens of MiB: at 32 Gbit/s the
/// faults took a tenth off the first ten all-reduces' rate on the device).
pub(in crate::client) fn prefault(ptr: *mut u8, len: usize) {
    for off in (0..len).step_by(4096) {
        // SAFETY: off < len, inside the allocation; a volatile write of the
        // zero already there, so the compiler keeps it.
        unsafe { std::ptr::write_volatile(ptr.add(off), 0) };
    }
}

/// Where a completed flight's result is, for [`Stage::land`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::client) enum Landed {
    /// In its staging slot: copy it into the caller's buffer.
    Staged,
    /// In its staging slot, and a rail thread copied it out already.
    Copied,
}

impl Landed {
    #[inline(always)]
    pub(in crate::client) fn of(rail_copied: bool) -> Landed {
        if rail_copied {
            Landed::Copied
        } else {
            Landed::Staged
        }
    }
}
