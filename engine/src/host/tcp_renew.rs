//! BBR started afresh on this process's connections to a peer taken back
//! after an outage, where what it learned across the cut would hold the
//! first all-reduces after the heal back.
//!
//! BBR (v1, Linux's `bbr`) can read a cut as a token-bucket policer: it
//! then paces the connection at the rate it measured across the cut for 48
//! of its round trips. After an 8 s cut that rate was 1.4 kbit/s, and a
//! 64 KiB piece took 16 s to 30 s (tests/suites/linkcut.rs, 7 runs in 101
//! on the 16-core device, where bbr is the hosts' default). Switching the
//! algorithm to reno and back makes the kernel initialise BBR's state
//! again ([`renew_congestion_control`]).
//!
//! But not every connection: a fresh BBR paces from the smoothed round
//! trip until its first bandwidth samples, and after a cut that RTT is
//! stale: the first acknowledgements after the heal echo timestamps from
//! before it, and one sample of the cut's length leaves the smoothed RTT
//! at about a second (`rtt:903/1793` in `ss`, where the path's is 8 us).
//! BBR started afresh on such a connection paced at 146 kbit/s and grew
//! back over 2 s: renewing every connection made 3 runs of 100 stand still
//! 3.4-3.6 s, where their own models were at 1-18 Gbit/s. (Holding the
//! connections in reno until the RTT was clean is worse: once BBR has run
//! on a socket the kernel keeps pacing it, and reno's rate is its window
//! over that same stale RTT, 267 kbit/s; two runs here stood still 4.1 s
//! and 6.7 s.) So only a connection whose BBR model is below
//! [`POLICED_BELOW_BPS`] is renewed: one that read the cut as a policer.
//! Other algorithms keep no such model and are left alone.
//!
//! Only TCP sockets connected to the given addresses are touched (those
//! `tcp_backoff::provider_sockets` finds), never on a data path: a rank's
//! watcher takes a server back, a server admits a REJOIN.
use std::net::IpAddr;

use super::tcp_backoff::{provider_sockets, tcp_info, TCP_ESTABLISHED};

/// A BBR connection whose bandwidth model is under this (bit/s) after an
/// outage is renewed: a thousandth of the slowest link tally is run on
/// (a policed one read 1376 bit/s; healthy ones after the same cut, 1-18 Gbit/s).
pub const POLICED_BELOW_BPS: u64 = 10_000_000;

/// `TCP_CC_INFO` (include/uapi/linux/tcp.h): the algorithm's own state;
/// for BBR `struct tcp_bbr_info`, its bandwidth model in bytes/s first.
const TCP_CC_INFO: libc::c_int = 26;

/// `TCP_CA_NAME_MAX` (include/net/tcp.h): the longest algorithm name, NUL included.
const CA_NAME_MAX: usize = 16;

/// Starts BBR afresh on each established TCP connection of this process
/// to one of `peers` (but those to or from `control_port`, as
/// `tcp_backoff::scan` leaves them) whose bandwidth model is below
/// [`POLICED_BELOW_BPS`] (the module doc says why not the others): the
/// algorithm is switched to reno and back. Returns how many were renewed.
///
/// Reno is open to every process, and so is the host's default: a
/// connection whose algorithm a privileged process set to another may
/// refuse the switch back, and then keeps reno.
pub fn renew_congestion_control(peers: &[IpAddr], control_port: u16) -> u32 {
    if peers.is_empty() {
        return 0;
    }
    let mut renewed = 0;
    for sock in provider_sockets(Some(peers), control_port, |_| true) {
        if tcp_info(sock.fd).is_none_or(|i| i.tcpi_state != TCP_ESTABLISHED) {
            continue;
        }
        let Some(name) = congestion_control(sock.fd) else { continue };
        if name.as_slice() != b"bbr" || bbr_bandwidth_bps(sock.fd).is_none_or(|bw| bw >= POLICED_BELOW_BPS) {
            continue;
        }
        if set_congestion_control(sock.fd, b"reno") && set_congestion_control(sock.fd, &name) {
            renewed += 1;
        }
    }
    renewed
}

