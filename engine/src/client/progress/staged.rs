//! Staged, failover's mode: a chunk's result is received into a slot of
//! the sub-job's staging area (`Stage`, owned by failover) and copied into
//! the caller's buffer only once whole: by the rail thread that received it
//! (`copy_to`), or here when the flight completes ([`complete`]). The slot then
//! remembers what it holds, for a recovery to relay (`failover`'s module
//! doc says why results are staged).
use crate::client::piece_times::PieceTimes;
use crate::client::rails::Rails;
use crate::client::stage::{Landed, Stage};
use crate::client::state::{Op, Stream};
use crate::dataplane::fabric::PostError;
use std::time::Instant;

/// Posts the receive of chunk (`st`, `seq`) into its staging slot; the
/// `len` bytes at `off` of `op`'s output are where it goes once whole.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(super) fn recv(
    rails: &mut Rails,
    stage: &Stage,
    op: &Op,
    stream: &Stream,
    st: usize,
    seq: u32,
    off: usize,
    len: usize,
    tag: u64,
    ctx: u32,
) -> Result<(), PostError> {
    // Where the result goes once whole: a rail copies it there, else `complete` does.
    // SAFETY: off + len <= bytes, inside the caller's buffer.
    let copy_to = op.rail_copies(rails, stream.rail).then(|| unsafe { op.recv.add(off) });
    // SAFETY: the staging slot of (stream, seq) holds a whole piece
    // and is the target of this receive only (slots cycle over twice
    // the window, see `Stage`); it lives as long as the sub-job. The
    // chunk's range of `recv` has one receive and stays the caller's
    // until the request completes.
    unsafe { rails.recv(stream.rail, stage.slot(st, seq), len, stage.mh(st), Some(stream.addr), (tag, 0), ctx, copy_to) }
}

/// A completed flight's staged result (received on rail `rail`): copied
/// out where that rail's thread did not copy it already, and kept in its
/// slot (timed into `times` where given).
#[inline]
#[allow(clippy::too_many_arguments)]
pub(super) fn complete(
    stage: &mut Stage,
    op: &Op,
    rails: &Rails,
    rail: usize,
    times: Option<&mut PieceTimes>,
    st: usize,
    seq: u32,
    chunk: usize,
) {
    let how = Landed::of(op.rail_copies(rails, rail));
    let began = (times.is_some() && how == Landed::Staged).then(Instant::now);
    op.land(stage, st, seq, chunk, how);
    if let (Some(t), Some(times)) = (began, times) {
        times.record_copy(t);
    }
}
