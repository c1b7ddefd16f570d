//! Which cores a rank process's threads run on (`bench allreduce --cores`):
//! its own thread, then its rails', then the copier's.
//!
//! The cores listed are shared by every rank, and each rank takes an equal
//! share of consecutive cores (the list's length over the ranks), its
//! threads going round its share: the rank's thread on the share's first
//! core, its rails on the next ones, wrapping onto the first again where
//! it has more threads than cores. Where there are more ranks than cores,
//! each rank takes one core after the other round the list.
//!
//! Why shares and not a block per thread: `bench cluster` gives the
//! workers one list for all of them (`placement::place`: "workers pinned to
//! cores 16-31" for 8 workers, 2 cores each), and a block as wide as the
//! rank's threads put 8 one-thread ranks on cores 16-23 and left 24-31
//! idle, while two-rail ranks (3 threads) wrapped round the list onto each
//! other's cores (nvidia-h200-x2, 8 + 8 hosts at 16 Gbit/s: per-CPU
//! /proc/stat, docs/measurements.md).

/// The cores of rank `rank`'s `threads` threads (its own first), of
/// `ranks` ranks sharing `cores`.
pub fn thread_cores(cores: &[usize], ranks: usize, rank: usize, threads: usize) -> Vec<usize> {
    let (ranks, threads) = (ranks.max(1), threads.max(1));
    if cores.is_empty() {
        return Vec::new();
    }
    let share = cores.len() / ranks;
    if share == 0 {
        return (0..threads).map(|k| cores[(rank * threads + k) % cores.len()]).collect();
    }
    let start = (rank % ranks) * share;
    (0..threads).map(|k| cores[start + k % share]).collect()
}

/// Whether some of a rank's `threads` threads share a core (see
/// [`thread_cores`]): two pollers on one core take turns.
pub fn shares_a_core(cores: usize, ranks: usize, threads: usize) -> bool {
    threads > 1 && cores / ranks.max(1) < threads
}

#[cfg(test)]
mod tests {
    use super::{shares_a_core, thread_cores};

    fn list(a: usize, b: usize) -> Vec<usize> {
        (a..=b).collect()
    }

    #[test]
    fn one_thread_ranks_spread_over_their_shares_of_the_list() {
        let cores = list(16, 31);
        let firsts: Vec<usize> = (0..8).map(|r| thread_cores(&cores, 8, r, 1)[0]).collect();
        assert_eq!(firsts, [16, 18, 20, 22, 24, 26, 28, 30]);
    }

    #[test]
    fn threads_go_round_their_own_share_and_never_into_another_ranks() {
        let cores = list(16, 31);
        // 8 ranks of 3 threads (2 rails) on 16 cores: two cores each.
        for r in 0..8 {
            let t = thread_cores(&cores, 8, r, 3);
            assert_eq!(t, [16 + 2 * r, 17 + 2 * r, 16 + 2 * r], "rank {r}");
        }
        assert!(shares_a_core(16, 8, 3));
        // 4 ranks of 5 threads on 24 cores: each thread its own core.
        let cores = list(8, 31);
        assert_eq!(thread_cores(&cores, 4, 1, 5), [14, 15, 16, 17, 18]);
        assert!(!shares_a_core(24, 4, 5));
        assert!(!shares_a_core(8, 8, 1));
    }

    #[test]
    fn more_ranks_than_cores_take_one_core_after_the_other() {
        let cores = list(0, 3);
        let firsts: Vec<usize> = (0..6).map(|r| thread_cores(&cores, 6, r, 1)[0]).collect();
        assert_eq!(firsts, [0, 1, 2, 3, 0, 1]);
        assert_eq!(thread_cores(&cores, 6, 1, 2), [2, 3]);
        assert!(thread_cores(&[], 2, 0, 1).is_empty());
    }
}
