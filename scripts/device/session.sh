#!/usr/bin/env bash
# One command for a 16+ core host that has only the built binaries and
# devlib/ (scripts/device/pack.sh): builds nothing, writes everything under
# $OUT and a summary to $OUT/summary.txt.
#
#   LD_LIBRARY_PATH=$PWD/devlib/lib TALLY_IPROUTE=$PWD/devlib/iproute OUT=/tmp/out scripts/device/session.sh [parts]
#
# Parts (default all but profile): latency, tail, cluster, demo, profile.
#   matrix   4 KiB agg vs ring, busy, back-to-back: 2, 4, 8 ranks against
#            server lcore sets of 1, 2 and 4 cores and TALLY_MIN_PIECE 4K,
#            2K, 1K (how far a small all-reduce is spread over lcores).
#   scale    core scaling: 8 ranks (cores 8-15), 64 MiB, one server with 1,
#            2, 4, 8 lcores (cores 0-7), against the shm transport ceiling
#            in the same run: `tally bench p2p --hubs L --leaves 8`, the same
#            streams each way moving the same bytes with no reduce.
#   cpu16    4 + 4 and 8 + 8 hosts at 16 Gbit/s (CPU-bound here), 30
#            all-reduces per figure: busy against adaptive polling, 1
#            against 2 lcores per server.
#   profile  host facts (clock source, core siblings), ping-pong between
#            several core pairs, a 1-rank agg loop (one hop through a server
#            against one ping-pong), and perf profiles (perf carried in
#            devlib/perf.tar.xz) of the 2-rank 4 KiB agg loop and of the
#            emulated cluster at its highest rate. Knobs: PF_CLUSTER (1; 0
#            leaves out the cluster's profile), PF_LINES (25 symbols a core).
#   latency  shm, busy, pinned: the ping-pong round trip, then back-to-back
#            4 KiB agg vs ring with 2, 4 and 8 ranks (mean, p50, p99), and
#            1 MiB / 64 MiB so that a change for small sizes shows whether
#            it cost the large ones. Knobs: LAT_RANKS ("2 4 8"), LAT_LARGE
#            (1; 0 leaves out 1 MiB / 64 MiB).
#   tail     4 KiB loop alone, then beside a job streaming 64 MiB all-reduces
#            through the same server (p50, p99 of the small job).
#   cluster  emulated cluster (tally bench cluster): 4 + 4 and 8 + 8 hosts,
#            2-16 Gbit/s, 16 and 64 MiB, agg, agg through the NCCL plugin, ring.
#   ranks    many ranks (issue 18): one server (lcores 0-3, tcp, adaptive),
#            8 and then 1024 ranks (threads, 64 per process, on the other
#            cores), 4 KiB and 1 MiB, every element checked: p50, the time
#            from the bench's start to the job running, and the server's
#            threads and VmRSS (sampled every 0.2 s, the highest seen).
#   rankscale  issue 18's target, throughput per lcore with many ranks: one
#            server (lcores 0-3, tcp, adaptive), ranks (threads above 64) on
#            the other cores; 8 ranks against 1024 at the same total bytes
#            per operation (8 x 64 MiB against 1024 x 512 KiB), once with the
#            default chunk (the server shrinks 1024 ranks' pieces to fit its
#            slab budget) and once with every run at the piece 1024 ranks get
#            (32 KiB: the same number of messages). Figure: server input
#            GB/s per lcore = ranks x bytes per rank / time (loop mean) /
#            lcores, and its ratio to 8 ranks' (issue 18 asks >= 0.8). Each
#            pair is run twice (8, N, 8, N) so the spread shows. Knobs (to
#            shrink it on a small host): RS_LCORES (0-3), RS_RANKS ("8 1024",
#            the first is the baseline; RANKS:WINDOW sets one count's window), RS_TOTAL (512M), RS_PIECE (32K),
#            RS_WINDOW (2), RS_ITERS (10), RS_REPEAT (2), RS_SLAB (256M),
#            RS_CASES ("chunk piece"), RS_DTYPE (f32; bf16 etc.), RS_LIBS (library folders put first
#            on LD_LIBRARY_PATH, one pass each, e.g. "devlib/lib
#            devlib/libfabric-1.22": libfabric builds side by side; default
#            the inherited path only; ",VAR=value" after a folder sets
#            variables for that pass; RPS=1 there steers loopback's receive
#            processing to the ranks' cores, STAGE=N gives the server
#            --stage-buffers N), RS_PERF (1: perf profile of the
#            lcores in each run, from devlib/perf.tar.xz).
#   fostage  what failover's staging copy costs: 8 ranks (cores 8-15)
#            against 3 servers (tcp, busy, lcores 0-1, 2-3, 4-5), 4 KiB,
#            1 MiB and 64 MiB, with TALLY_FAILOVER=0 and =1, same run.
#   relay    the two-rank relay against TALLY_RELAY=0, alternated: RL_ROUNDS
#            (8) rounds of a 4 KiB ping-pong round trip (cores 2,8), then per
#            setting 2 ranks 4 KiB (10,000 back-to-back) and 1 MiB (300), shm,
#            busy, server lcore 2: mean, p50 (last rank), rank 0's own p50.
#   split    small all-reduces split by rank over lcores, alternated beside
#            the ring: SP_ROUNDS (4) rounds of SP_CASES ("4:2-3 8:2-3 8:2-5",
#            ranks:server lcores), 4 KiB, SP_ITERS (10000) back-to-back, shm,
#            busy: mean, p50, p99, p99/p50, agg/ring. SP_MODES ("split
#            whole"): split by rank (TALLY_SPLIT=1), whole on one lcore per
#            operation (TALLY_SPLIT=0). SP_LIBS
#            (library folders put first on LD_LIBRARY_PATH, one pass each
#            inside every round; default the inherited path). A mode may end
#            in @VAR=value,VAR=value: variables for its runs (e.g.
#            split@TALLY_MIN_PIECE=2K).
#   demo     `tally demo` as a user runs it.
set -uo pipefail
cd "$(dirname "$0")/../.."
TALLY="${TALLY:-$PWD/target/release/tally}"
FINAL="${OUT:-./out}"
PARTS="${*:-latency tail cluster demo}"
DEVLIB="${DEVLIB:-$PWD/devlib}"
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
    # The round trip the ratios use: 20000 ping-pongs between the server's
    # core and rank 0's (1000 varied by 20% from run to run on the device VM).
    timeout 120 "$TALLY" bench p2p --provider shm --sizes 4K --iters 20000 --cores 2,8 --json 2>/dev/null >"$OUT/p2p.json"
    say "round trip for the ratios below (4 KiB, cores 2,8, median of 20000): $(python3 -c 'import json,sys; print("%.2f us" % (2 * json.load(open(sys.argv[1]))["results"][0]["latency_us"]))' "$OUT/p2p.json")"
    for n in ${LAT_RANKS:-2 4 8}; do
        lc=2; [ "$n" -ge 8 ] && lc=2-3
        say ""
        say "## $n ranks (pinned to cores 8-15), server lcores $lc, busy, shm: back-to-back"
        timeout 300 "$TALLY" bench allreduce --ranks "$n" --lcores "$lc" --cores 8-15 --poll busy --provider shm \
            --sizes 4K --iters 10000 --warmup 500 --mode agg,ring --json 2>>"$OUT/lat.err" >"$OUT/lat$n-small.json" || say "FAILED (see lat.err)"
        rm -f "$OUT/lat$n-large.json"
        [ "${LAT_LARGE:-1}" = 1 ] && { timeout 300 "$TALLY" bench allreduce --ranks "$n" --lcores "$lc" --cores 8-15 --poll busy --provider shm \
            --sizes 1M,64M --iters 20 --warmup 3 --mode agg,ring --json 2>>"$OUT/lat.err" >"$OUT/lat$n-large.json" || say "FAILED (see lat.err)"; }
        python3 - "$OUT/p2p.json" "$OUT/lat$n-small.json" "$OUT/lat$n-large.json" <<'PY' | tee -a "$S"
