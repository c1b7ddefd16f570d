//! A small TCP rendezvous for N ranks: how the ranks of a job find each other.
//!
//! Before any fabric traffic can flow, every rank needs the others' endpoint
//! names, and tests need to agree on things like "everyone is done". That is
//! control-plane work: a few hundred bytes, a handful of times per job. This
//! module does it over plain TCP in a star: rank 0 listens on a fixed
//! `ADDR:PORT` that every rank is told in advance, the other ranks connect to
//! it (retrying until their timeout, since rank 0 may start last), and every
//! collective goes through rank 0:
//!
//! ```text
//!   rank 1 ──┐                     gather: each rank sends its frame to rank 0
//!   rank 2 ──┼── rank 0            scatter: rank 0 sends everyone's frames back
//!   rank 3 ──┘
//! ```
//!
//! The star costs 2(N-1) messages per collective, which is nothing at
//! control-plane sizes, and keeps the failure story simple: every rank has at
//! most N-1 sockets, and a dead rank shows up as a closed socket or a timeout
//! on rank 0, which then closes everything.
//!
//! # Frames
//!
//! Every message is a 32-byte header followed by a payload:
//!
//! | bytes | field | why |
//! |---|---|---|
//! | 0..4 | magic `TLYB` | a stray connection (a port scanner, another program) is refused at once |
//! | 4..6 | version | a peer built from other sources is refused, not misread |
//! | 6..8 | kind | hello / welcome / reject / gather / scatter |
//! | 8..12 | sender's rank | a frame on the wrong socket is caught |
//! | 12..16 | nranks | ranks started with different N fail at hello, with both numbers |
//! | 16..24 | sequence | the collective's number: ranks calling different collectives fail |
//! | 24..32 | payload length | bounded by [`MAX_PAYLOAD`], so garbage cannot ask for 1 EiB |
//!
//! All integers are little-endian. Every blocking read and write has the
//! timeout given at creation: a rank that never arrives or dies silently is an
//! error after that long, never a hang.
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Largest payload one frame may carry (the scatter frame carries every
/// rank's bytes, so this bounds N x the per-rank contribution).
pub const MAX_PAYLOAD: u64 = 1 << 30;

const MAGIC: [u8; 4] = *b"TLYB";
const VERSION: u16 = 1;
const HEADER_LEN: usize = 32;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
enum Kind {
    /// A rank announcing itself to rank 0.
    Hello = 1,
    /// Rank 0: every rank has joined.
    Welcome = 2,
    /// Rank 0 refuses this rank (or aborts the job); the payload says why.
    Reject = 3,
    /// A rank's contribution to a collective, to rank 0.
    Gather = 4,
    /// Every rank's contributions, from rank 0.
    Scatter = 5,
}

impl Kind {
    fn from_u16(v: u16) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Reject,
            4 => Kind::Gather,
            5 => Kind::Scatter,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Header {
    kind: Kind,
    rank: u32,
    nranks: u32,
    seq: u64,
    len: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(self.kind as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.rank.to_le_bytes());
        b[12..16].copy_from_slice(&self.nranks.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header; the error says what was wrong with it.
    fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, HeaderError> {
        let first: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if first != MAGIC {
            return Err(HeaderError::Magic(first));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let version = u16_at(4);
        if version != VERSION {
            return Err(HeaderError::Version(version));
        }
        let kind = Kind::from_u16(u16_at(6)).ok_or(HeaderError::Kind(u16_at(6)))?;
        let len = u64_at(24);
        if len > MAX_PAYLOAD {
            return Err(HeaderError::TooLong(len));
        }
        Ok(Header { kind, rank: u32_at(8), nranks: u32_at(12), seq: u64_at(16), len })
    }
}

/// What is wrong with a frame header that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeaderError {
    /// Not the magic `TLYB`: these were the first bytes.
    Magic([u8; 4]),
    /// Another protocol version.
    Version(u16),
    /// A frame kind this build does not know.
    Kind(u16),
    /// A payload longer than [`MAX_PAYLOAD`].
    TooLong(u64),
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Magic(first) => {
                write!(f, "not a tally bootstrap frame (first bytes {first:02x?}, expected {MAGIC:02x?} \"TLYB\")")
            }
            HeaderError::Version(v) => write!(f, "bootstrap protocol version {v}, this build speaks {VERSION}"),
            HeaderError::Kind(k) => write!(f, "unknown frame kind {k}"),
            HeaderError::TooLong(len) => write!(f, "frame payload of {len} bytes exceeds the {MAX_PAYLOAD}-byte limit"),
        }
    }
}

/// Why a rendezvous or a collective failed.
#[derive(Debug)]
pub enum BootstrapError {
    /// The arguments cannot work: rank out of range, no ranks, an address
    /// that does not parse or resolve, port 0 where others must find it.
    Config(String),
    /// A socket call failed.
    Io { what: String, source: io::Error },
    /// Nothing happened within the timeout (connecting, or a peer's frame).
    Timeout { what: String, after: Duration },
    /// A peer closed its connection.
    Closed { peer: u32 },
    /// A peer sent something that is not the frame expected now.
    Protocol { peer: Option<u32>, detail: String },
    /// Rank 0 refused this rank or aborted the job; its reason.
    Rejected(String),
}

impl fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootstrapError::Config(s) => write!(f, "bootstrap: {s}"),
            BootstrapError::Io { what, source } => write!(f, "bootstrap: {what}: {source}"),
            BootstrapError::Timeout { what, after } => {
                write!(f, "bootstrap: timed out after {:.1} s {what}", after.as_secs_f64())
            }
            BootstrapError::Closed { peer } => {
                write!(f, "bootstrap: rank {peer} closed its connection")
            }
            BootstrapError::Protocol { peer: Some(p), detail } => {
                write!(f, "bootstrap: bad frame from rank {p}: {detail}")
            }
            BootstrapError::Protocol { peer: None, detail } => {
                write!(f, "bootstrap: bad frame from an unidentified connection: {detail}")
            }
            BootstrapError::Rejected(why) => {
                write!(f, "bootstrap: rank 0 refused this rank or aborted: {why}")
            }
        }
    }
}

