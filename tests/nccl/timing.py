"""Timing all-reduces as measuring.md (and nccl-tests) define it.

t = the wall time of a loop of back-to-back all-reduces / iterations, with a
barrier before the loop only. A synchronize (or a barrier) around every
operation would add each rank's launch and release skew to every operation:
at 16 MiB on 32 Gbit/s links (4 ms per operation) that skew alone cost NCCL's
ring and CollNet alike a third of their rate. CUDA events recorded between
the operations (no synchronize) give each one's time for p50, p99 and max.

`per_op_sync=True` keeps the old method, a synchronize before and after each
operation, for when that is what is asked; callers label it.
"""
import statistics
import time


def percentile(sorted_values, q):
    """The q-quantile (0..1) of an ascending list, nearest rank."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def time_allreduces(op, warmup, iters, barrier, per_op_sync=False):
    """Runs `op` (one all-reduce, enqueued on the current CUDA stream's
    device) `warmup` times, then `iters` timed times. Returns a dict: t (s
    per operation), p50, p99, max (s, per operation), method (a label)."""
    import torch

    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    barrier()
    torch.cuda.synchronize()
    if per_op_sync:
        times = []
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
        }
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    t0 = time.perf_counter()
    for k in range(iters):
        events[k].record()
        op()
    events[iters].record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    each = sorted(events[k].elapsed_time(events[k + 1]) / 1e3 for k in range(iters))
    return {
        "t": wall / iters,
        "p50": percentile(each, 0.5),
        "p99": percentile(each, 0.99),
        "max": each[-1],
        "method": "back-to-back loop, barrier before it only (wall / iterations)",
    }
