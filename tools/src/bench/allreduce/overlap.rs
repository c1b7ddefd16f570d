//! `--agg-in-flight K`: agg all-reduces with up to K in flight at once.
//!
//! A training step does not wait for one gradient bucket's all-reduce
//! before it starts the next (PyTorch DDP launches each bucket's as soon as
//! its gradients are ready), and a rank that finishes one all-reduce early
//! can start uploading the next while the others finish. One all-reduce at
//! a time hides neither. Here the i-th all-reduce of a loop writes into
//! result buffer i mod K, and starts once all-reduce i - K has completed,
//! so no buffer is written while an all-reduce still owns it. Completions
//! are taken in the order the all-reduces started (a later one that is done
//! first waits for its turn), which is what the loop's timestamps count.
use std::collections::VecDeque;
use tally_engine::client::{Client, Request};
use tally_engine::reduce::{DataType, ReduceOp};

/// The most all-reduces `--agg-in-flight` keeps in flight.
pub const MAX_IN_FLIGHT: usize = 8;

/// Runs `ops` all-reduces of `send` with up to `recvs.len()` in flight, the
/// i-th into `recvs[i % recvs.len()][..send.len()]`, calling `done` as each
/// completes, in start order.
pub fn pipelined(
    c: &mut Client,
    send: &[u8],
    recvs: &mut [Vec<u8>],
    ops: usize,
    dtype: DataType,
    op: ReduceOp,
    mut done: impl FnMut(),
) -> Result<(), String> {
    let k = recvs.len();
    let bytes = send.len();
    if k == 0 || recvs.iter().any(|r| r.len() < bytes) || !bytes.is_multiple_of(dtype.size()) {
        return Err(format!("{k} result buffers for all-reduces of {bytes} bytes of {dtype}"));
    }
    let mut flying: VecDeque<Request> = VecDeque::with_capacity(k);
    let mut started = 0;
    while started < ops || !flying.is_empty() {
        if started < ops && flying.len() < k {
            let recv = &mut recvs[started % k];
            // SAFETY: `send` and every buffer of `recvs` are borrowed for the
            // whole call, which returns only once every request it started
            // completed, or after `wait` failed and cancelled them all.
            // Buffer i % k is started on only after request i - k completed:
            // at most k are in flight, waited for in start order.
            let req = unsafe { c.start(send.as_ptr(), recv.as_mut_ptr(), bytes / dtype.size(), dtype, op) }.map_err(|e| e.to_string())?;
            flying.push_back(req);
            started += 1;
            continue;
        }
        // Waiting for the oldest drives the others too, and sleeps as a
        // blocking all-reduce does when nothing moves (a failure cancels
        // every request first: no buffer is written after this returns).
        let oldest = flying.pop_front().expect("in flight");
        c.wait(oldest).map_err(|e| e.to_string())?;
        done();
    }
    Ok(())
}
