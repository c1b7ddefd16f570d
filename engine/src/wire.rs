//! The wire: control-plane messages and the dataplane tag layout.
//!
//! Control plane (TCP, once per job): a client sends one [`Hello`]; the
//! server answers with an [`Accept`] header followed by one [`NameRecord`]
//! per lcore (the fabric address each shard goes to), or with a [`Reject`]
//! naming the field it refused. While the job runs the server may send a
//! [`Reject`] with code [`RejectCode::JobFailed`] and close the connection;
//! a client that finished sends a [`Header`] of kind [`Kind::Bye`] and closes.
//! A connection that closes without a Bye means the rank died: the job fails
//! at once for every rank, instead of leaving them to time out.
//!
//! Drain (a server going away while its jobs run): the server sends every
//! rank of a running job a [`Drain`]; each rank answers with a [`Boundary`]
//! (the index, counted per job from 0, of its first all-reduce not yet cut
//! into chunks, or [`Boundary::STAY`] when it has no other server to move
//! to); once every rank answered, the server sends every rank a
//! [`SwitchAt`] with the largest boundary, K. All-reduces before K still use
//! the draining server, later ones only the others; a rank that finished its
//! all-reduces before K says Bye to the draining server and closes.
//!
//! Failover (a server died): each rank that notices sends the first server
//! of the job's list that it has not lost a [`Lost`] with the set of lost
//! servers, its boundary and a report of what it holds of the lost servers'
//! work. That server tells every rank of the job with a [`Failover`] (so
//! that ranks that had not noticed report too) and, once every rank
//! reported the same set, sends every rank a [`Recover`] carrying the
//! largest boundary and all the reports. The ranks then agree, each on its
//! own and identically, on what to redo (see `client::failover`). A lost
//! server that comes back is joined anew with a [`Hello`] flagged
//! [`Hello::REJOIN`]; once every rank is in, it asks each for its boundary
//! (`Rejoin`), and the [`SwitchAt`] it sends names the operation from which
//! the job uses it again.
//!
//! Liveness (a server frozen, hung or cut off, with its connections still
//! open): a rank that sets [`Hello::ALIVE`] gets a bare [`Kind::Alive`]
//! header every `heartbeat_ms` from the server's control plane, which sends
//! it only while every lcore of the job keeps polling. A frozen process
//! sends nothing; a stuck lcore withholds its jobs' heartbeats. A rank that
//! heard a server once and then hears nothing for its liveness time
//! declares it lost, as it does a closed connection. The server learns that
//! it was dropped (fencing) from its closed connections, or at the latest
//! from the first Hello flagged [`Hello::REJOIN`] for a job it still runs:
//! that job is stale, so the server ends it and admits the rejoin. Results
//! of the stale job carry its old [`Tag`] and match no receive a rank posts.
//!
//! Relay (two-rank jobs, small pieces): ranks that set [`Hello::RELAY`] in a
//! two-rank job get, for every piece of at most [`RELAY_MAX`] bytes, the
//! *other* rank's piece back instead of the sum, sent on as soon as it
//! arrives, and reduce the two themselves in rank order (the same kernels,
//! so the same bits). The last piece in then costs one hop through the
//! server instead of a reduce and two sends in a row. Every rank of the job
//! must agree (the flag is part of the job's spec).
//!
//! Split (jobs of [`SPLIT_MIN_RANKS`] to [`SPLIT_MAX_RANKS`] ranks, small
//! pieces): ranks that set [`Hello::SPLIT`] send each piece of at most
//! [`SPLIT_MAX`] bytes not to one lcore for all ranks but to the lcore of
//! their rank's group ([`split_lcores`], [`split_position`]): the ranks are
//! cut into contiguous groups, one per lcore of those that take small
//! operations. Those pieces use slots `window..2 x window` of the job's tag
//! space (a stream of their own, whose sequence every rank advances alike).
//! Each lcore takes in its group's pieces and folds them, in rank order,
//! into a partial; the last lcore to complete its group combines the
//! partials in group order ([`split_folds_groups`]: `(r0 + r1) + (r2 + r3)`,
//! the same bits on every rank whatever the arrival order, though not those
//! of one rank-order fold), and each lcore sends the result to its own
//! group. 16-bit floats (combined in `f32` and rounded once) and more than
//! [`SPLIT_MAX_FOLDED_GROUPS`] groups keep one fold of every piece in rank
//! order. One lcore's copies in and out of a small all-reduce are then its
//! group's, not every rank's, and the combiner reads one partial per other
//! lcore rather than every other rank's piece.
//!
//! Every message is a fixed-size `#[repr(C)]` plain-old-data struct whose
//! size is pinned by a compile-time assertion, and starts with the same
//! [`Header`]. Integers are little-endian (every supported target is).
//! Nothing here trusts its input: [`Hello::check`] validates every field and
//! says which one is wrong.
//!
//! Dataplane (libfabric tagged messages): the 64-bit tag of every chunk
//! shard is `job (16) | slot (16) | sequence (32)`, see [`Tag`]. Receives
//! match on job and slot and leave the sequence free, so that a message with
//! a wrong sequence number still lands in its own job's slot and is caught
//! there (an error for that job) instead of waiting unmatched forever.
use bytemuck::{Pod, Zeroable};
use core::fmt;
use static_assertions::const_assert_eq;

