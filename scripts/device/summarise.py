#!/usr/bin/env python3
"""The device parts' summaries: one function per table, each reading the files
a part (scripts/device/parts/) wrote and printing its lines of summary.txt.

    python3 scripts/device/summarise.py KIND ARG...

KIND is a function below ('-' for '_'); its arguments are the part's files and
the figures of the row (round, ranks, ...), as the part passes them. A part
runs it per row, as the rows come, so a summary grows while the session runs
(and a session cut short by the device's time limit still says what it had).
The JSON shapes are those of `tally bench allreduce|p2p --json` ("results")
and `tally bench cluster --json` ("rows", "placement").
"""
import datetime
import glob
import json
import os
import re
import sys


def load(path, key="results"):
    """The rows of one bench JSON file ('-': standard input)."""
    f = sys.stdin if path == "-" else open(path)
    return json.load(f)[key]


def _rtt_us(path):
    """The shm round trip: twice the ping-pong's half round trip (first size)."""
    return 2 * load(path)[0]["latency_us"]


def rtt(path, digits="2"):
    """The round trip the latency ratios use, from a `bench p2p --json`."""
    print(f"{_rtt_us(path):.{int(digits)}f}")


def p2p_pairs(path="-"):
    """Half round trip per size of one core pair: '8B 1.23 4096B 2.34'."""
    print(" ".join("%dB %.2f" % (r["bytes"], r["latency_us"]) for r in load(path)))


def latency(p2p, *files):
    """Back-to-back agg against ring, mean/p50/p99, and the 4 KiB ratios."""
    p = load(p2p)
    rtt = 2 * p[0]["latency_us"]
    rows = {}
    for f in files:
        if not os.path.exists(f):
            continue
        try:
            rows.update({(r["mode"], r["bytes"]): r for r in load(f)})
        except Exception as e:
            print(f"{f}: {e}")
    print(f"{'mode':>10} {'size':>9} {'mean us':>10} {'p50 us':>9} {'p99 us':>9} {'max us':>9} {'busbw GB/s':>11}")
    for (m, b), r in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
        print(f"{m:>10} {b:>9} {r['time_us']:>10.2f} {r['p50_us']:>9.2f} {r['p99_us']:>9.2f} {r['max_us']:>9.2f} {r['busbw_GBps']:>11.3f}")
    a4, r4 = rows.get(("agg", 4096)), rows.get(("ring", 4096))
    if a4 and r4:
        tp = p[0].get("p99_latency_us", 0) / p[0]["latency_us"]
        print(f"4 KiB: agg mean {a4['time_us']:.2f} us = {a4['time_us']/rtt:.2f} x shm round trip ({rtt:.2f} us), p50 {a4['p50_us']/rtt:.2f} x (rank 0's own intervals {a4.get('rank0_p50_us', 0)/rtt:.2f} x); agg/ring time {a4['time_us']/r4['time_us']:.2f}; agg p99/p50 {a4['p99_us']/a4['p50_us']:.2f} (ring {r4['p99_us']/r4['p50_us']:.2f}, the ping-pong's own {tp:.2f})")


def _input_gbps(r, ranks):
    """Server input GB/s: ranks x bytes per rank / loop mean."""
    return ranks * r["bytes"] / (r["time_us"] * 1e-6) / 1e9


def scale(p2p, agg, lcores):
    """One row of core scaling: agg input GB/s against the p2p ceiling."""
    try:
        p = load(p2p)[0]["hub_input_GBps"]
    except Exception as e:
        p = None
        print("p2p:", e)
    try:
        a = _input_gbps(load(agg)[0], 8)
    except Exception as e:
        a = None
        print("agg:", e)
    f = lambda v: "%.2f" % v if v else "-"
    print("%7s %14s %16s %7s" % (lcores, f(a), f(p), f(a / p) if a and p else "-"))


def scale_grid(path, lcores, ranks, base):
    """One row of scale.sh's grid; the first field is the figure the next
    rows' fraction of linear is taken against (the 1-lcore row's)."""
    r = load(path)[0]
    L, n, base = int(lcores), int(ranks), float(base)
    thr = _input_gbps(r, n)
    lin = thr / (base * L) if base else 1.0
    print(f"{thr:.3f} {L:>6} {r['time_us']/1e3:>9.2f} {thr:>11.2f} {thr/L:>10.2f} {lin:>10.2f} {r['wrong']:>6}")


