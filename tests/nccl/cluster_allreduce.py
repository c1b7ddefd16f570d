#!/usr/bin/env python3
"""One rank of an all-reduce on the emulated cluster (tests/nccl/cluster_proof.sh).

`tally bench cluster --workers-run` starts one of these in every worker
network namespace, with TALLY_CLUSTER_RANK, _WORLD, _MASTER (worker 0's
address) and _IFNAME set; every byte between ranks, and to the tally
servers, crosses a link shaped with tc tbf. Each rank is its own NCCL node
(its own NCCL_HOSTID) on GPU rank % (GPUs of this host).

For every dtype and size: rank r's element i is k/16 with
k = ((i * 2654435761 + r * 40503) mod 255) - 127, exact in float32 and
bfloat16, so the float64 sum is exact and computed on the GPU for every
element. float32 results must equal it exactly. bfloat16 results are
compared with its correctly rounded value: the count that differ is
reported (tally's servers sum in float32 and round once; a ring rounds at
every hop), and any element further than the ring's worst case from the
exact sum fails. Then warm-up and timed all-reduces as measuring.md times
them (tests/nccl/timing.py: a back-to-back loop with a barrier before it
only; --per-op-sync brackets each with torch.cuda.synchronize instead, and
says so in the JSON's "method"); rank 0 writes t, p50/p99/max, algbw = S/t
and busbw = algbw*2(n-1)/n as one JSON line per size. The timed loop
all-reduces a copy of the input scaled by 2^-60 in place: the sums grow by
the world size each time and stay finite and normal in f32 and bf16.

Each rank also reads its own process CPU (every thread: NCCL's proxy, the
plugin's; timing.py) over the timed loop, and over --idle-s seconds of sleep
right after it, with no collective in flight (the idle cost of a rank with
the plugin loaded). One all-reduce of a small float32 tensor (each rank's
figures in its own row, zeros elsewhere: every sum exact) brings them to
rank 0, whose JSON line has them per rank: rank_cpu_s (over the loop),
rank_main_cpu_s (the Python main thread alone, which spins in the CUDA
synchronize ending the loop), rank_cpu_s_per_GB and rank_cpu_s_per_GB_nomain
(per GB all-reduced: bytes x iters / 1e9), rank_idle_core_pct (% of a core
over the sleep) and idle_s (the sleep's wall time, rank 0's).

--dry-run needs no GPU and no torch: the ranks rendezvous over TCP through
the shaped links and reach every server's control port, which is what the
real run needs from the testbed; each measures its idle CPU over --idle-s
(a plain Python process: it checks the reading, not the plugin) and rank 0
prints them in a line "ranks' idle CPU ...".
"""
import argparse
import json
import os
import socket
import sys
import time

from timing import idle_cpu, time_allreduces


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def env_int(name):
    v = os.environ.get(name)
    if v is None:
        sys.exit(f"{name} is not set: run this under `tally bench cluster --workers-run`")
    return int(v)


def idle_pct(seconds):
    """This process's CPU over an idle sleep of `seconds`, % of a core, and the sleep's wall time."""
    if seconds <= 0:
        return None, 0.0
    cpu, wall = idle_cpu(seconds)
    return cpu / wall * 100, wall


