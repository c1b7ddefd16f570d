//! Failover: a job keeps running when one of its servers dies.
//!
//! An all-reduce's shard is the same rank-order reduction wherever it is
//! computed, so work a dead server held can be redone on the others with a
//! bit-identical result, provided someone still has either the result or
//! every rank's input. Two things make that always true here:
//!
//! - **Results land in a staging area** (`Stage`, `client/stage.rs`; failover
//!   owns each sub-job's) and are copied into the
//!   caller's buffer only once whole. An in-place all-reduce's input is
//!   therefore never half overwritten by a result that stopped arriving.
//!   And no receive into a caller's buffer can outlive the all-reduce it
//!   belongs to: the provider cannot cancel a receive it has matched to a
//!   message half arrived (rxm over tcp; a multi-packet message on EFA),
//!   so when a link is cut, or a server frozen, in the middle of a piece,
//!   the rest of that piece comes in whenever the link returns, possibly
//!   long after the recovery completed the all-reduce and the caller took
//!   its buffer back. It lands in a staging slot of the lost stream, which
//!   nothing reads, and which is reused only once the provider gave the
//!   receive back (`take_back`, `settle_lost`). (Results once went straight
//!   into the caller's buffer where a proof said no rank could still need
//!   them from there, most of every large all-reduce; a cut link then wrote
//!   a stale piece into memory the caller had reused: `tests/suites/linkcut.rs`.)
//! - **A result stays staged until every rank has it.** Stream slots cycle
//!   over twice the window: a rank posts sequence `s + 2W` only after it
//!   received `s + W`, which the server sent only after every rank had
//!   posted `s + W`, which each did only after receiving `s`. So a slot is
//!   reused only once every rank holds what it held. A rank that already
//!   completed (and gave back) an all-reduce still holds what a slower rank
//!   may lack.
//!
//! The recovery, for one lost server X (or several lost together):
//!
//! 1. **Notice.** X's control connection closes (its process died: the
//!    kernel closes its sockets at once), an operation to X completes with
//!    an error, or X ends the job. The rank freezes X's streams as they
//!    stand (later completions from them are ignored), cancels what it
//!    posted there, closes its connection to X, and holds its later
//!    all-reduces uncut.
//! 2. **Report** to the leader, the first server of the job's list it has
//!    not lost: `Lost{dead, boundary, report}`. The report says, per stream,
//!    the oldest sequence not complete here and which of the next W
//!    results arrived. The leader tells every rank (`Failover`), so ranks
//!    that noticed nothing report too, and once every rank reported the
//!    same set it sends every rank every report and the switch operation K,
//!    the largest boundary (`Recover`). A loss noticed before that (the
//!    leader itself, say) grows the set and everyone reports again. With
//!    several sub-jobs each rank takes their Recovers in sub-job order (a
//!    redo job's join is collective), and a Recover of a later sub-job
//!    loses its servers in the earlier ones first (`Client::lose_before`):
//!    the leader's word of an earlier sub-job's recovery may still be on
//!    its way, on another connection, and a rank that took the later
//!    verdict first waited in its redo join for ranks that waited for its
//!    report in the earlier one.
//! 3. **Agree**, each rank on its own and identically from the same
//!    reports. Operations from K on are cut over the survivors only (a new
//!    stream set, as after a drain). The lost work is every chunk of an
//!    operation before K that was (or would have been) X's, from the oldest
//!    sequence any rank lacks: an *item*. Per item: if every rank has it,
//!    nothing; if some rank has it, it is relayed: the lowest such rank
//!    sends its copy and the others send the sum's identity (-0.0, or 0),
//!    through a Sum job, which returns exactly that copy; if no rank has
//!    it, it is recomputed: every rank sends its input again (intact, see
//!    above) through a job with the original op.
//! 4. **Redo** on *redo jobs*: sibling jobs joined on the survivors for
//!    this recovery (one lcore each, a window of [`REDO_WINDOW`]), with
//!    sequence numbers of their own. Items go to them in (operation, chunk)
//!    order, round-robin over their streams. Separate sequences matter: a
//!    rank that has not yet issued operation j+1 (its caller waits for j)
//!    could never fill a slot queued behind j+1's chunks on a shared stream.
//!
//! Rejoin: once a recovery is over, a background thread (`Watcher`, watcher.rs) tries
//! to reach the lost servers; one that answers again (restarted on its
//! address) gets a Hello flagged REJOIN for the same job, admits it once
//! every rank is back, and asks each rank for its boundary: from the
//! largest, K, operations are cut over its new streams too (streams carry
//! the operations from `born` to before `died`; every rank agrees on both).
//! A restarted one's new streams take the places of its lost ones (their
//! context ids, flights and staging slots: `take_back`), once nothing the
//! provider still holds of the old ones can complete (`settle_lost`): a
//! server killed and restarted any number of times costs a rank what it
//! cost once. (A frozen or cut-off one, the same process, still gets new
//! places each time, `take_back` says why, but not new staging slots:
//! those of a place lost for good whose receives settled, `Stage::hand_over`.)
//!
//! Limits: a second loss while a recovery's items are in flight fails the
//! job with an error saying so (a loss during the agreement is fine: it
//! just grows the set); a rank that finished and said Bye before the loss
//! cannot take part, so the leader ends the job. Failover is on for jobs
//! with two to 64 servers and a window of at most 32 (`TALLY_FAILOVER=0`
//! turns it off), on providers that complete sends independently (the
//! staging area is registered where the provider wants local buffers
//! registered, as EFA does: untested there so far). Not on shm: it completes an endpoint's
//! sends in order (see `fabric::endpoint`), so one send the dead server
//! never took blocks every later send completion of the rank for good.
//! shm is one host's transport, where servers and ranks die together
//! anyway; tcp;ofi_rxm and EFA complete sends per peer.
//!
//! The code: [`Failover`] (this file) owns every sub-job's failover state,
//! its staging area included, and is called by the client: `lose` (step
//! 1, 2), `recover` (3), the redo flights (4), `poll_rejoins`; `redo.rs`
//! is a recovery in progress ([`Round`](redo::Round)) and its redo jobs,
//! `rejoin.rs` taking lost servers back, `watcher.rs` the thread that
//! reaches them. Each call is lent the client's `Core` and calls nothing
//! above it: where the client has more to do afterwards (cut the
//! operations it held, complete the ones now done, post), the call's
//! result says so.
use super::error::ClientError;
use super::stage::{Landed, Stage};
use super::state::{bits, Core, Flight, Stream};
use crate::dataplane::fabric::CompletionError;
use crate::wire;
use redo::{seq_ge, Item, Round};
use rejoin::{Rejoins, ServerNames, Step};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod redo;
mod rejoin;
mod stats;
mod watcher;
pub use redo::{REDO_CONNECT_FOR, REDO_CONTEXTS_PER_SERVER, REDO_WINDOW};
pub use stats::FailoverStats;

