//! How often the control thread looks at this server's own TCP connections
//! for a rejoin (`ControlPlane::backed_off_towards`, `host::tcp_backoff`).
//! A look lists `/proc/self/fd` and asks the kernel about each socket: well
//! under a millisecond here, but it grows with the server's connections, and
//! it runs on the one thread that serves every job's control connections. A
//! flood of REJOIN Hellos, whether a token holder's or a job's own ranks'
//! retries, must not make those looks the control thread's whole work.
//!
//! So a look's verdict for one set of addresses is kept [`REUSE_FOR`]: a
//! Hello for the same addresses within that (the same rank again, or its
//! host's other ranks) gets the same answer without a look; and at most
//! [`LOOKS_PER_SPELL`] looks for different sets run in any such spell:
//! past that, a rejoin is told busy without one, like a rank whose
//! connections are still backed off (it asks again within a second: a
//! rank's watcher retries every 0.5 s). A set is at most the addresses of
//! one rank's endpoint names and of its connection, so the kept verdicts
//! are a few hundred bytes. Why a short cache and a cap rather than one
//! look per rank per spell: a flood names ranks freely, and a bound per
//! rank is no bound on the looks; the addresses looked at are the cost.
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How long a look's verdict stands for its addresses.
pub const REUSE_FOR: Duration = Duration::from_millis(100);

/// Looks for different sets of addresses in any [`REUSE_FOR`].
pub const LOOKS_PER_SPELL: usize = 8;

/// The verdicts of the last spell's looks.
#[derive(Default)]
pub struct BackoffGate {
    recent: Vec<(Vec<IpAddr>, Instant, bool)>,
}

/// What [`BackoffGate::verdict`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A look (`looked`) or a verdict kept from one: backed off or not.
    Seen { backed_off: bool, looked: bool },
    /// Too many looks in this spell: told busy without one.
    Throttled,
}

impl BackoffGate {
    /// Whether a connection to `ips` waits out a backoff, by `look` (called
    /// only when no kept verdict stands for `ips` and the spell has room).
    pub fn verdict(&mut self, ips: &[IpAddr], now: Instant, look: impl FnOnce(&[IpAddr]) -> bool) -> Verdict {
        self.recent.retain(|(_, at, _)| now.saturating_duration_since(*at) < REUSE_FOR);
        if let Some((_, _, b)) = self.recent.iter().find(|(set, _, _)| set == ips) {
            return Verdict::Seen { backed_off: *b, looked: false };
        }
        if self.recent.len() >= LOOKS_PER_SPELL {
            return Verdict::Throttled;
        }
        let backed_off = look(ips);
        self.recent.push((ips.to_vec(), now, backed_off));
        Verdict::Seen { backed_off, looked: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Vec<IpAddr> {
        vec![IpAddr::from([198, 18, 0, last])]
    }

    #[test]
    fn a_verdict_stands_for_its_addresses_for_a_spell_then_is_looked_at_again() {
        let (mut g, t) = (BackoffGate::default(), Instant::now());
        let mut looks = 0;
        let mut look = |b: bool| {
            looks += 1;
            move |_: &[IpAddr]| b
        };
        assert_eq!(g.verdict(&ip(1), t, look(true)), Verdict::Seen { backed_off: true, looked: true });
        let later = t + REUSE_FOR / 2;
        assert_eq!(g.verdict(&ip(1), later, |_| unreachable!()), Verdict::Seen { backed_off: true, looked: false });
        assert_eq!(g.verdict(&ip(1), t + REUSE_FOR, look(false)), Verdict::Seen { backed_off: false, looked: true });
        assert_eq!(looks, 2);
    }

    #[test]
    fn a_flood_of_different_addresses_gets_a_bounded_number_of_looks_per_spell() {
        let (mut g, t) = (BackoffGate::default(), Instant::now());
        let mut looked = 0;
        for i in 0..200u8 {
            match g.verdict(&ip(i), t + Duration::from_micros(i as u64), |_| false) {
                Verdict::Seen { looked: true, .. } => looked += 1,
                Verdict::Seen { looked: false, .. } => panic!("no verdict was kept for {i}"),
                Verdict::Throttled => {}
            }
        }
        assert_eq!(looked, LOOKS_PER_SPELL);
        // The next spell has room again.
        assert!(matches!(g.verdict(&ip(250), t + REUSE_FOR * 2, |_| false), Verdict::Seen { looked: true, .. }));
    }
}
