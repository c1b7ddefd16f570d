//! The metrics port's connection table: who holds a place, until when, and
//! whom a newcomer displaces. Pure bookkeeping (no sockets, the clock is
//! passed in), so the rules below are unit-tested without a network.
//!
//! Anyone who reaches the port can open connections and send nothing, or a
//! byte now and then; the port answers a liveness probe, so such a client
//! must not be able to keep the probe out. Each connection therefore has a
//! **deadline per request**, not per read: its whole request within
//! `request_time` of its accept, its whole answer written within
//! `answer_time` of its request's end. And the table is bounded twice:
//!
//! - **per source address** (`max_per_source`): when a source holds its
//!   share, its own oldest connection still waiting for a request makes
//!   room for the newcomer; only if all of its connections are being
//!   answered (which ends within `answer_time`) is the newcomer closed.
//!   A source that fills its share with idle connections thus displaces
//!   itself, and a prober behind the same address (a node's kubelet and a
//!   noisy pod behind one NAT) still gets in;
//! - **in total** (`max_total`): when the table is full, the oldest
//!   connection still waiting for its request, whatever its source, is
//!   evicted rather than the newcomer refused. A real client sends its
//!   request within a round trip of its accept, so under a flood the oldest
//!   waiting ones are, almost always, the idle ones, and the newest (the
//!   probe) gets its chance.
//!
//! Connections being answered are never evicted: their request is in, and
//! their deadline is near. Every operation scans the table (a few hundred
//! places at most), which keeps it a `Vec` without side indexes to keep in
//! step.
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// A place in the table (its index; also the connection's poll token).
pub type Key = usize;

/// The table's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_total: usize,
    pub max_per_source: u32,
    /// From the accept to the request's last byte.
    pub request_time: Duration,
    /// From the request's last byte to the answer's.
    pub answer_time: Duration,
}

/// What to do with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Take it.
    Admit,
    /// Take it, after closing this one (the oldest waiting for its request,
    /// of the newcomer's source if that source is at its cap).
    Evict(Key),
    /// Close it: every place it could take is being answered.
    Refuse,
}

struct Entry<C> {
    source: IpAddr,
    accepted: Instant,
    /// Until the request is in: `accepted + request_time`; then the answer's.
    deadline: Instant,
    answering: bool,
    conn: C,
}

/// Connections `C` in their places, with their sources and deadlines.
pub struct Conns<C> {
    slots: Vec<Option<Entry<C>>>,
    free: Vec<Key>,
    per_source: HashMap<IpAddr, u32>,
    len: usize,
    limits: Limits,
}