use crate::reduce::{DataType, ReduceOp};

/// "TLLY" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"TLLY");
pub const VERSION: u16 = 1;
/// Bytes of an endpoint name carried on the wire (shm names are paths; EFA's are 32 bytes).
pub const NAME_BYTES: usize = 256;
pub const TOKEN_BYTES: usize = 32;
/// The largest `nranks` any server will accept, whatever its configuration.
pub const MAX_RANKS: u32 = 1024;
/// The largest window: slots are 16 bits in the tag.
pub const MAX_WINDOW: u32 = 1 << 15;
/// Pieces of a relay job (see the module doc) of at most this many bytes
/// are relayed: shm's inject size, at or below which a piece costs the
/// server one copy to send on.
pub const RELAY_MAX: usize = 4096;
/// Pieces of a split job (see the module doc) of at most this many bytes are
/// split by rank over lcores.
pub const SPLIT_MAX: usize = 4096;
/// Split jobs have at least this many ranks (two lcores of two ranks each)
/// and at most [`SPLIT_MAX_RANKS`] (the combining lcore reads every rank's
/// piece at once).
pub const SPLIT_MIN_RANKS: u32 = 4;
pub const SPLIT_MAX_RANKS: u32 = 64;

/// The most groups whose partials a split round combines (one kernel pass).
pub const SPLIT_MAX_FOLDED_GROUPS: u32 = 8;

/// Whether a split round of `groups` groups of `dtype` folds each group into
/// a partial and combines the partials in group order (see the module doc);
/// otherwise every piece is folded in rank order. Servers and tests agree
/// through this.
pub fn split_folds_groups(groups: u32, dtype: DataType) -> bool {
    (2..=SPLIT_MAX_FOLDED_GROUPS).contains(&groups) && !dtype.is_half()
}

/// How many lcores a split job's small pieces go to, of `lcores` that take
/// its small operations: at least two ranks each. Below 2 the job is not
/// split. The client and the server compute it from the same Accept.
pub fn split_lcores(nranks: u32, lcores: u32) -> u32 {
    lcores.min(nranks / 2)
}

/// Which of the `groups` lcores rank `rank`'s small pieces go to: ranks in
/// contiguous blocks, so that lcore p serves [`split_ranks`]`(p, ..)`.
pub fn split_position(rank: u32, nranks: u32, groups: u32) -> u32 {
    (rank as u64 * groups as u64 / nranks as u64) as u32
}

/// The ranks lcore position `p` of `groups` serves in a split job.
pub fn split_ranks(p: u32, nranks: u32, groups: u32) -> core::ops::Range<u32> {
    let first = |p: u32| (p as u64 * nranks as u64).div_ceil(groups as u64) as u32;
    first(p)..first(p + 1)
}

