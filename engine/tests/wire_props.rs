//! Property test: everything tally parses from the network or from a
//! configuration file survives arbitrary bytes.
//!
//! A reduction server sits on a network shared by jobs, so the handshake
//! ([`Hello`]), every message [`Header`], a [`Reject`] (read by clients), a
//! [`NameRecord`] (read by clients) and the server's TOML file
//! ([`ServerFile::parse`] then [`ServerFile::resolve`]) are fed many random
//! byte strings and random mutations of valid inputs. What is proven, for
//! every input tried:
//!
//! - nothing panics (no out-of-range slice, overflow, bad UTF-8 assumption);
//! - a Hello that [`Hello::check`] accepts satisfies every invariant the server
//!   relies on afterwards: `rank < nranks <= limits`, a known type and op,
//!   `chunk_elems > 0` with a piece within the chunk limit, a window within
//!   both the server's and the tag's limit, `1 <= shards <= lcores`, a name
//!   length within the record, zero padding, and the typed fields equal the
//!   raw ones;
//! - a Header that checks is exactly magic, version and a known kind;
//! - Reject and NameRecord accessors return bounded, NUL-free text or a typed error;
//! - the drain messages ([`Drain`], [`Boundary`], [`SwitchAt`]) check only
//!   when they are exactly their own kind (with zero padding), and round-trip;
//! - a configuration that resolves satisfies its documented bounds.
//!
//! The generator is a self-contained xorshift64* with a fixed seed (printed,
//! overridable with `TALLY_PROP_SEED`) and fixed iteration counts, so a failure
//! reproduces exactly. Inputs found by the cargo-fuzz targets (`fuzz/`) are
//! kept below as fixed regression cases.
#![cfg(feature = "std")]

use bytemuck::Zeroable;
use tally_engine::host::config::ServerFile;
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::wire::{
    self, Boundary, Drain, Header, Hello, JobSpec, Kind, Limits, NameRecord, Reject, RejectCode, SwitchAt, WireError, MAX_LANES,
    MAX_MIN_PIECE, MAX_RANKS, MAX_RESERVE, MAX_SEAL_SHIFT, MAX_WINDOW, NAME_BYTES,
};

/// xorshift64* (Vigna): small, fast, good enough to drive a fuzzer.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
    /// `min + below(span)` random bytes.
    fn some_bytes(&mut self, min: usize, span: u64) -> Vec<u8> {
        let len = min + self.below(span) as usize;
        self.bytes(len)
    }
    /// A u32 biased towards the values that sit on limits.
    fn edgy_u32(&mut self) -> u32 {
        const EDGES: [u32; 12] = [0, 1, 2, 3, 15, 16, 17, 255, 256, 257, 1 << 15, u32::MAX];
        match self.below(4) {
            0 => EDGES[self.below(EDGES.len() as u64) as usize],
            1 => self.below(2048) as u32,
            2 => (self.next() as u32).wrapping_add(self.below(3) as u32).wrapping_sub(1),
            _ => self.next() as u32,
        }
    }
}

