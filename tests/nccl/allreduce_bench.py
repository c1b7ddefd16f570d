#!/usr/bin/env python3
"""All-reduce through PyTorch's NCCL backend: correctness and bus bandwidth.

Two processes (one GPU each) on this host, rendezvous over tcp://127.0.0.1.
NCCL's transport is chosen by the environment the caller sets (see
gpu_proof.sh): the Tally plugin's ncclNet, its ncclCollNet, or NCCL's own
Socket transport as the baseline.

For every size: a checked all-reduce (rank r's float32 element i is
(i % 7) + r + 1, so the sum is exact and known: every element is compared on
the GPU with torch.equal), then warm-up iterations and at least 20 timed
ones, back to back with a barrier before the loop only, as measuring.md and
nccl-tests time them (timing.py), then a second check. Rank 0 reports t =
wall / iterations with per-operation p50 and max, algbw = S/t and busbw =
algbw * 2(n-1)/n (the nccl-tests definitions) as JSON lines.
"""
import argparse
import json
import os
import sys

from timing import time_allreduces


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def sizes_between(lo, hi, factor):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def worker(rank, args):
    import torch
    import torch.distributed as dist

    world = args.world
    if args.distinct_hosts:
        # A different host id per rank: NCCL sees one GPU per "node", so the
        # traffic between them must take the network (and CollNet applies).
        os.environ["NCCL_HOSTID"] = f"tally-proof-host-{rank}"
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=rank,
        world_size=world,
        device_id=dev,
    )
    results = []
    failures = 0
    for size in args.sizes:
        n = max(1, size // 4)
        nbytes = n * 4
        idx = torch.arange(n, device=dev, dtype=torch.int64) % 7
        expect = (idx * world + sum(r + 1 for r in range(world))).to(torch.float32)

        def checked(label):
            t = (idx + rank + 1).to(torch.float32)
            dist.all_reduce(t)
            torch.cuda.synchronize()
            ok = torch.equal(t, expect)
            if not ok:
                bad = (t != expect).nonzero()
                first = int(bad[0].item()) if bad.numel() else -1
                print(
                    f"rank {rank}: {label} all-reduce of {nbytes} B WRONG: {bad.numel()} bad elements, "
                    f"first at {first}: got {t[first].item() if first >= 0 else '?'} want {expect[first].item() if first >= 0 else '?'}",
                    file=sys.stderr,
                    flush=True,
                )
            return ok

        ok = checked("first")
        buf = torch.zeros(n, device=dev, dtype=torch.float32)
        iters = args.iters
        warmup = args.warmup if nbytes < (64 << 20) else max(2, args.warmup // 2)
        tm = time_allreduces(lambda: dist.all_reduce(buf), warmup, iters, dist.barrier)
        ok = checked("last") and ok
        # Every rank's verdict, so rank 0 reports failures seen anywhere.
        verdict = torch.tensor([0 if ok else 1], device=dev, dtype=torch.int32)
        dist.all_reduce(verdict)
        all_ok = int(verdict.item()) == 0
        failures += 0 if all_ok else 1
        t = tm["t"]
        algbw = nbytes / t / 1e9
        busbw = algbw * 2 * (world - 1) / world
        row = {
            "label": args.label,
            "bytes": nbytes,
            "iters": iters,
            "method": tm["method"],
            "time_us": t * 1e6,
            "p50_us": tm["p50"] * 1e6,
            "max_us": tm["max"] * 1e6,
            "algbw_GBps": algbw,
            "busbw_GBps": busbw,
            "correct": all_ok,
        }
        results.append(row)
        if rank == 0:
            print(
                f"{args.label:>14} {nbytes:>12} B  t {t * 1e6:>11.1f} us  algbw {algbw:7.3f} GB/s  busbw {busbw:7.3f} GB/s  {'ok' if all_ok else 'WRONG'}",
                flush=True,
            )
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        sys.exit(3)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", required=True)
    p.add_argument("--out", help="JSON lines, one per size (rank 0)")
    p.add_argument("--min-size", default="1K")
    p.add_argument("--max-size", default="256M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--distinct-hosts", action="store_true", help="give each rank its own NCCL_HOSTID")
    args = p.parse_args()
    args.sizes = sizes_between(parse_size(args.min_size), parse_size(args.max_size), args.factor)
    if args.iters < 20:
        p.error("--iters must be at least 20 (measuring.md: at least 20 timed iterations)")

    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < args.world:
        print(f"need {args.world} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        sys.exit(2)
    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {args.world} ranks, label {args.label}", flush=True)
    mp.spawn(worker, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
