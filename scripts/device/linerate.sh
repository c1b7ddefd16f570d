#!/usr/bin/env bash
# Issue 30's measurements on a many-core host (the device kinds with 64
# cores): builds nothing, needs the built binaries and devlib/
# (scripts/device/pack.sh), writes a summary to $OUT/summary.txt.
#
#   LD_LIBRARY_PATH=$PWD/devlib/lib TALLY_IPROUTE=$PWD/devlib/iproute OUT=/tmp/out scripts/device/linerate.sh [parts]
#
# Parts (default: cluster p2p):
#   cpu      adaptive polling at LR_CPU_RATES ("16 32"), 64M: worker and server
#            CPU seconds per GB all-reduced, and cores per 100 Gbit/s.
#   libs     the cluster part once per libfabric in LR_LIBS (folders; "system":
#            the host's own, found by leaving devlib's libfabric out), configs
#            LR_LIB_CONFIGS ("rails rails1").
#   cluster  tally bench cluster, 4 + 4 hosts, LR_RATES (16,32) Gbit/s,
#            LR_SIZES (16M,64M), agg and ring in every run, LR_ROUNDS (2)
#            rounds of LR_CONFIGS alternated ("rails1 rails rails-fo0"):
#            rails1 = TALLY_RAILS=1 (one endpoint on the worker's thread, as
#            before rails), rails = the default (auto), -fo0 adds
#            TALLY_FAILOVER=0. A config may carry more variables after '@'
#            and bench cluster arguments after '+', comma-separated (e.g.
#            rails-c256@TALLY_WINDOW=8+--chunk=256K). LR_MODES (agg,ring).
#   p2p      the transport ceiling: tally bench p2p --provider tcp --hubs 2
#            --leaves 4 (16M), beside the kernel's own figure: the same
#            streams as plain TCP sockets (python3) between two processes.
#   perf     perf (devlib/perf.tar.xz) of the whole host during one 32
#            Gbit/s agg run with the default rails: top symbols per thread kind.
#   demo     `tally demo` as a user runs it.
#   nccl     real NCCL on the host's GPUs (tests/nccl/cluster_proof.sh) at
#            LR_NCCL_RATE (32) and half, LR_NCCL_SIZES (16M,64M,256M), f32 and
#            bf16, the four modes, timed as measuring.md says (back to back).
#   nccl-sync  the same timed the old way (a synchronize around every
#            all-reduce, PER_OP_SYNC=1), ring over Socket and CollNet, f32,
#            LR_NCCL_SYNC_SIZES (16M): what the ranks' launch skew costs.
#   nccl-knobs  NCCL modes LR_NCCL_KNOB_MODES (collnet: forced), f32,
#            LR_NCCL_KNOB_SIZES (16M,64M), once per setting in LR_NCCL_KNOBS
#            (space separated, name@VAR=v,VAR=v; "base" alone for the
#            defaults), each line with the channels NCCL used.
set -uo pipefail
cd "$(dirname "$0")/../.."
TALLY="${TALLY:-$PWD/target/release/tally}"
FINAL="${OUT:-./out}"
PARTS="${*:-cluster p2p}"
DEVLIB="${DEVLIB:-$PWD/devlib}"
OUT="$(mktemp -d /tmp/tally-linerate.XXXXXX)"
mkdir -p "$FINAL"
S="$FINAL/summary.txt"
trap 'tar -C "$OUT" -czf "$FINAL/details.tar.gz" . 2>/dev/null' EXIT
: >"$S"
say() { echo "$@" | tee -a "$S"; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
say "# tally line-rate session on $(hostname): $(nproc) cores, $(uname -r); parts: $PARTS"
fabric_version() { "$TALLY" doctor 2>/dev/null | awk '$1 == "libfabric" {gsub(";", "", $3); print $3; exit}'; }
say "# $("$TALLY" --version); libfabric $(fabric_version) (what fi_version() says; the file name's number is libtool's, 1.20.0 for 1.17)"
export TALLY_LOG=warn

table() { # json config
    python3 - "$1" "$2" <<'PY' | tee -a "$S"
import json, sys
v = json.load(open(sys.argv[1])); rows = v["rows"]
for r in rows:
    if r["mode"] == "ring":
        continue
    ring = [x for x in rows if x["mode"] == "ring" and x["bytes"] == r["bytes"] and x["link_gbit"] == r["link_gbit"]]
    q = f"{r['algbw_GBps']/ring[0]['algbw_GBps']:.2f}" if ring else "-"
    rf = f"{ring[0]['fraction']:.2f}" if ring else "-"
    size = f"{r['bytes']>>20}Mi" if r['bytes'] >= 1 << 20 else f"{r['bytes']>>10}Ki"
    extra = f"  p50 {r['p50_us']:.0f} us (ring {ring[0]['p50_us']:.0f})" if r['bytes'] < 1 << 20 and ring else ""
    print(f"{sys.argv[2]:>18} {r['link_gbit']:>5} {size:>5} {r['mode']:>10} {r['fraction']:.2f}  ring {rf}  /ring {q}  wrong {r['wrong']}{extra}")
PY
}

if has cluster; then
    say ""
    say "## emulated cluster 4 + 4 hosts, fraction of the link bound (agg: R, ring: R n/2(n-1)), configs alternated"
    rounds="${LR_ROUNDS:-2}"
    configs="${LR_CONFIGS:-rails1 rails rails-fo0}"
    for round in $(seq 1 "$rounds"); do
        for cfg in $configs; do
            # name[@VAR=v,VAR=v][+--arg=v,--arg=v]
            name="${cfg%%[@+]*}"
            vars=()
            extra=()
            if [[ "$cfg" == *+* ]]; then IFS=',' read -ra extra <<<"${cfg#*+}"; fi
            body="${cfg%%+*}"
            if [[ "$body" == *@* ]]; then IFS=',' read -ra vars <<<"${body#*@}"; fi
            case "$name" in
                rails1*) vars+=(TALLY_RAILS=1) ;;
            esac
            [[ "$name" == *-fo0 ]] && vars+=(TALLY_FAILOVER=0)
            j="$OUT/cluster-$round-$name.json"
            vars+=(TALLY_LR_CONFIG="$cfg")
            env "${vars[@]}" timeout -k 5 240 "$TALLY" bench cluster --hosts 4 --rates "${LR_RATES:-16,32}" --sizes "${LR_SIZES:-16M,64M}" \
                ${LR_ITERS:+--iters "$LR_ITERS"} --timeout 120 --mode "${LR_MODES:-agg,ring}" "${extra[@]}" --json --log "$OUT/cluster-$round-$name.log" >"$j" 2>>"$OUT/cluster.err" \
                || { say "FAILED $cfg (round $round)"; continue; }
            [ "$round" = 1 ] && [ "$cfg" = "${configs%% *}" ] && say "# placement: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["placement"])' "$j")"
            table "$j" "$cfg r$round"
        done
    done
