//! The metrics port: a small HTTP/1.1 endpoint on its own thread serving
//! `/metrics` (the Prometheus text exposition), `/healthz` (alive: the
//! control loop turns) and `/readyz` (ready: serving, not draining), GET
//! and HEAD; 404 for any other path, 405 for any other method.
//!
//! It is off the data path but must never hurt it, and it answers the
//! liveness probe, so nobody who can reach the port (it takes no token)
//! may keep that probe out. It therefore serves every connection at once
//! on its one thread, an epoll loop (mio) over non-blocking sockets, with:
//!
//! - a **deadline per request**, not per read: the whole request within
//!   [`REQUEST_TIME`] of the accept, the whole answer written within
//!   [`ANSWER_TIME`] of the request's end; past it the connection is closed,
//!   however often it sent or took a byte meanwhile (a byte every 1.5 s
//!   held the former one-connection-at-a-time loop, whose 2 s timeouts were
//!   per read, for good);
//! - **bounded places**, [`MAX_PER_SOURCE`] per source address and
//!   [`MAX_CONNS`] in all, where a newcomer over a cap displaces the oldest
//!   connection still waiting for its request (its source's own if that
//!   source is the one at its cap) rather than being refused: the rules and
//!   why are [`conns`]'s;
//! - **writes that never block**: an answer goes out as far as the socket
//!   takes it, the rest waits in the connection's buffer for the socket to
//!   be writable, so a client that does not read holds up only itself.
//!
//! A request is at most [`MAX_REQUEST`] bytes (request line plus headers),
//! kept per connection as it arrives; `Connection: close` after every
//! answer. What it reads is atomics and the control plane's published job
//! list; it takes no lock an lcore takes.
//!
//! The request is parsed by `httparse` (the parser hyper uses); the loop
//! around it is hand-written on `mio` (the control plane's event loop,
//! already a dependency), because the servers around would not give these
//! bounds: `tiny_http` runs an accept thread plus a thread per busy
//! connection, with no deadline per request and no cap per source, so idle
//! connections cost threads; hyper (or axum) needs a tokio runtime, a
//! scheduler and a second threading model in a server whose other threads
//! are pinned busy-polling lcores and one mio loop, for three plain-text
//! routes, and still leaves per-source caps and eviction to us. Here the
//! deadlines are plain `Instant`s the loop compares and the caps a table
//! (ARCHITECTURE.md, "Dependencies").
use super::health::{Healthy, ServerHealth, Unhealthy};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub mod conns;

use conns::{Conns, Key, Limits, Verdict};

/// Largest request accepted (request line plus headers).
pub const MAX_REQUEST: usize = 8192;

/// Headers a request may carry (a probe or a scraper sends a handful).
const MAX_HEADERS: usize = 32;

/// From a connection's accept to its request's last byte. A probe or a
/// scrape sends its request within a round trip; kubelet's probe timeout is
/// seconds (config/k8s: 2 s), so a client slower than this has given up.
pub const REQUEST_TIME: Duration = Duration::from_secs(2);

/// From a request's last byte to its answer's. A scrape of a big server is
/// some hundred KiB, which any reader takes within this.
pub const ANSWER_TIME: Duration = Duration::from_secs(2);

/// Connections one source address may hold. A source is a scraper, a
/// node's kubelet, a person with curl: one or two at a time each, a few
/// behind one NAT address; 8 leaves room for them and for retries, and
/// past it a source displaces its own idle connections (see [`conns`]).
pub const MAX_PER_SOURCE: u32 = 8;

/// Connections held in all: 32 sources at their cap. Bounds what the port
/// costs, whatever comes: this many descriptors and at most
/// `MAX_CONNS * MAX_REQUEST` (2 MiB) of requests being read.
pub const MAX_CONNS: usize = 256;

/// Accepts per turn of the loop: in a flood, the readiness of connections
/// accepted earlier (a probe's request) is served between batches, before
/// newer connections could evict them.
const ACCEPTS_PER_TURN: usize = 64;

/// After an accept error (out of descriptors), the next try. The
/// connection waits in the backlog, and epoll will not say so again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Evictions and refusals are logged at most this often (with a count).
const SHED_LOG_EVERY: Duration = Duration::from_secs(60);

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// Tokens of connections: their key in the table + this.
const FIRST_CONN: usize = 2;

/// The content type of the Prometheus text format.
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// The metrics endpoint's thread. Dropping it stops and joins the thread.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