fn seed() -> u64 {
    let s = std::env::var("TALLY_PROP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x7a11_7a11_5eed);
    eprintln!("wire_props seed {s} (set TALLY_PROP_SEED to reproduce another run)");
    s
}

fn random_limits(rng: &mut Rng) -> Limits {
    Limits {
        max_ranks: rng.edgy_u32(),
        max_window: rng.edgy_u32(),
        max_chunk_bytes: match rng.below(3) {
            0 => u64::MAX,
            1 => rng.below(1 << 24),
            _ => rng.next(),
        },
        // A server has at least one lcore.
        lcores: 1 + rng.below(256) as u32,
    }
}

fn valid_hello(rng: &mut Rng) -> (Hello, Limits) {
    let limits = Limits { max_ranks: 64, max_window: 16, max_chunk_bytes: 1 << 20, lcores: 4 };
    let dtype = DataType::ALL[rng.below(DataType::ALL.len() as u64) as usize];
    let op = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg][rng.below(5) as usize];
    let nranks = 1 + rng.below(64) as u32;
    let spec = JobSpec {
        job_id: rng.next(),
        nranks,
        dtype,
        op,
        chunk_elems: 1 + rng.below(((1 << 20) / dtype.size()) as u64) as u32,
        window: 1 + rng.below(16) as u32,
        shards: rng.below(5) as u32,
        relay: nranks == 2 && rng.below(2) == 1,
        split: (4..=64).contains(&nranks) && rng.below(2) == 1,
        seal_shift: if rng.chance(2) { rng.below(41) as u8 } else { 0 },
        interleave: rng.chance(2),
        min_piece: if rng.chance(2) { rng.below(MAX_MIN_PIECE as u64 + 1) as u32 } else { 0 },
        reserve: 0,
        sibling: false,
        failover: rng.chance(2),
    };
    let spec = match rng.below(3) {
        0 => JobSpec { reserve: rng.below(MAX_RESERVE as u64 + 1) as u8, ..spec },
        1 => JobSpec { sibling: true, ..spec },
        _ => spec,
    };
    let name = rng.some_bytes(1, NAME_BYTES as u64);
    let h = Hello::new(&spec, rng.below(nranks as u64) as u32, &[7; 32], &name).expect("a valid hello");
    assert_eq!(h.check(&limits).map(|s| (s.job_id, s.nranks, s.dtype, s.op)), Ok((spec.job_id, nranks, dtype, op)));
    (h, limits)
}

/// Checks `bytes` as a Hello against `limits`; on acceptance, every invariant.
fn check_hello(bytes: &[u8], limits: &Limits) -> bool {
    let h: Hello = match wire::read(bytes) {
        Ok(h) => h,
        Err(e) => {
            assert!(bytes.len() < core::mem::size_of::<Hello>(), "read refused {} bytes: {e}", bytes.len());
            assert_eq!(e, WireError::Short { need: 368, got: bytes.len() });
            let _ = e.to_string();
            return false;
        }
    };
    let _ = format!("{h:?}");
    let name = h.name();
    assert!(name.len() <= NAME_BYTES);
    let spec = match h.check(limits) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.field.is_empty() && !e.reason.is_empty());
            return false;
        }
    };
    let ctx = || format!("accepted {h:?} under {limits:?} as {spec:?}");
    assert_eq!(h.header.check(), Ok(Kind::Hello), "{}", ctx());
    assert!(spec.nranks >= 1 && spec.nranks <= limits.max_ranks.min(MAX_RANKS), "{}", ctx());
    assert!(h.rank < spec.nranks, "{}", ctx());
    assert_eq!(DataType::from_nccl(h.dtype as i32), Some(spec.dtype), "{}", ctx());
    assert_eq!(ReduceOp::from_nccl(h.op as i32), Some(spec.op), "{}", ctx());
    assert!(spec.chunk_elems > 0, "{}", ctx());
    assert!(spec.piece_bytes() as u64 <= limits.max_chunk_bytes, "{}", ctx());
    assert!(spec.window >= 1 && spec.window <= limits.max_window && spec.window <= MAX_WINDOW, "{}", ctx());
    assert!(spec.shards >= 1 && spec.shards <= limits.lcores, "{}", ctx());
    assert!(h.shards == spec.shards || (h.shards == 0 && spec.shards == limits.lcores), "{}", ctx());
    assert!(h.name_len >= 1 && h.name_len as usize <= NAME_BYTES, "{}", ctx());
    assert_eq!(name.len(), h.name_len as usize, "{}", ctx());
    assert!((h.lanes as usize) < MAX_LANES, "{}", ctx());
    assert_eq!(
        h.flags & !(Hello::REJOIN | Hello::RELAY | Hello::SPLIT | Hello::ALIVE | Hello::INTERLEAVE | Hello::SIBLING | Hello::FAILOVER),
        0,
        "{}",
        ctx()
    );
    assert!(h.reserve <= MAX_RESERVE && spec.reserve == h.reserve, "{}", ctx());
    assert_eq!(spec.sibling, h.flags & Hello::SIBLING != 0, "{}", ctx());
    assert!(!spec.sibling || spec.reserve == 0, "{}", ctx());
    assert!(spec.min_piece == h.min_piece && spec.min_piece <= MAX_MIN_PIECE, "{}", ctx());
    assert!(h.seal_shift <= MAX_SEAL_SHIFT && spec.seal_shift == h.seal_shift, "{}", ctx());
    assert_eq!(spec.relay, h.flags & Hello::RELAY != 0, "{}", ctx());
    assert!(!spec.relay || spec.nranks == 2, "{}", ctx());
    assert_eq!(spec.split, h.flags & Hello::SPLIT != 0, "{}", ctx());
    assert_eq!(spec.interleave, h.flags & Hello::INTERLEAVE != 0, "{}", ctx());
    assert_eq!(spec.failover, h.flags & Hello::FAILOVER != 0, "{}", ctx());
    assert!(!spec.split || (4..=64).contains(&spec.nranks), "{}", ctx());
    assert_eq!((spec.job_id, spec.nranks, spec.chunk_elems, spec.window), (h.job_id, h.nranks, h.chunk_elems, h.window));
    true
}

