//! The handshake: a rank's `Hello` (with its lanes' endpoint names,
//! `HelloMessage`), the server's `Accept` (with the lcores' endpoint names,
//! `NameRecord`) or `Reject` (a code and a reason), the job parameters every
//! rank must agree on (`JobSpec`) and the token.
//!
//! Lanes: a rank names one endpoint in its Hello, and every lcore of the
//! server sends to it; or, with `Hello::lanes` > 0, that many more as
//! `NameRecord`s right after the Hello, and the server's lcore `k` uses name
//! `k mod (1 + lanes)`. A rank with more rails than servers (each rail an
//! endpoint and a thread, `client::rails`) so spreads one server's lcores
//! over several rails. A server from before lanes refuses such a Hello (its
//! `lanes` byte was padding that had to be zero); a rank with no more rails
//! than servers sends none, and meets old and new servers alike.
use super::{
    copy_truncated, nul_terminated, read, Header, JobSecret, JobTag, Kind, WireError, JOB_SECRET_BYTES, MAGIC, MAX_RANKS, MAX_WINDOW,
    NAME_BYTES, RELAY_MAX, SPLIT_MAX, SPLIT_MAX_RANKS, SPLIT_MIN_RANKS, TOKEN_BYTES, VERSION,
};
use crate::reduce::{DataType, ReduceOp};
use bytemuck::{Pod, Zeroable};
use core::fmt;
use core::mem::size_of;
use static_assertions::const_assert_eq;

/// The most endpoint names one Hello carries (its own and the lanes').
pub const MAX_LANES: usize = 8;

/// A client's request to join a job.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Hello {
    pub header: Header,
    /// Chosen by the job (all ranks agree, e.g. from rank 0's NCCL handle).
    pub job_id: u64,
    /// HMAC of the token over the server's challenge and this message
    /// (`wire::auth`): the token is proven, never sent.
    pub proof: [u8; TOKEN_BYTES],
    /// The job's secret, sealed for the challenge (`wire::auth`); in clear
    /// between [`Hello::new`] and [`HelloMessage::answer`].
    pub secret: [u8; JOB_SECRET_BYTES],
    pub rank: u32,
    pub nranks: u32,
    /// NCCL data type code.
    pub dtype: u8,
    /// NCCL reduction op code.
    pub op: u8,
    /// [`Hello::REJOIN`]: the rank runs this job already, on other servers,
    /// and takes this (restarted) server back at an operation boundary.
    /// [`Hello::RELAY`]: (two-rank jobs) relay small pieces, see the module doc.
    /// [`Hello::SPLIT`], [`Hello::ALIVE`], [`Hello::INTERLEAVE`]: see each.
    pub flags: u8,
    /// How many [`NameRecord`]s follow the Hello: more endpoint names of the
    /// rank, below [`MAX_LANES`] (see the module doc).
    pub lanes: u8,
    /// Elements per shard of a chunk: the size of one server slot piece.
    pub chunk_elems: u32,
    /// Chunks each lcore keeps in flight for this job.
    pub window: u32,
    /// How many of the server's lcores the job uses (0: all).
    pub shards: u32,
    pub name_len: u16,
    /// All-reduces of at least `1 << seal_shift` bytes are sealed (0: none
    /// is, as from every rank of this build); see [`JobSpec::seal_shift`].
    /// A byte that was padding.
    pub seal_shift: u8,
    /// [`JobSpec::reserve`]: later jobs of this communicator the server
    /// keeps room for. A byte that was padding: a server from before
    /// refuses a job that reserves.
    pub reserve: u8,
    /// [`JobSpec::min_piece`]. Bytes that were padding: a server from
    /// before refuses a rank that sets it.
    pub min_piece: u32,
    /// The client's fabric endpoint name (first `name_len` bytes).
    pub name: [u8; NAME_BYTES],
}
const_assert_eq!(size_of::<Hello>(), 368);

