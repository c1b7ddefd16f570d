#!/usr/bin/env python3
"""What the device parts measure with Python rather than with tally: kept apart
from summarise.py because these run beside a part's runs (or are the run),
while summarise.py only reads the files afterwards.

    python3 scripts/device/probes.py phys-cores
        the first hardware thread of each physical core, space separated
    python3 scripts/device/probes.py lcore-sampler PID METRICS_PORT RANK_CORES
        every 0.1 s until PID ends: time, the lcore threads' CPU seconds, the
        bytes they took in (/metrics), the ranks' cores' busy seconds
    python3 scripts/device/probes.py tcp-ceiling
        plain TCP sockets on loopback, as tally's tcp p2p bench streams
"""
import glob
import os
import re
import socket
import sys
import threading
import time
import urllib.request


def phys_cores():
    # Cores whose sibling list was seen already are SMT threads of an earlier one.
    seen, firsts = set(), []
    for d in sorted(glob.glob('/sys/devices/system/cpu/cpu[0-9]*'), key=lambda p: int(re.findall(r'\d+$', p)[0])):
        try:
            sib = open(d + '/topology/thread_siblings_list').read().strip()
        except OSError:
            continue
        if sib not in seen:
            seen.add(sib)
            firsts.append(int(re.findall(r'\d+$', d)[0]))
    print(' '.join(map(str, firsts)))


def lcore_sampler(pid, mport, rcores):
    # Every 0.1 s: the lcore threads' CPU time and the bytes they took in, so
    # that the loop's lcore use can be told apart from the join (lcores below
    # 1.0 each: the ranks, not the server, set the figure).
    tick = os.sysconf("SC_CLK_TCK")
    lo, hi = map(int, rcores.split("-"))

    def rank_busy():
        # Busy time of the ranks' cores (everything but idle and iowait).
        t = 0
        for l in open("/proc/stat"):
            f = l.split()
            if f[0].startswith("cpu") and f[0][3:].isdigit() and lo <= int(f[0][3:]) <= hi:
                v = list(map(int, f[1:]))
                t += sum(v) - v[3] - v[4]
        return t / tick

    while os.path.exists(f"/proc/{pid}"):
        try:
            cpu = 0
            for t in glob.glob(f"/proc/{pid}/task/*"):
                if open(f"{t}/comm").read().startswith("lcore-"):
                    f = open(f"{t}/stat").read().rsplit(")", 1)[1].split()
                    cpu += int(f[11]) + int(f[12])
            m = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=1).read().decode()
            b = sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith("tally_lcore_bytes_in_total{"))
            print(time.time(), cpu / tick, b, rank_busy(), flush=True)
        except Exception:
            pass
        time.sleep(0.1)


def tcp_ceiling():
    # The kernel's own figure: 4 leaves x 2 hubs, each pair a TCP connection
    # streaming 1 MiB writes both ways, one thread per endpoint as tally's.
    N, CH, SECS = 8, 1 << 20, 3.0
    buf = bytearray(CH)
    done = [0] * (2 * N)

    def pump(s, i, stop):
        mv = memoryview(buf)
        while time.time() < stop:
            s.sendall(mv)
            done[i] += CH

    def drain(s, i, stop):
        b = bytearray(CH)
        while time.time() < stop + 0.5:
            n = s.recv_into(b)
            if not n:
                break
            done[i] += n

    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    port = ls.getsockname()[1]
    pairs = []
    for _ in range(N):
        a = socket.create_connection(("127.0.0.1", port))
        b, _ = ls.accept()
        pairs.append((a, b))
    stop = time.time() + SECS
    ts = []
    for k, (a, b) in enumerate(pairs):
        for s, i, f in ((a, 2 * k, pump), (b, 2 * k + 1, drain)):
            t = threading.Thread(target=f, args=(s, i, stop))
            t.start()
            ts.append(t)
    time.sleep(SECS + 0.2)
    for a, b in pairs:
        a.close()
    for t in ts:
        t.join(2)
    sent = sum(done[0::2]) / SECS / 1e9
    print(f"python TCP (GIL-bound, a floor for the kernel): {N} connections one way, {sent:.2f} GB/s in all, {sent/N:.2f} per connection")


if __name__ == "__main__":
    kinds = {"phys-cores": phys_cores, "lcore-sampler": lcore_sampler, "tcp-ceiling": tcp_ceiling}
    if len(sys.argv) < 2 or sys.argv[1] not in kinds:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(kinds)} ARG...")
    kinds[sys.argv[1]](*sys.argv[2:])