def matrix(n, lc, mp, path="-"):
    """One row of the 4 KiB matrix: agg and ring mean / p50 / p99."""
    try:
        rows = {r["mode"]: r for r in load(path)}
        a, g = rows["agg"], rows["ring"]
        f = lambda r: "%.2f / %.2f / %.2f" % (r["time_us"], r["p50_us"], r["p99_us"])
        print("%5s %6s %6s %9s %24s %24s %8.2f" % (n, lc, mp, "", f(a), f(g), a["time_us"] / g["time_us"]))
    except Exception as e:
        print(n, lc, mp, "FAILED", e)


def cluster_fractions(path):
    """A `bench cluster` run's rows, one line each: mode, size, rate, fraction."""
    for r in load(path, "rows"):
        print("%s %d MiB %s Gbit/s: fraction %.2f" % (r["mode"], r["bytes"] >> 20, r["link_gbit"], r["fraction"]))


def placement(path):
    print(json.load(open(path))["placement"])


def tail(alone, loaded, big, chunk, window, cfg):
    """The small job's tail alone and beside a streaming job."""
    a, b = load(alone)[0], load(loaded)[0]
    try:
        g = load(big)[0]
        big = f"; big job {g['time_us'] / 1e3:.1f} ms per 64 MiB, wrong {g['wrong']}"
    except Exception:
        big = "; big job: no result"
    if chunk == "256K":
        print(f"{cfg:>8} alone:  mean {a['time_us']:.2f} us, p50 {a['p50_us']:.2f}, p99 {a['p99_us']:.2f}, max {a['max_us']:.1f}; p99/p50 {a['p99_us']/a['p50_us']:.2f}; wrong {a['wrong']}")
    print(f"{cfg:>8} beside 64M (chunk {chunk}, window {window}):  mean {b['time_us']:.2f} us, p50 {b['p50_us']:.2f}, p99 {b['p99_us']:.2f}, max {b['max_us']:.1f}; p99/alone-p50 {b['p99_us']/a['p50_us']:.2f}; wrong {b['wrong']}{big}")


def _ring_of(rows, r):
    """The ring row of the same size and rate as r (empty if none)."""
    return [x for x in rows if x["mode"] == "ring" and x["bytes"] == r["bytes"] and x["link_gbit"] == r["link_gbit"]]


def cluster(path):
    """The emulated cluster's table: algbw, bound, fraction, agg/ring."""
    v = json.load(open(path))
    rows = v["rows"]
    print("# placement:", v["placement"])
    print(f"{'Gbit/s':>7} {'mode':>10} {'size':>9} {'algbw GB/s':>11} {'bound':>8} {'fraction':>9} {'agg/ring':>9} {'wrong':>6}")
    for r in rows:
        ring = _ring_of(rows, r)
        q = f"{r['algbw_GBps']/ring[0]['algbw_GBps']:.2f}" if r["mode"] != "ring" and ring else ""
        print(f"{r['link_gbit']:>7} {r['mode']:>10} {r['bytes']>>20:>7}Mi {r['algbw_GBps']:>11.4f} {r['bound_GBps']:>8.4f} {r['fraction']:>9.2f} {q:>9} {r['wrong']:>6}")


def configs(path, config):
    """linerate's cluster part: one line per non-ring row, against the ring."""
    rows = load(path, "rows")
    for r in rows:
        if r["mode"] == "ring":
            continue
        ring = _ring_of(rows, r)
        q = f"{r['algbw_GBps']/ring[0]['algbw_GBps']:.2f}" if ring else "-"
        rf = f"{ring[0]['fraction']:.2f}" if ring else "-"
        size = f"{r['bytes']>>20}Mi" if r['bytes'] >= 1 << 20 else f"{r['bytes']>>10}Ki"
        extra = f"  p50 {r['p50_us']:.0f} us (ring {ring[0]['p50_us']:.0f})" if r['bytes'] < 1 << 20 and ring else ""
        # TCP's retransmission timeouts over the loop (tally bench cluster's tcp_loss), where counted.
        rto = f"  rto {r['tcp_timeouts']}" if r.get("tcp_timeouts") is not None else ""
        # Tail loss probes over the loop (each up to about 200 ms where one segment is in flight).
        rto += f" tlp {r['tcp_loss_probes']}" if r.get("tcp_loss_probes") is not None else ""
        # Packets the hosts' interfaces dropped over the loop (retransmissions without a tbf drop).
        rto += f" drops {r['dev_drops']}" if r.get("dev_drops") else ""
        # Segments the hosts' sockets dropped over the loop.
        rto += f" sockdrops {r['sock_drops']}" if r.get("sock_drops") else ""
        print(f"{config:>18} {r['link_gbit']:>5} {size:>5} {r['mode']:>10} {r['fraction']:.2f}  ring {rf}  /ring {q}  wrong {r['wrong']}{rto}{_host(r.get('host_cpu'))}{extra}")


