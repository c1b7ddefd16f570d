//! Wall-clock times in log lines: when something happened, as UTC time of
//! day to the millisecond, so that the lines of several processes (ranks
//! and servers, each with its own monotonic clock) can be matched.
use core::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, now (0 if the clock reads before it).
/// A vDSO read of CLOCK_REALTIME: no system call.
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Shows a time from [`now_us`] as `HH:MM:SS.mmm UTC`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeOfDay(pub u64);

impl fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0 / 1000;
        let s = ms / 1000 % 86_400;
        write!(f, "{:02}:{:02}:{:02}.{:03} UTC", s / 3600, s / 60 % 60, s % 60, ms % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_of_day_is_utc_to_the_millisecond() {
        // 2026-11-28T06:12:03.123456Z
        assert_eq!(TimeOfDay(1_795_846_323_123_456).to_string(), "06:12:03.123 UTC");
        assert_eq!(TimeOfDay(0).to_string(), "00:00:00.000 UTC");
        assert!(now_us() > 1_700_000_000_000_000);
    }
}
