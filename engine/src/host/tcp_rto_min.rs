//! The floor of this process's TCP retransmission timers: why one lost
//! packet cost an all-reduce 200 ms, and what tally sets instead.
//!
//! When the last segment a connection sent is lost and nothing follows it,
//! no duplicate acknowledgement can report the loss: the sender learns of it
//! from a timer, the tail loss probe, which Linux arms at twice the round
//! trip plus the connection's *minimum retransmission timeout* when one
//! segment is in flight (room for a delayed acknowledgement), or from the
//! retransmission timeout itself, never shorter than that minimum. The
//! minimum is 200 ms by default, a WAN figure. agg's streams are such tails
//! all the time: a rank sends a server one piece per send credit and waits,
//! so each piece's last segment has nothing behind it, and a 16 MiB
//! all-reduce at 8 Gbit/s lasts about 17 ms. With 0.1% of the packets lost
//! (`tally bench cluster --loss 0.1`) agg fell to 0.25-0.30 of its
//! loss-free rate on the device; with the hosts' floor at 5 ms it kept
//! 0.98 of it on the 2-core machine (docs/measurements.md, "Loss").
//!
//! A process may set the floor of its own connections (`TCP_RTO_MIN_US`,
//! Linux 6.15 and later). tally does, on the connections its fabric
//! provider opened (tcp;ofi_rxm opens them itself, as a peer is first
//! sent to): every second, a server's control thread and one of the
//! process's rank watchdog threads (one walk for all its ranks,
//! [`sweep_for_ranks`]) walk this process's sockets and set the floor on each new one
//! (`TALLY_TCP_RTO_MIN_MS`, [`DEFAULT_FLOOR_MS`] by default; 0 leaves the
//! kernel's). A rank touches only its connections to its servers' endpoint
//! addresses: a training process holds other TCP connections (NCCL's
//! bootstrap, PyTorch's store) that are not tally's to change. Older
//! kernels refuse the option; the walk then stops, and says once that the
//! host can set the same floor itself (a route's `rto_min`, or
//! `net.ipv4.tcp_rto_min_us` from Linux 6.11), as docs/nccl.md tells.
//!
//! The retransmission timeout still follows the measured round trip
//! (smoothed RTT plus four deviations); the floor only stops a quiet
//! connection's timers from waiting 200 ms on a path whose round trip is
//! tens of microseconds. Nothing here is on a data path.
use super::tcp_backoff::{provider_sockets, set_int};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The floor tally sets where `TALLY_TCP_RTO_MIN_MS` does not say (ms).
/// 5 is what was measured (docs/measurements.md, "Loss"). It was off by
/// default while 1024 rank processes and their server on one 2-core machine
/// (`tests/suites/many_ranks.rs`) stalled for 30 s with it, reproducibly:
/// every rank walked its process's /proc/self/fd once a second, 64 ranks to
/// a process. One walk per process ([`sweep_for_ranks`]) passes.
pub const DEFAULT_FLOOR_MS: u32 = 5;

/// The floor used where the kernel refuses the asked one as below its
/// timer's resolution (two ticks: 8 ms at 250 Hz, 20 ms at 100 Hz).
const COARSE_FLOOR_US: libc::c_int = 20_000;

/// `TCP_RTO_MIN_US` (include/uapi/linux/tcp.h, Linux 6.15): not in the libc
/// crate yet.
const TCP_RTO_MIN_US: libc::c_int = 45;

/// The floor `TALLY_TCP_RTO_MIN_MS` asks for (ms; 0: the kernel's).
pub fn env_floor_ms() -> u32 {
    std::env::var("TALLY_TCP_RTO_MIN_MS").ok().and_then(|v| v.trim().parse::<u32>().ok()).unwrap_or(DEFAULT_FLOOR_MS)
}

/// Sets the floor on this process's new provider connections, sweep by sweep.
pub struct RtoFloor {
    floor_us: libc::c_int,
    /// The sockets set so far and open at the last sweep (inodes, sorted).
    done: Vec<u64>,
    /// The kernel has no such option (before Linux 6.15): nothing more to do.
    unsupported: bool,
}

impl RtoFloor {
    /// The floor `TALLY_TCP_RTO_MIN_MS` asks for ([`DEFAULT_FLOOR_MS`]
    /// unset); None where it is 0 (the kernel's floor stays).
    pub fn from_env() -> Option<RtoFloor> {
        RtoFloor::new(env_floor_ms())
    }

    /// A floor of `ms` (at most the kernel's 200); None for 0.
    pub fn new(ms: u32) -> Option<RtoFloor> {
        (ms > 0).then(|| RtoFloor { floor_us: (ms.min(200) * 1000) as libc::c_int, done: Vec::new(), unsupported: false })
    }

