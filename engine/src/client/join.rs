//! Joining a job: the Hello to every server, the answers (accepted, busy,
//! refused), the retries of a join storm, and the control connections a
//! joined sub-job keeps. All ranks join each (dtype, op) sub-job in the same
//! order, so every server sees the same jobs.
use super::greet::{read_opening, send_answered, Opening};
use super::state::{Flight, GenScratch, Leave, Pacing, Stream, SubJob};
use super::{failover, join_wait, Client, MAX_SUBJOBS};
use crate::client::error::ClientError;
use crate::client::failover::{Fo, Stage};
use crate::client::liveness::Liveness;
use crate::dataplane::fabric::EndpointName;
use crate::reduce::{DataType, ReduceOp};
use crate::wire::{self, Accept, Hello, HelloMessage, JobSpec, JobTag, Kind, NameRecord, Reject, RejectCode, TOKEN_BYTES};
use std::collections::VecDeque;
use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

impl Client {
    pub(super) fn job_id_for(&self, dtype: DataType, op: ReduceOp) -> u64 {
        // The first pair keeps the caller's id; the others derive one.
        match self.subs.iter().position(|s| s.dtype == dtype && s.op == op) {
            Some(0) | None if self.subs.is_empty() => self.cfg.job_id,
            _ => self.sub_job_id(dtype, op),
        }
    }