def configs_rounds(out, *configs):
    """linerate's cluster part, after its rounds: per configuration, rate,
    size and mode, the median fraction over the rounds with its range, and
    the median against the first configuration's (one round moves a figure
    by a third on some hosts: read these, not a round)."""
    med = {}
    lines = []
    for cfg in configs:
        name = re.split(r"[@+]", cfg)[0]
        runs = {}
        own = re.compile(r"cluster-\d+-" + re.escape(name) + r"\.json$")
        for path in sorted(p for p in glob.glob(os.path.join(out, "cluster-*.json")) if own.match(os.path.basename(p))):
            try:
                rows = load(path, "rows")
            except Exception:
                continue
            for r in rows:
                # A row with wrong elements is no figure (configs.sh also
                # sets a failed run's file aside).
                if r["mode"] == "ring" or r.get("wrong", 0):
                    continue
                runs.setdefault((r["link_gbit"], r["bytes"], r["mode"]), []).append(r["fraction"])
        for key, fs in runs.items():
            fs.sort()
            n = len(fs)
            m = fs[n // 2] if n % 2 else (fs[n // 2 - 1] + fs[n // 2]) / 2
            med[(name, key)] = m
            lines.append((name, key, m, fs))
    first = re.split(r"[@+]", configs[0])[0] if configs else ""
    for name, (rate, size, mode), m, fs in lines:
        base = med.get((first, (rate, size, mode)))
        vs = f"  /{first} {m / base:.2f}" if base and name != first else ""
        sz = f"{size >> 20}Mi" if size >= 1 << 20 else f"{size >> 10}Ki"
        print(f"{name:>18} {rate:>5} {sz:>5} {mode:>10} median {m:.2f} ({fs[0]:.2f}-{fs[-1]:.2f}, {len(fs)} rounds){vs}")


def _host(h):
    """The machine's CPU over a loop (bench cluster's host_cpu, timing.py's
    host): cores busy (of them in softirqs, where the tool reports it), and
    the share of the time some task waited for one."""
    if not h or "busy_cores" not in h:
        return ""
    wait = f" wait {h['cpu_wait'] * 100:.0f}%" if h.get("cpu_wait") is not None else ""
    sirq = f" (softirq {h['softirq_cores']:.1f})" if h.get("softirq_cores") is not None else ""
    return f"  busy {h['busy_cores']:.1f}/{h['cores']}{sirq}{wait}"


def cpu16(path, hosts, poll, lcores):
    rows = {r["mode"]: r for r in load(path, "rows")}
    q = rows["agg"]["algbw_GBps"] / rows["ring"]["algbw_GBps"] if "agg" in rows and "ring" in rows else 0
    print(f"{hosts} + {hosts} hosts, poll {poll:>8}, {lcores} lcore(s)/server: " + ", ".join(f"{m} {r['fraction']:.2f}" for m, r in rows.items()) + f"; agg/ring {q:.2f}")


def cpu(path):
    """linerate's cpu part: CPU seconds per GB, worker and servers."""
    for r in load(path, "rows"):
        w, s = r.get("worker_cpu_s_per_gb"), r.get("server_cpu_s_per_gb")
        f = lambda x: "-" if x is None else f"{x:.3f} s/GB ({x * 12.5:.1f} cores per 100 Gbit/s)"
        sq = [r.get(k) for k in ("worker_cores_softirq_s_per_gb", "server_cores_softirq_s_per_gb")]
        sirq = "" if sq[0] is None else "  softirqs on their cores " + " / ".join("-" if x is None else f"{x:.3f}" for x in sq)
        print(f"{r['link_gbit']:>5} {r['mode']:>5} {r['bytes']>>20}Mi fraction {r['fraction']:.2f}  worker {f(w)}  servers {f(s)}{sirq}")


def _stamp(line):
    """A log line's time (tally's log lines open with [RFC 3339 UTC])."""
    return datetime.datetime.strptime(line[1:24], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()


def ranks(n, rc, t0, t1, jf, log, peak):
    """Many ranks: time to the job running, p50, the server's peak threads and RSS."""
    t0, t1 = float(t0), float(t1)
    running = next((_stamp(l) for l in open(log) if ": running" in l and "job " in l), None)
    j2r = next((m.group(1) for l in open(log) for m in [re.search(r": running, (\S+) after its first rank joined", l)] if m), None)
    try:
        rows = load(jf)
    except Exception:
        rows = []
    pt, pr = (open(peak).read().split() + ["?", "?"])[:2]
    print(f"{n} ranks: exit {rc}; bench start to job running {running - t0:.2f} s (first join to running {j2r})" if running else f"{n} ranks: exit {rc}; job never ran")
    for r in rows:
        print(f"  {r['bytes']:>8} B: p50 {r.get('p50_us', 0):.0f} us, mean {r.get('mean_us', 0):.0f} us, p99 {r.get('p99_us', 0):.0f} us, wrong {r['wrong']}")
    print(f"  server: peak {pt} threads, peak VmRSS {int(pr) // 1024 if pr.isdigit() else pr} MiB; whole run {t1 - t0:.1f} s")


def rankscale(rnd, case, nw, L, rc, jf, log, basef, cpuf, libv):
    """One rank-scaling run: GB/s per lcore, its ratio to the first rank
    count's (kept in basef), and the lcores' and ranks' CPU from the sampler
    (probes.py lcore-sampler) while bytes came in."""
    # lcore CPU (cores) while bytes came in, leaving out the first and last such interval
    rows = [list(map(float, l.split())) for l in open(cpuf) if len(l.split()) == 4]
    act = [i for i in range(1, len(rows)) if rows[i][2] > rows[i - 1][2]]
    lc = rc_cpu = "-"
    if len(act) >= 3:
        a, b = act[1] - 1, act[-2]
        if rows[b][0] > rows[a][0]:
            lc = f"{(rows[b][1] - rows[a][1]) / (rows[b][0] - rows[a][0]):.2f}"
            rc_cpu = f"{(rows[b][3] - rows[a][3]) / (rows[b][0] - rows[a][0]):.1f}"
    n, w = nw.split(":")
    n, L = int(n), int(L)
    rk = f"{n}/w{w}"
    try:
        r = load(jf)[0]
    except Exception:
        r = None
    m = next((re.search(r"(\d+) elements per piece", l) for l in open(log) if "starting (tag" in l), None)
    esize = {"f16": 2, "bf16": 2, "f64": 8, "i64": 8, "u64": 8, "i8": 1, "u8": 1}.get(os.environ.get("RS_DTYPE", "f32"), 4)
    piece = f"{int(m.group(1)) * esize // 1024}K" if m else "?"
    if m and any("ranks at a time" in l for l in open(log) if "starting (tag" in l):
        piece += ",staged"
    if r is None:
        print(f"{rnd:>5} {case:>6} {rk:>8} {'-':>9} {piece:>9} {'-':>10} {'-':>9} {'-':>8} {lc:>7} {rc_cpu:>7} {'-':>6} {rc:>6} {libv}")
        return
    gbps = _input_gbps(r, n) / L
    if not os.path.exists(basef):
        open(basef, "w").write(str(gbps))
    base = float(open(basef).read())
    size = f"{r['bytes'] // 1024}K" if r["bytes"] < 1 << 20 else f"{r['bytes'] >> 20}M"
    print(f"{rnd:>5} {case:>6} {rk:>8} {size:>9} {piece:>9} {r['time_us'] / 1e3:>10.1f} {gbps:>9.3f} {gbps / base:>8.2f} {lc:>7} {rc_cpu:>7} {r['wrong']:>6} {rc:>6} {libv}")


def fostage(out):
    """Failover's staging cost: p50 with TALLY_FAILOVER=0 and =1 per size."""
    rows = {}
    for f in sorted(glob.glob(os.path.join(out, "fo[01]-*.json"))):
        fo = os.path.basename(f)[2]
        try:
            for r in load(f):
                rows.setdefault((r["bytes"], fo), []).append(r)
        except Exception as e:
            print(f"{f}: {e}")
    for b in sorted({k[0] for k in rows}):
        off, on = rows.get((b, "0"), []), rows.get((b, "1"), [])
        fmt = lambda rs: " / ".join(f"{r['p50_us']:.0f}" for r in rs)
        wrong = sum(r["wrong"] for r in off + on)
        ratio = (sum(r["p50_us"] for r in on) / len(on)) / (sum(r["p50_us"] for r in off) / len(off)) if on and off else float("nan")
        print(f"{b:>9} B: p50 us failover off {fmt(off)}, on {fmt(on)}; on/off {ratio:.2f}; wrong {wrong}")


def relay(small, large, rnd, on, rtt):
    try:
        s, l = load(small)[0], load(large)[0]
        bad = s["wrong"] + l["wrong"]
        rtt = float(rtt)
        print(f"{rnd:>5} {on:>6} {rtt:>8.2f} | {s['time_us']:>9.2f} {s['p50_us']:>9.2f} {s['rank0_p50_us']:>11.2f} {s['p50_us'] / rtt:>9.2f} | "
              f"{l['time_us']:>9.1f} {l['p50_us']:>9.1f}" + (f"  WRONG {bad}" if bad else ""))
    except Exception as e:
        print(f"{rnd:>5} {on:>6} failed: {e}")


def split(agg, ring, rnd, n, lc, lib, mode):
    """One split row: the agg run (or, with agg == ring, the ring itself)
    against the ring of the same round and library."""
    head = f"{rnd:>5} {n:>6} {lc:>7} {lib:<22} {mode:<8}"
    try:
        a, g = load(agg)[0], load(ring)[0]
        print(f"{head} | {a['time_us']:>9.2f} {a['p50_us']:>9.2f} {a['p99_us']:>9.2f} {a['p99_us'] / a['p50_us']:>7.2f} "
              f"{a['time_us'] / g['time_us']:>7.2f} {a['wrong']:>6}")
    except Exception as e:
        print(f"{head} failed: {e}")


def nccl_knobs(o, knob, rc, ch):
    """One NCCL setting's rows: fraction of the bound, p50, channels used."""
    for p in sorted(glob.glob(os.path.join(o, "*.jsonl"))):
        mode, rate = os.path.basename(p)[:-6].rsplit("-", 1)
        rate = float(rate)
        for line in open(p):
            r = json.loads(line)
            # Bounds (measuring.md): reduction servers R, the ring R n/(2(n-1)).
            n = r["world"]
            bound = rate / 8 if mode.startswith("collnet") else rate / 8 * n / (2 * (n - 1))
            print(f"{knob:>40} {mode:>12} {r.get('dtype', ''):>5} {rate:>4g} {r['bytes'] >> 20:>4}Mi fraction {r['algbw_GBps'] / bound:.2f}  p50 {r['p50_us'] / 1e3:.2f} ms  wrong {r['wrong']}{_host(r.get('host'))}  [{ch}] rc {rc}")


def slow_ops(d, factor="2"):
    """Every NCCL timed loop under directory d (cluster_proof.sh's *.jsonl)
    whose slowest operation took more than `factor` times its median: the
    run, dtype, size and each operation's time in loop order (ms), so that
    where the slow one falls (the first after the barrier, or anywhere) shows."""
    for path in sorted(glob.glob(os.path.join(d, "**", "*.jsonl"), recursive=True)):
        for line in open(path):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            each = r.get("each_us") or []
            if not each or max(each) <= float(factor) * r["p50_us"]:
                continue
            size = f"{r['bytes'] >> 20}M" if r["bytes"] >= 1 << 20 else f"{r['bytes'] >> 10}K"
            slow = max(range(len(each)), key=lambda k: each[k])
            print(f"# slow op {os.path.basename(path)[:-6]} {r['dtype']} {size}: #{slow} of {len(each)} took {each[slow] / 1e3:.1f} ms "
                  f"(p50 {r['p50_us'] / 1e3:.2f}); in order: {' '.join(f'{x / 1e3:.1f}' for x in each)}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].replace("-", "_") not in globals() or sys.argv[1].startswith("_"):
        sys.exit(f"usage: {sys.argv[0]} KIND ARG... (KIND: a function of this file)")
    globals()[sys.argv[1].replace("-", "_")](*sys.argv[2:])