/// Failover's state of one sub-job.
#[derive(Default)]
struct JobFailover {
    /// Where results land first (None: the sub-job cannot fail over, and
    /// they go straight into the caller's buffer).
    stage: Option<Stage>,
    /// Servers this rank lost (bit i: the i-th server of the list).
    dead: u64,
    /// The set it last reported.
    reported: u64,
    /// Lost servers whose recovery is complete.
    handled: u64,
    /// Reported, waiting for the leader's Recover: later operations are
    /// held uncut.
    recovering: bool,
    round: Option<Round>,
    /// When this rank noticed the first loss of the recovery in progress.
    noticed: Option<Instant>,
    /// Streams lost since the last recovery (it redoes their work).
    fresh: Vec<usize>,
    /// The leader's Recover, waiting for the sub-jobs before this one.
    verdict: Option<Verdict>,
    /// Lost servers on their way back, and the watcher that reaches them.
    rejoins: Rejoins,
    /// When to look again for lost streams' staging slots to give back
    /// (`rejoin::reclaim_slots`): set when a server is taken back, cleared
    /// once none is held.
    reclaim_at: Option<Instant>,
}

/// How often a rank looks for lost streams' staging slots it can give back.
const RECLAIM_EVERY: Duration = Duration::from_secs(1);

/// The leader's Recover: the lost set, the switch operation, and every
/// rank's report.
pub(super) type Verdict = (u64, u64, Vec<u8>);

