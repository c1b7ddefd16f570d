//! Pieces' round trips, sampled: a development setting
//! (`TALLY_PIECE_TIMES=1`, [`ClientConfig::piece_times`]; off by default)
//! that says where a rank's time goes between it and its servers.
//!
//! One piece in [`SAMPLE_EVERY`] (by its stream's sequence number) is timed
//! from the post of its send to the moment this rank's caller thread sees
//! its result: the servers' side, the links and every hop through this
//! rank's rail threads. The pieces of a sub-job's first all-reduce are not
//! (the provider makes its connections then), so the slowest round trip by
//! server says where a stall of the steady state was. Where the rails copy
//! staged results out (failover, `Cmd::RecvCopy`), each rail (or the copier
//! that copies for them) also times its copies, and where the caller's
//! thread copies (one endpoint), it does. Comparing the two with and
//! without a setting (failover, say) tells a piece that got slower from
//! pieces that were sent later. The client logs the figures when it closes
//! ([`PieceReport`]); tests and tools read them with
//! `Client::piece_times`.
//!
//! Operations are timed too, past each sub-job's first: the longest gaps
//! between two operations' starts (the caller's pace: NCCL's, under the
//! plugin) and the slowest operations from their start to their last piece
//! done (a few, that do not overlap in time, `Spells`), each with its index
//! and the wall-clock time it ended, to match with the servers' job-end
//! lines (which name the rank a round waited for, and when). A rank whose own operations were quick but whose caller started
//! one late was late before tally; one whose operation was slow waited on
//! its pieces.
//!
//! Rail threads (`rails`) also time their turns, and the report says what
//! share of their turns' time (spinning included, sleeping not) went to
//! turns that moved something: a rail with no spare turn puts whatever it
//! does per piece (failover's copy, say) on every piece's path.
//!
//! Off, the per-piece path pays one untaken branch. On, a sampled piece
//! costs two reads of the monotonic clock (the vDSO: no system call) and a
//! histogram slot, each
//! operation two (its start and its end; the wall clock once more where it
//! is kept as a spell), and each rail turn two; nothing allocates.
use crate::host::wall_clock::{self, TimeOfDay};
use std::fmt;
use std::time::{Duration, Instant};

/// One piece in this many is timed.
pub const SAMPLE_EVERY: u32 = 16;

/// Buckets: 1 µs wide below 16 µs, then 8 per power of two (12.5% wide)
/// up to 2^24 µs (16.8 s); slower pieces land in the last.
const LINEAR: usize = 16;
const PER_OCTAVE: usize = 8;
const OCTAVES: usize = 20;
const BUCKETS: usize = LINEAR + OCTAVES * PER_OCTAVE;

/// The sampled round trips of one client.
#[derive(Clone)]
pub struct PieceTimes {
    epoch: Instant,
    hist: [u64; BUCKETS],
    count: u64,
    total_ns: u64,
    /// Staged results the caller's thread copied out (no rails), and the
    /// ns those copies took; the rails count their own (`Rails::copy_times`).
    caller_copies: u64,
    caller_copy_ns: u64,
    /// The slowest sampled round trip (ns) by the server the piece went to
    /// (servers from `BY_SERVER - 1` up share the last entry): a stall of
    /// one connection shows at one server, a rank's own at all of them.
    slowest_by_server: [u64; BY_SERVER],
    /// The last operation's start (None before the first).
    last_start: Option<Instant>,
    /// The longest gaps between two starts, and the slowest operations.
    longest_gaps: Spells,
    slowest_ops: Spells,
}

/// How long something timed took, which operation it was and when it
/// ended (Unix µs, `wall_clock::now_us`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spell {
    pub ns: u64,
    pub index: u64,
    pub ended_us: u64,
}

impl Spell {
    fn overlaps(&self, o: &Spell) -> bool {
        let (a, b) = (self.ended_us.saturating_sub(self.ns / 1000), self.ended_us);
        let (c, d) = (o.ended_us.saturating_sub(o.ns / 1000), o.ended_us);
        a <= d && c <= b
    }
}

/// Spells a [`Spells`] keeps.
pub const SPELLS: usize = 4;

/// The [`SPELLS`] longest spells that do not overlap in time, longest
/// first: the operations in flight through one stall overlap, and count
/// once, so the start of a job (connections made on first use) takes one
/// entry and a stall of the steady state another.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spells(pub [Spell; SPELLS]);

impl Spells {
    /// Something of `ns`, of operation `index`, ended now.
    fn keep(&mut self, ns: u64, index: u64) {
        // The clock is read only for a spell long enough to be kept.
        if ns > self.0[SPELLS - 1].ns {
            self.keep_spell(Spell { ns, index, ended_us: wall_clock::now_us() });
        }
    }

