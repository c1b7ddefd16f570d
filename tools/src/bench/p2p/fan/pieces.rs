//! How a leaf's bytes become pieces: cut as the client cuts an all-reduce,
//! tagged with direction, leaf, hub and index so that each lands only at its
//! own place, and filled with a pattern that the leaf checks on return.
use tally_engine::client::op_chunk_bytes;

/// Leaf to hub.
pub(super) const DIR_UP: u64 = 1;

/// Hub to leaf (the echo).
pub(super) const DIR_DOWN: u64 = 2;

/// Leaves and hubs each have 14 bits of the tag (see `tag`).
pub(super) const MAX_PEERS: usize = 1 << 14;

/// Pieces per leaf: the chunk index has 32 bits of the tag.
pub(super) const MAX_PIECES: usize = 1 << 32;

/// How a leaf's S bytes are cut, as `engine::client` cuts an all-reduce.
#[derive(Clone, Copy)]
pub(super) struct Cut {
    pub(super) bytes: usize,
    pub(super) piece: usize,
    pub(super) pieces: usize,
    pub(super) hubs: usize,
}

impl Cut {
    pub(super) fn new(bytes: usize, chunk: usize, hubs: usize, min_piece: usize) -> Cut {
        let piece = op_chunk_bytes(bytes, chunk, hubs, 1, min_piece);
        Cut { bytes, piece, pieces: bytes.div_ceil(piece), hubs }
    }

    /// Pieces hub `h` gets from each leaf: chunks h, h + hubs, h + 2 hubs...
    pub(super) fn per_hub(&self, h: usize) -> usize {
        if h < self.pieces {
            (self.pieces - h).div_ceil(self.hubs)
        } else {
            0
        }
    }

    /// The chunk index of hub `h`'s `p`-th piece.
    pub(super) fn chunk_of(&self, h: usize, p: usize) -> usize {
        h + p * self.hubs
    }

    /// Offset and length of chunk `c` in a leaf's buffers.
    pub(super) fn span(&self, c: usize) -> (usize, usize) {
        let off = c * self.piece;
        (off, self.piece.min(self.bytes - off))
    }

    pub(super) fn hub_at(&self, off: usize) -> usize {
        (off / self.piece) % self.hubs
    }
}

/// direction (4 bits) | leaf (14) | hub (14) | chunk index (32). Receives
/// match it exactly (no ignored bits: shm 1.17 wants one mask per
/// endpoint, see `fabric::endpoint`), so a piece lands only in its own place.
pub(super) fn tag(dir: u64, leaf: usize, hub: usize, c: usize) -> u64 {
    (dir << 60) | ((leaf as u64) << 46) | ((hub as u64) << 32) | c as u64
}

/// The word a leaf sends at byte offset `off` (a multiple of 8) of its
/// input: a hash of (leaf, hub, offset). Odd, so that it never equals the
/// zeroed output it must replace.
fn pattern(leaf: usize, hub: usize, off: usize) -> u64 {
    let mut x = ((leaf as u64) << 50) ^ ((hub as u64) << 36) ^ off as u64;
    // splitmix64's finalizer: neighbouring offsets differ in every byte.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) | 1
}

pub(super) fn fill(buf: &mut [u8], cut: &Cut, leaf: usize) {
    for (i, w) in buf.chunks_mut(8).enumerate() {
        let off = i * 8;
        let n = w.len();
        w.copy_from_slice(&pattern(leaf, cut.hub_at(off), off).to_le_bytes()[..n]);
    }
}

/// Bytes of `got` that differ from `sent`, and the first such offset.
pub(super) fn compare(sent: &[u8], got: &[u8]) -> (usize, Option<usize>) {
    const BLOCK: usize = 4096;
    let (mut bad, mut first) = (0, None);
    for (b, (s, g)) in sent.chunks(BLOCK).zip(got.chunks(BLOCK)).enumerate() {
        if s != g {
            for (i, (x, y)) in s.iter().zip(g).enumerate() {
                if x != y {
                    bad += 1;
                    first.get_or_insert(b * BLOCK + i);
                }
            }
        }
    }
    (bad, first)
}
