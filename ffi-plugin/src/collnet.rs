//! ncclCollNet: all-reduce offloaded to tally reduction servers.
//!
//! With CollNet, NCCL hands whole all-reduces of each node's data to the
//! network: every rank calls `iallreduce` with the same sequence of buffers
//! and gets the reduced result back. Here the network is a set of tally
//! servers (`TALLY_SERVERS=host:port,...`, token `TALLY_TOKEN`), reached
//! through the engine's [`Client`]: it cuts each all-reduce into chunks,
//! sends every chunk to the server lcore that owns it and receives the sum.
//!
//! Without `TALLY_SERVERS` the plugin offers no CollNet device, and NCCL
//! carries on without CollNet.
//!
//! `connect` is collective: NCCL gives every rank every rank's listen handle.
//! Each `listen` draws a random job id and a job secret from the kernel's
//! random source; all ranks take rank 0's, so they meet in the same server
//! job, and hold the secret no one outside the communicator has (the
//! servers hold every rank, and any rejoin, to it: `wire::auth`). `connect` then joins the job for f32 sum (the
//! common case) on every server, which proves the servers reachable and the
//! token accepted before NCCL commits to CollNet; a failing connect makes
//! NCCL fall back to its other algorithms. Other (type, op) pairs join their
//! own jobs on first use, which is also collective: NCCL issues the same
//! collectives in the same order on every rank. Joining blocks without
//! driving the fabric, so the all-reduces still in flight are finished first
//! (`iallreduce` returns NULL, "try again", until they are): joining while a
//! server waits on this rank's progress stalled the job over shm.
//!
//! Requests: each comm has [`MAX_REQUESTS`] slots at fixed addresses (the
//! pointer NCCL holds); a full comm returns a NULL request, which NCCL retries.
use crate::abi::NCCL_NET_HANDLE_MAXSIZE;
use crate::device::Devices;
use crate::error::{Error, Result};
use crate::handed::Tagged;
use crate::log;
use std::sync::Mutex;
use std::time::Duration;
use tally_engine::client::{servers, Client, ClientConfig, ClientError, Request as ClientRequest, MAX_OPS};
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::wire::{JobSecret, JOB_SECRET_BYTES};

pub type Handle = [u8; NCCL_NET_HANDLE_MAXSIZE];
const HANDLE_MAGIC: [u8; 4] = *b"TLYC";
/// 2: the job's secret follows the job id.
const PROTO_VERSION: u8 = 2;
/// Where the handle holds the job's secret.
const SECRET_AT: usize = 16;

/// All-reduces one comm may have in flight (the client's own limit).
pub const MAX_REQUESTS: usize = MAX_OPS;

/// The servers to use, from `TALLY_SERVERS` (comma or space separated);
/// empty where it is unset. A server listed twice, or more than
/// `servers::MAX_SERVERS`, is refused (`tally_engine::client::servers`
/// says why a duplicate is not dropped instead).
pub fn servers_from_env() -> Result<Vec<String>> {
    servers_from(&std::env::var("TALLY_SERVERS").unwrap_or_default())
}

/// [`servers_from_env`] of `list`.
fn servers_from(list: &str) -> Result<Vec<String>> {
    servers::parse(list).map_err(|e| Error::InvalidUsage(format!("TALLY_SERVERS: {e}")))
}

/// Whether the servers reduce `dtype` with `op` (NCCL codes): every NCCL type
/// and operation tally knows, nothing else.
pub fn reduce_support(dtype: i32, op: i32) -> bool {
    DataType::from_nccl(dtype).is_some() && ReduceOp::from_nccl(op).is_some()
}

/// What CollNet's `init` returns. The device table is the net's (CollNet's
/// device is the net's device 0, under the same name and PCI path).
pub struct CollCtx {
    pub servers: Vec<String>,
}

