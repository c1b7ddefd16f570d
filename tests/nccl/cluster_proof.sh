#!/usr/bin/env bash
# Real NCCL on G GPUs of one host, each GPU its own "node" behind a shaped
# link: CollNet through tally servers against NCCL's ring.
#
# `tally bench cluster --workers-run` builds the testbed: G server hosts and
# G worker hosts, each a network namespace with one veth link to a bridge,
# shaped with tc tbf to R Gbit/s in both directions (198.18.0.0/15). One
# PyTorch rank per worker namespace (tests/nccl/cluster_allreduce.py), each
# its own NCCL node (NCCL_HOSTID; P2P, SHM and NVLS off), so every byte
# between GPUs, and to the servers, crosses a shaped link. Per rate (R and
# R/2) three runs:
#
#   ring-socket   NCCL ring over NCCL's Socket transport
#   ring-tally    NCCL ring over tally's ncclNet (tcp;ofi_rxm)
#   collnet       CollNet through the tally servers (NCCL_COLLNET_ENABLE=1)
#
# plus `collnet-auto` (CollNet enabled, NCCL_ALGO unset: which algorithm
# NCCL picks on its own; see the TUNING lines). f32 and bf16, 1 MiB to
# 256 MiB, every element checked, ITERS back to back (tests/nccl/timing.py). The summary gives algbw,
# busbw, the link bound (ring <= R x G / (2(G-1)), reduction servers <= R),
# the fraction of it, CollNet / best ring, bf16 elements not correctly
# rounded, the machine's cores busy and the share of the time some task
# waited for a CPU over each timed loop (every node shares the machine), and
# the NCCL log lines that show who carried the traffic.
#
#   PLUGIN=/abs/libnccl-net-tally.so TALLY_BIN=/abs/tally OUT=/tmp/c TALLY_IPROUTE=/abs/iproute \
#       tests/nccl/cluster_proof.sh
#
# DRYRUN=1 needs no GPU and no torch (this machine, CI): the same testbed
# with G ranks that rendezvous and reach every server through the shaped
# links, then tally's own agg, agg-plugin (the plugin's CollNet as NCCL
# drives it) and ring over the same links. Builds nothing.
#
# G may exceed the host's GPUs: ranks then share them round-robin (each
# still its own NCCL node), which checks the whole path on a 1-GPU host but
# says nothing about speed.
#
# Environment (all optional): G (ranks; default: one per GPU), RATE (Gbit/s, default
# 8; R/2 runs too), SIZES (1M,4M,16M,64M,256M), DTYPES (f32,bf16), ITERS
# (20), MODES, PYTHON (python3), STEP_TIMEOUT (s per run, 900), HALF (0: R only), DRYRUN,
# CLUSTER_ARGS (more `tally bench cluster` arguments for every run, e.g. --tcp-autocork on),
# PER_OP_SYNC=1 (the old method, labelled: a synchronize around every timed
# all-reduce, which adds the ranks' launch skew to each).
set -u -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
use_out
RATE=${RATE:-8}
SIZES=${SIZES:-1M,4M,16M,64M,256M}
DTYPES=${DTYPES:-f32,bf16}
ITERS=${ITERS:-20}
STEP_TIMEOUT=${STEP_TIMEOUT:-900}
DRYRUN=${DRYRUN:-0}
MODES=${MODES:-"ring-socket ring-tally collnet collnet-auto"}

summary="$OUT/summary.txt"
say() { echo "$*" | tee -a "$summary"; }
die() { say "FAILED: $*"; exit 1; }
: >"$summary"
say "tally cluster proof, $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores"
[ -x "$TALLY_BIN" ] || die "tally binary not found (set TALLY_BIN=/abs/path/tally)"
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, tc)"

half=$("$PYTHON" -c "print(f'{$RATE / 2:g}')") || die "$PYTHON does not run"
if [ "$DRYRUN" = 1 ]; then
    G=${G:-2}
    say "dry run: $G ranks without GPUs; rates $RATE and $half Gbit/s"
