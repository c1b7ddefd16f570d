#!/usr/bin/env bash
# Proof with real NCCL that libnccl-net-tally.so carries all-reduce traffic.
#
# On one host with 2 GPUs, PyTorch (NCCL backend) runs two processes, one GPU
# each, and all-reduces float32 tensors from 1 KiB to 256 MiB (every element
# checked, >= 20 timed iterations back to back, busbw as nccl-tests defines it):
#
#   socket        NCCL's own Socket transport on lo: the baseline
#   tally-tcp     ncclNet of the Tally plugin over libfabric tcp;ofi_rxm
#   tally-shm     ncclNet of the Tally plugin over libfabric shm
#   collnet-tcp   ncclCollNet (CollNetChain) to a tally server over tcp
#   collnet-shm   ncclCollNet (CollNetChain) to a tally server over shm
#
# P2P and SHM transports are disabled so that the two GPUs talk through the
# network plugin; for CollNet each rank gets its own NCCL_HOSTID (two
# "nodes") and the servers run on this host. The NCCL log of every run is
# searched for proof that the plugin carried the traffic. Everything goes to
# $OUT (default ./out); $OUT/summary.txt has the table and the log excerpts.
#
# Builds nothing and needs no network: it uses the built artifacts only.
#
#   PLUGIN=/abs/libnccl-net-tally.so TALLY_BIN=/abs/tally OUT=/tmp/proof tests/nccl/gpu_proof.sh
#
# Environment (all optional):
#   PLUGIN       the plugin (default: target/release/libnccl-net-tally.so of this checkout,
#                else libnccl-net-tally.so next to this script)
#   TALLY_BIN    the tally binary (default: target/release/tally, else next to this script)
#   OUT          output folder (default ./out)
#   PYTHON       python with torch (default python3)
#   MODES        runs to make (default "socket tally-tcp tally-shm collnet-tcp collnet-shm")
#   MIN_SIZE / MAX_SIZE / ITERS   sizes and timed iterations (1K / 256M / 20)
#   LCORES       server lcores (default 2-5), POLL server polling (default busy if >= 8 cores)
#   STEP_TIMEOUT seconds per run (default 600)
set -u -o pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
use_out
MODES=${MODES:-"socket tally-tcp tally-shm collnet-tcp collnet-shm"}
MIN_SIZE=${MIN_SIZE:-1K}
MAX_SIZE=${MAX_SIZE:-256M}
ITERS=${ITERS:-20}
LCORES=${LCORES:-2-5}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
if [ -z "${POLL:-}" ]; then
    if [ "$(nproc)" -ge 8 ]; then POLL=busy; else POLL=adaptive; fi
fi

