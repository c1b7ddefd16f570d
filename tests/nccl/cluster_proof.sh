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
# R/2) one run per mode (MODES):
#
#   ring-socket      NCCL ring over NCCL's Socket transport, its defaults
#   ring-socket-AxB  the same tuned as a user could: NCCL_SOCKET_NTHREADS=A
#                    NCCL_NSOCKS_PERTHREAD=B (A 1-16, A x B <= 64, NCCL's
#                    limits); one per TUNED_RINGS entry, at R only unless
#                    TUNED_HALF=1
#   ring-tally       NCCL ring over tally's ncclNet (tcp;ofi_rxm)
#   collnet          CollNet through the tally servers (NCCL_COLLNET_ENABLE=1,
#                    NCCL_ALGO=CollNetChain)
#   collnet-auto     CollNet enabled, NCCL_ALGO unset: which algorithm NCCL
#                    picks on its own (see the TUNING lines)
#
# f32 and bf16, 1 MiB to 256 MiB, every element checked, ITERS back to back
# (tests/nccl/timing.py). The summary (tests/nccl/proof_table.py) gives
# algbw, busbw, the link bound (ring <= R x G / (2(G-1)), reduction servers
# <= R), the fraction of it, CollNet / best ring (the best of every ring mode
# that ran at that rate, dtype and size; a line per size names it and each
# other ring's share of it), bf16 elements not correctly rounded, each rank
# process's own CPU (every thread: NCCL's proxy, the plugin's): the median
# rank's CPU seconds per GB all-reduced over the timed loop, the same less
# the Python main thread (which spins in the synchronize ending the loop),
# and the largest rank's idle CPU over IDLE_S seconds after the loop with
# nothing in flight (% of a core); the machine's cores busy and the share of
# the time some task waited for a CPU over each timed loop (every node
# shares the machine), and the NCCL log lines that show who carried the
# traffic (and the Socket threads and sockets each ring used).
#
#   PLUGIN=/abs/libnccl-net-tally.so TALLY_BIN=/abs/tally OUT=/tmp/c TALLY_IPROUTE=/abs/iproute \
#       tests/nccl/cluster_proof.sh
#
# DRYRUN=1 needs no GPU and no torch (this machine, CI): the same testbed
# with G ranks that rendezvous and reach every server through the shaped
# links (and read their process CPU over IDLE_S idle, a line "ranks' idle
# CPU": the reading works, no plugin loaded), then tally's own agg,
# agg-plugin (the plugin's CollNet as NCCL drives it) and ring over the same
# links. Builds nothing.
#
# G may exceed the host's GPUs: ranks then share them round-robin (each
# still its own NCCL node), which checks the whole path on a 1-GPU host but
# says nothing about speed.
#
# Environment (all optional): G (ranks; default: one per GPU), RATE (Gbit/s, default
# 8; R/2 runs too), SIZES (1M,4M,16M,64M,256M), DTYPES (f32,bf16), ITERS
# (20), TUNED_RINGS (the ring-socket-AxB modes: "2x8 4x4 8x2"; empty: none),
# TUNED_HALF (1: those at R/2 too; default R only, each run costs device
# time), MODES (default: ring-socket, one ring-socket-AxB per TUNED_RINGS,
# ring-tally, collnet, collnet-auto), IDLE_S (1: idle seconds read after
# each timed loop; 0: none), PYTHON (python3), STEP_TIMEOUT (s per run, 900), HALF (0: R only), DRYRUN,
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
TUNED_RINGS=${TUNED_RINGS-"2x8 4x4 8x2"}
TUNED_HALF=${TUNED_HALF:-0}
IDLE_S=${IDLE_S:-1}
tuned_modes=""
for t in $TUNED_RINGS; do tuned_modes+=" ring-socket-$t"; done
MODES=${MODES:-"ring-socket$tuned_modes ring-tally collnet collnet-auto"}

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
# The Socket ring's own defaults unless a mode tunes them (not the caller's).
base_env="-u NCCL_SOCKET_NTHREADS -u NCCL_NSOCKS_PERTHREAD NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"
base_env="$base_env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV,TUNING,COLL PYTHONUNBUFFERED=1"
run() { # mode rate
    local mode=$1 rate=$2 env name="$1-$2"
    case $mode in
        ring-socket) env="NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_ALGO=Ring" ;;
        ring-socket-*x*)
            # NCCL caps NCCL_SOCKET_NTHREADS at 16 and the sockets (A x B) at 64.
            local a=${mode#ring-socket-} b
            b=${a#*x} a=${a%x*}
            if ! [[ $a =~ ^[0-9]+$ && $b =~ ^[0-9]+$ ]] || ((10#$a < 1 || 10#$a > 16 || 10#$b < 1 || 10#$a * 10#$b > 64)); then
                verdict[$name]="FAILED: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD must be 1-16 x 1-64 with a product <= 64"
                say "$name: ${verdict[$name]}"
                return
            fi
            env="NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_ALGO=Ring NCCL_SOCKET_NTHREADS=$a NCCL_NSOCKS_PERTHREAD=$b" ;;
        ring-tally) env="NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=Tally NCCL_ALGO=Ring" ;;
        collnet) env="NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=Tally NCCL_COLLNET_ENABLE=1 NCCL_ALGO=CollNetChain" ;;
        collnet-auto) env="NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=Tally NCCL_COLLNET_ENABLE=1" ;;
        *) verdict[$name]="FAILED: unknown mode"; say "$name: ${verdict[$name]}"; return ;;
    esac
    say ""
    say "=== $name: $env"
    local res="$OUT/$name.jsonl" t0=$SECONDS
    : >"$res"
    # NCCL writes each rank's log to its own file (%h host, %p pid).
    cluster "$rate" "$name" --workers-run "env $base_env $env NCCL_DEBUG_FILE=$OUT/$name.nccl.%h.%p.log \
        $PYTHON $here/cluster_allreduce.py --label $mode --sizes $SIZES --dtypes $DTYPES --iters $ITERS --idle-s $IDLE_S ${PER_OP_SYNC:+--per-op-sync} --out $res" \
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
        cluster "$rate" "$name" --workers-run "$PYTHON $here/cluster_allreduce.py --label dry --dry-run --idle-s $IDLE_S --out $OUT/$name.jsonl" \
            >"$OUT/$name.out" 2>&1
        rc=$?
        say "testbed at $rate Gbit/s: $(cat "$OUT/$name.jsonl" 2>/dev/null) rc=$rc"
        grep -m1 "^ranks' idle CPU" "$OUT/$name.out" | sed 's/^/    /' | tee -a "$summary" >/dev/null
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
        for m in $MODES; do
            # The tuned Socket rings at R only, unless TUNED_HALF=1.
            case $m in ring-socket-*) [ "$rate" = "$RATE" ] || [ "$TUNED_HALF" = 1 ] || continue ;; esac
            run "$m" "$rate"
        done
    done
    say ""
    method="t = wall / $ITERS back-to-back all-reduces (barrier before the loop only)"
    [ -n "${PER_OP_SYNC:-}" ] && method="t = median of $ITERS all-reduces each bracketed by synchronize (PER_OP_SYNC=1)"
    say "=== table: $method, G = $G; bounds: ring R x G/(2(G-1)), CollNet R (R in GB/s = Gbit/s / 8)"
    say "    cpu s/GB: the median rank's process CPU (every thread) per GB all-reduced over the loop; -main: less its Python"
    say "    main thread (which spins in the synchronize); idle%: the largest rank's process CPU over $IDLE_S s after the loop"
    # shellcheck disable=SC2086 # MODES is a list
    "$PYTHON" "$here/proof_table.py" "$OUT" "$G" --rates $rates --modes $MODES | tee -a "$summary"
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
            # The Socket transport's helper threads and sockets (NCCL logs none
            # where it uses its default here: no helper threads, the data on its
            # control socket, progressed by the proxy thread).
            case $m in ring-socket*)
                t=$(grep -m1 -ohE "NET/Socket: Using [0-9]+ threads and [0-9]+ sockets per thread" "$f")
                [ -n "$t" ] || t="NET/Socket: no helper-thread line (NCCL's default: its proxy thread alone)"
                say "    $t" ;;
            esac
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