impl std::error::Error for BootstrapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BootstrapError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Maps a socket error to Timeout / Closed / Io.
fn io_error(e: io::Error, what: impl Into<String>, peer: u32, timeout: Duration) -> BootstrapError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => BootstrapError::Timeout { what: what.into(), after: timeout },
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe => {
            BootstrapError::Closed { peer }
        }
        _ => BootstrapError::Io { what: what.into(), source: e },
    }
}

fn resolve(addr: &str) -> Result<SocketAddr, BootstrapError> {
    addr.to_socket_addrs()
        .map_err(|e| BootstrapError::Config(format!("cannot resolve {addr:?} (expected ADDR:PORT): {e}")))?
        .next()
        .ok_or_else(|| BootstrapError::Config(format!("{addr:?} resolves to no address")))
}

fn check_ranks(rank: u32, nranks: u32) -> Result<(), BootstrapError> {
    if nranks == 0 {
        return Err(BootstrapError::Config("nranks must be at least 1".into()));
    }
    if rank >= nranks {
        return Err(BootstrapError::Config(format!("rank {rank} is out of range for {nranks} ranks")));
    }
    Ok(())
}

/// One TCP connection to a peer, with the framing and the timeouts.
struct Link {
    stream: TcpStream,
    /// The rank at the other end.
    peer: u32,
}

impl Link {
    fn new(stream: TcpStream, peer: u32, timeout: Duration) -> Result<Link, BootstrapError> {
        let setup = |e| BootstrapError::Io { what: "configuring a bootstrap socket".into(), source: e };
        stream.set_nonblocking(false).map_err(setup)?;
        stream.set_read_timeout(Some(timeout)).map_err(setup)?;
        stream.set_write_timeout(Some(timeout)).map_err(setup)?;
        // Frames are small and answered at once: do not wait for Nagle.
        stream.set_nodelay(true).map_err(setup)?;
        Ok(Link { stream, peer })
    }

