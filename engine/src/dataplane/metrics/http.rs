//! The metrics port: a small HTTP/1.1 endpoint on its own thread serving
//! `/metrics` (the Prometheus text exposition), `/healthz` (alive: the
//! control loop turns) and `/readyz` (ready: serving, not draining), GET
//! and HEAD; 404 for any other path, 405 for any other method.
//!
//! It is off the data path but must never hurt it, nor be held by a client:
//! one connection at a time on one thread, a request of at most
//! [`MAX_REQUEST`] bytes read into a stack buffer, 2 s read and write
//! timeouts, `Connection: close` after every answer. What it reads is
//! atomics and the control plane's published job list; it takes no lock an
//! lcore takes. The request is parsed by `httparse` (the parser hyper
//! uses); the accept loop stays hand-written because the servers of the
//! crates around (tiny_http: a thread per busy connection, no read timeout)
//! would give up those bounds (ARCHITECTURE.md, "Dependencies").
use super::health::{Healthy, ServerHealth, Unhealthy};
use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest request accepted (request line plus headers).
pub const MAX_REQUEST: usize = 8192;

/// Headers a request may carry (a probe or a scraper sends a handful).
const MAX_HEADERS: usize = 32;

/// How long a client may take to send its request or read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// The content type of the Prometheus text format.
const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// The metrics endpoint's thread. Dropping it stops and joins the thread.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
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
        let listener = TcpListener::bind(listen).map_err(|source| MetricsError::Bind { listen: listen.to_string(), source })?;
        let addr = listener.local_addr().map_err(MetricsError::Socket)?;
        listener.set_nonblocking(true).map_err(MetricsError::Socket)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tally-metrics".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => serve_one(s, &health, &render),
                        // Polling accept keeps the stop check simple; 50 ms is
                        // far below any scrape or probe interval.
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(50)),
                        Err(e) => {
                            log::warn!("metrics: accept: {e}");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
            .map_err(MetricsError::Socket)?;
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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

fn serve_one(mut s: TcpStream, health: &ServerHealth, render: &dyn Fn() -> String) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_write_timeout(Some(IO_TIMEOUT));
    let mut buf = [0u8; MAX_REQUEST];
    let mut got = 0;
    // Read until the request head is complete (a body, which no route
    // takes, is left unread).
    loop {
        if got == buf.len() {
            return write_answer(&mut s, false, Answer::text("431 Request Header Fields Too Large", "request too large\n"));
        }
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return, // closed or timed out before a whole request
            Ok(n) => got += n,
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        match httparse::Request::new(&mut headers).parse(&buf[..got]) {
            Ok(httparse::Status::Complete(_)) => break,
            Ok(httparse::Status::Partial) => continue,
            Err(e) => return write_answer(&mut s, false, Answer::text("400 Bad Request", format!("bad request: {e}\n"))),
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    if req.parse(&buf[..got]).is_err() {
        return; // parsed complete just above
    }
    let (method, target) = (req.method.unwrap_or(""), req.path.unwrap_or(""));
    let head = method == "HEAD";
    let answer = route(method, target, health, render);
    write_answer(&mut s, head, answer);
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

/// Writes the answer (its head only for HEAD, with the length GET would get).
fn write_answer(s: &mut TcpStream, head_only: bool, a: Answer) {
    let allow = if a.status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        a.status,
        a.content_type,
        a.body.len()
    );
    let _ = s.write_all(head.as_bytes());
    if !head_only {
        let _ = s.write_all(a.body.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::super::health::ServerPhase;
    use super::*;

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
                && starting.ends_with("\r\n\r\nstarting: the control loop has not turned yet\n"),
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
}
