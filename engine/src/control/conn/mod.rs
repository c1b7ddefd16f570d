//! Control connections, all of them on one thread: an epoll loop (mio).
//!
//! Every TCP connection to the control port lives here from its accept to
//! its close: first in its **handshake** (the server's challenge goes out at
//! once; the Hello that answers it is read into a Hello-sized buffer, its
//! fields, proof of the token (`wire::auth`) and endpoint names checked,
//! and turned into a [`ConnEvent::Join`]),
//! then **joined** (the rank sends at most a few small messages for the
//! rest of the job: `Boundary`, `Lost`, `Bye`, each parsed here into an
//! event). Nothing blocks: reads take what the socket has, writes go out as
//! far as the socket takes them and the rest waits in the connection's own
//! out-buffer (a `Recover` to a thousand ranks is large) until the socket
//! is writable again. A connection costs its file descriptor, one small
//! struct and its buffers, whatever the number of connections: no thread.
//!
//! Why mio rather than a tokio runtime: the control plane is one state
//! machine on one thread that already owns all its state; mio gives it
//! epoll, non-blocking sockets and a waker with nothing else to learn or to
//! run, no task scheduler or second threading model beside the lcores', and
//! deadlines stay plain `Instant`s the loop compares (see [`Connections::turn`]).
//!
//! Admission of handshakes (per source and in total) is [`super::admission`];
//! this module enforces its verdicts and the handshake deadline. What a
//! joined connection's messages mean is the job logic's ([`super::ControlPlane`]):
//! it hears [`ConnEvent`]s and answers through [`Connections::send`] and
//! [`Connections::refuse`].
use super::admission::{Admission, Verdict};
use crate::dataplane::fabric::{EndpointName, NameShape};
use crate::dataplane::metrics::ControlCounters;
use crate::host::random;
use crate::wire::{Challenge, Hello, JobSecret, JobSpec, Limits, Reject, RejectCode, NONCE_BYTES, TOKEN_BYTES};
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Poll, Token, Waker};
use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod read;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// Tokens of connections: slot index + this.
const FIRST_CONN: usize = 2;

/// A joined connection that leaves this much unsent is not reading: it is closed.
const MAX_OUT_BYTES: usize = 64 << 20;

/// A refused handshake stays open this long after its reject, or until the
/// peer closes, reading and dropping what comes. Closing at once with the
/// peer's Hello unread would make the kernel answer with a reset, and a
/// reset can reach the peer before the reject it has not read yet.
const LINGER: Duration = Duration::from_secs(1);

/// At most this many refused connections linger; past it they are closed at once.
const MAX_LINGERING: usize = 4096;

/// What the job logic hears from connections.
pub enum ConnEvent {
    Join(Box<Joining>),
    /// The rank finished cleanly.
    Bye {
        conn: u64,
    },
    /// The rank's answer to a Drain or a Rejoin: its first operation not yet cut.
    Boundary {
        conn: u64,
        next_op: u64,
    },
    /// The rank lost other servers of the job (this one leads the recovery).
    Lost {
        conn: u64,
        dead: u64,
        boundary: u64,
        report: Vec<u8>,
    },
    /// A joined connection closed (either side).
    Closed {
        conn: u64,
    },
}

/// A rank that completed its handshake.
pub struct Joining {
    /// The rank takes this (restarted) server back into a running job.
    pub rejoin: bool,
    /// The rank wants heartbeats ([`wire::Kind::Alive`]) once the job runs.
    pub heartbeats: bool,
    pub conn: u64,
    pub peer: SocketAddr,
    pub spec: JobSpec,
    pub rank: u32,
    /// The rank's endpoint names: its Hello's, then its lanes' (lcore `k`
    /// of the job uses name `k mod len`).
    pub names: Vec<EndpointName>,
    /// The job's secret, unsealed (`wire::auth`): the job logic holds every
    /// rank and rejoin of the job to its first rank's.
    pub secret: JobSecret,
}

/// What a handshake is checked against.
pub struct Rules {
    pub limits: Limits,
    pub token: Option<[u8; TOKEN_BYTES]>,
    /// What an endpoint name must look like to this server's provider.
    pub names: NameShape,
    pub handshake_timeout: Duration,
    pub max_handshakes: usize,
    pub max_handshakes_per_source: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Accepted; its Hello is being read. Counted by [`Admission`].
    Handshake,
    /// Its Hello was good: a rank (a Join was reported; its close will be).
    Rank,
    /// Its handshake was refused: it closes once the reject is written.
    Refused,
}