/// A client's failover: per sub-job, its staging area, the servers it
/// lost, the recovery in progress and the servers on their way back.
pub(super) struct Failover {
    jobs: Vec<JobFailover>,
    /// What failover did so far (the per-chunk path counts the rest:
    /// `Client::failover_stats`).
    stats: FailoverStats,
    /// The servers' endpoint names as last seen.
    names: ServerNames,
}

/// What a redo flight's completion did ([`Failover::on_redo_completion`]).
pub(super) enum RedoDone {
    /// Nothing yet: its other half is still out.
    Pending,
    /// Its item is redone.
    Item,
    /// Its item is redone, into an operation that may now be complete.
    ItemOfOp,
}

impl Failover {
    /// For a client of `servers` servers; `tcp_peers` is shared with the
    /// watchdog (see `ServerNames`).
    pub(super) fn new(servers: usize, tcp_peers: Arc<super::tcp_floor::TcpPeers>) -> Failover {
        Failover { jobs: Vec::new(), stats: FailoverStats::default(), names: ServerNames::new(servers, tcp_peers) }
    }

    /// A sub-job joined, with its staging area (None: it cannot fail over).
    pub(super) fn add_job(&mut self, stage: Option<Stage>) {
        self.jobs.push(JobFailover { stage, ..JobFailover::default() });
    }

    /// Whether sub-job `sub` can fail over.
    #[inline(always)]
    pub(super) fn on(&self, sub: usize) -> bool {
        self.jobs[sub].stage.is_some()
    }

    /// Sub-job `sub`'s staging area, where it can fail over.
    #[inline(always)]
    pub(super) fn staging(&self, sub: usize) -> Option<&Stage> {
        self.jobs[sub].stage.as_ref()
    }

    #[inline(always)]
    pub(super) fn staging_mut(&mut self, sub: usize) -> Option<&mut Stage> {
        self.jobs[sub].stage.as_mut()
    }

    /// What failover did so far (its own counters).
    pub(super) fn stats(&self) -> FailoverStats {
        self.stats
    }

    /// Operations of sub-job `sub` wait uncut: a recovery's agreement, or
    /// a rejoin's switch, is under way.
    pub(super) fn holding(&self, sub: usize) -> bool {
        self.jobs[sub].recovering || self.jobs[sub].rejoins.pending()
    }

    /// Reported, waiting for the leader's verdict.
    pub(super) fn recovering(&self, sub: usize) -> bool {
        self.jobs[sub].recovering
    }

    /// Whether this rank lost server `si` of sub-job `sub`.
    pub(super) fn has_lost(&self, sub: usize, si: usize) -> bool {
        self.jobs[sub].dead & (1u64 << si) != 0
    }

    /// The servers this rank lost in sub-job `sub` (bit i: the i-th server).
    pub(super) fn lost(&self, sub: usize) -> u64 {
        self.jobs[sub].dead
    }

    /// Whether a receive of a recovery's redo jobs will take a message
    /// with this tag (`client::sweep`).
    pub(super) fn redo_awaits(&self, tag: wire::Tag) -> bool {
        self.jobs.iter().filter_map(|j| j.round.as_ref()).any(|r| r.awaits(tag))
    }

    /// A recovery of sub-job `sub` is redoing work.
    #[inline(always)]
    pub(super) fn redoing(&self, sub: usize) -> bool {
        self.jobs[sub].round.is_some()
    }

    /// Operation `index` of sub-job `sub` is cut over the old stream set,
    /// whose lost servers' chunks the recovery in progress redoes.
    pub(super) fn redoes(&self, sub: usize, index: u64) -> bool {
        self.jobs[sub].round.as_ref().is_some_and(|r| index < r.switch_op)
    }

