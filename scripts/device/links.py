#!/usr/bin/env python3
"""What each emulated host's link and TCP sockets did, every few ms, while a
`tally bench cluster` run goes on.

    links.py OUT_PREFIX [PERIOD_MS]

Finds every network namespace that holds a tally server or an NCCL rank
(a Python process with TALLY_CLUSTER_RANK), names it as `ip netns` does, and
samples every PERIOD_MS (default 10), through one process inside it, until
SIGTERM or SIGINT:
  - eth0's bytes sent and received (/proc/PID/net/dev): the host's uplink
    after its tbf, and its downlink;
  - its TCP sockets (/proc/PID/net/tcp): bytes written but not yet
    acknowledged (tx_queue, which holds the unsent too), unread bytes, and
    sockets with the retransmission timer armed after a timeout (retrnsmt);
  - TcpExt's loss probes and timeouts, and Tcp's retransmitted segments.
Writes OUT_PREFIX.csv.gz (one row per host per period, with the wall-clock
time, to match against the servers' job-end lines and the plugin's piece
report, which give theirs) and OUT_PREFIX.txt: per host, the periods in which
its sockets held data yet its uplink sent nothing (a stalled sender: tbf,
TCP's window or timers, or no CPU for the softirq), the longest such stretch
and when it ended, its retransmissions, and every TCP counter of COUNTED
that each run moved; and OUT_PREFIX-held.txt: in each such period, each socket that held
unacknowledged bytes, with its timer (which, and when it fires), timeouts,
rto, ato and congestion window; where that timer is probe 0 (armed when
nothing is in flight and the socket may not send: a zero window from the
receiver, or its own queue below TCP full, or pacing), both ends of the
socket as `ss -tmi` shows them (TALLY_IPROUTE's ss, else the PATH's).
"""
import gzip
import os
import re
import subprocess
import time

from stalls import clock, role, sampler_args


def netns_names():
    """{netns inode: name} from /var/run/netns (bind mounts of the nsfs)."""
    out = {}
    try:
        for n in os.listdir("/var/run/netns"):
            try:
                out[os.stat(f"/var/run/netns/{n}").st_ino] = n
            except OSError:
                pass
    except OSError:
        pass
    return out