    fn keep_spell(&mut self, new: Spell) {
        if new.ns <= self.0[SPELLS - 1].ns {
            return;
        }
        let ns = new.ns;
        match self.0.iter().position(|s| s.ns > 0 && s.overlaps(&new)) {
            // The same stall: the longer stands for it.
            Some(i) if self.0[i].ns >= ns => return,
            Some(i) => self.0[i] = new,
            None => self.0[SPELLS - 1] = new,
        }
        self.0.sort_by_key(|s| core::cmp::Reverse(s.ns));
    }

    /// The spells kept, longest first.
    pub fn kept(&self) -> impl Iterator<Item = &Spell> {
        self.0.iter().filter(|s| s.ns > 0)
    }
}

/// Servers that [`PieceReport::slowest_by_server`] tells apart.
pub const BY_SERVER: usize = 8;

impl Default for PieceTimes {
    fn default() -> Self {
        PieceTimes {
            epoch: Instant::now(),
            hist: [0; BUCKETS],
            count: 0,
            total_ns: 0,
            caller_copies: 0,
            caller_copy_ns: 0,
            slowest_by_server: [0; BY_SERVER],
            last_start: None,
            longest_gaps: Spells::default(),
            slowest_ops: Spells::default(),
        }
    }
}

impl PieceTimes {
    /// Whether the piece of stream sequence `seq` is one of the sampled.
    #[inline(always)]
    pub fn sampled(seq: u32) -> bool {
        seq.is_multiple_of(SAMPLE_EVERY)
    }

    /// Now, in ns since this client began (never 0: 0 means "not timed").
    #[inline]
    pub fn now_ns(&self) -> u64 {
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// A sampled piece whose send to server `server` (the job's index) was
    /// posted at `sent_ns` has its result now.
    #[inline]
    pub fn record(&mut self, sent_ns: u64, server: usize) {
        self.record_round_trip(self.now_ns().saturating_sub(sent_ns), server);
    }

    /// A sampled piece's round trip of `ns` ([`PieceTimes::record`] with the
    /// clock read: the tests give it figures of their own, which a busy
    /// machine's scheduling cannot stretch).
    #[inline]
    fn record_round_trip(&mut self, ns: u64, server: usize) {
        self.hist[bucket(ns / 1000)] += 1;
        self.count += 1;
        self.total_ns += ns;
        let slowest = &mut self.slowest_by_server[server.min(BY_SERVER - 1)];
        *slowest = (*slowest).max(ns);
    }

    /// Operation `index` of its sub-job starts now (the first of each
    /// sub-job only marks the time: it waits for the ranks to join).
    #[inline]
    pub fn record_start(&mut self, index: u64) {
        let now = Instant::now();
        if let (true, Some(last)) = (index > 0, self.last_start) {
            self.longest_gaps.keep(now.duration_since(last).as_nanos() as u64, index);
        }
        self.last_start = Some(now);
    }

    /// Operation `index` completed (its last piece done), `took` after its start.
    #[inline]
    pub fn record_op(&mut self, index: u64, took: Duration) {
        if index > 0 {
            self.slowest_ops.keep(took.as_nanos() as u64, index);
        }
    }

    /// The caller's thread copied a staged result out, from `began` to now.
    #[inline]
    pub fn record_copy(&mut self, began: Instant) {
        self.caller_copies += 1;
        self.caller_copy_ns += began.elapsed().as_nanos() as u64;
    }

    /// The round trip below which a share `q` of the samples fell (the
    /// lower edge of its bucket: within 12.5% above 16 µs).
    pub fn quantile(&self, q: f64) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, n) in self.hist.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Duration::from_micros(lower_edge(i));
            }
        }
        Duration::from_micros(lower_edge(BUCKETS - 1))
    }

    /// The figures, with the rails' and the copier's copies of staged
    /// results (`count`, total ns) added to the caller's, how many of them
    /// the copier made (None: no copier), and the rails' busy shares
    /// (`Rails::busy_shares`).
    pub fn report(&self, rail_copies: (u64, u64), by_copier: Option<u64>, rail_busy: Option<(f64, f64)>) -> PieceReport {
        let mean = |n: u64, ns: u64| Duration::from_nanos(ns.checked_div(n).unwrap_or(0));
        let copies = (rail_copies.0 + self.caller_copies, rail_copies.1 + self.caller_copy_ns);
        PieceReport {
            sampled: self.count,
            mean: mean(self.count, self.total_ns),
            p50: self.quantile(0.5),
            p90: self.quantile(0.9),
            p99: self.quantile(0.99),
            copies: copies.0,
            copy_mean: mean(copies.0, copies.1),
            by_caller: self.caller_copies,
            by_copier,
            rail_busy,
            slowest_by_server: self.slowest_by_server.map(Duration::from_nanos),
            longest_gaps: self.longest_gaps,
            slowest_ops: self.slowest_ops,
        }
    }
}

