//! The dataplane tag every chunk's messages carry: job, slot, sequence;
//! and the job's sequence key ([`JobTag`]), which a piece's sequence is
//! XORed with on the wire.

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

/// A job's dataplane identity as the server grants it in its Accept: the
/// 16-bit tag (the high bits of every [`Tag`]) and a 32-bit key drawn at
/// random for the job, which every sequence number is XORed with on the
/// wire. An lcore's receive leaves the sequence bits free (so that a piece
/// out of sequence lands and is caught, not left waiting), so the key is
/// what a third party on the fabric, which can learn a job's tag, slot and
/// round, cannot guess: a piece whose sequence does not carry it is dropped
/// and counted, and the receive posted again (`dataplane::shard`). A
/// rank's receives of results match the whole tag, key included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobTag {
    pub job: u16,
    pub key: u32,
}

impl JobTag {
    /// The wire tag of `slot`'s piece or result of sequence `seq`.
    #[inline(always)]
    pub const fn tag(self, slot: u16, seq: u32) -> Tag {
        Tag::new(self.job, slot, seq ^ self.key)
    }

    /// The sequence a wire tag of this job carries.
    #[inline(always)]
    pub const fn seq_of(self, t: Tag) -> u32 {
        t.seq() ^ self.key
    }
}
