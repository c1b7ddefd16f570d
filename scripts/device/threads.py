#!/usr/bin/env python3
"""Per-thread CPU of every tally process while a benchmark runs.

    threads.py OUT_FILE [PERIOD_S]

Samples /proc/PID/task/TID/stat of every process whose name starts `tally`
each PERIOD_S seconds (default 1) until SIGTERM or SIGINT, then writes to
OUT_FILE, per thread, the busiest window's CPU share (100 = one core) and
the mean over the windows where its process was busy, with the process's
role (server, worker, bench) and the thread's name (`tally-rail2`,
`lcore-0`, `tally` for a worker's main thread). A thread near 100 in its
busiest window is what holds a run back; the host's CPU pressure of each
window is listed too. Reads only /proc: the device image has no procps.
"""
import os
import signal
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def role(pid):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return None
    words = [a.decode(errors="replace") for a in argv]
    if "server" in words:
        return "server"
    if "allreduce" in words:
        rank = words[words.index("--rank") + 1] if "--rank" in words else "?"
        return f"worker{rank}"
    return "bench"


def sample():
    """{(pid, tid): (role, name, cpu_ticks)} for every tally thread now."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if not open(f"/proc/{pid}/comm").read().startswith("tally"):
                continue
            r = role(pid)
            for tid in os.listdir(f"/proc/{pid}/task"):
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                # The name is in parentheses and may hold spaces.
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                out[(pid, tid)] = (r, name, int(fields[11]) + int(fields[12]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def pressure():
    try:
        line = open("/proc/pressure/cpu").readline().split()
        return line[1].split("=")[1] + "%"
    except (OSError, IndexError):
        return "-"


def main():
    out_file = sys.argv[1]
    period = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    prev, prev_t = sample(), time.monotonic()
    peak, total, busy_windows, windows = {}, {}, {}, []
    while not stop:
        time.sleep(period)
        now, now_t = sample(), time.monotonic()
        dt = now_t - prev_t
        window_total = 0.0
        for key, (r, name, ticks) in now.items():
            if key not in prev:
                continue
            pct = 100.0 * (ticks - prev[key][2]) / TICK / dt
            window_total += pct
            k = (r, key[0], key[1], name)
            peak[k] = max(peak.get(k, 0.0), pct)
            if pct > 1.0:
                total[k] = total.get(k, 0.0) + pct
                busy_windows[k] = busy_windows.get(k, 0) + 1
        windows.append((window_total, pressure()))
        prev, prev_t = now, now_t
    with open(out_file, "w") as f:
        f.write(f"# {len(windows)} windows of {period:g} s; per window: all tally threads' CPU (100 = one core), CPU pressure (some avg10)\n")
        f.write("# " + " ".join(f"{t:.0f}/{p}" for t, p in windows) + "\n")
        f.write(f"{'role':<9} {'pid':>7} {'tid':>7} {'thread':<16} {'peak %':>7} {'busy mean %':>11}\n")
        for k in sorted(peak, key=lambda k: -peak[k]):
            if peak[k] < 5.0:
                continue
            mean = total.get(k, 0.0) / max(busy_windows.get(k, 0), 1)
            f.write(f"{k[0]:<9} {k[1]:>7} {k[2]:>7} {k[3]:<16} {peak[k]:>7.0f} {mean:>11.0f}\n")


if __name__ == "__main__":
    main()