/// The bucket of a round trip of `us` microseconds.
#[inline(always)]
fn bucket(us: u64) -> usize {
    if us < LINEAR as u64 {
        return us as usize;
    }
    let octave = us.ilog2() as usize; // >= 4
    let sub = ((us >> (octave - 3)) & (PER_OCTAVE as u64 - 1)) as usize;
    (LINEAR + (octave - 4) * PER_OCTAVE + sub).min(BUCKETS - 1)
}

/// The smallest round trip (µs) of bucket `i`.
fn lower_edge(i: usize) -> u64 {
    if i < LINEAR {
        return i as u64;
    }
    let (octave, sub) = ((i - LINEAR) / PER_OCTAVE + 4, (i - LINEAR) % PER_OCTAVE);
    (1u64 << octave) + ((sub as u64) << (octave - 3))
}

/// What [`PieceTimes`] saw, for a log line or a test.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PieceReport {
    /// Pieces timed (one in [`SAMPLE_EVERY`]).
    pub sampled: u64,
    /// From the post of a piece's send to its result seen by the caller.
    pub mean: Duration,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    /// Staged results copied into the caller's buffer, and their mean copy.
    pub copies: u64,
    pub copy_mean: Duration,
    /// Of those, the caller's thread's (one endpoint, or the caller's rail).
    pub by_caller: u64,
    /// Of those, the copier's (None: the client runs no copier).
    pub by_copier: Option<u64>,
    /// Rail threads: the mean and the busiest rail's share of their turns'
    /// time spent in turns that moved something (None without rail threads).
    pub rail_busy: Option<(f64, f64)>,
    /// The slowest round trip by server (as `PieceTimes` keeps it; zero
    /// where none was timed).
    pub slowest_by_server: [Duration; BY_SERVER],
    /// The longest gaps between two operations' starts (each before
    /// operation `index`), and the slowest operations, as [`Spells`] keeps them.
    pub longest_gaps: Spells,
    pub slowest_ops: Spells,
}