fn check_header(bytes: &[u8]) {
    match wire::read::<Header>(bytes) {
        Ok(h) => match h.check() {
            Ok(kind) => {
                assert_eq!((h.magic, h.version, h.kind), (wire::MAGIC, wire::VERSION, kind as u16));
            }
            Err(e) => {
                let _ = e.to_string();
                match e {
                    WireError::BadMagic(m) => assert_ne!(m, wire::MAGIC),
                    WireError::BadVersion(v) => {
                        assert!(h.magic == wire::MAGIC && v != wire::VERSION)
                    }
                    WireError::BadKind(k) => assert!(!(1..=7).contains(&k)),
                    other => panic!("header check gave {other:?}"),
                }
            }
        },
        Err(e) => assert!(bytes.len() < 8, "{e}"),
    }
}

fn check_reject(bytes: &[u8]) {
    let Ok(r) = wire::read::<Reject>(bytes) else {
        assert!(bytes.len() < 256);
        return;
    };
    let (field, message) = (r.field(), r.message());
    assert!(field.len() <= 24 && !field.contains('\0'), "{field:?}");
    assert!(message.len() <= 216 && !message.contains('\0'), "{message:?}");
    let shown = r.to_string();
    assert!(shown.contains(message) && shown.contains(field), "{shown:?}");
    let _ = format!("{r:?}");
    match r.code() {
        Some(c) => assert_eq!(c as u16, r.code),
        None => assert!(RejectCode::from_u16(r.code).is_none() && shown.starts_with("unknown")),
    }
}

/// A drain message checks only if its header is exactly its own kind; what
/// it carries then comes back unchanged.
fn check_drain_messages(bytes: &[u8]) {
    if let Ok(d) = wire::read::<Drain>(bytes) {
        match d.check() {
            Ok(t) => assert_eq!((d.header.check(), t, d._pad), (Ok(Kind::Drain), d.timeout_s, 0)),
            Err(e) => assert!(d.header.check() != Ok(Kind::Drain) || d._pad != 0, "{e}"),
        }
    } else {
        assert!(bytes.len() < 16);
    }
    if let Ok(b) = wire::read::<Boundary>(bytes) {
        match b.check() {
            Ok(op) => assert_eq!((b.header.check(), op), (Ok(Kind::Boundary), b.next_op)),
            Err(_) => assert_ne!(b.header.check(), Ok(Kind::Boundary)),
        }
    }
    if let Ok(s) = wire::read::<SwitchAt>(bytes) {
        match s.check() {
            Ok(op) => assert_eq!((s.header.check(), op), (Ok(Kind::SwitchAt), s.op)),
            Err(_) => assert_ne!(s.header.check(), Ok(Kind::SwitchAt)),
        }
    }
}