    fn send(&mut self, h: Header, payload: &[u8], timeout: Duration) -> Result<(), BootstrapError> {
        debug_assert_eq!(h.len, payload.len() as u64);
        let what = || format!("sending a {:?} frame to rank {}", h.kind, self.peer);
        self.stream.write_all(&h.encode()).map_err(|e| io_error(e, what(), self.peer, timeout))?;
        self.stream.write_all(payload).map_err(|e| io_error(e, what(), self.peer, timeout))?;
        Ok(())
    }

    /// Reads one frame. A Reject frame becomes `Rejected`; any other kind is
    /// returned for the caller to check.
    fn recv(&mut self, timeout: Duration, waiting_for: &str) -> Result<(Header, Vec<u8>), BootstrapError> {
        let what = || format!("waiting for {waiting_for} from rank {}", self.peer);
        let mut hb = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut hb).map_err(|e| io_error(e, what(), self.peer, timeout))?;
        let h = Header::decode(&hb).map_err(|e| BootstrapError::Protocol { peer: Some(self.peer), detail: e.to_string() })?;
        let mut payload = vec![0u8; h.len as usize];
        self.stream.read_exact(&mut payload).map_err(|e| io_error(e, what(), self.peer, timeout))?;
        if h.kind == Kind::Reject {
            return Err(BootstrapError::Rejected(String::from_utf8_lossy(&payload).into_owned()));
        }
        Ok((h, payload))
    }
}

/// Rank 0's listening socket, bound but not yet accepting: lets the caller
/// bind port 0 and hand the chosen port to the other ranks (tests do).
pub struct BootstrapListener {
    listener: TcpListener,
    addr: SocketAddr,
}