else
    timeout 60 nvidia-smi -L >"$OUT/gpus.txt" 2>&1 || die "nvidia-smi failed: $(cat "$OUT/gpus.txt")"
    G=${G:-$(grep -c '^GPU ' "$OUT/gpus.txt")}
    [ "$G" -ge 2 ] || die "need at least 2 GPUs (found $G)"
    timeout 120 "$PYTHON" -c 'import torch; print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' \
        >"$OUT/torch.txt" 2>&1 || die "python/torch: $(cat "$OUT/torch.txt")"
    say "GPUs: $G of $(grep -c '^GPU ' "$OUT/gpus.txt") ($(head -1 "$OUT/gpus.txt")); $(cat "$OUT/torch.txt")"
    [ -f "$PLUGIN" ] || die "plugin not found (set PLUGIN=/abs/path/libnccl-net-tally.so)"
fi
cluster() { # rate logname cmd...
    local rate=$1 log=$2
    shift 2
    # shellcheck disable=SC2086 # CLUSTER_ARGS is split into arguments
    timeout -k 10 "$STEP_TIMEOUT" "$TALLY_BIN" bench cluster --hosts "$G" --rates "$rate" --timeout "$STEP_TIMEOUT" \
        --log "$OUT/$log.tally.log" ${CLUSTER_ARGS:-} "$@"
}

declare -A verdict
base_env="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"
base_env="$base_env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV,TUNING,COLL PYTHONUNBUFFERED=1"
run() { # mode rate
    local mode=$1 rate=$2 env name="$1-$2"
    case $mode in
        ring-socket) env="NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_ALGO=Ring" ;;
        ring-tally) env="NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=Tally NCCL_ALGO=Ring" ;;
        collnet) env="NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=Tally NCCL_COLLNET_ENABLE=1 NCCL_ALGO=CollNetChain" ;;
        collnet-auto) env="NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=Tally NCCL_COLLNET_ENABLE=1" ;;
        *) say "unknown mode $mode"; return ;;
    esac
    say ""
    say "=== $name: $env"
    local res="$OUT/$name.jsonl" t0=$SECONDS
    : >"$res"
    # NCCL writes each rank's log to its own file (%h host, %p pid).
    cluster "$rate" "$name" --workers-run "env $base_env $env NCCL_DEBUG_FILE=$OUT/$name.nccl.%h.%p.log \
        $PYTHON $here/cluster_allreduce.py --label $mode --sizes $SIZES --dtypes $DTYPES --iters $ITERS ${PER_OP_SYNC:+--per-op-sync} --out $res" \
        >"$OUT/$name.out" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then verdict[$name]="ok ($((SECONDS - t0)) s)"; else verdict[$name]="FAILED rc=$rc ($((SECONDS - t0)) s)"; fi
    # What the shaped links lost meanwhile (bench cluster's last line per rate).
    local loss
    loss=$(sed -n 's/^# loss on the links at [0-9.]* Gbit\/s: \(.*\) (per row.*/\1/p' "$OUT/$name.out" | tail -1)
    [ -n "$loss" ] && verdict[$name]+="; $loss"
    say "$name: ${verdict[$name]}"
    [ $rc -eq 0 ] || tail -20 "$OUT/$name.out" | tee -a "$summary" >/dev/null
}

if [ "$DRYRUN" = 1 ]; then
    for rate in "$RATE" "$half"; do
        name="dry-$rate"
        cluster "$rate" "$name" --workers-run "$PYTHON $here/cluster_allreduce.py --label dry --dry-run --out $OUT/$name.jsonl" \
            >"$OUT/$name.out" 2>&1
        rc=$?
        say "testbed at $rate Gbit/s: $(cat "$OUT/$name.jsonl" 2>/dev/null) rc=$rc"
        [ $rc -eq 0 ] && verdict[$name]=ok || verdict[$name]="FAILED rc=$rc"
        cluster "$rate" "tally-$rate" --mode agg,agg-plugin,ring --sizes 16M --iters 3 >"$OUT/tally-$rate.out" 2>&1
        rc=$?
        grep -E "^ +[0-9.]+ +(agg|agg-plugin|ring) " "$OUT/tally-$rate.out" | tee -a "$summary" >/dev/null
        [ $rc -eq 0 ] && verdict[tally-$rate]=ok || verdict[tally-$rate]="FAILED rc=$rc"
    done
