//! The handshake's first half on a new control connection: the server
//! speaks first, a [`Challenge`] (`wire::auth`), which the rank's Hello
//! answers with its proof of the token and its job's secret sealed. A
//! server that refuses at once (too many handshakes from this address)
//! sends a reject instead, left unread here for the answer's reader; one
//! of another protocol version is told apart by its header.
use crate::wire::{self, Challenge, HelloMessage, Kind, TOKEN_BYTES};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Longest wait for a server's challenge on a connection it accepted: it
/// sends it at once, so only a server frozen after its accept takes long.
const CHALLENGE_WAIT: Duration = Duration::from_secs(10);

/// What a server said first on a new control connection.
pub(crate) enum Opening {
    /// Its challenge, which the Hello answers (`wire::auth`).
    Challenge(Challenge),
    /// A reject before any challenge (too many handshakes from this
    /// address): left unread, for the answer's reader to report.
    Refused,
}

/// Reads the server's opening message on `s`, waiting at most `timeout`
/// (and [`CHALLENGE_WAIT`]). A server of another protocol version is told
/// apart here by its header.
pub(crate) fn read_opening(s: &mut TcpStream, timeout: Duration) -> std::io::Result<Opening> {
    use std::io::{Error, ErrorKind};
    let before = s.read_timeout()?;
    let wait = timeout.clamp(Duration::from_millis(100), CHALLENGE_WAIT);
    s.set_read_timeout(Some(wait))?;
    let deadline = Instant::now() + wait;
    let opening = (|| {
        let mut hdr = [0u8; 8];
        loop {
            // Peeked, not read: a reject stays for `read_answer`.
            let n = match s.peek(&mut hdr) {
                Ok(n) => n,
                // The read timeout ran out: a server whose kernel accepted
                // but whose process says nothing (frozen, or not tally).
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(Error::new(ErrorKind::TimedOut, format!("no challenge from the server within {wait:?} of connecting")));
                }
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Err(Error::new(ErrorKind::UnexpectedEof, "the server closed the connection before its challenge"));
            }
            if n == hdr.len() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::new(ErrorKind::TimedOut, "no challenge from the server in time"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let header: wire::Header = wire::read(&hdr).map_err(|e| Error::new(ErrorKind::InvalidData, e.to_string()))?;
        match header.check() {
            Ok(Kind::Challenge) => {}
            Ok(Kind::Reject) => return Ok(Opening::Refused),
            Ok(k) => return Err(Error::new(ErrorKind::InvalidData, format!("the server opened with {k:?}, not a challenge"))),
            Err(e) => return Err(Error::new(ErrorKind::InvalidData, format!("not this build's server: {e}"))),
        }
        let mut b = [0u8; core::mem::size_of::<Challenge>()];
        s.read_exact(&mut b)?;
        let c: Challenge = wire::read(&b).map_err(|e| Error::new(ErrorKind::InvalidData, e.to_string()))?;
        c.check().map_err(|e| Error::new(ErrorKind::InvalidData, format!("the server's challenge: {e}")))?;
        Ok(Opening::Challenge(c))
    })();
    s.set_read_timeout(before)?;
    opening
}

/// Sends `hello` on `s` answered to `challenge` (its own copy: a message
/// answers one challenge). A rank that holds a token answers no challenge
/// that asks for none: its job's secret would go sealed with a key of
/// zeros, readable by whatever answered at the server's address (a server
/// started without the token, or one posing as it). Nothing is sent then.
pub(crate) fn send_answered(
    s: &mut TcpStream,
    hello: &HelloMessage,
    challenge: &Challenge,
    token: &[u8; TOKEN_BYTES],
) -> std::io::Result<()> {
    if challenge.flags & Challenge::TOKEN_REQUIRED == 0 && *token != [0; TOKEN_BYTES] {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the server asks for no token and this rank holds one (TALLY_TOKEN): the job's secret is not sent where it could be read; give the server the same token (token_file or TALLY_TOKEN), or run the ranks without one",
        ));
    }
    let mut m = *hello;
    m.answer(challenge, token);
    s.write_all(m.as_bytes())
}

/// The handshake's first half on a connection just made: the server's
/// challenge read, the Hello answered to it and sent (nothing is sent to a
/// server that refused at once; the answer's reader reports why).
pub(crate) fn greet(s: &mut TcpStream, hello: &HelloMessage, token: &[u8; TOKEN_BYTES], timeout: Duration) -> std::io::Result<()> {
    match read_opening(s, timeout)? {
        Opening::Challenge(c) => send_answered(s, hello, &c, token),
        Opening::Refused => Ok(()),
    }
}