impl BootstrapListener {
    /// The address the listener is bound to, with the real port.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Becomes rank 0 of `nranks`: accepts the other ranks (until `timeout`
    /// passes), checks them, and welcomes them all.
    pub fn accept(self, nranks: u32, timeout: Duration) -> Result<Bootstrap, BootstrapError> {
        check_ranks(0, nranks)?;
        let deadline = Instant::now() + timeout;
        // Index r-1 holds rank r's link once it has said hello.
        let mut links: Vec<Option<Link>> = (1..nranks).map(|_| None).collect();
        let mut joined = 0;
        self.listener.set_nonblocking(true).map_err(|e| BootstrapError::Io { what: "configuring the listener".into(), source: e })?;
        while joined < links.len() {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<u32> = (1..nranks).filter(|r| links[*r as usize - 1].is_none()).collect();
                        return Err(BootstrapError::Timeout {
                            what: format!("on {} waiting for ranks {missing:?} to connect", self.addr),
                            after: timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Err(e) => return Err(BootstrapError::Io { what: format!("accepting on {}", self.addr), source: e }),
            };
            // Until it has said hello we do not know who this is, and it may
            // say nothing at all: wait for the hello no longer than the
            // accept deadline allows.
            let hello_wait = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
            let mut link = Link::new(stream, u32::MAX, hello_wait)?;
            let got = link.recv(hello_wait, "a hello");
            if let Err(BootstrapError::Closed { .. }) = got {
                // A rank's connect that gave up (its 1 s attempt timed out
                // while the connection waited in our backlog) and was retried:
                // the retry is the one that says hello.
                continue;
            }
            let (h, _) = got.map_err(|e| {
                let detail = match e {
                    BootstrapError::Protocol { detail, .. } => detail,
                    BootstrapError::Timeout { .. } => {
                        format!("no hello within {:.1} s", hello_wait.as_secs_f64())
                    }
                    BootstrapError::Closed { .. } => "closed before saying hello".into(),
                    other => other.to_string(),
                };
                BootstrapError::Protocol { peer: None, detail }
            })?;
            link.stream
                .set_read_timeout(Some(timeout))
                .map_err(|e| BootstrapError::Io { what: "configuring a bootstrap socket".into(), source: e })?;
            let refuse = |link: &mut Link, why: String| {
                // Best effort: tell the peer why before failing here too.
                let reject = Header { kind: Kind::Reject, rank: 0, nranks, seq: 0, len: why.len() as u64 };
                let _ = link.send(reject, why.as_bytes(), timeout);
                why
            };
            if h.kind != Kind::Hello {
                let why = refuse(&mut link, format!("expected a hello, got a {:?} frame", h.kind));
                return Err(BootstrapError::Protocol { peer: None, detail: why });
            }
            link.peer = h.rank;
            if h.nranks != nranks {
                let why = refuse(&mut link, format!("rank {} was started with {} ranks, rank 0 with {nranks}", h.rank, h.nranks));
                return Err(BootstrapError::Protocol { peer: Some(h.rank), detail: why });
            }
            if h.rank == 0 || h.rank >= nranks {
                let why = refuse(&mut link, format!("rank {} is not a rank 1..{} may connect as", h.rank, nranks));
                return Err(BootstrapError::Protocol { peer: Some(h.rank), detail: why });
            }
            let slot = &mut links[h.rank as usize - 1];
            if slot.is_some() {
                let why = refuse(&mut link, format!("rank {} connected twice", h.rank));
                return Err(BootstrapError::Protocol { peer: Some(h.rank), detail: why });
            }
            *slot = Some(link);
            joined += 1;
        }
        let mut links: Vec<Link> = links.into_iter().map(|l| l.expect("every rank joined")).collect();
        for link in &mut links {
            let welcome = Header { kind: Kind::Welcome, rank: 0, nranks, seq: 0, len: 0 };
            link.send(welcome, &[], timeout)?;
        }
        Ok(Bootstrap { rank: 0, nranks, timeout, seq: 0, links })
    }
}

/// A joined group of N ranks and their control-plane connections.
///
/// Every rank must call the same collectives in the same order; a rank that
/// calls another one, or none, is detected (sequence numbers, timeouts) and
/// reported as an error on every rank it is connected to.
pub struct Bootstrap {
    rank: u32,
    nranks: u32,
    timeout: Duration,
    /// Collectives completed so far: the sequence number of the next one.
    seq: u64,
    /// Rank 0: links to ranks 1..N (index r-1). Other ranks: the link to rank 0.
    links: Vec<Link>,
}

impl Bootstrap {
    /// Joins the group: rank 0 listens on `addr` (a fixed port; 0 is refused,
    /// since the others could not find it) and waits for the others; any
    /// other rank connects to `addr`, retrying until `timeout`. Returns once
    /// every rank has joined. `timeout` also bounds every later blocking read.
    pub fn new(addr: &str, rank: u32, nranks: u32, timeout: Duration) -> Result<Bootstrap, BootstrapError> {
        check_ranks(rank, nranks)?;
        if rank == 0 {
            let sa = resolve(addr)?;
            if sa.port() == 0 && nranks > 1 {
                return Err(BootstrapError::Config(format!(
                    "rank 0 needs a fixed port to listen on ({addr:?} has port 0; \
                     use Bootstrap::listen to pick one and pass it on)"
                )));
            }
            Bootstrap::listen(addr)?.accept(nranks, timeout)
        } else {
            Bootstrap::connect(addr, rank, nranks, timeout)
        }
    }

