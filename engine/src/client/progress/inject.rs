//! Inject: a small send the provider copies at the call, so that no send
//! completion comes back (the flight's send is done at once). Only where
//! the caller's thread drives the endpoint (rails on threads inject
//! nothing: their inject size is 0, as a queued send may be posted after
//! the caller's buffer changed) and without pacing, whose credits are
//! returned by send completions.
use crate::client::rails::Rails;
use crate::client::state::Op;
use crate::dataplane::fabric::{PeerAddr, PostError};

/// Whether a piece of `len` bytes goes by inject.
#[inline(always)]
pub(super) fn fits(rails: &Rails, len: usize, send_credits: u32) -> bool {
    len <= rails.inject_size() && rails.inject_size() > 0 && send_credits == 0
}

/// Sends the `len` bytes at `off` of `op`'s input by inject.
#[inline]
pub(super) fn send(rails: &mut Rails, op: &Op, off: usize, len: usize, addr: PeerAddr, tag: u64) -> Result<(), PostError> {
    // SAFETY: [send+off, +len) is inside the caller's buffer, valid
    // for this call (inject copies it).
    unsafe { rails.inject(op.send.add(off), len, addr, tag) }
}
