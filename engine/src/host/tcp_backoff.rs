//! This process's TCP connections to a peer that wait out a retransmission
//! backoff: what keeps a server that comes back after a healed link from
//! serving at once.
//!
//! When a link is cut, the data in flight on it is never acknowledged, and
//! the kernel resends it at exponentially growing intervals (200 ms, 400 ms,
//! ... up to 120 s). The link's return does not reset that clock: the next
//! resend comes when its timer fires, which after a cut of T seconds can be
//! up to about T seconds later. tcp;ofi_rxm keeps one connection per pair
//! of endpoints for the process's lifetime, so everything a rank sends to a
//! server it takes back queues behind that stuck data: the first
//! all-reduce after a 20 s cut once took 5.2 s (issue 55). Nothing in
//! libfabric's API closes or resets one connection, so tally reads its own
//! sockets instead (they are this process's file descriptors, opened by
//! the provider):
//!
//! - a server whose link returned is taken back only once none of this
//!   process's connections to it is still backed off ([`scan`] reports
//!   them; the rank's watcher and the server's rejoin admission wait);
//! - on kernels that have it (Linux 6.15 and later), the backoff of those
//!   connections is capped at [`RTO_CAP_MS`] while the peer is away
//!   (`TCP_RTO_MAX_MS`), so that the first resend after the link's return
//!   comes within that, not within the length of the cut; their give-up
//!   time stays what it was (`cap_rto` says why that matters).
//!
//! Once the peer answers again, each of those connections' congestion
//! control starts afresh: `tcp_renew`.
//!
//! Only TCP sockets connected to the given addresses are looked at, in
//! `/proc/self/fd`; nothing here is on a data path (a lost server's watcher
//! every half second, a server's rejoin admission).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The most a capped connection waits between two resends (ms): the
/// kernel's floor for `TCP_RTO_MAX_MS`.
pub const RTO_CAP_MS: u32 = 1000;

/// `TCP_RTO_MAX_MS` (include/uapi/linux/tcp.h, Linux 6.15): not in the libc
/// crate yet.
const TCP_RTO_MAX_MS: libc::c_int = 44;

/// `tcpi_state` of an established connection (include/net/tcp_states.h).
pub(super) const TCP_ESTABLISHED: u8 = 1;

/// What [`scan`] found among this process's TCP connections to the peers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Established TCP connections to the peers.
    pub sockets: u32,
    /// Of those, connections with data unacknowledged after at least one
    /// retransmission timeout: what is sent on them waits for their next resend.
    pub backed_off: u32,
    /// The longest retransmission timeout among those (ms).
    pub rto_ms: u32,
    /// Connections whose backoff this scan capped at [`RTO_CAP_MS`].
    pub capped: u32,
}

/// Looks at every established TCP connection of this process to one of
/// `peers`, but those to or from `control_port` (a server's control
/// connections, tally's own: the provider's are what matters, and a control
/// connection of a job fenced at the cut may stay backed off until it
/// closes); with `cap`, caps each one's backoff at [`RTO_CAP_MS`] where the
/// kernel can. Nothing found (no such connection, no /proc) is the default.
pub fn scan(peers: &[IpAddr], control_port: u16, cap: bool) -> Backoff {
    let mut out = Backoff::default();
    if peers.is_empty() {
        return out;
    }
    for sock in provider_sockets(Some(peers), control_port, |_| true) {
        let Some(info) = tcp_info(sock.fd) else { continue };
        if info.tcpi_state != TCP_ESTABLISHED {
            continue;
        }
        out.sockets += 1;
        if info.tcpi_backoff > 0 && info.tcpi_unacked > 0 {
            out.backed_off += 1;
            out.rto_ms = out.rto_ms.max(info.tcpi_rto / 1000);
        }
        if cap && cap_rto(sock.fd) {
            out.capped += 1;
        }
    }
    out
}

/// A connected IP socket of this process, as [`provider_sockets`] finds it.
pub(super) struct Socket {
    pub(super) fd: libc::c_int,
    /// The kernel's number for the socket (`socket:[N]` in /proc/self/fd):
    /// unlike the descriptor, never reused while the socket lives.
    pub(super) inode: u64,
}

/// This process's connected IP sockets whose peer is one of `peers` (any,
/// with None) and that are neither to nor from `control_port` (a server's
/// control connections, tally's own: the provider's are the rest). `fresh`
/// sees each socket's inode first: false skips it before any other call
/// (a caller that already handled it).
pub(super) fn provider_sockets<'a>(
    peers: Option<&'a [IpAddr]>,
    control_port: u16,
    mut fresh: impl FnMut(u64) -> bool + 'a,
) -> impl Iterator<Item = Socket> + 'a {
    let dir = std::fs::read_dir("/proc/self/fd").into_iter().flatten().flatten();
    dir.filter_map(move |entry| {
        let fd = entry.file_name().to_str()?.parse::<libc::c_int>().ok()?;
        let link = std::fs::read_link(entry.path()).ok()?;
        let inode = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse::<u64>().ok()?;
        if !fresh(inode) {
            return None;
        }
        // The descriptor may be closed, or reused, by the provider's threads
        // between the listing and these calls: each only reads a socket's
        // state or changes a timer of this process's own TCP sockets,
        // harmless on any of them, and fails on anything else.
        let (ip, port) = address(fd, libc::getpeername)?;
        let wanted = peers.is_none_or(|p| p.contains(&ip));
        let control = port == control_port || address(fd, libc::getsockname).is_some_and(|(_, p)| p == control_port);
        (wanted && !control).then_some(Socket { fd, inode })
    })
}

