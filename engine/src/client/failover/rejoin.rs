//! Taking a lost server back: a thread ([`Watcher`]) tries to reach it, a
//! Hello flagged REJOIN admits this rank again, and from the switch the
//! ranks agree on its new streams carry operations again.
use super::REDO_CONTEXTS_PER_SERVER;
use crate::client::{Client, ClientError, Flight, Stream};
use crate::dataplane::fabric::{EndpointName, PendingSends};
use crate::wire::{self, Challenge, Hello, JobSpec};
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A lost server that answered again, on its way back into the job.
pub(in crate::client) struct Rejoin {
    pub(in crate::client) server: usize,
    pub(in crate::client) conn: TcpStream,
    pub(in crate::client) phase: RejoinPhase,
    /// Since when its Accept waits for the lost streams' operations to
    /// settle ([`SETTLE_FOR`]).
    pub(in crate::client) settling: Option<Instant>,
    /// Its Accept says it sends heartbeats (`Accept::heartbeat_ms`).
    pub(in crate::client) beats: bool,
}

/// How long a server's Accept waits for what the provider still holds of
/// its lost streams (a receive it could not cancel at once, a send to a
/// process that still runs) before this rank lets the rejoin go and tries
/// again later (the watcher): far longer than any of that takes.
const SETTLE_FOR: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::client) enum RejoinPhase {
    /// Hello sent; waiting for the Accept (every rank must come).
    Accept,
    /// Accepted (its new streams added); waiting for its Rejoin question.
    Question,
    /// Answered with our boundary; waiting for the switch.
    Switch,
    /// Taken back (the entry goes).
    Done,
}

/// A lost server reached again: (sub-job, server, the connection, its
/// challenge), read on the watcher's thread so that the client's never
/// waits for a server that accepts and then says nothing.
pub(in crate::client) type Reached = (usize, usize, TcpStream, Challenge);

/// A lost server the watcher tries to reach.
#[derive(Clone)]
pub(in crate::client) struct Wanted {
    pub(in crate::client) sub: usize,
    pub(in crate::client) server: usize,
    /// Its control address.
    pub(in crate::client) addr: std::net::SocketAddr,
    /// The addresses of its endpoints (tcp's names; empty for other
    /// providers): this process's connections to them are looked at
    /// (`host::tcp_backoff`) before it is taken back.
    pub(in crate::client) data_ips: Vec<std::net::IpAddr>,
}

