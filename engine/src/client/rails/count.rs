//! How many rails a client runs ([`resolve_rails`]: asked, or
//! [`auto_rails`]), whether they run on threads ([`wants_rail_threads`]),
//! and which rails carry a server's streams ([`lanes`]). The module doc of
//! `rails.rs` says why rails exist; this is the arithmetic, decided once
//! at `Client::connect` and at each join.

/// The most rails a client runs.
pub const MAX_RAILS: usize = 8;

/// Rails a client of several servers runs at least, when auto: with fewer,
/// a rail of two servers carries 2 GB/s each way at 32 Gbit/s, one
/// endpoint's ceiling (docs/measurements.md, Rails: 2 + 2 hosts at 32
/// Gbit/s, 0.73-0.87 of the bound on two rails, 0.97-1.01 on four).
pub const AUTO_MIN_RAILS: usize = 4;

/// How many rails a client of `servers` servers over `provider` runs when
/// its configuration says 0 (auto): one per server but at least
/// [`AUTO_MIN_RAILS`] (so one server's lcores spread over lanes), up to
/// [`MAX_RAILS`], over tcp, with two servers or more, on a host with at
/// least 8 cores; else one (no thread: one server's small operations keep
/// the caller's thread, without a hop to a rail).
pub fn auto_rails(provider: &str, servers: usize, cores: usize) -> usize {
    if provider.starts_with("tcp") && servers >= 2 && cores >= 8 {
        servers.clamp(AUTO_MIN_RAILS, MAX_RAILS)
    } else {
        1
    }
}

/// Whether a client of `rails` rails over `provider` drives them from rail
/// threads: always for several; for shm's one only with `TALLY_SHM_RAIL=1`
/// (see the module's doc).
pub fn wants_rail_threads(provider: &str, rails: usize) -> bool {
    rails > 1 || (provider == "shm" && shm_rail())
}

/// Whether `provider`'s calls can spin for ever on a lock another process
/// holds (shm's, in memory shared with its peers): a caller's thread stuck
/// so ends its process (`watchdog::OnStuck::Exit`).
pub fn calls_may_spin_forever(provider: &str) -> bool {
    provider == "shm"
}

/// `TALLY_SHM_RAIL=1`: shm's one endpoint on a rail thread (a stuck call is
/// the error of the all-reduce, not the end of the process; every operation
/// pays the hop to that thread and back).
pub fn shm_rail() -> bool {
    std::env::var("TALLY_SHM_RAIL").is_ok_and(|v| v.trim() == "1")
}

/// The rails a client runs when it asked for `asked` (0: [`auto_rails`],
/// with this thread's cores), at most [`MAX_RAILS`]. More rails than
/// servers spread each server's lcores over several (see the module doc).
pub fn resolve_rails(asked: usize, provider: &str, servers: usize) -> usize {
    match asked {
        0 => auto_rails(provider, servers, std::thread::available_parallelism().map_or(1, |n| n.get())),
        n => n.clamp(1, MAX_RAILS),
    }
}

/// The rails that carry server `si`'s streams, its lanes in order, when
/// `rails` rails serve `servers` servers: rail `si mod rails` alone, or,
/// with more rails than servers, every rail `r` with `r mod servers == si`.
pub fn lanes(rails: usize, servers: usize, si: usize) -> core::iter::StepBy<core::ops::Range<usize>> {
    let (rails, servers) = (rails.max(1), servers.max(1));
    if rails <= servers {
        let r = si % rails;
        (r..r + 1).step_by(1)
    } else {
        (si % servers..rails).step_by(servers)
    }
}

#[cfg(test)]
mod tests {
    use super::lanes;

    fn all(rails: usize, servers: usize) -> Vec<Vec<usize>> {
        (0..servers).map(|si| lanes(rails, servers, si).collect()).collect()
    }

    #[test]
    fn no_more_rails_than_servers_is_a_rail_per_server_shared_round_robin() {
        assert_eq!(all(1, 3), [[0], [0], [0]]);
        assert_eq!(all(2, 3), [[0], [1], [0]]);
        assert_eq!(all(3, 3), [[0], [1], [2]]);
    }

    #[test]
    fn more_rails_than_servers_spread_each_server_over_lanes_that_cover_every_rail_once() {
        assert_eq!(all(8, 2), [vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        assert_eq!(all(5, 3), [vec![0, 3], vec![1, 4], vec![2]]);
        assert_eq!(all(4, 1), [vec![0, 1, 2, 3]]);
        for (r, s) in [(8, 3), (7, 2), (8, 8), (6, 4)] {
            let mut seen: Vec<usize> = all(r, s).concat();
            seen.sort();
            assert_eq!(seen, (0..r).collect::<Vec<_>>(), "{r} rails over {s} servers");
        }
    }
}
