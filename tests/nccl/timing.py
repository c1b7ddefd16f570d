"""Timing all-reduces as measuring.md (and nccl-tests) define it.

t = the wall time of a loop of back-to-back all-reduces / iterations, with a
barrier before the loop only. A synchronize (or a barrier) around every
operation would add each rank's launch and release skew to every operation:
at 16 MiB on 32 Gbit/s links (4 ms per operation) that skew alone cost NCCL's
ring and CollNet alike a third of their rate. CUDA events recorded between
the operations (no synchronize) give each one's time for p50, p99 and max.

`per_op_sync=True` keeps the old method, a synchronize before and after each
operation, for when that is what is asked; callers label it.

Over the back-to-back loop the machine's CPU is read too (`host_cpu`): cores
busy and the share of the time some task waited for a CPU
(/proc/pressure/cpu), as `tally bench cluster` gives per row, since every
emulated node of tests/nccl/cluster_proof.sh shares one machine. And the
rank's own process CPU (`cpu`: user + system of every thread of the process,
NCCL's proxy and the plugin's threads included, and of the Python main thread
alone, which spins in the CUDA synchronize that ends the loop); `idle_cpu`
gives the same over a sleep with no all-reduce in flight.
"""
import os
import statistics
import time


def host_cpu():
    """(busy ticks, all ticks, microseconds some task waited for a CPU or
    None, perf_counter) of the whole machine, or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    v += [0] * (8 - len(v))
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    wait = None
    try:
        with open("/proc/pressure/cpu") as f:
            some = next(line for line in f if line.startswith("some "))
            wait = int(some.split("total=")[1].split()[0])
    except (OSError, StopIteration, IndexError, ValueError):
        pass
    return busy, busy + v[3] + v[4], wait, time.perf_counter()


def host_load(before, after):
    """{busy_cores, cores, cpu_wait} between two host_cpu() readings."""
    if before is None or after is None or after[1] <= before[1]:
        return {}
    cores = os.cpu_count() or 1
    out = {"busy_cores": (after[0] - before[0]) / (after[1] - before[1]) * cores, "cores": cores}
    if before[2] is not None and after[2] is not None and after[3] > before[3]:
        out["cpu_wait"] = min(1.0, (after[2] - before[2]) / 1e6 / (after[3] - before[3]))
    return out


def proc_cpu():
    """(CPU seconds of every thread of this process, of the calling thread)
    so far: CLOCK_PROCESS_CPUTIME_ID and CLOCK_THREAD_CPUTIME_ID."""
    return time.process_time(), time.thread_time()


def cpu_since(before):
    """{process_s, main_s}: proc_cpu() now less `before`."""
    now = proc_cpu()
    return {"process_s": now[0] - before[0], "main_s": now[1] - before[1]}


def idle_cpu(seconds):
    """(CPU seconds of this process, wall seconds) over a sleep of `seconds`:
    what a rank costs between all-reduces, with nothing in flight."""
    c0, t0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return time.process_time() - c0, time.perf_counter() - t0


def percentile(sorted_values, q):
    """The q-quantile (0..1) of an ascending list, nearest rank."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def time_allreduces(op, warmup, iters, barrier, per_op_sync=False):
    """Runs `op` (one all-reduce, enqueued on the current CUDA stream's
    device) `warmup` times, then `iters` timed times. Returns a dict: t (s
    per operation), p50, p99, max (s, per operation), method (a label), and
    cpu (cpu_since over the timed operations: this process's CPU seconds and
    its main thread's), and for the back-to-back loop host (host_load over
    it) and in_order (each operation's time, s, in loop order)."""
    import torch

    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    barrier()
    torch.cuda.synchronize()
    if per_op_sync:
        times = []
        cpu = proc_cpu()
        for _ in range(iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            op()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        times.sort()
        return {
            "t": statistics.median(times),
            "p50": percentile(times, 0.5),
            "p99": percentile(times, 0.99),
            "max": times[-1],
            "method": "median of operations each bracketed by synchronize",
            "cpu": cpu_since(cpu),
        }
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    cpu0, cpu = host_cpu(), proc_cpu()
    t0 = time.perf_counter()
    for k in range(iters):
        events[k].record()
        op()
    events[iters].record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    host, cpu = host_load(cpu0, host_cpu()), cpu_since(cpu)
    in_order = [events[k].elapsed_time(events[k + 1]) / 1e3 for k in range(iters)]
    each = sorted(in_order)
    return {
        "t": wall / iters,
        "p50": percentile(each, 0.5),
        "p99": percentile(each, 0.99),
        "max": each[-1],
        "method": "back-to-back loop, barrier before it only (wall / iterations)",
        "host": host,
        "cpu": cpu,
        # Each operation's time in loop order: where a slow one falls.
        "in_order": in_order,
    }