import json, os, sys
p = json.load(open(sys.argv[1]))
rtt = 2 * p["results"][0]["latency_us"]
rows = {}
for f in sys.argv[2:]:
    if not os.path.exists(f):
        continue
    try:
        rows.update({(r["mode"], r["bytes"]): r for r in json.load(open(f))["results"]})
    except Exception as e:
        print(f"{f}: {e}")
print(f"{'mode':>10} {'size':>9} {'mean us':>10} {'p50 us':>9} {'p99 us':>9} {'max us':>9} {'busbw GB/s':>11}")
for (m, b), r in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
    print(f"{m:>10} {b:>9} {r['time_us']:>10.2f} {r['p50_us']:>9.2f} {r['p99_us']:>9.2f} {r['max_us']:>9.2f} {r['busbw_GBps']:>11.3f}")
a4, r4 = rows.get(("agg", 4096)), rows.get(("ring", 4096))
if a4 and r4:
    tp = p["results"][0].get("p99_latency_us", 0) / p["results"][0]["latency_us"]
    print(f"4 KiB: agg mean {a4['time_us']:.2f} us = {a4['time_us']/rtt:.2f} x shm round trip ({rtt:.2f} us), p50 {a4['p50_us']/rtt:.2f} x (rank 0's own intervals {a4.get('rank0_p50_us', 0)/rtt:.2f} x); agg/ring time {a4['time_us']/r4['time_us']:.2f}; agg p99/p50 {a4['p99_us']/a4['p50_us']:.2f} (ring {r4['p99_us']/r4['p50_us']:.2f}, the ping-pong's own {tp:.2f})")
PY
    done
fi

if has scale; then
    say ""
    say "## core scaling: 8 ranks, 64 MiB f32 sum, chunk 256K, window 4, shm, busy; server input GB/s = 8 x 64 MiB / time"
    say "$(printf '%7s %14s %16s %7s' lcores 'agg input' 'p2p ceiling' ratio)"
    for L in 1 2 4 8; do
        hub="0-$((L-1))"
        timeout 200 "$TALLY" bench p2p --hubs "$L" --leaves 8 --cores "$hub,8-15" --sizes 64M --chunk 256K --window 4 --iters 5 \
            --poll busy --provider shm --json >"$OUT/scale-p2p-$L.json" 2>>"$OUT/scale.err"
        timeout 200 "$TALLY" bench allreduce --ranks 8 --lcores "$hub" --cores 8-15 --poll busy --provider shm --sizes 64M \
            --chunk 256K --window 4 --iters 10 --warmup 2 --mode agg --json >"$OUT/scale-agg-$L.json" 2>>"$OUT/scale.err"
        python3 - "$OUT/scale-p2p-$L.json" "$OUT/scale-agg-$L.json" "$L" <<'PY' | tee -a "$S"
import json, sys
try:
    p = json.load(open(sys.argv[1]))["results"][0]["hub_input_GBps"]
except Exception as e:
    p = None; print("p2p:", e)
try:
    a = json.load(open(sys.argv[2]))["results"][0]
    agg = 8 * a["bytes"] / (a["time_us"] * 1e-6) / 1e9
except Exception as e:
    agg = None; print("agg:", e)
f = lambda v: "%.2f" % v if v else "-"
print("%7s %14s %16s %7s" % (sys.argv[3], f(agg), f(p), f(agg / p) if agg and p else "-"))
PY
    done
fi