impl fmt::Display for PieceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        write!(
            f,
            "piece round trips (1 in {SAMPLE_EVERY} timed, {} pieces): mean {:.0} us, p50 {:.0} us, p90 {:.0} us, p99 {:.0} us; \
             {} staged results copied out",
            self.sampled,
            us(self.mean),
            us(self.p50),
            us(self.p90),
            us(self.p99),
            self.copies,
        )?;
        if let Some(n) = self.by_copier {
            write!(f, " ({n} by the copier)")?;
        }
        if self.by_caller > 0 && self.by_caller < self.copies {
            write!(f, " ({} by the caller's thread)", self.by_caller)?;
        }
        write!(f, ", {:.2} us each", us(self.copy_mean))?;
        for (what, spells) in
            [("longest gaps between two all-reduces' starts", &self.longest_gaps), ("slowest all-reduces", &self.slowest_ops)]
        {
            for (k, sp) in spells.kept().enumerate() {
                let lead = if k == 0 { format!("; {what} ") } else { ", ".to_string() };
                write!(f, "{lead}{:.2} ms (all-reduce {}, ended {})", sp.ns as f64 / 1e6, sp.index, TimeOfDay(sp.ended_us))?;
            }
        }
        if let Some(last) = self.slowest_by_server.iter().rposition(|d| !d.is_zero()) {
            write!(f, "; slowest by server:")?;
            for (i, d) in self.slowest_by_server.iter().enumerate().take(last + 1) {
                let more = if i == BY_SERVER - 1 { "+" } else { "" };
                write!(f, "{} {i}{more}: {:.0} us", if i == 0 { "" } else { "," }, us(*d))?;
            }
        }
        if let Some((mean, max)) = self.rail_busy {
            write!(f, "; rails busy in {:.0}% of their turns' time (busiest {:.0}%)", mean * 100.0, max * 100.0)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_each_holds_its_lower_edge() {
        let mut last = 0;
        for i in 0..BUCKETS {
            let edge = lower_edge(i);
            assert!(i == 0 || edge > last, "bucket {i}: {edge} after {last}");
            assert_eq!(bucket(edge), i, "the lower edge of bucket {i} ({edge} us)");
            if i + 1 < BUCKETS {
                assert_eq!(bucket(lower_edge(i + 1) - 1), i, "the top of bucket {i}");
            }
            last = edge;
        }
        assert_eq!(bucket(u64::MAX / 1000), BUCKETS - 1, "the slowest land in the last");
    }

    #[test]
    fn quantiles_find_the_bucket_of_the_share() {
        let mut t = PieceTimes::default();
        // 90 pieces of 100 us and 10 of 5 ms (round trips given, not timed:
        // on a busy 2-core machine a preempted test stretched "100 us").
        for k in 0..100u64 {
            t.record_round_trip(if k < 90 { 100_000 } else { 5_000_000 }, (k % 2) as usize);
        }
        let r = t.report((4, 8_000), None, None);
        assert_eq!(r.sampled, 100);
        assert!((96..=120).contains(&(r.p50.as_micros() as u64)), "p50 {:?}", r.p50);
        assert!((96..=120).contains(&(r.p90.as_micros() as u64)), "p90 {:?}", r.p90);
        assert!((4608..=5200).contains(&(r.p99.as_micros() as u64)), "p99 {:?}", r.p99);
        assert!(r.mean >= Duration::from_micros(590) && r.mean < Duration::from_micros(700), "mean {:?}", r.mean);
        assert_eq!((r.copies, r.copy_mean), (4, Duration::from_nanos(2_000)));
        assert!(r.to_string().starts_with("piece round trips (1 in 16 timed, 100 pieces): mean "), "{r}");
        assert!(PieceTimes::sampled(0) && PieceTimes::sampled(32) && !PieceTimes::sampled(1));
        assert!(!r.to_string().contains("rails"), "no rail threads, no word of rails: {r}");
        let r = t.report((4, 8_000), Some(3), Some((0.625, 0.9)));
        assert!(r.to_string().ends_with("; rails busy in 62% of their turns' time (busiest 90%)"), "{r}");
        assert!(
            r.to_string()
                .contains("; 4 staged results copied out (3 by the copier), 2.00 us each; slowest by server: 0: 5000 us, 1: 5000 us;"),
            "{r}"
        );
        // One connection's stall shows at its server alone; servers past the
        // last told apart share its entry.
        t.record_round_trip(140_000_000, 9);
        let r = t.report((0, 0), None, None);
        assert_eq!(r.slowest_by_server[BY_SERVER - 1], Duration::from_millis(140));
        assert!(
            r.to_string()
                .ends_with("slowest by server: 0: 5000 us, 1: 5000 us, 2: 0 us, 3: 0 us, 4: 0 us, 5: 0 us, 6: 0 us, 7+: 140000 us"),
            "{r}"
        );
    }

    #[test]
    fn the_longest_gaps_between_starts_and_the_slowest_operations_are_named() {
        let mut t = PieceTimes::default();
        assert!(!t.report((0, 0), None, None).to_string().contains("all-reduces' starts"), "nothing timed, nothing said");
        // The first operation only marks the time; its own slowness is the join's.
        t.record_start(0);
        t.record_op(0, Duration::from_secs(3));
        std::thread::sleep(Duration::from_millis(30));
        t.record_start(1);
        t.record_op(1, Duration::from_millis(5));
        t.record_start(2);
        t.record_op(2, Duration::from_millis(9));
        let r = t.report((0, 0), None, None);
        let gaps: Vec<_> = r.longest_gaps.kept().collect();
        let ops: Vec<_> = r.slowest_ops.kept().collect();
        assert_eq!(gaps[0].index, 1);
        assert!(gaps[0].ns >= 30_000_000, "{r:?}");
        // Operations 1 and 2 ended microseconds apart, 5 and 9 ms long: one stall.
        assert_eq!(ops.len(), 1, "{r:?}");
        assert_eq!((ops[0].index, ops[0].ns), (2, 9_000_000));
        assert!(ops[0].ended_us > 1_700_000_000_000_000, "{r:?}");
        let line = r.to_string();
        assert!(
            line.contains("; slowest all-reduces 9.00 ms (all-reduce 2, ended ")
                && line.contains("; longest gaps between two all-reduces' starts "),
            "{line}"
        );
    }

    #[test]
    fn spells_keep_the_longest_that_do_not_overlap() {
        let at = |ns: u64, index: u64, ended_us: u64| Spell { ns, index, ended_us };
        let mut s = Spells::default();
        // Spells with end times of their own (not the clock's).
        let mut put = |sp: Spell| s.keep_spell(sp);
        put(at(100_000_000, 6, 1_000_000)); // the start: 100 ms ending at 1 s
        put(at(90_000_000, 7, 1_001_000)); // the same stall
        put(at(40_000_000, 900, 9_000_000)); // a stall at 9 s
        put(at(41_000_000, 901, 9_000_500)); // the same one, longer
        put(at(5_000_000, 1000, 10_000_000));
        put(at(6_000_000, 1100, 11_000_000));
        put(at(7_000_000, 1200, 12_000_000)); // pushes out the 5 ms one
        let kept: Vec<_> = s.kept().map(|k| k.index).collect();
        assert_eq!(kept, [6, 901, 1200, 1100]);
    }
}
