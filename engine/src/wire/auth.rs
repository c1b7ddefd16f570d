//! A join's authentication: the token proven, never sent, and the job's
//! secret.
//!
//! **The token.** A server speaks first on every control connection: a
//! [`Challenge`] with a fresh random nonce. The rank's Hello answers it: its
//! `proof` is HMAC-SHA256 keyed with the token, over a label, the nonce and
//! the whole handshake message (the Hello with `proof` zeroed, then its
//! lanes' name records). The server computes the same and compares in
//! constant time. A capture of the control plane so holds the proof of one
//! nonce, which no later challenge asks for, and never the token; and a
//! Hello changed on the way (its job, rank or endpoint names) fails its
//! proof. A short token can still be guessed offline from a captured proof,
//! as any password can: tokens are drawn (`openssl rand -hex 16`).
//!
//! **The job's secret.** Holding the token admits a client to the server,
//! not to other teams' jobs. Every job carries 32 bytes ([`JobSecret`])
//! drawn by the job and held by its ranks alone (the plugin draws them with
//! the job id into rank 0's CollNet handle, which NCCL gives every rank of
//! the communicator and nobody else). The server keeps the secret its first
//! rank brought and holds every later Hello for that job to it: the other
//! ranks joining, and a `REJOIN` that would fence the running job. A token
//! holder that read a job's id on `/metrics` cannot act on the job. The
//! secret travels sealed: XORed with HMAC(token, another label, nonce), a
//! pad that only holders of the token who saw this nonce can compute.
//!
//! A server without a token says so in its challenge
//! ([`Challenge::TOKEN_REQUIRED`] clear): ranks then key both with 32 zero
//! bytes, so nothing is authenticated and the secret can be read off the
//! wire; the server still holds ranks to it.
use super::{expect_kind, read, token_eq, Header, Hello, HelloMessage, Kind, WireError, TOKEN_BYTES};
use bytemuck::{Pod, Zeroable};
use core::mem::size_of;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use static_assertions::const_assert_eq;

/// Bytes of a challenge's nonce.
pub const NONCE_BYTES: usize = 32;

/// Bytes of a job's secret.
pub const JOB_SECRET_BYTES: usize = 32;

/// A job's secret (see the module doc).
pub type JobSecret = [u8; JOB_SECRET_BYTES];

/// Domain labels: a proof is never a pad, nor a pad a proof.
const PROOF_LABEL: &[u8] = b"tally/2 hello proof";
const SEAL_LABEL: &[u8] = b"tally/2 job secret seal";

/// The server's first message on a control connection.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct Challenge {
    pub header: Header,
    /// [`Challenge::TOKEN_REQUIRED`]; other bits must be zero.
    pub flags: u32,
    pub _pad: u32,
    /// Fresh from the server's random source for this connection.
    pub nonce: [u8; NONCE_BYTES],
}
const_assert_eq!(size_of::<Challenge>(), 48);

impl Challenge {
    /// The server checks tokens: the rank keys its proof and seal with its
    /// token (else with zeros).
    pub const TOKEN_REQUIRED: u32 = 1;

    pub fn new(nonce: [u8; NONCE_BYTES], token_required: bool) -> Challenge {
        Challenge {
            header: Header::new(Kind::Challenge),
            flags: if token_required { Challenge::TOKEN_REQUIRED } else { 0 },
            _pad: 0,
            nonce,
        }
    }

    /// The header, kind and reserved bits checked.
    pub fn check(&self) -> Result<(), WireError> {
        expect_kind(&self.header, Kind::Challenge)?;
        if self.flags & !Challenge::TOKEN_REQUIRED != 0 || self._pad != 0 {
            return Err(WireError::BadPadding);
        }
        Ok(())
    }

    /// The key a rank holding `token` proves and seals with for this server.
    pub fn key(&self, token: &[u8; TOKEN_BYTES]) -> [u8; TOKEN_BYTES] {
        if self.flags & Challenge::TOKEN_REQUIRED != 0 {
            *token
        } else {
            [0; TOKEN_BYTES]
        }
    }
}

fn hmac(key: &[u8; TOKEN_BYTES], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// The proof of a handshake message `msg` (a Hello and its lanes' records)
/// for `nonce`: the MAC of the message with its `proof` bytes read as zero.
fn proof_of(key: &[u8; TOKEN_BYTES], nonce: &[u8; NONCE_BYTES], msg: &[u8]) -> [u8; 32] {
    let at = core::mem::offset_of!(Hello, proof);
    let end = at + TOKEN_BYTES;
    hmac(key, &[PROOF_LABEL, nonce, &msg[..at], &[0u8; TOKEN_BYTES], &msg[end..]])
}

/// The pad a job's secret is sealed with for `nonce`.
fn pad(key: &[u8; TOKEN_BYTES], nonce: &[u8; NONCE_BYTES]) -> JobSecret {
    hmac(key, &[SEAL_LABEL, nonce])
}

fn xor(a: &JobSecret, b: &JobSecret) -> JobSecret {
    core::array::from_fn(|i| a[i] ^ b[i])
}

impl HelloMessage {
    /// Answers `challenge`: seals the Hello's secret (put there in clear by
    /// [`Hello::new`]) and writes the proof. Call once per connection, on
    /// a message built for it: a message answers one challenge only.
    pub fn answer(&mut self, challenge: &Challenge, token: &[u8; TOKEN_BYTES]) {
        let key = challenge.key(token);
        self.hello.secret = xor(&self.hello.secret, &pad(&key, &challenge.nonce));
        self.hello.proof = [0; TOKEN_BYTES];
        let proof = proof_of(&key, &challenge.nonce, self.as_bytes());
        self.hello.proof = proof;
    }
}

impl Hello {
    /// Whether `msg`, a whole handshake message (this Hello and its lanes'
    /// records), proves `key` for `nonce`; constant time in the proof.
    pub fn proves(msg: &[u8], key: &[u8; TOKEN_BYTES], nonce: &[u8; NONCE_BYTES]) -> bool {
        let Ok(hello) = read::<Hello>(msg) else { return false };
        let want = proof_of(key, nonce, msg);
        let mut diff = 0u8;
        for (a, b) in want.iter().zip(hello.proof.iter()) {
            diff |= a ^ b;
        }
        // black_box keeps the compiler from turning the loop into an early exit.
        core::hint::black_box(diff) == 0
    }

    /// The job's secret this Hello carries, sealed for `nonce` with `key`.
    pub fn secret(&self, key: &[u8; TOKEN_BYTES], nonce: &[u8; NONCE_BYTES]) -> JobSecret {
        xor(&self.secret, &pad(key, nonce))
    }
}

/// The id of another job of the same ranks (`what` names which: a
/// communicator's job for another type and operation, a failover's redo
/// job), derived from the first job's id and the secret: whoever read the
/// first id on `/metrics` cannot compute these, so cannot join one first to
/// hold it up. Odd, as the plugin's drawn ids are.
pub fn derive_job_id(job_id: u64, secret: &JobSecret, what: &[u8]) -> u64 {
    let m = hmac(secret, &[b"tally/2 job id", &job_id.to_le_bytes(), what]);
    u64::from_le_bytes([m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]]) | 1
}

