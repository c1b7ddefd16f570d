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
    TokenTooLong(TokenSource),
    /// The token is configured but empty or blank (it would read as no
    /// token at all: see `control/token.rs`).
    EmptyToken(TokenSource),
    /// `TALLY_TOKEN` is set to bytes that are not UTF-8.
    TokenNotUtf8,
}

/// Where a server's token was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `token_file`, at this path.
    File(String),
    /// `TALLY_TOKEN`.
    Env,
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::File(path) => write!(f, "token_file {path}"),
            TokenSource::Env => write!(f, "TALLY_TOKEN"),
        }
    }
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Listen { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
            SetupError::NoAddress { addr } => write!(f, "cannot listen on {addr}: no address"),
            SetupError::TokenFile { path, source } => write!(f, "token_file {path}: {source}"),
            SetupError::TokenTooLong(from) => write!(f, "{from}: the token is longer than {TOKEN_BYTES} bytes"),
            SetupError::EmptyToken(TokenSource::File(path)) => {
                write!(f, "token_file {path} is empty: write a token (e.g. `openssl rand -hex 16`) or remove token_file to run without one")
            }
            SetupError::EmptyToken(TokenSource::Env) => {
                write!(f, "TALLY_TOKEN is set but empty: set a token (e.g. `openssl rand -hex 16`) or unset TALLY_TOKEN to run without one")
            }
            SetupError::TokenNotUtf8 => write!(f, "TALLY_TOKEN is not UTF-8"),
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