#[repr(u16)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Hello = 1,
    Accept = 2,
    Reject = 3,
    /// The rank is done with the job (all its all-reduces completed).
    Bye = 4,
    /// Server to rank: this server is draining (see [`Drain`]).
    Drain = 5,
    /// Rank to server: where this rank can switch (see [`Boundary`]).
    Boundary = 6,
    /// Server to rank: the operation from which the job leaves this server (see [`SwitchAt`]).
    SwitchAt = 7,
    /// Rank to a surviving server: servers this rank lost, and its state (see [`Lost`]).
    Lost = 8,
    /// Server to rank: the job is recovering from losing these servers; report (see [`Failover`]).
    Failover = 9,
    /// Server to rank: every rank's report and the switch operation (see [`Recover`]).
    Recover = 10,
    /// Server to rank of a rejoined job: answer with a [`Boundary`]; the
    /// [`SwitchAt`] that follows names the operation from which the job
    /// uses this server again. A bare [`Header`].
    Rejoin = 11,
    /// Server to a rank that set [`Hello::ALIVE`]: a heartbeat, sent every
    /// `heartbeat_ms` while every lcore of the job keeps polling. A bare
    /// [`Header`]. A rank that hears none for its liveness time declares
    /// the server lost, as if its connection had closed (see the module doc).
    Alive = 12,
}

impl Kind {
    /// Bytes of a whole message of this kind that a server may send a rank
    /// after the handshake (None: not one it sends then).
    pub const fn server_message_bytes(self) -> Option<usize> {
        match self {
            Kind::Reject => Some(core::mem::size_of::<Reject>()),
            Kind::Drain => Some(core::mem::size_of::<Drain>()),
            Kind::SwitchAt => Some(core::mem::size_of::<SwitchAt>()),
            Kind::Failover => Some(core::mem::size_of::<Failover>()),
            Kind::Rejoin => Some(core::mem::size_of::<Header>()),
            Kind::Alive => Some(core::mem::size_of::<Header>()),
            // Followed by `nranks * report_len` bytes of reports.
            Kind::Recover => Some(core::mem::size_of::<Recover>()),
            _ => None,
        }
    }

    /// Bytes of a whole message of this kind that a rank may send its server
    /// after the handshake (None: not one it sends then).
    pub const fn rank_message_bytes(self) -> Option<usize> {
        match self {
            Kind::Bye => Some(core::mem::size_of::<Header>()),
            Kind::Boundary => Some(core::mem::size_of::<Boundary>()),
            // Followed by `report_len` bytes of report.
            Kind::Lost => Some(core::mem::size_of::<Lost>()),
            _ => None,
        }
    }
}

/// The first 8 bytes of every control message.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Header {
    pub magic: u32,
    pub version: u16,
    pub kind: u16,
}
const_assert_eq!(core::mem::size_of::<Header>(), 8);

impl Header {
    pub const fn new(kind: Kind) -> Header {
        Header { magic: MAGIC, version: VERSION, kind: kind as u16 }
    }

    /// Checks magic and version and returns the message kind.
    pub fn check(&self) -> Result<Kind, WireError> {
        if self.magic != MAGIC {
            return Err(WireError::BadMagic(self.magic));
        }
        if self.version != VERSION {
            return Err(WireError::BadVersion(self.version));
        }
        match self.kind {
            1 => Ok(Kind::Hello),
            2 => Ok(Kind::Accept),
            3 => Ok(Kind::Reject),
            4 => Ok(Kind::Bye),
            5 => Ok(Kind::Drain),
            6 => Ok(Kind::Boundary),
            7 => Ok(Kind::SwitchAt),
            8 => Ok(Kind::Lost),
            9 => Ok(Kind::Failover),
            10 => Ok(Kind::Recover),
            11 => Ok(Kind::Rejoin),
            12 => Ok(Kind::Alive),
            k => Err(WireError::BadKind(k)),
        }
    }
}

/// Server to every rank of a running job: this server is draining. It
/// admits no new jobs and exits when no job uses it (or after `timeout_s`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Drain {
    pub header: Header,
    /// Seconds until the server ends whatever jobs are still on it.
    pub timeout_s: u32,
    pub _pad: u32,
}
const_assert_eq!(core::mem::size_of::<Drain>(), 16);

