//! Posting a context id's send or receive: decoded from the id alone (see
//! `state.rs`), and handed to its chunk's mode: a send goes by inject
//! (`inject.rs`) or as a plain send; a receive lands in the relay slot
//! (`relay.rs`), a staging slot (`staged.rs`) or the caller's buffer
//! (`direct.rs`); a redo flight's goes to failover (`failover/redo.rs`).
//! A post refused with EAGAIN keeps its context id on the retry list.
use super::{direct, inject, relay, staged};
use crate::client::error::ClientError;
use crate::client::failover::Failover;
use crate::client::piece_times::PieceTimes;
use crate::client::state::Core;
use crate::dataplane::fabric::PostError;

/// Posts the operation a context id names, from the flight it belongs to.
pub(super) fn post(c: &mut Core, fo: &Failover, times: &mut PieceTimes, ctx: u32) -> Result<(), ClientError> {
    let (sub, local) = ((ctx / c.per_sub) as usize, ctx % c.per_sub);
    if local >= c.redo_base {
        return fo.post_redo(c, sub, local - c.redo_base);
    }
    let (fi, is_send) = ((local >> 1) as usize, local & 1 == 1);
    let window = c.cfg.window as usize;
    let (st, slot) = (fi / window, fi % window);
    let f = c.subs[sub].flights[fi];
    let Some(op) = c.ops.iter().find(|o| o.id == f.op) else { return Ok(()) };
    // A sampled send is timed, but not in the sub-job's first all-reduce,
    // which makes the connections.
    if is_send && c.cfg.piece_times && PieceTimes::sampled(f.seq) && op.index > 0 {
        c.subs[sub].flights[fi].sent_at = times.now_ns();
    }
    let s = &c.subs[sub];
    let stream = &s.streams[st];
    let (chunk, seq) = (f.chunk, f.seq);
    let (off, len) = op.span(chunk);
    let tag = stream.job_tag.tag(stream.slot_base + slot as u16, seq).0;
    let r = if is_send && inject::fits(&c.rails, len, c.cfg.send_credits) {
        let r = inject::send(&mut c.rails, op, off, len, stream.addr, tag);
        if r.is_ok() {
            // No send completion comes back for it.
            c.subs[sub].flights[fi].send_done = true;
        }
        r
    } else if is_send {
        // SAFETY: [send+off, +len) is inside the caller's buffer, valid
        // until the request completes (contract of `start`).
        unsafe { c.rails.send(stream.rail, op.send.add(off), len, op.mh_send, stream.addr, tag, ctx) }
    } else if let Some(slots) = s.relay.as_ref().filter(|_| f.relayed) {
        relay::recv(&mut c.rails, slots, stream, st, seq, len, tag, ctx)
    } else if let Some(stage) = fo.staging(sub) {
        staged::recv(&mut c.rails, stage, op, stream, st, seq, off, len, tag, ctx)
    } else {
        direct::recv(&mut c.rails, op, stream, off, len, tag, ctx)
    };
    match r {
        // A relayed chunk's receive goes once its send did (`Progress::pump`).
        Ok(()) if is_send && f.relayed => post(c, fo, times, ctx - 1),
        Ok(()) => Ok(()),
        Err(PostError::Again) => {
            c.retry.push(ctx);
            Ok(())
        }
        Err(e) => Err(ClientError::Fabric(e.to_string())),
    }
}
