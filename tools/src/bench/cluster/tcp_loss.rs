//! Loss on the emulated links: TCP's retransmissions and retransmission
//! timeouts in the hosts' namespaces over each timed loop, and what the tbf
//! qdiscs dropped over each rate.
//!
//! A shaped link drops a packet when its tbf queue holds more than
//! `--tbf-latency` of traffic; TCP then retransmits, and where the loss
//! leaves nothing to trigger a fast retransmit it waits out its
//! retransmission timeout, 200 ms at least. One such wait in a loop of
//! 4 ms all-reduces moves the figure by far more than anything tally does,
//! so the rows say how many there were (`tcp_timeouts`), read beside the
//! figure, not guessed at.
//!
//! TCP also retransmits where no tbf dropped anything, when a packet is lost
//! elsewhere on the way: a veth's or the bridge's backlog (`dev_drops`, the
//! drop columns of every interface's receive and transmit counters), or a
//! receiving socket (`sock_drops`: its backlog, receive or out-of-order
//! queue full, or pruned), so the rows count those too. And a timeout can
//! fire with nothing lost, when a segment waits in a queue longer than the
//! timeout (a deep tbf queue): the kernel counts the timeouts it later
//! found spurious (`spurious_rtos`) and the retransmissions of segments
//! still queued in their own host (`rtx_host_queued`).
//!
//! Where nothing is lost, TCP still retransmits what arrives out of order
//! (`reordered`; the receiver reports the duplicates, `dsacks`), and a
//! receiver whose reader falls behind closes its window (`zero_windows`):
//! a sender with nothing in flight that may not send waits for TCP's probe
//! 0, 200 ms at least. (The senders caught so on the emulated links had
//! their windows open and were held by BBR's pacing: docs/measurements.md,
//! "BBR's pacing held the sockets".)
//!
//! Each namespace has its own counters (`/proc/<pid>/net/snmp`, `.../netstat`
//! and `.../dev` show those of `pid`'s namespace), read through one process
//! that lives in it (a server, a worker): no process is started per loop.
use super::netns::Iproute;
use serde::Serialize;

/// What the namespaces' network counters say was lost, summed over the
/// namespaces read: TCP's retransmissions and timeouts, the interfaces' drops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetLoss {
    /// Segments retransmitted (`Tcp: RetransSegs`).
    pub retrans: u64,
    /// Retransmission timeouts that fired (`TcpExt: TCPTimeouts`).
    pub timeouts: u64,
    /// Packets the interfaces dropped, receiving or sending (`/proc/net/dev`).
    pub dev_drops: u64,
    /// Segments the receiving sockets dropped (`TcpExt:` [`SOCKET_DROPS`]).
    pub sock_drops: u64,
    /// Timeouts found spurious afterwards (`TcpExt: TCPSpuriousRTOs`).
    pub spurious_rtos: u64,
    /// Retransmissions of segments still queued in their host
    /// (`TcpExt: TCPSpuriousRtxHostQueues`).
    pub rtx_host_queued: u64,
    /// Tail loss probes sent (`TcpExt: TCPLossProbes`): where one segment
    /// alone is in flight the probe waits about 200 ms (1.5 round trips
    /// plus the longest delayed ACK), so each is a wait as long as a
    /// timeout's that `timeouts` does not count.
    pub loss_probes: u64,
    /// Times a sender learnt its segments arrived out of order
    /// (`TcpExt: TCPSACKReorder`, `TCPTSReorder`, `TCPRenoReorder`): what
    /// sets off fast retransmissions where nothing was lost.
    pub reordered: u64,
    /// Retransmissions the receiver already had (`TcpExt: TCPDSACKRecv`):
    /// spurious ones.
    pub dsacks: u64,
    /// Times a receiver closed its window (`TcpExt: TCPToZeroWindowAdv`):
    /// its reader fell behind, and the sender waits for it.
    pub zero_windows: u64,
}

/// The `TcpExt:` counters of segments a receiving socket dropped: its
/// backlog or receive queue full, its out-of-order queue full or pruned,
/// its window closed. A kernel that lacks one counts it as 0.
pub const SOCKET_DROPS: [&str; 6] = ["TCPBacklogDrop", "TCPRcvQDrop", "RcvPruned", "OfoPruned", "TCPOFODrop", "TCPZeroWindowDrop"];