    /// Binds rank 0's listening socket. Port 0 picks a free port, which
    /// [`BootstrapListener::port`] reports.
    pub fn listen(addr: &str) -> Result<BootstrapListener, BootstrapError> {
        let sa = resolve(addr)?;
        // A thousand ranks connect at once: std's backlog of 128 would drop
        // SYNs and make them wait out retransmits.
        let bind = || -> io::Result<TcpListener> {
            let s = socket2::Socket::new(socket2::Domain::for_address(sa), socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
            s.set_reuse_address(true)?;
            s.bind(&sa.into())?;
            s.listen(4096)?;
            Ok(s.into())
        };
        let listener = bind().map_err(|e| BootstrapError::Io { what: format!("binding the bootstrap listener to {sa}"), source: e })?;
        let addr = listener.local_addr().map_err(|e| BootstrapError::Io { what: "reading the listener's address".into(), source: e })?;
        Ok(BootstrapListener { listener, addr })
    }

    /// Joins as rank `rank` (not 0) by connecting to rank 0 at `addr`,
    /// retrying until `timeout`, and waiting for rank 0's welcome.
    pub fn connect(addr: &str, rank: u32, nranks: u32, timeout: Duration) -> Result<Bootstrap, BootstrapError> {
        check_ranks(rank, nranks)?;
        if rank == 0 {
            return Err(BootstrapError::Config("rank 0 listens; it does not connect".into()));
        }
        let sa = resolve(addr)?;
        let deadline = Instant::now() + timeout;
        let stream = loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(BootstrapError::Timeout { what: format!("connecting to rank 0 at {sa}"), after: timeout });
            }
            match TcpStream::connect_timeout(&sa, remaining.min(Duration::from_secs(1))) {
                Ok(s) => break s,
                // Rank 0 not listening yet (or the backlog is full): try again.
                Err(_) => std::thread::sleep(Duration::from_millis(10).min(remaining)),
            }
        };
        let mut link = Link::new(stream, 0, timeout)?;
        let hello = Header { kind: Kind::Hello, rank, nranks, seq: 0, len: 0 };
        link.send(hello, &[], timeout)?;
        let (h, _) = link.recv(timeout, "the welcome (all ranks joined)")?;
        if h.kind != Kind::Welcome || h.rank != 0 || h.nranks != nranks {
            return Err(BootstrapError::Protocol { peer: Some(0), detail: format!("expected a welcome for {nranks} ranks, got {h:?}") });
        }
        Ok(Bootstrap { rank, nranks, timeout, seq: 0, links: vec![link] })
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Every rank's `mine`, in rank order. Lengths may differ between ranks.
    pub fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let seq = self.seq + 1;
        let result = if self.rank == 0 { self.allgather_root(mine, seq) } else { self.allgather_leaf(mine, seq) };
        if let Err(e) = &result {
            self.abort(&format!("collective #{seq} failed on rank 0: {e}"));
        }
        self.seq = seq;
        result
    }

