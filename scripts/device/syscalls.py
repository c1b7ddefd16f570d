#!/usr/bin/env python3
"""A census of the system calls tally's processes make, per byte moved.

    perf record -e raw_syscalls:sys_enter,raw_syscalls:sys_exit -a -o sc.data -- sleep S
    perf script -i sc.data -F comm,pid,tid,event,trace | scripts/device/syscalls.py S

Groups the recorded calls by process role (a server: a process with
`lcore-*` threads; a rank: any other process with `tally*` threads, which
includes `bench cluster --mode tcp`'s stream processes) and by thread name
(`lcore`, `rail` for `tally-rail*`, else the name), and prints for each role
the calls per second per process, the calls per MiB the role's sends and
receives moved (both directions together: the figure to compare between
modes that move different bytes), and the busiest calls with their share
that returned EAGAIN, the share of `epoll_wait`/`poll` that found nothing
(an empty progress call of libfabric's tcp provider), and the mean bytes a
successful read or write moved. Why: at 16 Gbit/s the kernel's work is most
of a worker's CPU (docs/measurements.md), and a census says how much of it
is calls that move nothing. Every call's number is taken as x86-64's.
"""
import collections
import re
import sys

NAMES = {
    0: "read", 1: "write", 7: "poll", 19: "readv", 20: "writev", 24: "sched_yield",
    35: "nanosleep", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg",
    202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 233: "epoll_ctl",
    271: "ppoll", 281: "epoll_pwait", 299: "recvmmsg", 307: "sendmmsg", 441: "epoll_pwait2",
}
# Calls whose positive return is payload bytes (eventfd and socketpair
# signals move 1-8 bytes: they count as calls, not as bytes).
MOVES = {"readv", "writev", "sendto", "recvfrom", "sendmsg", "recvmsg"}
WAITS = {"epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll"}
EXIT = re.compile(r"^\s*(\S+)\s+(\d+)/(\d+)\s+raw_syscalls:sys_(enter|exit):\s+NR (\d+)(?: = (-?\d+))?")
EAGAIN = -11


def census(lines):
    comms = collections.defaultdict(set)
    calls, again, empty, moved, ok = (collections.Counter() for _ in range(5))
    for line in lines:
        m = EXIT.match(line)
        if not m:
            continue
        comm, pid, _tid, ev, nr, ret = m.groups()
        comms[pid].add(comm)
        if ev != "exit":
            continue
        name = NAMES.get(int(nr), f"nr{nr}")
        thread = "lcore" if comm.startswith("lcore") else "rail" if comm.startswith("tally-rail") else comm
        k = (pid, thread, name)
        calls[k] += 1
        r = int(ret)
        if r == EAGAIN:
            again[k] += 1
        elif r == 0 and name in WAITS:
            empty[k] += 1
        elif r > 0 and name in MOVES:
            moved[k] += r
            ok[k] += 1
    return comms, calls, again, empty, moved, ok


def role_of(names):
    if any(c.startswith("lcore") for c in names):
        return "server"
    return "rank" if any(c.startswith("tally") for c in names) else None


def main():
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    comms, calls, again, empty, moved, ok = census(sys.stdin)
    rows = collections.defaultdict(lambda: [0, 0, 0, 0, 0])
    procs = collections.defaultdict(set)
    for (pid, thread, name), n in calls.items():
        role = role_of(comms[pid])
        if role is None:
            continue
        procs[role].add(pid)
        r = rows[(role, thread, name)]
        k = (pid, thread, name)
        r[0] += n
        r[1] += again[k]
        r[2] += empty[k]
        r[3] += moved[k]
        r[4] += ok[k]
    for role in ("rank", "server"):
        n = len(procs[role])
        if not n:
            continue
        mine = sorted(((k, v) for k, v in rows.items() if k[0] == role), key=lambda kv: -kv[1][0])
        total = sum(v[0] for _, v in mine)
        mib = sum(v[3] for _, v in mine) / 2**20
        per_mib = f", {total / mib:.0f} per MiB moved ({mib / n / secs / 1024:.2f} GiB/s in+out each)" if mib else ""
        print(f"  {role}s: {n} processes, {total / n / secs:,.0f} calls/s each{per_mib}")
        for (_, thread, name), (c, ag, em, b, o) in mine[:14]:
            if c / n / secs < 50:
                continue
            extra = f", {100 * ag / c:.0f}% EAGAIN" if ag else ""
            extra += f", {100 * em / c:.0f}% empty" if em else ""
            extra += f", {b / o / 1024:.1f} KiB a call" if o else ""
            print(f"    {thread:>14} {name:<13} {c / n / secs:>10,.0f}/s{extra}")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        pass