/// A rank's answer to a [`Drain`]: the first operation it may still move.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Boundary {
    pub header: Header,
    /// Index (per job, from 0) of the rank's first all-reduce not yet cut
    /// into chunks; [`Boundary::STAY`]: the rank has no other server.
    pub next_op: u64,
}
const_assert_eq!(core::mem::size_of::<Boundary>(), 16);

/// The server's decision after every rank's [`Boundary`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct SwitchAt {
    pub header: Header,
    /// All-reduces from this index on go to the other servers only;
    /// [`Boundary::STAY`]: the job stays on this server until it ends.
    pub op: u64,
}
const_assert_eq!(core::mem::size_of::<SwitchAt>(), 16);

impl Drain {
    pub fn new(timeout_s: u32) -> Drain {
        Drain { header: Header::new(Kind::Drain), timeout_s, _pad: 0 }
    }

    /// Checks the header and the padding.
    pub fn check(&self) -> Result<u32, WireError> {
        expect_kind(&self.header, Kind::Drain)?;
        if self._pad != 0 {
            return Err(WireError::BadPadding);
        }
        Ok(self.timeout_s)
    }
}

impl Boundary {
    /// "I cannot move off this server": the job stays there until it ends.
    pub const STAY: u64 = u64::MAX;

    pub fn new(next_op: u64) -> Boundary {
        Boundary { header: Header::new(Kind::Boundary), next_op }
    }

    pub fn check(&self) -> Result<u64, WireError> {
        expect_kind(&self.header, Kind::Boundary)?;
        Ok(self.next_op)
    }
}

impl SwitchAt {
    pub fn new(op: u64) -> SwitchAt {
        SwitchAt { header: Header::new(Kind::SwitchAt), op }
    }

    pub fn check(&self) -> Result<u64, WireError> {
        expect_kind(&self.header, Kind::SwitchAt)?;
        Ok(self.op)
    }
}

/// The largest report a rank may attach to a [`Lost`] (the server keeps
/// one per rank until every rank reported).
pub const MAX_REPORT: u32 = 64 << 10;

/// Rank to the surviving server it takes as the recovery's leader (the
/// first in its server list that it has not lost): it lost the servers in
/// `dead` (bit i: the i-th server of the job's list, the same list on every
/// rank). `boundary` is its first all-reduce not yet cut, as in
/// [`Boundary`]. `report_len` bytes follow: the rank's view of the lost
/// servers' work, opaque to the server, which hands every rank's report to
/// every rank in the [`Recover`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Lost {
    pub header: Header,
    pub dead: u64,
    pub boundary: u64,
    pub report_len: u32,
    pub _pad: u32,
}
const_assert_eq!(core::mem::size_of::<Lost>(), 32);

/// Server to every rank of a job: a rank reported losing the servers in
/// `dead` (the union of what ranks reported so far). A rank that has not
/// reported this set reports it (after dropping those servers itself).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Failover {
    pub header: Header,
    pub dead: u64,
}
const_assert_eq!(core::mem::size_of::<Failover>(), 16);

/// Server to every rank, once every rank reported the same `dead` set:
/// operations from `switch_op` (the largest boundary) on run without those
/// servers; `nranks` reports of `report_len` bytes follow, in rank order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable, PartialEq, Eq)]
pub struct Recover {
    pub header: Header,
    pub dead: u64,
    pub switch_op: u64,
    pub nranks: u32,
    pub report_len: u32,
}
const_assert_eq!(core::mem::size_of::<Recover>(), 32);

impl Lost {
    pub fn new(dead: u64, boundary: u64, report_len: u32) -> Lost {
        Lost { header: Header::new(Kind::Lost), dead, boundary, report_len, _pad: 0 }
    }

    /// Checks the header, the padding, a non-empty dead set and the report's bound.
    pub fn check(&self) -> Result<(), WireError> {
        expect_kind(&self.header, Kind::Lost)?;
        if self._pad != 0 {
            return Err(WireError::BadPadding);
        }
        if self.dead == 0 || self.report_len > MAX_REPORT {
            return Err(WireError::BadField("lost"));
        }
        Ok(())
    }
}

