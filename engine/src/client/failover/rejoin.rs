//! Taking a lost server back: the watcher (`watcher.rs`) reaches it, a
//! Hello flagged REJOIN admits this rank again, and from the switch the
//! ranks agree on its new streams carry operations again. Nothing of the
//! job changes before that switch: a rejoin that fails on the way (another
//! rank put it off, the server failed it) leaves this rank as every other
//! rank, and the watcher tries again. [`Rejoins`]
//! holds a sub-job's servers on their way back, stepped by
//! `Failover::poll_rejoins` with what arrived; [`ServerNames`] what each
//! server's endpoint names were, to tell a restarted server from the same
//! one back.
use super::watcher::{Reached, Wanted, Watcher};
use crate::client::error::ClientError;
use crate::client::greet::send_answered;
use crate::client::handshake::{hello_to, keepalive, wire_min_piece};
use crate::client::stage::Stage;
use crate::client::state::{Core, Flight, Stream};
use crate::client::tcp_floor::TcpPeers;
use crate::dataplane::fabric::{EndpointName, PendingSends};
use crate::wire::{self, Hello, JobSpec};
use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A lost server that answered again, on its way back into the job.
struct Rejoin {
    server: usize,
    conn: TcpStream,
    phase: RejoinPhase,
    /// Since when its Accept waits for the lost streams' operations to
    /// settle ([`SETTLE_FOR`]).
    settling: Option<Instant>,
    /// Its Accept says it sends heartbeats (`Accept::heartbeat_ms`).
    beats: bool,
    /// What its Accept granted, taken into the job at the switch.
    accepted: Option<Accepted>,
}

/// A rejoining server's Accept: its new streams' names, and whether it is
/// another process than the one lost (other names).
struct Accepted {
    accept: wire::Accept,
    names: Vec<EndpointName>,
    restarted: bool,
}

/// How long a server's Accept waits for what the provider still holds of
/// its lost streams (a receive it could not cancel at once, a send to a
/// process that still runs) before this rank lets the rejoin go and tries
/// again later (the watcher): far longer than any of that takes.
const SETTLE_FOR: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RejoinPhase {
    /// Hello sent; waiting for the Accept (every rank must come).
    Accept,
    /// Accepted (its new streams added); waiting for its Rejoin question.
    Question,
    /// Answered with our boundary; waiting for the switch.
    Switch,
}

/// A sub-job's lost servers on their way back, and the watcher that
/// reaches them (started on the first loss).
#[derive(Default)]
pub(super) struct Rejoins {
    list: Vec<Rejoin>,
    watcher: Option<Watcher>,
    /// `ClientConfig::fault_rejoin_put_off` was acted on.
    put_off_done: bool,
}

/// Where a step of rejoin `i` left it ([`Rejoins::step`]).
pub(super) enum Step {
    /// Waiting for the server's next message.
    Waiting,
    /// Over: given up, or left to the watcher to try again.
    Over,
    /// Server `si` carries operations again from `k` on, with `conn` as
    /// the sub-job's control connection to it; `beats`: its Accept said it
    /// sends heartbeats (`Accept::heartbeat_ms`).
    Back { si: usize, k: u64, conn: TcpStream, beats: bool },
}

/// What each server's endpoint names were when last seen: a fingerprint (a
/// server taken back under other names is another process: see
/// `settle_lost`) and, over tcp, their IP addresses (the watcher's
/// `host::tcp_backoff`, and the watchdog's TCP timer floor).
pub(super) struct ServerNames {
    fingerprints: Vec<u64>,
    ips: Vec<Vec<IpAddr>>,
    /// Every server's addresses together, shared with the watchdog's chore
    /// that sets the floor of the TCP timers on this process's connections
    /// to them (`host::tcp_rto_min`).
    tcp_peers: Arc<TcpPeers>,
}

impl ServerNames {
    pub(super) fn new(servers: usize, tcp_peers: Arc<TcpPeers>) -> ServerNames {
        ServerNames { fingerprints: vec![0; servers], ips: vec![Vec::new(); servers], tcp_peers }
    }

    /// Keeps what server `si`'s endpoint names say (over `provider`).
    pub(super) fn note<'a>(&mut self, provider: &str, si: usize, names: impl Iterator<Item = &'a [u8]> + Clone) {
        self.fingerprints[si] = fingerprint(names.clone());
        if provider.starts_with("tcp") {
            self.ips[si] = crate::host::tcp_backoff::ips_of(names, None);
        }
        self.tcp_peers.set(self.ips.concat());
    }
}

