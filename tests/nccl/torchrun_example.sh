#!/usr/bin/env bash
# The worker side of docs/nccl.md, runnable: the environment NCCL needs to
# all-reduce through tally servers, torchrun with torchrun_example.py (a DDP
# training loop that checks its own results), then the proof from NCCL's log.
# The commands docs/nccl.md shows for workers are the ones below, verbatim
# (tools/tests/docs_nccl.rs checks that).
#
# Against running servers, on every node (like any multi-node torchrun job):
#
#   TALLY_SERVERS=10.0.1.11:7400,10.0.1.12:7400 TALLY_TOKEN=... \
#   NNODES=4 NODE_RANK=0 NPROC=8 MASTER_ADDR=10.0.2.21 tests/nccl/torchrun_example.sh
#
# On one GPU host with nothing else (TALLY_SERVERS unset): starts a tally
# server on 127.0.0.1:7400 (provider tcp, a fresh token; `tally stats
# 127.0.0.1:9400` shows it live) and runs NPROC ranks (default 2), each its
# own NCCL "node" (TALLY_EXAMPLE_ONE_NODE_PER_GPU=1: one NCCL_HOSTID per
# rank), so that CollNet applies; ranks beyond the GPU count share GPUs.
# All-reduce is then restricted to CollNet (NCCL_ALGO=allreduce:collnetchain):
# the run fails rather than falls back to NCCL's own algorithms. Seen passing
# on one H100 (PyTorch 2.11, NCCL 2.28.9).
#
# Builds nothing: it uses target/release/tally and
# target/release/libnccl-net-tally.so of this checkout (`make`), or TALLY_BIN
# and TALLY_LIB. Exits 0 when the training checked out and the log shows the
# CollNet lines docs/nccl.md lists.
#
# Environment (all optional):
#   TALLY_BIN      the tally binary (default target/release/tally, else next to this script)
#   TALLY_LIB      folder holding libnccl-net-tally.so (default: TALLY_BIN's folder)
#   TALLY_SERVERS TALLY_TOKEN TALLY_PROVIDER TALLY_FABRIC_ADDR TALLY_TIMEOUT_S   see docs/nccl.md
#   NNODES NODE_RANK NPROC MASTER_ADDR MASTER_PORT   torchrun's (default 1 0 2 127.0.0.1 29500)
#   FORCE_COLLNET  1: all-reduce may use CollNet only (default 1 without TALLY_SERVERS, else 0)
#   LOG            where the job's output goes (default ./torchrun_example.log)
#   LCORES         lcores of the local server (default 2-5; 0-1 on hosts with fewer than 8 cores)
set -u -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LOG=${LOG:-./torchrun_example.log}
touch "$LOG" && LOG=$(readlink -f "$LOG")
die() { echo "torchrun_example: FAILED: $*" >&2; exit 1; }

[ -x "$TALLY_BIN" ] || die "tally binary not found (run make, or set TALLY_BIN)"
TALLY_LIB=${TALLY_LIB:-$(dirname "$TALLY_BIN")}
[ -e "$TALLY_LIB/libnccl-net-tally.so" ] || die "no libnccl-net-tally.so in $TALLY_LIB (run make, or set TALLY_LIB)"
TALLY_LIB=$(readlink -f "$TALLY_LIB")
# `tally` below is that binary.
PATH="$(dirname "$TALLY_BIN"):$PATH"
command -v torchrun >/dev/null || die "torchrun not found (PyTorch's launcher)"
# torchrun is given tests/nccl/torchrun_example.py, as docs/nccl.md writes it.
cd "$root"

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
NPROC=${NPROC:-2}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}

trap stop_server EXIT