else
    rates="$RATE $half"
    [ "${HALF:-1}" = 0 ] && rates="$RATE"
    for rate in $rates; do
        for m in $MODES; do run "$m" "$rate"; done
    done
    say ""
    method="t = wall / $ITERS back-to-back all-reduces (barrier before the loop only)"
    [ -n "${PER_OP_SYNC:-}" ] && method="t = median of $ITERS all-reduces each bracketed by synchronize (PER_OP_SYNC=1)"
    say "=== table: $method, G = $G; bounds: ring R x G/(2(G-1)), CollNet R (R in GB/s = Gbit/s / 8)"
    "$PYTHON" - "$OUT" "$G" "$RATE" "$half" $MODES <<'EOF' | tee -a "$summary"
import json, os, sys
out, g, rates, modes = sys.argv[1], int(sys.argv[2]), [float(sys.argv[3]), float(sys.argv[4])], sys.argv[5:]
def fmt(n):
    for u, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s}{u}"
    return str(n)
print(f"{'Gbit/s':>6} {'mode':>13} {'dtype':>5} {'size':>5} {'algbw':>8} {'busbw':>8} {'bound':>7} {'fraction':>8} {'coll/ring':>9} {'p50 ms':>7} {'p99 ms':>7} {'wrong':>6} {'bf16 off':>8} {'host busy,wait':>14}")
def host(r):
    h = r.get("host") or {}
    if "busy_cores" not in h:
        return "-"
    w = f"{h['cpu_wait'] * 100:.0f}%" if "cpu_wait" in h else "-"
    return f"{h['busy_cores']:.1f}/{h['cores']},{w}"
for rate in rates:
    rows = {}
    for m in modes:
        p = os.path.join(out, f"{m}-{rate:g}.jsonl")
        if os.path.exists(p):
            for line in open(p):
                r = json.loads(line)
                rows[(m, r["dtype"], r["bytes"])] = r
    R = rate / 8
    for (m, d, b), r in sorted(rows.items(), key=lambda x: (x[0][1], x[0][2], x[0][0])):
        bound = R if m.startswith("collnet") else R * g / (2 * (g - 1))
        best_ring = max((rows[(x, d, b)]["algbw_GBps"] for x in ("ring-socket", "ring-tally") if (x, d, b) in rows), default=0)
        q = f"{r['algbw_GBps'] / best_ring:.2f}" if m.startswith("collnet") and best_ring else ""
        off = r["off_correct_rounding"] if d == "bf16" else ""
        print(f"{rate:>6g} {m:>13} {d:>5} {fmt(b):>5} {r['algbw_GBps']:>8.3f} {r['busbw_GBps']:>8.3f} {bound:>7.3f} {r['algbw_GBps'] / bound:>8.2f} {q:>9} {r.get('p50_us', 0) / 1e3:>7.2f} {r.get('p99_us', 0) / 1e3:>7.2f} {r['wrong']:>6} {off:>8} {host(r):>14}")
EOF
    say ""
    say "=== proof from the NCCL logs (rank 0's file of each run)"
    for rate in $rates; do
        for m in $MODES; do
            # Rank 0 logs each collective's algorithm; the others do not.
            f=$(grep -l " -> Algo " "$OUT/$m-$rate".nccl.*.log 2>/dev/null | head -1)
            [ -n "$f" ] || f=$(ls "$OUT/$m-$rate".nccl.*.log 2>/dev/null | head -1)
            [ -n "$f" ] || continue
            say "--- $m at $rate Gbit/s ($(basename "$f"))"
            grep -hE "Using network|Loaded (coll)?net plugin|CollNet|COLLNET|via NET/" "$f" | head -6 | sed 's/^/    /' | tee -a "$summary" >/dev/null
            # The algorithm NCCL chose for each all-reduce (NCCL_DEBUG_SUBSYS=COLL,TUNING).
            say "    algorithm per size (all-reduces counted):"
            grep -ohE "AllReduce: [0-9]+ Bytes -> Algo [A-Z_]+ proto [A-Z0-9]+" "$f" | sort | uniq -c | sort -k3n | sed 's/^/      /' |
                tee -a "$summary" >/dev/null
        done
    done
fi
say ""
say "=== verdicts"
bad=0
for k in "${!verdict[@]}"; do
    say "$k: ${verdict[$k]}"
    case "${verdict[$k]}" in ok*) ;; *) bad=1 ;; esac
done
exit $bad
