//! Reading a control connection: what its socket has, first as the
//! handshake (one Hello answering the connection's challenge, checked and
//! turned into a [`ConnEvent::Join`] or refused), then as the joined rank's framed messages (`Boundary`, `Lost`,
//! `Bye`, ...), each parsed into a [`ConnEvent`]; and its end of stream.
use super::{ConnEvent, Connections, Joining, Phase, Refusal};
use crate::dataplane::fabric::EndpointName;
use crate::wire::{self, Header, Hello, HelloMessage, Kind, RejectCode, TOKEN_BYTES};
use std::io::{ErrorKind, Read};

impl Connections {
    /// Reads what the socket has and acts on it.
    pub(super) fn read(&mut self, slot: usize, out: &mut Vec<ConnEvent>) {
        let mut buf = [0u8; 4096];
        loop {
            let Some(c) = self.slots[slot].as_mut() else { return };
            // A handshake reads no further than its Hello and the lanes'
            // names it announces (at most MAX_LANES - 1): a peer cannot make
            // an unauthenticated connection buffer more.
            let want = match c.phase {
                Phase::Handshake => Hello::message_len(&c.input) - c.input.len(),
                Phase::Rank | Phase::Refused => buf.len(),
            };
            if want == 0 {
                break;
            }
            match c.stream.read(&mut buf[..want]) {
                Ok(0) => {
                    self.eof(slot, out);
                    return;
                }
                Ok(n) => {
                    if c.closing {
                        continue; // already refused: drain and ignore
                    }
                    c.input.extend_from_slice(&buf[..n]);
                    if !self.consume(slot, out) {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.eof(slot, out);
                    return;
                }
            }
        }
    }

    /// The peer closed (or reset) the connection.
    fn eof(&mut self, slot: usize, out: &mut Vec<ConnEvent>) {
        let Some(c) = self.slots[slot].as_ref() else { return };
        if c.phase == Phase::Handshake && !c.input.is_empty() && !c.closing {
            let (peer, got) = (c.peer, c.input.len());
            self.quiet_refusal(Refusal::Truncated, peer, || format!("connection closed after {got} bytes of a handshake"));
        }
        self.drop_slot(slot, out);
    }

    /// Parses the input; false once the connection is gone or closing.
    fn consume(&mut self, slot: usize, out: &mut Vec<ConnEvent>) -> bool {
        let c = self.slots[slot].as_mut().expect("live slot");
        match c.phase {
            Phase::Handshake => self.handshake(slot, out),
            Phase::Rank => self.messages(slot, out),
            Phase::Refused => false,
        }
    }

    /// Checks the Hello as far as it arrived: a header that is already wrong
    /// is refused without waiting for the rest; then its fields, then, with
    /// its lanes' names in, its proof of the token for this connection's
    /// challenge (`wire::auth`).
    fn handshake(&mut self, slot: usize, out: &mut Vec<ConnEvent>) -> bool {
        let c = self.slots[slot].as_ref().expect("live slot");
        let (id, peer, nonce) = (c.id, c.peer, c.nonce);
        if c.input.len() >= 8 {
            let hdr: Header = wire::read(&c.input).expect("8 bytes");
            if let Err(e) = hdr.check().and_then(|k| if k == Kind::Hello { Ok(k) } else { Err(wire::WireError::BadKind(k as u16)) }) {
                let field = match e {
                    wire::WireError::BadMagic(_) => "magic",
                    wire::WireError::BadVersion(_) => "version",
                    _ => "kind",
                };
                self.quiet_refusal(Refusal::Malformed, peer, || format!("refused handshake: {e}"));
                self.counters.refused(RejectCode::BadField);
                self.refuse_handshake(id, RejectCode::BadField, field, &e.to_string());
                return false;
            }
        }
        if c.input.len() < core::mem::size_of::<Hello>() {
            return true;
        }
        let hello: Hello = wire::read(&c.input).expect("a whole Hello");
        let spec = match hello.check(&self.rules.limits) {
            Ok(s) => s,
            Err(e) => {
                self.quiet_refusal(Refusal::Malformed, peer, || format!("refused handshake: {}: {}", e.field, e.reason));
                self.counters.refused(RejectCode::BadField);
                self.refuse_handshake(id, RejectCode::BadField, e.field, e.reason);
                return false;
            }
        };
        // The lanes' names follow the Hello (wire::join's module doc).
        if c.input.len() < Hello::message_len(&c.input) {
            return true;
        }
        // The proof covers the whole message; a server without a token
        // checks it against the zero key its challenge told the rank to use.
        let key = self.rules.token.unwrap_or([0; TOKEN_BYTES]);
        if !Hello::proves(&c.input, &key, &nonce) {
            let (job, rank) = (hello.job_id, hello.rank);
            let with_token = self.rules.token.is_some();
            let msg = if with_token { "wrong or missing token" } else { "the proof does not answer this connection's challenge" };
            self.quiet_refusal(Refusal::Unauthorized, peer, || match with_token {
                true => format!("refused: wrong or missing token (job {:#x}, rank {})", job, rank),
                false => format!("refused: {msg} (job {job:#x}, rank {rank})"),
            });
            self.counters.refused(RejectCode::Unauthorized);
            self.refuse_handshake(id, RejectCode::Unauthorized, "token", msg);
            return false;
        }
        let c = self.slots[slot].as_ref().expect("live slot");
        let mut names = Vec::with_capacity(1 + hello.lanes as usize);
        for k in 0..=hello.lanes as usize {
            let name = match k {
                0 => EndpointName::from_bytes(hello.name()),
                k => HelloMessage::lane(&c.input, k).ok().and_then(|r| r.name().ok().and_then(EndpointName::from_bytes)),
            };
            // A name this server's provider could not take is refused here,
            // for this rank alone: it never reaches an address vector.
            let problem = match &name {
                None => Some("an endpoint name is empty or too long".to_string()),
                Some(n) => self.rules.names.problem(n.as_bytes()),
            };
            if let Some(why) = problem {
                let field = if k == 0 { "name" } else { "lanes" };
                self.quiet_refusal(Refusal::Malformed, peer, || format!("refused handshake: {field}: {why}"));
                self.counters.refused(RejectCode::BadField);
                self.refuse_handshake(id, RejectCode::BadField, field, &why);
                return false;
            }
            names.push(name.expect("checked"));
        }
        let secret = hello.secret(&key, &nonce);
        let c = self.slots[slot].as_mut().expect("live slot");
        c.phase = Phase::Rank;
        c.input.clear();
        self.ranks += 1;
        self.admission.leave(peer.ip());
        out.push(ConnEvent::Join(Box::new(Joining {
            rejoin: hello.rejoin(),
            heartbeats: hello.wants_heartbeats(),
            conn: id,
            peer,
            spec,
            rank: hello.rank,
            names,
            secret,
        })));
        true
    }

    /// Parses rank messages after the handshake.
    fn messages(&mut self, slot: usize, out: &mut Vec<ConnEvent>) -> bool {
        loop {
            let c = self.slots[slot].as_mut().expect("live slot");
            let (id, peer) = (c.id, c.peer);
            if c.input.len() < 8 {
                return true;
            }
            let kind = wire::read::<Header>(&c.input).map(|h| h.check());
            let Ok(Ok(kind)) = kind else {
                log::warn!("{peer}: unexpected bytes after the handshake; closing");
                self.close(id);
                return false;
            };
            let Some(n) = kind.rank_message_bytes() else {
                log::warn!("{peer}: unexpected {kind:?} after the handshake; closing");
                self.close(id);
                return false;
            };
            if c.input.len() < n {
                return true;
            }
            let used = match kind {
                Kind::Bye => {
                    out.push(ConnEvent::Bye { conn: id });
                    n
                }
                Kind::Boundary => match wire::read::<wire::Boundary>(&c.input).map(|m| m.check()) {
                    Ok(Ok(next_op)) => {
                        out.push(ConnEvent::Boundary { conn: id, next_op });
                        n
                    }
                    _ => {
                        log::warn!("{peer}: malformed boundary; closing");
                        self.close(id);
                        return false;
                    }
                },
                Kind::Lost => {
                    let lost = wire::read::<wire::Lost>(&c.input[..n]);
                    let Ok(lost) = lost.and_then(|l| l.check().map(|_| l)) else {
                        log::warn!("{peer}: malformed lost report; closing");
                        self.close(id);
                        return false;
                    };
                    let len = lost.report_len as usize;
                    if c.input.len() < n + len {
                        return true;
                    }
                    let report = c.input[n..n + len].to_vec();
                    out.push(ConnEvent::Lost { conn: id, dead: lost.dead, boundary: lost.boundary, report });
                    n + len
                }
                _ => unreachable!("rank_message_bytes names only these"),
            };
            c.input.drain(..used);
        }
    }
}
