#!/usr/bin/env bash
# One command for a 16+ core host that has only the built binaries and
# devlib/ (scripts/device-pack.sh): builds nothing, writes everything under
# $OUT and a summary to $OUT/summary.txt.
#
#   LD_LIBRARY_PATH=$PWD/devlib/lib TALLY_IPROUTE=$PWD/devlib/iproute OUT=/tmp/out scripts/device-session.sh [parts]
#
# Parts (default all): latency, tail, cluster, demo.
#   latency  shm, busy, pinned: the ping-pong round trip, then back-to-back
#            4 KiB agg vs ring with 2, 4 and 8 ranks (mean, p50, p99), and
#            1 MiB / 64 MiB so that a change for small sizes shows whether
#            it cost the large ones.
#   tail     4 KiB loop alone, then beside a job streaming 64 MiB all-reduces
#            through the same server (p50, p99 of the small job).
#   cluster  emulated cluster (tally bench cluster): 4 + 4 and 8 + 8 hosts,
#            2-16 Gbit/s, 16 and 64 MiB, agg, agg through the NCCL plugin, ring.
#   demo     `tally demo` as a user runs it.
set -uo pipefail
cd "$(dirname "$0")/.."
TALLY="${TALLY:-$PWD/target/release/tally}"
FINAL="${OUT:-./out}"
PARTS="${*:-latency tail cluster demo}"
# Details go to a work folder, packed into one tarball at the end (the device
# tool brings back only a few files); the summary goes to $OUT/summary.txt.
OUT="$(mktemp -d /tmp/tally-session.XXXXXX)"
mkdir -p "$FINAL"
S="$FINAL/summary.txt"
finish() {
    tar -C "$OUT" -czf "$FINAL/details.tar.gz" . 2>/dev/null
}
trap finish EXIT
: >"$S"
say() { echo "$@" | tee -a "$S"; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
say "# tally device session on $(hostname): $(nproc) cores, $(uname -r); parts: $PARTS"
say "# $("$TALLY" --version)"
export TALLY_LOG=warn
C=$(nproc)

if has latency; then
    say ""
    say "## shm ping-pong (busy, cores $((C-2)),$((C-1)))"
    timeout 120 "$TALLY" bench p2p --provider shm --sizes 8,4K,64K,1M --cores $((C-2)),$((C-1)) 2>>"$OUT/p2p.err" | tee -a "$S"
    timeout 120 "$TALLY" bench p2p --provider shm --sizes 4K --cores $((C-2)),$((C-1)) --json 2>/dev/null >"$OUT/p2p.json"
    for n in 2 4 8; do
        lc=2; [ "$n" -ge 8 ] && lc=2-3
        say ""
        say "## $n ranks (pinned to cores 8-15), server lcores $lc, busy, shm: back-to-back"
        timeout 300 "$TALLY" bench allreduce --ranks "$n" --lcores "$lc" --rank-cores 8-15 --poll busy --provider shm \
            --sizes 4K --iters 1000 --warmup 50 --mode agg,ring --json 2>>"$OUT/lat.err" >"$OUT/lat$n-small.json" || say "FAILED (see lat.err)"
        timeout 300 "$TALLY" bench allreduce --ranks "$n" --lcores "$lc" --rank-cores 8-15 --poll busy --provider shm \
            --sizes 1M,64M --iters 20 --warmup 3 --mode agg,ring --json 2>>"$OUT/lat.err" >"$OUT/lat$n-large.json" || say "FAILED (see lat.err)"
        python3 - "$OUT/p2p.json" "$OUT/lat$n-small.json" "$OUT/lat$n-large.json" <<'PY' | tee -a "$S"
import json, sys
p = json.load(open(sys.argv[1]))
rtt = 2 * p["results"][0]["latency_us"]
rows = {}
for f in sys.argv[2:]:
    try:
        rows.update({(r["mode"], r["bytes"]): r for r in json.load(open(f))["results"]})
    except Exception as e:
        print(f"{f}: {e}")
print(f"{'mode':>10} {'size':>9} {'mean us':>10} {'p50 us':>9} {'p99 us':>9} {'max us':>9} {'busbw GB/s':>11}")
for (m, b), r in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
    print(f"{m:>10} {b:>9} {r['time_us']:>10.2f} {r['p50_us']:>9.2f} {r['p99_us']:>9.2f} {r['max_us']:>9.2f} {r['busbw_GBps']:>11.3f}")
a4, r4 = rows.get(("agg", 4096)), rows.get(("ring", 4096))
if a4 and r4:
    print(f"4 KiB: agg mean {a4['time_us']:.2f} us = {a4['time_us']/rtt:.2f} x shm round trip ({rtt:.2f} us); agg/ring time {a4['time_us']/r4['time_us']:.2f}; agg p99/p50 {a4['p99_us']/a4['p50_us']:.2f}")
PY
    done
fi

if has tail; then
    say ""
    say "## tail: 4 KiB agg loop (2 ranks) alone and beside a 64 MiB agg job (2 ranks), one server, 2 lcores busy"
    "$TALLY" server --listen 127.0.0.1:7470 --lcores 2-3 --poll busy --provider shm --slab-size 512M >"$OUT/tail-server.out" 2>"$OUT/tail-server.err" &
    SP=$!
    for _ in $(seq 300); do grep -q ready "$OUT/tail-server.out" 2>/dev/null && break; sleep 0.1; done
    small() { timeout -k 5 120 "$TALLY" bench allreduce --servers 127.0.0.1:7470 --provider shm --ranks 2 --rank-cores "$1" --poll busy \
        --sizes 4K --iters 5000 --warmup 100 --mode agg --timeout 30 --json 2>>"$OUT/tail.err"; }
    small 8,9 >"$OUT/tail-alone.json"
    # The big job ends by itself (bounded iterations), long after the small loop.
    timeout -k 5 120 "$TALLY" bench allreduce --servers 127.0.0.1:7470 --provider shm --ranks 2 --rank-cores 10,11 --poll busy \
        --sizes 64M --iters 150 --warmup 2 --mode agg --timeout 30 --json >"$OUT/tail-big.json" 2>>"$OUT/tail.err" &
    BP=$!
    sleep 1.5
    small 8,9 >"$OUT/tail-loaded.json"
    wait "$BP"
    kill "$SP"; sleep 2; kill -9 "$SP" 2>/dev/null; wait "$SP" 2>/dev/null
    python3 - "$OUT/tail-alone.json" "$OUT/tail-loaded.json" <<'PY' | tee -a "$S"
import json, sys
a = json.load(open(sys.argv[1]))["results"][0]; b = json.load(open(sys.argv[2]))["results"][0]
print(f"alone:       mean {a['time_us']:.2f} us, p50 {a['p50_us']:.2f}, p99 {a['p99_us']:.2f}, max {a['max_us']:.1f}; p99/p50 {a['p99_us']/a['p50_us']:.2f}")
print(f"beside 64M:  mean {b['time_us']:.2f} us, p50 {b['p50_us']:.2f}, p99 {b['p99_us']:.2f}, max {b['max_us']:.1f}; p99/alone-p50 {b['p99_us']/a['p50_us']:.2f}")
PY
fi

if has cluster; then
    for h in 4 8; do
        say ""
        say "## emulated cluster, $h + $h hosts"
        timeout -k 5 280 "$TALLY" bench cluster --hosts "$h" --rates 16,8,4,2 --sizes 16M,64M --iters 5 --timeout 120 --mode agg,agg-plugin,ring \
            --plot "$OUT/cluster$h.svg" --log "$OUT/cluster$h.log" --json >"$OUT/cluster$h.json" 2>>"$OUT/cluster.err" || say "FAILED (see cluster.err)"
        python3 - "$OUT/cluster$h.json" <<'PY' | tee -a "$S"
import json, sys
v = json.load(open(sys.argv[1])); rows = v["rows"]
print("# placement:", v["placement"])
print(f"{'Gbit/s':>7} {'mode':>10} {'size':>9} {'algbw GB/s':>11} {'bound':>8} {'fraction':>9} {'agg/ring':>9} {'wrong':>6}")
for r in rows:
    ring = [x for x in rows if x["mode"] == "ring" and x["bytes"] == r["bytes"] and x["link_gbit"] == r["link_gbit"]]
    q = f"{r['algbw_GBps']/ring[0]['algbw_GBps']:.2f}" if r["mode"] != "ring" and ring else ""
    print(f"{r['link_gbit']:>7} {r['mode']:>10} {r['bytes']>>20:>7}Mi {r['algbw_GBps']:>11.4f} {r['bound_GBps']:>8.4f} {r['fraction']:>9.2f} {q:>9} {r['wrong']:>6}")
PY
    done
fi

if has demo; then
    say ""
    say "## tally demo"
    timeout 300 "$TALLY" demo --out "$OUT/demo" >"$OUT/demo.txt" 2>>"$OUT/demo.err"
    say "exit $?"
    grep -E "^ +(0\.|[0-9]+ )|agg reaches|verified|Part" "$OUT/demo.txt" | tee -a "$S" >/dev/null
    cat "$OUT/demo.txt" >>"$S"
fi
say "done"