impl NetLoss {
    /// The counters of the namespaces `pids` live in, summed; None if one
    /// cannot be read (the process exited).
    pub fn of(pids: &[u32]) -> Option<NetLoss> {
        let mut sum = NetLoss::default();
        for pid in pids {
            let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).ok();
            sum = sum.plus(NetLoss::parse(&read("snmp")?, &read("netstat")?, &read("dev")?)?);
        }
        Some(sum)
    }

    /// The counters of namespaces `names`, summed, read by a `cat` in each
    /// (between loops, where no process of the namespace may be left).
    pub(super) fn of_namespaces(tools: &Iproute, names: &[String]) -> Option<NetLoss> {
        let mut sum = NetLoss::default();
        for ns in names {
            let read = |f: &str| tools.read_in(ns, &format!("/proc/net/{f}")).ok();
            sum = sum.plus(NetLoss::parse(&read("snmp")?, &read("netstat")?, &read("dev")?)?);
        }
        Some(sum)
    }

    fn parse(snmp: &str, netstat: &str, dev: &str) -> Option<NetLoss> {
        let ext = |name: &str| counter(netstat, "TcpExt:", name).unwrap_or(0);
        Some(NetLoss {
            retrans: counter(snmp, "Tcp:", "RetransSegs")?,
            timeouts: counter(netstat, "TcpExt:", "TCPTimeouts")?,
            dev_drops: dev_drops(dev)?,
            sock_drops: SOCKET_DROPS.iter().map(|n| ext(n)).sum(),
            spurious_rtos: ext("TCPSpuriousRTOs"),
            rtx_host_queued: ext("TCPSpuriousRtxHostQueues"),
            loss_probes: ext("TCPLossProbes"),
            reordered: ["TCPSACKReorder", "TCPTSReorder", "TCPRenoReorder"].iter().map(|n| ext(n)).sum(),
            dsacks: ext("TCPDSACKRecv"),
            zero_windows: ext("TCPToZeroWindowAdv"),
        })
    }

    /// Field by field, `f` of the two.
    fn zip(self, o: NetLoss, f: impl Fn(u64, u64) -> u64) -> NetLoss {
        NetLoss {
            retrans: f(self.retrans, o.retrans),
            timeouts: f(self.timeouts, o.timeouts),
            dev_drops: f(self.dev_drops, o.dev_drops),
            sock_drops: f(self.sock_drops, o.sock_drops),
            spurious_rtos: f(self.spurious_rtos, o.spurious_rtos),
            rtx_host_queued: f(self.rtx_host_queued, o.rtx_host_queued),
            loss_probes: f(self.loss_probes, o.loss_probes),
            reordered: f(self.reordered, o.reordered),
            dsacks: f(self.dsacks, o.dsacks),
            zero_windows: f(self.zero_windows, o.zero_windows),
        }
    }

    fn plus(self, o: NetLoss) -> NetLoss {
        self.zip(o, |a, b| a + b)
    }

    /// What happened between `before` and `self`.
    pub fn since(self, before: NetLoss) -> NetLoss {
        self.zip(before, u64::saturating_sub)
    }
}

/// Receive and transmit drops of every interface in a /proc/net/dev table
/// (after `name:`, the 4th and the 12th numbers); None if a line is short.
fn dev_drops(dev: &str) -> Option<u64> {
    dev.lines()
        .filter_map(|l| l.split_once(':').map(|(_, v)| v))
        .map(|v| {
            let n: Vec<&str> = v.split_whitespace().collect();
            Some(n.get(3)?.parse::<u64>().ok()? + n.get(11)?.parse::<u64>().ok()?)
        })
        .sum()
}

/// Counter `name` of a /proc/net/snmp-style table: a header line and a
/// value line, both starting with `prefix`.
fn counter(table: &str, prefix: &str, name: &str) -> Option<u64> {
    let mut lines = table.lines().filter(|l| l.starts_with(prefix));
    while let (Some(head), Some(values)) = (lines.next(), lines.next()) {
        if let Some(i) = head.split_whitespace().position(|h| h == name) {
            return values.split_whitespace().nth(i)?.parse().ok();
        }
    }
    None
}

