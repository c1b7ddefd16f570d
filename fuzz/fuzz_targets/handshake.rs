//! The server's side of the handshake: arbitrary bytes from a TCP peer read
//! as a Hello and checked against limits taken from the input's first bytes.
//! Proves no panic, and that an accepted Hello satisfies every invariant the
//! server relies on (rank < nranks within limits, known type and op, a piece
//! within the chunk limit, window within both limits, 1 <= shards <= lcores,
//! a bounded name, zero padding).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tally_engine::reduce::{DataType, ReduceOp};
use tally_engine::wire::{self, Header, Hello, Kind, Limits, MAX_RANKS, MAX_WINDOW, NAME_BYTES};

fuzz_target!(|data: &[u8]| {
    let (limits, rest) = if data.len() >= 20 {
        let u = |i: usize| u32::from_le_bytes(data[i..i + 4].try_into().unwrap());
        let limits = Limits {
            max_ranks: u(0),
            max_window: u(4),
            max_chunk_bytes: u64::from_le_bytes(data[8..16].try_into().unwrap()),
            lcores: 1 + u(16) % 256,
        };
        (limits, &data[20..])
    } else {
        (
            Limits {
                max_ranks: 64,
                max_window: 16,
                max_chunk_bytes: 1 << 20,
                lcores: 2,
            },
            data,
        )
    };
    if let Ok(h) = wire::read::<Header>(rest) {
        if let Ok(kind) = h.check() {
            assert_eq!(
                (h.magic, h.version, h.kind),
                (wire::MAGIC, wire::VERSION, kind as u16)
            );
        }
    }
    let Ok(h) = wire::read::<Hello>(rest) else {
        return;
    };
    let _ = format!("{h:?}");
    assert!(h.name().len() <= NAME_BYTES);
    let Ok(spec) = h.check(&limits) else { return };
    assert_eq!(h.header.check(), Ok(Kind::Hello));
    assert!(spec.nranks >= 1 && spec.nranks <= limits.max_ranks.min(MAX_RANKS));
    assert!(h.rank < spec.nranks);
    assert_eq!(DataType::from_nccl(h.dtype as i32), Some(spec.dtype));
    assert_eq!(ReduceOp::from_nccl(h.op as i32), Some(spec.op));
    assert!(spec.chunk_elems > 0 && spec.piece_bytes() as u64 <= limits.max_chunk_bytes);
    assert!(spec.window >= 1 && spec.window <= limits.max_window && spec.window <= MAX_WINDOW);
    assert!(spec.shards >= 1 && spec.shards <= limits.lcores);
    assert!(h.name_len >= 1 && h.name().len() == h.name_len as usize);
    assert_eq!(h._pad1, 0);
    assert_eq!(spec.min_piece, h.min_piece);
    assert!(h.seal_shift <= wire::MAX_SEAL_SHIFT && spec.seal_shift == h.seal_shift);
});
