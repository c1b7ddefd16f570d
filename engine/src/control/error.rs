//! Why the control plane could not be set up: its port not bound, its
//! token not read. (Once running, it reports a job's failure to the job's
//! ranks, never to its caller.)
use crate::wire::TOKEN_BYTES;
use std::fmt;
use std::io;

/// Why [`super::listen`] or [`super::rules`] failed.
#[derive(Debug)]
pub enum SetupError {
    /// The control address does not resolve, or cannot be bound.
    Listen { addr: String, source: io::Error },
    /// The control address resolves to no address at all.
    NoAddress { addr: String },
    /// `token_file` cannot be read.
    TokenFile { path: String, source: io::Error },
    /// The token is longer than [`TOKEN_BYTES`].
    TokenTooLong,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Listen { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
            SetupError::NoAddress { addr } => write!(f, "cannot listen on {addr}: no address"),
            SetupError::TokenFile { path, source } => write!(f, "token_file {path}: {source}"),
            SetupError::TokenTooLong => write!(f, "the token is longer than {TOKEN_BYTES} bytes"),
        }
    }
}

impl std::error::Error for SetupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SetupError::Listen { source, .. } | SetupError::TokenFile { source, .. } => Some(source),
            _ => None,
        }
    }
}