    /// Sets the floor on every provider connection not set before: those
    /// whose peer is one of `peers` (every one with None), but not to or
    /// from `control_port`. Returns how many it set.
    pub fn sweep(&mut self, peers: Option<&[IpAddr]>, control_port: u16) -> u32 {
        if self.unsupported || peers.is_some_and(|p| p.is_empty()) {
            return 0;
        }
        // The sockets set before and still open (each costs its readlink
        // only: a server of a thousand ranks holds thousands), and the rest,
        // to look at. Only those set go into `done`: one not yet connected,
        // or to a peer not yet named, is looked at again next time.
        let mut kept = Vec::with_capacity(self.done.len());
        let done = &self.done;
        let fresh: Vec<(libc::c_int, u64)> = provider_sockets(peers, control_port, |inode| match done.binary_search(&inode) {
            Ok(_) => {
                kept.push(inode);
                false
            }
            Err(_) => true,
        })
        .map(|sock| (sock.fd, sock.inode))
        .collect();
        let mut set = 0;
        for (fd, inode) in fresh {
            match self.set(fd) {
                Ok(()) => {
                    set += 1;
                    kept.push(inode);
                }
                Err(e) if e == libc::ENOPROTOOPT => {
                    log::info!(
                        "this kernel cannot lower one connection's minimum TCP retransmission timeout (TCP_RTO_MIN_US, Linux \
                         6.15+): a lost tail packet costs an all-reduce about 200 ms; the host can lower it for every connection \
                         (a route's rto_min, or net.ipv4.tcp_rto_min_us on Linux 6.11+; docs/nccl.md)"
                    );
                    self.unsupported = true;
                    return set;
                }
                // Not a TCP socket, or gone: nothing to set.
                Err(_) => {}
            }
        }
        kept.sort_unstable();
        // The sockets that closed are forgotten: their numbers may come back.
        self.done = kept;
        set
    }

    /// Sets the floor on `fd`; where the kernel's timer is too coarse for
    /// it, the coarsest floor every tick rate allows.
    fn set(&mut self, fd: libc::c_int) -> Result<(), libc::c_int> {
        if set_int(fd, TCP_RTO_MIN_US, self.floor_us) {
            return Ok(());
        }
        let err = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        if err == libc::EINVAL && self.floor_us < COARSE_FLOOR_US {
            log::debug!("the kernel refused a TCP floor of {} us (its timer's resolution); using {COARSE_FLOOR_US} us", self.floor_us);
            self.floor_us = COARSE_FLOOR_US;
            return self.set(fd);
        }
        Err(err)
    }
}

/// How often the ranks of one process walk its sockets, all of them
/// together ([`sweep_for_ranks`]).
pub const RANK_SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How often a process walks while a job's connections are being opened
/// (a rank asking `soon`, a server after an admission): for [`SETTLE`]
/// after a join or a rejoin. Until a walk finds a new connection, a lost
/// tail on it waits the kernel's 200 ms (`client::tcp_floor` says what that cost).
pub const RANK_SWEEP_SOON: Duration = Duration::from_millis(50);

/// How long after a join or a rejoin the walks come every [`RANK_SWEEP_SOON`].
pub const SETTLE: Duration = Duration::from_secs(3);

/// The ranks' walk of this process's sockets, one for the whole process.
/// A process may hold many ranks (`tally bench allreduce --ranks 64`, the
/// load generator `tests/suites/many_ranks.rs` runs 16 of), each with its
/// own client: walked once a second per rank, 1024 ranks on a 2-core host
/// read /proc/self/fd about 200,000 times a second.
static RANK_SWEEP: Mutex<RankSweep> = Mutex::new(RankSweep { floor: None, peers: Vec::new(), last: None });

/// The ranks' shared walk: the peers asked for since the last one, and
/// when that ran.
struct RankSweep {
    /// The floor of the first rank that asked (every rank reads the same
    /// `TALLY_TCP_RTO_MIN_MS`; a later one asking another is not followed).
    floor: Option<RtoFloor>,
    peers: Vec<IpAddr>,
    last: Option<Instant>,
}

/// Sets the floor of `floor_ms` on this process's new connections to
/// `peers` (a rank's servers, control connections too): the peers join the
/// next walk, which runs when a rank asks at least [`RANK_SWEEP_EVERY`]
/// after the last ([`RANK_SWEEP_SOON`] where it asks `soon`: a rank whose
/// connections are being opened). Each rank asks every second, so a rank's
/// new connections get the floor within two. Returns how many this call set.
pub fn sweep_for_ranks(floor_ms: u32, peers: &[IpAddr], soon: bool) -> u32 {
    let Ok(mut shared) = RANK_SWEEP.lock() else { return 0 };
    shared.ask(floor_ms, peers, Instant::now(), soon)
}

impl RankSweep {
    fn ask(&mut self, floor_ms: u32, peers: &[IpAddr], now: Instant, soon: bool) -> u32 {
        if self.floor.is_none() {
            self.floor = RtoFloor::new(floor_ms);
        }
        for ip in peers {
            if !self.peers.contains(ip) {
                self.peers.push(*ip);
            }
        }
        // `last`: when the last walk ran.
        let every = if soon { RANK_SWEEP_SOON } else { RANK_SWEEP_EVERY };
        if self.last.is_some_and(|last| now < last + every) {
            return 0;
        }
        let Some(floor) = self.floor.as_mut() else { return 0 };
        self.last = Some(now);
        let set = floor.sweep(Some(&self.peers), 0);
        // Only the ranks that ask again (those still alive) name the next walk's peers.
        self.peers.clear();
        set
    }
}

