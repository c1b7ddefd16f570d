#!/usr/bin/env python3
"""The summary table of tests/nccl/cluster_proof.sh, from the runs' JSON lines.

    proof_table.py OUT G --rates R [R/2] --modes MODE...

reads OUT/MODE-RATE.jsonl (cluster_allreduce.py's rows, rank 0's) for every
rate and mode given (a missing file is a run that did not happen or
failed: left out) and prints, per rate, dtype and size, one row a mode:
algbw, busbw, the link bound (measuring.md: a ring R x G / (2(G-1)),
reduction servers R, R in GB/s = Gbit/s / 8), the fraction of it, and for
CollNet rows coll/ring, against the best of every ring mode that ran at
that rate, dtype and size (NCCL's Socket ring at its defaults and tuned,
ring-socket-AxB, and the ring over tally's ncclNet); p50/p99, elements
wrong, bf16 elements not correctly rounded; the ranks' own CPU: the
median rank's process CPU seconds per GB all-reduced over the timed loop
(every thread: NCCL's proxy, the plugin's), the same less the Python main
thread (which spins in the CUDA synchronize that ends the loop), and the
largest rank's idle CPU (% of a core over a gap with no all-reduce in
flight); and the machine's cores busy and CPU wait over the loop. After
each size a line names the best ring and each other ring's share of it;
after each rate, how often each ring won.
"""
import argparse
import json
import os
import statistics


def fmt_size(n):
    for u, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s}{u}"
    return str(n)


def host(r):
    """The machine's cores busy / cores, and the share of time some task waited for a CPU."""
    h = r.get("host") or {}
    if "busy_cores" not in h:
        return "-"
    w = f"{h['cpu_wait'] * 100:.0f}%" if "cpu_wait" in h else "-"
    return f"{h['busy_cores']:.1f}/{h['cores']},{w}"


def rank_cpu(r):
    """(median rank's process CPU s/GB over the loop, the same less the main
    thread, largest rank's idle % of a core) as strings, '-' where absent."""
    def med(key):
        v = r.get(key) or []
        return f"{statistics.median(v):.3g}" if v else "-"

    idle = r.get("rank_idle_core_pct") or []
    return med("rank_cpu_s_per_GB"), med("rank_cpu_s_per_GB_nomain"), (f"{max(idle):.1f}" if idle else "-")


def load(out, rate, modes):
    """{(mode, dtype, bytes): row} of one rate's runs."""
    rows = {}
    for m in modes:
        p = os.path.join(out, f"{m}-{rate}.jsonl")
        if not os.path.exists(p):
            continue
        for line in open(p):
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "dtype" in r:
                rows[(m, r["dtype"], r["bytes"])] = r
    return rows


def is_ring(mode):
    return mode.startswith("ring-")


def is_collnet(mode):
    return mode.startswith("collnet")


HEAD = (f"{'Gbit/s':>6} {'mode':>15} {'dtype':>5} {'size':>5} {'algbw':>8} {'busbw':>8} {'bound':>7} {'fraction':>8} "
        f"{'coll/ring':>9} {'p50 ms':>7} {'p99 ms':>7} {'wrong':>6} {'bf16 off':>8} {'cpu s/GB':>8} {'-main':>6} {'idle%':>5} "
        f"{'host busy,wait':>14}")


def table(out, g, rates, modes):
    print(HEAD)
    for rate in rates:
        rows = load(out, rate, modes)
        R = float(rate) / 8
        ring_bound = R * g / (2 * (g - 1))
        wins = {}
        groups = sorted({(d, b) for (_, d, b) in rows})
        for d, b in groups:
            present = [m for m in modes if (m, d, b) in rows]
            rings = [(rows[(m, d, b)]["algbw_GBps"], m) for m in present if is_ring(m)]
            best_bw, best = max(rings) if rings else (0.0, None)
            for m in present:
                r = rows[(m, d, b)]
                bound = R if is_collnet(m) else ring_bound
                q = f"{r['algbw_GBps'] / best_bw:.2f}" if is_collnet(m) and best_bw else ""
                off = r.get("off_correct_rounding", "") if d == "bf16" else ""
                cpu, nomain, idle = rank_cpu(r)
                print(f"{rate:>6} {m:>15} {d:>5} {fmt_size(b):>5} {r['algbw_GBps']:>8.3f} {r['busbw_GBps']:>8.3f} "
                      f"{bound:>7.3f} {r['algbw_GBps'] / bound:>8.2f} {q:>9} {r.get('p50_us', 0) / 1e3:>7.2f} "
                      f"{r.get('p99_us', 0) / 1e3:>7.2f} {r['wrong']:>6} {off:>8} {cpu:>8} {nomain:>6} {idle:>5} {host(r):>14}")
            if best:
                wins[best] = wins.get(best, 0) + 1
                others = ", ".join(f"{m} {bw / best_bw:.2f}" for bw, m in rings if m != best)
                print(f"{'':>6} best ring: {best} ({d} {fmt_size(b)}, {best_bw:.3f} GB/s)"
                      f"{'; the others, share of it: ' + others if others else ''}")
        if wins:
            tally = ", ".join(f"{m} {n}" for m, n in sorted(wins.items(), key=lambda x: -x[1]))
            print(f"{'':>6} best ring at {rate} Gbit/s (dtype and size won): {tally}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("g", type=int)
    ap.add_argument("--rates", nargs="+", required=True, help="as the runs' file names spell them")
    ap.add_argument("--modes", nargs="+", required=True)
    a = ap.parse_args()
    table(a.out, a.g, a.rates, a.modes)


if __name__ == "__main__":
    main()
