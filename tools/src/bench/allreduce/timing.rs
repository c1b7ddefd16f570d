//! Per-operation times of a back-to-back loop: every rank's completion
//! timestamps on the host's one monotonic clock, and their order statistics.

/// Most completion timestamps (ranks x iterations) gathered to time
/// operations by their last rank: 8 MiB of them.
pub const GATHER_STAMPS: usize = 1 << 20;

/// This host's monotonic clock in nanoseconds: the same clock in every
/// process of the host (Instant's, which cannot be compared across processes).
pub(super) fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Per-operation times (seconds) of a back-to-back loop from every rank's
/// timestamps (`parts[r]`: the loop's start, then each completion, as
/// little-endian u64 nanoseconds): operation k took the last rank's
/// completion of k minus the last rank's of k - 1 (of the start for k = 0).
pub(super) fn last_rank_times(parts: &[Vec<u8>], iters: usize) -> Result<Vec<f64>, String> {
    let mut last = vec![0u64; iters + 1];
    for (r, part) in parts.iter().enumerate() {
        if part.len() != 8 * (iters + 1) {
            return Err(format!("rank {r} sent {} bytes of timestamps, not {}", part.len(), 8 * (iters + 1)));
        }
        for (l, b) in last.iter_mut().zip(part.chunks_exact(8)) {
            *l = (*l).max(u64::from_le_bytes(b.try_into().expect("8 bytes")));
        }
    }
    Ok(last.windows(2).map(|w| w[1].saturating_sub(w[0]) as f64 / 1e9).collect())
}

/// Order statistics of per-operation times (seconds), nearest-rank.
#[derive(Clone, Copy)]
pub(super) struct OpTimes {
    pub(super) p50: f64,
    pub(super) p99: f64,
    pub(super) max: f64,
}

impl OpTimes {
    pub(super) fn of(times: &mut [f64]) -> OpTimes {
        times.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| times[((q * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
        OpTimes { p50: at(0.5), p99: at(0.99), max: times[times.len() - 1] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_ends_with_its_last_rank() {
        let stamps = |v: &[u64]| v.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>();
        // Two ranks taking turns to finish first: each one's own intervals
        // alternate 2 and 8 us, the operations themselves take 5 each.
        let a = stamps(&[0, 2_000, 10_000, 12_000, 20_000]);
        let b = stamps(&[1_000, 5_000, 7_000, 15_000, 17_000]);
        let t = last_rank_times(&[a.clone(), b], 4).unwrap();
        assert_eq!(t, [4e-6, 5e-6, 5e-6, 5e-6]);
        assert!(last_rank_times(&[a, vec![0; 8]], 4).unwrap_err().contains("rank 1"));
    }
}
