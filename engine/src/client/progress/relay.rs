//! Relay: in a two-rank job with `Hello::RELAY`, a piece of at most
//! `RELAY_MAX` bytes is not reduced on the server, which only sends each
//! rank's piece on to the other: this rank receives the other's piece into
//! the sub-job's relay slot (posted once its own piece's send is, see
//! `Progress::pump`) and, once both completed, reduces the two here, in
//! rank order ([`reduce`]), so that both ranks get the same bits.
use crate::client::error::ClientError;
use crate::client::rails::Rails;
use crate::client::stage::Stage;
use crate::client::state::{Core, Flight, Stream};
use crate::dataplane::fabric::PostError;
use crate::reduce::Kernels;

/// Posts the receive of the other rank's piece of chunk (`st`, `seq`) into
/// its relay slot.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(super) fn recv(
    rails: &mut Rails,
    slots: &Stage,
    stream: &Stream,
    st: usize,
    seq: u32,
    len: usize,
    tag: u64,
    ctx: u32,
) -> Result<(), PostError> {
    // SAFETY: the relay slot of (stream, seq) holds RELAY_MAX bytes
    // and is the target of this receive only (slots cycle over twice
    // the window); it lives as long as the sub-job.
    unsafe { rails.recv(stream.rail, slots.slot(st, seq), len, slots.mh(st), Some(stream.addr), (tag, 0), ctx, None) }
}

/// A relayed flight (of stream `st`) has the other rank's piece and sent its own:
/// reduces the two, in rank order, into where the result goes (the
/// staging slot, or the caller's buffer).
#[inline]
pub(super) fn reduce(c: &Core, stage: Option<&Stage>, kernels: &Kernels, sub: usize, st: usize, f: Flight) -> Result<(), ClientError> {
    let s = &c.subs[sub];
    let Some(op) = c.ops.iter().find(|o| o.id == f.op) else { return Ok(()) };
    let Some(relay) = s.relay.as_ref() else { return Ok(()) };
    let (off, len) = op.span(f.chunk);
    let got = f.got as usize;
    if got != len {
        return Err(ClientError::Fabric(format!("a relayed piece of {got} bytes where the chunk has {len}")));
    }
    let peer = relay.slot(st, f.seq);
    // SAFETY: off + len <= bytes, inside the caller's buffers (contract of `start`).
    let (own, out) = unsafe { (op.send.add(off), stage.map_or(op.recv.add(off), |g| g.slot(st, f.seq))) };
    let elems = len / s.dtype.size();
    // SAFETY: peer holds the whole piece (its receive completed), own and
    // out `len` bytes each; out overlaps no input except inputs[0]
    // exactly: rank 1 reducing in place reduces into the peer's slot and
    // copies from there, since out would be its second input.
    let r = unsafe {
        if c.cfg.rank == 0 {
            kernels.reduce_raw(s.dtype, s.op, out, &[own, peer], elems)
        } else if std::ptr::eq(own, out) {
            let r = kernels.reduce_raw(s.dtype, s.op, peer, &[peer, own], elems);
            std::ptr::copy_nonoverlapping(peer, out, len);
            r
        } else {
            kernels.reduce_raw(s.dtype, s.op, out, &[peer, own], elems)
        }
    };
    r.map_err(|e| ClientError::Fabric(format!("reducing a relayed piece: {e}")))
}