    /// Server `si`'s endpoint names, from its Accept (over `provider`).
    pub(super) fn note_server_names<'a>(&mut self, provider: &str, si: usize, names: impl Iterator<Item = &'a [u8]> + Clone) {
        self.names.note(provider, si, names);
    }

    /// The leader's Recover for sub-job `sub`, kept until the sub-jobs
    /// before it had theirs ([`Failover::take_verdict`]).
    pub(super) fn hear_verdict(&mut self, sub: usize, verdict: Verdict) {
        self.jobs[sub].verdict = Some(verdict);
    }

    pub(super) fn take_verdict(&mut self, sub: usize) -> Option<Verdict> {
        self.jobs[sub].verdict.take()
    }

    /// This rank lost the servers in `mask` (or was told so): freeze their
    /// streams, close their connections, and report to the leader.
    pub(super) fn lose(&mut self, c: &mut Core, sub: usize, mask: u64, why: &str) -> Result<(), ClientError> {
        let job = c.subs[sub].job_id;
        let fo = &mut self.jobs[sub];
        if fo.stage.is_none() {
            return Err(ClientError::Refused {
                server: c.servers_named(mask),
                reject: format!("lost ({why}); failover is off for this job"),
            });
        }
        let new = mask & !fo.dead;
        if new != 0 {
            if let Some(r) = &fo.round {
                return Err(ClientError::Refused {
                    server: c.servers_named(new),
                    reject: format!(
                        "lost ({why}) while job {job:#x} was still redoing the work of {}: a second loss during a recovery is not recovered",
                        c.servers_named(r.dead)
                    ),
                });
            }
            let window = c.cfg.window as usize;
            for si in bits(new) {
                log::warn!("server {} lost ({why}): job {job:#x} fails over to its other servers", c.cfg.servers[si]);
                let s = &mut c.subs[sub];
                s.controls[si] = None; // if it lives, it ends the job there, which tells the others
                fo.rejoins.forget_server(si);
                for st in 0..s.streams.len() {
                    if s.streams[st].server != si || s.streams[st].lost {
                        continue;
                    }
                    s.streams[st].lost = true;
                    fo.fresh.push(st);
                    for slot in 0..window {
                        if s.flights[st * window + slot].op != 0 {
                            let base = sub as u32 * c.per_sub + ((st * window + slot) as u32) * 2;
                            let rail = s.streams[st].rail;
                            c.rails.cancel(rail, base);
                            c.rails.cancel(rail, base + 1);
                        }
                    }
                }
            }
            fo.dead |= new;
            fo.noticed.get_or_insert_with(Instant::now);
            // Queued sends to a lost server must not wait for its credits.
            for si in bits(new) {
                if let Some(p) = c.subs[sub].pacing.get_mut(si) {
                    p.in_flight = 0;
                    p.waiting.clear();
                }
            }
            // Posts waiting for a retry on the lost streams are dropped too.
            let (per_sub, redo_base, streams) = (c.per_sub, c.redo_base, &c.subs[sub].streams);
            c.retry.retain(|&ctx| {
                let (csub, local) = ((ctx / per_sub) as usize, ctx % per_sub);
                csub != sub || local >= redo_base || !streams[(local >> 1) as usize / window].lost
            });
        }
        let fo = &self.jobs[sub];
        if fo.dead & !fo.handled == 0 || fo.reported == fo.dead {
            return Ok(());
        }
        let Some(leader) = (0..c.cfg.servers.len()).find(|&si| fo.dead & (1u64 << si) == 0 && c.subs[sub].controls[si].is_some()) else {
            return Err(ClientError::Refused {
                server: c.servers_named(fo.dead),
                reject: format!("every server of job {job:#x} is lost (last: {why}); no server left to fail over to"),
            });
        };
        self.report(c, sub, leader)
    }

    /// Sends the leader this rank's boundary and its view of every stream.
    fn report(&mut self, c: &mut Core, sub: usize, leader: usize) -> Result<(), ClientError> {
        let window = c.cfg.window as usize;
        let boundary = c.first_uncut(sub);
        let dead = self.jobs[sub].dead;
        let s = &c.subs[sub];
        let mut msg = Vec::with_capacity(32 + 8 * s.streams.len());
        msg.extend_from_slice(bytemuck::bytes_of(&wire::Lost::new(dead, boundary, 8 * s.streams.len() as u32)));
        for (st, stream) in s.streams.iter().enumerate() {
            let mask = held_mask(stream, &s.flights[st * window..(st + 1) * window]);
            msg.extend_from_slice(&stream.head_seq.to_le_bytes());
            msg.extend_from_slice(&mask.to_le_bytes());
        }
        log::debug!("job {:#x}: reporting lost servers {dead:#x} to {} (boundary {boundary})", s.job_id, c.cfg.servers[leader]);
        match c.send_control(sub, leader, &msg) {
            Ok(()) => {
                let fo = &mut self.jobs[sub];
                fo.reported = dead;
                fo.recovering = true;
                Ok(())
            }
            Err(e) => self.lose(c, sub, 1u64 << leader, &format!("cannot report to it: {e}")),
        }
    }

    /// The leader's verdict: every rank's report for the lost set `dead`,
    /// and the switch operation. Works out the items and starts redoing
    /// them. True: a recovery started, and the client completes what is
    /// done, cuts what it held and posts (`Client::recover`); false: the
    /// verdict is stale here.
    pub(super) fn recover(&mut self, c: &mut Core, sub: usize, (dead, switch_op, reports): Verdict) -> Result<bool, ClientError> {
        let job = c.subs[sub].job_id;
        let (nranks, window) = (c.cfg.nranks as usize, c.cfg.window as usize);
        let fo = &mut self.jobs[sub];
        if dead != fo.dead || fo.round.is_some() || !fo.recovering {
            log::debug!("job {job:#x}: recovery for {dead:#x} is stale here (lost {:#x}); ignored", fo.dead);
            return Ok(false);
        }
        let nstreams = c.subs[sub].streams.len();
        if reports.len() != nranks * nstreams * 8 {
            return Err(ClientError::Fabric(format!(
                "recovery of job {job:#x}: {} bytes of reports, expected {} ranks x {nstreams} streams x 8",
                reports.len(),
                nranks
            )));
        }
        let word = |i: usize| u32::from_le_bytes(reports[4 * i..4 * i + 4].try_into().unwrap());
        let heads: Vec<u32> = (0..nranks * nstreams).map(|i| word(2 * i)).collect();
        let masks: Vec<u32> = (0..nranks * nstreams).map(|i| word(2 * i + 1)).collect();
        let new = dead & !fo.handled;
        let dtype = c.subs[sub].dtype;
        let piece = c.subs[sub].chunk_elems * dtype.size();
        fo.recovering = false;
        fo.round = Some(Round::new(switch_op, new, nranks, heads, masks, dtype, piece));
        let lost: Vec<usize> = std::mem::take(&mut fo.fresh);
        for &st in &lost {
            c.subs[sub].streams[st].died = switch_op;
        }
        let lo = fo.round.as_ref().map_or_else(Vec::new, |r| r.oldest_heads(nstreams));
        let mut items = Vec::new();
        // (a) Results staged here of operations that completed here.
        let s = &c.subs[sub];
        if let Some(stage) = &fo.stage {
            for &st in &lost {
                for k in 0..stage.slots {
                    let h = stage.meta[st * stage.slots + k];
                    let in_flight = (0..window).any(|w| s.flights[st * window + w].op != 0 && s.flights[st * window + w].seq == h.seq);
                    if h.valid && seq_ge(h.seq, lo[st]) && !in_flight {
                        items.push(Item {
                            op_index: h.op_index,
                            chunk: h.chunk as usize,
                            st,
                            seq: h.seq,
                            len: h.len as usize,
                            op: 0,
                            off: 0,
                            holder: None,
                            done: false,
                        });
                    }
                }
            }
        }
        // (b) Flights to the lost servers, as they stood when lost.
        for &st in &lost {
            for w in 0..window {
                let f = c.subs[sub].flights[st * window + w];
                if f.op == 0 {
                    continue;
                }
                c.subs[sub].flights[st * window + w] = Flight::default();
                let Some(pos) = c.ops.iter().position(|o| o.id == f.op) else { continue };
                let op = &c.ops[pos];
                let (off, len) = op.span(f.chunk);
                let index = op.index;
                if f.recv_done {
                    // The result is here; only the send's completion was missing.
                    // (Never a relayed piece: relay jobs have one server.)
                    if let Some(stage) = fo.stage.as_mut() {
                        let rail = c.subs[sub].streams[st].rail;
                        op.land(stage, st, f.seq, f.chunk, Landed::of(op.rail_copies(&c.rails, rail)));
                    }
                    c.ops[pos].done += 1;
                    items.push(Item { op_index: index, chunk: f.chunk, st, seq: f.seq, len, op: 0, off, holder: None, done: false });
                } else {
                    items.push(Item { op_index: index, chunk: f.chunk, st, seq: f.seq, len, op: f.op, off, holder: None, done: false });
                }
            }
            let stream = &mut c.subs[sub].streams[st];
            stream.head_seq = stream.next_seq;
            stream.head_slot = stream.next_slot;
        }
        items.sort_by_key(|it| (it.op_index, it.chunk));
        let round_no = fo.handled.count_ones() as u64 + 1;
        let r = fo.round.as_mut().expect("started above");
        r.items = items;
        // (c) Chunks of operations already cut that were never posted there.
        for oi in 0..c.ops.len() {
            if c.ops[oi].sub == sub && c.ops[oi].planned && c.ops[oi].index < switch_op {
                r.take_chunks(c, oi)?;
            }
        }
        r.items.sort_by_key(|it| (it.op_index, it.chunk));
        if let Err(e) = r.join_jobs(c, sub, round_no, dead) {
            return Err(ClientError::Refused {
                server: c.servers_named(!dead & ((1u64 << c.cfg.servers.len()) - 1)),
                reject: format!("the recovery of job {job:#x} from losing {} failed: {e}", c.servers_named(new)),
            });
        }
        if c.rails.needs_local_mr() {
            r.register_identity(&mut c.rails)?;
        }
        r.classify(c, sub)?;
        log::info!(
            "job {job:#x}: recovering from losing {}: operations from {switch_op} run on the other servers; {} chunks to redo",
            c.servers_named(new),
            r.left()
        );
        Ok(true)
    }

    /// Hands operation `oi`'s chunks on the lost streams to the recovery
    /// in progress, where one is (see `Round::cut`).
    pub(super) fn redo_cut(&mut self, c: &mut Core, oi: usize) -> Result<(), ClientError> {
        match self.jobs[c.ops[oi].sub].round.as_mut() {
            Some(r) => r.take_chunks(c, oi),
            None => Ok(()),
        }
    }

    /// An error completion: from a lost server's stream, expected (canceled);
    /// from a live server's, that server is lost to this job (if it can fail
    /// over); from a redo job, a second loss.
    pub(super) fn on_error_completion(&mut self, c: &mut Core, e: CompletionError) -> Result<(), ClientError> {
        let Some(ctx) = e.context else { return Err(ClientError::Fabric(e.to_string())) };
        let (sub, local) = ((ctx / c.per_sub) as usize, ctx % c.per_sub);
        if sub >= c.subs.len() {
            return Err(ClientError::Fabric(e.to_string()));
        }
        if local >= c.redo_base {
            return Err(ClientError::Fabric(format!("while recovering from a lost server: {e}")));
        }
        let st = (local >> 1) as usize / c.cfg.window as usize;
        let Some(si) = c.subs[sub].streams.get(st).map(|s| s.server) else { return Err(ClientError::Fabric(e.to_string())) };
        if c.subs[sub].lost_stream(st) {
            return Ok(());
        }
        if self.jobs[sub].stage.is_some() {
            return self.lose(c, sub, 1u64 << si, &format!("fabric error: {e}"));
        }
        Err(ClientError::Fabric(e.to_string()))
    }

    /// Posts queued redo items on every redo stream with room, and ends
    /// the recovery once all are done.
    pub(super) fn pump_redo(&mut self, c: &mut Core, sub: usize) -> Result<(), ClientError> {
        let fo = &mut self.jobs[sub];
        if let Some(r) = fo.round.as_mut() {
            r.post_queued(c, sub, fo.stage.as_ref())?;
        }
        self.maybe_end_round(c, sub);
        Ok(())
    }

    /// Posts the send or receive of a redo flight (`local`: its context id
    /// after the sub-job's `redo_base`).
    pub(super) fn post_redo(&self, c: &mut Core, sub: usize, local: u32) -> Result<(), ClientError> {
        let fo = &self.jobs[sub];
        fo.round.as_ref().expect("redo flights are posted while their recovery runs").post(c, sub, fo.stage.as_ref(), local)
    }

    /// A redo flight's send or receive completed.
    pub(super) fn on_redo_completion(&mut self, c: &mut Core, sub: usize, local: u32, is_recv: bool) -> RedoDone {
        let Some(r) = self.jobs[sub].round.as_mut() else { return RedoDone::Pending };
        let Some(redone) = r.on_completion(c, local, is_recv) else { return RedoDone::Pending };
        if redone.relayed {
            self.stats.relayed += 1;
        } else {
            self.stats.recomputed += 1;
        }
        if redone.for_op {
            RedoDone::ItemOfOp
        } else {
            RedoDone::Item
        }
    }

    /// Ends the recovery once every item is done and every operation
    /// before the switch was cut: says Bye to the redo jobs, and has the
    /// watcher look for the lost servers.
    fn maybe_end_round(&mut self, c: &mut Core, sub: usize) {
        let fo = &mut self.jobs[sub];
        let Some(r) = fo.round.as_ref() else { return };
        if !r.finished() || c.first_uncut(sub) < r.switch_op {
            return;
        }
        let Some(mut r) = fo.round.take() else { return };
        r.close(&mut c.rails);
        fo.handled |= r.dead;
        let took = fo.noticed.take().map_or(Duration::ZERO, |t| t.elapsed());
        // Take them back when they return (restarted on the same address).
        for si in bits(r.dead) {
            fo.rejoins.watch_again(c, &self.names, sub, si);
        }
        self.stats.recoveries += 1;
        self.stats.last_recovery = took;
        log::warn!(
            "job {:#x}: recovered from losing {} in {:.0} ms ({} chunks redone; {} relayed, {} recomputed so far)",
            c.subs[sub].job_id,
            c.servers_named(r.dead),
            took.as_secs_f64() * 1e3,
            r.items.len(),
            self.stats.relayed,
            self.stats.recomputed
        );
    }

    /// Takes back lost servers of sub-job `sub` that answer again (see
    /// `rejoin.rs`), between recoveries. True: operations held for a
    /// rejoin's switch were cut (the client posts them): the server is
    /// back, or its rejoin failed on the way (then without it, as on the
    /// ranks that had not come that far).
    pub(super) fn poll_rejoins(&mut self, c: &mut Core, sub: usize) -> Result<bool, ClientError> {
        let fo = &mut self.jobs[sub];
        if fo.round.is_some() || fo.recovering {
            return Ok(false);
        }
        if let (Some(at), Some(stage)) = (fo.reclaim_at, fo.stage.as_mut()) {
            let now = Instant::now();
            if now >= at {
                fo.reclaim_at = rejoin::reclaim_slots(c, stage, sub).then_some(now + RECLAIM_EVERY);
            }
        }
        if !fo.rejoins.watching() {
            return Ok(false);
        }
        fo.rejoins.answer_reached(c, &self.names, sub);
        let held = fo.rejoins.pending();
        let mut i = 0;
        while i < fo.rejoins.active() {
            match fo.rejoins.step(c, &mut self.names, fo.stage.as_mut(), sub, i)? {
                Step::Waiting => i += 1,
                Step::Over => fo.rejoins.end(i),
                Step::Back { si, k, conn, beats } => {
                    fo.rejoins.end(i);
                    let s = &mut c.subs[sub];
                    for st in s.streams.iter_mut().filter(|st| st.server == si && st.born == u64::MAX) {
                        st.born = k;
                    }
                    fo.dead &= !(1u64 << si);
                    fo.handled &= !(1u64 << si);
                    fo.reported &= !(1u64 << si);
                    s.controls[si] = Some(conn);
                    // Armed from now where its Accept said it sends heartbeats
                    // (`Liveness::alive` says why), else by its first one.
                    if beats {
                        s.live.alive(si, Instant::now());
                    } else {
                        s.live.disarm(si);
                    }
                    log::warn!("server {} is back in job {:#x} from operation {k}", c.cfg.servers[si], s.job_id);
                    self.stats.rejoins += 1;
                    fo.reclaim_at = Some(Instant::now());
                }
            }
        }
        let mut cut = false;
        if held && !(c.subs[sub].awaiting_switch() || fo.recovering || fo.rejoins.pending()) {
            for oi in 0..c.ops.len() {
                if c.ops[oi].sub == sub && !c.ops[oi].planned {
                    c.cut(oi)?;
                    cut = true;
                }
            }
        }
        Ok(cut)
    }
}