/// Why the metrics endpoint did not start.
#[derive(Debug)]
pub enum MetricsError {
    /// Its address cannot be bound.
    Bind { listen: String, source: std::io::Error },
    /// Setting up the bound socket or its thread failed.
    Socket(std::io::Error),
}

impl fmt::Display for MetricsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsError::Bind { listen, source } => write!(f, "cannot serve metrics on {listen}: {source}"),
            MetricsError::Socket(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for MetricsError {}

impl MetricsServer {
    /// Binds `listen` and serves: `render()` on every scrape of `/metrics`,
    /// `health`'s answers on `/healthz` and `/readyz`.
    pub fn start<F>(listen: &str, health: Arc<ServerHealth>, render: F) -> Result<MetricsServer, MetricsError>
    where
        F: Fn() -> String + Send + 'static,
    {
        let listener = std::net::TcpListener::bind(listen).map_err(|source| MetricsError::Bind { listen: listen.to_string(), source })?;
        let addr = listener.local_addr().map_err(MetricsError::Socket)?;
        listener.set_nonblocking(true).map_err(MetricsError::Socket)?;
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new().map_err(MetricsError::Socket)?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE).map_err(MetricsError::Socket)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(MetricsError::Socket)?);
        let stop = Arc::new(AtomicBool::new(false));
        let limits = Limits { max_total: MAX_CONNS, max_per_source: MAX_PER_SOURCE, request_time: REQUEST_TIME, answer_time: ANSWER_TIME };
        let mut endpoint = Endpoint {
            poll,
            events: Events::with_capacity(256),
            ready: Vec::with_capacity(256),
            listener,
            conns: Conns::new(limits),
            health,
            render: Box::new(render),
            stop: stop.clone(),
            accept_at: None,
            expired: Vec::new(),
            shed: Shed::default(),
        };
        let thread =
            std::thread::Builder::new().name("tally-metrics".into()).spawn(move || endpoint.run()).map_err(MetricsError::Socket)?;
        Ok(MetricsServer { addr, stop, waker, thread: Some(thread) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The loop may sleep until a deadline, or with none; the waker ends the wait.
        if let Err(e) = self.waker.wake() {
            log::warn!("metrics: cannot wake the endpoint to stop it: {e}");
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection: its request so far, then its answer and how much of it went out.
struct Conn {
    stream: TcpStream,
    input: Vec<u8>,
    output: Vec<u8>,
    sent: usize,
}

/// Connections closed to make room or refused, between log lines.
#[derive(Default)]
struct Shed {
    evicted: u64,
    refused: u64,
    last: Option<Instant>,
    sample: Option<IpAddr>,
}

/// The endpoint's thread: the listener, the connections, what it answers with.
struct Endpoint {
    poll: Poll,
    events: Events,
    /// This turn's ready tokens, copied out of `events` (which the handlers cannot borrow beside `self`).
    ready: Vec<Token>,
    listener: TcpListener,
    conns: Conns<Conn>,
    health: Arc<ServerHealth>,
    render: Box<dyn Fn() -> String + Send>,
    stop: Arc<AtomicBool>,
    /// Accept at this time without a new readiness event: connections left in the
    /// backlog by [`ACCEPTS_PER_TURN`] (now) or by an accept error (a bit later).
    accept_at: Option<Instant>,
    expired: Vec<Key>,
    shed: Shed,
}

impl Endpoint {
    fn run(&mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            self.turn();
        }
    }

    /// Waits for readiness (or the next deadline), serves what is ready,
    /// accepts, and closes what is past its deadline.
    fn turn(&mut self) {
        let now = Instant::now();
        let wake = [self.conns.next_deadline(), self.accept_at].into_iter().flatten().min();
        let timeout = wake.map(|w| w.saturating_duration_since(now));
        if let Err(e) = self.poll.poll(&mut self.events, timeout) {
            if e.kind() != ErrorKind::Interrupted {
                log::warn!("metrics: poll: {e}");
                std::thread::sleep(ACCEPT_RETRY);
            }
            return;
        }
        let mut ready = std::mem::take(&mut self.ready);
        ready.clear();
        ready.extend(self.events.iter().map(|e| e.token()));
        let mut accept = self.accept_at.is_some_and(|t| t <= Instant::now());
        for &token in &ready {
            match token {
                LISTENER => accept = true,
                WAKER => {}
                // Readable or writable alike: the connection goes on from
                // where it is (reading its request, or writing its answer).
                Token(t) => self.progress(t - FIRST_CONN),
            }
        }
        self.ready = ready;
        if accept {
            self.accept();
        }
        let now = Instant::now();
        let mut expired = std::mem::take(&mut self.expired);
        expired.clear();
        self.conns.expired(now, &mut expired);
        for &key in &expired {
            self.close(key);
        }
        self.expired = expired;
        self.log_shed(now);
    }

    fn accept(&mut self) {
        self.accept_at = None;
        for _ in 0..ACCEPTS_PER_TURN {
            match self.listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer.ip()),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("metrics: accept: {e} (retrying in {ACCEPT_RETRY:?})");
                    self.accept_at = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
            }
        }
        self.accept_at = Some(Instant::now());
    }

    /// Takes a new connection into the table (making room as [`Conns::verdict`]
    /// says), and reads at once what it may have sent already.
    fn admit(&mut self, stream: TcpStream, source: IpAddr) {
        match self.conns.verdict(source) {
            Verdict::Admit => {}
            Verdict::Evict(key) => {
                self.shed.evicted += 1;
                self.shed.sample = Some(source);
                self.close(key);
            }
            Verdict::Refuse => {
                self.shed.refused += 1;
                self.shed.sample = Some(source);
                return; // dropped: closed
            }
        }
        let conn = Conn { stream, input: Vec::new(), output: Vec::new(), sent: 0 };
        let key = self.conns.insert(source, Instant::now(), conn);
        let c = self.conns.get_mut(key).expect("just inserted");
        if let Err(e) = self.poll.registry().register(&mut c.stream, Token(key + FIRST_CONN), Interest::READABLE | Interest::WRITABLE) {
            log::warn!("metrics: cannot watch a connection from {source}: {e}");
            self.conns.remove(key);
            return;
        }
        self.progress(key);
    }

    /// Reads `key`'s request, or writes its answer, as far as its socket allows.
    fn progress(&mut self, key: Key) {
        if !self.conns.is_answering(key) && !self.read(key) {
            return;
        }
        if self.conns.is_answering(key) {
            self.flush(key);
        }
    }

    /// Reads what the socket has; once the request is whole (or bad, or too
    /// large), puts the answer in the connection's output. False if the
    /// connection was closed.
    fn read(&mut self, key: Key) -> bool {
        let mut chunk = [0u8; 2048];
        loop {
            let Some(c) = self.conns.get_mut(key) else { return false };
            let answer = if c.input.len() == MAX_REQUEST {
                Some(answer_bytes(false, Answer::text("431 Request Header Fields Too Large", "request too large\n")))
            } else {
                let room = (MAX_REQUEST - c.input.len()).min(chunk.len());
                match c.stream.read(&mut chunk[..room]) {
                    Ok(0) => break, // closed before a whole request
                    Ok(n) => {
                        c.input.extend_from_slice(&chunk[..n]);
                        answer_to(&c.input, &self.health, &*self.render)
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == ErrorKind::Interrupted => None,
                    Err(_) => break,
                }
            };
            if let Some(out) = answer {
                // A body, which no route takes, is left unread.
                c.output = out;
                c.input = Vec::new();
                self.conns.answering(key, Instant::now());
                return true;
            }
        }
        self.close(key);
        false
    }

    /// Writes as much of `key`'s answer as the socket takes; closes it once all went out.
    fn flush(&mut self, key: Key) {
        loop {
            let Some(c) = self.conns.get_mut(key) else { return };
            if c.sent == c.output.len() {
                break;
            }
            match c.stream.write(&c.output[c.sent..]) {
                Ok(0) => break,
                Ok(n) => c.sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.close(key);
    }

    fn close(&mut self, key: Key) {
        if let Some(mut c) = self.conns.remove(key) {
            let _ = self.poll.registry().deregister(&mut c.stream);
        }
    }

    /// A line for connections shed since the last one, at most every [`SHED_LOG_EVERY`].
    fn log_shed(&mut self, now: Instant) {
        let s = &mut self.shed;
        if s.evicted + s.refused == 0 || s.last.is_some_and(|t| now.duration_since(t) < SHED_LOG_EVERY) {
            return;
        }
        log::warn!(
            "metrics: {} connections evicted to make room and {} refused (caps: {MAX_PER_SOURCE} per source, {MAX_CONNS} in all; \
             one from {}): idle connections flood the port",
            s.evicted,
            s.refused,
            s.sample.map_or_else(String::new, |a| a.to_string()),
        );
        *s = Shed { last: Some(now), ..Shed::default() };
    }
}

/// The answer to `input` once it holds a whole request (or a malformed one).
fn answer_to(input: &[u8], health: &ServerHealth, render: &dyn Fn() -> String) -> Option<Vec<u8>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(input) {
        Ok(httparse::Status::Complete(_)) => {
            let (method, target) = (req.method.unwrap_or(""), req.path.unwrap_or(""));
            Some(answer_bytes(method == "HEAD", route(method, target, health, render)))
        }
        Ok(httparse::Status::Partial) => None,
        Err(e) => Some(answer_bytes(false, Answer::text("400 Bad Request", format!("bad request: {e}\n")))),
    }
}

/// An answer: status line, content type, body.
struct Answer {
    status: &'static str,
    content_type: &'static str,
    body: String,
}

impl Answer {
    fn text(status: &'static str, body: impl Into<String>) -> Answer {
        Answer { status, content_type: TEXT, body: body.into() }
    }
}

/// What `method target` gets.
fn route(method: &str, target: &str, health: &ServerHealth, render: &dyn Fn() -> String) -> Answer {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return Answer::text("404 Not Found", "not found: this port serves /metrics, /healthz and /readyz\n");
    }
    if method != "GET" && method != "HEAD" {
        return Answer::text("405 Method Not Allowed", "only GET and HEAD are served\n");
    }
    let now = Instant::now();
    let probe = |r: Result<Healthy, Unhealthy>| match r {
        Ok(line) => Answer::text("200 OK", line.to_string()),
        Err(why) => Answer::text("503 Service Unavailable", why.to_string()),
    };
    match path {
        "/metrics" => Answer { status: "200 OK", content_type: EXPOSITION, body: render() },
        "/healthz" => probe(health.alive_at(now)),
        _ => probe(health.ready_at(now)),
    }
}

/// The answer's bytes (its head only for HEAD, with the length GET would get).
fn answer_bytes(head_only: bool, a: Answer) -> Vec<u8> {
    let allow = if a.status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        a.status,
        a.content_type,
        a.body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(a.body.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::health::ServerPhase;
    use super::*;
    use std::net::TcpStream;

    fn ask(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_health_and_readiness_and_404s_the_rest() {
        let health = Arc::new(ServerHealth::new());
        let m = MetricsServer::start("127.0.0.1:0", health.clone(), || "tally_x 1\n".to_string()).unwrap();
        let get = |path: &str| ask(m.local_addr(), format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\ntally_x 1\n"), "{ok}");
        assert!(ok.contains("Content-Length: 10\r\n") && ok.contains("Content-Type: text/plain; version=0.0.4"), "{ok}");
        assert!(get("/metrics?name[]=x").starts_with("HTTP/1.1 200 OK\r\n"));
        // Alive from the start (the loop gets 5 s to begin), ready once serving.
        assert!(get("/healthz").starts_with("HTTP/1.1 200 OK\r\n"));
        let starting = get("/readyz");
        assert!(
            starting.starts_with("HTTP/1.1 503 Service Unavailable\r\n")
                && starting.ends_with("\r\n\r\nstarting: the lcores, listener and control loop are not all up yet\n"),
            "{starting}"
        );
        health.advance(ServerPhase::Serving);
        health.control_turned(Instant::now());
        assert!(get("/readyz").ends_with("\r\n\r\nready\n"));
        health.advance(ServerPhase::Draining);
        assert!(get("/readyz").starts_with("HTTP/1.1 503"));
        assert!(get("/healthz").starts_with("HTTP/1.1 200"));
        // HEAD: the head GET would get, no body.
        let head = ask(m.local_addr(), b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.contains("Content-Length: 10\r\n") && head.ends_with("\r\n\r\n"), "{head}");
        assert!(get("/").starts_with("HTTP/1.1 404"));
        assert!(get("/healthzz").starts_with("HTTP/1.1 404"));
        let post = ask(m.local_addr(), b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD\r\n"), "{post}");
        assert!(ask(m.local_addr(), b"GET /metrics\0 HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 400"));
    }

    #[test]
    fn a_request_split_over_writes_is_read_whole_and_an_oversized_one_refused() {
        let m = MetricsServer::start("127.0.0.1:0", Arc::new(ServerHealth::new()), || "tally_x 1\n".to_string()).unwrap();
        let mut s = TcpStream::connect(m.local_addr()).unwrap();
        s.write_all(b"GET /metr").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b"ics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        // A head that fills the buffer without ending: refused, and closed
        // with nothing left unread (so the client reads the answer).
        let big = format!("GET /metrics HTTP/1.1\r\nX-Pad: {}", "a".repeat(MAX_REQUEST));
        let mut s = TcpStream::connect(m.local_addr()).unwrap();
        s.write_all(&big.as_bytes()[..MAX_REQUEST]).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
    }

    /// Whether the server closed `s` (end of stream or reset), waiting at most `bound`.
    fn closed_within(s: &mut TcpStream, bound: Duration) -> bool {
        s.set_read_timeout(Some(bound)).unwrap();
        let mut sink = [0u8; 64 << 10];
        let until = Instant::now() + bound;
        while Instant::now() < until {
            match s.read(&mut sink) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
                Err(_) => return true,
            }
        }
        false
    }

    /// A connection to `addr` from the loopback address `source`.
    fn connect_from(source: [u8; 4], addr: SocketAddr) -> TcpStream {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&SocketAddr::from((source, 0)).into()).unwrap();
        s.connect(&addr.into()).unwrap();
        s.into()
    }

    #[test]
    fn a_trickled_request_is_closed_at_its_deadline_and_holds_up_no_probe() {
        let m = MetricsServer::start("127.0.0.1:0", Arc::new(ServerHealth::new()), || "tally_x 1\n".to_string()).unwrap();
        let t0 = Instant::now();
        // Idle connections from the prober's own address, past its cap:
        // they displace each other, and then the probes displace them.
        let idle: Vec<TcpStream> = (0..3 * MAX_PER_SOURCE).map(|_| TcpStream::connect(m.local_addr()).unwrap()).collect();
        let mut trickle = connect_from([127, 0, 0, 2], m.local_addr());
        let trickled = Instant::now();
        let req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        let (mut sent, mut probes) = (0, 0);
        // A byte every 300 ms would take 11 s for the request: it is closed at 2 s.
        let closed_at = loop {
            assert!(sent < req.len(), "the trickle was never closed");
            if trickle.write_all(&req[sent..sent + 1]).is_err() {
                break trickled.elapsed();
            }
            sent += 1;
            let asked = Instant::now();
            let probe = ask(m.local_addr(), b"GET /healthz HTTP/1.1\r\n\r\n");
            assert!(probe.starts_with("HTTP/1.1 200 OK\r\n"), "{probe}");
            assert!(asked.elapsed() < Duration::from_secs(1), "a probe waited {:?}", asked.elapsed());
            probes += 1;
            trickle.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            match trickle.read(&mut [0u8; 1]) {
                Ok(0) => break trickled.elapsed(),
                Ok(_) => panic!("an answer to a partial request"),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break trickled.elapsed(),
            }
        };
        assert!(closed_at >= REQUEST_TIME - Duration::from_millis(100), "closed early: {closed_at:?}");
        assert!(closed_at < REQUEST_TIME + Duration::from_secs(2), "closed late: {closed_at:?}");
        assert!(probes >= 3, "{probes}");
        // The idle ones are all closed by now or soon: displaced, or at their deadline.
        for mut s in idle {
            let left = (t0 + REQUEST_TIME + Duration::from_secs(3)).saturating_duration_since(Instant::now());
            assert!(closed_within(&mut s, left.max(Duration::from_millis(1))), "an idle connection outlived its deadline");
        }
    }

    #[test]
    fn a_client_that_does_not_read_its_answer_holds_up_nobody() {
        // An answer far larger than the socket buffers, never read.
        let m = MetricsServer::start("127.0.0.1:0", Arc::new(ServerHealth::new()), || "x".repeat(64 << 20)).unwrap();
        let mut hog = TcpStream::connect(m.local_addr()).unwrap();
        hog.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let asked = Instant::now();
        assert!(ask(m.local_addr(), b"GET /healthz HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(asked.elapsed() < Duration::from_secs(1), "the probe waited {:?}", asked.elapsed());
        // Its answer's deadline passes: it is closed with the answer cut short.
        std::thread::sleep(ANSWER_TIME + Duration::from_millis(500));
        let mut got = 0usize;
        hog.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match hog.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        assert!(got < 64 << 20, "the whole answer went out: {got} bytes");
    }

    #[test]
    fn dropping_the_server_stops_it_promptly() {
        let m = MetricsServer::start("127.0.0.1:0", Arc::new(ServerHealth::new()), String::new).unwrap();
        let addr = m.local_addr();
        let _idle = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        drop(m);
        assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
        assert!(TcpStream::connect(addr).is_err(), "still listening");
    }
}