impl Failover {
    pub fn new(dead: u64) -> Failover {
        Failover { header: Header::new(Kind::Failover), dead }
    }

    pub fn check(&self) -> Result<u64, WireError> {
        expect_kind(&self.header, Kind::Failover)?;
        Ok(self.dead)
    }
}

impl Recover {
    pub fn new(dead: u64, switch_op: u64, nranks: u32, report_len: u32) -> Recover {
        Recover { header: Header::new(Kind::Recover), dead, switch_op, nranks, report_len }
    }

    pub fn check(&self) -> Result<(), WireError> {
        expect_kind(&self.header, Kind::Recover)?;
        if self.dead == 0 || self.report_len > MAX_REPORT || self.nranks == 0 || self.nranks > MAX_RANKS {
            return Err(WireError::BadField("recover"));
        }
        Ok(())
    }
}

fn expect_kind(h: &Header, want: Kind) -> Result<(), WireError> {
    let k = h.check()?;
    if k != want {
        return Err(WireError::BadKind(k as u16));
    }
    Ok(())
}

/// A client's request to join a job.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct Hello {
    pub header: Header,
    /// Chosen by the job (all ranks agree, e.g. from rank 0's NCCL handle).
    pub job_id: u64,
    /// Shared secret; compared in constant time.
    pub token: [u8; TOKEN_BYTES],
    pub rank: u32,
    pub nranks: u32,
    /// NCCL data type code.
    pub dtype: u8,
    /// NCCL reduction op code.
    pub op: u8,
    /// [`Hello::REJOIN`]: the rank runs this job already, on other servers,
    /// and takes this (restarted) server back at an operation boundary.
    /// [`Hello::RELAY`]: (two-rank jobs) relay small pieces, see the module doc.
    pub flags: u8,
    pub _pad0: u8,
    /// Elements per shard of a chunk: the size of one server slot piece.
    pub chunk_elems: u32,
    /// Chunks each lcore keeps in flight for this job.
    pub window: u32,
    /// How many of the server's lcores the job uses (0: all).
    pub shards: u32,
    pub name_len: u16,
    pub _pad1: [u8; 6],
    /// The client's fabric endpoint name (first `name_len` bytes).
    pub name: [u8; NAME_BYTES],
}
const_assert_eq!(core::mem::size_of::<Hello>(), 336);

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
}
const_assert_eq!(core::mem::size_of::<Accept>(), 24);

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
const_assert_eq!(core::mem::size_of::<NameRecord>(), 264);

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
const_assert_eq!(core::mem::size_of::<Reject>(), 256);

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

fn copy_truncated(dst: &mut [u8], src: &[u8]) {
    // Keep at least one NUL, and cut on a char boundary so the text stays UTF-8.
    let mut n = src.len().min(dst.len() - 1);
    while n > 0 && core::str::from_utf8(&src[..n]).is_err() {
        n -= 1;
    }
    dst[..n].copy_from_slice(&src[..n]);
}

fn nul_terminated(b: &[u8]) -> &str {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    core::str::from_utf8(&b[..n]).unwrap_or("<not utf-8>")
}

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
}

