//! A hub (a server lcore's stand-in): keeps `--window` receives posted per
//! leaf and echoes every piece back from the buffer it arrived in.
use super::gate::Shared;
use super::node::{posted, Node};
use super::pieces::{tag, Cut, DIR_DOWN, DIR_UP};
use super::plan::FanPlan;
use std::collections::VecDeque;
use std::time::Instant;
use tally_engine::dataplane::fabric::Completion;
use tally_engine::host::cpuset;

/// A hub thread; its node is left in `keep` for the main thread to close.
pub(super) fn run_hub(plan: &FanPlan, shared: &Shared, h: usize, core: usize, keep: &mut Option<Node>) -> Result<(), String> {
    cpuset::pin_current_thread(core).map_err(|e| format!("pin core {core}: {e}"))?;
    // Slot (leaf l, k) holds one piece of leaf l: receive, then echo.
    let slots = plan.leaves * plan.window;
    let node = keep.insert(Node::open(plan, &format!("p2p hub {h}"), plan.chunk, slots, 2 * slots)?);
    if h == 0 {
        *shared.provider_used.lock().unwrap_or_else(|e| e.into_inner()) = Some(node.ep.provider().to_string());
    }
    hub_loop(node, plan, shared, h)
}

#[derive(Clone, Copy)]
pub(super) enum HubOp {
    Recv,
    Send,
}

fn hub_loop(node: &mut Node, plan: &FanPlan, shared: &Shared, h: usize) -> Result<(), String> {
    node.meet(shared, h, plan.hubs..plan.hubs + plan.leaves)?;
    let w = plan.window;
    let slots = plan.leaves * w;
    // Per slot: which of the leaf's pieces (for this hub) it holds, and the
    // length that arrived.
    let mut piece = vec![0usize; slots];
    let mut len = vec![0usize; slots];
    let mut queue: VecDeque<(usize, HubOp)> = VecDeque::with_capacity(2 * slots);
    let mut c = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
    for &size in &plan.sizes {
        let cut = Cut::new(size, plan.chunk, plan.hubs, plan.min_piece);
        let n = cut.per_hub(h);
        for _ in 0..plan.warmup + plan.iters {
            // Receives are posted before the start, as a server's are.
            for (s, p) in piece.iter_mut().enumerate() {
                *p = s % w;
                if *p < n {
                    queue.push_back((s, HubOp::Recv));
                }
            }
            let (mut echoed, total) = (0, plan.leaves * n);
            hub_post(node, &cut, h, w, &piece, &len, &mut queue)?;
            shared.gate.wait()?;
            shared.times.lock().unwrap_or_else(|e| e.into_inner()).starts[h] = Some(Instant::now());
            node.last_progress = Instant::now();
            while echoed < total {
                hub_post(node, &cut, h, w, &piece, &len, &mut queue)?;
                let what = |f| format!("{echoed} of {total} pieces echoed, {f} operations in flight");
                let k = node.poll(&mut c, shared, what)?;
                for x in &c[..k] {
                    let s = (x.context / 2) as usize;
                    let (l, cix) = (s / w, cut.chunk_of(h, piece[s]));
                    if x.is_recv {
                        let want = cut.span(cix).1;
                        if x.len != want {
                            return Err(format!("piece {cix} from leaf {l}: {} bytes arrived, {want} expected", x.len));
                        }
                        len[s] = x.len;
                        queue.push_back((s, HubOp::Send));
                    } else {
                        echoed += 1;
                        piece[s] += w;
                        if piece[s] < n {
                            queue.push_back((s, HubOp::Recv));
                        }
                    }
                }
            }
            shared.gate.wait()?;
        }
    }
    shared.gate.wait()
}

/// Posts what `queue` holds, in order, until the provider says try again.
fn hub_post(
    node: &mut Node,
    cut: &Cut,
    h: usize,
    w: usize,
    piece: &[usize],
    len: &[usize],
    queue: &mut VecDeque<(usize, HubOp)>,
) -> Result<(), String> {
    while let Some(&(s, op)) = queue.front() {
        let (l, cix) = (s / w, cut.chunk_of(h, piece[s]));
        let at = node.slab.slot_ptr(s);
        let ok = match op {
            // SAFETY: slot s lies in the registered slab, which outlives the
            // endpoint's use of it; only this receive, then its echo, use it
            // until the echo completes.
            HubOp::Recv => {
                // SAFETY: see above.
                posted(unsafe { node.ep.recv(at, cut.piece, Some(node.mh), Some(node.peers[l]), tag(DIR_UP, l, h, cix), 0, 2 * s as u32) })?
            }
            // SAFETY: as above: the slot holds the piece just received and
            // is not written again before this send completes.
            HubOp::Send => {
                // SAFETY: see above.
                posted(unsafe { node.ep.send(at, len[s], Some(node.mh), node.peers[l], tag(DIR_DOWN, l, h, cix), 2 * s as u32 + 1) })?
            }
        };
        if !ok {
            break;
        }
        queue.pop_front();
    }
    Ok(())
}
