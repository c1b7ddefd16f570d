//! A leaf (a rank's stand-in): sends its bytes to the hubs piece by piece,
//! `--window` in flight per hub, each receive for the echo posted before
//! its send, and checks every byte that comes back.
use super::gate::Shared;
use super::node::{posted, Node};
use super::pieces::{compare, fill, tag, Cut, DIR_DOWN, DIR_UP};
use super::plan::FanPlan;
use std::collections::VecDeque;
use std::time::Instant;
use tally_engine::dataplane::fabric::Completion;
use tally_engine::host::cpuset;
use tally_engine::host::units::format_size;

/// A leaf thread; its node is left in `keep` for the main thread to close.
pub(super) fn run_leaf(plan: &FanPlan, shared: &Shared, l: usize, core: usize, keep: &mut Option<Node>) -> Result<(), String> {
    cpuset::pin_current_thread(core).map_err(|e| format!("pin core {core}: {e}"))?;
    // Slot 0: the input, slot 1: the output, like an all-reduce's buffers.
    let node = keep.insert(Node::open(plan, &format!("p2p leaf {l}"), plan.max, 2, 2 * plan.hubs * plan.window)?);
    leaf_loop(node, plan, shared, l)
}

/// One piece in flight between a leaf and a hub.
#[derive(Clone, Copy, Default)]
struct Flight {
    /// Which of the hub's pieces.
    piece: usize,
    recv_posted: bool,
    send_posted: bool,
    recv_done: bool,
    send_done: bool,
}

fn leaf_loop(node: &mut Node, plan: &FanPlan, shared: &Shared, l: usize) -> Result<(), String> {
    node.meet(shared, plan.hubs + l, 0..plan.hubs)?;
    let (w, hubs) = (plan.window, plan.hubs);
    let me = hubs + l;
    // Flight (hub h, k): the piece in the hub's window slot k.
    let mut fl = vec![Flight::default(); hubs * w];
    let mut next = vec![0usize; hubs];
    let mut head = vec![0usize; hubs];
    let mut stalled: VecDeque<usize> = VecDeque::new();
    let mut c = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
    for &size in &plan.sizes {
        let cut = Cut::new(size, plan.chunk, hubs, plan.min_piece);
        let n: Vec<usize> = (0..hubs).map(|h| cut.per_hub(h)).collect();
        fill(&mut node.slab.slot_mut(0)[..size], &cut, l);
        node.slab.slot_mut(1)[..size].fill(0);
        for _ in 0..plan.warmup + plan.iters {
            next.fill(0);
            head.fill(0);
            let mut left: usize = n.iter().sum();
            shared.gate.wait()?;
            shared.times.lock().unwrap_or_else(|e| e.into_inner()).starts[me] = Some(Instant::now());
            node.last_progress = Instant::now();
            loop {
                // A flight refused with EAGAIN keeps its place in chunk order.
                while let Some(&f) = stalled.front() {
                    if !leaf_post(node, &cut, l, w, &mut fl[f], f / w)? {
                        break;
                    }
                    stalled.pop_front();
                }
                // One piece per hub per pass, as the client posts: chunks go
                // out in chunk order.
                while stalled.is_empty() {
                    let mut any = false;
                    for h in 0..hubs {
                        if next[h] < n[h] && next[h] - head[h] < w {
                            let f = h * w + next[h] % w;
                            fl[f] = Flight { piece: next[h], ..Flight::default() };
                            next[h] += 1;
                            any = true;
                            if !leaf_post(node, &cut, l, w, &mut fl[f], h)? {
                                stalled.push_back(f);
                                break;
                            }
                        }
                    }
                    if !any {
                        break;
                    }
                }
                if left == 0 {
                    break;
                }
                let what = |f| format!("{left} pieces not back, {f} operations in flight");
                let k = node.poll(&mut c, shared, what)?;
                for x in &c[..k] {
                    let f = (x.context / 2) as usize;
                    let h = f / w;
                    if x.is_recv {
                        let cix = cut.chunk_of(h, fl[f].piece);
                        let want = cut.span(cix).1;
                        if x.len != want {
                            return Err(format!("piece {cix} back from hub {h}: {} bytes, {want} expected", x.len));
                        }
                        fl[f].recv_done = true;
                    } else {
                        fl[f].send_done = true;
                    }
                    // A piece is done when its send and its return are.
                    while head[h] < next[h] {
                        let g = &fl[h * w + head[h] % w];
                        if !(g.recv_done && g.send_done) {
                            break;
                        }
                        head[h] += 1;
                        left -= 1;
                    }
                }
            }
            shared.times.lock().unwrap_or_else(|e| e.into_inner()).ends[l] = Some(Instant::now());
            shared.gate.wait()?;
            // Checked after the end gate: the check's memory traffic must
            // not slow the leaves still running.
            let (bad, first) = compare(&node.slab.slot(0)[..size], &node.slab.slot(1)[..size]);
            if let Some(o) = first {
                return Err(format!(
                    "{bad} of {} returned bytes differ from those sent (first at offset {o}, chunk {}, hub {})",
                    format_size(size as u64),
                    o / cut.piece,
                    cut.hub_at(o)
                ));
            }
            node.slab.slot_mut(1)[..size].fill(0);
        }
    }
    shared.gate.wait()
}

/// Posts a piece as the client posts a chunk: the receive for its return
/// first, straight into the output, then the send from the input. Returns
/// false if the provider said try again (the flight remembers what went out).
fn leaf_post(node: &mut Node, cut: &Cut, l: usize, w: usize, f: &mut Flight, h: usize) -> Result<bool, String> {
    let cix = cut.chunk_of(h, f.piece);
    let (off, len) = cut.span(cix);
    // The context ids of flight (h, k): 2 (h w + k) for the receive, +1 for the send.
    let ctx = 2 * (h * w + f.piece % w) as u32;
    if !f.recv_posted {
        // SAFETY: off + len <= S <= the slot size: the range lies in slot 1,
        // inside the registered slab; no other operation in flight covers it.
        let at = unsafe { node.slab.slot_ptr(1).add(off) };
        // SAFETY: the slab outlives the endpoint's use of it; nothing reads
        // or writes this range until the receive completes.
        f.recv_posted = posted(unsafe { node.ep.recv(at, len, Some(node.mh), Some(node.peers[h]), tag(DIR_DOWN, l, h, cix), 0, ctx) })?;
        if !f.recv_posted {
            return Ok(false);
        }
    }
    if !f.send_posted {
        // SAFETY: as above, in slot 0.
        let at = unsafe { node.slab.slot_ptr(0).add(off) };
        // SAFETY: slot 0 is written only between repetitions, with nothing in flight.
        f.send_posted = posted(unsafe { node.ep.send(at, len, Some(node.mh), node.peers[h], tag(DIR_UP, l, h, cix), ctx + 1) })?;
    }
    Ok(f.send_posted)
}
