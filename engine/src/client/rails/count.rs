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

/// Gbit/s each way a rail is given when the link's rate is known
/// (`ClientConfig::rail_gbits`'s default). On nvidia-h200-x2, 4 + 4 emulated
/// hosts, agg held 0.96-0.99 of the bound on two rails at 16 Gbit/s, as on
/// four, at a quarter less CPU per GB (0.93-1.06 s/GB against 1.20-1.33), and
/// fell to 0.69-0.79 on two at 32; at 8 Gbit/s one rail (the caller's thread)
/// held 0.95-0.99 in 14 runs at 0.70-1.06 s/GB, two rails 1.14-1.46
/// adaptive (docs/measurements.md, "Rails that follow the link").
pub const RAIL_GBITS: f64 = 8.0;

/// [`RAIL_GBITS`] for the NCCL plugin's client: its rails carry NCCL's
/// steps, each a burst of pieces over every server. Under `bench cluster
/// --mode agg-plugin` two rails held 8 Gbit/s at 0.99 of the bound (2.8
/// s/GB against four's 3.4-3.7) but 16 only at 0.82-0.98 against four's
/// 0.97-0.99, and so did real NCCL (0.72-0.93 against 0.80-0.97); one rail
/// at 8 Gbit/s gave 0.72-0.99. That was with a thread for every rail; with
/// the caller's rail the plugin counts on [`RAIL_GBITS`] ([`plugin_rail_gbits`]).
pub const NCCL_RAIL_GBITS: f64 = 4.0;

/// What the NCCL plugin's client counts on each rail carrying on a link of
/// `link_gbits`, with the caller's rail (`ClientConfig::caller_rail`, the
/// plugin's default) or without. With it NCCL's proxy thread drives rail 0
/// in the polls it makes anyway, and above 8 Gbit/s half the rails held the
/// link: on nvidia-h200-x2 (4 + 4 emulated hosts, `bench cluster --mode
/// agg-plugin`, alternated) two rails held 16 Gbit/s at 0.99 of the bound for
/// 0.94-1.00 worker CPU s/GB against four's 0.98-0.99 at 1.37-1.57, and real
/// NCCL (CollNet, one rank a GPU) at 0.99-1.00 for 1.37-1.48 rank s/GB
/// against 1.59-1.67; 32 Gbit/s still wants four (two: 0.47-0.53 of the
/// bound, real NCCL 0.85-0.97). At 8 Gbit/s one rail (the proxy's thread
/// alone) held 4 + 4 hosts at 0.99 but 8 + 8 (two cores a worker) at
/// 0.87-0.98 against two rails' 0.97-0.99, so up to 8 the plugin keeps
/// [`NCCL_RAIL_GBITS`].
pub fn plugin_rail_gbits(caller_rail: bool, link_gbits: f64) -> f64 {
    if caller_rail && link_gbits > RAIL_GBITS {
        RAIL_GBITS
    } else {
        NCCL_RAIL_GBITS
    }
}