type NameCall = unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int;

/// The peer's (`getpeername`) or this end's (`getsockname`) address and
/// port of `fd`, if it is an IP socket (IPv4-mapped IPv6 addresses as IPv4).
fn address(fd: libc::c_int, call: NameCall) -> Option<(IpAddr, u16)> {
    // SAFETY: an all-zero sockaddr_storage is a valid (empty) value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: ss is writable for len bytes; getpeername and getsockname
    // write at most that and fail (EBADF, ENOTSOCK, ENOTCONN) on anything
    // but a (connected) socket.
    if unsafe { call(fd, (&mut ss as *mut libc::sockaddr_storage).cast(), &mut len) } != 0 {
        return None;
    }
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(&ss as *const libc::sockaddr_storage).cast() };
            Some((IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 = unsafe { &*(&ss as *const libc::sockaddr_storage).cast() };
            Some((IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)).to_canonical(), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// The kernel's TCP_INFO of `fd`; None if it is not a TCP socket.
pub(super) fn tcp_info(fd: libc::c_int) -> Option<libc::tcp_info> {
    // SAFETY: an all-zero tcp_info is a valid value (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: info is writable for len bytes; the kernel writes at most len.
    let ret = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, (&mut info as *mut libc::tcp_info).cast(), &mut len) };
    (ret == 0).then_some(info)
}

/// Caps `fd`'s backoff at [`RTO_CAP_MS`]; false where the kernel has no
/// `TCP_RTO_MAX_MS` (before Linux 6.15).
///
/// The kernel gives a connection up after `tcp_retries2` (15) resends, a
/// time it models with the backoff's ceiling: 924 s at the default 120 s,
/// but about 13 s at 1 s, after which tcp;ofi_rxm's connection is gone and
/// the peer (which may not know) refuses a new one from the same process as
/// a duplicate. So the connection's own give-up time, `TCP_USER_TIMEOUT`,
/// is set first to what it was, [`GIVE_UP_MS`].
fn cap_rto(fd: libc::c_int) -> bool {
    set_int(fd, libc::TCP_USER_TIMEOUT, GIVE_UP_MS as libc::c_int) && set_int(fd, TCP_RTO_MAX_MS, RTO_CAP_MS as libc::c_int)
}

/// How long a capped connection keeps resending before the kernel gives
/// it up (ms): what the defaults give an uncapped one.
pub const GIVE_UP_MS: u32 = 924_600;

/// Sets TCP option `opt` of `fd` to `value`.
pub(super) fn set_int(fd: libc::c_int, opt: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: a c_int option read from a live stack value; the kernel only reads it.
    let ret = unsafe {
        libc::setsockopt(fd, libc::IPPROTO_TCP, opt, (&value as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as _)
    };
    ret == 0
}

/// The IP addresses of tcp;ofi_rxm endpoint `names` (those that are such
/// names), and `also`, each once, in order.
pub fn ips_of<'a>(names: impl IntoIterator<Item = &'a [u8]>, also: Option<IpAddr>) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = names.into_iter().filter_map(name_ip).chain(also).collect();
    ips.sort_unstable();
    ips.dedup();
    ips
}

/// The IP address in a tcp;ofi_rxm endpoint name (a `sockaddr_in` or
/// `sockaddr_in6` as the provider's `fi_getname` gives it); None for other
/// formats (shm's and EFA's names, anything too short).
pub fn name_ip(name: &[u8]) -> Option<IpAddr> {
    let family = u16::from_ne_bytes([*name.first()?, *name.get(1)?]) as libc::c_int;
    match family {
        libc::AF_INET if name.len() >= std::mem::size_of::<libc::sockaddr_in>() => {
            Some(IpAddr::V4(Ipv4Addr::new(name[4], name[5], name[6], name[7])))
        }
        libc::AF_INET6 if name.len() >= std::mem::size_of::<libc::sockaddr_in6>() => {
            let b: [u8; 16] = name[8..24].try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(b)).to_canonical())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn finds_this_processs_connection_to_a_peer_and_not_others() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        c.write_all(b"x").unwrap();
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let here = scan(&[local], 0, false);
        // Both ends are this process's: the client's and the accepted one.
        assert!(here.sockets >= 2, "{here:?}");
        assert_eq!(here.backed_off, 0, "{here:?}");
        // As control connections (the listener's port) neither counts.
        let port = l.local_addr().unwrap().port();
        let with_ours = scan(&[local], port, false);
        assert_eq!(with_ours.sockets, here.sockets - 2, "{here:?} {with_ours:?}");
        assert_eq!(scan(&["192.0.2.1".parse().unwrap()], 0, false), Backoff::default());
        assert_eq!(scan(&[], 0, true), Backoff::default());
    }

    #[test]
    fn reads_ipv4_and_ipv6_names_and_refuses_others() {
        let mut v4 = [0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&7400u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[198, 18, 0, 11]);
        assert_eq!(name_ip(&v4), Some("198.18.0.11".parse().unwrap()));
        assert_eq!(name_ip(&v4[..8]), None);
        let mut v6 = [0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[8..24].copy_from_slice(&"fd00::5".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(name_ip(&v6), Some("fd00::5".parse().unwrap()));
        assert_eq!(name_ip(b"fi_shm://1234:0"), None);
        assert_eq!(name_ip(&[]), None);
    }
}