struct Connection {
    id: u64,
    stream: TcpStream,
    peer: SocketAddr,
    phase: Phase,
    /// Bytes read and not yet consumed: the Hello, then rank messages.
    input: Vec<u8>,
    output: Vec<u8>,
    /// Bytes of `output` already written.
    sent: usize,
    /// Close once `output` is written (a reject, an end).
    closing: bool,
    /// Refused, reject written, write side shut: waiting for the peer's close.
    lingering: bool,
    /// The challenge's nonce its Hello must answer (`wire::auth`).
    nonce: [u8; NONCE_BYTES],
}

/// Every control connection and the listener, on one mio poll.
pub struct Connections {
    poll: Poll,
    events: mio::Events,
    /// (token, readable, writable) of the last poll's events, reused.
    ready: Vec<(Token, bool, bool)>,
    listener: TcpListener,
    waker: Arc<Waker>,
    slots: Vec<Option<Connection>>,
    free: Vec<usize>,
    /// Per slot: generation, so that a stale id never names a new connection.
    generation: Vec<u32>,
    /// Handshake deadlines in accept order (one timeout for all: FIFO is sorted).
    deadlines: VecDeque<(Instant, u64)>,
    /// Refused connections waiting for their peer's close, by deadline (FIFO, as above).
    lingering: VecDeque<(Instant, u64)>,
    admission: Admission,
    /// Connections in [`Phase::Rank`].
    ranks: usize,
    rules: Rules,
    counters: Arc<ControlCounters>,
    /// Events produced outside `turn` (a write that failed), reported by the next one.
    queued: Vec<ConnEvent>,
    /// The listener stopped on an error (out of descriptors): retry each turn.
    accept_stalled: bool,
    /// Rate-limited summaries instead of a log line per refused connection.
    quiet: Quiet,
}

/// Counts refusals and handshake timeouts between log lines, so a storm of
/// thousands of connections costs a line a second, not a line each.
#[derive(Default)]
struct Quiet {
    busy_source: u64,
    evicted: u64,
    timed_out: u64,
    accept_errors: u64,
    /// Refused handshakes past the [`LOUD_REFUSALS`] of this second, by [`Refusal`].
    refused: [u64; 3],
    /// Refused handshakes logged in full in the second from `loud_since`.
    loud: u32,
    loud_since: Option<Instant>,
    last: Option<Instant>,
    sample: Option<IpAddr>,
}

/// Refused handshakes logged in full each second; the rest are counted
/// into the summary (a bad client is still told why in its reject).
const LOUD_REFUSALS: u32 = 4;

/// Why a handshake was refused, as the rate-limited log counts it.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// Bad magic, version, kind, field or endpoint name.
    Malformed = 0,
    /// Its proof does not match: a wrong or missing token.
    Unauthorized = 1,
    /// The peer closed in the middle of its Hello.
    Truncated = 2,
}

impl Refusal {
    const NAMES: [&'static str; 3] = ["malformed", "with a wrong or missing token", "cut off"];
}

impl Connections {
    pub fn new(listener: std::net::TcpListener, rules: Rules, counters: Arc<ControlCounters>) -> std::io::Result<Connections> {
        listener.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new()?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        Ok(Connections {
            poll,
            events: mio::Events::with_capacity(1024),
            ready: Vec::with_capacity(1024),
            listener,
            waker,
            slots: Vec::new(),
            free: Vec::new(),
            generation: Vec::new(),
            deadlines: VecDeque::new(),
            lingering: VecDeque::new(),
            ranks: 0,
            admission: Admission::new(rules.max_handshakes, rules.max_handshakes_per_source),
            rules,
            counters,
            queued: Vec::new(),
            accept_stalled: false,
            quiet: Quiet::default(),
        })
    }

    /// Holds ranks' endpoint names to `shape` from now on (the server's
    /// lcores opened their endpoints: `fabric::names`).
    pub fn expect_names(&mut self, shape: NameShape) {
        self.rules.names = shape;
    }

    /// Whether ranks' endpoint names are socket addresses (tcp): then this
    /// process's connections to them are TCP sockets (`host::tcp_backoff`).
    pub fn names_are_socket_addresses(&self) -> bool {
        matches!(self.rules.names, NameShape::SocketAddress { .. })
    }

    /// The port ranks' control connections come to.
    pub fn listen_port(&self) -> u16 {
        self.listener.local_addr().map_or(0, |a| a.port())
    }

