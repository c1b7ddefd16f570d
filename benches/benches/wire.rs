//! The wire path of `engine/src/wire.rs`: a client encoding its handshake
//! (`Hello`, answered to the server's challenge: its HMAC proof of the
//! token), the server validating one the way its control plane does
//! (header, every field, the proof), the same for malformed handshakes (the
//! error path, up to the `Reject` the server would send), and packing and
//! unpacking dataplane tags (`job | slot | seq`).
//!
//! Unit: time per message (ns); `tag_pack_unpack` counts tags (time and
//! rate per tag, 1024 tags per iteration).
// A refusal is the 256-byte `Reject` the server sends, returned by value as
// the server builds it: boxing it would time an allocation the server avoids.
#![allow(clippy::result_large_err)]
use bytemuck::bytes_of;
use divan::counter::ItemsCount;
use divan::{black_box, Bencher};
use std::fmt;
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::wire::{
    read, Challenge, Header, Hello, HelloMessage, JobSecret, JobSpec, Kind, Limits, Reject, RejectCode, Tag, WireError, NONCE_BYTES,
    TOKEN_BYTES,
};

fn main() {
    divan::main();
}

const HELLO_BYTES: usize = size_of::<Hello>();

/// A typical job: 8 ranks of bf16, 512 KiB pieces, window 4, on 2 of the server's lcores.
const SPEC: JobSpec = JobSpec::new(0x7a11_0000_0042, 8, DataType::Bfloat16, ReduceOp::Sum, 256 << 10, 4, 2);
/// What the server accepts (its defaults' order of magnitude).
const LIMITS: Limits = Limits { max_ranks: 1024, max_window: 64, max_chunk_bytes: 4 << 20, lcores: 4 };
const TOKEN: [u8; TOKEN_BYTES] = *b"0123456789abcdef0123456789abcdef";
/// The server's challenge on the connection, and the job's secret.
const NONCE: [u8; NONCE_BYTES] = [0x5c; NONCE_BYTES];
const SECRET: JobSecret = [0xa7; 32];
/// An endpoint name of the length shm's are.
const NAME: &[u8] = b"fi_shm://4242:1000:7:0";

fn encoded(hello: &Hello) -> [u8; HELLO_BYTES] {
    let mut out = [0u8; HELLO_BYTES];
    out.copy_from_slice(bytes_of(hello));
    out
}

/// A Hello answered to the challenge with `token`.
fn answered(spec: &JobSpec, rank: u32, token: &[u8; TOKEN_BYTES]) -> Hello {
    let mut m = HelloMessage::new(spec, rank, &SECRET, &[NAME]).expect("the name fits");
    m.answer(&Challenge::new(NONCE, true), token);
    m.hello
}

fn good_hello() -> Hello {
    answered(&SPEC, 3, &TOKEN)
}

/// What the server's control plane does with the bytes of a handshake
/// (`control/conn/read.rs`): header first (magic, version, kind), then the
/// whole Hello's fields, then its proof of the token for the challenge. A refusal is the
/// `Reject` it would send (here with fixed texts: the server formats the
/// wire error's text, an allocation this measures without).
fn validate(bytes: &[u8], token: &[u8; TOKEN_BYTES]) -> Result<JobSpec, Reject> {
    let refuse = |field: &str, reason: &str| Reject::new(RejectCode::BadField, field, reason);
    let header: Header = read(bytes).map_err(|_| refuse("", "message too short"))?;
    match header.check() {
        Ok(Kind::Hello) => {}
        Ok(_) => return Err(refuse("kind", "expected a hello")),
        Err(WireError::BadMagic(_)) => return Err(refuse("magic", "not a tally handshake")),
        Err(WireError::BadVersion(_)) => return Err(refuse("version", "unsupported protocol version")),
        Err(_) => return Err(refuse("kind", "unknown message kind")),
    }
    let hello: Hello = read(bytes).map_err(|_| refuse("", "message too short"))?;
    let spec = hello.check(&LIMITS).map_err(|e| refuse(e.field, e.reason))?;
    if !Hello::proves(bytes, token, &NONCE) {
        return Err(Reject::new(RejectCode::Unauthorized, "token", "wrong or missing token"));
    }
    Ok(spec)
}

