//! One all-reduce through the ring: [`Ring::run`] checks the call and sets
//! it up, [`Schedule`] lays out its messages (the same on every rank: steps,
//! chunk positions, blocks of `window`), and [`Pass`] is the event loop that
//! posts, completes and forwards them (see "Pipelining" in the `ring`
//! module doc).
use super::{tag, Entry, Lane, Ring, RingError, IDLE_LANE, SPIN_POLLS, TAG_CHUNK_BITS, WAIT_MS};
use crate::dataplane::fabric::{Completion, Endpoint, MemoryHandle, PeerAddr, PollError, PostError};
use crate::reduce::{DataType, Kernels, ReduceOp};
use std::time::{Duration, Instant};

impl Ring {
    /// Checks the call, runs the pipeline, and on failure makes sure that
    /// nothing the provider still holds can touch the caller's buffers after
    /// we return.
    pub(super) fn run(&mut self, send: *const u8, recv: *mut u8, bytes: usize, dtype: DataType, op: ReduceOp) -> Result<(), RingError> {
        if let Some(why) = &self.broken {
            return Err(RingError::Broken(why.clone()));
        }
        if !bytes.is_multiple_of(dtype.size()) {
            return Err(RingError::Buffers(format!(
                "{bytes} bytes is not a whole number of {dtype} elements ({} bytes each)",
                dtype.size()
            )));
        }
        if self.nranks == 1 {
            if !std::ptr::eq(send, recv) {
                // SAFETY: both buffers are `bytes` long (checked by the
                // callers) and do not overlap: `send` is a shared borrow and
                // `recv` a distinct mutable one.
                unsafe { std::ptr::copy_nonoverlapping(send, recv, bytes) };
            }
            return Ok(());
        }
        if bytes == 0 {
            return Ok(());
        }
        let schedule = Schedule::new(self, bytes, dtype)?;
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let result = {
            let Ring {
                ep,
                staging,
                staging_mr,
                prev,
                next,
                poll_busy,
                bounce,
                progress_timeout,
                kernels,
                entries,
                recv_lanes,
                send_lanes,
                nranks,
                rank,
                ..
            } = self;
            let Some(ep) = ep.as_mut() else {
                return Err(RingError::Broken("the endpoint is closed".into()));
            };
            // A successful pass leaves them so; make sure.
            entries.fill(Entry::Free);
            recv_lanes.fill(IDLE_LANE);
            send_lanes.fill(IDLE_LANE);
            let mut pass = Pass {
                ep,
                s: schedule,
                seq,
                dtype,
                op,
                kernels: *kernels,
                send,
                recv,
                staging: staging.as_ptr(),
                slot_bytes: staging.slot_size(),
                mr: *staging_mr,
                bounce: *bounce,
                prev: *prev,
                next: *next,
                prev_rank: (*rank + *nranks - 1) % *nranks,
                next_rank: (*rank + 1) % *nranks,
                entries,
                recv_lanes,
                send_lanes,
                next_recv: 0,
                next_send: 0,
                recvs_in_flight: 0,
                sends_in_flight: 0,
                poll_busy: *poll_busy,
                progress_timeout: *progress_timeout,
            };
            pass.run()
        };
        if let Err(e) = &result {
            self.broken = Some(e.to_string());
            if let Some(ep) = self.ep.as_mut() {
                // Nothing the provider still holds may touch the caller's
                // buffers after we return: cancel everything, and if some
                // operation will not finish, close the endpoint, which ends
                // them all. (Keeping it open otherwise matters for peers in
                // this process: shm maps them onto our endpoint's memory.)
                ep.cancel_all();
                if ep.in_flight() > 0 {
                    self.ep = None;
                }
            }
        }
        result
    }
}

/// One message of the stream: its step, chunk position, and where its bytes
/// are in the user's buffers.
#[derive(Debug, Clone, Copy)]
struct Msg {
    step: u64,
    chunk: u64,
    /// Byte offset in the buffer.
    off: usize,
    /// Bytes.
    len: usize,
}