/// The server's answer: `lcores` [`NameRecord`]s follow.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Accept {
    pub header: Header,
    /// The server's 16-bit tag for this job (the high bits of every [`Tag`]).
    pub job_tag: u16,
    /// The first `latency_lcores` name records are the server's latency
    /// lcores: operations of at most `2^latency_max_log2` bytes go to them
    /// only, larger ones only to the other records, so that a small
    /// all-reduce never queues behind a bulk job's pieces. 0: every lcore
    /// takes every operation (what a server from before these fields sends;
    /// a client that ignores them is still served right, only slower).
    pub latency_lcores: u8,
    pub latency_max_log2: u8,
    /// Number of lcore name records that follow (the shards this job uses).
    pub lcores: u32,
    /// Lcores the server has in all.
    pub server_lcores: u32,
    /// Elements per piece the server's slots hold for this job: at most the
    /// Hello's `chunk_elems`, less when `window x nranks` pieces of that size
    /// would not fit the job's slab budget (`control::budget`). The client
    /// cuts no piece larger (the smallest over its servers). 0: as asked
    /// (what a server from before this field sends).
    pub piece_elems: u32,
    /// The job's sequence key ([`JobTag`]): drawn at random per job.
    pub seq_key: u32,
    /// Milliseconds between the heartbeats this server sends the ranks that
    /// asked for them ([`Hello::ALIVE`]); 0: it sends none (heartbeats off
    /// here), or says nothing (a server from before this field, which sends
    /// them unannounced: such a rank arms its liveness at their first).
    pub heartbeat_ms: u32,
}
const_assert_eq!(size_of::<Accept>(), 32);

impl Accept {
    /// The job's dataplane identity: its tag and sequence key.
    pub fn job(&self) -> JobTag {
        JobTag { job: self.job_tag, key: self.seq_key }
    }
}

impl Accept {
    /// Largest latency threshold a server may announce (1 GiB).
    pub const MAX_LATENCY_LOG2: u8 = 30;

    /// How many of the name records are latency lcores, and the largest
    /// operation (bytes) that goes to them; None when the server splits
    /// nothing (no latency lcores, none left for bulk operations, or a
    /// threshold out of range).
    pub fn latency_split(&self) -> Option<(usize, usize)> {
        let l = self.latency_lcores as u32;
        let ok = l > 0 && l < self.lcores && (10..=Self::MAX_LATENCY_LOG2).contains(&self.latency_max_log2);
        ok.then(|| (l as usize, 1usize << self.latency_max_log2))
    }
}

/// One lcore's fabric endpoint name.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct NameRecord {
    pub len: u16,
    pub _pad: [u8; 6],
    pub bytes: [u8; NAME_BYTES],
}
const_assert_eq!(size_of::<NameRecord>(), 264);

impl NameRecord {
    pub fn new(name: &[u8]) -> Option<NameRecord> {
        if name.is_empty() || name.len() > NAME_BYTES {
            return None;
        }
        let mut r = NameRecord::zeroed();
        r.len = name.len() as u16;
        r.bytes[..name.len()].copy_from_slice(name);
        Some(r)
    }

    pub fn name(&self) -> Result<&[u8], WireError> {
        let n = self.len as usize;
        if n == 0 || n > NAME_BYTES {
            return Err(WireError::BadNameLength(self.len));
        }
        Ok(&self.bytes[..n])
    }
}

/// Why a server refused a client or ended a job.
#[repr(u16)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectCode {
    /// A field of the Hello is malformed or out of range (see `field`).
    BadField = 1,
    /// Wrong or missing token.
    Unauthorized = 2,
    /// The Hello disagrees with other ranks of the same job.
    JobMismatch = 3,
    /// The rank already joined.
    DuplicateRank = 4,
    /// Not enough slab space on the server for this job.
    NoCapacity = 5,
    /// The server already runs its maximum number of jobs.
    TooManyJobs = 6,
    /// Not every rank joined in time, or the handshake was too slow.
    Timeout = 7,
    /// The job failed while running (a rank vanished, a bad chunk, a fabric error).
    JobFailed = 8,
    /// The server is shutting down.
    Shutdown = 9,
    Internal = 10,
    /// Too many connections are in their handshake at once; try again later.
    Busy = 11,
    /// The server is draining: it admits no new jobs, or (after its drain
    /// timeout) ends the jobs still on it.
    Draining = 12,
}

