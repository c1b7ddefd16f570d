//! A job's admission: the ranks' Hellos gathered until every rank came
//! (or the join timeout), checked against each other, then the job placed
//! on lcores with a slab region on each (`budget`, `alloc`) and the Accepts
//! sent; or every rank refused with the reason.
use super::{budget, Active, Conn, ControlPlane, Pending, Phase, RTO_SETTLE, RTO_SWEEP_SOON};
use crate::control::alloc::REGION_ALIGN;
use crate::control::backoff_gate::{Verdict, REUSE_FOR};
use crate::control::conn::{Connections, Joining};
use crate::dataplane::fabric::EndpointName;
use crate::dataplane::shard::{slot_strides, Command, JobOnShard, SplitOn};
use crate::dataplane::split::SplitShared;
use crate::wire::{self, Accept, JobSpec, RejectCode};
use bytemuck::Zeroable;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl ControlPlane {
    /// A rank takes this server back after an outage (a cut link, a frozen
    /// process): whether a connection of this process to its endpoints
    /// still waits out TCP's retransmission backoff from it
    /// (`host::tcp_backoff`). Results the job sends it would wait too, up to
    /// about as long again as the outage lasted; the rank, refused as busy,
    /// asks again within a second. The backoff is capped meanwhile, where
    /// the kernel can, so that the connection resends soon; once none is
    /// backed off, their congestion control starts afresh.
    ///
    /// Only the addresses of the rank's endpoint names where it proved to
    /// be one of the running job's ranks (`proven`: its secret), else only
    /// the address its connection comes from, which it cannot choose: a
    /// token holder may not have this server touch connections to hosts it
    /// names. Looks are few however many Hellos come (`backoff_gate`).
    fn backed_off_towards(&mut self, c: &Conn, names: &[EndpointName], proven: bool) -> bool {
        if !self.net.names_are_socket_addresses() {
            return false;
        }
        let named = names.iter().map(|n| n.as_bytes()).filter(|_| proven);
        let ips = crate::host::tcp_backoff::ips_of(named, Some(c.peer.ip().to_canonical()));
        let (port, counters) = (self.net.listen_port(), &self.counters);
        let verdict = self.backoff_gate.verdict(&ips, Instant::now(), |ips| {
            counters.backoff_looks.fetch_add(1, Ordering::Relaxed);
            counters.backoff_look_addresses.fetch_add(ips.len() as u64, Ordering::Relaxed);
            let b = crate::host::tcp_backoff::scan(ips, port, true);
            if b.backed_off > 0 {
                // Debug: the rank asks again every half second, and logs the wait once itself.
                log::debug!(
                    "{}: rank {} takes this server back, but {} of its connections to the rank still wait out TCP's retransmission \
                     backoff from the outage (resend in up to {} ms{}): refused as busy until they resent",
                    c.peer,
                    c.rank,
                    b.backed_off,
                    b.rto_ms,
                    if b.capped > 0 { ", capped" } else { "" }
                );
            }
            if b.backed_off == 0 {
                // Taken back: what the connections' congestion control made
                // of the outage is wrong now (`tcp_backoff`'s module doc).
                let renewed = crate::host::tcp_renew::renew_congestion_control(ips, port);
                counters.cc_renewals.fetch_add(u64::from(renewed), Ordering::Relaxed);
            }
            b.backed_off > 0
        });
        match verdict {
            Verdict::Seen { backed_off, .. } => backed_off,
            Verdict::Throttled => {
                log::debug!("{}: rank {}'s rejoin told busy: too many backoff looks in the last {REUSE_FOR:?}", c.peer, c.rank);
                true
            }
        }
    }

    pub(super) fn join(&mut self, j: Joining) {
        let Joining { rejoin, heartbeats, conn, peer, spec, rank, names, secret } = j;
        let c = Conn { id: conn, rank, peer, heartbeats };
        if self.draining.is_some() {
            log::info!("{peer}: rank {rank} of job {:#x} refused: the server is draining", spec.job_id);
            refuse(&mut self.net, &c, RejectCode::Draining, "", "the server is draining (shutting down): it admits no new jobs");
            return;
        }
        let running = self.active.iter().position(|a| a.as_ref().is_some_and(|a| a.job_id == spec.job_id && a.phase != Phase::Ending));
        if let Some(i) = running {
            if !rejoin {
                refuse(&mut self.net, &c, RejectCode::JobMismatch, "job_id", "a job with this id is already running");
                return;
            }
            // Fencing ends the running job: only its own ranks may, and they
            // hold its secret (`wire::auth`); a token and its id are not enough.
            if !wire::secret_eq(&self.active[i].as_ref().expect("found").secret, &secret) {
                log::warn!("{peer}: a rejoin of job {:#x} as rank {rank} refused: not the job's secret; the job goes on", spec.job_id);
                self.counters.refused(RejectCode::Unauthorized);
                refuse(&mut self.net, &c, RejectCode::Unauthorized, "secret", "not this job's secret: only its own ranks may rejoin it");
                return;
            }
        }
        if rejoin && self.backed_off_towards(&c, &names, running.is_some()) {
            refuse(
                &mut self.net,
                &c,
                RejectCode::Busy,
                "",
                "this server's connections to you still wait out TCP's backoff; try again shortly",
            );
            return;
        }
        if let Some(i) = running {
            self.fence(i, rank, peer);
        }
        // A failed job's tombstone holds back its own ranks (its secret), not
        // another client that picked the same id.
        if let Some(t) = self.failed_joins.get(&spec.job_id).filter(|t| wire::secret_eq(&t.secret, &secret)) {
            if t.until <= Instant::now() {
                self.failed_joins.remove(&spec.job_id);
            } else if t.rejoins || !rejoin {
                let why = t.why.clone();
                log::info!("{peer}: rank {rank} of job {:#x} refused: {why}", spec.job_id);
                refuse(&mut self.net, &c, RejectCode::JobFailed, "", &why);
                return;
            }
        }
        // Ranks waiting for their job to gather hold a connection each: bounded
        // by what the server could ever run at once.
        let waiting: u32 = self.pending.values().map(|p| p.joined).sum();
        if waiting >= self.limits.max_ranks * self.active.len() as u32 {
            log::warn!("{peer}: refused: {waiting} ranks already waiting for their jobs to gather");
            refuse(&mut self.net, &c, RejectCode::Busy, "", "too many ranks waiting for their jobs to gather; try again later");
            return;
        }
        let nranks = spec.nranks as usize;
        let p = self.pending.entry(spec.job_id).or_insert_with(|| Pending {
            spec,
            secret,
            rejoin,
            conns: (0..nranks).map(|_| None).collect(),
            names: vec![None; nranks],
            joined: 0,
            first_join: Instant::now(),
            deadline: Instant::now() + self.join_timeout,
        });
        if !wire::secret_eq(&p.secret, &secret) {
            // Refused alone: the ranks that brought the job's secret go on joining.
            log::warn!("{peer}: rank {rank} of job {:#x} refused: not the secret the job's first rank brought", spec.job_id);
            self.counters.refused(RejectCode::Unauthorized);
            refuse(&mut self.net, &c, RejectCode::Unauthorized, "secret", "not this job's secret (the ranks of a job share one)");
            return;
        }
        if p.spec != spec || p.rejoin != rejoin {
            let field = if p.rejoin != rejoin { "flags" } else { mismatch_field(&p.spec, &spec) };
            log::warn!("{peer}: rank {rank} of job {:#x} disagrees with the other ranks on {field}", spec.job_id);
            refuse(&mut self.net, &c, RejectCode::JobMismatch, field, "differs from what other ranks of this job sent");
            return;
        }
        if p.conns[rank as usize].is_some() {
            if p.names[rank as usize].as_ref() != Some(&names) {
                log::warn!("{peer}: rank {rank} of job {:#x} joined twice", spec.job_id);
                refuse(&mut self.net, &c, RejectCode::DuplicateRank, "rank", "this rank already joined the job");
                return;
            }
            // The same rank (the same endpoint) again: its first connection
            // broke while it waited (its keepalive gave up on a link that was
            // down a while), and it joined again. Take the new connection.
            let old = p.conns[rank as usize].take().expect("checked");
            p.joined -= 1;
            log::info!("job {:#x}: rank {rank} joined again from {peer}; its first connection is dropped", spec.job_id);
            self.conn_job.remove(&old.id);
            self.net.close(old.id);
        }
        p.conns[rank as usize] = Some(c);
        p.names[rank as usize] = Some(names);
        p.joined += 1;
        self.conn_job.insert(conn, spec.job_id);
        log::debug!("job {:#x}: rank {rank} joined from {peer} ({}/{})", spec.job_id, p.joined, spec.nranks);
        if p.joined == spec.nranks {
            let p = self.pending.remove(&spec.job_id).unwrap();
            self.admit(p);
        }
    }

    pub(super) fn admit(&mut self, p: Pending) {
        let spec = p.spec;
        // Its ranks' first sends open provider connections: find them soon.
        let now = Instant::now();
        self.rto_settle_until = now + RTO_SETTLE;
        self.next_rto_sweep = self.next_rto_sweep.min(now + RTO_SWEEP_SOON);
        let mut conns: Vec<Conn> = p.conns.into_iter().map(|c| c.expect("all joined")).collect();
        let names: Vec<Vec<EndpointName>> = p.names.into_iter().map(|n| n.expect("all joined")).collect();
        // A communicator's later job takes the room its first job kept
        // (`reserve`); any other job a slot no job, quarantine or room holds.
        let room = if spec.sibling { self.take_room(&p.secret, spec.job_id) } else { None };
        let Some(index) = room.or_else(|| (0..self.active.len()).find(|&i| self.slot_is_free(i))) else {
            log::warn!("job {:#x} refused: already serving {} jobs", spec.job_id, self.active.len());
            let hint = if spec.sibling { LATER_JOB_HINT } else { "" };
            self.refuse_all(
                &mut conns,
                RejectCode::TooManyJobs,
                "",
                &format!("the server already runs its limit of {} jobs (or keeps their slots for other jobs){hint}", self.active.len()),
            );
            return;
        };
        if let Some(l) = self.stuck_lcore(spec.shards) {
            let msg = format!("lcore {l} of the server is stuck inside the fabric provider; restart the server");
            log::warn!("job {:#x} refused: {msg}", spec.job_id);
            self.refuse_all(&mut conns, RejectCode::Internal, "", &msg);
            return;
        }
        // The piece may be smaller than asked, so that the region fits (budget.rs).
        let asked = spec.chunk_elems;
        let grant = match budget::grant(&spec, &self.allocs, REGION_ALIGN, self.stage_buffers) {
            Ok(g) => g,
            Err(e) => {
                log::warn!("job {:#x} refused: {e}", spec.job_id);
                let hint = if spec.sibling { LATER_JOB_HINT } else { "" };
                self.refuse_all(&mut conns, RejectCode::NoCapacity, "", &format!("{e}{hint}"));
                return;
            }
        };
        let spec = JobSpec { chunk_elems: grant.chunk_elems, ..spec };
        // Per lcore: the piece and region. A latency lcore (when the job
        // has bulk lcores too, as the Accept will say) only ever gets
        // operations of at most latency_max bytes, so its pieces, and its
        // region, need be no larger.
        let split = spec.shards > self.latency_lcores as u32;
        let latency_elems = ((1usize << self.latency_max_log2) / spec.dtype.size()) as u32;
        let tag = self.next_tag();
        // The job's sequence key: what a third party on the fabric cannot guess.
        let key = match crate::host::random::bytes::<4>() {
            Ok(b) => u32::from_le_bytes(b),
            Err(e) => {
                log::error!("job {:#x} refused: {e}", spec.job_id);
                self.refuse_all(&mut conns, RejectCode::Internal, "", &e.to_string());
                return;
            }
        };
        let latency_lcores = self.latency_lcores as usize;
        let shape = |l: usize| -> (JobSpec, usize, usize) {
            if split && l < latency_lcores && latency_elems < spec.chunk_elems {
                let s = JobSpec { chunk_elems: latency_elems, ..spec };
                let stride = s.piece_bytes().next_multiple_of(budget::PIECE_ALIGN);
                (s, stride, spec.window as usize * slot_strides(spec.dtype, spec.nranks, grant.stage) * stride)
            } else {
                (spec, grant.stride, grant.len)
            }
        };
        // A split job (small pieces split by rank over the lcores that take
        // small operations, see `dataplane::split`): its split slots follow
        // its window's, and each split lcore's area follows its region.
        let groups = wire::split_lcores(spec.nranks, self.small_lcores(spec.shards));
        let split_shared = (spec.split && groups >= 2).then(|| Arc::new(SplitShared::new(spec.nranks, groups, spec.window)));
        if split_shared.is_some() && 2 * spec.window * spec.nranks > self.limits.max_window * self.limits.max_ranks {
            let msg = format!(
                "a split job of {} ranks at window {} needs twice the operation contexts this server has per job (max_window x max_ranks); set TALLY_SPLIT=0 on the ranks",
                spec.nranks, spec.window
            );
            log::warn!("job {:#x} refused: {msg}", spec.job_id);
            self.refuse_all(&mut conns, RejectCode::NoCapacity, "", &msg);
            return;
        }
        let area = |l: usize| split_shared.as_ref().filter(|_| l < groups as usize).map_or(0, |sh| sh.area_len(l as u32));
        let mut regions = Vec::new();
        for l in 0..spec.shards as usize {
            let (_, stride, len) = shape(l);
            match self.allocs[l].alloc(len + area(l)) {
                Some(off) => regions.push((off, len + area(l))),
                None => {
                    let (largest, total) = (self.allocs[l].largest_free(), self.allocs[l].total());
                    for (k, (off, len)) in regions.iter().enumerate() {
                        self.allocs[k].release(*off, *len);
                    }
                    let msg = format!(
                        "the job needs {} per lcore (window {} x {} ranks x {} piece); lcore {l} has {} free of {}",
                        crate::host::units::format_size(len as u64),
                        spec.window,
                        spec.nranks,
                        crate::host::units::format_size(stride as u64),
                        crate::host::units::format_size(largest as u64),
                        crate::host::units::format_size(total as u64)
                    );
                    log::warn!("job {:#x} refused: {msg}", spec.job_id);
                    let hint = if spec.sibling { LATER_JOB_HINT } else { "" };
                    self.refuse_all(&mut conns, RejectCode::NoCapacity, "", &format!("{msg}{hint}"));
                    return;
                }
            }
        }
        if spec.reserve > 0 {
            if let Err((code, msg)) = self.keep_rooms(index, &spec, &p.secret, &regions, grant.stride, grant.stage > 0) {
                for (l, (off, len)) in regions.iter().enumerate() {
                    self.allocs[l].release(*off, *len);
                }
                log::warn!("job {:#x} refused: {msg}", spec.job_id);
                self.refuse_all(&mut conns, code, "reserve", &msg);
                return;
            }
        }
        for (l, (off, _)) in regions.iter().enumerate() {
            let (spec, stride, len) = shape(l);
            let split = split_shared.as_ref().filter(|_| l < groups as usize).map(|sh| SplitOn {
                shared: sh.clone(),
                position: l as u32,
                base: *off + len,
            });
            // Each rank's name for this lcore: its lane l mod lanes.
            let client_names = names.iter().map(|n| n[l % n.len()].clone()).collect();
            let on = JobOnShard { index: index as u16, tag, key, spec, base: *off, stride, stage: grant.stage, client_names, split };
            let _ = self.lcores[l].send(Command::AddJob(Box::new(on)));
        }
        log::info!(
            "job {:#x}: {} ranks, {} {}, {} elements per piece{}, window {}, {} shards{}: starting (tag {tag:#06x})",
            spec.job_id,
            spec.nranks,
            spec.dtype,
            spec.op,
            spec.chunk_elems,
            match (asked == spec.chunk_elems, grant.stage) {
                (true, 0) => String::new(),
                (true, b) => format!(" (received {b} ranks at a time: a piece per rank would not fit the job's slab budget)"),
                (false, _) => format!(" (asked {asked}: the region fits the job's slab budget)"),
            },
            spec.window,
            spec.shards,
            match (spec.relay, &split_shared) {
                (true, _) => format!(", relay (pieces of at most {} bytes go on to the other rank)", wire::RELAY_MAX),
                (false, Some(_)) => format!(", split (pieces of at most {} bytes by rank over {groups} lcores)", wire::SPLIT_MAX),
                (false, None) => String::new(),
            } + if spec.interleave { ", streams lcore-major" } else { "" }
                + &if spec.min_piece > 0 { format!(", pieces spread down to {} bytes", spec.min_piece) } else { String::new() }
        );
        self.active[index] = Some(Active {
            job_id: spec.job_id,
            spec,
            secret: p.secret,
            key,
            tag,
            conns,
            regions,
            ready: 0,
            ended: 0,
            stuck_lcores: Vec::new(),
            done: vec![false; spec.nranks as usize],
            phase: Phase::Starting,
            seen_bytes: 0,
            last_traffic: Instant::now(),
            drain: None,
            recovery: None,
            rounds: super::round_budget::RoundBudget::new(Instant::now()),
            rejoin: p.rejoin,
            first_join: p.first_join,
            withheld: false,
        });
    }

    /// How many lcores take a job's small operations, as the ranks read it
    /// from the Accept: its latency lcores where it has them, else all.
    pub(super) fn small_lcores(&self, shards: u32) -> u32 {
        let a = Accept {
            latency_lcores: accept_latency_lcores(self.latency_lcores, shards),
            latency_max_log2: self.latency_max_log2,
            lcores: shards,
            ..Accept::zeroed()
        };
        a.latency_split().map_or(shards, |(l, _)| l as u32)
    }

    /// The tag of a new job: the next value of a rolling 16-bit count that
    /// no running or quarantined job holds (never 0). A tag names a job on
    /// the wire (the high bits of every data message), and a job's late
    /// messages can outlive it in a provider's queue of unexpected messages
    /// (a rank's sends that arrived after the job ended here, as under a
    /// link cut or a fenced job). With tcp;ofi_rxm 1.17, a new receive that
    /// matched such a message from a rank whose connection is gone crashed
    /// the server inside fi_trecv (seen in scripts/bench/soak.sh with link cuts:
    /// a tag of a 4-bit generation per job slot came back every 16 jobs,
    /// and address-vector entries are reused). Rolling over 16 bits makes a
    /// tag come back only after 65535 other jobs.
    pub(super) fn next_tag(&mut self) -> u16 {
        loop {
            self.last_tag = self.last_tag.wrapping_add(1);
            let t = self.last_tag;
            let taken = |t: u16| self.active.iter().flatten().any(|a| a.tag == t) || self.quarantined.iter().flatten().any(|q| q.tag == t);
            if t != 0 && !taken(t) {
                return t;
            }
        }
    }

    pub(super) fn refuse_all(&mut self, conns: &mut [Conn], code: RejectCode, field: &str, msg: &str) {
        for c in conns {
            self.conn_job.remove(&c.id);
            refuse(&mut self.net, c, code, field, msg);
        }
    }
}

