//! Errors, and the one place they become `ncclResult_t` codes.
//!
//! The safe core returns [`Error`] values; the C entry points in
//! [`crate::ffi`] turn them into codes through [`Error::code`] (and a panic
//! into `ncclInternalError`) and log the text through NCCL's logger, so a
//! failure is never silent and never crosses the ABI as a panic.
use crate::abi::{self, NcclResult};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A null pointer, an unknown device, data type or operation, a size
    /// over the limits: the caller passed something the API does not allow.
    InvalidArgument(String),
    /// A call out of order or against the plugin's contract (a second
    /// connection on one listen handle, a handle from another plugin).
    InvalidUsage(String),
    /// The local system failed: libfabric, memory registration, sockets.
    System(String),
    /// An operation failed in flight or a peer or server went away.
    Remote(String),
    /// A bug: a panic, or state poisoned by an earlier panic.
    Internal(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The `ncclResult_t` for this error.
    pub fn code(&self) -> NcclResult {
        match self {
            Error::InvalidArgument(_) => abi::NCCL_INVALID_ARGUMENT,
            Error::InvalidUsage(_) => abi::NCCL_INVALID_USAGE,
            Error::System(_) => abi::NCCL_SYSTEM_ERROR,
            Error::Remote(_) => abi::NCCL_REMOTE_ERROR,
            Error::Internal(_) => abi::NCCL_INTERNAL_ERROR,
        }
    }

    pub fn arg(msg: impl Into<String>) -> Error {
        Error::InvalidArgument(msg.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::InvalidUsage(m) => write!(f, "invalid usage: {m}"),
            Error::System(m) => write!(f, "system error: {m}"),
            Error::Remote(m) => write!(f, "remote error: {m}"),
            Error::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// A lock whose holder panicked: the state behind it may be half-updated, so
/// every later call on it fails instead of guessing.
impl<T> From<std::sync::PoisonError<T>> for Error {
    fn from(_: std::sync::PoisonError<T>) -> Error {
        Error::Internal("state poisoned by an earlier panic".into())
    }
}