/// What one rate's (and loss level's) loops saw on every link
/// (`ClusterOutcome::links`).
#[derive(Serialize, Debug, Clone)]
pub struct LinkLoss {
    pub link_gbit: f64,
    /// Under `--loss`: the level (as its rows say it) and what its rules dropped.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub loss: Option<RuleDrops>,
    /// Over every namespace (the hosts'; the switch's counts no TCP): segments
    /// retransmitted and retransmission timeouts.
    pub tcp_retrans: Option<u64>,
    pub tcp_timeouts: Option<u64>,
    /// Packets every tbf (both ends of every link) dropped.
    pub tbf_drops: Option<u64>,
    /// Packets the interfaces of every namespace (hosts and switch) dropped.
    pub dev_drops: Option<u64>,
    /// Over every namespace: segments the receiving sockets dropped,
    /// timeouts found spurious, retransmissions of segments still queued in
    /// their host (see [`NetLoss`]).
    pub sock_drops: Option<u64>,
    pub spurious_rtos: Option<u64>,
    pub rtx_host_queued: Option<u64>,
    /// Over every namespace: tail loss probes (see [`NetLoss::loss_probes`]).
    pub loss_probes: Option<u64>,
    /// Over every namespace: reorderings seen, spurious retransmissions,
    /// windows closed (see [`NetLoss`]).
    pub reordered: Option<u64>,
    pub dsacks: Option<u64>,
    pub zero_windows: Option<u64>,
    /// The hosts' retransmission timeout floor in ms (`--tcp-rto-min`):
    /// about how long a timeout or a lone tail's probe waits.
    pub rto_floor_ms: u32,
    /// The floor tally's servers and ranks set on their own connections
    /// (`TALLY_TCP_RTO_MIN_MS`; 0: they keep the hosts').
    pub tally_floor_ms: u32,
}

/// A `--loss` level and what its rules dropped (`loss`).
#[derive(Serialize, Debug, Clone)]
pub struct RuleDrops {
    pub loss_pct: f64,
    /// `every` link, or the host whose link.
    pub loss_link: String,
    /// What dropped them: nftables or iptables.
    pub loss_by: &'static str,
    /// Packets the rules dropped, every host's together; None where a
    /// host's could not be read.
    pub loss_drops: Option<u64>,
}

/// Packets the tbf qdiscs of namespaces `names` dropped so far.
pub(super) fn tbf_drops(tools: &Iproute, names: &[String]) -> Option<u64> {
    names.iter().map(|ns| tools.tc_out_in(ns, &["-s", "qdisc", "show"]).ok().map(|o| qdisc_drops(&o))).sum()
}

/// Packets `tc -s qdisc show` says were dropped, summed over its output.
pub(super) fn qdisc_drops(tc_output: &str) -> u64 {
    tc_output.split("(dropped ").skip(1).filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()).sum()
}