    /// Joins the job for (dtype, op) on every server, if not joined yet.
    /// Blocks until every rank joined (or the timeout). Collective.
    pub fn join(&mut self, dtype: DataType, op: ReduceOp) -> Result<usize, ClientError> {
        if let Some(i) = self.subs.iter().position(|s| s.dtype == dtype && s.op == op) {
            return Ok(i);
        }
        if self.subs.len() == MAX_SUBJOBS {
            return Err(ClientError::BadArgument(format!("more than {MAX_SUBJOBS} (dtype, op) pairs in one job")));
        }
        // Failover needs another server to move to and a window the report's
        // per-stream bitmap covers.
        let can_fail_over = self.cfg.failover
            && self.cfg.servers.len() > 1
            && self.cfg.servers.len() <= 64
            && self.cfg.window <= 32
            && !self.rails.in_order_sends();
        let mut chunk_elems = (self.cfg.chunk_bytes / dtype.size()).max(1);
        let spec = JobSpec {
            job_id: self.job_id_for(dtype, op),
            nranks: self.cfg.nranks,
            dtype,
            op,
            chunk_elems: chunk_elems as u32,
            window: self.cfg.window,
            shards: self.cfg.shards,
            // One server only: the relay is not combined with failover
            // (see ARCHITECTURE "Small all-reduces"). Every rank has the
            // same server list, so every rank decides alike.
            relay: self.cfg.relay && self.cfg.nranks == 2 && self.cfg.servers.len() == 1,
            // The same for the split, which needs two ranks per lcore.
            split: self.cfg.split
                && self.cfg.servers.len() == 1
                && (wire::SPLIT_MIN_RANKS..=wire::SPLIT_MAX_RANKS).contains(&self.cfg.nranks),
            // Never sealed (`JobSpec::seal_shift`: builds from before
            // 2026-11-29 sealed large all-reduces under failover).
            seal_shift: 0,
            // Every rank takes part in a recovery, or none: the server checks.
            failover: can_fail_over,
            // The server holds every rank to the same order and cut.
            interleave: self.cfg.interleave,
            min_piece: wire_min_piece(self.cfg.min_piece),
            // The first job holds the room of the later ones on each server.
            reserve: if self.subs.is_empty() { self.cfg.reserve } else { 0 },
            sibling: !self.subs.is_empty() && self.cfg.reserve > 0,
        };
        let mut hellos = (0..self.cfg.servers.len()).map(|si| self.hello_to(si, &spec)).collect::<Result<Vec<_>, _>>()?;
        if self.wants_heartbeats() {
            hellos.iter_mut().for_each(|h| h.hello.flags |= Hello::ALIVE);
        }
        // Connect to every server first, then answer each one's challenge
        // as it comes and wait for the answers: servers admit the job only
        // when all ranks are in, on all servers at once. The connects run
        // side by side, and the challenges are taken as they arrive: a
        // server that does not answer yet (its link down a while, or its
        // process frozen after the kernel accepted) must not hold back this
        // rank's Hellos to the others, which could then not tell the other
        // ranks at once if this rank died meanwhile (they would wait out the
        // join timeout).
        let timeout = self.cfg.join_timeout;
        let connected: Vec<Result<TcpStream, ClientError>> = if hellos.len() == 1 {
            vec![connect_control(&self.cfg.servers[0], timeout)]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = self.cfg.servers.iter().map(|server| scope.spawn(move || connect_control(server, timeout))).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err(ClientError::Config("a connect thread panicked".into()))))
                    .collect()
            })
        };
        let controls = connected.into_iter().collect::<Result<Vec<TcpStream>, ClientError>>()?;
        let mut streams = Vec::new();
        let mut latency_max = 0usize;
        // The lcores a split job's small operations may go to (one server).
        let mut small_lcores = 0u32;
        let mut leave = vec![Leave::Serving; controls.len()];
        let mut refused_draining = None;
        let mut controls: Vec<Option<TcpStream>> = controls.into_iter().map(Some).collect();
        let join_started = Instant::now();
        let mut answers = self.collect_answers(&mut controls, &hellos, join_started)?;
        let mut live = Liveness::new(self.cfg.servers.len());
        for (si, slot) in controls.iter_mut().enumerate() {
            let server = &self.cfg.servers[si];
            let Some(s) = slot.as_mut() else { continue };
            let Some(answer) = answers[si].take() else { continue };
            let g = match answer {
                Ok(g) => g,
                // Every rank of the sub-job gets this same answer from a
                // draining server, so all of them leave it out alike.
                Err(r) if r.code() == Some(RejectCode::Draining) => {
                    log::info!("server {server} drains: job {:#x} runs on the other servers", spec.job_id);
                    refused_draining = Some(ClientError::Refused { server: server.clone(), reject: r.to_string() });
                    leave[si] = Leave::At(0);
                    *slot = None;
                    continue;
                }
                Err(r) => return Err(ClientError::Refused { server: server.clone(), reject: r.to_string() }),
            };
            // A server may grant smaller pieces than asked (its slab budget):
            // cut to the smallest grant. Every rank gets the same answers.
            if g.piece_elems != 0 {
                chunk_elems = chunk_elems.min(g.piece_elems as usize);
            }
            // The smallest threshold of the servers that split operations by
            // size: every rank gets the same answers, so classes every op alike.
            if let Some((_, max)) = g.latency {
                latency_max = if latency_max == 0 { max } else { latency_max.min(max) };
            }
            let latency_lcores = g.latency.map_or(0, |(l, _)| l);
            small_lcores = if latency_lcores > 0 { latency_lcores } else { g.names.len() } as u32;
            self.note_server_names(si, g.names.iter().map(|n| n.as_bytes()));
            if g.beats && self.wants_heartbeats() {
                live.alive(si, Instant::now());
            }
            for (k, n) in g.names.iter().enumerate() {
                let rail = self.rails.rail_for(si, k);
                let addr = self.rails.insert_peer(rail, n).map_err(|e| ClientError::Fabric(e.to_string()))?;
                streams.push(Stream { latency: k < latency_lcores, lcore: k as u32, ..Stream::new(addr, si, rail, g.tag) });
            }
            keepalive(s);
            let _ = s.set_nonblocking(true);
        }
        if streams.is_empty() {
            return Err(refused_draining.unwrap_or_else(|| ClientError::Config("no server accepted the job".into())));
        }
        // A split job: the stream to this rank's group's lcore, which the
        // server (from the same Accept) serves in slots window..2 x window.
        let groups = wire::split_lcores(self.cfg.nranks, small_lcores);
        let (split, split_max) = if spec.split && groups >= 2 {
            let p = wire::split_position(self.cfg.rank, self.cfg.nranks, groups) as usize;
            let base = Stream::new(streams[p].addr, streams[p].server, streams[p].rail, streams[p].job_tag);
            streams.push(Stream { split: true, slot_base: self.cfg.window as u16, ..base });
            (Some(streams.len() - 1), wire::SPLIT_MAX.min(chunk_elems * dtype.size()))
        } else {
            (None, 0)
        };
        if streams.len() as u32 * self.cfg.window * 2 + failover::REDO_CONTEXTS_PER_SERVER * self.cfg.servers.len() as u32 > self.per_sub {
            return Err(ClientError::Config(format!(
                "{} streams x window {} exceeds this client's context table",
                streams.len(),
                self.cfg.window
            )));
        }
        let flights = vec![Flight::default(); streams.len() * self.cfg.window as usize];
        if self.cfg.failover && self.cfg.servers.len() > 1 && !can_fail_over && self.subs.is_empty() {
            log::info!("failover is off for this client: {} completes sends in order", self.rails.provider());
        }
        let stage = match can_fail_over {
            true => Some(Stage::new(streams.len(), self.cfg.window as usize, chunk_elems * dtype.size(), &mut self.rails)?),
            false => None,
        };
        let relay = match spec.relay {
            true => Some(Stage::new(streams.len(), self.cfg.window as usize, wire::RELAY_MAX, &mut self.rails)?),
            false => None,
        };
        let per_server = streams.len().div_ceil(self.cfg.servers.len()) * self.cfg.window as usize;
        let pacing = (0..self.cfg.servers.len()).map(|_| Pacing { in_flight: 0, waiting: VecDeque::with_capacity(per_server) }).collect();
        let gens = Vec::new();
        self.subs.push(SubJob {
            dtype,
            op,
            chunk_elems,
            streams,
            flights,
            controls,
            leave,
            gens,
            latency_max,
            interleave: spec.interleave,
            scratch: GenScratch::default(),
            started: 0,
            retiring: false,
            pacing,
            stage,
            relay,
            split,
            split_max,
            fo: Fo::default(),
            live,
        });
        Ok(self.subs.len() - 1)
    }

    /// The Hello to server `si`: it names the rails that carry its streams
    /// (its lanes, `Rails::lanes`).
    pub(super) fn hello_to(&self, si: usize, spec: &JobSpec) -> Result<HelloMessage, ClientError> {
        let names: Vec<&[u8]> = self.rails.lanes(si).map(|r| self.rails.name(r).as_bytes()).collect();
        HelloMessage::new(spec, self.cfg.rank, &self.cfg.job_secret, &names)
            .ok_or_else(|| ClientError::Fabric("endpoint name too long".into()))
    }

    /// Every server's answer to this rank's Hello, waited for side by side
    /// (see [`join_wait`]): a refusal, or a server that accepted and has
    /// since ended the job, fails the join at once instead of after the
    /// slowest server's answer. (A draining server's refusal is an answer:
    /// the job runs on the others.)
    #[allow(clippy::type_complexity)]
    pub(super) fn collect_answers(
        &self,
        controls: &mut [Option<TcpStream>],
        hellos: &[HelloMessage],
        join_started: Instant,
    ) -> Result<Vec<Option<Result<Granted, Box<Reject>>>>, ClientError> {
        let n = controls.len();
        let mut answers: Vec<Option<Result<Granted, Box<Reject>>>> = (0..n).map(|_| None).collect();
        // Whose challenge was taken: a server's first readable turn is its
        // challenge (or a reject), answered with its Hello.
        let mut greeted = vec![false; n];
        loop {
            let pending: Vec<bool> = (0..n).map(|si| answers[si].is_none() && controls[si].is_some()).collect();
            if !pending.contains(&true) {
                return Ok(answers);
            }
            let waiting_on: Vec<Option<&TcpStream>> =
                controls.iter().zip(&pending).map(|(c, &p)| if p { c.as_ref() } else { None }).collect();
            let ready = join_wait::readable(&waiting_on, join_wait::TURN_MS);
            for si in (0..n).filter(|&si| ready[si]) {
                let (server, s) = (&self.cfg.servers[si], controls[si].as_mut().expect("pending servers have a connection"));
                if !greeted[si] {
                    greeted[si] = true;
                    // A reject instead (busy), or a broken connection, is
                    // read as the answer below, which retries where it may.
                    if let Ok(Opening::Challenge(c)) = read_opening(s, Duration::from_secs(1)) {
                        send_answered(s, &hellos[si], &c, &self.token)
                            .map_err(|e| ClientError::Connect { server: server.clone(), error: e.to_string() })?;
                        continue;
                    }
                }
                let a = self.answer(server, s, &hellos[si], join_started, self.cfg.join_timeout, true)?;
                if let Err(r) = &a {
                    if r.code() != Some(RejectCode::Draining) {
                        // A server from before lanes, seals or min_piece reads their bytes as padding.
                        let h = &hellos[si].hello;
                        let hint = match r.field() {
                            "padding" if h.lanes > 0 => {
                                " (this server predates lanes, more rails than servers: upgrade it, or set TALLY_RAILS to at most the number of servers)"
                            }
                            "padding" if h.min_piece > 0 => {
                                " (this server predates the Hello's min_piece, which TALLY_MIN_PIECE and the plugin over tcp set: upgrade the servers with their clients)"
                            }
                            "padding" if h.reserve > 0 => {
                                " (this server predates reserving room for a communicator's later jobs: upgrade it, or set TALLY_COMM_JOBS=1 on every rank)"
                            }
                            "seal_shift" => {
                                " (ranks of this build never seal; ranks of a build from before 2026-11-29 seal under failover: \
                                 run one build on every rank)"
                            }
                            "failover" => " (set TALLY_FAILOVER alike on every rank of the job)",
                            "flags" if h.flags & wire::Hello::FAILOVER != 0 && r.to_string().contains("unknown flag bits") => {
                                " (this server predates the Hello's failover flag: upgrade the servers with their clients, or set TALLY_FAILOVER=0 on every rank)"
                            }
                            "min_piece" => " (set TALLY_MIN_PIECE alike on every rank of the job, or on none)",
                            _ => "",
                        };
                        return Err(ClientError::Refused { server: server.clone(), reject: format!("{r}{hint}") });
                    }
                }
                answers[si] = Some(a);
            }
            for si in (0..n).filter(|&si| matches!(answers[si], Some(Ok(_)))) {
                if let Some(why) = controls[si].as_mut().and_then(join_wait::ended_meanwhile) {
                    return Err(ClientError::Refused {
                        server: self.cfg.servers[si].clone(),
                        reject: format!("{why} (while this rank waited for the other servers' answers to its join)"),
                    });
                }
            }
            if join_started.elapsed() > self.cfg.join_timeout + Duration::from_secs(5) {
                let late: Vec<&str> = (0..n).filter(|&si| pending[si]).map(|si| self.cfg.servers[si].as_str()).collect();
                return Err(ClientError::Timeout(format!(
                    "no answer to the join from {} within {:?}",
                    late.join(", "),
                    self.cfg.join_timeout
                )));
            }
        }
    }

    /// Reads a server's answer to `hello` on `s`. A server that is busy
    /// (too many connections in their handshake, as in a join storm) says
    /// so at once: join again after a jittered backoff, until the join
    /// deadline; so does one whose connection broke before it answered, if
    /// `rejoin_broken` (a server restarting under a job's start). `limit`
    /// bounds the whole wait from `join_started`. Ok(Err(reject)): the server
    /// refused the job.
    pub(super) fn answer(
        &self,
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
                    let pause = join_backoff(tries, self.cfg.rank).min(limit - waited);
                    log::debug!("server {server} is busy ({r}); joining again in {pause:?} (try {tries})");
                    std::thread::sleep(pause);
                    *s = hello_again(server, hello, &self.token, limit.saturating_sub(join_started.elapsed()))?;
                    let _ = s.set_read_timeout(Some(limit + Duration::from_secs(5)));
                }
                Err(Answer::Rejected(r)) => return Ok(Err(r)),
                // The connection broke before the answer (the server died or
                // restarts): join again, as after `busy`, until the deadline.
                // Every rank of the job then meets the server's next life.
                Err(Answer::Io(e)) if rejoin_broken && join_started.elapsed() + Duration::from_millis(100) < limit => {
                    tries += 1;
                    let pause = join_backoff(tries, self.cfg.rank).min(limit.saturating_sub(join_started.elapsed()));
                    log::info!("server {server}: the join broke off ({e}); joining again in {pause:?}");
                    std::thread::sleep(pause);
                    *s = hello_again(server, hello, &self.token, limit.saturating_sub(join_started.elapsed()))?;
                    let _ = s.set_read_timeout(Some(limit + Duration::from_secs(5)));
                }
                Err(Answer::Io(e)) => return Err(ClientError::Connect { server: server.to_string(), error: e }),
            }
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
/// (Heartbeats, see [`liveness`], notice that in 2 s where the server sends
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
    super::greet::greet(&mut s, hello, token, timeout)
        .map_err(|e| ClientError::Connect { server: server.to_string(), error: e.to_string() })?;
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
    let io = |e: std::io::Error| Answer::Io(e.to_string());
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
/// ([`super::MIN_SPREAD_PIECE`]), so that ranks of a build from before the
/// field (which send 0) meet ranks of this one that kept the default; a
/// size past `u32` is sent as `u32::MAX` (the server only compares it).
pub(super) fn wire_min_piece(min_piece: usize) -> u32 {
    if min_piece == super::MIN_SPREAD_PIECE {
        0
    } else {
        u32::try_from(min_piece).unwrap_or(u32::MAX)
    }
}