/// What a communicator's later job refused for capacity is told.
const LATER_JOB_HINT: &str = ": a later job (dtype, op pair) of a communicator, past the room its first job reserved (TALLY_COMM_JOBS, on every rank, reserves room for that many pairs at init)";

/// Refuses a rank's join: the reject, then the close (counted by reason).
pub(super) fn refuse(net: &mut Connections, c: &Conn, code: RejectCode, field: &str, msg: &str) {
    net.refuse(c.id, code, field, msg);
}

/// The latency lcores a job on `shards` lcores is told of: none when it has
/// no bulk lcore (every one of its lcores then takes every operation).
pub(super) fn accept_latency_lcores(latency_lcores: u8, shards: u32) -> u8 {
    if shards > latency_lcores as u32 {
        latency_lcores
    } else {
        0
    }
}

pub(super) fn mismatch_field(a: &JobSpec, b: &JobSpec) -> &'static str {
    if a.nranks != b.nranks {
        "nranks"
    } else if a.dtype != b.dtype {
        "dtype"
    } else if a.op != b.op {
        "op"
    } else if a.chunk_elems != b.chunk_elems {
        "chunk_elems"
    } else if a.window != b.window {
        "window"
    } else if a.relay != b.relay || a.split != b.split || a.interleave != b.interleave {
        "flags"
    } else if a.seal_shift != b.seal_shift {
        "seal_shift"
    } else if a.failover != b.failover {
        "failover"
    } else if a.min_piece != b.min_piece {
        "min_piece"
    } else if a.reserve != b.reserve {
        "reserve"
    } else if a.sibling != b.sibling {
        "flags"
    } else {
        "shards"
    }
}