impl LinkLoss {
    /// The line a rate's table ends with.
    pub fn note(&self) -> String {
        let floor = match (self.rto_floor_ms, self.tally_floor_ms) {
            (host, t) if t > 0 && t < host => format!("{host} ms, {t} on tally's own connections,"),
            (host, _) => format!("{host} ms"),
        };
        let tcp = match (self.tcp_retrans, self.tcp_timeouts, self.loss_probes) {
            (Some(r), Some(t), Some(p)) => format!(
                "{r} TCP segments retransmitted, {t} retransmission timeouts (each a wait of {floor} or more), {p} tail loss probes (up to about {floor} each)"
            ),
            _ => "TCP's counters unreadable".into(),
        };
        let order = match (self.reordered, self.dsacks, self.zero_windows) {
            (Some(r), Some(d), Some(z)) => {
                format!("; {r} reorderings seen, {d} retransmissions found spurious, {z} receive windows closed (a reader behind)")
            }
            _ => String::new(),
        };
        let tbf = self.tbf_drops.map_or("tbf's drops unreadable".into(), |d| format!("tbf dropped {d} packets"));
        let dev = self.dev_drops.map_or("the interfaces' drops unreadable".into(), |d| format!("the interfaces dropped {d}"));
        let sock = self.sock_drops.map_or("the sockets' drops unreadable".into(), |d| format!("the receiving sockets {d}"));
        let late = match (self.spurious_rtos, self.rtx_host_queued) {
            (Some(s), Some(q)) => format!("; {s} timeouts found spurious, {q} retransmissions of segments still queued in their host"),
            _ => String::new(),
        };
        let rules = self.loss.as_ref().map_or_else(String::new, |l| {
            let n = l.loss_drops.map_or("an unreadable number of".into(), |d| d.to_string());
            let at = if l.loss_link == "every" { "every link".to_string() } else { format!("{}'s link", l.loss_link) };
            format!(" with {}% loss on {at}: the {} rules dropped {n} packets;", l.loss_pct, l.loss_by)
        });
        format!(
            "# loss on the links at {} Gbit/s:{rules} {tcp}; {tbf}, {dev}, {sock}{late}{order} (per row: tcp_retrans, tcp_timeouts, dev_drops, sock_drops in --json)",
            self.link_gbit
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_found_by_name_in_their_table() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 1068 4\n";
        assert_eq!(counter(snmp, "Tcp:", "RetransSegs"), Some(1068));
        assert_eq!(counter(snmp, "Tcp:", "Nothing"), None);
        let netstat = "TcpExt: SyncookiesSent TCPTimeouts\nTcpExt: 0 37\nIpExt: InNoRoutes\nIpExt: 0\n";
        assert_eq!(counter(netstat, "TcpExt:", "TCPTimeouts"), Some(37));
        // The socket counters, where the kernel has them (absent ones count 0).
        let ext = "TcpExt: TCPTimeouts RcvPruned TCPSpuriousRTOs TCPBacklogDrop TCPOFODrop TCPSpuriousRtxHostQueues TCPLossProbes\n\
                   TcpExt: 5 1 2 3 4 6 11\n";
        let l = NetLoss::parse("Tcp: RetransSegs\nTcp: 9\n", ext, "  eth0: 0 0 0 1 0 0 0 0 0 0 0 1\n").unwrap();
        assert_eq!(
            l,
            NetLoss {
                retrans: 9,
                timeouts: 5,
                dev_drops: 2,
                sock_drops: 8,
                spurious_rtos: 2,
                rtx_host_queued: 6,
                loss_probes: 11,
                ..NetLoss::default()
            }
        );
        let dev =
            "Inter-|   Receive  |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop\n\
                       lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n  eth0: 900 9 0 5 0 0 0 0 800 8 0 2 0 0 0 0\n";
        assert_eq!(dev_drops(dev), Some(7));
        assert_eq!(dev_drops("  eth0: 1 2 3\n"), None);
        // This process's namespace, read as the cluster's are.
        assert!(NetLoss::of(&[std::process::id()]).is_some());
        assert_eq!(NetLoss::of(&[u32::MAX]), None);
    }

    #[test]
    fn drops_are_summed_over_every_qdisc() {
        let tc =
            "qdisc tbf 8001: root refcnt 2 rate 32Gbit burst 8Mb lat 50ms\n Sent 1 bytes 2 pkt (dropped 12, overlimits 3 requeues 0)\n\
                  qdisc tbf 8002: root\n Sent 5 bytes 6 pkt (dropped 30, overlimits 0 requeues 0)\n";
        assert_eq!(qdisc_drops(tc), 42);
        assert_eq!(qdisc_drops(""), 0);
        let after = NetLoss {
            retrans: 10,
            timeouts: 2,
            dev_drops: 5,
            sock_drops: 3,
            spurious_rtos: 1,
            rtx_host_queued: 7,
            loss_probes: 9,
            reordered: 20,
            dsacks: 8,
            zero_windows: 4,
        };
        let before = NetLoss {
            retrans: 4,
            timeouts: 2,
            dev_drops: 1,
            sock_drops: 1,
            spurious_rtos: 0,
            rtx_host_queued: 2,
            loss_probes: 3,
            reordered: 5,
            dsacks: 8,
            zero_windows: 1,
        };
        assert_eq!(
            after.since(before),
            NetLoss {
                retrans: 6,
                timeouts: 0,
                dev_drops: 4,
                sock_drops: 2,
                spurious_rtos: 1,
                rtx_host_queued: 5,
                loss_probes: 6,
                reordered: 15,
                dsacks: 0,
                zero_windows: 3
            }
        );
        assert_eq!(after.plus(before).since(before), after);
    }
}