impl<C> Conns<C> {
    pub fn new(limits: Limits) -> Conns<C> {
        let limits = Limits { max_total: limits.max_total.max(1), max_per_source: limits.max_per_source.max(1), ..limits };
        Conns { slots: Vec::new(), free: Vec::new(), per_source: HashMap::new(), len: 0, limits }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Connections from `source` in the table.
    pub fn from_source(&self, source: IpAddr) -> u32 {
        self.per_source.get(&source).copied().unwrap_or(0)
    }

    /// Decides for a new connection from `source`; changes nothing (the
    /// caller removes an evicted one, then [`Conns::insert`]s).
    pub fn verdict(&self, source: IpAddr) -> Verdict {
        let over = if self.from_source(source) >= self.limits.max_per_source {
            Some(source)
        } else if self.len >= self.limits.max_total {
            None
        } else {
            return Verdict::Admit;
        };
        match self.oldest_waiting(over) {
            Some(k) => Verdict::Evict(k),
            None => Verdict::Refuse,
        }
    }

    /// The connection waiting for its request the longest (of `source` alone, if given).
    fn oldest_waiting(&self, source: Option<IpAddr>) -> Option<Key> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(k, e)| e.as_ref().map(|e| (k, e)))
            .filter(|(_, e)| !e.answering && source.is_none_or(|s| e.source == s))
            .min_by_key(|(_, e)| e.accepted)
            .map(|(k, _)| k)
    }

    /// Takes a connection accepted at `now`, waiting for its request.
    /// Enforcing the caps is [`Conns::verdict`]'s: this only counts.
    pub fn insert(&mut self, source: IpAddr, now: Instant, conn: C) -> Key {
        let e = Entry { source, accepted: now, deadline: now + self.limits.request_time, answering: false, conn };
        let key = match self.free.pop() {
            Some(k) => {
                self.slots[k] = Some(e);
                k
            }
            None => {
                self.slots.push(Some(e));
                self.slots.len() - 1
            }
        };
        *self.per_source.entry(source).or_insert(0) += 1;
        self.len += 1;
        key
    }

    pub fn get_mut(&mut self, key: Key) -> Option<&mut C> {
        self.slots.get_mut(key).and_then(Option::as_mut).map(|e| &mut e.conn)
    }

    /// Whether `key`'s request is in (it is being answered).
    pub fn is_answering(&self, key: Key) -> bool {
        self.slots.get(key).and_then(Option::as_ref).is_some_and(|e| e.answering)
    }

    /// `key`'s request is complete at `now`: it may no longer be evicted,
    /// and its answer must be out within `answer_time`.
    pub fn answering(&mut self, key: Key, now: Instant) {
        let t = self.limits.answer_time;
        if let Some(e) = self.slots.get_mut(key).and_then(Option::as_mut) {
            e.answering = true;
            e.deadline = now + t;
        }
    }

    pub fn remove(&mut self, key: Key) -> Option<C> {
        let e = self.slots.get_mut(key)?.take()?;
        self.free.push(key);
        self.len -= 1;
        if let Some(n) = self.per_source.get_mut(&e.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&e.source);
            }
        }
        Some(e.conn)
    }

    /// Connections past their deadline at `now`, into `out` (to remove).
    pub fn expired(&self, now: Instant, out: &mut Vec<Key>) {
        out.extend(self.slots.iter().enumerate().filter(|(_, e)| e.as_ref().is_some_and(|e| e.deadline <= now)).map(|(k, _)| k));
    }

    /// The earliest deadline, if any connection is held.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.slots.iter().flatten().map(|e| e.deadline).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits =
        Limits { max_total: 4, max_per_source: 2, request_time: Duration::from_secs(2), answer_time: Duration::from_secs(2) };

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_source_at_its_cap_displaces_its_own_oldest_waiting_connection() {
        let t0 = Instant::now();
        let mut c = Conns::new(LIMITS);
        let a1 = c.insert(ip(1), t0, "a1");
        let a2 = c.insert(ip(1), t0 + Duration::from_millis(1), "a2");
        assert_eq!(c.verdict(ip(2)), Verdict::Admit, "another source is not held back");
        assert_eq!(c.verdict(ip(1)), Verdict::Evict(a1), "the oldest of its own, not a refusal");
        // Being answered, a1 is kept; a2 goes instead.
        c.answering(a1, t0 + Duration::from_millis(2));
        assert_eq!(c.verdict(ip(1)), Verdict::Evict(a2));
        c.answering(a2, t0 + Duration::from_millis(2));
        assert_eq!(c.verdict(ip(1)), Verdict::Refuse, "all of its share is being answered");
        assert_eq!(c.remove(a1), Some("a1"));
        assert_eq!(c.verdict(ip(1)), Verdict::Admit);
        assert_eq!((c.len(), c.from_source(ip(1))), (1, 1));
    }

    #[test]
    fn a_full_table_evicts_the_oldest_waiting_connection_of_any_source() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Conns::new(LIMITS);
        let first = c.insert(ip(1), t0, ());
        let second = c.insert(ip(2), t0 + ms(1), ());
        c.insert(ip(3), t0 + ms(2), ());
        c.insert(ip(1), t0 + ms(3), ());
        assert_eq!(c.len(), 4);
        assert_eq!(c.verdict(ip(9)), Verdict::Evict(first), "the oldest idle one pays, not the newcomer");
        c.answering(first, t0 + ms(4));
        assert_eq!(c.verdict(ip(9)), Verdict::Evict(second));
        // Evict, then take the newcomer into the freed place.
        c.remove(second);
        let new = c.insert(ip(9), t0 + ms(5), ());
        assert_eq!(new, second, "places are reused");
        assert_eq!((c.len(), c.from_source(ip(2)), c.from_source(ip(9))), (4, 0, 1));
        // Everyone being answered: the newcomer is refused.
        for k in 0..4 {
            c.answering(k, t0 + ms(6));
        }
        assert_eq!(c.verdict(ip(9)), Verdict::Refuse);
        assert_eq!(c.verdict(ip(10)), Verdict::Refuse);
    }

    #[test]
    fn deadlines_run_per_request_from_accept_then_per_answer_from_the_request() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut c = Conns::new(LIMITS);
        let idle = c.insert(ip(1), t0, ());
        let served = c.insert(ip(2), t0, ());
        assert_eq!(c.next_deadline(), Some(t0 + s(2)));
        c.answering(served, t0 + s(1));
        let mut out = Vec::new();
        c.expired(t0 + s(2) - Duration::from_millis(1), &mut out);
        assert!(out.is_empty());
        // Whatever it sent meanwhile, the idle one is due at accept + 2 s.
        c.expired(t0 + s(2), &mut out);
        assert_eq!(out, [idle]);
        c.remove(idle);
        assert_eq!(c.next_deadline(), Some(t0 + s(3)), "the answer's deadline runs from the request");
        out.clear();
        c.expired(t0 + s(3), &mut out);
        assert_eq!(out, [served]);
        c.remove(served);
        assert!(c.is_empty() && c.next_deadline().is_none());
        assert_eq!(c.remove(served), None, "removing twice is harmless");
    }
}