if [ -z "${TALLY_SERVERS:-}" ]; then
    one_host=1
    if [ -z "${LCORES:-}" ]; then
        if [ "$(nproc)" -ge 8 ]; then LCORES=2-5; else LCORES=0-1; fi
    fi
    export TALLY_PROVIDER=${TALLY_PROVIDER:-tcp}
    export TALLY_FABRIC_ADDR=${TALLY_FABRIC_ADDR:-127.0.0.1}
    export TALLY_EXAMPLE_ONE_NODE_PER_GPU=1
    # The GPUs talk through the plugin only; NVLink multicast stays off.
    export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0
    token=${TALLY_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
    srv_log="${LOG%.log}.server"
    # The server and the plugin set the same rxm eager limit (rxm peers must
    # agree on FI_OFI_RXM_EAGER_LIMIT: engine/src/dataplane/fabric/defaults.rs).
    TALLY_TOKEN=$token tally server --listen 127.0.0.1:7400 --lcores "$LCORES" --provider "$TALLY_PROVIDER" --poll adaptive \
        --metrics 127.0.0.1:9400 >"$srv_log.out" 2>"$srv_log.log" &
    server_pid=$!
    for _ in $(seq 150); do
        grep -q "tally server ready" "$srv_log.out" 2>/dev/null && break
        kill -0 "$server_pid" 2>/dev/null || die "the tally server did not start: $(tail -5 "$srv_log.log")"
        sleep 0.2
    done
    grep -q "tally server ready" "$srv_log.out" || die "the tally server did not start in 30 s"
    echo "torchrun_example: $(cat "$srv_log.out")"
    servers=127.0.0.1:7400
else
    one_host=0
    servers=$TALLY_SERVERS
    token=${TALLY_TOKEN:-}
    [ -n "$token" ] || echo "torchrun_example: TALLY_TOKEN is empty (servers without a token accept anyone)" >&2
fi
FORCE_COLLNET=${FORCE_COLLNET:-$one_host}

# --- what docs/nccl.md tells a worker to set ---------------------------------
export NCCL_NET_PLUGIN=tally
export LD_LIBRARY_PATH=$TALLY_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TALLY_SERVERS=$servers
export TALLY_TOKEN=$token
export NCCL_COLLNET_ENABLE=1
eval "$(tally efa-env print --role worker)"
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING
if [ "$FORCE_COLLNET" = 1 ]; then
    export NCCL_ALGO=allreduce:collnetchain
fi
export PYTHONUNBUFFERED=1

echo "torchrun_example: TALLY_SERVERS=$TALLY_SERVERS provider=${TALLY_PROVIDER:-auto} NCCL_ALGO=${NCCL_ALGO:-auto} nodes=$NNODES node_rank=$NODE_RANK nproc=$NPROC log=$LOG"
torchrun --nnodes="$NNODES" --node-rank="$NODE_RANK" --nproc-per-node="$NPROC" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" tests/nccl/torchrun_example.py 2>&1 | tee "$LOG"
rc=$?

# --- the proof docs/nccl.md describes -----------------------------------------
echo "torchrun_example: CollNet set-up lines in $LOG:"
grep -E 'Loaded (net|collnet) plugin Tally|via COLLNET/Tally|CollNet rank .* joined job' "$LOG"
echo "torchrun_example: all-reduces NCCL ran as CollNet (rank 0's TUNING lines):"
grep -cE 'AllReduce: [0-9]+ Bytes -> Algo COLLNET' "$LOG"
missing=()
for pattern in 'Loaded net plugin Tally' 'Loaded collnet plugin Tally' 'via COLLNET/Tally' 'CollNet rank .* joined job'; do
    grep -qE "$pattern" "$LOG" || missing+=("$pattern")
done
if [ "$FORCE_COLLNET" = 1 ]; then
    grep -qE 'AllReduce: [0-9]+ Bytes -> Algo COLLNET' "$LOG" || missing+=("AllReduce ... Algo COLLNET")
fi
if [ -n "$server_pid" ]; then
    stop_server
    echo "torchrun_example: jobs the server ran:"
    grep -E 'job .*: starting' "$srv_log.log" | sed 's/^/    /'
    grep -qE 'job .*: starting' "$srv_log.log" || missing+=("a job on the server")
fi

[ $rc -eq 0 ] || die "torchrun exited with $rc (see $LOG)"
grep -q "torchrun_example: ok" "$LOG" || die "the training did not check out (see $LOG)"
[ ${#missing[@]} -eq 0 ] || die "not in the log: ${missing[*]}"
echo "torchrun_example: ok: all-reduce went through the Tally plugin's CollNet"