/// The message layout of one all-reduce, the same on every rank.
///
/// Messages have virtual indices k = (block, step, position): block b covers
/// chunk positions b·W .. (b+1)·W, and within it step t's W positions come
/// before step t+1's. An index whose chunk lies past the end of its segment
/// (the tail of the last block, short or empty segments) is a hole: neither
/// side sends or receives anything for it.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    rank: u64,
    n: u64,
    elem: usize,
    /// Segment k has `base + (k < rem)` elements.
    base: u64,
    rem: u64,
    chunk_elems: u64,
    /// Chunk positions per block: the window.
    w: u64,
    /// 2(n-1).
    steps: u64,
    /// Virtual indices, holes included.
    total: u64,
}

impl Schedule {
    fn new(ring: &Ring, bytes: usize, dtype: DataType) -> Result<Schedule, RingError> {
        let n = ring.nranks as u64;
        let elem = dtype.size();
        let count = (bytes / elem) as u64;
        let (base, rem) = (count / n, count % n);
        let chunk_elems = (ring.chunk_bytes / elem).max(1) as u64;
        let w = ring.window as u64;
        let steps = 2 * (n - 1);
        // Segment 0 is the longest.
        let chunks = (base + (rem > 0) as u64).div_ceil(chunk_elems);
        if chunks >= 1 << TAG_CHUNK_BITS {
            return Err(RingError::Buffers(format!(
                "{bytes} bytes over {n} ranks is {chunks} chunks per segment, more than tags can name; raise chunk_bytes"
            )));
        }
        let total = chunks.div_ceil(w) * steps * w;
        Ok(Schedule { rank: ring.rank as u64, n, elem, base, rem, chunk_elems, w, steps, total })
    }

    /// The message at virtual index `k` of the stream whose step-t segment
    /// is (rank - t - shift) mod n: shift 1 for what this rank sends, 2 for
    /// what it receives. `None` for a hole.
    fn locate(&self, k: u64, shift: u64) -> Option<Msg> {
        let per_block = self.steps * self.w;
        let (block, within) = (k / per_block, k % per_block);
        let (step, chunk) = (within / self.w, block * self.w + within % self.w);
        // rank + 2n - step - shift > 0, as step <= 2n - 3 and shift <= 2.
        let seg = (self.rank + 2 * self.n - step - shift) % self.n;
        let seg_elems = self.base + (seg < self.rem) as u64;
        let seg_start = seg * self.base + seg.min(self.rem);
        let first = chunk * self.chunk_elems;
        if first >= seg_elems {
            return None;
        }
        let elems = self.chunk_elems.min(seg_elems - first);
        Some(Msg { step, chunk, off: ((seg_start + first) as usize) * self.elem, len: elems as usize * self.elem })
    }

    fn send_msg(&self, k: u64) -> Option<Msg> {
        self.locate(k, 1)
    }

    fn recv_msg(&self, k: u64) -> Option<Msg> {
        self.locate(k, 2)
    }

    /// The first message this rank sends at index >= k, or `total`.
    fn next_send(&self, mut k: u64) -> u64 {
        while k < self.total && self.send_msg(k).is_none() {
            k += 1;
        }
        k
    }

    /// The first message this rank receives at index >= k, or `total`.
    fn next_recv(&self, mut k: u64) -> u64 {
        while k < self.total && self.recv_msg(k).is_none() {
            k += 1;
        }
        k
    }
}

/// One all-reduce in progress: the state the event loop works on.
struct Pass<'a> {
    ep: &'a mut Endpoint,
    s: Schedule,
    seq: u16,
    dtype: DataType,
    op: ReduceOp,
    kernels: Kernels,
    send: *const u8,
    recv: *mut u8,
    staging: *mut u8,
    slot_bytes: usize,
    mr: Option<MemoryHandle>,
    bounce: bool,
    prev: PeerAddr,
    next: PeerAddr,
    prev_rank: u32,
    next_rank: u32,
    /// Indexed by virtual index mod 2W; entry i uses staging slot i.
    entries: &'a mut [Entry],
    recv_lanes: &'a mut [Lane],
    send_lanes: &'a mut [Lane],
    /// Next message to post, in order; `s.total` when all are posted.
    next_recv: u64,
    next_send: u64,
    recvs_in_flight: usize,
    sends_in_flight: usize,
    poll_busy: bool,
    progress_timeout: Duration,
}

