//! Why a server did not start: a setting that cannot work, a part that
//! failed to come up (the kernels, the control plane, an lcore, the metrics
//! endpoint), or a socket or thread call. Each keeps the text the server
//! has always logged and `tally server` prints.
use crate::control::error::SetupError;
use crate::dataplane::fabric::FabricError;
use crate::dataplane::lcore::LcoreError;
use crate::dataplane::metrics::http::MetricsError;
use crate::dataplane::slab::{ParsePolicyError, SlabError};
use crate::reduce::IsaError;
use std::fmt;
use std::io;

/// Why [`super::Server::start`] failed.
#[derive(Debug)]
pub enum StartError {
    /// `hugepages` is not a policy.
    Hugepages(ParsePolicyError),
    /// `poll` is not a polling mode.
    Poll,
    /// max_jobs x max_window x max_ranks x 2 operation contexts per lcore,
    /// past the limit.
    TooManyContexts(u64),
    /// No kernels for this CPU, or `TALLY_ISA` names none.
    Kernels(IsaError),
    /// The control port or the token.
    Control(SetupError),
    /// The control plane's epoll loop cannot be made.
    ControlLoop(io::Error),
    /// An lcore did not start.
    Lcores(LcoreError),
    /// The metrics endpoint did not start.
    Metrics(MetricsError),
    /// The listener's address or the control thread.
    Io(io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Hugepages(e) => write!(f, "hugepages: {e}"),
            StartError::Poll => write!(f, "poll: expected busy or adaptive"),
            StartError::TooManyContexts(n) => {
                write!(f, "max_jobs x max_window x max_ranks x 2 = {n} operation contexts per lcore; keep it under {}", 1u64 << 22)
            }
            StartError::Kernels(e) => e.fmt(f),
            StartError::Control(e) => e.fmt(f),
            StartError::ControlLoop(e) => write!(f, "control plane: {e}"),
            StartError::Lcores(e) => e.fmt(f),
            StartError::Metrics(e) => e.fmt(f),
            StartError::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for StartError {}

impl From<SetupError> for StartError {
    fn from(e: SetupError) -> StartError {
        StartError::Control(e)
    }
}

/// Why an lcore's set-up (its endpoint, slab and registration) failed; it
/// becomes [`LcoreError::Setup`]'s reason.
#[derive(Debug)]
pub(super) enum LcoreSetupError {
    /// The endpoint did not open on `provider`.
    Endpoint {
        provider: String,
        source: FabricError,
    },
    Slab(SlabError),
    /// Registering the slab, or reading the endpoint's name.
    Fabric(FabricError),
    /// The lcore's command channel was taken already.
    StartedTwice,
}

impl fmt::Display for LcoreSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LcoreSetupError::Endpoint { provider, source } => write!(f, "{provider}: {source}"),
            LcoreSetupError::Slab(e) => e.fmt(f),
            LcoreSetupError::Fabric(e) => e.fmt(f),
            LcoreSetupError::StartedTwice => write!(f, "lcore started twice"),
        }
    }
}