fn check_name_record(bytes: &[u8]) {
    let Ok(n) = wire::read::<NameRecord>(bytes) else {
        assert!(bytes.len() < 264);
        return;
    };
    match n.name() {
        Ok(name) => {
            assert!(!name.is_empty() && name.len() <= NAME_BYTES && name.len() == n.len as usize);
            assert_eq!(name, &n.bytes[..name.len()]);
            let again = NameRecord::new(name).expect("a name read back is a valid name");
            assert_eq!(again.name().unwrap(), name);
        }
        Err(e) => assert_eq!(e, WireError::BadNameLength(n.len)),
    }
}

/// Parses `text` and, if it parses, resolves it; checks what resolves.
fn check_config(text: &str) {
    let Ok(file) = ServerFile::parse(text) else {
        return;
    };
    let Ok(cfg) = file.clone().resolve() else {
        return;
    };
    let ctx = || format!("{text:?} resolved to {cfg:?}");
    assert!(!cfg.lcores.as_slice().is_empty(), "{}", ctx());
    assert!(matches!(cfg.poll.as_str(), "busy" | "adaptive"), "{}", ctx());
    assert!(matches!(cfg.hugepages.as_str(), "require" | "prefer" | "off"), "{}", ctx());
    assert!(cfg.max_chunk >= 1 && cfg.max_chunk <= cfg.slab_size, "{}", ctx());
    assert!((1..=1024).contains(&cfg.max_window), "{}", ctx());
    assert!((1..=4096).contains(&cfg.max_jobs), "{}", ctx());
    assert!((1..=1024).contains(&cfg.max_ranks), "{}", ctx());
    assert!(cfg.listen.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_some(), "{}", ctx());
    assert!(cfg.nics.is_empty() || cfg.nics.len() == cfg.lcores.len(), "{}", ctx());
    // Overlaying a file on itself changes nothing.
    assert_eq!(file.clone().overlay(file).resolve().unwrap(), cfg);
}

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        if bytes.is_empty() {
            bytes.push(rng.next() as u8);
            continue;
        }
        let i = rng.below(bytes.len() as u64) as usize;
        match rng.below(6) {
            0 => bytes[i] ^= 1 << rng.below(8),
            1 => bytes[i] = rng.next() as u8,
            2 => bytes[i] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5) as usize],
            3 => bytes.truncate(i),
            4 => bytes.insert(i, rng.next() as u8),
            _ => {
                bytes.remove(i);
            }
        }
    }
}

/// Sets one Hello field to an edge value (the structured mutation).
fn mutate_field(rng: &mut Rng, h: &mut Hello) {
    let v = rng.edgy_u32();
    match rng.below(12) {
        0 => h.rank = v,
        1 => h.nranks = v,
        2 => h.dtype = v as u8,
        3 => h.op = v as u8,
        4 => h.chunk_elems = v,
        5 => h.window = v,
        6 => h.shards = v,
        7 => h.name_len = v as u16,
        8 if rng.below(2) == 0 => h.lanes = v as u8,
        8 => h.flags = v as u8,
        9 if rng.below(2) == 0 => h.seal_shift = v as u8,
        9 if rng.below(2) == 0 => h.reserve = v as u8,
        9 => h.min_piece = v,
        10 => h.header.kind = v as u16,
        _ => h.header.version = v as u16,
    }
}

const ITERS: usize = 200_000;

#[test]
fn random_bytes_never_panic_and_accepted_hellos_hold_every_invariant() {
    let mut rng = Rng::new(seed());
    let mut accepted = 0;
    for i in 0..ITERS {
        let len = match rng.below(4) {
            0 => rng.below(16) as usize,
            1 => 368,
            _ => rng.below(400) as usize,
        };
        let mut bytes = rng.bytes(len);
        // Random bytes almost never carry the magic; give some of them a valid header.
        if i % 2 == 0 && bytes.len() >= 8 {
            bytes[..8].copy_from_slice(bytemuck::bytes_of(&Header::new(Kind::Hello)));
        }
        let limits = random_limits(&mut rng);
        accepted += check_hello(&bytes, &limits) as usize;
        check_header(&bytes);
        check_reject(&bytes);
        check_name_record(&bytes);
        check_drain_messages(&bytes);
    }
    eprintln!("{ITERS} random byte strings, {accepted} accepted as hellos");
}