case "$PLUGIN" in /*) ;; *) PLUGIN=$(readlink -f "$PLUGIN") ;; esac

summary="$OUT/summary.txt"
say() { echo "$*" | tee -a "$summary"; }
die() { say "FAILED: $*"; exit 1; }
: >"$summary"

say "tally NCCL plugin proof, $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
[ -f "$PLUGIN" ] || die "plugin not found (set PLUGIN=/abs/path/libnccl-net-tally.so)"
[ -x "$TALLY_BIN" ] || die "tally binary not found (set TALLY_BIN=/abs/path/tally)"
say "plugin: $PLUGIN"
say "tally:  $TALLY_BIN"

# --- preflight: GPUs, torch, libfabric, the plugin's symbols ---------------
timeout 60 nvidia-smi -L >"$OUT/gpus.txt" 2>&1 || die "nvidia-smi failed: $(cat "$OUT/gpus.txt")"
ngpu=$(grep -c '^GPU ' "$OUT/gpus.txt")
say "GPUs: $ngpu ($(head -1 "$OUT/gpus.txt"))"
[ "$ngpu" -ge 2 ] || die "need 2 GPUs"
timeout 120 "$PYTHON" -c 'import torch; print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' >"$OUT/torch.txt" 2>&1 || die "python/torch: $(cat "$OUT/torch.txt")"
say "$(cat "$OUT/torch.txt")"
if ldd "$PLUGIN" | grep -q "not found"; then
    die "the plugin's libraries are missing: $(ldd "$PLUGIN" | grep 'not found' | tr -s ' ')"
fi
say "libfabric: $(ldd "$PLUGIN" | awk '/libfabric/ {print $3}' | xargs -r readlink -f)"
if command -v fi_info >/dev/null; then
    say "libfabric providers: $(timeout 30 fi_info -l 2>/dev/null | grep -o '^[a-z_0-9;]*' | tr '\n' ' ')"
fi
if command -v nm >/dev/null; then
    say "exported: $(nm -D --defined-only "$PLUGIN" | awk '{print $3}' | tr '\n' ' ')"
fi

# --- runs ---------------------------------------------------------------------
base_env=(
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV
    PYTHONUNBUFFERED=1
)
trap stop_server EXIT

start_server() { # provider
    local log="$OUT/server-$1.log"
    # The server and the plugin (with TALLY_SERVERS) set the same rxm eager limit
    # (rxm peers must agree on FI_OFI_RXM_EAGER_LIMIT: export it for both or neither).
    "$TALLY_BIN" server --listen 127.0.0.1:7400 --lcores "$LCORES" --provider "$1" --poll "$POLL" >"$log.out" 2>"$log" &
    server_pid=$!
    for _ in $(seq 150); do
        grep -q "tally server ready" "$log.out" 2>/dev/null && return 0
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.2
    done
    say "tally server ($1) did not start: $(tail -5 "$log")"
    server_pid=""
    return 1
}

port=29511
declare -A verdict
run_mode() { # mode
    local mode=$1 env=() extra=() log="$OUT/$1.log" res="$OUT/$1.jsonl"
    case $mode in
        socket) env=(NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo) ;;
        tally-tcp) env=(NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=Tally TALLY_PROVIDER=tcp TALLY_FABRIC_ADDR=127.0.0.1) ;;
        tally-shm) env=(NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=Tally TALLY_PROVIDER=shm) ;;
        collnet-tcp | collnet-shm)
            local prov=${mode#collnet-}
            start_server "$prov" || { verdict[$mode]="server failed"; return; }
            env=(NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=Tally TALLY_PROVIDER=$prov TALLY_FABRIC_ADDR=127.0.0.1
                TALLY_SERVERS=127.0.0.1:7400 NCCL_COLLNET_ENABLE=1 NCCL_ALGO=CollNetChain)
            extra=(--distinct-hosts)
            ;;
        *) say "unknown mode $mode"; return ;;
    esac
    port=$((port + 1))
    say ""
    say "=== $mode: ${env[*]}"
    local t0=$SECONDS
    env "${base_env[@]}" "${env[@]}" timeout -k 10 "$STEP_TIMEOUT" "$PYTHON" "$here/allreduce_bench.py" \
        --label "$mode" --out "$res" --min-size "$MIN_SIZE" --max-size "$MAX_SIZE" --iters "$ITERS" --port $port "${extra[@]}" \
        >"$log" 2>&1
    local rc=$?
    stop_server
    grep -E '^ *'"$mode"' ' "$log" | tee -a "$summary" >/dev/null
    if [ $rc -eq 0 ]; then verdict[$mode]="ok ($((SECONDS - t0)) s)"; else verdict[$mode]="FAILED rc=$rc ($((SECONDS - t0)) s)"; fi
    say "$mode: ${verdict[$mode]}"
    [ $rc -eq 0 ] || { say "--- last lines of $log:"; tail -25 "$log" | tee -a "$summary" >/dev/null; }
}

for m in $MODES; do run_mode "$m"; done

# --- table --------------------------------------------------------------------
say ""
say "=== busbw (GB/s), float32 sum, 2 ranks; 'x' = result wrong, '-' = no data"
"$PYTHON" - "$OUT" $MODES <<'EOF' | tee -a "$summary"
import json, os, sys
out, modes = sys.argv[1], sys.argv[2:]
data = {}
for m in modes:
    p = os.path.join(out, m + ".jsonl")
    if os.path.exists(p):
        for line in open(p):
            r = json.loads(line)
            data.setdefault(r["bytes"], {})[m] = r
def fmt(n):
    for u, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s}{u}"
    return str(n)
print(f"{'size':>6} " + " ".join(f"{m:>12}" for m in modes) + ("   tally-tcp/socket" if "socket" in modes and "tally-tcp" in modes else ""))
wins, losses = [], []
for b in sorted(data):
    row = data[b]
    cells = []
    for m in modes:
        r = row.get(m)
        cells.append("-".rjust(12) if r is None else (f"{r['busbw_GBps']:.3f}" + ("" if r["correct"] else " x")).rjust(12))
    ratio = ""
    if "socket" in row and "tally-tcp" in row:
        q = row["tally-tcp"]["busbw_GBps"] / max(row["socket"]["busbw_GBps"], 1e-12)
        ratio = f"   {q:6.2f}"
        if b >= 1 << 20:
            (wins if q >= 1.0 else losses).append(fmt(b))
    print(f"{fmt(b):>6} " + " ".join(cells) + ratio)
wrong = [(m, fmt(b)) for b, row in data.items() for m, r in row.items() if not r["correct"]]
print("results: " + ("all correct" if not wrong else f"WRONG: {wrong}"))
if wins or losses:
    print(f"tally-tcp >= socket at >= 1 MiB: {'yes' if not losses else 'no'} (>= at {wins or 'none'}; below at {losses or 'none'})")
EOF

# --- proof from the logs ------------------------------------------------------
say ""
say "=== proof from the NCCL logs"
excerpt() { # file pattern label
    local n
    n=$(grep -cE "$2" "$1" 2>/dev/null)
    n=${n:-0}
    say "[$3] $n line(s) matching /$2/ in $(basename "$1")"
    grep -E "$2" "$1" 2>/dev/null | head -4 | sed 's/^/    /' | tee -a "$summary" >/dev/null
    [ "$n" -gt 0 ]
}
for m in $MODES; do
    f="$OUT/$m.log"
    [ -f "$f" ] || continue
    say "--- $m"
    case $m in
        socket)
            excerpt "$f" 'via NET/Socket' "channels over NCCL Socket" ;;
        tally-*)
            excerpt "$f" 'NET/Plugin.*Tally|Loaded net plugin Tally' "plugin loaded"
            excerpt "$f" 'Using network Tally|NET/Tally' "NET/Tally in use"
            excerpt "$f" 'via NET/Tally' "channels via NET/Tally" ;;
        collnet-*)
            excerpt "$f" 'Loaded collnet plugin Tally' "collnet plugin loaded"
            excerpt "$f" 'CollNet rank .* joined job' "plugin joined a tally server job"
            excerpt "$f" 'COLLNET|CollNet|Collnet' "NCCL CollNet lines"
            excerpt "$OUT/server-${m#collnet-}.log" 'starting' "tally server ran the job" ;;
    esac
done
say ""
say "=== verdicts"
for m in $MODES; do say "$m: ${verdict[$m]:-not run}"; done
bad=0
for m in $MODES; do case "${verdict[$m]:-}" in ok*) ;; *) bad=1 ;; esac; done
exit $bad
