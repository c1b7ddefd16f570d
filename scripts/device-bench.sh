#!/usr/bin/env bash
# Figures that need more cores than a development box: run on a 16+ core host
# with only the built `tally` binary (no toolchain, no network).
#   - core scaling: one server with 1, 2, 4, 8 lcores (busy, pinned), enough
#     ranks over shm to keep it busy; server input throughput per lcore count;
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
say "## core scaling: one server, L lcores (busy, pinned to cores 0..L-1), $RANKS ranks, shm, 64 MiB f32 sum per rank"
say "lcores  time(ms)  server input GB/s  per-lcore GB/s  vs linear"
base=""
for L in 1 2 4 8; do
    last=$((L - 1))
    timeout 600 "$TALLY" bench allreduce --mode agg --ranks "$RANKS" --lcores "0-$last" --poll busy --sizes 64M --iters 10 --warmup 2 \
        --chunk 256K --window 8 --provider shm --json 2>>"$OUT/scale.err" >"$OUT/scale-$L.json" || say "L=$L failed: $(tail -3 "$OUT/scale.err")"
    python3 - "$OUT/scale-$L.json" "$L" "$RANKS" "${base:-0}" <<'PY' | tee -a "$S" >"$OUT/scale-$L.txt"
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]; L = int(sys.argv[2]); n = int(sys.argv[3]); base = float(sys.argv[4])
thr = n * r["bytes"] / (r["time_us"] * 1e-6) / 1e9
lin = thr / (base * L) if base else 1.0
print(f"{L:>6} {r['time_us']/1e3:>9.1f} {thr:>18.2f} {thr/L:>15.2f} {lin:>10.2f}   wrong={r['wrong']}")
PY
    if [ -z "$base" ]; then base=$(python3 -c "import json;r=json.load(open('$OUT/scale-1.json'))['results'][0];print($RANKS*r['bytes']/(r['time_us']*1e-6)/1e9)" 2>/dev/null || echo 0); fi
done

say ""
say "## demo (the default job) on this host"
timeout 300 "$TALLY" demo 2>>"$OUT/demo.err" | tee -a "$S" >/dev/null
echo "done" >>"$S"
