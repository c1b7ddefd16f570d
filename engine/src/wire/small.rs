//! Small all-reduces' paths, as servers and clients agree on them: which
//! pieces a two-rank job relays, and how a split job's ranks are cut into
//! groups over lcores (the module above describes both).
use super::*;

/// Pieces of a relay job (see the module doc) of at most this many bytes
/// are relayed: shm's inject size, at or below which a piece costs the
/// server one copy to send on.
pub const RELAY_MAX: usize = 4096;

/// Pieces of a split job (see the module doc) of at most this many bytes are
/// split by rank over lcores.
pub const SPLIT_MAX: usize = 4096;

/// Split jobs have at least this many ranks (two lcores of two ranks each)
/// and at most [`SPLIT_MAX_RANKS`] (the combining lcore reads every rank's
/// piece at once).
pub const SPLIT_MIN_RANKS: u32 = 4;

pub const SPLIT_MAX_RANKS: u32 = 64;

/// The most groups whose partials a split round combines (one kernel pass).
pub const SPLIT_MAX_FOLDED_GROUPS: u32 = 8;

/// Whether a split round of `groups` groups of `dtype` folds each group into
/// a partial and combines the partials in group order (see the module doc);
/// otherwise every piece is folded in rank order. Servers and tests agree
/// through this.
pub fn split_folds_groups(groups: u32, dtype: DataType) -> bool {
    (2..=SPLIT_MAX_FOLDED_GROUPS).contains(&groups) && !dtype.is_half()
}

/// How many lcores a split job's small pieces go to, of `lcores` that take
/// its small operations: at least two ranks each. Below 2 the job is not
/// split. The client and the server compute it from the same Accept.
pub fn split_lcores(nranks: u32, lcores: u32) -> u32 {
    lcores.min(nranks / 2)
}

/// Which of the `groups` lcores rank `rank`'s small pieces go to: ranks in
/// contiguous blocks, so that lcore p serves [`split_ranks`]`(p, ..)`.
pub fn split_position(rank: u32, nranks: u32, groups: u32) -> u32 {
    (rank as u64 * groups as u64 / nranks as u64) as u32
}

/// The ranks lcore position `p` of `groups` serves in a split job.
pub fn split_ranks(p: u32, nranks: u32, groups: u32) -> core::ops::Range<u32> {
    let first = |p: u32| (p as u64 * nranks as u64).div_ceil(groups as u64) as u32;
    first(p)..first(p + 1)
}