impl JobSpec {
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
    pub fn new(spec: &JobSpec, rank: u32, token: &[u8; TOKEN_BYTES], name: &[u8]) -> Option<Hello> {
        if name.is_empty() || name.len() > NAME_BYTES {
            return None;
        }
        let mut h = Hello::zeroed();
        h.header = Header::new(Kind::Hello);
        h.job_id = spec.job_id;
        h.token = *token;
        h.rank = rank;
        h.nranks = spec.nranks;
        h.dtype = spec.dtype as u8;
        h.op = spec.op as u8;
        h.chunk_elems = spec.chunk_elems;
        h.window = spec.window;
        h.shards = spec.shards;
        if spec.relay {
            h.flags |= Hello::RELAY;
        }
        if spec.split {
            h.flags |= Hello::SPLIT;
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

    pub fn rejoin(&self) -> bool {
        self.flags & Hello::REJOIN != 0
    }

    pub fn wants_heartbeats(&self) -> bool {
        self.flags & Hello::ALIVE != 0
    }

    /// Validates every field against `limits`; the token is checked by the
    /// server separately (it needs constant-time comparison and logging).
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
        if self.flags & !(Hello::REJOIN | Hello::RELAY | Hello::SPLIT | Hello::ALIVE) != 0 {
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
        if self._pad0 != 0 || self._pad1 != [0; 6] {
            return bad("padding", "reserved bytes must be zero");
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
        })
    }

    pub fn name(&self) -> &[u8] {
        &self.name[..(self.name_len as usize).min(NAME_BYTES)]
    }
}

/// Why bytes could not be read as a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    Short {
        need: usize,
        got: usize,
    },
    BadMagic(u32),
    BadVersion(u16),
    BadKind(u16),
    BadNameLength(u16),
    /// Reserved bytes that must be zero are not.
    BadPadding,
    /// A field of a recovery message is out of range (which message).
    BadField(&'static str),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Short { need, got } => write!(f, "message too short: {got} of {need} bytes"),
            WireError::BadMagic(m) => write!(f, "bad magic {m:#010x} (not a tally peer)"),
            WireError::BadVersion(v) => write!(f, "unsupported protocol version {v} (this build speaks {VERSION})"),
            WireError::BadKind(k) => write!(f, "unknown message kind {k}"),
            WireError::BadNameLength(n) => write!(f, "bad endpoint name length {n}"),
            WireError::BadPadding => write!(f, "reserved bytes are not zero"),
            WireError::BadField(m) => write!(f, "{m} message: a field is out of range"),
        }
    }
}

