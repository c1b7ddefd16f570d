//! Joining a sub-job: the Hello to every server, the answers (accepted,
//! busy, refused) waited for side by side, and the sub-job built from them:
//! its streams, flights, control connections, and failover's staging area
//! where it can fail over. All ranks join each (dtype, op) sub-job in the
//! same order, so every server sees the same jobs. A connection's own steps
//! (connect, Hello, answer) are `handshake.rs`'s.
use super::error::ClientError;
use super::failover::Failover;
use super::greet::{read_opening, send_answered, Opening};
use super::handshake::{await_answer, connect_control, hello_to, keepalive, wire_min_piece, Granted};
use super::join_wait;
use super::liveness::Liveness;
use super::stage::Stage;
use super::state::{Core, Flight, GenScratch, Leave, Pacing, Stream, SubJob};
use crate::reduce::{DataType, ReduceOp};
use crate::wire::{self, Hello, HelloMessage, JobSpec, Reject, RejectCode};
use std::collections::VecDeque;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Sibling jobs (one per dtype/op pair) a client may open.
pub const MAX_SUBJOBS: usize = 8;

/// Joins the job for (dtype, op) on every server, if not joined yet:
/// the sub-job's index. Blocks until every rank joined (or the timeout).
/// Collective.
pub(super) fn join_sub_job(c: &mut Core, fo: &mut Failover, dtype: DataType, op: ReduceOp) -> Result<usize, ClientError> {
    if let Some(i) = c.subs.iter().position(|s| s.dtype == dtype && s.op == op) {
        return Ok(i);
    }
    if c.subs.len() == MAX_SUBJOBS {
        return Err(ClientError::BadArgument(format!("more than {MAX_SUBJOBS} (dtype, op) pairs in one job")));
    }
    // Failover needs another server to move to and a window the report's
    // per-stream bitmap covers.
    let can_fail_over =
        c.cfg.failover && c.cfg.servers.len() > 1 && c.cfg.servers.len() <= 64 && c.cfg.window <= 32 && !c.rails.in_order_sends();
    let mut chunk_elems = (c.cfg.chunk_bytes / dtype.size()).max(1);
    // The first pair keeps the caller's id; the others derive one.
    let job_id = if c.subs.is_empty() { c.cfg.job_id } else { c.sub_job_id(dtype, op) };
    let spec = JobSpec {
        job_id,
        nranks: c.cfg.nranks,
        dtype,
        op,
        chunk_elems: chunk_elems as u32,
        window: c.cfg.window,
        shards: c.cfg.shards,
        // One server only: the relay is not combined with failover
        // (see ARCHITECTURE "Small all-reduces"). Every rank has the
        // same server list, so every rank decides alike.
        relay: c.cfg.relay && c.cfg.nranks == 2 && c.cfg.servers.len() == 1,
        // The same for the split, which needs two ranks per lcore.
        split: c.cfg.split && c.cfg.servers.len() == 1 && (wire::SPLIT_MIN_RANKS..=wire::SPLIT_MAX_RANKS).contains(&c.cfg.nranks),
        // Never sealed (`JobSpec::seal_shift`: builds from before
        // 2026-11-29 sealed large all-reduces under failover).
        seal_shift: 0,
        // Every rank takes part in a recovery, or none: the server checks.
        failover: can_fail_over,
        // The server holds every rank to the same order and cut.
        interleave: c.cfg.interleave,
        min_piece: wire_min_piece(c.cfg.min_piece),
        // The first job holds the room of the later ones on each server.
        reserve: if c.subs.is_empty() { c.cfg.reserve } else { 0 },
        sibling: !c.subs.is_empty() && c.cfg.reserve > 0,
    };
    let mut hellos = (0..c.cfg.servers.len()).map(|si| hello_to(c, si, &spec)).collect::<Result<Vec<_>, _>>()?;
    if c.cfg.wants_heartbeats() {
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
    let timeout = c.cfg.join_timeout;
    let connected: Vec<Result<TcpStream, ClientError>> = if hellos.len() == 1 {
        vec![connect_control(&c.cfg.servers[0], timeout)]
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = c.cfg.servers.iter().map(|server| scope.spawn(move || connect_control(server, timeout))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(ClientError::Config("a connect thread panicked".into())))).collect()
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
    let mut answers = collect_answers(c, &mut controls, &hellos, join_started)?;
    let mut live = Liveness::new(c.cfg.servers.len());
    for (si, slot) in controls.iter_mut().enumerate() {
        let server = &c.cfg.servers[si];
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
        fo.note_server_names(c.rails.provider(), si, g.names.iter().map(|n| n.as_bytes()));
        if g.beats && c.cfg.wants_heartbeats() {
            live.alive(si, Instant::now());
        }
        for (k, n) in g.names.iter().enumerate() {
            let rail = c.rails.rail_for(si, k);
            let addr = c.rails.insert_peer(rail, n).map_err(|e| ClientError::Fabric(e.to_string()))?;
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
    let groups = wire::split_lcores(c.cfg.nranks, small_lcores);
    let (split, split_max) = if spec.split && groups >= 2 {
        let p = wire::split_position(c.cfg.rank, c.cfg.nranks, groups) as usize;
        let base = Stream::new(streams[p].addr, streams[p].server, streams[p].rail, streams[p].job_tag);
        streams.push(Stream { split: true, slot_base: c.cfg.window as u16, ..base });
        (Some(streams.len() - 1), wire::SPLIT_MAX.min(chunk_elems * dtype.size()))
    } else {
        (None, 0)
    };
    if streams.len() as u32 * c.cfg.window * 2 > c.redo_base {
        return Err(ClientError::Config(format!(
            "{} streams x window {} exceeds this client's context table",
            streams.len(),
            c.cfg.window
        )));
    }
    let flights = vec![Flight::default(); streams.len() * c.cfg.window as usize];
    if c.cfg.failover && c.cfg.servers.len() > 1 && !can_fail_over && c.subs.is_empty() {
        log::info!("failover is off for this client: {} completes sends in order", c.rails.provider());
    }
    let stage = match can_fail_over {
        true => Some(Stage::new(streams.len(), c.cfg.window as usize, chunk_elems * dtype.size(), &mut c.rails)?),
        false => None,
    };
    let relay = match spec.relay {
        true => Some(Stage::new(streams.len(), c.cfg.window as usize, wire::RELAY_MAX, &mut c.rails)?),
        false => None,
    };
    let per_server = streams.len().div_ceil(c.cfg.servers.len()) * c.cfg.window as usize;
    let pacing = (0..c.cfg.servers.len()).map(|_| Pacing { in_flight: 0, waiting: VecDeque::with_capacity(per_server) }).collect();
    let gens = Vec::new();
    c.subs.push(SubJob {
        job_id,
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
        relay,
        split,
        split_max,
        live,
    });
    fo.add_job(stage);
    Ok(c.subs.len() - 1)
}

/// Every server's answer to this rank's Hello, waited for side by side
/// (see [`join_wait`]): a refusal, or a server that accepted and has
/// since ended the job, fails the join at once instead of after the
/// slowest server's answer. (A draining server's refusal is an answer:
/// the job runs on the others.)
#[allow(clippy::type_complexity)]
fn collect_answers(
    c: &Core,
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
        let waiting_on: Vec<Option<&TcpStream>> = controls.iter().zip(&pending).map(|(c, &p)| if p { c.as_ref() } else { None }).collect();
        let ready = join_wait::readable(&waiting_on, join_wait::TURN_MS);
        for si in (0..n).filter(|&si| ready[si]) {
            let (server, s) = (&c.cfg.servers[si], controls[si].as_mut().expect("pending servers have a connection"));
            if !greeted[si] {
                greeted[si] = true;
                // A reject instead (busy), or a broken connection, is
                // read as the answer below, which retries where it may.
                if let Ok(Opening::Challenge(challenge)) = read_opening(s, Duration::from_secs(1)) {
                    send_answered(s, &hellos[si], &challenge, &c.token)
                        .map_err(|e| ClientError::Connect { server: server.clone(), error: e.to_string() })?;
                    continue;
                }
            }
            let a = await_answer(c.cfg.rank, &c.token, server, s, &hellos[si], join_started, c.cfg.join_timeout, true)?;
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
                    server: c.cfg.servers[si].clone(),
                    reject: format!("{why} (while this rank waited for the other servers' answers to its join)"),
                });
            }
        }
        if join_started.elapsed() > c.cfg.join_timeout + Duration::from_secs(5) {
            let late: Vec<&str> = (0..n).filter(|&si| pending[si]).map(|si| c.cfg.servers[si].as_str()).collect();
            return Err(ClientError::Timeout(format!("no answer to the join from {} within {:?}", late.join(", "), c.cfg.join_timeout)));
        }
    }
}
