//! What a peer's endpoint name must look like before it reaches
//! `fi_av_insert`.
//!
//! A rank's endpoint names arrive in its Hello, from a client the server
//! does not control, and an lcore inserts them into the address vector it
//! shares with every other job. libfabric takes such a name as given: it is
//! raw bytes in the provider's own format (tcp;ofi_rxm: a `sockaddr_in` or
//! `sockaddr_in6`; shm: a NUL-terminated string; efa: 32 bytes of GID, QP
//! number and key). A name of another provider's format, or crafted, is
//! undefined input there: an shm name given to a tcp server's AV (the
//! plugin picks shm for servers on 127.x, so a developer's test job does
//! this by accident) left libfabric 1.17's AV refusing every later insert
//! with `-FI_EINVAL`, every job after it failing until a restart.
//!
//! So the control plane checks each name against the shape of the server's
//! own names ([`NameShape::of`]) and refuses a rank whose name does not
//! fit, for that rank alone, with a reason that names the provider the
//! name looks like. The check is of form, not of reachability: a well-formed
//! name of a host that is not there still fails its job, and only its job.
use super::EndpointName;

/// `AF_INET` and `AF_INET6` as they sit little-endian in a name's first
/// two bytes (`sa_family_t`, host order).
const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;
const SOCKADDR_IN: usize = core::mem::size_of::<libc::sockaddr_in>();
const SOCKADDR_IN6: usize = core::mem::size_of::<libc::sockaddr_in6>();

/// The form a provider's endpoint names take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameShape {
    /// Not known yet (before the lcores opened their endpoints): anything
    /// [`EndpointName`] holds.
    Any,
    /// A socket address of the server's own family, `sockaddr_in` or
    /// `sockaddr_in6`, with a port (tcp, and the providers rxm layers over
    /// it): an address vector holds addresses of one length, its own.
    SocketAddress { inet6: bool },
    /// A printable string, NUL-padded, starting like the server's own names
    /// (shm: `fi_shm://` and the like); `prefix` is what they share.
    Text { prefix: Vec<u8> },
    /// Exactly this many bytes, and not all zero (efa: 32).
    Fixed(usize),
}

impl NameShape {
    /// The shape of names for `provider`, learnt from one of the server's
    /// own names.
    pub fn of(provider: &str, own: &EndpointName) -> NameShape {
        let b = own.as_bytes();
        if provider.starts_with("tcp") || provider.starts_with("sockets") || looks_like_socket_address(b) {
            NameShape::SocketAddress { inet6: b.len() == SOCKADDR_IN6 }
        } else if provider.starts_with("shm") || is_text(b) {
            let text = trim_nuls(b);
            let prefix = match text.windows(3).position(|w| w == b"://") {
                Some(i) => text[..i + 3].to_vec(),
                None => Vec::new(),
            };
            NameShape::Text { prefix }
        } else {
            NameShape::Fixed(b.len())
        }
    }

    /// Why `name` is not one of this shape's, if it is not.
    pub fn problem(&self, name: &[u8]) -> Option<String> {
        let fits = match self {
            NameShape::Any => !name.is_empty(),
            NameShape::SocketAddress { inet6 } => looks_like_socket_address(name) && (name.len() == SOCKADDR_IN6) == *inet6,
            NameShape::Text { prefix } => is_text(name) && trim_nuls(name).starts_with(prefix),
            NameShape::Fixed(n) => name.len() == *n && name.iter().any(|&b| b != 0),
        };
        if fits {
            return None;
        }
        if let (NameShape::Text { prefix }, true) = (self, is_text(name)) {
            return Some(format!(
                "the endpoint name does not start with {:?} as this server's (shm) names do",
                String::from_utf8_lossy(prefix)
            ));
        }
        let mine = match self {
            NameShape::Any => "any",
            NameShape::SocketAddress { inet6: false } => "tcp's over IPv4 (a sockaddr_in)",
            NameShape::SocketAddress { inet6: true } => "tcp's over IPv6 (a sockaddr_in6)",
            NameShape::Text { .. } => "shm's (a string)",
            NameShape::Fixed(32) => "efa's (32 bytes)",
            NameShape::Fixed(_) => "of another length",
        };
        Some(format!(
            "the endpoint name ({} bytes) {}, and this server's names are {mine}: the rank and the server must use the same provider (TALLY_PROVIDER)",
            name.len(),
            match guess(name) {
                Some(p) => format!("looks like {p}'s"),
                None => "is of no provider's form".to_string(),
            }
        ))
    }
}