/// BBR's bandwidth model of `fd` (bit/s), from `TCP_CC_INFO`.
fn bbr_bandwidth_bps(fd: libc::c_int) -> Option<u64> {
    // struct tcp_bbr_info: bbr_bw_lo, bbr_bw_hi, bbr_min_rtt, bbr_pacing_gain, bbr_cwnd_gain.
    let mut info = [0u32; 5];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: info is writable for len bytes; the kernel writes at most len.
    let ret = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, TCP_CC_INFO, info.as_mut_ptr().cast(), &mut len) };
    if ret != 0 || (len as usize) < 8 {
        return None;
    }
    let bytes_per_s = u64::from(info[0]) | (u64::from(info[1]) << 32);
    Some(bytes_per_s.saturating_mul(8))
}

/// The name of `fd`'s congestion control algorithm.
fn congestion_control(fd: libc::c_int) -> Option<Vec<u8>> {
    let mut name = [0u8; CA_NAME_MAX];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: name is writable for len bytes; the kernel writes at most len.
    let ret = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_mut_ptr().cast(), &mut len) };
    if ret != 0 {
        return None;
    }
    let name = &name[..(len as usize).min(CA_NAME_MAX)];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    (end > 0).then(|| name[..end].to_vec())
}

/// Sets `fd`'s congestion control algorithm to `name`.
fn set_congestion_control(fd: libc::c_int, name: &[u8]) -> bool {
    // SAFETY: the kernel reads at most name.len() bytes of a live slice.
    let ret = unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_ptr().cast(), name.len() as _) };
    ret == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    /// A connected pair on loopback between `ip` and itself (not 127.0.0.1,
    /// which other tests of this binary count their connections to), both
    /// ends in BBR; None where the kernel has no BBR for this process.
    fn bbr_pair(ip: &str) -> Option<(TcpStream, TcpStream, u16)> {
        let l = TcpListener::bind((ip, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let c = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        c.bind(&std::net::SocketAddr::new(addr.ip(), 0).into()).unwrap();
        c.connect(&addr.into()).unwrap();
        let (s, _) = l.accept().unwrap();
        let c: TcpStream = c.into();
        let both = set_congestion_control(c.as_raw_fd(), b"bbr") && set_congestion_control(s.as_raw_fd(), b"bbr");
        if !both {
            eprintln!("tcp_renew: SKIPPED: no bbr on this kernel for this process");
        }
        both.then_some((c, s, addr.port()))
    }

    #[test]
    fn renews_bbr_with_no_bandwidth_model_and_leaves_a_measured_one() {
        let Some((mut c, mut s, port)) = bbr_pair("127.0.0.3") else { return };
        let peer: IpAddr = "127.0.0.3".parse().unwrap();
        // A fresh connection has no samples yet: a model of 0, renewed (both ends are this process's).
        assert_eq!(bbr_bandwidth_bps(c.as_raw_fd()), Some(0));
        // As control connections (the listener's port) they are left alone.
        assert_eq!(renew_congestion_control(&[peer], port), 0);
        assert_eq!(renew_congestion_control(&[peer], 0), 2);
        assert_eq!(congestion_control(c.as_raw_fd()).as_deref(), Some(b"bbr".as_slice()), "the algorithm is kept");
        assert_eq!(congestion_control(s.as_raw_fd()).as_deref(), Some(b"bbr".as_slice()));
        // Loopback measured both ways: far above the floor, left alone.
        let mut buf = vec![0u8; 1 << 20];
        for _ in 0..8 {
            c.write_all(&buf).unwrap();
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
            c.read_exact(&mut buf).unwrap();
        }
        let bw = bbr_bandwidth_bps(c.as_raw_fd()).unwrap();
        assert!(bw >= POLICED_BELOW_BPS, "loopback's model {bw} bit/s");
        assert_eq!(renew_congestion_control(&[peer], 0), 0, "a measured model is left alone");
        assert_eq!(renew_congestion_control(&["192.0.2.1".parse().unwrap()], 0), 0);
        assert_eq!(renew_congestion_control(&[], 0), 0);
    }

    #[test]
    fn other_algorithms_are_left_alone() {
        let Some((c, s, _)) = bbr_pair("127.0.0.2") else { return };
        assert!(set_congestion_control(c.as_raw_fd(), b"reno") && set_congestion_control(s.as_raw_fd(), b"reno"));
        assert_eq!(bbr_bandwidth_bps(c.as_raw_fd()), None, "reno has no model");
        assert_eq!(renew_congestion_control(&["127.0.0.2".parse().unwrap()], 0), 0);
    }
}