if has matrix; then
    say ""
    say "## 4 KiB matrix: shm, busy, ranks on cores 8-15, back-to-back 20000 (mean / p50 / p99 us)"
    say "$(printf '%5s %6s %6s %9s %24s %24s %8s' ranks lcores minpc mode agg ring agg/ring)"
    for n in 2 4 8; do
        for lc in 2 2-3 2-5; do
            for mp in 4K 2K 1K; do
                [ "$lc" = 2 ] && [ "$mp" != 4K ] && continue
                r=$(TALLY_MIN_PIECE=$mp timeout 120 "$TALLY" bench allreduce --ranks "$n" --lcores "$lc" --cores 8-15 --poll busy --provider shm \
                    --sizes 4K --iters 20000 --warmup 500 --mode agg,ring --json 2>>"$OUT/matrix.err")
                echo "$r" | python3 -c '
import json, sys
n, lc, mp = sys.argv[1:4]
try:
    rows = {r["mode"]: r for r in json.load(sys.stdin)["results"]}
    a, g = rows["agg"], rows["ring"]
    f = lambda r: "%.2f / %.2f / %.2f" % (r["time_us"], r["p50_us"], r["p99_us"])
    print("%5s %6s %6s %9s %24s %24s %8.2f" % (n, lc, mp, "", f(a), f(g), a["time_us"] / g["time_us"]))
except Exception as e:
    print(n, lc, mp, "FAILED", e)
' "$n" "$lc" "$mp" | tee -a "$S"
            done
        done
    done
fi

if has profile; then
    say ""
    say "## host facts"
    say "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource 2>/dev/null))"
    say "model: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    say "siblings: $(for c in 0 1 2 8 14; do printf 'cpu%s:%s ' "$c" "$(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>/dev/null)"; done)"
    say "numa nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l); isolated: $(cat /sys/devices/system/cpu/isolated 2>/dev/null); nohz_full: $(cat /sys/devices/system/cpu/nohz_full 2>/dev/null)"
    say ""
    say "## shm ping-pong 4 KiB between core pairs (half round trip, us)"
    for pair in 14,15 2,8 8,9 2,3 0,8; do
        say "cores $pair: $(timeout 60 "$TALLY" bench p2p --provider shm --sizes 8,4K --iters 20000 --cores $pair --json 2>/dev/null | python3 -c 'import json,sys; print(" ".join("%dB %.2f" % (r["bytes"], r["latency_us"]) for r in json.load(sys.stdin)["results"]))')"
    done
    say ""
    say "## 2 ranks, agg 4 KiB, busy: lcore 2, ranks on 8,9 and on 14,15"
    for rc in 8,9 14,15; do
        timeout 120 "$TALLY" bench allreduce --ranks 2 --lcores 2 --cores $rc --poll busy --provider shm --sizes 4K --iters 20000 --warmup 1000 \
            --mode agg,ring 2>>"$OUT/profile.err" | grep -E "^ +(agg|ring)" | sed "s/^/ranks $rc /" | tee -a "$S"
    done
    say "## one hop through a server: agg, 1 rank (core 8), lcore 2, busy, 4 KiB, back-to-back (vs ping-pong round trip cores 2,8)"
    timeout 120 "$TALLY" bench allreduce --ranks 1 --lcores 2 --cores 8 --poll busy --provider shm --sizes 4K,64K --iters 20000 --warmup 1000 \
        --mode agg 2>>"$OUT/profile.err" | grep -E "^ +agg" | tee -a "$S"
    PERF=""
    if [ -f "$DEVLIB/perf.tar.xz" ]; then
        mkdir -p /tmp/tally-perf && tar -C /tmp/tally-perf -xJf "$DEVLIB/perf.tar.xz"
        PERF="env LD_LIBRARY_PATH=/tmp/tally-perf/perf/lib:${LD_LIBRARY_PATH:-} /tmp/tally-perf/perf/perf"
        $PERF --version >/dev/null 2>&1 || { say "perf does not run here: $($PERF --version 2>&1 | head -2)"; PERF=""; }
    fi
    if [ -n "$PERF" ]; then
        say ""
        say "## perf: 2 ranks (cores 8,9), lcore 2, 4 KiB agg loop; cycles by core and symbol"
        "$TALLY" bench allreduce --ranks 2 --lcores 2 --cores 8,9 --poll busy --provider shm --sizes 4K --iters 400000 --warmup 1000 \
            --mode agg >"$OUT/perf-lat.txt" 2>>"$OUT/profile.err" &
        BP=$!
        sleep 2
        $PERF record -F 9999 -C 2,8,9 -o "$OUT/perf-lat.data" -- sleep 4 >/dev/null 2>>"$OUT/profile.err"
        wait $BP
        grep -E "^ +agg" "$OUT/perf-lat.txt" | tee -a "$S"
        for c in 2 8; do
            say "core $c:"
            $PERF report -i "$OUT/perf-lat.data" --cpu $c --no-children --sort dso,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -${PF_LINES:-25} | tee -a "$S"
        done
        [ "${PF_CLUSTER:-1}" = 1 ] && {
        say ""
        say "## perf: emulated cluster 4 + 4 hosts, 16 Gbit/s, 64 MiB agg; whole machine, 6 s"
        timeout -k 5 200 "$TALLY" bench cluster --hosts 4 --rates 16 --sizes 64M --iters 200 --mode agg --timeout 150 --json \
            >"$OUT/perf-cluster.json" 2>>"$OUT/profile.err" &
        CP=$!
        sleep 6
        $PERF record -F 999 -a -o "$OUT/perf-cluster.data" -- sleep 5 >/dev/null 2>>"$OUT/profile.err"
        wait $CP
        python3 -c 'import json,sys; [print("%s %d MiB %s Gbit/s: fraction %.2f" % (r["mode"], r["bytes"] >> 20, r["link_gbit"], r["fraction"])) for r in json.load(open(sys.argv[1]))["rows"]]' "$OUT/perf-cluster.json" 2>&1 | tee -a "$S"
        say "by command and object:"
        $PERF report -i "$OUT/perf-cluster.data" --no-children --sort comm,dso --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -25 | tee -a "$S"
        say "by symbol:"
        $PERF report -i "$OUT/perf-cluster.data" --sort dso,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -50 | tee -a "$S"
        }
        rm -f "$OUT"/perf-*.data
    fi
