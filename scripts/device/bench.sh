#!/usr/bin/env bash
# Figures that need more cores than a development box: run on a 16+ core host
# with only the built `tally` binary (no toolchain, no network).
#   - core scaling (scripts/device/scale.sh): one server with 1, 2, 4, 8
#     lcores (busy, pinned), enough ranks over shm to keep it busy; server
#     input throughput per lcore count, by copy path, size and rank placement;
#   - latency: 2 ranks, 4 KiB agg all-reduce (busy polling, one lcore) against
#     the shm ping-pong round trip measured in the same run.
# Writes everything to $OUT (default ./out) and a summary to $OUT/summary.txt.
set -uo pipefail
TALLY="${TALLY:-./target/release/tally}"
OUT="${OUT:-./out}"
RANKS="${RANKS:-8}"
mkdir -p "$OUT"
S="$OUT/summary.txt"
: >"$S"
say() { echo "$@" | tee -a "$S"; }
say "# tally device bench on $(hostname): $(nproc) cores, $(uname -r)"
say "# $("$TALLY" --version)"
export TALLY_LOG=warn

say ""
say "## p2p baseline (shm, busy)"
timeout 300 "$TALLY" bench p2p --provider shm --sizes 8,4K,64K,1M,16M --cores 30,31 2>>"$OUT/p2p.err" | tee -a "$S"
timeout 120 "$TALLY" bench p2p --provider shm --sizes 4K --cores 30,31 --json 2>/dev/null >"$OUT/p2p.json"

say ""
say "## latency: 2 ranks, 4 KiB agg (1 lcore, busy) vs ring"
timeout 300 "$TALLY" bench allreduce --ranks 2 --lcores 2 --poll busy --sizes 4K,64K --iters 200 --warmup 20 --provider shm \
    --mode agg,ring --json 2>>"$OUT/lat.err" >"$OUT/lat.json"
cat "$OUT/lat.json" >>"$S"
python3 - "$OUT/p2p.json" "$OUT/lat.json" <<'PY' | tee -a "$S"
import json, sys
p = json.load(open(sys.argv[1])); a = json.load(open(sys.argv[2]))
rtt = 2 * p["results"][0]["latency_us"]
for r in a["results"]:
    if r["bytes"] == 4096:
        print(f"{r['mode']} 4 KiB median {r['time_us']:.2f} us = {r['time_us']/rtt:.2f} x the shm ping-pong round trip ({rtt:.2f} us); target for agg <= 3")
PY

say ""
say "## core scaling (scripts/device/scale.sh)"
OUT="$OUT" TALLY="$TALLY" RANKS="$RANKS" bash "$(dirname "$0")/scale.sh"
cat "$OUT/scale-summary.txt" >>"$S"

if [ -z "${SKIP_DEMO:-}" ]; then
    say ""
    say "## demo (the default job) on this host"
    timeout 300 "$TALLY" demo 2>>"$OUT/demo.err" | tee -a "$S" >/dev/null
fi
echo "done" >>"$S"