/// How many rails a client of `servers` servers over `provider` runs when
/// its configuration says 0 (auto), over tcp, with two servers or more, on
/// a host with at least 8 cores (else one: no thread, one server's small
/// operations keep the caller's thread, without a hop to a rail):
/// - the link's rate unknown (`link_gbits` 0): one per server but at least
///   [`AUTO_MIN_RAILS`] (so one server's lcores spread over lanes), up to
///   [`MAX_RAILS`];
/// - known: as many as carry it at `rail_gbits` each (one: the caller's
///   thread drives the endpoint, no thread hop), rounded up to a count that
///   divides the servers or that they divide (every rail then carries as
///   many servers or lanes), and never more than the above. Each rail is a
///   thread that sleeps and wakes for the pieces it carries when adaptive,
///   and spins a core when busy: rails beyond what the link needs cost a
///   rank CPU for the same bytes.
pub fn auto_rails(provider: &str, servers: usize, cores: usize, link_gbits: f64, rail_gbits: f64) -> usize {
    if !(provider.starts_with("tcp") && servers >= 2 && cores >= 8) {
        return 1;
    }
    let most = servers.clamp(AUTO_MIN_RAILS, MAX_RAILS);
    if !(link_gbits.is_finite() && link_gbits > 0.0) {
        return most;
    }
    let need = ((link_gbits / rail_gbits.max(0.1)).ceil() as usize).max(1);
    (need..=most).find(|&r| r.is_multiple_of(servers) || servers.is_multiple_of(r)).unwrap_or(most)
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
/// with this thread's cores, the link's rate, 0 if unknown, and what a
/// rail carries), at most [`MAX_RAILS`]. More rails than servers spread
/// each server's lcores over several (see the module doc).
pub fn resolve_rails(asked: usize, provider: &str, servers: usize, link_gbits: f64, rail_gbits: f64) -> usize {
    match asked {
        0 => auto_rails(provider, servers, std::thread::available_parallelism().map_or(1, |n| n.get()), link_gbits, rail_gbits),
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
    use super::{auto_rails, lanes};

    #[test]
    fn auto_rails_carry_a_known_link_with_as_few_threads_as_divide_the_servers() {
        let t = "tcp;ofi_rxm";
        let lib = super::RAIL_GBITS;
        let nccl = super::NCCL_RAIL_GBITS;
        // Unknown rate: a rail per server, 4 to 8.
        assert_eq!(auto_rails(t, 4, 32, 0.0, lib), 4);
        assert_eq!(auto_rails(t, 2, 32, f64::NAN, lib), 4);
        assert_eq!(auto_rails(t, 12, 32, 0.0, lib), 8);
        // Known: the caller's thread up to 8 Gbit/s, then what the link needs.
        assert_eq!(auto_rails(t, 4, 32, 4.0, lib), 1);
        assert_eq!(auto_rails(t, 4, 32, 8.0, lib), 1);
        assert_eq!(auto_rails(t, 4, 32, 10.0, lib), 2);
        assert_eq!(auto_rails(t, 4, 32, 16.0, lib), 2);
        assert_eq!(auto_rails(t, 4, 32, 25.0, lib), 4);
        assert_eq!(auto_rails(t, 4, 32, 32.0, lib), 4);
        assert_eq!(auto_rails(t, 4, 32, 400.0, lib), 4);
        assert_eq!(auto_rails(t, 8, 32, 32.0, lib), 4);
        assert_eq!(auto_rails(t, 3, 32, 16.0, lib), 3);
        assert_eq!(auto_rails(t, 3, 32, 32.0, lib), 4);
        // The plugin's rails carry less each without the caller's rail,
        // as much as the library's with it.
        let plugin = |caller_rail, link| auto_rails(t, 4, 32, link, super::plugin_rail_gbits(caller_rail, link));
        assert_eq!([4.0, 8.0, 12.5, 16.0, 32.0].map(|g| plugin(true, g)), [1, 2, 2, 2, 4]);
        assert_eq!([4.0, 8.0, 12.5, 16.0, 32.0].map(|g| plugin(false, g)), [1, 2, 4, 4, 4]);
        assert_eq!(auto_rails(t, 4, 32, 4.0, nccl), 1);
        assert_eq!(auto_rails(t, 4, 32, 8.0, nccl), 2);
        assert_eq!(auto_rails(t, 4, 32, 16.0, nccl), 4);
        assert_eq!(auto_rails(t, 8, 32, 16.0, nccl), 4);
        // Never on one server, on shm or on a small host.
        assert_eq!(auto_rails(t, 1, 32, 32.0, lib), 1);
        assert_eq!(auto_rails("shm", 4, 32, 32.0, lib), 1);
        assert_eq!(auto_rails(t, 4, 4, 32.0, lib), 1);
    }

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