fi

if has tail; then
    say ""
    say "## tail: 4 KiB agg loop (2 ranks, cores 8,9) alone and beside a 64 MiB agg job (2 ranks, cores 10,11), one server, busy, shm."
    say "## shared: lcores 2-3 serve both jobs. latency lcore: lcores 2-4 with --latency-lcores 1 (lcore 2 takes operations"
    say "## of at most 64 KiB, lcores 3-4 the larger ones: the big job has two lcores either way)."
    for cfg in shared latency; do
        case $cfg in
            shared) lc=(--lcores 2-3) ;;
            latency) lc=(--lcores 2-4 --latency-lcores 1 --latency-max 64K) ;;
        esac
        "$TALLY" server --listen 127.0.0.1:7470 "${lc[@]}" --poll busy --provider shm --slab-size 512M >"$OUT/tail-server-$cfg.out" 2>"$OUT/tail-server-$cfg.err" &
        SP=$!
        for _ in $(seq 300); do grep -q ready "$OUT/tail-server-$cfg.out" 2>/dev/null && break; sleep 0.1; done
        small() { timeout -k 5 120 "$TALLY" bench allreduce --servers 127.0.0.1:7470 --provider shm --ranks 2 --cores "$1" --poll busy \
            --sizes 4K --iters 5000 --warmup 100 --mode agg --timeout 30 --json 2>>"$OUT/tail.err"; }
        small 8,9 >"$OUT/tail-alone-$cfg.json"
        # The big job ends by itself (bounded iterations), long after the small
        # loop. Its chunk and window set how many bytes wait in an lcore's shm
        # queue ahead of a small job's piece: run it with two of each.
        for big in "256K 4" "64K 2"; do
            set -- $big
            timeout -k 5 120 "$TALLY" bench allreduce --servers 127.0.0.1:7470 --provider shm --ranks 2 --cores 10,11 --poll busy \
                --sizes 64M --iters 150 --warmup 2 --mode agg --chunk "$1" --window "$2" --timeout 30 --json >"$OUT/tail-big-$cfg-$1.json" 2>>"$OUT/tail.err" &
            BP=$!
            sleep 1.5
            small 8,9 >"$OUT/tail-loaded-$cfg-$1.json"
            wait "$BP"
            python3 - "$OUT/tail-alone-$cfg.json" "$OUT/tail-loaded-$cfg-$1.json" "$OUT/tail-big-$cfg-$1.json" "$1" "$2" "$cfg" <<'PY' | tee -a "$S"
import json, sys
a = json.load(open(sys.argv[1]))["results"][0]; b = json.load(open(sys.argv[2]))["results"][0]
try:
    g = json.load(open(sys.argv[3]))["results"][0]; big = f"; big job {g['time_us'] / 1e3:.1f} ms per 64 MiB, wrong {g['wrong']}"
except Exception:
    big = "; big job: no result"
cfg = sys.argv[6]
if sys.argv[4] == "256K":
    print(f"{cfg:>8} alone:  mean {a['time_us']:.2f} us, p50 {a['p50_us']:.2f}, p99 {a['p99_us']:.2f}, max {a['max_us']:.1f}; p99/p50 {a['p99_us']/a['p50_us']:.2f}; wrong {a['wrong']}")
print(f"{cfg:>8} beside 64M (chunk {sys.argv[4]}, window {sys.argv[5]}):  mean {b['time_us']:.2f} us, p50 {b['p50_us']:.2f}, p99 {b['p99_us']:.2f}, max {b['max_us']:.1f}; p99/alone-p50 {b['p99_us']/a['p50_us']:.2f}; wrong {b['wrong']}{big}")
PY
        done
        kill "$SP"; sleep 2; kill -9 "$SP" 2>/dev/null; wait "$SP" 2>/dev/null
    done
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

if has cpu16; then
    say ""
    say "## 16 Gbit/s, 64 MiB, 30 back-to-back all-reduces per figure: polling and lcores per server (the machine's CPU is the limit here)"
    for v in "4 busy 2" "4 adaptive 2" "4 busy 1" "8 busy 1" "8 adaptive 1"; do
        set -- $v
        timeout -k 5 200 "$TALLY" bench cluster --hosts "$1" --rates 16 --sizes 64M --iters 30 --timeout 150 --mode agg,agg-plugin,ring \
            --poll "$2" --server-lcores "$3" --json >"$OUT/cpu16-$1-$2-$3.json" 2>>"$OUT/cluster.err" || say "FAILED $v"
        python3 - "$OUT/cpu16-$1-$2-$3.json" "$@" <<'PY' | tee -a "$S"
import json, sys
v = json.load(open(sys.argv[1]))
rows = {r["mode"]: r for r in v["rows"]}
q = rows["agg"]["algbw_GBps"] / rows["ring"]["algbw_GBps"] if "agg" in rows and "ring" in rows else 0
print(f"{sys.argv[2]} + {sys.argv[2]} hosts, poll {sys.argv[3]:>8}, {sys.argv[4]} lcore(s)/server: " + ", ".join(f"{m} {r['fraction']:.2f}" for m, r in rows.items()) + f"; agg/ring {q:.2f}")
PY
    done
fi