/// CollNet devices: one, riding on net device 0, when servers are configured.
pub fn device_count(devices: Option<&Devices>) -> usize {
    match devices {
        // A refused list offers no device either (`coll_init` said why).
        Some(d) if !d.list.is_empty() && servers_from_env().is_ok_and(|s| !s.is_empty()) => 1,
        _ => 0,
    }
}

pub struct CollListen {
    job_id: u64,
    /// NCCL's connect has no context argument: the listen comm carries what it needs.
    servers: Vec<String>,
}

/// A registration from CollNet's `regMr`. The client registers buffers
/// itself where the provider needs it, so this only records the range.
#[derive(Debug)]
pub struct CollMr {
    pub addr: usize,
    pub len: usize,
}

pub fn listen(ctx: &CollCtx, dev: i32) -> Result<(CollListen, Handle)> {
    if ctx.servers.is_empty() {
        return Err(Error::InvalidUsage("CollNet has no devices: TALLY_SERVERS is not set".into()));
    }
    if dev != 0 {
        return Err(Error::arg(format!("CollNet device {dev} does not exist (1 device)")));
    }
    // Never 0, which the server may treat as "no job".
    let random = |e: std::io::Error| Error::System(format!("CollNet listen: {e}"));
    let job_id = u64::from_le_bytes(tally_engine::host::random::bytes().map_err(random)?) | 1;
    let secret: JobSecret = tally_engine::host::random::bytes().map_err(random)?;
    let mut h = [0u8; NCCL_NET_HANDLE_MAXSIZE];
    h[0..4].copy_from_slice(&HANDLE_MAGIC);
    h[4] = PROTO_VERSION;
    h[8..16].copy_from_slice(&job_id.to_le_bytes());
    h[SECRET_AT..SECRET_AT + JOB_SECRET_BYTES].copy_from_slice(&secret);
    Ok((CollListen { job_id, servers: ctx.servers.clone() }, h))
}