/// A stream's report mask: bit i is set when this rank holds the result of
/// sequence `head_seq + i` (`flights` are the stream's window of slots).
/// Held: its result came in, or the flight completed already: its slot is
/// cleared while the head still waits for an older flight in flight (results
/// can complete out of order, e.g. a relayed small piece beside a large one),
/// and its result is staged like any other.
fn held_mask(stream: &Stream, flights: &[Flight]) -> u32 {
    let window = flights.len();
    let posted = stream.next_seq.wrapping_sub(stream.head_seq) as usize;
    let mut mask = 0u32;
    for i in 0..window.min(posted) {
        let seq = stream.head_seq.wrapping_add(i as u32);
        let f = &flights[(stream.head_slot as usize + i) % window];
        if f.op == 0 || (f.seq == seq && f.recv_done) {
            mask |= 1 << i;
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::held_mask;
    use crate::client::state::{Flight, Stream};

    /// Window 4, head at sequence 10 in slot 2; 10, 11 and 12 posted. 11
    /// completed before 10 (its slot is cleared, the head still waits on
    /// 10), 12's result came in but its send did not complete, 10 waits
    /// for its result: this rank holds 11 and 12 (bits 1 and 2), not 10.
    /// Before 9be490d the cleared slot of 11 was reported as not held.
    #[test]
    fn a_flight_completed_out_of_order_counts_as_held() {
        let mut stream = Stream::new(0, 0, 0, crate::wire::JobTag { job: 1, key: 0 });
        (stream.head_seq, stream.head_slot, stream.next_seq, stream.next_slot) = (10, 2, 13, 1);
        let mut flights = [Flight::default(); 4];
        flights[2] = Flight { op: 7, seq: 10, send_done: true, ..Flight::default() };
        flights[0] = Flight { op: 8, seq: 12, recv_done: true, ..Flight::default() };
        assert_eq!(held_mask(&stream, &flights), 0b110);
        // A result still missing is not held; nothing past next_seq is.
        flights[0].recv_done = false;
        assert_eq!(held_mask(&stream, &flights), 0b010);
        // A stale flight (an older sequence in the slot) is not this one.
        flights[0] = Flight { op: 8, seq: 8, recv_done: true, ..Flight::default() };
        assert_eq!(held_mask(&stream, &flights), 0b010);
        // Sequences wrap at 2^32, not at a multiple of the window.
        (stream.head_seq, stream.next_seq) = (u32::MAX, 2);
        flights[2].seq = u32::MAX;
        flights[0] = Flight { op: 8, seq: 1, recv_done: true, ..Flight::default() };
        assert_eq!(held_mask(&stream, &flights), 0b110);
    }
}