#[test]
fn mutated_valid_hellos_are_refused_by_name_or_hold_every_invariant() {
    let mut rng = Rng::new(seed() ^ 1);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..ITERS {
        let (mut h, limits) = valid_hello(&mut rng);
        let limits = if rng.chance(4) { random_limits(&mut rng) } else { limits };
        for _ in 0..1 + rng.below(3) {
            mutate_field(&mut rng, &mut h);
        }
        let mut bytes = bytemuck::bytes_of(&h).to_vec();
        if rng.chance(2) {
            mutate(&mut rng, &mut bytes);
        }
        if check_hello(&bytes, &limits) {
            accepted += 1;
        } else {
            refused += 1;
        }
        check_header(&bytes);
    }
    eprintln!("{ITERS} mutated hellos: {accepted} accepted, {refused} refused");
    assert!(accepted > 0 && refused > 0, "the mutations explore both sides");
}

#[test]
fn rejects_and_name_records_from_valid_ones() {
    let mut rng = Rng::new(seed() ^ 2);
    for _ in 0..ITERS / 4 {
        let code = RejectCode::from_u16(1 + rng.below(12) as u16).unwrap();
        let text = String::from_utf8_lossy(&rng.some_bytes(0, 300)).into_owned();
        let field: String = text.chars().take(rng.below(40) as usize).collect();
        let r = Reject::new(code, &field, &text);
        // What the sender wrote comes back, cut at a character boundary.
        assert!(field.starts_with(r.field()) && text.starts_with(r.message()));
        let mut bytes = bytemuck::bytes_of(&r).to_vec();
        check_reject(&bytes);
        mutate(&mut rng, &mut bytes);
        check_reject(&bytes);
        let n = NameRecord::new(&rng.some_bytes(1, 256)).unwrap();
        let mut bytes = bytemuck::bytes_of(&n).to_vec();
        check_name_record(&bytes);
        mutate(&mut rng, &mut bytes);
        check_name_record(&bytes);
        let v = rng.next();
        for msg in [
            bytemuck::bytes_of(&Drain::new(v as u32)).to_vec(),
            bytemuck::bytes_of(&Boundary::new(v)).to_vec(),
            bytemuck::bytes_of(&SwitchAt::new(v)).to_vec(),
        ] {
            let mut bytes = msg.clone();
            check_drain_messages(&bytes);
            mutate(&mut rng, &mut bytes);
            check_drain_messages(&bytes);
        }
    }
}

const VALID_CONFIG: &str = r#"
listen = "0.0.0.0:7400"
lcores = "2-5"
provider = "efa"
fabric_addr = "10.0.0.1"
poll = "busy"
hugepages = "require"
slab_size = "1G"
max_chunk = "4M"
max_window = 16
max_jobs = 32
max_ranks = 256
token_file = "/etc/tally/token"
handshake_timeout_s = 10
op_timeout_s = 30
idle_timeout_s = 3600
metrics = "0.0.0.0:9400"
nics = ["rdmap0s1", "rdmap0s2", "rdmap0s3", "rdmap0s4"]
"#;

/// Pieces a TOML-ish generator strings together.
const TOKENS: &[&str] = &[
    "listen",
    "lcores",
    "provider",
    "poll",
    "hugepages",
    "slab_size",
    "max_chunk",
    "max_window",
    "max_jobs",
    "max_ranks",
    "nics",
    "metrics",
    "op_timeout_s",
    "idle_timeout_s",
    "handshake_timeout_s",
    "token_file",
    "fabric_addr",
    "=",
    " ",
    "\n",
    "\"",
    "'",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    "-",
    ":",
    "#",
    "0",
    "1",
    "7",
    "-1",
    "4096",
    "18446744073709551615",
    "99999999999999999999999",
    "1e400",
    "nan",
    "inf",
    "true",
    "0-1",
    "3-1",
    "0-8191",
    "0-4294967295",
    "1G",
    "4M",
    "0.5K",
    "1.5.5G",
    "16E",
    "17E",
    "\"\"",
    "\"busy\"",
    "\"adaptive\"",
    "\"require\"",
    "\"127.0.0.1:0\"",
    "\"[::1]:70000\"",
    "\\u0000",
    "é",
    "\u{feff}",
    "[[x]]",
    "[table]",
    "\"\"\"",
    "'''",
];