    /// Wakes [`Connections::turn`] from another thread (an lcore's event).
    pub fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    /// The earliest handshake deadline, if any connection is in its handshake.
    fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&(_, id)) = self.deadlines.front() {
            if self.get(id).is_some_and(|c| c.phase == Phase::Handshake) {
                break;
            }
            self.deadlines.pop_front();
        }
        while let Some(&(_, id)) = self.lingering.front() {
            if self.get(id).is_some_and(|c| c.lingering) {
                break;
            }
            self.lingering.pop_front();
        }
        [self.deadlines.front(), self.lingering.front()].into_iter().flatten().map(|d| d.0).min()
    }

    /// One turn: waits for readiness (at most `timeout`, less if a handshake
    /// deadline comes first), accepts, reads, writes, expires handshakes,
    /// and appends what happened to `out`.
    pub fn turn(&mut self, timeout: Duration, out: &mut Vec<ConnEvent>) {
        out.append(&mut self.queued);
        let now = Instant::now();
        let timeout = match self.next_deadline() {
            Some(d) => timeout.min(d.saturating_duration_since(now)),
            None => timeout,
        };
        let timeout = if out.is_empty() { timeout } else { Duration::ZERO };
        if let Err(e) = self.poll.poll(&mut self.events, Some(timeout)) {
            if e.kind() != ErrorKind::Interrupted {
                log::error!("control plane: poll: {e}");
            }
            return;
        }
        // The events borrow the poll's buffer; copy what matters out first.
        let mut ready = std::mem::take(&mut self.ready);
        ready.clear();
        ready.extend(self.events.iter().map(|e| (e.token(), e.is_readable() || e.is_read_closed() || e.is_error(), e.is_writable())));
        let mut accept = self.accept_stalled;
        for &(token, readable, writable) in &ready {
            match token {
                LISTENER => accept = true,
                WAKER => {}
                Token(t) => {
                    let slot = t - FIRST_CONN;
                    if writable {
                        self.flush(slot, out);
                    }
                    if readable {
                        self.read(slot, out);
                    }
                }
            }
        }
        self.ready = ready;
        if accept {
            self.accept();
        }
        self.expire(Instant::now());
        self.summarize(Instant::now());
        out.append(&mut self.queued);
        self.publish();
    }

    fn accept(&mut self) {
        self.accept_stalled = false;
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and kin: the connection stays in the backlog;
                    // epoll will not say so again, so retry next turn.
                    if self.quiet.accept_errors == 0 {
                        log::warn!("control plane: accept: {e} (connections wait in the backlog; retrying)");
                    }
                    self.quiet.accept_errors += 1;
                    self.accept_stalled = true;
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr) {
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        let source = peer.ip();
        match self.admission.verdict(source) {
            Verdict::SourceFull => {
                self.quiet.busy_source += 1;
                self.quiet.sample = Some(source);
                self.counters.refused(RejectCode::Busy);
                let why = "too many connections from this address in their handshake; try again later";
                if self.lingering.len() >= MAX_LINGERING {
                    // A flood: one try, then close (a reset may beat the reject).
                    let _ = stream.write(bytemuck::bytes_of(&Reject::new(RejectCode::Busy, "", why)));
                    return;
                }
                if let Some(id) = self.register(stream, peer, Phase::Refused) {
                    self.refuse_handshake(id, RejectCode::Busy, "", why);
                }
                return;
            }
            Verdict::AdmitEvicting(victim) => self.evict(victim),
            Verdict::Admit => {}
        }
        if let Some(id) = self.register(stream, peer, Phase::Handshake) {
            self.admission.enter(source);
            self.deadlines.push_back((Instant::now() + self.rules.handshake_timeout, id));
        }
    }

    /// Gives an accepted connection a slot and a place on the poll.
    fn register(&mut self, mut stream: TcpStream, peer: SocketAddr, phase: Phase) -> Option<u64> {
        let _ = stream.set_nodelay(true);
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.generation.push(0);
                self.slots.len() - 1
            }
        };
        self.generation[slot] = self.generation[slot].wrapping_add(1);
        let id = ((self.generation[slot] as u64) << 32) | slot as u64;
        if let Err(e) = self.poll.registry().register(&mut stream, Token(slot + FIRST_CONN), Interest::READABLE | Interest::WRITABLE) {
            log::warn!("{peer}: cannot watch the connection: {e}");
            self.free.push(slot);
            return None;
        }
        let input = if phase == Phase::Handshake { Vec::with_capacity(core::mem::size_of::<Hello>()) } else { Vec::new() };
        let nonce = if phase == Phase::Handshake {
            match random::bytes::<NONCE_BYTES>() {
                Ok(n) => n,
                Err(e) => {
                    log::error!("{peer}: no nonce for its challenge: {e}; closing");
                    let _ = self.poll.registry().deregister(&mut stream);
                    self.free.push(slot);
                    return None;
                }
            }
        } else {
            [0; NONCE_BYTES]
        };
        // The server speaks first: the challenge the Hello must answer.
        let output = match phase {
            Phase::Handshake => bytemuck::bytes_of(&Challenge::new(nonce, self.rules.token.is_some())).to_vec(),
            _ => Vec::new(),
        };
        self.slots[slot] = Some(Connection { id, stream, peer, phase, input, output, sent: 0, closing: false, lingering: false, nonce });
        if phase == Phase::Handshake {
            let mut out = Vec::new();
            self.flush(slot, &mut out);
            self.queued.append(&mut out);
        }
        Some(id)
    }

    /// Makes room: the oldest handshake from `source` is told busy and closed.
    fn evict(&mut self, source: IpAddr) {
        let victim = self
            .deadlines
            .iter()
            .map(|d| d.1)
            .find(|&id| self.get(id).is_some_and(|c| c.phase == Phase::Handshake && c.peer.ip() == source));
        if let Some(id) = victim {
            self.quiet.evicted += 1;
            self.quiet.sample = Some(source);
            self.counters.refused(RejectCode::Busy);
            self.refuse_handshake(id, RejectCode::Busy, "", "evicted from a full handshake table; try again later");
        }
    }

    fn get(&self, id: u64) -> Option<&Connection> {
        self.slots.get((id & 0xffff_ffff) as usize).and_then(|s| s.as_ref()).filter(|c| c.id == id)
    }

    fn slot_of(&self, id: u64) -> Option<usize> {
        self.get(id).map(|_| (id & 0xffff_ffff) as usize)
    }

    /// Writes what is queued; closes once done if asked to.
    fn flush(&mut self, slot: usize, out: &mut Vec<ConnEvent>) {
        let Some(c) = self.slots[slot].as_mut() else { return };
        while c.sent < c.output.len() {
            match c.stream.write(&c.output[c.sent..]) {
                Ok(0) => break,
                Ok(n) => c.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    // The peer is gone: the read side says so too, or this does.
                    c.output.clear();
                    c.sent = 0;
                    if c.closing || c.phase == Phase::Rank {
                        self.drop_slot(slot, out);
                    }
                    return;
                }
            }
        }
        c.output.clear();
        c.sent = 0;
        if c.closing && c.phase == Phase::Refused && !c.lingering && self.lingering.len() < MAX_LINGERING {
            // The reject is out: FIN after it, and wait for the peer's close.
            let _ = c.stream.shutdown(Shutdown::Write);
            c.lingering = true;
            self.lingering.push_back((Instant::now() + LINGER, c.id));
        } else if c.closing && !c.lingering {
            let _ = c.stream.shutdown(Shutdown::Both);
            self.drop_slot(slot, out);
        }
    }

    /// Queues `bytes` for connection `id` and writes what the socket takes now.
    pub fn send(&mut self, id: u64, bytes: &[u8]) -> Result<(), &'static str> {
        let Some(slot) = self.slot_of(id) else { return Err("the connection is closed") };
        let c = self.slots[slot].as_mut().expect("live slot");
        if c.closing {
            return Err("the connection is closing");
        }
        if c.output.len() - c.sent + bytes.len() > MAX_OUT_BYTES {
            log::warn!("{}: {} bytes unsent: the peer does not read; closing", c.peer, c.output.len() - c.sent);
            self.close(id);
            return Err("the peer does not read its messages");
        }
        c.output.extend_from_slice(bytes);
        let mut out = Vec::new();
        self.flush(slot, &mut out);
        self.queued.append(&mut out);
        Ok(())
    }

    /// Sends a reject and closes the connection once it is written.
    pub fn refuse(&mut self, id: u64, code: RejectCode, field: &str, msg: &str) {
        let r = Reject::new(code, field, msg);
        if self.send(id, bytemuck::bytes_of(&r)).is_ok() {
            self.close(id);
        }
    }

    /// Closes `id` once what is queued for it is written.
    pub fn close(&mut self, id: u64) {
        let Some(slot) = self.slot_of(id) else { return };
        self.slots[slot].as_mut().expect("live slot").closing = true;
        let mut out = Vec::new();
        self.flush(slot, &mut out);
        self.queued.append(&mut out);
    }

    /// Sends a reject to a connection that is not a rank (in its handshake,
    /// or refused at accept) and closes it once written, lingering (see [`LINGER`]).
    fn refuse_handshake(&mut self, id: u64, code: RejectCode, field: &str, msg: &str) {
        if let Some(slot) = self.slot_of(id) {
            let c = self.slots[slot].as_mut().expect("live slot");
            if c.phase == Phase::Handshake {
                // It leaves the table now, not when the reject is written.
                c.phase = Phase::Refused;
                c.input = Vec::new();
                self.admission.leave(c.peer.ip());
            }
            c.closing = true;
            c.output.extend_from_slice(bytemuck::bytes_of(&Reject::new(code, field, msg)));
            let mut out = Vec::new();
            self.flush(slot, &mut out);
            self.queued.append(&mut out);
        }
    }

    /// Closes handshakes past their deadline, and refused connections past their linger.
    fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, id)) = self.lingering.front() {
            if deadline > now {
                break;
            }
            self.lingering.pop_front();
            if let Some(slot) = self.slot_of(id) {
                let mut out = Vec::new();
                self.drop_slot(slot, &mut out);
            }
        }
        while let Some(&(deadline, id)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            if self.get(id).is_some_and(|c| c.phase == Phase::Handshake) {
                self.quiet.timed_out += 1;
                self.counters.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
                let (peer, got) = self.get(id).map(|c| (c.peer, c.input.len())).expect("checked");
                if self.quiet.timed_out == 1 {
                    self.quiet.sample = Some(peer.ip());
                }
                log::debug!("{peer}: no complete handshake within {:?} ({got} bytes); closing", self.rules.handshake_timeout);
                self.refuse_handshake(id, RejectCode::Timeout, "", "handshake not completed in time");
            }
        }
    }

    /// At most one line a second about refused and expired connections.
    fn summarize(&mut self, now: Instant) {
        let q = &mut self.quiet;
        if q.busy_source + q.evicted + q.timed_out + q.refused.iter().sum::<u64>() == 0 {
            return;
        }
        if q.last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            return;
        }
        let mut parts = Vec::new();
        if q.busy_source > 0 {
            parts.push(format!(
                "{} refused as busy (their address already had {} in their handshake)",
                q.busy_source,
                self.admission.max_per_source()
            ));
        }
        if q.evicted > 0 {
            parts.push(format!("{} evicted from the full handshake table ({} places)", q.evicted, self.admission.max_total()));
        }
        if q.timed_out > 0 {
            parts.push(format!("{} closed at their {:?} handshake deadline", q.timed_out, self.rules.handshake_timeout));
        }
        for (n, what) in q.refused.iter().zip(Refusal::NAMES) {
            if *n > 0 {
                parts.push(format!("{n} more handshakes refused {what}"));
            }
        }
        let sample = q.sample.map(|s| format!(" (e.g. from {s})")).unwrap_or_default();
        log::warn!("control connections: {}{sample}; {} in their handshake now", parts.join(", "), self.admission.total());
        *q = Quiet { last: Some(now), accept_errors: q.accept_errors, loud: q.loud, loud_since: q.loud_since, ..Quiet::default() };
    }

    /// A refused handshake: its line in full while fewer than
    /// [`LOUD_REFUSALS`] were logged this second, else counted for
    /// [`Connections::summarize`].
    fn quiet_refusal(&mut self, why: Refusal, peer: SocketAddr, line: impl FnOnce() -> String) {
        let now = Instant::now();
        let q = &mut self.quiet;
        if q.loud_since.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            q.loud_since = Some(now);
            q.loud = 0;
        }
        if q.loud < LOUD_REFUSALS {
            q.loud += 1;
            log::warn!("{peer}: {}", line());
        } else {
            q.refused[why as usize] += 1;
            q.sample = Some(peer.ip());
        }
    }

    /// Forgets a connection; a joined one is reported closed.
    fn drop_slot(&mut self, slot: usize, out: &mut Vec<ConnEvent>) {
        let Some(mut c) = self.slots[slot].take() else { return };
        let _ = self.poll.registry().deregister(&mut c.stream);
        match c.phase {
            Phase::Handshake => self.admission.leave(c.peer.ip()),
            Phase::Rank => {
                self.ranks -= 1;
                out.push(ConnEvent::Closed { conn: c.id });
            }
            Phase::Refused => {} // never a rank: nobody waits for its close
        }
        self.free.push(slot);
    }

    fn publish(&self) {
        self.counters.handshakes.store(self.admission.total() as u64, Ordering::Relaxed);
        self.counters.joined.store(self.ranks as u64, Ordering::Relaxed);
    }

    /// Best effort at shutdown: writes what is queued, without waiting.
    pub fn flush_all(&mut self) {
        let mut out = Vec::new();
        for slot in 0..self.slots.len() {
            self.flush(slot, &mut out);
        }
    }
}