/// `fi_av_insert`'s refusal of `whose` endpoint `name` (`"the client's"`),
/// in words that name the cause where the name's form shows it: the peer
/// runs another provider than `provider`, this end's (`own`: this end's
/// name, when it has one). Where the name is of this provider's form, the
/// error alone: the form is not the problem.
pub fn insert_refused(provider: &str, own: Option<&EndpointName>, name: &EndpointName, e: &super::FabricError, whose: &str) -> String {
    let name = name.as_bytes();
    let misfit = own.is_none_or(|o| NameShape::of(provider, o).problem(name).is_some());
    match guess(name) {
        _ if !misfit => e.to_string(),
        Some(p) if !provider.starts_with(p) => {
            format!("{e}: {whose} endpoint name is not a {provider} address: it runs provider {p}? (TALLY_PROVIDER)")
        }
        _ => {
            format!("{e}: {whose} endpoint name is not a {provider} address (the provider, TALLY_PROVIDER, must be the same on both ends)")
        }
    }
}

/// Which provider's a name looks like, as far as its form tells.
fn guess(name: &[u8]) -> Option<&'static str> {
    if looks_like_socket_address(name) {
        Some("tcp")
    } else if is_text(name) {
        Some("shm")
    } else if name.len() == 32 {
        Some("efa")
    } else {
        None
    }
}

fn looks_like_socket_address(b: &[u8]) -> bool {
    if b.len() < 4 {
        return false;
    }
    let family = u16::from_ne_bytes([b[0], b[1]]);
    let port = u16::from_be_bytes([b[2], b[3]]);
    let len_fits = match family {
        AF_INET => b.len() == SOCKADDR_IN,
        AF_INET6 => b.len() == SOCKADDR_IN6,
        _ => false,
    };
    len_fits && port != 0
}

/// Printable ASCII, then nothing but NULs, and something before them.
fn is_text(b: &[u8]) -> bool {
    let t = trim_nuls(b);
    !t.is_empty() && t.iter().all(|&c| (0x20..0x7f).contains(&c)) && b[t.len()..].iter().all(|&c| c == 0)
}

fn trim_nuls(b: &[u8]) -> &[u8] {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    &b[..n]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(b: &[u8]) -> EndpointName {
        EndpointName::from_bytes(b).unwrap()
    }

    fn sockaddr_in(port: u16) -> Vec<u8> {
        let mut b = vec![0u8; SOCKADDR_IN];
        b[..2].copy_from_slice(&AF_INET.to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[4..8].copy_from_slice(&[127, 0, 0, 1]);
        b
    }

    #[test]
    fn a_tcp_server_takes_socket_addresses_only() {
        let shape = NameShape::of("tcp;ofi_rxm", &name(&sockaddr_in(40000)));
        assert_eq!(shape, NameShape::SocketAddress { inet6: false });
        assert_eq!(shape.problem(&sockaddr_in(41234)), None);
        let mut v6 = vec![0u8; SOCKADDR_IN6];
        v6[..2].copy_from_slice(&AF_INET6.to_ne_bytes());
        v6[2..4].copy_from_slice(&7u16.to_be_bytes());
        assert!(shape.problem(&v6).unwrap().contains("IPv4"), "another family than the server's");
        let shape6 = NameShape::of("tcp", &name(&v6));
        assert_eq!(shape6.problem(&v6), None);
        assert!(shape6.problem(&sockaddr_in(41234)).is_some());
        let shm = shape.problem(b"fi_shm://12345:0\0\0").unwrap();
        assert!(shm.contains("looks like shm's") && shm.contains("tcp's"), "{shm}");
        assert!(shape.problem(&sockaddr_in(0)).is_some(), "no port");
        assert!(shape.problem(&sockaddr_in(1)[..12]).is_some(), "short");
        assert!(shape.problem(&[0xff; 16]).unwrap().contains("no provider's form"));
        assert!(shape.problem(&[0x11; 32]).unwrap().contains("efa's"));
    }

    #[test]
    fn an_shm_server_takes_its_kind_of_string_only() {
        let shape = NameShape::of("shm", &name(b"fi_shm://4242:0:1\0"));
        assert_eq!(shape, NameShape::Text { prefix: b"fi_shm://".to_vec() });
        assert_eq!(shape.problem(b"fi_shm://99:3:0"), None);
        assert!(shape.problem(&sockaddr_in(40000)).unwrap().contains("looks like tcp's"));
        assert!(shape.problem(b"other://1").unwrap().contains("does not start with \"fi_shm://\""), "another prefix");
        assert!(shape.problem(b"fi_shm://1\x01").is_some(), "not printable");
        assert!(shape.problem(b"fi_shm://1\0x").is_some(), "text after the NUL");
        // A name without a scheme: any printable string.
        let bare = NameShape::of("shm", &name(b"4242_0\0"));
        assert_eq!(bare.problem(b"99_1"), None);
    }

    #[test]
    fn an_efa_server_takes_its_length_only() {
        let shape = NameShape::of("efa", &name(&[0xfe; 32]));
        assert_eq!(shape, NameShape::Fixed(32));
        assert_eq!(shape.problem(&[0x80; 32]), None);
        assert!(shape.problem(&[0; 32]).is_some(), "all zero");
        assert!(shape.problem(&sockaddr_in(1)).is_some());
    }
}