impl Rejoins {
    /// A rejoin waits for its switch operation: hold operations uncut.
    pub(super) fn pending(&self) -> bool {
        self.list.iter().any(|r| r.phase == RejoinPhase::Switch)
    }

    /// Whether the watcher runs (a server of the sub-job was lost).
    pub(super) fn watching(&self) -> bool {
        self.watcher.is_some()
    }

    /// Rejoins in progress.
    pub(super) fn active(&self) -> usize {
        self.list.len()
    }

    /// Rejoin `i` is over.
    pub(super) fn end(&mut self, i: usize) {
        self.list.remove(i);
    }

    /// Server `si` is lost again: its rejoin, if any, is over.
    pub(super) fn forget_server(&mut self, si: usize) {
        self.list.retain(|r| r.server != si);
    }

    /// Has the watcher try to reach server `si` of sub-job `sub` (started
    /// on the first loss).
    pub(super) fn watch_again(&mut self, c: &Core, names: &ServerNames, sub: usize, si: usize) {
        let Some(addr) = c.cfg.servers[si].to_socket_addrs().ok().and_then(|mut a| a.next()) else { return };
        let data_ips = names.ips[si].clone();
        let watcher = self.watcher.get_or_insert_with(Watcher::start);
        if let Ok(mut v) = watcher.wanted.lock() {
            v.push(Wanted { sub, server: si, addr, data_ips });
        }
    }

    /// Answers the servers the watcher reached again: joins the job there
    /// anew (a Hello flagged REJOIN, the job's own spec). All ranks do the
    /// same (each finds the server within a second), so the server admits
    /// the job once every rank is back, like any job.
    pub(super) fn answer_reached(&mut self, c: &Core, names: &ServerNames, sub: usize) {
        let reached: Vec<Reached> = match self.watcher.as_ref().map(|w| w.reached.try_lock()) {
            Some(Ok(mut v)) if v.iter().any(|x| x.0 == sub) => {
                let (mine, rest): (Vec<_>, Vec<_>) = v.drain(..).partition(|x| x.0 == sub);
                *v = rest;
                mine
            }
            _ => Vec::new(),
        };
        for (_, si, mut conn, challenge) in reached {
            let s = &c.subs[sub];
            let spec = JobSpec {
                job_id: s.job_id,
                nranks: c.cfg.nranks,
                dtype: s.dtype,
                op: s.op,
                chunk_elems: s.chunk_elems as u32,
                window: c.cfg.window,
                shards: c.cfg.shards,
                relay: s.relay.is_some(),
                split: s.split.is_some(),
                seal_shift: 0,
                failover: true,
                interleave: s.interleave,
                min_piece: wire_min_piece(c.cfg.min_piece),
                // As at the first join: the first job reserves, the later ones take.
                reserve: if sub == 0 { c.cfg.reserve } else { 0 },
                sibling: sub > 0 && c.cfg.reserve > 0,
            };
            let Ok(mut hello) = hello_to(c, si, &spec) else { continue };
            hello.hello.flags |= Hello::REJOIN;
            if c.cfg.wants_heartbeats() {
                hello.hello.flags |= Hello::ALIVE;
            }
            let _ = conn.set_nodelay(true);
            keepalive(&conn);
            let sent = send_answered(&mut conn, &hello, &challenge, &c.token);
            if sent.is_ok() && conn.set_nonblocking(true).is_ok() {
                log::info!("server {} answers again: taking it back into job {:#x}", c.cfg.servers[si], spec.job_id);
                self.list.push(Rejoin { server: si, conn, phase: RejoinPhase::Accept, settling: None, beats: false, accepted: None });
            } else {
                self.watch_again(c, names, sub, si);
            }
        }
        // Switches read in one pass add their servers' places in server
        // order, not in the order this rank's watcher reached them: a
        // server taken back as the same process adds places, and their
        // order must be every rank's. (Switches read in different passes
        // on different ranks could still add them in another order.)
        self.list.sort_by_key(|r| r.server);
    }