impl Pass<'_> {
    fn run(&mut self) -> Result<(), RingError> {
        self.next_recv = self.s.next_recv(0);
        self.next_send = self.s.next_send(0);
        let mut completions = [Completion { context: 0, is_recv: false, len: 0, tag: 0 }; 16];
        let mut last_progress = Instant::now();
        let mut idle_polls = 0u32;
        loop {
            self.post_recvs()?;
            self.post_sends()?;
            if self.next_recv == self.s.total && self.next_send == self.s.total && self.recvs_in_flight == 0 && self.sends_in_flight == 0 {
                return Ok(());
            }
            let got = match self.ep.poll(&mut completions) {
                Ok(got) => got,
                Err(PollError::Completion(e)) => {
                    let what = match e.context {
                        Some(c) => self.describe_context(c),
                        None => "an operation".to_string(),
                    };
                    return Err(RingError::Transport(format!("{what} failed: {e}")));
                }
                Err(PollError::Fabric(e)) => return Err(RingError::Transport(format!("polling: {e}"))),
            };
            for c in &completions[..got] {
                self.complete(c)?;
            }
            if got > 0 {
                last_progress = Instant::now();
                idle_polls = 0;
                continue;
            }
            idle_polls = idle_polls.saturating_add(1);
            if !self.poll_busy {
                if idle_polls <= SPIN_POLLS {
                    // Ranks often outnumber cores here: let a peer that has
                    // work run, rather than spin against it.
                    std::thread::yield_now();
                } else {
                    // Sleep until the provider signals a completion (or nap
                    // briefly). Progress is manual: the next poll drives it.
                    self.ep.wait(WAIT_MS).map_err(|e| RingError::Transport(format!("waiting: {e}")))?;
                }
            }
            if (self.poll_busy && !idle_polls.is_multiple_of(1024)) || last_progress.elapsed() < self.progress_timeout {
                continue;
            }
            return Err(self.stalled());
        }
    }

    fn slot(&self, entry: usize) -> *mut u8 {
        // Slots are `slot_bytes` apart from the start of the slab; entry is
        // below 3W, the number of slots.
        self.staging.wrapping_add(entry * self.slot_bytes)
    }

    fn w(&self) -> u64 {
        self.s.w
    }

    /// Posts receives in stream order while a lane and the message's entry
    /// (and slot) are free.
    fn post_recvs(&mut self) -> Result<(), RingError> {
        while self.next_recv < self.s.total {
            let k = self.next_recv;
            let lane = (k % self.w()) as usize;
            let entry = (k % (2 * self.w())) as usize;
            if self.recv_lanes[lane].busy || self.entries[entry] != Entry::Free {
                return Ok(());
            }
            let m = self.s.recv_msg(k).expect("next_recv names a message");
            // All-gather chunks are final: straight into the result, unless bouncing.
            let direct = !self.bounce && m.step >= self.s.n - 1;
            let (buf, mr) = if direct { (self.recv.wrapping_add(m.off), None) } else { (self.slot(entry), self.mr) };
            // SAFETY: `buf` is either the chunk's own range of the result
            // buffer, which the caller lent us for the whole call and which
            // nothing else writes while this receive is posted (every chunk
            // is received once), or a staging slot that is Free, so no other
            // operation uses it; the slot holds chunk_bytes >= m.len. The
            // endpoint is closed before `run` returns an error, so the
            // provider never writes after we return.
            let r = unsafe { self.ep.recv(buf, m.len, mr, Some(self.prev), tag(self.seq, m.step, m.chunk), 0, lane as u32) };
            match r {
                Ok(()) => {}
                Err(PostError::Again) => return Ok(()),
                Err(e) => {
                    return Err(RingError::Transport(format!(
                        "posting the receive of step {} chunk {} from rank {}: {e}",
                        m.step, m.chunk, self.prev_rank
                    )))
                }
            }
            self.recv_lanes[lane] = Lane { busy: true, msg: k, release: None };
            self.entries[entry] = Entry::Posted(k);
            self.recvs_in_flight += 1;
            self.next_recv = self.s.next_recv(k + 1);
        }
        Ok(())
    }

    /// Posts sends in stream order while a lane is free and the data is ready.
    fn post_sends(&mut self) -> Result<(), RingError> {
        while self.next_send < self.s.total {
            let k = self.next_send;
            let lane = (k % self.w()) as usize;
            if self.send_lanes[lane].busy {
                return Ok(());
            }
            let m = self.s.send_msg(k).expect("next_send names a message");
            let (buf, mr, release) = if m.step == 0 {
                // This rank's own data for the segment it starts.
                if self.bounce {
                    let bounce = self.slot(2 * self.w() as usize + lane);
                    // SAFETY: the send lane is free, so its bounce slot is not
                    // in use; it holds chunk_bytes >= m.len; the source is the
                    // caller's send buffer, valid for the whole call.
                    unsafe { std::ptr::copy_nonoverlapping(self.send.add(m.off), bounce, m.len) };
                    (bounce as *const u8, self.mr, None)
                } else {
                    (self.send.wrapping_add(m.off), None, None)
                }
            } else {
                // Forward the chunk received W messages earlier, once it has
                // arrived and been combined.
                let src = k - self.w();
                let entry = (src % (2 * self.w())) as usize;
                if self.entries[entry] != Entry::Ready(src) {
                    return Ok(());
                }
                // Intermediate reduce-scatter results live in the slot;
                // final data in the result buffer (and, bouncing, also in the slot).
                if self.bounce || m.step < self.s.n - 1 {
                    (self.slot(entry) as *const u8, self.mr, Some(entry))
                } else {
                    (self.recv.wrapping_add(m.off) as *const u8, None, Some(entry))
                }
            };
            // SAFETY: `buf` is m.len bytes of the caller's buffers (valid for
            // the whole call; a chunk's final bytes are never written again),
            // or of a staging slot held (Forwarding, or the lane's bounce
            // slot) until this send's completion. The endpoint is closed
            // before `run` returns an error.
            let r = unsafe { self.ep.send(buf, m.len, mr, self.next, tag(self.seq, m.step, m.chunk), (self.w() as usize + lane) as u32) };
            match r {
                Ok(()) => {}
                Err(PostError::Again) => return Ok(()),
                Err(e) => {
                    return Err(RingError::Transport(format!(
                        "posting the send of step {} chunk {} to rank {}: {e}",
                        m.step, m.chunk, self.next_rank
                    )))
                }
            }
            if let Some(entry) = release {
                self.entries[entry] = Entry::Forwarding(k - self.w());
            }
            self.send_lanes[lane] = Lane { busy: true, msg: k, release };
            self.sends_in_flight += 1;
            self.next_send = self.s.next_send(k + 1);
        }
        Ok(())
    }

    fn complete(&mut self, c: &Completion) -> Result<(), RingError> {
        let w = self.w() as usize;
        let ctx = c.context as usize;
        if !c.is_recv {
            let lane = ctx
                .checked_sub(w)
                .filter(|&l| l < w && self.send_lanes[l].busy)
                .ok_or_else(|| RingError::Transport(format!("send completion for unknown context {}", c.context)))?;
            if let Some(entry) = self.send_lanes[lane].release {
                self.entries[entry] = Entry::Free;
            }
            self.send_lanes[lane] = IDLE_LANE;
            self.sends_in_flight -= 1;
            return Ok(());
        }
        if ctx >= w || !self.recv_lanes[ctx].busy {
            return Err(RingError::Transport(format!("receive completion for unknown context {}", c.context)));
        }
        let k = self.recv_lanes[ctx].msg;
        self.recv_lanes[ctx] = IDLE_LANE;
        self.recvs_in_flight -= 1;
        let m = self.s.recv_msg(k).expect("a posted receive names a message");
        let want = tag(self.seq, m.step, m.chunk);
        if c.tag != want || c.len != m.len {
            return Err(RingError::Transport(format!(
                "step {} chunk {} from rank {}: got {} bytes with tag {:#x}, expected {} bytes with tag {want:#x} \
                 (do all ranks call with the same length and type?)",
                m.step, m.chunk, self.prev_rank, c.len, c.tag, m.len
            )));
        }
        let entry = (k % (2 * self.w())) as usize;
        let slot = self.slot(entry);
        let n = self.s.n;
        let elems = m.len / self.s.elem;
        // Combining goes pairwise; avg adds and divides once at the end.
        let op = if self.op == ReduceOp::Avg { ReduceOp::Sum } else { self.op };
        let mine = self.send.wrapping_add(m.off);
        let out = self.recv.wrapping_add(m.off);
        if m.step + 2 < n {
            // Reduce-scatter, not the last step: slot = slot op mine, then forward.
            // SAFETY: the slot holds the m.len bytes just received and no
            // operation uses it (its receive completed, its forward is not
            // posted); `mine` is m.len bytes of the caller's send buffer,
            // which overlaps no slot. Out is exactly inputs[0], as allowed.
            unsafe { self.kernels.reduce_raw(self.dtype, op, slot, &[slot as *const u8, mine], elems) }
                .map_err(|e| RingError::Transport(format!("reduce: {e}")))?;
            self.entries[entry] = Entry::Ready(k);
        } else if m.step + 2 == n {
            // Last reduce-scatter step: this rank's segment is complete.
            // SAFETY: `out` and `mine` are the same m.len-byte range of the
            // result and send buffers, which are either the same buffer
            // (in place: out is exactly inputs[0], as allowed) or disjoint;
            // the slot is disjoint from both and no operation uses it.
            unsafe { self.kernels.reduce_raw(self.dtype, op, out, &[mine, slot as *const u8], elems) }
                .map_err(|e| RingError::Transport(format!("reduce: {e}")))?;
            if self.op == ReduceOp::Avg {
                // SAFETY: m.len bytes of the result buffer, written just above
                // and not otherwise referenced while this slice lives.
                let result = unsafe { std::slice::from_raw_parts_mut(out, m.len) };
                self.kernels.finish_avg(self.dtype, result, n as usize).map_err(|e| RingError::Transport(format!("average: {e}")))?;
            }
            if self.bounce {
                // SAFETY: as above; the slot is forwarded from, so it gets a copy.
                unsafe { std::ptr::copy_nonoverlapping(out, slot, m.len) };
            }
            self.entries[entry] = Entry::Ready(k);
        } else {
            // All-gather: the chunk is final.
            if self.bounce {
                // SAFETY: the slot holds the m.len bytes just received; `out`
                // is that chunk's range of the result buffer, disjoint from it.
                unsafe { std::ptr::copy_nonoverlapping(slot, out, m.len) };
            }
            self.entries[entry] = if m.step + 1 == self.s.steps { Entry::Free } else { Entry::Ready(k) };
        }
        Ok(())
    }

    /// Names the message behind a context id, for error messages.
    fn describe_context(&self, context: u32) -> String {
        let w = self.w() as usize;
        let c = context as usize;
        let (lane, is_recv) = if c < w {
            (self.recv_lanes[c], true)
        } else if c < 2 * w {
            (self.send_lanes[c - w], false)
        } else {
            return format!("operation with context {context}");
        };
        let m = if is_recv { self.s.recv_msg(lane.msg) } else { self.s.send_msg(lane.msg) };
        match (m, is_recv) {
            (Some(m), true) => format!("the receive of step {} chunk {} from rank {}", m.step, m.chunk, self.prev_rank),
            (Some(m), false) => format!("the send of step {} chunk {} to rank {}", m.step, m.chunk, self.next_rank),
            (None, _) => format!("operation with context {context}"),
        }
    }

    fn stalled(&self) -> RingError {
        let waiting = self
            .recv_lanes
            .iter()
            .filter(|l| l.busy)
            .map(|l| l.msg)
            .min()
            .and_then(|k| self.s.recv_msg(k))
            .map(|m| format!("step {} chunk {} from rank {}", m.step, m.chunk, self.prev_rank))
            .unwrap_or_else(|| format!("send completions from rank {}", self.next_rank));
        RingError::Stalled(format!(
            "no progress for {:.1} s, waiting for {waiting} ({} receives and {} sends in flight): \
             a peer died, stopped calling, or called with a different length or type",
            self.progress_timeout.as_secs_f64(),
            self.recvs_in_flight,
            self.sends_in_flight
        ))
    }
}