if has ranks; then
    say ""
    say "## many ranks: one server (lcores 0-3, tcp, adaptive), ranks on cores 4-$((C-1)), window 2, 4 KiB and 1 MiB, 20 iterations"
    for n in 8 1024; do
        TALLY_LOG=info "$TALLY" server --listen 127.0.0.1:7480 --lcores 0-3 --provider tcp --poll adaptive \
            >"$OUT/ranks-server$n.out" 2>"$OUT/ranks-server$n.log" &
        spid=$!
        for _ in $(seq 100); do grep -q ready "$OUT/ranks-server$n.out" 2>/dev/null && break; sleep 0.1; done
        ( peak_t=0; peak_r=0
          while kill -0 "$spid" 2>/dev/null; do
              t=$(awk '/^Threads:/ {print $2}' "/proc/$spid/status" 2>/dev/null || echo 0)
              r=$(awk '/^VmRSS:/ {print $2}' "/proc/$spid/status" 2>/dev/null || echo 0)
              [ "${t:-0}" -gt "$peak_t" ] && peak_t=$t; [ "${r:-0}" -gt "$peak_r" ] && peak_r=$r
              echo "$peak_t $peak_r" >"$OUT/ranks-peak$n"; sleep 0.2
          done ) &
        sampler=$!
        t0=$(date +%s.%N)
        timeout -k 5 400 taskset -c 4-$((C-1)) "$TALLY" bench allreduce --servers 127.0.0.1:7480 --provider tcp --ranks "$n" \
            --mode agg --sizes 4K,1M --iters 20 --warmup 2 --window 2 --json >"$OUT/ranks$n.json" 2>"$OUT/ranks$n.err"
        rc=$?
        t1=$(date +%s.%N)
        sleep 0.5
        kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
        python3 - "$n" "$rc" "$t0" "$t1" "$OUT/ranks$n.json" "$OUT/ranks-server$n.log" "$OUT/ranks-peak$n" <<'PY' | tee -a "$S"
import json, sys, datetime
n, rc, t0, t1, jf, log, peak = sys.argv[1:]
t0, t1 = float(t0), float(t1)
def stamp(line):
    return datetime.datetime.strptime(line[1:24], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc).timestamp()
running = next((stamp(l) for l in open(log) if ": running" in l and "job " in l), None)
import re
j2r = next((m.group(1) for l in open(log) for m in [re.search(r": running, (\S+) after its first rank joined", l)] if m), None)
first = next((stamp(l) for l in open(log) if "starting (tag" in l), None)
try:
    rows = json.load(open(jf))["results"]
except Exception as e:
    rows = []
pt, pr = (open(peak).read().split() + ["?", "?"])[:2]
print(f"{n} ranks: exit {rc}; bench start to job running {running - t0:.2f} s (first join to running {j2r})" if running else f"{n} ranks: exit {rc}; job never ran")
for r in rows:
    print(f"  {r['bytes']:>8} B: p50 {r.get('p50_us', 0):.0f} us, mean {r.get('mean_us', 0):.0f} us, p99 {r.get('p99_us', 0):.0f} us, wrong {r['wrong']}")
print(f"  server: peak {pt} threads, peak VmRSS {int(pr) // 1024 if pr.isdigit() else pr} MiB; whole run {t1 - t0:.1f} s")
PY
    done
fi