/// Encodes a Hello into its 368 wire bytes.
#[divan::bench]
fn hello_encode() -> [u8; HELLO_BYTES] {
    encoded(&answered(black_box(&SPEC), black_box(3), black_box(&TOKEN)))
}

/// Validates a good Hello's bytes into its `JobSpec`.
#[divan::bench]
fn hello_validate(bencher: Bencher) {
    let bytes = encoded(&good_hello());
    assert_eq!(validate(&bytes, &TOKEN).map_err(|r| r.to_string()), Ok(SPEC));
    bencher.bench_local(|| validate(black_box(&bytes), black_box(&TOKEN)));
}

/// Both: encode, then validate what was encoded.
#[divan::bench]
fn hello_round_trip() -> Result<JobSpec, Reject> {
    let hello = answered(black_box(&SPEC), black_box(3), black_box(&TOKEN));
    validate(&encoded(&hello), black_box(&TOKEN))
}

/// Malformed handshakes, from the one refused soonest to the one refused last.
#[derive(Clone, Copy, Debug)]
enum Malformed {
    /// 100 bytes: too short for a Hello.
    Short,
    /// Not a tally peer at all (an HTTP request): refused at the header.
    Foreign,
    /// A good Hello proving another token: refused last, at the proof.
    WrongToken,
    /// `window` = 0: refused in the middle of the field checks.
    BadWindow,
    /// Non-zero reserved bytes: the last field check.
    BadReserve,
}

impl Malformed {
    const ALL: [Malformed; 5] = [Malformed::Short, Malformed::Foreign, Malformed::WrongToken, Malformed::BadWindow, Malformed::BadReserve];

    /// The bytes, and the field the refusal must name.
    fn bytes(self) -> (Vec<u8>, &'static str) {
        let mut hello = good_hello();
        match self {
            Malformed::Short => return (encoded(&hello)[..100].to_vec(), ""),
            Malformed::Foreign => {
                let mut b = vec![0u8; HELLO_BYTES];
                let request = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
                b[..request.len()].copy_from_slice(request);
                return (b, "magic");
            }
            Malformed::WrongToken => hello = answered(&SPEC, 3, &[0x42; TOKEN_BYTES]),
            Malformed::BadWindow => hello.window = 0,
            Malformed::BadReserve => hello.reserve = 8,
        }
        let field = match self {
            Malformed::WrongToken => "token",
            Malformed::BadWindow => "window",
            _ => "padding",
        };
        (encoded(&hello).to_vec(), field)
    }
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Malformed::Short => "1_short",
            Malformed::Foreign => "2_foreign",
            Malformed::WrongToken => "3_wrong_token",
            Malformed::BadWindow => "4_bad_window",
            Malformed::BadReserve => "5_bad_reserve",
        })
    }
}

/// Validates a malformed handshake: the refusal, `Reject` built.
#[divan::bench(args = Malformed::ALL)]
fn hello_malformed(bencher: Bencher, case: Malformed) {
    let (bytes, field) = case.bytes();
    match validate(&bytes, &TOKEN) {
        Ok(spec) => panic!("{case}: accepted {spec:?}"),
        Err(reject) => assert_eq!(reject.field(), field, "{case}: {reject}"),
    }
    bencher.bench_local(|| validate(black_box(&bytes), black_box(&TOKEN)));
}

/// Packs 1024 tags (`Tag::new`) and unpacks each (`job`, `slot`, `seq`).
#[divan::bench]
fn tag_pack_unpack(bencher: Bencher) {
    const TAGS: u32 = 1024;
    let (job, seq0) = (0x0a5u16, 0xffff_fe00u32);
    bencher.counter(ItemsCount::new(TAGS)).bench_local(|| {
        let (job, seq0) = (black_box(job), black_box(seq0));
        let mut acc = 0u64;
        for i in 0..TAGS {
            let tag = Tag::new(job, (i % 16) as u16, seq0.wrapping_add(i));
            let tag = black_box(tag);
            acc = acc.wrapping_add(u64::from(tag.job()) ^ u64::from(tag.slot()) ^ u64::from(tag.seq()));
        }
        acc
    });
}
