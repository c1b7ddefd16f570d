//! Why a step of a slot's round failed its job. A small enum rather than a
//! `String`: it is built on the per-chunk path, where nothing allocates; the
//! text (kept as it was, for the logs and the tests that read it) is made
//! only when the job fails.
use crate::dataplane::fabric::PostError;
use crate::reduce::ReduceError;
use core::fmt;

/// Why a fold, a combine or a post inside one failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RoundError {
    /// A kernel refused the reduce or fold.
    Reduce(ReduceError),
    /// Staged: a folded rank's buffer could not take the receive of the
    /// rank `stage` further on.
    Refill(PostError),
    /// Split: the combining lcore found a split lcore of the job without
    /// a published area.
    NoSplitArea(u32),
}

impl fmt::Display for RoundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoundError::Reduce(e) => write!(f, "reduce failed: {e}"),
            RoundError::Refill(e) => write!(f, "posting receives: {e}"),
            RoundError::NoSplitArea(p) => write!(f, "split lcore {p} of the job has no area"),
        }
    }
}

impl From<ReduceError> for RoundError {
    fn from(e: ReduceError) -> RoundError {
        RoundError::Reduce(e)
    }
}
