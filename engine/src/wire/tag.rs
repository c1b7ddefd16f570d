//! The dataplane tag every chunk's messages carry: job, slot, sequence.

/// A dataplane tag: `job (16) | slot (16) | sequence (32)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag(pub u64);

impl Tag {
    /// Tag bits a receive leaves free: the sequence.
    pub const SEQ_BITS: u64 = 0xffff_ffff;

    #[inline(always)]
    pub const fn new(job: u16, slot: u16, seq: u32) -> Tag {
        Tag(((job as u64) << 48) | ((slot as u64) << 32) | seq as u64)
    }
    #[inline(always)]
    pub const fn job(self) -> u16 {
        (self.0 >> 48) as u16
    }
    #[inline(always)]
    pub const fn slot(self) -> u16 {
        (self.0 >> 32) as u16
    }
    #[inline(always)]
    pub const fn seq(self) -> u32 {
        self.0 as u32
    }
}
