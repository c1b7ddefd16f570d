//! What a client's calls fail with ([`ClientError`]).
use std::fmt;

#[derive(Debug)]
pub enum ClientError {
    Config(String),
    Connect {
        server: String,
        error: String,
    },
    /// The server refused the job, or ended it (a rank left, a bad chunk...).
    Refused {
        server: String,
        reject: String,
    },
    Fabric(String),
    /// No progress within the timeout.
    Timeout(String),
    BadArgument(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Config(m) => write!(f, "configuration: {m}"),
            ClientError::Connect { server, error } => write!(f, "cannot connect to {server}: {error}"),
            ClientError::Refused { server, reject } => write!(f, "server {server}: {reject}"),
            ClientError::Fabric(m) => write!(f, "fabric: {m}"),
            ClientError::Timeout(m) => write!(f, "timed out: {m}"),
            ClientError::BadArgument(m) => write!(f, "bad argument: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}