fi

if has cpu; then
    say ""
    say "## CPU cost, adaptive polling (a poller's work, not its spin), default rails: CPU seconds per GB all-reduced"
    for rate in ${LR_CPU_RATES:-16 32}; do
        j="$OUT/cpu-$rate.json"
        timeout -k 5 200 "$TALLY" bench cluster --hosts 4 --rates "$rate" --sizes 64M --mode agg,ring --poll adaptive --json >"$j" 2>>"$OUT/cluster.err" \
            || { say "FAILED cpu $rate"; continue; }
        python3 - "$j" <<'PY' | tee -a "$S"
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    w, s = r.get("worker_cpu_s_per_gb"), r.get("server_cpu_s_per_gb")
    f = lambda x: "-" if x is None else f"{x:.3f} s/GB ({x * 12.5:.1f} cores per 100 Gbit/s)"
    print(f"{r['link_gbit']:>5} {r['mode']:>5} {r['bytes']>>20}Mi fraction {r['fraction']:.2f}  worker {f(w)}  servers {f(s)}")
PY
    done
fi

if has libs; then
    say ""
    say "## libfabric builds side by side (LR_LIBS: folders put first on LD_LIBRARY_PATH; 'system' = the host's own libfabric)"
    # devlib's libraries without its libfabric: what every build below needs beside its own.
    rest="$OUT/lib-nofabric"
    mkdir -p "$rest" && cp "$DEVLIB"/lib/* "$rest"/ && rm -f "$rest"/libfabric.so*
    for lib in ${LR_LIBS:-system}; do
        dir="$lib:$rest"
        [ "$lib" = system ] && dir="$rest"
        v=$(LD_LIBRARY_PATH="$dir" ldd "$TALLY" | awk '/libfabric/ {print $3}')
        say "# $lib: $v, libfabric $(LD_LIBRARY_PATH="$dir" fabric_version)"
        OUT2="$OUT/lib-$(basename "$lib")"
        mkdir -p "$OUT2"
        LD_LIBRARY_PATH="$dir" OUT="$OUT2" LR_ROUNDS=1 LR_CONFIGS="${LR_LIB_CONFIGS:-rails rails1}" bash "$0" cluster >/dev/null 2>&1
        sed -n '/configs alternated/,$p' "$OUT2/summary.txt" | grep -v '^#' | grep -v configs | sed "s|^|$(basename "$lib") |" | tee -a "$S"
    done
fi

if has p2p; then
    say ""
    say "## transport ceiling, tcp on loopback: 2 hubs x 4 leaves, 16 MiB, beside plain TCP sockets"
    "$TALLY" bench p2p --provider tcp --hubs 2 --leaves 4 --sizes 16M 2>&1 | grep -v '^$' | tail -6 | tee -a "$S"
    python3 - <<'PY' | tee -a "$S"
# The kernel's own figure: 4 leaves x 2 hubs, each pair a TCP connection
# streaming 1 MiB writes both ways, one thread per endpoint as tally's.
import socket, threading, time, os
N, CH, SECS = 8, 1 << 20, 3.0
buf = bytearray(CH)
done = [0] * (2 * N)
def pump(s, i, stop):
    mv = memoryview(buf)
    while time.time() < stop:
        s.sendall(mv)
        done[i] += CH
def drain(s, i, stop):
    b = bytearray(CH)
    while time.time() < stop + 0.5:
        n = s.recv_into(b)
        if not n:
            break
        done[i] += n
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(64)
port = ls.getsockname()[1]
pairs = []
for _ in range(N):
    a = socket.create_connection(("127.0.0.1", port)); b, _ = ls.accept(); pairs.append((a, b))
stop = time.time() + SECS
ts = []
for k, (a, b) in enumerate(pairs):
    for s, i, f in ((a, 2 * k, pump), (b, 2 * k + 1, drain)):
        t = threading.Thread(target=f, args=(s, i, stop)); t.start(); ts.append(t)
time.sleep(SECS + 0.2)
for a, b in pairs:
    a.close()
for t in ts:
    t.join(2)
sent = sum(done[0::2]) / SECS / 1e9
print(f"python TCP (GIL-bound, a floor for the kernel): {N} connections one way, {sent:.2f} GB/s in all, {sent/N:.2f} per connection")
PY
fi

if has perf; then
    say ""
    say "## perf of the host during a 32 Gbit/s agg run (default rails), self time by thread kind"
    P="$OUT/perf"
    mkdir -p "$P" && tar -C "$P" -xJf "$DEVLIB/perf.tar.xz"
    PERF() { LD_LIBRARY_PATH="$P/perf/lib:${LD_LIBRARY_PATH:-}" "$P/perf/perf" "$@"; }
    "$TALLY" bench cluster --hosts 4 --rates 32 --sizes 64M --iters 400 --timeout 120 --mode agg --json >"$OUT/perf-run.json" 2>>"$OUT/cluster.err" &
    run=$!
    sleep "${LR_PERF_AFTER:-5}"
    PERF record -a -g -F 499 -o "$OUT/perf.data" -- sleep 4 >/dev/null 2>&1
    wait $run
    table "$OUT/perf-run.json" "perf run"
    PERF report -i "$OUT/perf.data" --stdio --no-children -g none --sort comm,symbol --percent-limit 0.7 2>/dev/null | grep -v '^#' | grep -v '^$' | head -45 | tee -a "$S"
fi

nccl_proof() { # name, then VAR=value pairs for cluster_proof.sh
    local name=$1 o="$OUT/$1"
    shift
    say ""
    say "## $name: real NCCL, tests/nccl/cluster_proof.sh $*"
    env "$@" RATE="${LR_NCCL_RATE:-32}" OUT="$o" TALLY_BIN="$TALLY" STEP_TIMEOUT=240 \
        PLUGIN="${PLUGIN:-$(dirname "$TALLY")/libnccl_net_tally.so}" bash tests/nccl/cluster_proof.sh >"$o.out" 2>&1
    say "# exit $?"
    sed -n '/^=== table/,/^=== proof/p' "$o/summary.txt" | grep -v '^=== proof' | tee -a "$S"
    sed -n '/^=== verdicts/,$p' "$o/summary.txt" | tee -a "$S"
    grep -h "algorithm per size" -A4 "$o/summary.txt" | head -20 >>"$S"
    for f in "$o"/*-"${LR_NCCL_RATE:-32}".nccl.*.log; do
        [ -e "$f" ] || continue
        echo "$(basename "$f" | cut -d. -f1): $(grep -ohE "[0-9]+ coll channels, [0-9]+ collnet channels|NCCL defaults set.*" "$f" | sort -u | paste -sd';')"
    done | sort -u | tee -a "$S"
}
if has nccl; then
    nccl_proof nccl SIZES="${LR_NCCL_SIZES:-16M,64M,256M}" DTYPES=f32,bf16
fi
if has nccl-sync; then
    nccl_proof nccl-sync PER_OP_SYNC=1 SIZES="${LR_NCCL_SYNC_SIZES:-16M}" DTYPES=f32 MODES="ring-socket collnet"
fi
if has nccl-knobs; then
    say ""
    say "## NCCL CollNet (forced), f32, at LR_NCCL_RATE and half, one setting at a time"
    for knob in ${LR_NCCL_KNOBS:-base}; do
        name="${knob%%@*}" vars=()
        [[ "$knob" == *@* ]] && IFS=',' read -ra vars <<<"${knob#*@}"
        o="$OUT/knob-$name"
        env "${vars[@]}" RATE="${LR_NCCL_RATE:-32}" OUT="$o" TALLY_BIN="$TALLY" STEP_TIMEOUT=120 MODES="${LR_NCCL_KNOB_MODES:-collnet}" SIZES="${LR_NCCL_KNOB_SIZES:-16M,64M}" DTYPES=f32 \
            PLUGIN="${PLUGIN:-$(dirname "$TALLY")/libnccl_net_tally.so}" bash tests/nccl/cluster_proof.sh >"$o.out" 2>&1
        rc=$?
        ch=$(grep -ohE "[0-9]+ coll channels, [0-9]+ collnet channels" "$o"/*.nccl.*.log 2>/dev/null | sort -u | paste -sd/)
        python3 - "$o" "$knob" "$rc" "$ch" <<'PY' | tee -a "$S"
import glob, json, os, sys
o, knob, rc, ch = sys.argv[1:5]
for p in sorted(glob.glob(os.path.join(o, "*.jsonl"))):
    mode, rate = os.path.basename(p)[:-6].rsplit("-", 1)
    rate = float(rate)
    for line in open(p):
        r = json.loads(line)
        # Bounds (measuring.md): reduction servers R, the ring R n/(2(n-1)).
        n = r["world"]
        bound = rate / 8 if mode.startswith("collnet") else rate / 8 * n / (2 * (n - 1))
        print(f"{knob:>40} {mode:>12} {rate:>4g} {r['bytes'] >> 20:>4}Mi fraction {r['algbw_GBps'] / bound:.2f}  p50 {r['p50_us'] / 1e3:.2f} ms  wrong {r['wrong']}  [{ch}] rc {rc}")
PY
    done
fi

if has demo; then
    say ""
    say "## tally demo"
    timeout -k 5 200 "$TALLY" demo 2>&1 | tee -a "$S"
fi