/// Reads a `T` from the front of `bytes` (any alignment).
pub fn read<T: Pod>(bytes: &[u8]) -> Result<T, WireError> {
    let need = core::mem::size_of::<T>();
    if bytes.len() < need {
        return Err(WireError::Short { need, got: bytes.len() });
    }
    Ok(bytemuck::pod_read_unaligned(&bytes[..need]))
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

/// A dataplane tag: `job (16) | slot (16) | sequence (32)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag(pub u64);

impl Tag {
    /// Tag bits a receive leaves free: the sequence.
    pub const SEQ_BITS: u64 = 0xffff_ffff;

    #[inline(always)]
    pub const fn new(job: u16, slot: u16, seq: u32) -> Tag {
        Tag(((job as u64) << 48) | ((slot as u64) << 32) | seq as u64)
    }
    #[inline(always)]
    pub const fn job(self) -> u16 {
        (self.0 >> 48) as u16
    }
    #[inline(always)]
    pub const fn slot(self) -> u16 {
        (self.0 >> 32) as u16
    }
    #[inline(always)]
    pub const fn seq(self) -> u32 {
        self.0 as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            job_id: 7,
            nranks: 4,
            dtype: DataType::Float32,
            op: ReduceOp::Sum,
            chunk_elems: 1024,
            window: 4,
            shards: 2,
            relay: false,
            split: false,
        }
    }
    const LIMITS: Limits = Limits { max_ranks: 64, max_window: 16, max_chunk_bytes: 1 << 20, lcores: 2 };

    #[test]
    fn hello_round_trips() {
        let h = Hello::new(&spec(), 3, &[9; 32], b"addr").unwrap();
        let back: Hello = read(bytemuck::bytes_of(&h)).unwrap();
        assert_eq!(back.check(&LIMITS).unwrap(), spec());
        assert_eq!(back.name(), b"addr");
        assert_eq!(back.rank, 3);
    }

    #[test]
    fn every_bad_field_is_named() {
        let good = Hello::new(&spec(), 0, &[0; 32], b"x").unwrap();
        // The field a mutation breaks, and the mutation.
        type Case = (&'static str, fn(&mut Hello));
        let cases: &[Case] = &[
            ("magic", |h| h.header.magic = 1),
            ("version", |h| h.header.version = 9),
            ("kind", |h| h.header.kind = 2),
            ("nranks", |h| h.nranks = 0),
            ("nranks", |h| h.nranks = 65),
            ("rank", |h| h.rank = 4),
            ("dtype", |h| h.dtype = 10),
            ("op", |h| h.op = 5),
            ("chunk_elems", |h| h.chunk_elems = 0),
            ("chunk_elems", |h| h.chunk_elems = (1 << 20) / 4 + 1),
            ("window", |h| h.window = 0),
            ("window", |h| h.window = 17),
            ("shards", |h| h.shards = 3),
            ("name_len", |h| h.name_len = 0),
            ("name_len", |h| h.name_len = 257),
            ("padding", |h| h._pad1[3] = 1),
            ("flags", |h| h.flags = 16),
            // Relay with four ranks.
            ("flags", |h| h.flags = Hello::RELAY),
        ];
        for (field, mutate) in cases {
            let mut h = good;
            mutate(&mut h);
            assert_eq!(h.check(&LIMITS).unwrap_err().field, *field);
        }
    }

    /// A Hello of `s` carries exactly `flag` and reads back as `s`.
    fn round_trips_with_flag(s: JobSpec, flag: u8) {
        let h = Hello::new(&s, s.nranks - 1, &[0; 32], b"x").unwrap();
        assert_eq!(h.flags, flag);
        assert_eq!(h.check(&LIMITS).unwrap(), s);
    }

    #[test]
    fn a_two_rank_relay_job_round_trips() {
        let s = JobSpec { nranks: 2, relay: true, ..spec() };
        round_trips_with_flag(s, Hello::RELAY);
        assert!(s.relays(RELAY_MAX) && !s.relays(RELAY_MAX + 1) && !spec().relays(64));
    }

    #[test]
    fn split_rounds_fold_by_group_except_16_bit_floats_and_many_groups() {
        for dtype in DataType::ALL {
            assert!(!split_folds_groups(1, dtype) && !split_folds_groups(SPLIT_MAX_FOLDED_GROUPS + 1, dtype));
            for groups in 2..=SPLIT_MAX_FOLDED_GROUPS {
                assert_eq!(split_folds_groups(groups, dtype), !dtype.is_half(), "{dtype} {groups}");
            }
        }
    }

    #[test]
    fn a_split_job_round_trips_and_groups_ranks_in_blocks() {
        let s = JobSpec { nranks: 5, split: true, ..spec() };
        round_trips_with_flag(s, Hello::SPLIT);
        assert!(s.splits(SPLIT_MAX) && !s.splits(SPLIT_MAX + 1) && !spec().splits(64));
        for nranks in [3, 5, 8] {
            let mut h = Hello::new(&JobSpec { nranks, ..s }, 0, &[0; 32], b"x").unwrap();
            assert_eq!(h.check(&LIMITS).is_ok(), nranks >= SPLIT_MIN_RANKS, "{nranks}");
            h.nranks = 65;
            assert!(h.check(&Limits { max_ranks: 1024, ..LIMITS }).is_err());
        }
        // At least two ranks an lcore, at most the lcores there are.
        assert_eq!((split_lcores(4, 4), split_lcores(5, 4), split_lcores(8, 2), split_lcores(64, 3), split_lcores(4, 1)), (2, 2, 2, 3, 1));
        // Every rank in exactly one group, groups contiguous, and a rank's
        // position names the group that holds it.
        for nranks in SPLIT_MIN_RANKS..=SPLIT_MAX_RANKS {
            for lcores in 2..=8 {
                let g = split_lcores(nranks, lcores);
                let mut next = 0;
                for p in 0..g {
                    let r = split_ranks(p, nranks, g);
                    assert!(r.start == next && r.len() >= 2, "{nranks} ranks, {g} groups: {r:?}");
                    next = r.end;
                    assert!(r.clone().all(|rank| split_position(rank, nranks, g) == p));
                }
                assert_eq!(next, nranks);
            }
        }
    }

    #[test]
    fn zero_shards_means_all_lcores() {
        let mut s = spec();
        s.shards = 0;
        let h = Hello::new(&s, 0, &[0; 32], b"x").unwrap();
        assert_eq!(h.check(&LIMITS).unwrap().shards, 2);
    }

    #[test]
    fn short_and_foreign_bytes_are_errors() {
        assert_eq!(read::<Hello>(&[0; 10]).unwrap_err(), WireError::Short { need: 336, got: 10 });
        let hdr: Header = read(b"GET / HTTP/1.1\r\n").unwrap();
        assert!(matches!(hdr.check(), Err(WireError::BadMagic(_))));
    }

    #[test]
    fn reject_text_is_bounded_and_utf8() {
        let long = "é".repeat(300);
        let r = Reject::new(RejectCode::BadField, "window", &long);
        assert_eq!(r.field(), "window");
        assert!(r.message().len() < 216 && r.message().chars().all(|c| c == 'é'));
        assert_eq!(r.code(), Some(RejectCode::BadField));
    }

    #[test]
    fn tag_fields() {
        let t = Tag::new(0xabcd, 0x1234, 0xdeadbeef);
        assert_eq!((t.job(), t.slot(), t.seq()), (0xabcd, 0x1234, 0xdeadbeef));
        assert_eq!(t.0 & !Tag::SEQ_BITS, Tag::new(0xabcd, 0x1234, 0).0);
    }

    #[test]
    fn drain_messages_round_trip_and_check() {
        let d: Drain = read(bytemuck::bytes_of(&Drain::new(60))).unwrap();
        assert_eq!(d.check(), Ok(60));
        let b: Boundary = read(bytemuck::bytes_of(&Boundary::new(41))).unwrap();
        assert_eq!(b.check(), Ok(41));
        let s: SwitchAt = read(bytemuck::bytes_of(&SwitchAt::new(Boundary::STAY))).unwrap();
        assert_eq!(s.check(), Ok(Boundary::STAY));
        // A message of one kind is not read as another.
        let wrong: SwitchAt = read(bytemuck::bytes_of(&Boundary::new(3))).unwrap();
        assert_eq!(wrong.check(), Err(WireError::BadKind(Kind::Boundary as u16)));
        let mut d = Drain::new(1);
        d._pad = 1;
        assert_eq!(d.check(), Err(WireError::BadPadding));
        assert_eq!(Kind::Drain.server_message_bytes(), Some(16));
        assert_eq!(Kind::Reject.server_message_bytes(), Some(256));
        assert_eq!(Kind::Boundary.server_message_bytes(), None);
        assert_eq!(Kind::Boundary.rank_message_bytes(), Some(16));
        assert_eq!(Kind::Bye.rank_message_bytes(), Some(8));
        assert_eq!(RejectCode::from_u16(12), Some(RejectCode::Draining));
    }

    #[test]
    fn recovery_messages_round_trip_and_check() {
        let l: Lost = read(bytemuck::bytes_of(&Lost::new(0b10, 7, 24))).unwrap();
        assert_eq!(l.check(), Ok(()));
        assert_eq!((l.dead, l.boundary, l.report_len), (0b10, 7, 24));
        assert_eq!(Lost::new(0, 7, 24).check(), Err(WireError::BadField("lost")));
        assert_eq!(Lost::new(1, 7, MAX_REPORT + 1).check(), Err(WireError::BadField("lost")));
        let f: Failover = read(bytemuck::bytes_of(&Failover::new(5))).unwrap();
        assert_eq!(f.check(), Ok(5));
        let r: Recover = read(bytemuck::bytes_of(&Recover::new(1, 9, 4, 16))).unwrap();
        assert_eq!(r.check(), Ok(()));
        assert_eq!(Recover::new(1, 9, MAX_RANKS + 1, 16).check(), Err(WireError::BadField("recover")));
        assert_eq!(Kind::Lost.rank_message_bytes(), Some(32));
        assert_eq!(Kind::Recover.server_message_bytes(), Some(32));
        assert_eq!(Kind::Failover.server_message_bytes(), Some(16));
        assert_eq!(Kind::Lost.server_message_bytes(), None);
    }

    #[test]
    fn token_comparison() {
        let a = [1u8; 32];
        let mut b = a;
        assert!(token_eq(&a, &b));
        b[31] = 0;
        assert!(!token_eq(&a, &b));
    }
}