def netns_of(pid):
    """The inode of `pid`'s network namespace; None once it has exited."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def hosts(roles, known):
    """Adds to `known` ({netns name: pid}) a process of each namespace that
    holds a server or a rank."""
    names = netns_names()
    taken = {netns_of(p) for p in known.values()}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        if pid not in roles or roles[pid] is None:
            roles[pid] = role(pid)
        r = roles[pid]
        if r is None or not (r == "server" or r.startswith("rank")):
            continue
        ino = netns_of(pid)
        if ino is None or ino in taken or ino not in names:
            continue
        taken.add(ino)
        known[names[ino]] = pid


def counters(text, table):
    """{field: value} of one `Table: names` / `Table: values` pair of
    /proc/net/snmp or /proc/net/netstat."""
    lines = [line.split() for line in text.splitlines() if line.startswith(table + ":")]
    if len(lines) < 2:
        return {}
    return dict(zip(lines[0][1:], map(int, lines[1][1:])))


def hexaddr(a):
    """`0A0012C6:1CE8` as /proc/net/tcp writes it, as `198.18.0.10:7400`."""
    ip, port = a.split(":")
    return ".".join(str(int(ip[i:i + 2], 16)) for i in (6, 4, 2, 0)) + f":{int(port, 16)}"


def read_host(pid, held):
    """(tx bytes, rx bytes, unacked sum, unacked max, unread sum, sockets
    after a timeout, retransmitted segments, loss probes, timeouts) now, and
    the TCP counters; appends to `held` each socket holding unacknowledged
    bytes: (local, remote, unacked, unread, timer, when (jiffies), timeouts,
    rto, ato, cwnd, ssthresh)."""
    tx = rx = 0
    for line in open(f"/proc/{pid}/net/dev"):
        if line.strip().startswith("eth0:"):
            f = line.split(":", 1)[1].split()
            rx, tx = int(f[0]), int(f[8])
    unacked = unacked_max = unread = timed_out = 0
    with open(f"/proc/{pid}/net/tcp") as tcp:
        next(tcp)
        for line in tcp:
            f = line.split()
            if f[3] != "01":
                continue
            txq, rxq = (int(x, 16) for x in f[4].split(":"))
            if txq:
                tr, when = f[5].split(":")
                held.append((hexaddr(f[1]), hexaddr(f[2]), txq, rxq, int(tr, 16), int(when, 16), int(f[6], 16), *f[12:14], *f[15:17]))
            unacked += txq
            unacked_max = max(unacked_max, txq)
            unread += rxq
            timed_out += int(f[6], 16) > 0
    snmp = counters(open(f"/proc/{pid}/net/snmp").read(), "Tcp")
    ext = counters(open(f"/proc/{pid}/net/netstat").read(), "TcpExt")
    return (tx, rx, unacked, unacked_max, unread, timed_out, snmp.get("RetransSegs", 0),
            ext.get("TCPLossProbes", 0), ext.get("TCPTimeouts", 0)), {**snmp, **ext}


# The TCP counters worth reading per run: loss, recovery, reordering, delayed ACKs.
COUNTED = {
    "RetransSegs", "OutSegs", "InSegs", "TCPLostRetransmit", "TCPFastRetrans", "TCPSlowStartRetrans",
    "TCPTimeouts", "TCPLossProbes", "TCPLossProbeRecovery", "TCPSpuriousRTOs", "TCPSpuriousRtxHostQueues",
    "TCPDSACKRecv", "TCPDSACKOfoRecv", "TCPDSACKOldSent", "TCPDSACKUndo", "TCPSACKReorder", "TCPTSReorder",
    "TCPRenoReorder", "TCPSACKRecovery", "TCPLossUndo", "TCPPartialUndo", "TCPFullUndo", "TCPLossFailures",
    "TCPOFOQueue", "TCPOFODrop", "DelayedACKs", "DelayedACKLocked", "DelayedACKLost", "TCPAckCompressed",
    "TCPRcvQDrop", "TCPBacklogDrop", "PAWSEstab", "TCPToZeroWindowAdv", "TCPWantZeroWindowAdv",
}


def ss_view(ns, local, remote):
    """`ss -tmi` of the socket (local, remote) in namespace `ns`, on one
    line: TALLY_IPROUTE's ss (scripts/device/pack.sh's devlib/iproute, as
    bench cluster's ip), else the PATH's."""
    iproute, env = os.environ.get("TALLY_IPROUTE"), dict(os.environ)
    ss = "ss"
    if iproute:
        ss = f"{iproute}/sbin/ss"
        env["LD_LIBRARY_PATH"] = f"{iproute}/lib:" + env.get("LD_LIBRARY_PATH", "")
    try:
        out = subprocess.run([ss, "-N", ns, "-tmin", "sport", "=", ":" + local.split(":")[1], "dport", "=", ":" + remote.split(":")[1]],
                             capture_output=True, text=True, timeout=2, env=env).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"ss failed: {e}"
    return " | ".join(l.strip() for l in out.splitlines()[1:] if l.strip())


def sender_facts(view):
    """What holds a socket with probe 0 pending, from the sender's `ss -tmi`
    line: its congestion control, the peer's window (snd_wnd: 0 is a closed
    window), its bytes below TCP (skmem t: TCP small queues), in flight
    (unacked), written and not sent (notsent), ms since it last sent, and
    its pacing rate in Gbit/s. None where ss failed."""
    f = {}
    m = re.search(r"skmem:\(r\d+,rb\d+,t(\d+)", view)
    if not m:
        return None
    f["below"] = int(m.group(1))
    m = re.search(r"\) (\w+) wscale", view)
    f["cc"] = m.group(1) if m else "?"
    for key in ("snd_wnd", "unacked", "notsent", "lastsnd"):
        m = re.search(rf"\b{key}:(\d+)", view)
        f[key] = int(m.group(1)) if m else 0
    m = re.search(r"pacing_rate (\d+)bps", view)
    f["pacing"] = int(m.group(1)) / 1e9 if m else None
    return f


def probe0_line(facts):
    """One line for a run's sockets caught with probe 0 pending: how many
    had each of the causes Linux arms it for ruled out."""
    n = len(facts)
    span = lambda k: f"{min(x[k] for x in facts)}-{max(x[k] for x in facts)}"
    ccs = sorted({x["cc"] for x in facts})
    paced = [x["pacing"] for x in facts if x["pacing"] is not None]
    return (f"{n} sockets (ss, both ends): congestion control {'/'.join(ccs)}; window open {sum(x['snd_wnd'] > 0 for x in facts)}, "
            f"nothing below TCP {sum(x['below'] == 0 for x in facts)}, nothing in flight {sum(x['unacked'] == 0 for x in facts)}; "
            f"unsent {span('notsent')} B, last sent {span('lastsnd')} ms before"
            + (f", pacing {min(paced):.1f}-{max(paced):.1f} Gbit/s" if paced else ""))


def both_ends(host, local, remote):
    """The socket (local, remote) of `host` and its peer, as ss shows them:
    the sender's window from the peer (snd_wnd), what it holds queued below
    TCP (skmem t, the qdisc's and device's), and the receiver's queue,
    buffer and window. The peer's namespace is `host`'s run's (`tlyNx`) +
    s or w + index, from its address (198.18.0.(10+i): server i,
    198.18.1.(10+i): worker i)."""
    a, b = remote.split(":")[0].split(".")[2:]
    peer = host.rsplit("x", 1)[0] + "x" + ("s" if a == "0" else "w") + str(int(b) - 10)
    sender = ss_view(host, local, remote)
    return f"#   sender {host}: {sender}\n#   receiver {peer}: {ss_view(peer, remote, local)}\n", sender_facts(sender)


def main():
    prefix, period, stop = sampler_args()
    roles, known, prev = {}, {}, {}
    # per (host, pid), one per run: [periods, stalled periods, run, longest
    # run, its end, timed-out sockets seen, bytes sent, first sample, last values]
    st = {}
    last_scan = 0.0
    csv = gzip.open(prefix + ".csv.gz", "wt")
    stuck = open(prefix + "-held.txt", "w")
    stuck.write("# each period a host's uplink sent nothing while its sockets held unacknowledged bytes: those sockets\n"
                "# utc host local remote unacked unread timer(1 retransmit/loss probe, 4 probe 0) when(1/100 s) timeouts rto ato cwnd ssthresh\n")
    stuck_lines = receiver_views = 0
    probed = {}  # (host, local, remote): the sender's facts, the first time ss read it held
    csv.write("utc,host,tx_bytes,rx_bytes,unacked,unacked_max,unread,timed_out_sockets,retrans_segs,loss_probes,timeouts\n")
    while not stop:
        time.sleep(period)
        now = time.time()
        if now - last_scan >= 0.5:
            hosts(roles, known)
            last_scan = now
        for host, pid in list(known.items()):
            held = []
            try:
                v, tcp = read_host(pid, held)
            except (OSError, StopIteration, ValueError):
                del known[host]
                prev.pop(host, None)
                continue
            csv.write(f"{clock(now)},{host}," + ",".join(map(str, v)) + "\n")
            p = prev.get(host)
            prev[host] = v
            if p is None or v[0] < p[0]:
                continue
            s = st.setdefault((host, pid), [0, 0, 0, 0, "-", 0, 0, clock(now), v, tcp, tcp])
            s[8], s[10] = v, tcp
            s[0] += 1
            s[6] += v[0] - p[0]
            if v[0] == p[0] and p[2] > 0:
                s[1] += 1
                s[2] += 1
                if stuck_lines < 20000:
                    for h in held:
                        stuck.write(f"{clock(now)} {host} " + " ".join(map(str, h)) + "\n")
                        if h[4] == 4 and receiver_views < 200:
                            # A probe-0 timer pending (nothing in flight, and the socket may not
                            # send: a zero window, its queue below TCP full, or its pacing): both
                            # ends' view, and the sender's facts once per socket for the run's line.
                            text, facts = both_ends(host, h[0], h[1])
                            stuck.write(text)
                            receiver_views += 1
                            if facts and (host, h[0], h[1]) not in probed:
                                probed[(host, h[0], h[1])] = facts
                    stuck_lines += len(held)
                if s[2] > s[3]:
                    s[3], s[4] = s[2], clock(now)
            else:
                s[2] = 0
            s[5] = max(s[5], v[5])
    csv.close()
    stuck.close()
    with open(prefix + ".txt", "w") as f:
        f.write(f"# every {period * 1e3:g} ms; stalled: its sockets held unacknowledged data and eth0 sent nothing\n")
        f.write(f"{'host':<12} {'from UTC':>12} {'periods':>7} {'stalled':>7} {'longest ms':>10} {'ended UTC':>12} {'GB sent':>7} "
                f"{'retrans':>7} {'probes':>6} {'timeouts':>8} {'timed-out sockets':>17}\n")
        for (host, _), s in sorted(st.items(), key=lambda kv: (kv[1][7], kv[0][0])):
            v = s[8]
            f.write(f"{host:<12} {s[7]:>12} {s[0]:>7} {s[1]:>7} {s[3] * period * 1e3:>10.0f} {s[4]:>12} {s[6] / 1e9:>7.1f} "
                    f"{v[6]:>7} {v[7]:>6} {v[8]:>8} {s[5]:>17}\n")
        # Every TCP counter a run moved, per host (its namespace is new per
        # run), then summed over each run's hosts (`tly<pid>x...`).
        runs = {}
        for (host, _), s in sorted(st.items(), key=lambda kv: (kv[1][7], kv[0][0])):
            moved = {k: s[10][k] - s[9].get(k, 0) for k in sorted(COUNTED) if s[10].get(k, 0) != s[9].get(k, 0)}
            f.write(f"# {host} from {s[7]}: " + " ".join(f"{k}={n}" for k, n in moved.items()) + "\n")
            run = runs.setdefault(host.rsplit("x", 1)[0], {})
            for k, n in moved.items():
                run[k] = run.get(k, 0) + n
        for run, moved in runs.items():
            f.write(f"# run {run}, all hosts: " + " ".join(f"{k}={n}" for k, n in moved.items()) + "\n")
        for run in runs:
            facts = [x for (host, _, _), x in probed.items() if host.rsplit("x", 1)[0] == run]
            if facts:
                f.write(f"# run {run}, probe 0 pending: {probe0_line(facts)}\n")


if __name__ == "__main__":
    main()
