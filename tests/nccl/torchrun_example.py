#!/usr/bin/env python3
"""A training step whose gradient all-reduce can run through tally servers.

Launched by torchrun (one process per GPU); tests/nccl/torchrun_example.sh
sets the environment docs/nccl.md describes and starts it. Nothing here is
tally-specific: NCCL decides from the environment whether all-reduce goes
through the Tally plugin's CollNet (NCCL_COLLNET_ENABLE=1, TALLY_SERVERS).

Each rank trains a small MLP with DistributedDataParallel (DDP all-reduces
gradient buckets, float32 sum) for --steps steps on its own random batch,
then checks:
  - a known-value all-reduce of --check-size bytes (rank r's element i is
    (i % 7) + r + 1, so the float32 sum is exact) equals the expected sum,
    element for element;
  - every rank ends with bit-identical parameters (DDP's invariant, which a
    wrong gradient all-reduce breaks), compared against rank 0's.
Rank 0 prints "torchrun_example: ok ..." and every rank exits 0 only if both
hold.

TALLY_EXAMPLE_ONE_NODE_PER_GPU=1 (single-host demo only) gives each local
rank its own NCCL_HOSTID, so that NCCL sees one GPU per node and the traffic
between ranks takes the network: CollNet needs at least
NCCL_COLLNET_NODE_THRESHOLD (default 2) nodes.
"""
import argparse
import os
import sys
import time


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=2048, help="hidden width of the MLP (gradient bytes grow with its square)")
    p.add_argument("--check-size", default="64M", help="bytes of the known-value all-reduce")
    args = p.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if os.environ.get("TALLY_EXAMPLE_ONE_NODE_PER_GPU") == "1":
        os.environ["NCCL_HOSTID"] = f"tally-example-node-{local_rank}"

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    # More ranks than GPUs (a one-GPU demo host) share devices round-robin.
    dev = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width),
        torch.nn.ReLU(),
        torch.nn.Linear(args.width, args.width),
        torch.nn.ReLU(),
        torch.nn.Linear(args.width, 16),
    ).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    torch.manual_seed(1000 + rank)  # a different batch on every rank
    grad_bytes = sum(q.numel() * q.element_size() for q in model.parameters())

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        x = torch.randn(64, args.width, device=dev)
        y = torch.randn(64, 16, device=dev)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradient buckets here
        opt.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) / args.steps * 1e3

    # A known-value all-reduce: exact in float32.
    n = max(1, parse_size(args.check_size) // 4)
    idx = torch.arange(n, device=dev, dtype=torch.int64) % 7
    t = (idx + rank + 1).to(torch.float32)
    dist.all_reduce(t)
    expect = (idx * world + world * (world + 1) // 2).to(torch.float32)
    bad = int((t != expect).sum().item())

    # DDP's invariant: identical parameters everywhere (rank 0's, broadcast,
    # compared bit for bit).
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    diverged = int((ref != flat).sum().item())

    # Every rank's verdict. Only float32 sums go through all_reduce here: each
    # (type, op) pair an all-reduce uses is one more job on the servers.
    verdict = torch.tensor([float(bad + diverged)], device=dev, dtype=torch.float32)
    dist.all_reduce(verdict)
    ok = int(verdict.item()) == 0
    if rank == 0:
        print(
            f"torchrun_example: {'ok' if ok else 'FAILED'}: {world} ranks, {args.steps} steps of "
            f"{grad_bytes / 2**20:.1f} MiB of gradients, {step_ms:.1f} ms/step; "
            f"{n * 4 / 2**20:.0f} MiB check all-reduce: {bad} wrong elements; parameters differ in {diverged} elements",
            flush=True,
        )
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
