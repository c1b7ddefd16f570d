//! The wire: control-plane messages and the dataplane tag layout.
//!
//! Control plane (TCP, once per job): the server sends a [`Challenge`], a
//! client answers with one [`Hello`] that proves the token and carries the
//! job's secret sealed (`auth.rs`); the server answers with an [`Accept`]
//! header followed by one [`NameRecord`] per lcore (the fabric address each
//! shard goes to), or with a [`Reject`] naming the field it refused. While the job runs the server may send a
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
//!
//! Files: this one holds the header, [`Kind`], [`WireError`] and reading;
//! `join.rs` the handshake (Hello, Accept, Reject, JobSpec, the token),
//! `auth.rs` its challenge, proof and the job's secret,
//! `drain.rs` and `failover.rs` their messages, `small.rs` the relay and
//! split rules, `tag.rs` the tag. Callers name everything as `wire::X`.
use bytemuck::{Pod, Zeroable};
use core::fmt;
use static_assertions::const_assert_eq;

mod auth;
mod drain;
mod failover;
mod join;
mod small;
mod tag;
pub use auth::*;
pub use drain::*;
pub use failover::*;
pub use join::*;
pub use small::*;
pub use tag::*;

/// "TLLY" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"TLLY");
/// 2: the server speaks first, a [`Challenge`]; the Hello proves the
/// token instead of carrying it, and carries the job's secret (`auth.rs`);
/// the Accept carries the job's sequence key ([`JobTag`]).
pub const VERSION: u16 = 2;
/// Bytes of an endpoint name carried on the wire (shm names are paths; EFA's are 32 bytes).
pub const NAME_BYTES: usize = 256;
pub const TOKEN_BYTES: usize = 32;
/// The largest `nranks` any server will accept, whatever its configuration.
pub const MAX_RANKS: u32 = 1024;
/// The largest window: slots are 16 bits in the tag.
pub const MAX_WINDOW: u32 = 1 << 15;

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
    /// Server to a new connection, before anything else: the nonce its
    /// Hello must answer (see [`Challenge`]).
    Challenge = 13,
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
            13 => Ok(Kind::Challenge),
            k => Err(WireError::BadKind(k)),
        }
    }
}

fn expect_kind(h: &Header, want: Kind) -> Result<(), WireError> {
    let k = h.check()?;
    if k != want {
        return Err(WireError::BadKind(k as u16));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::{DataType, ReduceOp};

    /// A valid spec, for the wire's tests (`auth.rs`'s too).
    pub(in crate::wire) fn spec() -> JobSpec {
        JobSpec::new(7, 4, DataType::Float32, ReduceOp::Sum, 1024, 4, 2)
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
            ("reserve", |h| h.reserve = 8),
            ("seal_shift", |h| h.seal_shift = MAX_SEAL_SHIFT + 1),
            ("min_piece", |h| h.min_piece = MAX_MIN_PIECE + 1),
            ("min_piece", |h| h.min_piece = u32::MAX),
            ("lanes", |h| h.lanes = MAX_LANES as u8),
            ("flags", |h| h.flags = 128),
            // A later job of a communicator reserves nothing.
            ("reserve", |h| {
                h.flags = Hello::SIBLING;
                h.reserve = 1
            }),
            // Relay with four ranks.
            ("flags", |h| h.flags = Hello::RELAY),
        ];
        for (field, mutate) in cases {
            let mut h = good;
            mutate(&mut h);
            assert_eq!(h.check(&LIMITS).unwrap_err().field, *field);
        }
    }

    #[test]
    fn a_hello_with_lanes_carries_their_names_after_it() {
        let names: [&[u8]; 3] = [b"rail0", b"rail2", b"rail4"];
        let m = HelloMessage::new(&spec(), 1, &[0; 32], &names).unwrap();
        let bytes = m.as_bytes();
        assert_eq!(bytes.len(), core::mem::size_of::<Hello>() + 2 * core::mem::size_of::<NameRecord>());
        // The length is known once the Hello is whole, not before.
        assert_eq!(Hello::message_len(&bytes[..100]), core::mem::size_of::<Hello>());
        assert_eq!(Hello::message_len(bytes), bytes.len());
        let h: Hello = read(bytes).unwrap();
        assert_eq!((h.check(&LIMITS).unwrap(), h.lanes, h.name()), (spec(), 2, &b"rail0"[..]));
        for (k, want) in names.iter().enumerate().skip(1) {
            assert_eq!(HelloMessage::lane(bytes, k).unwrap().name().unwrap(), *want);
        }
        // Cut short, the last lane is an error, not a read past the end.
        assert!(HelloMessage::lane(&bytes[..bytes.len() - 1], 2).is_err());
        // One name is a plain Hello, as a server from before lanes reads it.
        let one = HelloMessage::new(&spec(), 1, &[0; 32], &names[..1]).unwrap();
        assert_eq!(one.as_bytes(), bytemuck::bytes_of(&Hello::new(&spec(), 1, &[0; 32], b"rail0").unwrap()));
        // Too many names, or none, is no message.
        assert!(HelloMessage::new(&spec(), 1, &[0; 32], &[&b"x"[..]; MAX_LANES + 1]).is_none());
        assert!(HelloMessage::new(&spec(), 1, &[0; 32], &[]).is_none());
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
        assert_eq!(read::<Hello>(&[0; 10]).unwrap_err(), WireError::Short { need: 368, got: 10 });
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
        let j = JobTag { job: 0xabcd, key: 0x5a5a_1234 };
        let keyed = j.tag(7, 42);
        assert_eq!((keyed.job(), keyed.slot()), (0xabcd, 7), "job and slot in clear: receives match on them");
        assert_ne!(keyed.seq(), 42, "the sequence is not");
        assert_eq!(j.seq_of(keyed), 42);
        assert_ne!(JobTag { key: 1, ..j }.seq_of(keyed), 42, "another key reads another sequence");
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