    /// Advances rejoin `i` of sub-job `sub` with what arrived: keeps what
    /// its Accept granted, answers its question with this rank's boundary
    /// and, at the switch operation K it names, adds the new streams (into
    /// `stage`, the sub-job's staging area) and is [`Step::Back`].
    pub(super) fn step(
        &mut self,
        c: &mut Core,
        names: &mut ServerNames,
        stage: Option<&mut Stage>,
        sub: usize,
        i: usize,
    ) -> Result<Step, ClientError> {
        let si = self.list[i].server;
        let server = c.cfg.servers[si].clone();
        let mut hdr = [0u8; core::mem::size_of::<wire::Accept>()];
        let n = match self.list[i].conn.peek(&mut hdr) {
            Ok(0) => {
                log::info!("server {server} went away again while taking it back; waiting for it");
                self.watch_again(c, names, sub, si);
                return Ok(Step::Over);
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Step::Waiting),
            Err(_) => {
                self.watch_again(c, names, sub, si);
                return Ok(Step::Over);
            }
        };
        if n < 8 {
            return Ok(Step::Waiting);
        }
        let kind = match wire::read::<wire::Header>(&hdr).and_then(|h| h.check()) {
            Ok(k) => k,
            Err(e) => {
                log::warn!("server {server}: {e} while taking it back; giving up on it for this job");
                return Ok(Step::Over);
            }
        };
        let phase = self.list[i].phase;
        let need = match (kind, phase) {
            (wire::Kind::Reject, _) => core::mem::size_of::<wire::Reject>(),
            (wire::Kind::Accept, RejoinPhase::Accept) => {
                if n < hdr.len() {
                    return Ok(Step::Waiting);
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
                return Ok(Step::Over);
            }
        };
        let mut msg = vec![0u8; need];
        if self.list[i].conn.peek(&mut msg).map_or(true, |got| got < need) {
            return Ok(Step::Waiting);
        }
        // An Accept's names, read once; its streams wait (the message stays
        // unread) until the lost ones settled.
        let mut accepted = Vec::new();
        let mut restarted = false;
        if kind == wire::Kind::Accept {
            let a: wire::Accept = wire::read(&msg).map_err(|e| ClientError::Fabric(e.to_string()))?;
            for k in 0..(a.lcores as usize).min((msg.len() - hdr.len()) / core::mem::size_of::<wire::NameRecord>()) {
                let rec: wire::NameRecord = wire::read(&msg[hdr.len() + k * core::mem::size_of::<wire::NameRecord>()..])
                    .map_err(|e| ClientError::Fabric(e.to_string()))?;
                let name = rec.name().map_err(|e| ClientError::Fabric(e.to_string()))?;
                accepted.push(EndpointName::from_bytes(name).ok_or_else(|| ClientError::Fabric("bad name".into()))?);
            }
            restarted = fingerprint(accepted.iter().map(|n| n.as_bytes())) != names.fingerprints[si];
            let mut left = if restarted { settle_lost(c, sub, si) } else { 0 };
            if c.cfg.fault_rejoin_put_off && !self.put_off_done {
                left = left.max(1);
            }
            if left > 0 {
                let since = *self.list[i].settling.get_or_insert_with(Instant::now);
                if since.elapsed() < SETTLE_FOR {
                    return Ok(Step::Waiting);
                }
                log::warn!(
                    "server {server}: {left} operation(s) posted to it before it was lost still not returned by the provider after \
                     {SETTLE_FOR:?}; taking it back later"
                );
                self.put_off_done |= c.cfg.fault_rejoin_put_off;
                self.watch_again(c, names, sub, si);
                return Ok(Step::Over);
            }
        }
        if self.list[i].conn.read_exact(&mut msg).is_err() {
            self.watch_again(c, names, sub, si);
            return Ok(Step::Over);
        }
        let job = c.subs[sub].job_id;
        match kind {
            // Taken; whatever follows it is read at once.
            wire::Kind::Alive => self.step(c, names, stage, sub, i),
            wire::Kind::Reject => {
                let r: wire::Reject = wire::read(&msg).map_err(|e| ClientError::Fabric(e.to_string()))?;
                use wire::RejectCode::{Busy, JobFailed, Timeout};
                match r.code() {
                    // Every rank of every job reconnects to a restarted
                    // server at once: the watcher tries again in 0.5 s.
                    Some(Busy) => {
                        log::debug!("server {server} is busy ({r}); taking it back later");
                        self.watch_again(c, names, sub, si);
                        return Ok(Step::Over);
                    }
                    // Another rank let this rejoin go (its provider still
                    // held an operation posted before the loss) or did not
                    // come in time: every rank tries again, as that one does.
                    Some(JobFailed | Timeout) => {
                        log::info!("server {server} could not take job {job:#x} back this time ({r}); trying again");
                        self.watch_again(c, names, sub, si);
                        return Ok(Step::Over);
                    }
                    _ => {}
                }
                log::warn!("server {server} refused to take job {job:#x} back ({r}); the job goes on without it");
                Ok(Step::Over)
            }
            wire::Kind::Accept => {
                let a: wire::Accept = wire::read(&msg).map_err(|e| ClientError::Fabric(e.to_string()))?;
                if a.piece_elems != 0 && (a.piece_elems as usize) < c.subs[sub].chunk_elems {
                    log::warn!(
                        "server {server} grants pieces of {} elements now, fewer than job {job:#x}'s {}: it goes on without it",
                        a.piece_elems,
                        c.subs[sub].chunk_elems
                    );
                    return Ok(Step::Over);
                }
                if !has_room(c, sub, si, accepted.len(), restarted) {
                    return Ok(Step::Over);
                }
                self.list[i].accepted = Some(Accepted { accept: a, names: accepted, restarted });
                self.list[i].phase = RejoinPhase::Question;
                self.list[i].beats = a.heartbeat_ms > 0;
                Ok(Step::Waiting)
            }
            wire::Kind::Rejoin => {
                let b = c.first_uncut(sub);
                let msg = wire::Boundary::new(b);
                let conn = &mut self.list[i].conn;
                let _ = conn.set_nonblocking(false);
                let ok = conn.write_all(bytemuck::bytes_of(&msg)).is_ok();
                let _ = conn.set_nonblocking(true);
                if !ok {
                    self.watch_again(c, names, sub, si);
                    return Ok(Step::Over);
                }
                self.list[i].phase = RejoinPhase::Switch;
                Ok(Step::Waiting)
            }
            _ => {
                let k = wire::read::<wire::SwitchAt>(&msg).and_then(|m| m.check()).map_err(|e| ClientError::Fabric(e.to_string()))?;
                let Some(a) = self.list[i].accepted.take() else { return Ok(Step::Over) };
                if !take_back(c, names, stage, sub, si, &a)? {
                    return Ok(Step::Over);
                }
                // The caller drops the rejoin entry; the connection lives on
                // (a duplicate descriptor) as the job's control connection.
                let conn = self.list[i].conn.try_clone().map_err(|e| ClientError::Fabric(e.to_string()))?;
                Ok(Step::Back { si, k, conn, beats: self.list[i].beats })
            }
        }
    }
}

/// Before server `si`'s new streams take the places of its lost ones in
/// sub-job `sub` (`take_back`): how many operations posted on those may
/// still complete. The places are the same on every rank (every rank
/// lost the same streams), so a completion of the old ones must not be
/// taken for one of the new: their receives were canceled at the loss
/// and are asked again; their sends are forgotten (the server is another
/// process now: tcp;ofi_rxm drops what was queued to the dead one without
/// completing it).
fn settle_lost(c: &mut Core, sub: usize, si: usize) -> u32 {
    let s = &c.subs[sub];
    let lost: Vec<usize> =
        (0..s.streams.len()).filter(|&st| s.streams[st].server == si && s.streams[st].lost && !s.streams[st].split).collect();
    let mut left = 0u32;
    for st in lost {
        left = left.saturating_add(settle_stream(c, sub, st, PendingSends::Forget));
    }
    left
}

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
/// Called at the switch, so that a rejoin that fails before it changes
/// nothing. False: no room for them in the context table.
fn take_back(
    c: &mut Core,
    seen: &mut ServerNames,
    mut stage: Option<&mut Stage>,
    sub: usize,
    si: usize,
    accepted: &Accepted,
) -> Result<bool, ClientError> {
    let Accepted { accept: a, names, restarted } = accepted;
    if !has_room(c, sub, si, names.len(), *restarted) {
        return Ok(false);
    }
    let window = c.cfg.window as usize;
    let old = reusable_places(c, sub, si, *restarted);
    seen.note(c.rails.provider(), si, names.iter().map(|n| n.as_bytes()));
    let latency_lcores = a.latency_split().map_or(0, |(l, _)| l);
    let mut added = 0;
    for (k, name) in names.iter().enumerate() {
        let rail = c.rails.rail_for(si, k);
        let addr = c.rails.insert_peer(rail, name).map_err(|e| ClientError::Fabric(e.to_string()))?;
        // It carries nothing until the switch names its first operation.
        let stream = Stream { born: u64::MAX, latency: k < latency_lcores, lcore: k as u32, ..Stream::new(addr, si, rail, a.job()) };
        let s = &mut c.subs[sub];
        match old.get(k) {
            Some(&st) => {
                s.streams[st] = stream;
                s.flights[st * window..(st + 1) * window].fill(Flight::default());
                if let Some(stage) = stage.as_deref_mut() {
                    stage.clear(st);
                }
            }
            None => {
                s.streams.push(stream);
                added += 1;
            }
        }
    }
    let s = &mut c.subs[sub];
    s.flights.resize(s.streams.len() * window, Flight::default());
    if let Some(stage) = stage {
        stage.add_places(added);
        let len = c.subs[sub].streams.len();
        let taken: Vec<usize> = old.iter().take(names.len()).copied().chain(len - added..len).collect();
        equip_stage(c, stage, sub, &taken)?;
    }
    Ok(true)
}

/// The places of server `si`'s lost streams in sub-job `sub` that its new
/// ones take, where it is another process (`restarted`: see `take_back`).
fn reusable_places(c: &Core, sub: usize, si: usize, restarted: bool) -> Vec<usize> {
    let s = &c.subs[sub];
    let reusable = |st: usize| restarted && s.streams[st].server == si && s.streams[st].lost && !s.streams[st].split;
    (0..s.streams.len()).filter(|&st| reusable(st)).collect()
}

/// Whether `lcores` new streams of server `si` fit in this client's context
/// table beside sub-job `sub`'s (`take_back`); logged where not.
fn has_room(c: &Core, sub: usize, si: usize, lcores: usize, restarted: bool) -> bool {
    let s = &c.subs[sub];
    let grown = s.streams.len() + lcores.saturating_sub(reusable_places(c, sub, si, restarted).len());
    let room = (grown * c.cfg.window as usize * 2) as u32 <= c.redo_base;
    if !room {
        log::warn!(
            "server {}: no room for its streams in this client's context table; job {:#x} goes on without it",
            c.cfg.servers[si],
            s.job_id
        );
    }
    room
}

/// Staging slots for the places in `taken` that have none: a block handed
/// over from a stream lost for good whose receives the provider gave back
/// (`Stage::hand_over`), else a new one. Which block a place gets is this
/// rank's own business (no other rank sees it), so it asks only its own
/// provider. Called between recoveries only (`Failover::poll_rejoins`): no
/// recovery reads staged results of lost streams any more.
fn equip_stage(c: &mut Core, stage: &mut Stage, sub: usize, taken: &[usize]) -> Result<(), ClientError> {
    let s = &c.subs[sub];
    let needy: Vec<usize> = taken.iter().copied().filter(|&st| !stage.has_slots(st)).collect();
    let mut donors: Vec<usize> = (0..s.streams.len())
        .filter(|&st| s.streams[st].lost && !s.streams[st].split && stage.has_slots(st) && !taken.contains(&st))
        .collect();
    for st in needy {
        let settled = donors.iter().position(|&d| settle_stream(c, sub, d, PendingSends::Ignore) == 0);
        match settled {
            Some(i) => stage.hand_over(donors.swap_remove(i), st),
            None => stage.equip(st, &mut c.rails)?,
        }
    }
    Ok(())
}

/// `Rails::settle` over stream `st`'s contexts in sub-job `sub` (its
/// window's receives and sends): how many may still complete.
fn settle_stream(c: &mut Core, sub: usize, st: usize, sends: PendingSends) -> u32 {
    let window = c.cfg.window;
    let base = sub as u32 * c.per_sub + st as u32 * window * 2;
    c.rails.settle(c.subs[sub].streams[st].rail, base..base + window * 2, sends)
}

/// Gives back the memory of lost streams' staging slots whose receives the
/// provider has given back by now: those no place took at a rejoin
/// (`equip_stage`) because they had not settled then (a server frozen
/// mid-result completes it only after it resumes: on the device's soak at
/// 16 Gbit/s a freeze kept a rank 18 MB larger for good). True: some are
/// still held, look again later. Between recoveries only.
pub(super) fn reclaim_slots(c: &mut Core, stage: &mut Stage, sub: usize) -> bool {
    let mut held = false;
    for st in 0..c.subs[sub].streams.len() {
        let s = &c.subs[sub].streams[st];
        if !s.lost || s.split || !stage.has_slots(st) {
            continue;
        }
        if settle_stream(c, sub, st, PendingSends::Ignore) == 0 {
            stage.release(st, &mut c.rails);
        } else {
            held = true;
        }
    }
    held
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