if has rankscale; then
    RS_LCORES="${RS_LCORES:-0-3}"; RS_RANKS="${RS_RANKS:-8 1024}"; RS_TOTAL="${RS_TOTAL:-512M}"
    RS_PIECE="${RS_PIECE:-32K}"; RS_WINDOW="${RS_WINDOW:-2}"; RS_ITERS="${RS_ITERS:-10}"
    RS_REPEAT="${RS_REPEAT:-2}"; RS_SLAB="${RS_SLAB:-256M}"; RS_CASES="${RS_CASES:-chunk piece}"; RS_LIBS="${RS_LIBS:--}"
    LD0="${LD_LIBRARY_PATH:-}"
    bytes() { numfmt --from=iec "$1"; }
    L=$(( ${RS_LCORES#*-} - ${RS_LCORES%-*} + 1 ))
    # Ranks on the cores the lcores leave; a host with no others shares them.
    if [ "$C" -gt $(( ${RS_LCORES#*-} + 1 )) ]; then RCORES="$(( ${RS_LCORES#*-} + 1 ))-$((C-1))"; else RCORES="0-$((C-1))"; fi
    total=$(bytes "$RS_TOTAL")
    say ""
    say "## rank scaling (issue 18): one server (lcores $RS_LCORES, tcp, adaptive, slab $RS_SLAB), ranks on cores $RCORES;"
    say "## $RS_TOTAL in per operation (ranks x size), window $RS_WINDOW, $RS_ITERS back-to-back all-reduces after 2 warm-up, every element checked;"
    say "## per-lcore GB/s = ranks x size / loop mean / $L lcores; ratio = against the first rank count's of the same case and round"
    say "## lc cpu = cores the lcore threads used while bytes came in (of $L; well below $L: the ranks, not the server, set the figure);"
    say "## rk cpu = busy cores among the ranks' cores $RCORES over the same span (near all of them: the load generator is the limit)"
    say "$(printf '%5s %6s %8s %9s %9s %10s %9s %8s %7s %7s %6s %6s %s' round case ranks/win size piece 'mean ms' 'GB/s/lc' ratio 'lc cpu' 'rk cpu' wrong exit libfabric)"
    port=7481
    for round in $(seq "$RS_REPEAT"); do
        for case in $RS_CASES; do
          for entry in $RS_LIBS; do
            lib="${entry%%,*}"; extra=""; [ "$entry" != "$lib" ] && extra="${entry#*,}"
            if [ "$lib" = - ]; then export LD_LIBRARY_PATH="$LD0"; else export LD_LIBRARY_PATH="$(realpath "$lib")${LD0:+:$LD0}"; fi
            for kv in ${extra//,/ }; do export "${kv?}"; done
            # RPS=1 among a pass's variables: loopback's receive processing
            # (the TCP input path, waking the reader) runs on the ranks'
            # cores, as a NIC's would run off the sender's, instead of inside
            # the sender's send; left alone, lcores pay for the ranks' side.
            rps=/sys/class/net/lo/queues/rx-0/rps_cpus
            if [ "${RPS:-0}" = 1 ] && [ -w "$rps" ]; then
                rps0=$(cat "$rps"); m=0; for c in $(seq "${RCORES%-*}" "${RCORES#*-}"); do m=$(( m | 1 << c )); done
                printf '%x' "$m" >"$rps"
            fi
            libv=$("$TALLY" doctor 2>/dev/null | awk '$1 == "libfabric" {sub(";", "", $3); print "libfabric-" $3; exit}'); libv="${libv:-libfabric-?}${extra:+,$extra}"
            for nw in $RS_RANKS; do
                # RANKS:WINDOW gives that rank count its own window.
                n=${nw%%:*}; w=${nw#*:}; [ "$w" = "$nw" ] && w=$RS_WINDOW
                size=$(( total / n ))
                chunk=256K; [ "$case" = piece ] && chunk=$RS_PIECE
                tag="$round-$case-$libv-$n-w$w"
                TALLY_LOG=info "$TALLY" server --listen 127.0.0.1:$port --lcores "$RS_LCORES" --provider tcp --poll adaptive \
                    ${STAGE:+--stage-buffers "$STAGE"} --slab-size "$RS_SLAB" --metrics 127.0.0.1:$((port + 100)) >"$OUT/rs-server$tag.out" 2>"$OUT/rs-server$tag.log" &
                spid=$!
                for _ in $(seq 100); do grep -q ready "$OUT/rs-server$tag.out" 2>/dev/null && break; sleep 0.1; done
                # Every 0.1 s: the lcore threads' CPU time and the bytes they
                # took in, so that the loop's lcore use can be told apart from
                # the join (lcores below 1.0 each: the ranks, not the server,
                # set the figure).
                python3 - "$spid" "$((port + 100))" "$RCORES" >"$OUT/rs-cpu$tag" 2>/dev/null <<'PY' &
import glob, os, sys, time, urllib.request
pid, mport, rcores = sys.argv[1], sys.argv[2], sys.argv[3]
tick = os.sysconf("SC_CLK_TCK")
lo, hi = map(int, rcores.split("-"))
def rank_busy():
    # Busy time of the ranks' cores (everything but idle and iowait).
    t = 0
    for l in open("/proc/stat"):
        f = l.split()
        if f[0].startswith("cpu") and f[0][3:].isdigit() and lo <= int(f[0][3:]) <= hi:
            v = list(map(int, f[1:]))
            t += sum(v) - v[3] - v[4]
    return t / tick
while os.path.exists(f"/proc/{pid}"):
    try:
        cpu = 0
        for t in glob.glob(f"/proc/{pid}/task/*"):
            if open(f"{t}/comm").read().startswith("lcore-"):
                f = open(f"{t}/stat").read().rsplit(")", 1)[1].split()
                cpu += int(f[11]) + int(f[12])
        m = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=1).read().decode()
        b = sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith("tally_lcore_bytes_in_total{"))
        print(time.time(), cpu / tick, b, rank_busy(), flush=True)
    except Exception:
        pass
    time.sleep(0.1)
PY
                sampler=$!
                timeout -k 5 500 taskset -c "$RCORES" "$TALLY" bench allreduce --servers 127.0.0.1:$port --provider tcp --ranks "$n" \
                    --mode agg --dtype "${RS_DTYPE:-f32}" --sizes "$size" --chunk "$chunk" --window "$w" --iters "$RS_ITERS" --warmup 2 --json \
                    >"$OUT/rs$tag.json" 2>"$OUT/rs$tag.err" &
                bpid=$!
                if [ -n "${RS_PERF:-}" ] && [ -f "$DEVLIB/perf.tar.xz" ]; then
                    # RS_PERF=1: the lcores' profile once bytes flow (the
                    # second half of the run's expected span).
                    [ -x /tmp/tally-perf/perf/perf ] || { mkdir -p /tmp/tally-perf && tar -C /tmp/tally-perf -xJf "$DEVLIB/perf.tar.xz"; }
                    for _ in $(seq 600); do [ "$(wc -l <"$OUT/rs-cpu$tag" 2>/dev/null || echo 0)" -gt 2 ] && \
                        awk 'NR > 1 && $3 > p {f = 1} {p = $3} END {exit !f}' "$OUT/rs-cpu$tag" && break; sleep 0.1; done
                    env LD_LIBRARY_PATH="/tmp/tally-perf/perf/lib:${LD_LIBRARY_PATH:-}" /tmp/tally-perf/perf/perf record -F 1999 \
                        -C "$RS_LCORES" -o "$OUT/rs-perf$tag.data" -- sleep 3 >/dev/null 2>>"$OUT/rs-perf.err"
                    env LD_LIBRARY_PATH="/tmp/tally-perf/perf/lib:${LD_LIBRARY_PATH:-}" /tmp/tally-perf/perf/perf report -i "$OUT/rs-perf$tag.data" \
                        --no-children --sort dso --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -8 >"$OUT/rs-perf$tag.txt"
                    env LD_LIBRARY_PATH="/tmp/tally-perf/perf/lib:${LD_LIBRARY_PATH:-}" /tmp/tally-perf/perf/perf report -i "$OUT/rs-perf$tag.data" \
                        --no-children --sort dso,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -30 >>"$OUT/rs-perf$tag.txt"
                    rm -f "$OUT/rs-perf$tag.data"
                fi
                wait "$bpid"
                rc=$?
                kill "$spid" 2>/dev/null; wait "$spid" "$sampler" 2>/dev/null
                port=$((port + 1))
                python3 - "$round" "$case" "$n:$w" "$L" "$rc" "$OUT/rs$tag.json" "$OUT/rs-server$tag.log" "$OUT/rs-base-$round-$case-$libv" "$OUT/rs-cpu$tag" "$libv" <<'PY' | tee -a "$S"
import json, os, re, sys
rnd, case, n, L, rc, jf, log, basef, cpuf, libv = sys.argv[1:]
# lcore CPU (cores) while bytes came in, leaving out the first and last such interval
rows = [list(map(float, l.split())) for l in open(cpuf) if len(l.split()) == 4]
act = [i for i in range(1, len(rows)) if rows[i][2] > rows[i - 1][2]]
lc = rc_cpu = "-"
if len(act) >= 3:
    a, b = act[1] - 1, act[-2]
    if rows[b][0] > rows[a][0]:
        lc = f"{(rows[b][1] - rows[a][1]) / (rows[b][0] - rows[a][0]):.2f}"
        rc_cpu = f"{(rows[b][3] - rows[a][3]) / (rows[b][0] - rows[a][0]):.1f}"
n, w = n.split(":"); n, L = int(n), int(L); rk = f"{n}/w{w}"
try:
    r = json.load(open(jf))["results"][0]
except Exception:
    r = None
m = next((re.search(r"(\d+) elements per piece", l) for l in open(log) if "starting (tag" in l), None)
esize = {"f16": 2, "bf16": 2, "f64": 8, "i64": 8, "u64": 8, "i8": 1, "u8": 1}.get(os.environ.get("RS_DTYPE", "f32"), 4)
piece = f"{int(m.group(1)) * esize // 1024}K" if m else "?"
if m and any("ranks at a time" in l for l in open(log) if "starting (tag" in l):
    piece += ",staged"
if r is None:
    print(f"{rnd:>5} {case:>6} {rk:>8} {'-':>9} {piece:>9} {'-':>10} {'-':>9} {'-':>8} {lc:>7} {rc_cpu:>7} {'-':>6} {rc:>6} {libv}")
    sys.exit()
gbps = n * r["bytes"] / (r["time_us"] * 1e-6) / L / 1e9
if not os.path.exists(basef):
    open(basef, "w").write(str(gbps))
base = float(open(basef).read())
size = f"{r['bytes'] // 1024}K" if r["bytes"] < 1 << 20 else f"{r['bytes'] >> 20}M"
print(f"{rnd:>5} {case:>6} {rk:>8} {size:>9} {piece:>9} {r['time_us'] / 1e3:>10.1f} {gbps:>9.3f} {gbps / base:>8.2f} {lc:>7} {rc_cpu:>7} {r['wrong']:>6} {rc:>6} {libv}")
PY
            done
            [ -n "${rps0:-}" ] && { echo "$rps0" >"$rps"; rps0=""; }
            for kv in ${extra//,/ }; do unset "${kv%%=*}"; done
          done
        done
    done
    export LD_LIBRARY_PATH="$LD0"
    for f in "$OUT"/rs-perf*.txt; do
        [ -f "$f" ] || continue
        say ""; say "## lcore profile (perf, self time by library, then by symbol): $(basename "$f" .txt)"; head -28 "$f" | tee -a "$S"
    done
fi

if has fostage; then
    say ""
    say "## failover staging cost: 8 ranks (cores 8-15), 3 servers (tcp, busy, lcores 0-1, 2-3, 4-5)"
    pids=""; addrs=""
    for k in 0 1 2; do
        "$TALLY" server --listen 127.0.0.1:$((7490 + k)) --lcores $((2 * k))-$((2 * k + 1)) --provider tcp --poll busy \
            >"$OUT/fo-server$k.out" 2>"$OUT/fo-server$k.log" &
        pids="$pids $!"; addrs="$addrs,127.0.0.1:$((7490 + k))"
    done
    addrs="${addrs#,}"
    sleep 2
    for fo in 0 1 0 1; do
        TALLY_FAILOVER=$fo timeout -k 5 300 "$TALLY" bench allreduce --servers "$addrs" --provider tcp --ranks 8 --cores 8-15 \
            --poll busy --mode agg --sizes 4K,1M,64M --iters 20 --warmup 3 --json >"$OUT/fo$fo-$RANDOM.json" 2>>"$OUT/fo.err" || say "FAILED (fo.err)"
    done
    kill $pids 2>/dev/null; wait $pids 2>/dev/null
    python3 - "$OUT" <<'PY' | tee -a "$S"
import json, sys, glob, os
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "fo[01]-*.json"))):
    fo = os.path.basename(f)[2]
    try:
        for r in json.load(open(f))["results"]:
            rows.setdefault((r["bytes"], fo), []).append(r)
    except Exception as e:
        print(f"{f}: {e}")
for b in sorted({k[0] for k in rows}):
    off, on = rows.get((b, "0"), []), rows.get((b, "1"), [])
    fmt = lambda rs: " / ".join(f"{r['p50_us']:.0f}" for r in rs)
    wrong = sum(r["wrong"] for r in off + on)
    ratio = (sum(r["p50_us"] for r in on) / len(on)) / (sum(r["p50_us"] for r in off) / len(off)) if on and off else float("nan")
    print(f"{b:>9} B: p50 us failover off {fmt(off)}, on {fmt(on)}; on/off {ratio:.2f}; wrong {wrong}")
PY
fi

if has relay; then
    say ""
    say "## two-rank relay (TALLY_RELAY=1) against the servers reducing (=0), alternated; shm, busy, lcore 2, ranks on 8-15"
    say "$(printf '%5s %6s %8s | %9s %9s %11s %9s | %9s %9s' round relay 'rtt us' '4K mean' '4K p50' 'rank0 p50' 'p50/rtt' '1M mean' '1M p50')"
    for round in $(seq "${RL_ROUNDS:-8}"); do
        rtt=$(timeout 60 "$TALLY" bench p2p --provider shm --sizes 4K --iters 20000 --cores 2,8 --json 2>/dev/null \
            | python3 -c 'import json,sys; print("%.3f" % (2 * json.load(sys.stdin)["results"][0]["latency_us"]))')
        for relay in 1 0; do
            TALLY_RELAY=$relay timeout 60 "$TALLY" bench allreduce --ranks 2 --lcores 2 --cores 8-15 --poll busy --provider shm \
                --sizes 4K --iters 10000 --warmup 500 --mode agg --json >"$OUT/relay-$round-$relay-small.json" 2>>"$OUT/relay.err"
            TALLY_RELAY=$relay timeout 60 "$TALLY" bench allreduce --ranks 2 --lcores 2 --cores 8-15 --poll busy --provider shm \
                --sizes 1M --iters 300 --warmup 20 --mode agg --json >"$OUT/relay-$round-$relay-large.json" 2>>"$OUT/relay.err"
            python3 - "$OUT/relay-$round-$relay-small.json" "$OUT/relay-$round-$relay-large.json" "$round" "$relay" "$rtt" <<'PY' | tee -a "$S"
import json, sys
try:
    s = json.load(open(sys.argv[1]))["results"][0]
    l = json.load(open(sys.argv[2]))["results"][0]
    bad = s["wrong"] + l["wrong"]
    rtt = float(sys.argv[5])
    print(f"{sys.argv[3]:>5} {sys.argv[4]:>6} {rtt:>8.2f} | {s['time_us']:>9.2f} {s['p50_us']:>9.2f} {s['rank0_p50_us']:>11.2f} {s['p50_us'] / rtt:>9.2f} | "
          f"{l['time_us']:>9.1f} {l['p50_us']:>9.1f}" + (f"  WRONG {bad}" if bad else ""))
except Exception as e:
    print(f"{sys.argv[3]:>5} {sys.argv[4]:>6} failed: {e}")
PY
        done
    done
fi

if has split; then
    say ""
    say "## split small all-reduces, modes alternated (split: TALLY_SPLIT=1; whole: TALLY_SPLIT=0); shm, busy, ranks on 8-15"
    say "## 4 KiB, ${SP_ITERS:-10000} back-to-back; the ring in the same round and library; ratio = agg mean / ring mean"
    say "$(printf '%5s %6s %7s %-22s %-8s | %9s %9s %9s %7s %7s %6s' round ranks lcores lib mode 'mean us' 'p50 us' 'p99 us' p99/p50 ratio wrong)"
    base_ld="${LD_LIBRARY_PATH:-}"
    for round in $(seq "${SP_ROUNDS:-4}"); do
        for lib in ${SP_LIBS:-inherited}; do
            ld="$base_ld"; [ "$lib" != inherited ] && ld="$PWD/$lib:$base_ld"
            for nl in ${SP_CASES:-4:2-3 8:2-3 8:2-5}; do
                n=${nl%%:*}; lc=${nl#*:}; tag="$round-$(basename "$lib")-$n-$lc"
                LD_LIBRARY_PATH="$ld" timeout 60 "$TALLY" bench allreduce --ranks "$n" --lcores 2 --cores 8-15 --poll busy --provider shm \
                    --sizes 4K --iters "${SP_ITERS:-10000}" --warmup 300 --mode ring --json >"$OUT/split-$tag-ring.json" 2>>"$OUT/split.err"
                for mode in ${SP_MODES:-split whole}; do
                    case ${mode%%@*} in
                        split) env=(TALLY_SPLIT=1) ;;
                        *) env=(TALLY_SPLIT=0) ;;
                    esac
                    # MODE@VAR=value,VAR=value: more variables for that run.
                    [[ $mode == *@* ]] && IFS=, read -ra more <<<"${mode#*@}" && env+=("${more[@]}")
                    env LD_LIBRARY_PATH="$ld" "${env[@]}" timeout 60 "$TALLY" bench allreduce --ranks "$n" --lcores "$lc" --cores 8-15 --poll busy --provider shm \
                        --sizes 4K --iters "${SP_ITERS:-10000}" --warmup 300 --mode agg --json >"$OUT/split-$tag-$mode.json" 2>>"$OUT/split.err"
                    python3 - "$OUT/split-$tag-$mode.json" "$OUT/split-$tag-ring.json" "$round" "$n" "$lc" "$(basename "$lib")" "$mode" <<'PY' | tee -a "$S"
import json, sys
head = f"{sys.argv[3]:>5} {sys.argv[4]:>6} {sys.argv[5]:>7} {sys.argv[6]:<22} {sys.argv[7]:<8}"
try:
    a = json.load(open(sys.argv[1]))["results"][0]
    g = json.load(open(sys.argv[2]))["results"][0]
    print(f"{head} | {a['time_us']:>9.2f} {a['p50_us']:>9.2f} {a['p99_us']:>9.2f} {a['p99_us'] / a['p50_us']:>7.2f} "
          f"{a['time_us'] / g['time_us']:>7.2f} {a['wrong']:>6}")
except Exception as e:
    print(f"{head} failed: {e}")
PY
                done
                python3 - "$OUT/split-$tag-ring.json" "$round" "$n" "$lc" "$(basename "$lib")" <<'PY' | tee -a "$S"
import json, sys
head = f"{sys.argv[2]:>5} {sys.argv[3]:>6} {sys.argv[4]:>7} {sys.argv[5]:<22} {'ring':<8}"
try:
    g = json.load(open(sys.argv[1]))["results"][0]
    print(f"{head} | {g['time_us']:>9.2f} {g['p50_us']:>9.2f} {g['p99_us']:>9.2f} {g['p99_us'] / g['p50_us']:>7.2f} {1:>7.2f} {g['wrong']:>6}")
except Exception as e:
    print(f"{head} failed: {e}")
PY
            done
        done
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