    fn allgather_root(&mut self, mine: &[u8], seq: u64) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let (nranks, timeout) = (self.nranks, self.timeout);
        let mut all = Vec::with_capacity(nranks as usize);
        all.push(mine.to_vec());
        for link in &mut self.links {
            let (h, payload) = link.recv(timeout, "its part of a collective")?;
            if h.kind != Kind::Gather || h.rank != link.peer || h.nranks != nranks || h.seq != seq {
                return Err(BootstrapError::Protocol {
                    peer: Some(link.peer),
                    detail: format!(
                        "expected gather #{seq} from rank {} of {nranks}, got {:?} #{} from rank {} of {}",
                        link.peer, h.kind, h.seq, h.rank, h.nranks
                    ),
                });
            }
            all.push(payload);
        }
        // The scatter payload: for each rank, a u64 length and the bytes.
        let total: usize = all.iter().map(|p| 8 + p.len()).sum();
        if total as u64 > MAX_PAYLOAD {
            return Err(BootstrapError::Config(format!("an allgather of {total} bytes in all exceeds the {MAX_PAYLOAD}-byte frame limit")));
        }
        let mut packed = Vec::with_capacity(total);
        for p in &all {
            packed.extend_from_slice(&(p.len() as u64).to_le_bytes());
            packed.extend_from_slice(p);
        }
        let h = Header { kind: Kind::Scatter, rank: 0, nranks, seq, len: packed.len() as u64 };
        for link in &mut self.links {
            link.send(h, &packed, timeout)?;
        }
        Ok(all)
    }

    fn allgather_leaf(&mut self, mine: &[u8], seq: u64) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let (rank, nranks, timeout) = (self.rank, self.nranks, self.timeout);
        if mine.len() as u64 > MAX_PAYLOAD {
            return Err(BootstrapError::Config(format!("{} bytes exceed the frame limit", mine.len())));
        }
        let link = &mut self.links[0];
        let h = Header { kind: Kind::Gather, rank, nranks, seq, len: mine.len() as u64 };
        link.send(h, mine, timeout)?;
        let (h, packed) = link.recv(timeout, "the result of a collective")?;
        let bad = |detail: String| BootstrapError::Protocol { peer: Some(0), detail };
        if h.kind != Kind::Scatter || h.rank != 0 || h.nranks != nranks || h.seq != seq {
            return Err(bad(format!("expected scatter #{seq} for {nranks} ranks, got {h:?}")));
        }
        let mut all = Vec::with_capacity(nranks as usize);
        let mut rest = &packed[..];
        for r in 0..nranks {
            let malformed = || bad(format!("scatter #{seq} is cut short at rank {r}'s part"));
            let len_bytes: [u8; 8] = rest.get(..8).ok_or_else(malformed)?.try_into().expect("8 bytes");
            let len = u64::from_le_bytes(len_bytes) as usize;
            let part = rest.get(8..8usize.saturating_add(len)).ok_or_else(malformed)?;
            all.push(part.to_vec());
            rest = &rest[8 + len..];
        }
        if !rest.is_empty() {
            return Err(bad(format!("scatter #{seq} has {} bytes after the last rank's part", rest.len())));
        }
        if all[rank as usize] != mine {
            return Err(bad(format!("scatter #{seq} does not carry back this rank's own bytes")));
        }
        Ok(all)
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&mut self) -> Result<(), BootstrapError> {
        self.allgather(&[]).map(|_| ())
    }

    /// `root`'s `data`, on every rank (what the others pass is ignored).
    pub fn broadcast(&mut self, root: u32, data: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        if root >= self.nranks {
            return Err(BootstrapError::Config(format!("broadcast root {root} of {} ranks", self.nranks)));
        }
        let mine = if self.rank == root { data } else { &[] };
        let mut all = self.allgather(mine)?;
        Ok(std::mem::take(&mut all[root as usize]))
    }

    /// The sum of every rank's `value` (modulo 2^64), on every rank.
    pub fn reduce_sum_u64(&mut self, value: u64) -> Result<u64, BootstrapError> {
        let all = self.allgather(&value.to_le_bytes())?;
        let mut sum = 0u64;
        for (r, part) in all.iter().enumerate() {
            let bytes: [u8; 8] = part.as_slice().try_into().map_err(|_| BootstrapError::Protocol {
                peer: Some(r as u32),
                detail: format!("reduce_sum_u64: rank {r} contributed {} bytes, not 8", part.len()),
            })?;
            sum = sum.wrapping_add(u64::from_le_bytes(bytes));
        }
        Ok(sum)
    }

    /// On rank 0, after a failed collective: tell every other rank (best
    /// effort) so they fail now rather than at their timeout. (A failure on
    /// another rank shows at rank 0 as an error on that rank's socket.)
    fn abort(&mut self, why: &str) {
        if self.rank != 0 {
            return;
        }
        let h = Header { kind: Kind::Reject, rank: 0, nranks: self.nranks, seq: self.seq, len: why.len() as u64 };
        for link in &mut self.links {
            let _ = link.send(h, why.as_bytes(), self.timeout);
        }
    }
}

impl fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bootstrap").field("rank", &self.rank).field("nranks", &self.nranks).field("seq", &self.seq).finish()
    }
}
