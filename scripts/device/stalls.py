#!/usr/bin/env python3
"""Which threads were kept off a CPU, and for how long, while a run goes on.

    stalls.py OUT_FILE [PERIOD_MS]

Samples /proc/PID/task/TID/schedstat (CPU time, time spent runnable but
waiting for a CPU) of every thread of the tally and Python processes every
PERIOD_MS (default 10) until SIGTERM or SIGINT, then writes to OUT_FILE, per
thread that ran at all: its CPU share, the longest wait for a CPU within one
period, how many periods it waited 5 ms or more, and the longest stretch of
periods in which it neither ran nor waited to run (asleep or blocked) while
its mean share was over a tenth of a core. With a process's role (server,
NCCL rank, bench) and the thread's name (`lcore-0`, `tally-rail2`, NCCL's
own). A rank whose all-reduces are late at every server (the servers'
job-end lines) either had a thread kept off a CPU (long waits here) or one
that slept or blocked (long idle stretches), or neither (then the cause is
not a thread of these processes). Reads only /proc: the device image has no
procps. A long wait in one period can also be the sampler's own lateness:
the header says how late the sampler was at most, to compare, and how much
time the hypervisor took from each virtual CPU (steal, /proc/stat): the
most in one period on any CPU, and the periods in which some CPU lost 5 ms
or more, each with its wall-clock time (the first 40). In a VM, a virtual
CPU the host preempts stops whatever runs on it without the guest's
scheduler (or /proc/pressure/cpu) seeing a wait.
"""
import os
import signal
import sys
import time


def role(pid):
    try:
        argv = [a.decode(errors="replace") for a in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")]
    except OSError:
        return None
    text = " ".join(argv)
    if "tally" in os.path.basename(argv[0]) and "server" in argv:
        return "server"
    if "python" in os.path.basename(argv[0]):
        rank = ""
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            for kv in env:
                if kv.startswith(b"TALLY_CLUSTER_RANK="):
                    rank = kv.split(b"=", 1)[1].decode()
        except OSError:
            pass
        return f"rank{rank}" if rank else "python"
    if "tally" in text:
        return "tally"
    return None


def sample(roles, recheck):
    """{(pid, tid): (cpu_ns, wait_ns)} now; `roles` caches each pid's role
    (one without a role is looked at again where `recheck`: `ip netns exec`
    becomes the server or the rank it starts, under the same pid)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == str(os.getpid()):
            continue
        if pid not in roles or (recheck and roles[pid] is None):
            roles[pid] = role(pid)
        if roles[pid] is None:
            continue
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                cpu, wait, _ = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()
                out[(pid, tid)] = (int(cpu), int(wait))
        except (OSError, ValueError):
            continue
    return out


def steal_ms():
    """{cpu: steal time in ms} now, from /proc/stat (USER_HZ ticks)."""
    out = {}
    tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
    try:
        for line in open("/proc/stat"):
            f = line.split()
            if f and f[0].startswith("cpu") and f[0] != "cpu" and len(f) > 8:
                out[f[0]] = int(f[8]) * tick_ms
    except OSError:
        pass
    return out


def name(pid, tid):
    try:
        return open(f"/proc/{pid}/task/{tid}/comm").read().strip()
    except OSError:
        return "?"


def clock(t):
    """Wall-clock time `t` as HH:MM:SS.mmm (UTC), as tally's lines give it."""
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}"


def sampler_args():
    """(OUT argument, period in s, a list that SIGTERM or SIGINT makes non-empty)."""
    period = (float(sys.argv[2]) if len(sys.argv) > 2 else 10.0) / 1000.0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    return sys.argv[1], period, stop


def main():
    out_file, period, stop = sampler_args()
    roles, names = {}, {}
    prev, prev_t = sample(roles, True), time.monotonic()
    last_recheck = prev_t
    t0 = prev_t
    # per thread: [cpu_ns, max_wait_ns, waits_over_5ms, idle_run, max_idle_run, max_idle_at]
    st = {}
    late_max = 0.0
    steal_at = []  # (wall-clock time, ms, cpu) of each period a CPU lost 5 ms or more
    steal_prev, steal_max, steal_periods, steal_total = steal_ms(), (0.0, "-", 0.0), 0, 0.0
    while not stop:
        time.sleep(period)
        recheck = time.monotonic() - last_recheck >= 0.5
        now, now_t = sample(roles, recheck), time.monotonic()
        if recheck:
            last_recheck = now_t
        late_max = max(late_max, now_t - prev_t - period)
        steal_now = steal_ms()
        worst = max(((steal_now[c] - steal_prev.get(c, steal_now[c]), c) for c in steal_now), default=(0.0, "-"))
        steal_total += sum(steal_now[c] - steal_prev.get(c, steal_now[c]) for c in steal_now)
        if worst[0] > steal_max[0]:
            steal_max = (worst[0], worst[1], now_t - t0)
        steal_periods += worst[0] >= 5.0
        if worst[0] >= 5.0:
            steal_at.append((time.time(), worst[0], worst[1]))
        steal_prev = steal_now
        for key, (cpu, wait) in now.items():
            if key not in prev:
                names[key] = name(*key)
                continue
            d_cpu, d_wait = cpu - prev[key][0], wait - prev[key][1]
            s = st.setdefault(key, [0, 0, 0, 0, 0, 0.0])
            s[0] += d_cpu
            s[1] = max(s[1], d_wait)
            s[2] += d_wait >= 5_000_000
            if d_cpu == 0 and d_wait == 0:
                s[3] += 1
                if s[3] > s[4]:
                    s[4], s[5] = s[3], now_t - t0
            else:
                s[3] = 0
            names.setdefault(key, name(*key))
        prev, prev_t = now, now_t
    span = max(prev_t - t0, 1e-9)
    with open(out_file, "w") as f:
        f.write(f"# {span:.1f} s sampled every {period * 1e3:g} ms; the sampler was up to {late_max * 1e3:.1f} ms late\n")
        f.write(
            f"# steal (the hypervisor's): {steal_total:.0f} ms over all CPUs, at most {steal_max[0]:.0f} ms in one period "
            f"({steal_max[1]}, at {steal_max[2]:.1f} s), {steal_periods} periods with a CPU losing 5 ms or more\n"
        )
        for t, ms, cpu in steal_at[:40]:
            f.write(f"# steal {ms:.0f} ms on {cpu}, period ending {clock(t)} UTC\n")
        f.write(f"{'role':<8} {'pid':>7} {'tid':>7} {'thread':<16} {'cpu %':>6} {'max wait ms':>11} {'waits>=5ms':>10} {'max idle ms':>11} {'at s':>6}\n")
        rows = [(k, s) for k, s in st.items() if s[0] > 0]
        rows.sort(key=lambda r: -r[1][1])
        for (pid, tid), s in rows:
            share = 100.0 * s[0] / 1e9 / span
            if share < 1.0 and s[1] < 5_000_000:
                continue
            idle = s[4] * period * 1e3 if share >= 10.0 else 0.0
            f.write(
                f"{roles.get(pid) or '?':<8} {pid:>7} {tid:>7} {names.get((pid, tid), '?'):<16} {share:>6.0f} "
                f"{s[1] / 1e6:>11.1f} {s[2]:>10} {idle:>11.0f} {s[5] if idle else 0:>6.1f}\n"
            )


if __name__ == "__main__":
    main()
