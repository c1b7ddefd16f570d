//! Direct: a chunk's result received straight into its place in the
//! caller's output buffer, where the sub-job cannot fail over (one server,
//! failover off, or a provider that completes sends in order). Never under
//! failover: `failover`'s module doc says why a receive into the caller's
//! buffer must not outlive its all-reduce.
use crate::client::rails::Rails;
use crate::client::state::{Op, Stream};
use crate::dataplane::fabric::PostError;

/// Posts the receive of the `len` bytes at `off` of `op`'s output.
#[inline]
pub(super) fn recv(rails: &mut Rails, op: &Op, stream: &Stream, off: usize, len: usize, tag: u64, ctx: u32) -> Result<(), PostError> {
    // SAFETY: off + len <= bytes, inside the caller's buffer, valid until
    // the request completes (contract of `start`); each chunk's range of
    // `recv` has one receive.
    unsafe { rails.recv(stream.rail, op.recv.add(off), len, op.mh_recv, Some(stream.addr), (tag, 0), ctx, None) }
}