/// A thread that tries to reach lost servers (a blocking connect to a dead
/// host must not stall the data path) and hands over the connections.
///
/// A server reached again is handed over only once none of this process's
/// connections to its endpoints waits out a retransmission backoff left by
/// the cut (`host::tcp_backoff`): whatever the job sent it would queue
/// behind that. While it is away the watcher caps those connections'
/// backoff (where the kernel can) so that they resend soon after it returns;
/// when it hands a server over, their congestion control starts afresh.
pub struct Watcher {
    /// Lost servers still to reach.
    pub(in crate::client) wanted: std::sync::Arc<std::sync::Mutex<Vec<Wanted>>>,
    /// Connections made, each with the server's challenge read, not yet taken.
    pub(in crate::client) reached: std::sync::Arc<std::sync::Mutex<Vec<Reached>>>,
    pub(in crate::client) stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Watcher {
    pub(in crate::client) fn start() -> Watcher {
        use std::sync::{atomic::AtomicBool, atomic::Ordering, Arc, Mutex};
        let wanted: Arc<Mutex<Vec<Wanted>>> = Arc::default();
        let reached: Arc<Mutex<Vec<Reached>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (w, r, st) = (wanted.clone(), reached.clone(), stop.clone());
        let _ = std::thread::Builder::new().name("tally-rejoin".into()).spawn(move || {
            // Servers whose wait for a backoff was logged (once each time).
            let mut told: Vec<(usize, usize)> = Vec::new();
            while !st.load(Ordering::Relaxed) {
                let todo: Vec<Wanted> = w.lock().map(|v| v.clone()).unwrap_or_default();
                for want in todo {
                    let (sub, si) = (want.sub, want.server);
                    let backoff = crate::host::tcp_backoff::scan(&want.data_ips, want.addr.port(), true);
                    let Ok(mut c) = TcpStream::connect_timeout(&want.addr, Duration::from_secs(1)) else { continue };
                    if backoff.backed_off > 0 {
                        if !told.contains(&(sub, si)) {
                            told.push((sub, si));
                            log::info!(
                                "server {} answers again, but {} of this process's connections to it still wait out TCP's \
                                 retransmission backoff from the outage (resend in up to {} ms{}): taking it back once they resent",
                                want.addr,
                                backoff.backed_off,
                                backoff.rto_ms,
                                if backoff.capped > 0 { ", capped" } else { "" }
                            );
                        }
                        continue;
                    }
                    // A server that refuses at once (busy) is tried again on a later turn.
                    if let Ok(crate::client::greet::Opening::Challenge(challenge)) =
                        crate::client::greet::read_opening(&mut c, Duration::from_secs(1))
                    {
                        // What the connections' congestion control made of
                        // the outage is wrong now (`tcp_backoff`'s module doc).
                        crate::host::tcp_renew::renew_congestion_control(&want.data_ips, want.addr.port());
                        if let (Ok(mut wv), Ok(mut rv)) = (w.lock(), r.lock()) {
                            wv.retain(|x| (x.sub, x.server) != (sub, si));
                            told.retain(|x| *x != (sub, si));
                            rv.push((sub, si, c, challenge));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        Watcher { wanted, reached, stop }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Client {
    /// Takes back lost servers that answer again: joins the job there anew
    /// (a Hello flagged REJOIN, the job's own spec), adds the streams of its
    /// Accept, answers its question with this rank's boundary and, at the
    /// switch operation K it names, cuts operations over it again. All
    /// ranks do the same (each finds the server within a second), so the
    /// server admits the job once every rank is back, like any job.
    pub(in crate::client) fn poll_rejoins(&mut self, sub: usize) -> Result<(), ClientError> {
        let s = &self.subs[sub];
        if s.fo.round.is_some() || s.fo.recovering {
            return Ok(());
        }
        let reached: Vec<Reached> = match s.fo.watcher.as_ref().map(|w| w.reached.try_lock()) {
            Some(Ok(mut v)) if v.iter().any(|x| x.0 == sub) => {
                let (mine, rest): (Vec<_>, Vec<_>) = v.drain(..).partition(|x| x.0 == sub);
                *v = rest;
                mine
            }
            _ => Vec::new(),
        };
        for (_, si, mut conn, challenge) in reached {
            let spec = JobSpec {
                job_id: self.job_id_of(sub),
                nranks: self.cfg.nranks,
                dtype: self.subs[sub].dtype,
                op: self.subs[sub].op,
                chunk_elems: self.subs[sub].chunk_elems as u32,
                window: self.cfg.window,
                shards: self.cfg.shards,
                relay: self.subs[sub].relay.is_some(),
                split: self.subs[sub].split.is_some(),
                seal_shift: 0,
                failover: true,
                interleave: self.subs[sub].interleave,
                min_piece: super::super::join::wire_min_piece(self.cfg.min_piece),
                // As at the first join: the first job reserves, the later ones take.
                reserve: if sub == 0 { self.cfg.reserve } else { 0 },
                sibling: sub > 0 && self.cfg.reserve > 0,
            };
            let Ok(mut hello) = self.hello_to(si, &spec) else { continue };
            hello.hello.flags |= Hello::REJOIN;
            if self.wants_heartbeats() {
                hello.hello.flags |= Hello::ALIVE;
            }
            let _ = conn.set_nodelay(true);
            crate::client::join::keepalive(&conn);
            let sent = crate::client::greet::send_answered(&mut conn, &hello, &challenge, &self.token);
            if sent.is_ok() && conn.set_nonblocking(true).is_ok() {
                log::info!("server {} answers again: taking it back into job {:#x}", self.cfg.servers[si], spec.job_id);
                self.subs[sub].fo.rejoins.push(Rejoin { server: si, conn, phase: RejoinPhase::Accept, settling: None, beats: false });
            } else {
                self.watch_again(sub, si);
            }
        }
        let mut i = 0;
        while i < self.subs[sub].fo.rejoins.len() {
            match self.step_rejoin(sub, i) {
                Ok(true) => i += 1,
                Ok(false) => {
                    self.subs[sub].fo.rejoins.remove(i);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Has the watcher try to reach server `si` of sub-job `sub` (started
    /// on the first loss).
    pub(in crate::client) fn watch_again(&mut self, sub: usize, si: usize) {
        let Some(addr) = self.cfg.servers[si].to_socket_addrs().ok().and_then(|mut a| a.next()) else { return };
        let data_ips = self.server_ips[si].clone();
        let watcher = self.subs[sub].fo.watcher.get_or_insert_with(Watcher::start);
        if let Ok(mut v) = watcher.wanted.lock() {
            v.push(Wanted { sub, server: si, addr, data_ips });
        }
    }

    /// Keeps what server `si`'s endpoint names say: a fingerprint (a server
    /// taken back under other names is another process: see `settle_lost`)
    /// and, over tcp, their IP addresses (the watcher's `host::tcp_backoff`).
    pub(in crate::client) fn note_server_names<'a>(&mut self, si: usize, names: impl Iterator<Item = &'a [u8]> + Clone) {
        self.server_names[si] = fingerprint(names.clone());
        if self.rails.provider().starts_with("tcp") {
            self.server_ips[si] = crate::host::tcp_backoff::ips_of(names, None);
        }
        if let Ok(mut all) = self.tcp_peers.lock() {
            *all = self.server_ips.concat();
        }
    }

    /// Before server `si`'s new streams take the places of its lost ones in
    /// sub-job `sub` (`take_back`): how many operations posted on those may
    /// still complete. The places are the same on every rank (every rank
    /// lost the same streams), so a completion of the old ones must not be
    /// taken for one of the new: their receives were canceled at the loss
    /// and are asked again; their sends are forgotten (the server is
    /// another process now: tcp;ofi_rxm drops what was queued to the dead
    /// one without completing it).
    fn settle_lost(&mut self, sub: usize, si: usize) -> u32 {
        let window = self.cfg.window;
        let s = &self.subs[sub];
        let mut left = 0u32;
        for (st, stream) in s.streams.iter().enumerate().filter(|(_, x)| x.server == si && x.lost && !x.split) {
            let base = sub as u32 * self.per_sub + st as u32 * window * 2;
            left = left.saturating_add(self.rails.settle(stream.rail, base..base + window * 2, PendingSends::Forget));
        }
        left
    }

    /// Advances rejoin `i` with what arrived; false: it is over (taken
    /// back, or given up).
    pub(in crate::client) fn step_rejoin(&mut self, sub: usize, i: usize) -> Result<bool, ClientError> {
        use std::io::Read;
        let si = self.subs[sub].fo.rejoins[i].server;
        let server = self.cfg.servers[si].clone();
        let mut hdr = [0u8; core::mem::size_of::<wire::Accept>()];
        let n = match self.subs[sub].fo.rejoins[i].conn.peek(&mut hdr) {
            Ok(0) => {
                log::info!("server {server} went away again while taking it back; waiting for it");
                self.watch_again(sub, si);
                return Ok(false);
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(true),
            Err(_) => {
                self.watch_again(sub, si);
                return Ok(false);
            }
        };
        if n < 8 {
            return Ok(true);
        }
        let kind = match wire::read::<wire::Header>(&hdr).and_then(|h| h.check()) {
            Ok(k) => k,
            Err(e) => {
                log::warn!("server {server}: {e} while taking it back; giving up on it for this job");
                return Ok(false);
            }
        };
        let phase = self.subs[sub].fo.rejoins[i].phase;
        let need = match (kind, phase) {
            (wire::Kind::Reject, _) => core::mem::size_of::<wire::Reject>(),
            (wire::Kind::Accept, RejoinPhase::Accept) => {
                if n < hdr.len() {
                    return Ok(true);
                }
                let a: wire::Accept = wire::read(&hdr).map_err(|e| ClientError::Fabric(e.to_string()))?;
                hdr.len() + a.lcores.min(4096) as usize * core::mem::size_of::<wire::NameRecord>()
            }
            (wire::Kind::Rejoin, RejoinPhase::Question) => 8,
            // Heartbeats start once the server admitted the job again.
            (wire::Kind::Alive, RejoinPhase::Question | RejoinPhase::Switch) => 8,
            (wire::Kind::SwitchAt, RejoinPhase::Switch) => core::mem::size_of::<wire::SwitchAt>(),
            (k, p) => {
                log::warn!("server {server}: unexpected {k:?} while taking it back ({p:?}); giving up on it for this job");
                return Ok(false);
            }
        };
        let mut msg = vec![0u8; need];
        let c = &mut self.subs[sub].fo.rejoins[i].conn;
        if c.peek(&mut msg).map_or(true, |got| got < need) {
            return Ok(true);
        }
        // An Accept's names, read once; its streams wait (the message stays
        // unread) until the lost ones settled.
        let mut names = Vec::new();
        if kind == wire::Kind::Accept {
            let a: wire::Accept = wire::read(&msg).map_err(|e| ClientError::Fabric(e.to_string()))?;
            for k in 0..(a.lcores as usize).min((msg.len() - hdr.len()) / core::mem::size_of::<wire::NameRecord>()) {
                let rec: wire::NameRecord = wire::read(&msg[hdr.len() + k * core::mem::size_of::<wire::NameRecord>()..])
                    .map_err(|e| ClientError::Fabric(e.to_string()))?;
                let name = rec.name().map_err(|e| ClientError::Fabric(e.to_string()))?;
                names.push(crate::dataplane::fabric::EndpointName::from_bytes(name).ok_or_else(|| ClientError::Fabric("bad name".into()))?);
            }
            let restarted = fingerprint(names.iter().map(|n| n.as_bytes())) != self.server_names[si];
            let left = if restarted { self.settle_lost(sub, si) } else { 0 };
            if left > 0 {
                let since = *self.subs[sub].fo.rejoins[i].settling.get_or_insert_with(Instant::now);
                if since.elapsed() < SETTLE_FOR {
                    return Ok(true);
                }
                log::warn!(
                    "server {server}: {left} operation(s) posted to it before it was lost still not returned by the provider after \
                     {SETTLE_FOR:?}; taking it back later"
                );
                self.watch_again(sub, si);
                return Ok(false);
            }
        }
        let c = &mut self.subs[sub].fo.rejoins[i].conn;
        if c.read_exact(&mut msg).is_err() {
            self.watch_again(sub, si);
            return Ok(false);
        }
        match kind {
            // Taken; whatever follows it is read at once.
            wire::Kind::Alive => self.step_rejoin(sub, i),
            wire::Kind::Reject => {
                let r: wire::Reject = wire::read(&msg).map_err(|e| ClientError::Fabric(e.to_string()))?;
                if r.code() == Some(wire::RejectCode::Busy) {
                    // Every rank of every job reconnects to a restarted
                    // server at once: the watcher tries again in 0.5 s.
                    log::debug!("server {server} is busy ({r}); taking it back later");
                    self.watch_again(sub, si);
                    return Ok(false);
                }
                log::warn!("server {server} refused to take job {:#x} back ({r}); the job goes on without it", self.job_id_of(sub));
                Ok(false)
            }
            wire::Kind::Accept => {
                let a: wire::Accept = wire::read(&msg).map_err(|e| ClientError::Fabric(e.to_string()))?;
                if a.piece_elems != 0 && (a.piece_elems as usize) < self.subs[sub].chunk_elems {
                    log::warn!(
                        "server {server} grants pieces of {} elements now, fewer than job {:#x}'s {}: it goes on without it",
                        a.piece_elems,
                        self.job_id_of(sub),
                        self.subs[sub].chunk_elems
                    );
                    return Ok(false);
                }
                let restarted = fingerprint(names.iter().map(|n| n.as_bytes())) != self.server_names[si];
                if !self.take_back(sub, si, &a, &names, restarted)? {
                    return Ok(false);
                }
                self.subs[sub].fo.rejoins[i].phase = RejoinPhase::Question;
                self.subs[sub].fo.rejoins[i].beats = a.heartbeat_ms > 0;
                Ok(true)
            }
            wire::Kind::Rejoin => {
                let b = self.first_uncut(sub);
                let msg = wire::Boundary::new(b);
                let c = &mut self.subs[sub].fo.rejoins[i].conn;
                let _ = c.set_nonblocking(false);
                let ok = c.write_all(bytemuck::bytes_of(&msg)).is_ok();
                let _ = c.set_nonblocking(true);
                if !ok {
                    self.watch_again(sub, si);
                    return Ok(false);
                }
                self.subs[sub].fo.rejoins[i].phase = RejoinPhase::Switch;
                Ok(true)
            }
            _ => {
                let k = wire::read::<wire::SwitchAt>(&msg).and_then(|m| m.check()).map_err(|e| ClientError::Fabric(e.to_string()))?;
                let job = self.job_id_of(sub);
                // The caller drops the rejoin entry; the connection lives on
                // (a duplicate descriptor) as the job's control connection.
                let conn = self.subs[sub].fo.rejoins[i].conn.try_clone().map_err(|e| ClientError::Fabric(e.to_string()))?;
                let s = &mut self.subs[sub];
                s.fo.rejoins[i].phase = RejoinPhase::Done;
                for st in s.streams.iter_mut().filter(|st| st.server == si && st.born == u64::MAX) {
                    st.born = k;
                }
                s.fo.dead &= !(1u64 << si);
                s.fo.handled &= !(1u64 << si);
                s.fo.reported &= !(1u64 << si);
                s.controls[si] = Some(conn);
                // Armed from now where its Accept said it sends heartbeats
                // (`Liveness::alive` says why), else by its first one.
                if s.fo.rejoins[i].beats {
                    s.live.alive(si, Instant::now());
                } else {
                    s.live.disarm(si);
                }
                log::warn!("server {server} is back in job {job:#x} from operation {k}");
                self.stats.rejoins += 1;
                if !self.subs[sub].holding() {
                    for oi in 0..self.ops.len() {
                        if self.ops[oi].sub == sub && !self.ops[oi].planned {
                            self.plan(oi)?;
                        }
                    }
                }
                Ok(false)
            }
        }
    }
}

impl Client {
    /// Server `si` accepted sub-job `sub` again with `names`: its new
    /// streams, carrying nothing until the switch. Where it is another
    /// process (`restarted`: other names; settled, see `settle_lost`) they
    /// take the places of its lost ones, lcore k the k-th, with their
    /// flights and staging slots; only lcores it did not have before add
    /// places. Every rank sees the same names and does the same, so the
    /// streams' order stays the same on every rank, and a server killed and
    /// restarted N times costs what it cost once. The same process back (a
    /// frozen or cut-off server) gets places of its own, as before: its
    /// provider may still complete what was posted to it before the outage
    /// long after it answers again (a link-cut run once waited over 5 s),
    /// and every rank must decide alike without waiting for that.
    /// False: no room for them in the context table.
    fn take_back(&mut self, sub: usize, si: usize, a: &wire::Accept, names: &[EndpointName], restarted: bool) -> Result<bool, ClientError> {
        let window = self.cfg.window as usize;
        let s = &self.subs[sub];
        let reusable = |st: usize| restarted && s.streams[st].server == si && s.streams[st].lost && !s.streams[st].split;
        let old: Vec<usize> = (0..s.streams.len()).filter(|&st| reusable(st)).collect();
        let grown = s.streams.len() + names.len().saturating_sub(old.len());
        if (grown * window * 2) as u32 + REDO_CONTEXTS_PER_SERVER * self.cfg.servers.len() as u32 > self.per_sub {
            log::warn!(
                "server {}: no room for its streams in this client's context table; job {:#x} goes on without it",
                self.cfg.servers[si],
                self.job_id_of(sub)
            );
            return Ok(false);
        }
        self.note_server_names(si, names.iter().map(|n| n.as_bytes()));
        let latency_lcores = a.latency_split().map_or(0, |(l, _)| l);
        let mut added = 0;
        for (k, name) in names.iter().enumerate() {
            let rail = self.rails.rail_for(si, k);
            let addr = self.rails.insert_peer(rail, name).map_err(|e| ClientError::Fabric(e.to_string()))?;
            // It carries nothing until the switch names its first operation.
            let stream = Stream { born: u64::MAX, latency: k < latency_lcores, lcore: k as u32, ..Stream::new(addr, si, rail, a.job()) };
            let s = &mut self.subs[sub];
            match old.get(k) {
                Some(&st) => {
                    s.streams[st] = stream;
                    s.flights[st * window..(st + 1) * window].fill(Flight::default());
                    if let Some(stage) = s.stage.as_mut() {
                        stage.clear(st);
                    }
                }
                None => {
                    s.streams.push(stream);
                    added += 1;
                }
            }
        }
        let s = &mut self.subs[sub];
        s.flights.resize(s.streams.len() * window, Flight::default());
        if let Some(stage) = s.stage.as_mut() {
            stage.add_places(added);
        }
        let taken = old.iter().take(names.len()).copied().chain(self.subs[sub].streams.len() - added..self.subs[sub].streams.len());
        self.equip_stage(sub, &taken.collect::<Vec<_>>())?;
        Ok(true)
    }

    /// Staging slots for the places in `taken` that have none: a block
    /// handed over from a stream lost for good whose receives the provider
    /// gave back (`Stage::hand_over`), else a new one. Which block a place
    /// gets is this rank's own business (no other rank sees it), so it asks
    /// only its own provider. Not while a recovery may still read staged
    /// results of lost streams.
    fn equip_stage(&mut self, sub: usize, taken: &[usize]) -> Result<(), ClientError> {
        let window = self.cfg.window;
        let s = &self.subs[sub];
        let Some(stage) = s.stage.as_ref() else { return Ok(()) };
        let needy: Vec<usize> = taken.iter().copied().filter(|&st| !stage.has_slots(st)).collect();
        let recovering = s.fo.round.is_some() || s.fo.recovering;
        let mut donors: Vec<usize> = (0..s.streams.len())
            .filter(|&st| !recovering && s.streams[st].lost && !s.streams[st].split && stage.has_slots(st) && !taken.contains(&st))
            .collect();
        for st in needy {
            let settled = donors.iter().position(|&d| {
                let base = sub as u32 * self.per_sub + d as u32 * window * 2;
                self.rails.settle(self.subs[sub].streams[d].rail, base..base + window * 2, PendingSends::Ignore) == 0
            });
            let stage = self.subs[sub].stage.as_mut().expect("a stage");
            match settled {
                Some(i) => stage.hand_over(donors.swap_remove(i), st),
                None => stage.equip(st, &mut self.rails)?,
            }
        }
        Ok(())
    }
}

/// A fingerprint of a server's endpoint names, to tell whether it came back
/// as the same process.
fn fingerprint<'a>(names: impl Iterator<Item = &'a [u8]>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for n in names {
        n.hash(&mut h);
    }
    h.finish()
}