/// Whether this kernel lets a process set one connection's floor
/// (`TCP_RTO_MIN_US`, Linux 6.15+), probed on a fresh TCP socket.
pub fn kernel_has_option() -> bool {
    // SAFETY: socket() takes no pointer; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return false;
    }
    let has = floor_of(fd).is_some();
    // SAFETY: fd is the socket opened above, closed once.
    unsafe { libc::close(fd) };
    has
}

/// The floor of `fd` as the kernel reports it (us); None where it cannot.
pub fn floor_of(fd: libc::c_int) -> Option<u32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v is writable for len bytes; the kernel writes at most len.
    let ret = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, TCP_RTO_MIN_US, (&mut v as *mut libc::c_int).cast(), &mut len) };
    (ret == 0).then_some(v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn sets_the_floor_on_connections_to_the_peers_once_and_leaves_the_control_port_alone() {
        // An address of its own: other tests of this process connect over 127.0.0.1.
        let data = TcpListener::bind("127.0.0.77:0").unwrap();
        let control = TcpListener::bind("127.0.0.77:0").unwrap();
        let c = TcpStream::connect(data.local_addr().unwrap()).unwrap();
        let (s, _) = data.accept().unwrap();
        let ctl = TcpStream::connect(control.local_addr().unwrap()).unwrap();
        let Some(before) = floor_of(c.as_raw_fd()) else {
            // Before Linux 6.15: the sweep must say so and stop.
            let mut f = RtoFloor::new(5).unwrap();
            assert_eq!(f.sweep(None, 0), 0);
            assert!(f.unsupported);
            return;
        };
        assert_eq!(before, 200_000, "the kernel's floor");
        let local: IpAddr = "127.0.0.77".parse().unwrap();
        let mut f = RtoFloor::new(5).unwrap();
        // Other peers' connections are not touched.
        assert_eq!(f.sweep(Some(&["192.0.2.1".parse().unwrap()]), 0), 0);
        assert_eq!(floor_of(c.as_raw_fd()), Some(200_000));
        let port = control.local_addr().unwrap().port();
        // The data connection to the peer, not the control one. (Its
        // accepted end's peer is 127.0.0.1, the source loopback picks.)
        assert_eq!(f.sweep(Some(&[local]), port), 1);
        let floor = floor_of(c.as_raw_fd()).unwrap();
        // Rounded to the kernel's ticks (8 ms at 250 Hz), or the coarse floor.
        assert!((5_000..=COARSE_FLOOR_US as u32).contains(&floor), "{floor}");
        assert_eq!(floor_of(s.as_raw_fd()), Some(200_000));
        assert_eq!(floor_of(ctl.as_raw_fd()), Some(200_000));
        // Done once: the next sweep sets nothing new.
        assert_eq!(f.sweep(Some(&[local]), port), 0);
        assert!(RtoFloor::new(0).is_none());
    }

    #[test]
    fn ranks_of_one_process_share_one_walk_and_each_ranks_peers_join_the_next() {
        // Addresses of their own, as above.
        let (a, b) = (TcpListener::bind("127.0.0.78:0").unwrap(), TcpListener::bind("127.0.0.79:0").unwrap());
        let ca = TcpStream::connect(a.local_addr().unwrap()).unwrap();
        let cb = TcpStream::connect(b.local_addr().unwrap()).unwrap();
        if floor_of(ca.as_raw_fd()).is_none() {
            return; // before Linux 6.15: the test above checks the refusal
        }
        let (pa, pb): (IpAddr, IpAddr) = ("127.0.0.78".parse().unwrap(), "127.0.0.79".parse().unwrap());
        let mut shared = RankSweep { floor: None, peers: Vec::new(), last: None };
        let t0 = Instant::now();
        // Rank A's ask walks at once; rank B's, within the second, waits.
        assert_eq!(shared.ask(5, &[pa], t0, false), 1);
        assert_eq!(shared.ask(5, &[pb], t0 + Duration::from_millis(300), false), 0);
        assert_eq!(floor_of(cb.as_raw_fd()), Some(200_000));
        // The next walk, whoever asks it, carries B's peer too.
        assert_eq!(shared.ask(5, &[pa], t0 + RANK_SWEEP_EVERY, false), 1);
        assert!(floor_of(cb.as_raw_fd()).unwrap() < 200_000);
        // A rank opening connections may ask sooner; nothing new, nothing set.
        let t1 = t0 + RANK_SWEEP_EVERY + RANK_SWEEP_SOON;
        assert_eq!(shared.ask(5, &[pa, pb], t1, false), 0);
        assert_eq!(shared.ask(5, &[pa, pb], t1, true), 0);
        assert_eq!(shared.last, Some(t1), "the soon walk ran");
        // A floor of 0 asks for nothing.
        let mut none = RankSweep { floor: None, peers: Vec::new(), last: None };
        assert_eq!(none.ask(0, &[pa], t0, false), 0);
    }
}