/// The job id and secret a handle carries.
fn job_of(h: &Handle) -> Result<(u64, JobSecret)> {
    if h[0..4] != HANDLE_MAGIC || h[4] != PROTO_VERSION {
        return Err(Error::InvalidUsage("a handle is not a tally CollNet handle of this version".into()));
    }
    let secret: JobSecret = h[SECRET_AT..SECRET_AT + JOB_SECRET_BYTES].try_into().expect("32 bytes");
    Ok((u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")), secret))
}

impl CollListen {
    pub fn job_id(&self) -> u64 {
        self.job_id
    }
}

/// A request slot, at a fixed address NCCL holds as the request pointer
/// (tagged: [`crate::handed`]).
#[derive(Debug)]
pub struct CollRequest {
    /// The pointer NCCL holds for the owning [`CollComm`] (turned back into
    /// the comm only by the FFI layer, through its tag).
    pub owner: usize,
    pub index: usize,
}

#[derive(Clone)]
struct Flight {
    req: ClientRequest,
    bytes: usize,
    /// Already completed (seen while draining), or failed: reported by `test`.
    outcome: Option<std::result::Result<(), String>>,
}

struct State {
    client: Client,
    slots: Vec<Option<Flight>>,
    /// (type, op) pairs whose server job this rank has joined.
    joined: Vec<(DataType, ReduceOp)>,
}

pub struct CollComm {
    state: Mutex<State>,
    requests: Vec<Tagged<CollRequest>>,
    pub rank: u32,
    pub nranks: u32,
    pub job_id: u64,
}

fn client_error(e: ClientError) -> Error {
    match e {
        ClientError::BadArgument(m) => Error::InvalidArgument(m),
        ClientError::Config(m) => Error::InvalidUsage(m),
        e @ ClientError::Fabric(_) => Error::System(e.to_string()),
        e => Error::Remote(e.to_string()),
    }
}

/// Joins the job named by rank 0's handle on every server. Blocking and
/// collective, like NCCL's call.
pub fn connect(listen: &CollListen, handles: &[Handle], rank: i32) -> Result<CollComm> {
    let nranks = handles.len();
    let rank = u32::try_from(rank).ok().filter(|&r| (r as usize) < nranks).ok_or_else(|| Error::arg(format!("rank {rank} of {nranks}")))?;
    for h in handles {
        job_of(h)?;
    }
    let (job_id, secret) = job_of(&handles[0])?;
    let mut cfg = ClientConfig::new(listen.servers.clone(), job_id, rank, nranks as u32);
    cfg.job_secret = secret;
    if let Some(t) = std::env::var("TALLY_TIMEOUT_S").ok().and_then(|s| s.trim().parse::<u64>().ok()).filter(|&t| t > 0) {
        cfg.timeout = Duration::from_secs(t);
    }
    let local = listen.servers.iter().all(|s| s.starts_with("127.") || s.starts_with("localhost:") || s.starts_with("[::1]"));
    if tally_engine::dataplane::fabric::select_provider(None, local).starts_with("tcp") {
        tcp_defaults(&mut cfg);
    }
    if std::env::var_os("TALLY_MIN_PIECE").is_none() {
        // NCCL hands CollNet an all-reduce in steps (512 KiB each by
        // default) with several in flight, so cutting every step into a
        // piece per server lcore buys no parallelism, only more messages:
        // at 16 Gbit/s (emulated, 4 + 4 hosts, TCP autocorking on, which
        // held 64 KiB messages' tails: docs/measurements.md) 64 KiB pieces
        // reached 0.46 of the bound and 128 KiB ones 0.78. Half a chunk at
        // least (over tcp whole chunks: tcp_defaults).
        cfg.min_piece = cfg.min_piece.max(cfg.chunk_bytes / 2);
    }
    if std::env::var_os("TALLY_COMM_JOBS").is_none() {
        cfg.reserve = COMM_JOBS - 1;
    }
    let mut client = Client::connect(cfg).map_err(client_error)?;
    client.join(DataType::Float32, ReduceOp::Sum).map_err(client_error)?;
    let c = client.config();
    let credits = if c.send_credits == 0 {
        "sends as the window allows".to_string()
    } else {
        format!("{} sends in flight per server", c.send_credits)
    };
    log::info_init(&format!(
        "CollNet rank {rank}/{nranks}: joined job {job_id:#x} on {} over {} ({} streams; pieces of at most {} bytes, window {}, {credits})",
        listen.servers.join(","),
        client.provider(),
        client.streams(),
        c.chunk_bytes,
        c.window,
    ));
    // The requests get their owner once the comm is handed to NCCL
    // (`CollComm::set_requests_owner`).
    Ok(CollComm {
        state: Mutex::new(State { client, slots: vec![None; MAX_REQUESTS], joined: vec![(DataType::Float32, ReduceOp::Sum)] }),
        requests: (0..MAX_REQUESTS).map(|index| Tagged::new(CollRequest { owner: 0, index })).collect(),
        rank,
        nranks: nranks as u32,
        job_id,
    })
}

/// Jobs (dtype, op pairs) a communicator keeps room for on every server
/// from its start unless TALLY_COMM_JOBS says otherwise: f32 sum, which it
/// joins at init, and one more (bf16 sum in mixed-precision training), so
/// that a server filled meanwhile cannot fail the run at its first bf16
/// all-reduce (`control::reserve`). More pairs than this still run where
/// the servers have free capacity.
pub const COMM_JOBS: u8 = 2;

/// Pieces in flight per server lcore over tcp unless TALLY_WINDOW says
/// otherwise: the servers' default `max_window`, and room for all of NCCL's
/// 8 steps in flight where a step gives each stream a piece or two.
pub const TCP_WINDOW: u32 = 16;

/// The largest piece the plugin sends over tcp unless TALLY_CHUNK says
/// otherwise (where the eager limit allows it; see [`tcp_defaults`]).
pub const TCP_MAX_PIECE: usize = 128 << 10;

/// Cores below which the plugin sends pieces of at most [`FEW_CORES_PIECE`]
/// over tcp (the threshold below which `client::rails::auto_rails` keeps
/// one rail too).
pub const FEW_CORES: usize = 8;

/// The largest piece over tcp on a host of fewer than [`FEW_CORES`] cores.
pub const FEW_CORES_PIECE: usize = 32 << 10;

/// How much of the rank's link the plugin keeps in flight over tcp at most,
/// in milliseconds of it, where the link's rate is known (TALLY_LINK_GBITS).
/// More only waits in queues: on the 2-core machine, 8 + 8 hosts at 0.25
/// Gbit/s (`bench cluster --hosts 8 --rates 0.25 --sizes 16M --mode
/// agg-plugin`), [`TCP_WINDOW`]'s 16 pieces of 32 KiB a stream put 8 MiB, a
/// quarter of a second of the link, in flight per rank: the links' queues
/// dropped 4,185-7,715 packets a run and the plugin reached 0.86-0.87 of the
/// bound; a window of 4 (2 MiB) 541 packets and 0.89-0.91, alternated four
/// times, the servers a tenth less CPU per byte. At 1 Gbit/s (4 + 4 hosts, 64
/// MiB) 4 was too few: 0.74-0.80 against 0.83-0.88 with 16.
pub const TCP_IN_FLIGHT_MS: f64 = 32.0;

/// The least window [`tcp_window`] gives: the client library's auto window.
pub const TCP_MIN_WINDOW: u32 = 4;

/// The window over tcp: [`TCP_WINDOW`], or where the rank's link rate is
/// known, as many pieces a server as hold [`TCP_IN_FLIGHT_MS`] of the link
/// over `servers` servers, from [`TCP_MIN_WINDOW`] to [`TCP_WINDOW`]. (A
/// server's lcores each take the window, so a server with two holds twice.)
/// Every rank must ask the same window: it depends only on the rate, the
/// servers and the piece, which every rank of a job shares.
pub fn tcp_window(link_gbits: f64, servers: usize, piece: usize) -> u32 {
    if !(link_gbits.is_finite() && link_gbits > 0.0) || servers == 0 || piece == 0 {
        return TCP_WINDOW;
    }
    let link_bytes = link_gbits * 1e9 / 8.0 * TCP_IN_FLIGHT_MS / 1e3;
    // `as` saturates: a huge quotient is u32::MAX, then TCP_WINDOW.
    ((link_bytes / (servers * piece) as f64).round() as u32).clamp(TCP_MIN_WINDOW, TCP_WINDOW)
}

/// The client's settings over tcp;ofi_rxm where the user set none.
///
/// - Pieces of the eager limit the process runs with
///   (`fabric::defaults::eager_limit`: 128 KiB on libfabric 1.17, 32 KiB
///   from 1.18), at most [`TCP_MAX_PIECE`], and whole ones (TALLY_MIN_PIECE
///   too): a piece above the limit costs a rendezvous round trip (on shaped
///   links at 2-8 Gbit/s real NCCL over 4 emulated nodes reached 0.55-0.73
///   of the link with 256 KiB pieces, 0.98-0.99 with 32 KiB ones), and each
///   piece below it costs a rail the kernel's and the provider's work per
///   message. At 32 Gbit/s (4 + 4 hosts, `bench cluster --mode agg-plugin`,
///   alternated on three hosts) 128 KiB gave 0.81-0.97 of the bound against
///   0.70-0.85 with 32 KiB, 256 KiB 0.80-0.81 (64 KiB's collapse to
///   0.03-0.05 there was the emulated hosts' TCP autocorking; without it
///   0.98 / 0.86 against 128 KiB's 0.97 / 0.91); real NCCL: 11 of 16
///   pairs, with a tail of slow pieces. So NCCL's
///   512 KiB step goes to four streams whole, not to sixteen in 32 KiB
///   pieces (`client::op_chunk_bytes`, rotating over the streams).
/// - No send credits (TALLY_SEND_CREDITS unset is 0, as for the client
///   library): NCCL's steps (512 KiB at 16 MiB, 1 MiB from 64 MiB, over 4
///   channels) pace themselves, up to 8 in flight; a credit comes back only
///   once the rail's send completion has passed through NCCL's proxy
///   thread (its `test`). One credit per server held CollNet at 32 Gbit/s
///   to 0.65-0.78 of the link; four still cost CollNet on 4 GPUs: none won
///   9 of 10 pairs alternated on two hosts, 0.81-0.93 of the link against
///   0.59-0.85 at 16 MiB, 0.83-0.94 against 0.71-0.89 at 64 MiB (with 32
///   KiB pieces).
/// - [`TCP_WINDOW`]: with the auto window (4 pieces of 32 KiB) two servers
///   held two of NCCL's 8 steps in flight; fewer where the rank's link is
///   slow enough that 16 would only queue ([`tcp_window`]).
///
/// Real NCCL at 32 Gbit/s (`linerate.sh nccl-knobs`, alternated in one call
/// each; docs/measurements.md): on 2 GPUs one credit and window 4 gave
/// 0.65-0.78 of the link at 16 and 64 MiB, no credits and window 16
/// 0.90-0.99; on 4 GPUs the figures above. At 4-16 Gbit/s every setting
/// gave 0.96-1.00.
///
/// The caller's rail is on unless TALLY_CALLER_RAIL=0, as for the library's
/// client: NCCL's proxy thread drives rail 0 itself (`client::rails`). Where the rank's
/// link rate is known (TALLY_LINK_GBITS; `tally bench cluster` sets it for
/// its workers), auto rails count on each carrying
/// `client::rails::plugin_rail_gbits`: with the caller's rail one up to 4
/// Gbit/s, two at 8 and 16, four at 32; without it one up to 4, two at 8,
/// four from 16.
///
/// On a host of fewer than [`FEW_CORES`] cores pieces are at most
/// [`FEW_CORES_PIECE`]: there the CPU, not the count of messages, is what
/// runs out, and 128 KiB pieces cost twice the CPU per byte (2-core
/// machine, `bench cluster --hosts 8 --rates 0.25 --sizes 16M --mode
/// agg-plugin`: 0.60-0.61 of the bound at 6.7-7.1 worker CPU s/GB with 128
/// KiB pieces, 0.86 at 3.7-4.0 with 32 KiB ones, agg 0.91 beside them).
fn tcp_defaults(cfg: &mut ClientConfig) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = if cores >= FEW_CORES { TCP_MAX_PIECE } else { FEW_CORES_PIECE };
    if std::env::var_os("TALLY_CHUNK").is_none() {
        cfg.chunk_bytes = tally_engine::dataplane::fabric::defaults::eager_limit().clamp(4 << 10, most);
    }
    if std::env::var_os("TALLY_MIN_PIECE").is_none() {
        cfg.min_piece = cfg.chunk_bytes;
    }
    if std::env::var_os("TALLY_WINDOW").is_none() {
        cfg.window = tcp_window(cfg.link_gbits, cfg.servers.len(), cfg.chunk_bytes);
    }
    cfg.rail_gbits = tally_engine::client::rails::plugin_rail_gbits(cfg.caller_rail, cfg.link_gbits);
}

impl CollComm {
    pub fn request(&self, index: usize) -> &Tagged<CollRequest> {
        &self.requests[index]
    }

    /// Every request slot's owner: `at`, the pointer NCCL holds for this comm.
    pub(crate) fn set_requests_owner(&mut self, at: usize) {
        for r in self.requests.iter_mut() {
            r.owner = at;
        }
    }

    /// Marks every request slot closed, as NCCL closes the comm.
    pub(crate) fn close_requests(&mut self) {
        self.requests.iter_mut().for_each(Tagged::close);
    }

    /// Starts an all-reduce; Ok(None): every slot is busy, try again.
    ///
    /// # Safety
    /// `send` and `recv` must hold `count` elements of `dtype` and stay valid
    /// (and `recv` untouched by anyone else) until [`CollComm::test`] reports
    /// the request done or the comm is closed.
    pub unsafe fn iallreduce(&self, send: *const u8, recv: *mut u8, count: usize, dtype: i32, op: i32) -> Result<Option<usize>> {
        let dt = DataType::from_nccl(dtype).ok_or_else(|| Error::arg(format!("data type {dtype} is not supported")))?;
        let rop = ReduceOp::from_nccl(op).ok_or_else(|| Error::arg(format!("reduction operation {op} is not supported")))?;
        let bytes = count.checked_mul(dt.size()).filter(|&b| b <= crate::device::MAX_COLL_BYTES).ok_or_else(|| {
            Error::arg(format!("{count} elements of {dt} exceed the {} bytes one all-reduce may carry", crate::device::MAX_COLL_BYTES))
        })?;
        if bytes > 0 && (send.is_null() || recv.is_null()) {
            return Err(Error::arg("null buffer"));
        }
        let mut st = self.state.lock()?;
        let Some(slot) = st.slots.iter().position(Option::is_none) else {
            return Ok(None);
        };
        if !st.joined.contains(&(dt, rop)) {
            // A new (type, op) pair joins its own server job, a blocking
            // collective that does not drive the fabric meanwhile: with
            // all-reduces of another job still in flight, servers waiting on
            // this rank's progress can stall (seen over shm). So finish those
            // first: drive them here, report them through `test` later, and
            // have NCCL retry this call until none is left.
            let st = &mut *st;
            for f in st.slots.iter_mut().flatten().filter(|f| f.outcome.is_none()) {
                match st.client.test(f.req) {
                    Ok(true) => f.outcome = Some(Ok(())),
                    Ok(false) => {}
                    Err(e) => f.outcome = Some(Err(e.to_string())),
                }
            }
            if st.slots.iter().flatten().any(|f| f.outcome.is_none()) {
                return Ok(None);
            }
            st.client.join(dt, rop).map_err(client_error)?;
            st.joined.push((dt, rop));
            log::info(&format!("CollNet rank {}: joined the job for {dt} {rop}", self.rank));
        }
        // SAFETY: the caller's contract is the client's: both buffers stay
        // valid until the request is reported done or the comm is dropped.
        let req = unsafe { st.client.start(send, recv, count, dt, rop) }.map_err(client_error)?;
        st.slots[slot] = Some(Flight { req, bytes, outcome: None });
        Ok(Some(slot))
    }

    /// Some(bytes) once request `index` is done.
    pub fn test(&self, index: usize) -> Result<Option<usize>> {
        let mut st = self.state.lock()?;
        let Some(f) = st.slots.get(index).cloned().flatten() else {
            return Err(Error::InvalidUsage(format!("request {index} is not in flight")));
        };
        let outcome = match f.outcome {
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(e),
            // Kept as the client's words: wrapped once, as Error::Remote, below.
            None => st.client.test(f.req).map_err(|e| e.to_string()),
        };
        match outcome {
            Ok(false) => Ok(None),
            Ok(true) => {
                st.slots[index] = None;
                Ok(Some(f.bytes))
            }
            Err(e) => {
                st.slots[index] = None;
                // The client is unusable after a failure mid-operation: its
                // receives may target buffers NCCL will reuse. Cancel them.
                st.client.abort();
                Err(Error::Remote(e))
            }
        }
    }

    /// Closes the comm: the client says goodbye to the servers (or, with
    /// operations in flight, cancels them and closes, which fails the job
    /// for the other ranks at once rather than by timeout).
    pub fn close(self) -> Result<()> {
        let CollComm { state, rank, .. } = self;
        let mut st = state.into_inner()?;
        if let Some(r) = st.client.take_piece_times() {
            log::info(&format!("CollNet rank {rank}: {r}"));
        }
        let in_flight = st.slots.iter().flatten().count();
        if in_flight > 0 {
            log::info(&format!("CollNet rank {rank}: closed with {in_flight} all-reduce(s) in flight"));
        }
        drop(st.client);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tcp_window_holds_no_more_than_its_share_of_a_known_link() {
        // Unknown rate (no TALLY_LINK_GBITS): 16.
        assert_eq!(tcp_window(0.0, 8, 32 << 10), TCP_WINDOW);
        assert_eq!(tcp_window(f64::NAN, 8, 32 << 10), TCP_WINDOW);
        // 8 servers at 0.25 Gbit/s, 32 KiB pieces: 1 MB of link is 4 a server.
        assert_eq!(tcp_window(0.25, 8, 32 << 10), 4);
        // 4 servers at 1 Gbit/s: 30, at most 16.
        assert_eq!(tcp_window(1.0, 4, 32 << 10), 16);
        // Slower still: never below the client library's 4.
        assert_eq!(tcp_window(0.01, 64, 128 << 10), TCP_MIN_WINDOW);
        // The device's rates keep 16.
        assert_eq!(tcp_window(16.0, 4, 128 << 10), 16);
        assert_eq!(tcp_window(0.5, 8, 32 << 10), 8);
    }

    #[test]
    fn the_plugin_drives_rail_0_on_the_callers_thread_unless_told_not_to() {
        use tally_engine::client::rails::{NCCL_RAIL_GBITS, RAIL_GBITS};
        // Only this test sets TALLY_CALLER_RAIL in this binary.
        std::env::remove_var("TALLY_CALLER_RAIL");
        let mut cfg = ClientConfig::new(vec![], 1, 0, 2);
        assert!(cfg.caller_rail, "the library's client drives rail 0 on the caller's thread too");
        tcp_defaults(&mut cfg);
        assert!(cfg.caller_rail);
        // Link rate unknown (TALLY_LINK_GBITS unset): NCCL_RAIL_GBITS; known, see `plugin_rail_gbits`.
        assert_eq!(cfg.rail_gbits, NCCL_RAIL_GBITS);
        cfg.link_gbits = 16.0;
        tcp_defaults(&mut cfg);
        assert_eq!(cfg.rail_gbits, RAIL_GBITS, "above 8 Gbit/s with the caller's rail a rail counts as the library's");
        std::env::set_var("TALLY_CALLER_RAIL", "0");
        let mut cfg = ClientConfig::new(vec![], 1, 0, 2);
        tcp_defaults(&mut cfg);
        std::env::remove_var("TALLY_CALLER_RAIL");
        assert!(!cfg.caller_rail);
        assert_eq!(cfg.rail_gbits, NCCL_RAIL_GBITS);
    }

    #[test]
    fn tally_servers_are_taken_in_order_and_a_repeat_is_refused() {
        assert_eq!(servers_from(" 10.0.0.2:7400,10.0.0.1:7400 ").unwrap(), ["10.0.0.2:7400", "10.0.0.1:7400"]);
        assert_eq!(servers_from("").unwrap(), Vec::<String>::new());
        let e = servers_from("10.0.0.1:7400, 10.0.0.1:7400").unwrap_err();
        assert!(matches!(&e, Error::InvalidUsage(m) if m.starts_with("TALLY_SERVERS: server 10.0.0.1:7400 is listed twice")), "{e}");
        // A thousand copies of one server made a thousand joins of one job.
        let e = servers_from(&vec!["127.0.0.1:7400"; 1000].join(",")).unwrap_err();
        assert!(e.to_string().contains(&format!("1000 servers given, at most {}", servers::MAX_SERVERS)), "{e}");
    }
}