/// Whether two secrets are equal, in time independent of where they differ.
pub fn secret_eq(a: &JobSecret, b: &JobSecret) -> bool {
    token_eq(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::spec;

    fn message(secret: &JobSecret) -> HelloMessage {
        HelloMessage::new(&spec(), 1, secret, &[b"rail0", b"rail1"]).unwrap()
    }

    #[test]
    fn a_proof_holds_for_its_token_nonce_and_bytes_only() {
        let token = *b"0123456789abcdef0123456789abcdef";
        let c = Challenge::new([5; NONCE_BYTES], true);
        let mut m = message(&[3; JOB_SECRET_BYTES]);
        m.answer(&c, &token);
        let bytes = m.as_bytes().to_vec();
        assert!(Hello::proves(&bytes, &token, &c.nonce));
        // The token itself is nowhere in what goes on the wire.
        assert!(!bytes.windows(TOKEN_BYTES).any(|w| w == token));
        let mut other = token;
        other[31] ^= 1;
        assert!(!Hello::proves(&bytes, &other, &c.nonce), "another token");
        assert!(!Hello::proves(&bytes, &token, &[6; NONCE_BYTES]), "another nonce: a replay");
        for at in [8, 20, 100, bytes.len() - 1] {
            let mut changed = bytes.clone();
            changed[at] ^= 0x40;
            assert!(!Hello::proves(&changed, &token, &c.nonce), "byte {at} changed");
        }
        assert!(!Hello::proves(&bytes[..10], &token, &c.nonce), "a short message");
    }

    #[test]
    fn the_secret_is_sealed_for_its_nonce() {
        let token = [9u8; TOKEN_BYTES];
        let secret = [0xa5; JOB_SECRET_BYTES];
        let c = Challenge::new([1; NONCE_BYTES], true);
        let mut m = message(&secret);
        m.answer(&c, &token);
        assert_ne!(m.hello.secret, secret, "not in clear");
        assert_eq!(m.hello.secret(&token, &c.nonce), secret);
        assert_ne!(m.hello.secret(&[0; TOKEN_BYTES], &c.nonce), secret, "not without the token");
        // Another connection's seal of the same secret differs.
        let c2 = Challenge::new([2; NONCE_BYTES], true);
        let mut m2 = message(&secret);
        m2.answer(&c2, &token);
        assert_ne!(m2.hello.secret, m.hello.secret);
    }

    #[test]
    fn a_server_without_a_token_is_answered_with_zeros() {
        let c = Challenge::new([1; NONCE_BYTES], false);
        assert_eq!(c.key(&[7; TOKEN_BYTES]), [0; TOKEN_BYTES]);
        let mut m = message(&[4; JOB_SECRET_BYTES]);
        m.answer(&c, &[7; TOKEN_BYTES]);
        assert!(Hello::proves(m.as_bytes(), &[0; TOKEN_BYTES], &c.nonce));
        assert_eq!(m.hello.secret(&[0; TOKEN_BYTES], &c.nonce), [4; JOB_SECRET_BYTES]);
    }

    #[test]
    fn derived_job_ids_need_the_secret() {
        let (a, b) = ([1; JOB_SECRET_BYTES], [2; JOB_SECRET_BYTES]);
        assert_eq!(derive_job_id(7, &a, b"bf16"), derive_job_id(7, &a, b"bf16"));
        assert_ne!(derive_job_id(7, &a, b"bf16"), derive_job_id(7, &b, b"bf16"));
        assert_ne!(derive_job_id(7, &a, b"bf16"), derive_job_id(7, &a, b"f16"));
        assert_ne!(derive_job_id(7, &a, b"x"), derive_job_id(8, &a, b"x"));
    }

    #[test]
    fn a_challenge_checks_its_header_and_reserved_bits() {
        let c = Challenge::new([0; NONCE_BYTES], true);
        assert!(c.check().is_ok());
        let back: Challenge = read(bytemuck::bytes_of(&c)).unwrap();
        assert_eq!(back.flags, Challenge::TOKEN_REQUIRED);
        let mut bad = c;
        bad.flags |= 2;
        assert_eq!(bad.check(), Err(WireError::BadPadding));
        let mut bad = c;
        bad.header.kind = Kind::Hello as u16;
        assert!(bad.check().is_err());
    }
}