#[test]
fn config_text_never_panics_and_what_resolves_is_in_bounds() {
    let mut rng = Rng::new(seed() ^ 3);
    check_config(VALID_CONFIG);
    assert!(ServerFile::parse(VALID_CONFIG).unwrap().resolve().is_ok());
    let lines: Vec<&str> = VALID_CONFIG.lines().collect();
    for _ in 0..ITERS / 10 {
        let text = match rng.below(4) {
            // Random bytes, lossily made UTF-8 (the file is read as UTF-8 text).
            0 => String::from_utf8_lossy(&rng.some_bytes(0, 200)).into_owned(),
            // Token soup.
            1 => (0..rng.below(40)).map(|_| TOKENS[rng.below(TOKENS.len() as u64) as usize]).collect(),
            // A valid file with lines replaced by `key = token-soup`.
            2 => lines
                .iter()
                .map(|l| {
                    if rng.chance(3) {
                        let key = l.split('=').next().unwrap_or("");
                        let v: String = (0..1 + rng.below(3)).map(|_| TOKENS[rng.below(TOKENS.len() as u64) as usize]).collect();
                        format!("{key}= {v}\n")
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect(),
            // A valid file with byte mutations.
            _ => {
                let mut b = VALID_CONFIG.as_bytes().to_vec();
                mutate(&mut rng, &mut b);
                String::from_utf8_lossy(&b).into_owned()
            }
        };
        check_config(&text);
    }
}

/// Fixed inputs: edge cases worth keeping, and whatever the fuzz targets found.
#[test]
fn regression_inputs() {
    let limits = Limits { max_ranks: u32::MAX, max_window: u32::MAX, max_chunk_bytes: u64::MAX, lcores: 1 };
    // Every field at its largest: the largest ranks and window are capped by the wire limits.
    let mut h = Hello::zeroed();
    h.header = Header::new(Kind::Hello);
    h.nranks = u32::MAX;
    h.rank = u32::MAX - 1;
    h.dtype = DataType::Float64 as u8;
    h.chunk_elems = u32::MAX;
    h.window = u32::MAX;
    h.name_len = u16::MAX;
    assert_eq!(h.check(&limits).unwrap_err().field, "nranks");
    h.nranks = MAX_RANKS;
    h.rank = MAX_RANKS - 1;
    assert_eq!(h.check(&limits).unwrap_err().field, "window");
    h.window = MAX_WINDOW;
    assert_eq!(h.check(&limits).unwrap_err().field, "name_len");
    h.name_len = NAME_BYTES as u16;
    assert!(check_hello(bytemuck::bytes_of(&h), &limits), "a piece of 2^32 x 8 bytes does not overflow the check");
    // Too-short and empty inputs.
    for len in [0, 1, 7, 8, 255, 263, 335] {
        let b = vec![0xffu8; len];
        check_hello(&b, &limits);
        check_header(&b);
        check_reject(&b);
        check_name_record(&b);
    }
    // A reject whose text is cut mid-character, or not UTF-8 at all.
    let mut r = Reject::new(RejectCode::JobFailed, "f", "x");
    r.message = [0xc3; 216];
    r.field = [b'a'; 24];
    check_reject(bytemuck::bytes_of(&r));
    assert_eq!(r.message(), "<not utf-8>");
    r.code = 0xffff;
    assert!(r.to_string().starts_with("unknown"));
    for text in [
        "lcores = \"0-4294967295\"",
        "lcores = \"0-18446744073709551616\"",
        "slab_size = \"16E\"",
        "slab_size = \"99999999999999999999999G\"",
        "max_chunk = \"0.0000001K\"",
        "max_window = -1",
        "nics = []",
        "listen = \":\"",
        "listen = \"x:\"",
        "metrics = \"[::1]:65536\"",
    ] {
        check_config(text);
    }
}
