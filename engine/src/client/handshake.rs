//! A control connection from its connect to the server's answer, as every
//! join makes it: a sub-job's (`join.rs`), a recovery's redo jobs' and a
//! rejoin's (`failover/`). Connects are retried until a deadline; the
//! Hello ([`hello_to`]) names the rails of the server's lanes and is
//! answered to the server's challenge (`greet.rs`); the answer
//! ([`await_answer`]) is a grant, a refusal, or busy (joined again after a
//! jittered backoff, as in a join storm); an accepted connection gets TCP
//! keepalive ([`keepalive`]).
use super::config::MIN_SPREAD_PIECE;
use super::error::ClientError;
use super::greet::greet;
use super::state::Core;
use crate::dataplane::fabric::EndpointName;
use crate::wire::{self, Accept, HelloMessage, JobSpec, JobTag, Kind, NameRecord, Reject, RejectCode, TOKEN_BYTES};
use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The Hello to server `si`: it names the rails that carry its streams
/// (its lanes, `Rails::lanes`).
pub(super) fn hello_to(c: &Core, si: usize, spec: &JobSpec) -> Result<HelloMessage, ClientError> {
    let names: Vec<&[u8]> = c.rails.lanes(si).map(|r| c.rails.name(r).as_bytes()).collect();
    HelloMessage::new(spec, c.cfg.rank, &c.cfg.job_secret, &names).ok_or_else(|| ClientError::Fabric("endpoint name too long".into()))
}

/// Reads a server's answer to `hello` on `s`. A server that is busy
/// (too many connections in their handshake, as in a join storm) says
/// so at once: join again after a jittered backoff, until the join
/// deadline; so does one whose connection broke before it answered, if
/// `rejoin_broken` (a server restarting under a job's start). `limit`
/// bounds the whole wait from `join_started`. Ok(Err(reject)): the server
/// refused the job.
#[allow(clippy::too_many_arguments)]
pub(super) fn await_answer(
    rank: u32,
    token: &[u8; TOKEN_BYTES],
    server: &str,
    s: &mut TcpStream,
    hello: &HelloMessage,
    join_started: Instant,
    limit: Duration,
    rejoin_broken: bool,
) -> Result<Result<Granted, Box<Reject>>, ClientError> {
    let _ = s.set_read_timeout(Some(limit + Duration::from_secs(5)));
    let mut tries = 0u32;
    loop {
        match read_answer(s) {
            Ok(a) => return Ok(Ok(a)),
            Err(Answer::Rejected(r)) if r.code() == Some(RejectCode::Busy) => {
                let waited = join_started.elapsed();
                if waited >= limit {
                    return Err(ClientError::Refused {
                        server: server.to_string(),
                        reject: format!(
                            "{r} (retried {tries} times for {:.1} s, until the join deadline of {:.0} s)",
                            waited.as_secs_f64(),
                            limit.as_secs_f64()
                        ),
                    });
                }
                tries += 1;
                let pause = join_backoff(tries, rank).min(limit - waited);
                log::debug!("server {server} is busy ({r}); joining again in {pause:?} (try {tries})");
                std::thread::sleep(pause);
                *s = hello_again(server, hello, token, limit.saturating_sub(join_started.elapsed()))?;
                let _ = s.set_read_timeout(Some(limit + Duration::from_secs(5)));
            }
            Err(Answer::Rejected(r)) => return Ok(Err(r)),
            // The connection broke before the answer (the server died or
            // restarts): join again, as after `busy`, until the deadline.
            // Every rank of the job then meets the server's next life.
            Err(Answer::Io(e)) if rejoin_broken && join_started.elapsed() + Duration::from_millis(100) < limit => {
                tries += 1;
                let pause = join_backoff(tries, rank).min(limit.saturating_sub(join_started.elapsed()));
                log::info!("server {server}: the join broke off ({e}); joining again in {pause:?}");
                std::thread::sleep(pause);
                *s = hello_again(server, hello, token, limit.saturating_sub(join_started.elapsed()))?;
                let _ = s.set_read_timeout(Some(limit + Duration::from_secs(5)));
            }
            Err(Answer::Io(e)) => return Err(ClientError::Connect { server: server.to_string(), error: e }),
        }
    }
}

/// The pause before join attempt `tries` + 1 after a `busy` answer: 50 ms
/// doubling to 2 s, each drawn between half and all of that (ranks that
/// were turned away together do not come back together).
pub(super) fn join_backoff(tries: u32, rank: u32) -> Duration {
    let cap_ms = (50u64 << tries.min(6)).min(2000);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64);
    let mut x = nanos ^ (u64::from(rank) << 32) ^ u64::from(tries).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    Duration::from_millis(cap_ms / 2 + x % (cap_ms / 2 + 1))
}

/// TCP keepalive on a job's control connection, probing after 2 s idle,
/// every second, 3 times: a server whose host went away or whose link is
/// down is noticed in about 5 s (the connection fails, and failover takes
/// over), where TCP alone would wait for minutes. A SIGKILLed server's
/// kernel closes the connection at once; this is for hosts that vanish.
/// (Heartbeats, see [`liveness`](super::liveness), notice that in 2 s where the server sends
/// them.) Set once the server accepted the job, not while the join waits:
/// a link down for a few seconds while a job starts must not break a join
/// that the server may have admitted already (the other ranks would run a
/// job this rank can no longer enter); the join deadline bounds that wait.
pub(crate) fn keepalive(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = s.as_raw_fd();
    for (level, name, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 2),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ] {
        let v: libc::c_int = value;
        // SAFETY: fd is an open socket owned by `s`; v is a c_int whose size is passed.
        unsafe {
            libc::setsockopt(fd, level, name, (&v as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t)
        };
    }
}

