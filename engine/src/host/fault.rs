//! Fault injection for the tests: a thread that is to block for good, as
//! inside a provider call that never returns, read once at start-up from
//! `VAR=INDEX@SECONDS` (`TALLY_FAULT_STALL` for an lcore,
//! `TALLY_FAULT_RAIL_STALL` for a client's rail). Unset in real use.
use std::time::{Duration, Instant};

/// When thread `index` (an lcore id, a rail number) named by `var` is to
/// stall, counted from now; None unless `var` names this index.
pub fn stall_at(var: &str, index: usize) -> Option<Instant> {
    let v = std::env::var(var).ok()?;
    let (i, secs) = v.split_once('@')?;
    (i.trim().parse::<usize>().ok()? == index).then_some(())?;
    Some(Instant::now() + Duration::from_secs_f64(secs.trim().parse().ok()?))
}
