//! Carving a slab into job regions.
//!
//! Each lcore's slab is one registered region; a job takes a contiguous
//! range of it on every lcore it uses. The control plane keeps one
//! [`RangeAlloc`] per lcore (the lcore itself only ever sees offsets), so
//! admission is a plain first-fit search over a short free list.

/// Granularity of slab regions: pages, so regions never share one.
pub const REGION_ALIGN: usize = 4096;

/// First-fit allocator of byte ranges, in units of `align` bytes.
#[derive(Debug, Clone)]
pub struct RangeAlloc {
    align: usize,
    /// Free ranges (offset, length), sorted by offset, never adjacent.
    free: Vec<(usize, usize)>,
    total: usize,
}

impl RangeAlloc {
    pub fn new(total: usize, align: usize) -> RangeAlloc {
        let total = total / align * align;
        RangeAlloc { align, free: if total > 0 { vec![(0, total)] } else { vec![] }, total }
    }

    pub fn round(&self, len: usize) -> usize {
        len.div_ceil(self.align) * self.align
    }

    /// Takes `len` bytes (rounded up to the alignment); None if no free range fits.
    pub fn alloc(&mut self, len: usize) -> Option<usize> {
        let len = self.round(len.max(1));
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (off + len, l - len);
        }
        Some(off)
    }

    /// Returns a range taken with `alloc(len)`.
    pub fn release(&mut self, off: usize, len: usize) {
        let len = self.round(len.max(1));
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Merge with the next, then with the previous neighbour.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    pub fn free_bytes(&self) -> usize {
        self.free.iter().map(|&(_, l)| l).sum()
    }

    pub fn largest_free(&self) -> usize {
        self.free.iter().map(|&(_, l)| l).max().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::RangeAlloc;

    #[test]
    fn alloc_release_merges() {
        let mut a = RangeAlloc::new(4096 * 10, 4096);
        let x = a.alloc(4096).unwrap();
        let y = a.alloc(5000).unwrap();
        let z = a.alloc(4096 * 3).unwrap();
        assert_eq!((x, y, z), (0, 4096, 4096 * 3));
        assert!(a.alloc(4096 * 5).is_none());
        a.release(y, 5000);
        a.release(x, 4096);
        assert_eq!(a.largest_free(), 4096 * 4);
        a.release(z, 4096 * 3);
        assert_eq!(a.free_bytes(), 4096 * 10);
        assert_eq!(a.largest_free(), 4096 * 10);
    }
}