/// A control connection to `server`, retried until `timeout`; nothing
/// read or sent yet (the server's challenge comes first).
pub(super) fn connect_control(server: &str, timeout: Duration) -> Result<TcpStream, ClientError> {
    let err = |e: String| ClientError::Connect { server: server.to_string(), error: e };
    let addr = server.to_socket_addrs().map_err(|e| err(e.to_string()))?.next().ok_or_else(|| err("no address".into()))?;
    let s = connect_retry(&addr, timeout).map_err(|e| err(e.to_string()))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// A control connection to `server` (retried until `timeout`) that has
/// sent `hello`, answered to the server's challenge.
pub(super) fn say_hello(
    server: &str,
    hello: &HelloMessage,
    token: &[u8; TOKEN_BYTES],
    timeout: Duration,
) -> Result<TcpStream, ClientError> {
    let mut s = connect_control(server, timeout)?;
    greet(&mut s, hello, token, timeout).map_err(|e| ClientError::Connect { server: server.to_string(), error: e.to_string() })?;
    Ok(s)
}

/// A new control connection to `server` with the same Hello.
pub(super) fn hello_again(
    server: &str,
    hello: &HelloMessage,
    token: &[u8; TOKEN_BYTES],
    timeout: Duration,
) -> Result<TcpStream, ClientError> {
    say_hello(server, hello, token, timeout.max(Duration::from_millis(100)))
}

/// A TCP connection to `addr`, retried until `timeout`; the error is the
/// last attempt's.
pub(super) fn connect_retry(addr: &std::net::SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect_timeout(addr, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

pub(super) enum Answer {
    Rejected(Box<Reject>),
    Io(String),
}

/// What a server's Accept grants a job.
pub(crate) struct Granted {
    /// The job's tag and sequence key.
    pub tag: JobTag,
    /// The job's lcores' endpoint names (the job's shards, in order).
    pub names: Vec<EndpointName>,
    /// Elements per piece (0: as asked).
    pub piece_elems: u32,
    /// The first `.0` names take only operations of at most `.1` bytes
    /// (`Accept::latency_split`).
    pub latency: Option<(usize, usize)>,
    /// The server says it sends heartbeats (`Accept::heartbeat_ms`).
    pub beats: bool,
}

/// An Accept's grant, or why not.
pub(super) fn read_answer(s: &mut TcpStream) -> Result<Granted, Answer> {
    // The read timeout (`await_answer`'s) running out reads as EAGAIN:
    // say what it means instead.
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            Answer::Io("no answer to the Hello in time (a server answers once every rank of the job has joined)".into())
        }
        _ => Answer::Io(e.to_string()),
    };
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr).map_err(io)?;
    let h: wire::Header = wire::read(&hdr).map_err(|e| Answer::Io(e.to_string()))?;
    match h.check().map_err(|e| Answer::Io(e.to_string()))? {
        Kind::Reject => {
            let mut b = [0u8; core::mem::size_of::<Reject>()];
            b[..8].copy_from_slice(&hdr);
            s.read_exact(&mut b[8..]).map_err(io)?;
            let r: Reject = wire::read(&b).map_err(|e| Answer::Io(e.to_string()))?;
            Err(Answer::Rejected(Box::new(r)))
        }
        Kind::Accept => {
            let mut b = [0u8; core::mem::size_of::<Accept>()];
            b[..8].copy_from_slice(&hdr);
            s.read_exact(&mut b[8..]).map_err(io)?;
            let a: Accept = wire::read(&b).map_err(|e| Answer::Io(e.to_string()))?;
            if a.lcores == 0 || a.lcores > 4096 {
                return Err(Answer::Io(format!("accept names {} lcores", a.lcores)));
            }
            let mut names = Vec::new();
            for _ in 0..a.lcores {
                let mut r = [0u8; core::mem::size_of::<NameRecord>()];
                s.read_exact(&mut r).map_err(io)?;
                let rec: NameRecord = wire::read(&r).map_err(|e| Answer::Io(e.to_string()))?;
                let n = rec.name().map_err(|e| Answer::Io(e.to_string()))?;
                names.push(EndpointName::from_bytes(n).ok_or_else(|| Answer::Io("bad name".into()))?);
            }
            Ok(Granted { tag: a.job(), names, piece_elems: a.piece_elems, latency: a.latency_split(), beats: a.heartbeat_ms > 0 })
        }
        k => Err(Answer::Io(format!("unexpected {k:?} from the server"))),
    }
}

/// `ClientConfig::min_piece` as the Hello carries it: 0 for the default
/// ([`MIN_SPREAD_PIECE`]), so that ranks of a build from before the
/// field (which send 0) meet ranks of this one that kept the default; a
/// size past `u32` is sent as `u32::MAX` (the server only compares it).
pub(super) fn wire_min_piece(min_piece: usize) -> u32 {
    if min_piece == MIN_SPREAD_PIECE {
        0
    } else {
        u32::try_from(min_piece).unwrap_or(u32::MAX)
    }
}
