//! Admission of unauthenticated connections: who may hold a place in the
//! handshake table.
//!
//! A connection is unauthenticated from its accept until its Hello has been
//! read and checked (token included). Until then it costs the server a file
//! descriptor, a Hello-sized buffer and a slot here, and it has proven
//! nothing, so the table is bounded twice:
//!
//! - **per source address** (`max_handshakes_per_source`): one host cannot
//!   hold more than this many at once; a connection past it is told `busy`
//!   at once (a real rank then retries with backoff);
//! - **in total** (`max_handshakes`): when the table is full, a new
//!   connection is still taken, and the oldest handshake of the source that
//!   holds the most is evicted (told `busy`) to make room.
//!
//! The second rule is what keeps a storm from starving real joins: a rank
//! that presents a valid Hello finishes its handshake within a round trip
//! of its accept, while a silent connection waits for its deadline; so
//! under pressure the ones evicted are, almost always, the silent ones of
//! the noisiest source, and a new connection always gets its chance to
//! present a token. Nothing here reads the clock or allocates per
//! connection beyond the per-source count.
use std::collections::HashMap;
use std::net::IpAddr;

/// What to do with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Take it into the handshake table.
    Admit,
    /// Take it, after evicting the oldest handshake from this source.
    AdmitEvicting(IpAddr),
    /// Refuse it as `busy`: its source holds its share already.
    SourceFull,
}

/// Counts of connections in their handshake, per source and in total.
#[derive(Debug)]
pub struct Admission {
    per_source: HashMap<IpAddr, u32>,
    total: usize,
    max_total: usize,
    max_per_source: u32,
}

impl Admission {
    pub fn new(max_total: usize, max_per_source: u32) -> Admission {
        Admission { per_source: HashMap::new(), total: 0, max_total: max_total.max(1), max_per_source: max_per_source.max(1) }
    }

    /// Decides for a connection from `source`; does not count it (see [`Admission::enter`]).
    pub fn verdict(&self, source: IpAddr) -> Verdict {
        let mine = self.per_source.get(&source).copied().unwrap_or(0);
        if mine >= self.max_per_source {
            return Verdict::SourceFull;
        }
        if self.total < self.max_total {
            return Verdict::Admit;
        }
        // Full: the source holding the most pays. Ties go to any of them.
        let (&victim, _) = self.per_source.iter().max_by_key(|(_, &n)| n).expect("a full table has sources");
        Verdict::AdmitEvicting(victim)
    }

    /// A connection from `source` entered the handshake table.
    pub fn enter(&mut self, source: IpAddr) {
        *self.per_source.entry(source).or_insert(0) += 1;
        self.total += 1;
    }

    /// A connection from `source` left the handshake table (joined, refused,
    /// timed out, evicted or closed).
    pub fn leave(&mut self, source: IpAddr) {
        if let Some(n) = self.per_source.get_mut(&source) {
            *n -= 1;
            self.total -= 1;
            if *n == 0 {
                self.per_source.remove(&source);
            }
        }
    }

    /// Connections in their handshake now.
    pub fn total(&self) -> usize {
        self.total
    }

    pub fn from_source(&self, source: IpAddr) -> u32 {
        self.per_source.get(&source).copied().unwrap_or(0)
    }

    pub fn max_total(&self) -> usize {
        self.max_total
    }

    pub fn max_per_source(&self) -> u32 {
        self.max_per_source
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_source_past_its_share_is_refused_others_are_not() {
        let mut a = Admission::new(100, 3);
        for _ in 0..3 {
            assert_eq!(a.verdict(ip(1)), Verdict::Admit);
            a.enter(ip(1));
        }
        assert_eq!(a.verdict(ip(1)), Verdict::SourceFull);
        assert_eq!(a.verdict(ip(2)), Verdict::Admit);
        a.leave(ip(1));
        assert_eq!(a.verdict(ip(1)), Verdict::Admit);
        assert_eq!((a.total(), a.from_source(ip(1))), (2, 2));
    }

    #[test]
    fn a_full_table_evicts_from_the_source_holding_the_most() {
        let mut a = Admission::new(5, 10);
        for _ in 0..4 {
            a.enter(ip(1));
        }
        a.enter(ip(2));
        // A newcomer, from a new source or from the small one, evicts the big one's.
        assert_eq!(a.verdict(ip(3)), Verdict::AdmitEvicting(ip(1)));
        assert_eq!(a.verdict(ip(2)), Verdict::AdmitEvicting(ip(1)));
        a.leave(ip(1));
        a.enter(ip(3));
        assert_eq!(a.total(), 5);
        // Leaving an unknown source changes nothing.
        a.leave(ip(9));
        assert_eq!(a.total(), 5);
        for _ in 0..3 {
            a.leave(ip(1));
        }
        a.leave(ip(2));
        a.leave(ip(3));
        assert_eq!((a.total(), a.per_source.len()), (0, 0));
    }
}
