//! Pacing: a stream's window bounds the chunks awaiting results, but if
//! every one of them is sent at once, TCP-like fabrics share the link
//! among them fairly, all the uploads finish together and the results come
//! back only afterwards: no overlap of upload and download, about half the
//! link rate. With `send_credits` set, at most that many sends per server
//! are in flight, issued in chunk order across streams, so early chunks
//! finish uploading early and their results flow back while later chunks
//! go up. Receives are posted as before (they cost no bandwidth).
use super::post::post;
use crate::client::error::ClientError;
use crate::client::failover::Failover;
use crate::client::piece_times::PieceTimes;
use crate::client::state::Core;

/// Posts a chunk's send now if its server has a send credit, else queues it.
#[inline]
pub(super) fn issue_send(c: &mut Core, fo: &Failover, times: &mut PieceTimes, ctx: u32) -> Result<(), ClientError> {
    if c.cfg.send_credits == 0 {
        return post(c, fo, times, ctx);
    }
    let (sub, fi) = ((ctx / c.per_sub) as usize, ((ctx % c.per_sub) >> 1) as usize);
    let server = c.subs[sub].streams[fi / c.cfg.window as usize].server;
    let p = &mut c.subs[sub].pacing[server];
    if p.in_flight >= c.cfg.send_credits || !p.waiting.is_empty() {
        p.waiting.push_back(ctx);
        return Ok(());
    }
    p.in_flight += 1;
    post(c, fo, times, ctx)
}

/// A send completed: its server's credit goes to the next waiting sends.
#[inline]
pub(super) fn release_send_credit(
    c: &mut Core,
    fo: &Failover,
    times: &mut PieceTimes,
    sub: usize,
    server: usize,
) -> Result<(), ClientError> {
    if c.cfg.send_credits == 0 {
        return Ok(());
    }
    let p = &mut c.subs[sub].pacing[server];
    p.in_flight = p.in_flight.saturating_sub(1);
    loop {
        let p = &mut c.subs[sub].pacing[server];
        if p.in_flight >= c.cfg.send_credits {
            return Ok(());
        }
        let Some(ctx) = p.waiting.pop_front() else { return Ok(()) };
        p.in_flight += 1;
        post(c, fo, times, ctx)?;
    }
}