impl RejectCode {
    pub fn from_u16(v: u16) -> Option<RejectCode> {
        use RejectCode::*;
        Some(match v {
            1 => BadField,
            2 => Unauthorized,
            3 => JobMismatch,
            4 => DuplicateRank,
            5 => NoCapacity,
            6 => TooManyJobs,
            7 => Timeout,
            8 => JobFailed,
            9 => Shutdown,
            10 => Internal,
            11 => Busy,
            12 => Draining,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use RejectCode::*;
        match self {
            BadField => "bad field",
            Unauthorized => "unauthorized",
            JobMismatch => "job mismatch",
            DuplicateRank => "duplicate rank",
            NoCapacity => "no capacity",
            TooManyJobs => "too many jobs",
            Timeout => "timeout",
            JobFailed => "job failed",
            Shutdown => "shutdown",
            Internal => "internal error",
            Busy => "busy",
            Draining => "draining",
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Reject {
    pub header: Header,
    pub code: u16,
    pub _pad: [u8; 6],
    /// The offending Hello field, NUL-padded (empty when not about a field).
    pub field: [u8; 24],
    /// Human-readable reason, NUL-padded.
    pub message: [u8; 216],
}
const_assert_eq!(size_of::<Reject>(), 256);

impl Reject {
    pub fn new(code: RejectCode, field: &str, message: &str) -> Reject {
        let mut r = Reject::zeroed();
        r.header = Header::new(Kind::Reject);
        r.code = code as u16;
        copy_truncated(&mut r.field, field.as_bytes());
        copy_truncated(&mut r.message, message.as_bytes());
        r
    }

    pub fn code(&self) -> Option<RejectCode> {
        RejectCode::from_u16(self.code)
    }

    pub fn field(&self) -> &str {
        nul_terminated(&self.field)
    }

    pub fn message(&self) -> &str {
        nul_terminated(&self.message)
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = self.code().map(RejectCode::name).unwrap_or("unknown");
        if self.field().is_empty() {
            write!(f, "{code}: {}", self.message())
        } else {
            write!(f, "{code}: {}: {}", self.field(), self.message())
        }
    }
}

impl fmt::Debug for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The largest [`JobSpec::min_piece`] (1 GiB): a piece never grows past its
/// job's chunk, which is far smaller, so a larger minimum changes nothing
/// but its rounding, which could then overflow (`client::MAX_MIN_PIECE`).
pub const MAX_MIN_PIECE: u32 = 1 << 30;

/// The most later jobs a communicator's first job reserves room for
/// ([`JobSpec::reserve`]): a client opens at most 8 (dtype, op) pairs.
pub const MAX_RESERVE: u8 = 7;

/// The largest [`JobSpec::seal_shift`]: seals from 1 TiB.
pub const MAX_SEAL_SHIFT: u8 = 40;

/// What a server will accept; the rest of a Hello is checked against these.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_ranks: u32,
    pub max_window: u32,
    /// Largest shard piece in bytes (chunk_elems x dtype size).
    pub max_chunk_bytes: u64,
    /// Lcores the server has.
    pub lcores: u32,
}

/// A Hello that passed every check, with its fields typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobSpec {
    pub job_id: u64,
    pub nranks: u32,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub chunk_elems: u32,
    pub window: u32,
    /// Lcores used (resolved: never 0).
    pub shards: u32,
    /// Two ranks that reduce pieces of at most [`RELAY_MAX`] bytes
    /// themselves: the server relays each to the other rank.
    pub relay: bool,
    /// Small pieces are split by rank over the lcores (see the module doc).
    pub split: bool,
    /// The ranks close each stream's share of an all-reduce of at least
    /// `1 << seal_shift` bytes with an empty piece, the seal (0: no seals).
    /// Ranks of this build send 0; builds from before 2026-11-29 sealed
    /// large all-reduces under failover (the proof that let their results
    /// skip the staging area, which a cut link showed unsafe: see
    /// `client::failover`). To the server a seal is a piece like any other,
    /// of length 0, but every rank must cut alike, so it holds them to one.
    pub seal_shift: u8,
    /// The ranks fail over if a server of the job is lost
    /// (`ClientConfig::failover`, [`Hello::FAILOVER`]). The server does
    /// nothing with it but hold every rank to the same: a rank that would
    /// not take part in a recovery would leave the others waiting for it.
    pub failover: bool,
    /// The ranks cut each all-reduce over the stream set in lcore-major
    /// order (`ClientConfig::interleave`). The server does nothing with it
    /// but hold every rank to the same, since ranks that cut differently
    /// would meet with different chunks in the same slot.
    pub interleave: bool,
    /// The smallest piece (bytes) the ranks cut an all-reduce into to
    /// spread it over the streams (`ClientConfig::min_piece`, TALLY_MIN_PIECE;
    /// 0: the default, `client::MIN_SPREAD_PIECE`). It decides the chunk
    /// size of an all-reduce smaller than one chunk per stream, so every
    /// rank must use the same: the server holds them to it, as it does
    /// `interleave`.
    pub min_piece: u32,
    /// The job is a communicator's first, and the server keeps a job slot
    /// and the same slab room as this job's for each of `reserve` later jobs
    /// of it (its other dtype and op pairs), from this job's admission
    /// until it ends, so that none of them can be refused for capacity
    /// mid-run (`control::reserve`); a server without the room refuses
    /// this job. At most [`MAX_RESERVE`].
    pub reserve: u8,
    /// The job is a later one of a communicator whose first job reserved
    /// room: it takes a room of the running job with the same secret, or,
    /// when none is left, free capacity as any job does.
    pub sibling: bool,
}

impl JobSpec {
    /// A job of `nranks` ranks reducing `dtype` with `op` in pieces of
    /// `chunk_elems`, `window` pieces in flight, on `shards` lcores (0: every
    /// one), with none of the options: no relay, split, seals, failover or interleave,
    /// the default smallest piece, no reserved rooms, not a sibling. Set
    /// those with struct update syntax: `JobSpec { relay: true, ..JobSpec::new(..) }`.
    pub const fn new(job_id: u64, nranks: u32, dtype: DataType, op: ReduceOp, chunk_elems: u32, window: u32, shards: u32) -> JobSpec {
        JobSpec {
            job_id,
            nranks,
            dtype,
            op,
            chunk_elems,
            window,
            shards,
            relay: false,
            split: false,
            seal_shift: 0,
            failover: false,
            interleave: false,
            min_piece: 0,
            reserve: 0,
            sibling: false,
        }
    }

    /// Bytes of one shard piece.
    pub fn piece_bytes(&self) -> usize {
        self.chunk_elems as usize * self.dtype.size()
    }

    /// Whether a piece of `len` bytes of this job is relayed (see the module doc).
    pub fn relays(&self, len: usize) -> bool {
        self.relay && len <= RELAY_MAX
    }

    /// Whether a piece of `len` bytes of this job is split by rank (see the module doc).
    pub fn splits(&self, len: usize) -> bool {
        self.split && len <= SPLIT_MAX
    }
}

/// A field-level refusal: which field and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub reason: &'static str,
}

impl fmt::Debug for Hello {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hello")
            .field("job_id", &self.job_id)
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("dtype", &self.dtype)
            .field("op", &self.op)
            .field("chunk_elems", &self.chunk_elems)
            .field("window", &self.window)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl Hello {
    /// A Hello for `rank` of the job `spec` carrying the job's `secret`
    /// (in clear until [`HelloMessage::answer`] seals it) and the rank's
    /// endpoint `name`.
    pub fn new(spec: &JobSpec, rank: u32, secret: &JobSecret, name: &[u8]) -> Option<Hello> {
        if name.is_empty() || name.len() > NAME_BYTES {
            return None;
        }
        let mut h = Hello::zeroed();
        h.header = Header::new(Kind::Hello);
        h.job_id = spec.job_id;
        h.secret = *secret;
        h.rank = rank;
        h.nranks = spec.nranks;
        h.dtype = spec.dtype as u8;
        h.op = spec.op as u8;
        h.chunk_elems = spec.chunk_elems;
        h.window = spec.window;
        h.shards = spec.shards;
        h.seal_shift = spec.seal_shift;
        h.reserve = spec.reserve;
        h.min_piece = spec.min_piece;
        if spec.relay {
            h.flags |= Hello::RELAY;
        }
        if spec.split {
            h.flags |= Hello::SPLIT;
        }
        if spec.interleave {
            h.flags |= Hello::INTERLEAVE;
        }
        if spec.sibling {
            h.flags |= Hello::SIBLING;
        }
        if spec.failover {
            h.flags |= Hello::FAILOVER;
        }
        h.name_len = name.len() as u16;
        h.name[..name.len()].copy_from_slice(name);
        Some(h)
    }

    /// The rank runs the job already and takes this server back (see `flags`).
    pub const REJOIN: u8 = 1;
    /// The job's ranks take small pieces relayed, and reduce them themselves
    /// (two-rank jobs only; see the module doc).
    pub const RELAY: u8 = 2;
    /// The job's small pieces are split by rank over lcores
    /// ([`SPLIT_MIN_RANKS`] to [`SPLIT_MAX_RANKS`] ranks; see the module doc).
    pub const SPLIT: u8 = 4;
    /// The rank wants heartbeats ([`Kind::Alive`]) on this connection once
    /// the job runs. Per rank, not part of the job's spec.
    pub const ALIVE: u8 = 8;
    /// The job's ranks cut over the streams lcore-major
    /// ([`JobSpec::interleave`]). A server from before it refuses the bit.
    pub const INTERLEAVE: u8 = 16;
    /// A later job of a communicator whose first job reserved room
    /// ([`JobSpec::sibling`]). A server from before it refuses the bit.
    pub const SIBLING: u8 = 32;
    /// The job's ranks fail over ([`JobSpec::failover`]). A server from
    /// before it refuses the bit.
    pub const FAILOVER: u8 = 64;

    pub fn rejoin(&self) -> bool {
        self.flags & Hello::REJOIN != 0
    }

    pub fn wants_heartbeats(&self) -> bool {
        self.flags & Hello::ALIVE != 0
    }

    /// Validates every field against `limits`; the proof and the secret
    /// are checked by the server separately (`wire::auth`: they need the
    /// challenge and the whole message).
    pub fn check(&self, limits: &Limits) -> Result<JobSpec, FieldError> {
        let bad = |field, reason| Err(FieldError { field, reason });
        if self.header.magic != MAGIC {
            return bad("magic", "not a tally handshake");
        }
        if self.header.version != VERSION {
            return bad("version", "unsupported protocol version");
        }
        if self.header.kind != Kind::Hello as u16 {
            return bad("kind", "expected a hello");
        }
        if self.nranks == 0 || self.nranks > limits.max_ranks.min(MAX_RANKS) {
            return bad("nranks", "zero or above the server's rank limit");
        }
        if self.rank >= self.nranks {
            return bad("rank", "must be below nranks");
        }
        let Some(dtype) = DataType::from_nccl(self.dtype as i32) else {
            return bad("dtype", "unknown data type");
        };
        let Some(op) = ReduceOp::from_nccl(self.op as i32) else {
            return bad("op", "unknown reduction op");
        };
        let piece = self.chunk_elems as u64 * dtype.size() as u64;
        if self.chunk_elems == 0 || piece > limits.max_chunk_bytes {
            return bad("chunk_elems", "zero or above the server's chunk limit");
        }
        if self.window == 0 || self.window > limits.max_window.min(MAX_WINDOW) {
            return bad("window", "zero or above the server's window limit");
        }
        if self.shards > limits.lcores {
            return bad("shards", "more shards than the server has lcores");
        }
        if self.name_len == 0 || self.name_len as usize > NAME_BYTES {
            return bad("name_len", "endpoint name empty or too long");
        }
        const KNOWN: u8 = Hello::REJOIN | Hello::RELAY | Hello::SPLIT | Hello::ALIVE | Hello::INTERLEAVE | Hello::SIBLING | Hello::FAILOVER;
        if self.flags & !KNOWN != 0 {
            return bad("flags", "unknown flag bits");
        }
        let relay = self.flags & Hello::RELAY != 0;
        if relay && self.nranks != 2 {
            return bad("flags", "relay is for two-rank jobs only");
        }
        let split = self.flags & Hello::SPLIT != 0;
        if split && !(SPLIT_MIN_RANKS..=SPLIT_MAX_RANKS).contains(&self.nranks) {
            return bad("flags", "split is for jobs of 4 to 64 ranks");
        }
        if self.lanes as usize >= MAX_LANES {
            return bad("lanes", "more endpoint names than a rank may send");
        }
        if self.seal_shift > MAX_SEAL_SHIFT {
            return bad("seal_shift", "seals above 1 TiB");
        }
        let sibling = self.flags & Hello::SIBLING != 0;
        if self.reserve > MAX_RESERVE {
            return bad("reserve", "room for more than 7 later jobs of a communicator");
        }
        if sibling && self.reserve != 0 {
            return bad("reserve", "a communicator's later job reserves nothing");
        }
        if self.min_piece > MAX_MIN_PIECE {
            return bad("min_piece", "above 1 GiB");
        }
        let shards = if self.shards == 0 { limits.lcores } else { self.shards };
        Ok(JobSpec {
            job_id: self.job_id,
            nranks: self.nranks,
            dtype,
            op,
            chunk_elems: self.chunk_elems,
            window: self.window,
            shards,
            relay,
            split,
            seal_shift: self.seal_shift,
            failover: self.flags & Hello::FAILOVER != 0,
            interleave: self.flags & Hello::INTERLEAVE != 0,
            min_piece: self.min_piece,
            reserve: self.reserve,
            sibling,
        })
    }

    pub fn name(&self) -> &[u8] {
        &self.name[..(self.name_len as usize).min(NAME_BYTES)]
    }

    /// Bytes of the whole handshake message that starts with `prefix`: the
    /// Hello alone until all of it is there, then with its lanes' records
    /// (at most [`MAX_LANES`] - 1 of them, whatever the byte says: a larger
    /// count is refused by [`Hello::check`] before the rest is read).
    pub fn message_len(prefix: &[u8]) -> usize {
        let hello = core::mem::size_of::<Hello>();
        match read::<Hello>(prefix) {
            Ok(h) => hello + (h.lanes as usize).min(MAX_LANES - 1) * core::mem::size_of::<NameRecord>(),
            Err(_) => hello,
        }
    }
}

/// A Hello as it goes on the wire: the Hello, then `hello.lanes` name
/// records (the rest of `lanes` is not sent).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct HelloMessage {
    pub hello: Hello,
    pub lanes: [NameRecord; MAX_LANES - 1],
}

impl HelloMessage {
    /// A Hello naming `names[0]`, with the rest of `names` as its lanes, to
    /// be answered to a server's challenge ([`HelloMessage::answer`]); None
    /// for no names, more than [`MAX_LANES`], or one empty or too long.
    pub fn new(spec: &JobSpec, rank: u32, secret: &JobSecret, names: &[&[u8]]) -> Option<HelloMessage> {
        let (first, rest) = names.split_first()?;
        if rest.len() >= MAX_LANES {
            return None;
        }
        let mut m = HelloMessage::zeroed();
        m.hello = Hello::new(spec, rank, secret, first)?;
        m.hello.lanes = rest.len() as u8;
        for (r, n) in m.lanes.iter_mut().zip(rest) {
            *r = NameRecord::new(n)?;
        }
        Some(m)
    }

    /// The bytes to send: the Hello and its lanes' records.
    pub fn as_bytes(&self) -> &[u8] {
        let all = bytemuck::bytes_of(self);
        &all[..core::mem::size_of::<Hello>() + self.hello.lanes as usize * core::mem::size_of::<NameRecord>()]
    }

    /// Lane `k`'s record (`1..=lanes`; the Hello itself names lane 0) in
    /// a message of [`Hello::message_len`] bytes.
    pub fn lane(msg: &[u8], k: usize) -> Result<NameRecord, WireError> {
        let at = core::mem::size_of::<Hello>() + k.saturating_sub(1) * core::mem::size_of::<NameRecord>();
        read(msg.get(at..).unwrap_or(&[]))
    }
}

/// The wire form of a token string: its bytes, zero-padded to 32. Longer
/// tokens are refused rather than silently cut (`openssl rand -hex 16` fits).
pub fn token_bytes(s: &str) -> Option<[u8; TOKEN_BYTES]> {
    let b = s.trim().as_bytes();
    if b.len() > TOKEN_BYTES {
        return None;
    }
    let mut t = [0u8; TOKEN_BYTES];
    t[..b.len()].copy_from_slice(b);
    Some(t)
}

/// Compares two tokens in time independent of where they differ.
pub fn token_eq(a: &[u8; TOKEN_BYTES], b: &[u8; TOKEN_BYTES]) -> bool {
    let mut diff = 0u8;
    for i in 0..TOKEN_BYTES {
        diff |= a[i] ^ b[i];
    }
    // black_box keeps the compiler from turning the loop into an early exit.
    core::hint::black_box(diff) == 0
}