def dry_run(args, rank, world, master):
    """Rendezvous over TCP and reach every server: the testbed works."""
    idle, _ = idle_pct(args.idle_s)
    servers = [s for s in os.environ.get("TALLY_SERVERS", "").split(",") if s]
    reached = 0
    for s in servers:
        host, port = s.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10):
            reached += 1
    deadline = time.time() + 30
    if rank == 0:
        ls = socket.create_server((master, args.port))
        ls.settimeout(30)
        peers = {0: idle}
        while len(peers) < world:
            c, _ = ls.accept()
            r, pct = c.recv(64).decode().split()
            peers[int(r)] = None if pct == "-" else float(pct)
            c.sendall(b"ok")
            c.close()
        rec = {"label": args.label, "dry_run": True, "world": world, "ranks_reached": len(peers), "servers_reached": reached}
        print(json.dumps(rec), flush=True)
        if args.idle_s > 0:
            print(f"ranks' idle CPU over {args.idle_s:g} s (% of a core, rank order): "
                  + " ".join("-" if peers[r] is None else f"{peers[r]:.2f}" for r in sorted(peers)), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
    else:
        while True:
            try:
                c = socket.create_connection((master, args.port), timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        c.sendall(f"{rank} {'-' if idle is None else idle}".encode())
        assert c.recv(16) == b"ok"
        c.close()
    if reached != len(servers):
        sys.exit(f"rank {rank}: reached {reached} of {len(servers)} servers")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--sizes", default="1M,4M,16M,64M,256M")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--per-op-sync", action="store_true", help="bracket each timed all-reduce with synchronize (labelled)")
    ap.add_argument("--port", type=int, default=29600)
    ap.add_argument("--idle-s", type=float, default=1.0, help="seconds of idle after each timed loop whose process CPU is read (0: none)")
    ap.add_argument("--out", help="rank 0 appends its JSON lines here too")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    rank, world = env_int("TALLY_CLUSTER_RANK"), env_int("TALLY_CLUSTER_WORLD")
    master = os.environ["TALLY_CLUSTER_MASTER"]
    if args.dry_run:
        return dry_run(args, rank, world, master)

    os.environ.setdefault("NCCL_HOSTID", f"tally-cluster-host-{rank}")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", os.environ.get("TALLY_CLUSTER_IFNAME", "eth0"))
    import torch
    import torch.distributed as dist

    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    dev = torch.device("cuda", gpu)
    dist.init_process_group("nccl", init_method=f"tcp://{master}:{args.port}", rank=rank, world_size=world, device_id=dev)
    types = {"f32": torch.float32, "bf16": torch.bfloat16}
    failures = 0
    for dname in args.dtypes.split(","):
        dtype = types[dname]
        esize = torch.tensor([], dtype=dtype).element_size()
        for size in [parse_size(s) for s in args.sizes.split(",")]:
            n = size // esize
            i = torch.arange(n, device=dev, dtype=torch.int64)

            def value(r):
                return (((i * 2654435761 + r * 40503) % 255) - 127).to(torch.float64) / 16

            exact = sum(value(r) for r in range(world))
            mine = value(rank).to(dtype)
            t = mine.clone()
            dist.all_reduce(t)
            torch.cuda.synchronize()
            got = t.to(torch.float64)
            if dtype == torch.float32:
                wrong = int((got != exact).sum().item())
                off = wrong
            else:
                off = int((t != exact.to(dtype)).sum().item())
                # A ring rounds at each of its n-1 additions: half an ulp of
                # the largest partial sum each time (|partial| < 8 * 127/16).
                bound = (world - 1) * 0.5 * 2.0 ** (-7) * 64 + 1e-9
                wrong = int(((got - exact).abs() > bound).sum().item())
            del got, exact
            if wrong:
                print(f"rank {rank}: {dname} {size} B: {wrong} wrong elements", file=sys.stderr, flush=True)
                failures += 1
            t.copy_(mine)
            t.mul_(2.0**-60)
            tm = time_allreduces(lambda: dist.all_reduce(t), args.warmup, args.iters, dist.barrier, args.per_op_sync)
            idle, idle_wall = idle_pct(args.idle_s)
            # Every rank's CPU figures to every rank: row r is rank r's.
            cpu = torch.zeros(world, 3, dtype=torch.float32, device=dev)
            cpu[rank] = torch.tensor([tm["cpu"]["process_s"], tm["cpu"]["main_s"], idle or 0.0], dtype=torch.float32, device=dev)
            dist.all_reduce(cpu)
            cpu = cpu.tolist()
            gb = n * esize * args.iters / 1e9
            algbw = n * esize / tm["t"] / 1e9
            rec = {
                "label": args.label,
                "dtype": dname,
                "bytes": n * esize,
                "world": world,
                "iters": args.iters,
                "method": tm["method"],
                "time_us": tm["t"] * 1e6,
                "p50_us": tm["p50"] * 1e6,
                "p99_us": tm["p99"] * 1e6,
                "max_us": tm["max"] * 1e6,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (world - 1) / world,
                "wrong": wrong,
                "off_correct_rounding": off,
                "host": tm.get("host", {}),
                "rank_cpu_s": [round(c[0], 4) for c in cpu],
                "rank_main_cpu_s": [round(c[1], 4) for c in cpu],
                "rank_cpu_s_per_GB": [round(c[0] / gb, 4) for c in cpu],
                "rank_cpu_s_per_GB_nomain": [round((c[0] - c[1]) / gb, 4) for c in cpu],
                "rank_idle_core_pct": [round(c[2], 3) for c in cpu] if idle is not None else [],
                "idle_s": round(idle_wall, 3),
                "each_us": [round(x * 1e6) for x in tm.get("in_order", [])],
            }
            if rank == 0:
                print(json.dumps(rec), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(rec) + "\n")
            del t, mine, i
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
