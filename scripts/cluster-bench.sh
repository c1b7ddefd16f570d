#!/usr/bin/env bash
# Emulated cluster: N server hosts and N worker hosts, each a network namespace
# with one link to a bridge, shaped with tc tbf to RATE in both directions
# (egress on both ends of each veth). Addresses from 198.18.0.0/15, provider
# tcp;ofi_rxm, adaptive polling. Runs agg and ring all-reduce among the workers
# and prints algbw, busbw, the link-rate bound, the fraction of it reached and
# agg/ring, for each rate given. Makes and deletes everything it uses; every
# step is bounded in time.
#
#   scripts/cluster-bench.sh [--rates 1,0.5] [--hosts 4] [--sizes 16M,64M] [--iters 5] [--json]
#
# Environment: CHUNK (agg and ring chunk, default 512K), WINDOW (default 4),
# SEND_CREDITS (agg sends in flight per server per worker, default 1: paced,
# see engine/src/client.rs; 0 = as many as the window allows), TBF_BURST,
# TBF_LATENCY, MTU.
set -euo pipefail

RATES="0.5,0.25"   # Gbit/s per link
HOSTS=4
SIZES="16M,64M"
ITERS=5
JSON=0
# tbf queue: a short queue keeps the rendezvous handshakes of tcp;ofi_rxm from
# waiting behind a bufferbloated backlog of bulk data.
TBF_BURST="${TBF_BURST:-4mb}"
TBF_LATENCY="${TBF_LATENCY:-50ms}"
TALLY="${TALLY:-$(dirname "$0")/../target/release/tally}"
while [ $# -gt 0 ]; do
    case "$1" in
        --rates) RATES="$2"; shift 2 ;;
        --hosts) HOSTS="$2"; shift 2 ;;
        --sizes) SIZES="$2"; shift 2 ;;
        --iters) ITERS="$2"; shift 2 ;;
        --json) JSON=1; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
TALLY="$(readlink -f "$TALLY")"
[ -x "$TALLY" ] || { echo "cluster-bench: build first (make): $TALLY missing" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "cluster-bench: needs root (network namespaces, tc)" >&2; exit 1; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "cluster-bench: needs iproute2 (ip, tc)" >&2; exit 1; }

PFX="tly$$"
SW="${PFX}sw"
WORK="$(mktemp -d)"
PIDS=()
log() { [ "$JSON" = 1 ] || echo "$@"; }

cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    sleep 0.2
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
    for ns in $(ip netns list | awk '{print $1}' | grep "^${PFX}" || true); do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

# Host i (0-based): servers are s0..s(N-1) at .10+i, workers w0..w(N-1) at .50+i.
addr_of() { case "$1" in s*) echo "198.18.0.$((10 + ${1#s}))" ;; w*) echo "198.18.0.$((50 + ${1#w}))" ;; esac; }

ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 mtu "${MTU:-9000}"
ip -n "$SW" link set br0 up
ip -n "$SW" link set lo up
HOSTNAMES=()
for i in $(seq 0 $((HOSTS - 1))); do HOSTNAMES+=("s$i" "w$i"); done
for h in "${HOSTNAMES[@]}"; do
    ns="${PFX}$h"
    ip netns add "$ns"
    ip link add "${PFX}$h" type veth peer name eth0 netns "$ns"
    ip link set "${PFX}$h" netns "$SW"
    ip -n "$SW" link set "${PFX}$h" master br0 up
    # Jumbo frames, as EFA-class fabrics have (9001 on AWS): with 1500 the
    # per-packet cost, not the shaped rate, bounds tcp;ofi_rxm here.
    ip -n "$SW" link set "${PFX}$h" mtu "${MTU:-9000}"
    ip -n "$ns" link set eth0 mtu "${MTU:-9000}"
    ip -n "$ns" addr add "$(addr_of "$h")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
done

shape() { # rate in Gbit/s, on both ends of every veth
    local r="$1" mbit
    mbit=$(python3 -c "print(int(float('$r') * 1000))")
    for h in "${HOSTNAMES[@]}"; do
        ip netns exec "${PFX}$h" tc qdisc replace dev eth0 root tbf rate "${mbit}mbit" burst "$TBF_BURST" latency "$TBF_LATENCY"
        ip netns exec "$SW" tc qdisc replace dev "${PFX}$h" root tbf rate "${mbit}mbit" burst "$TBF_BURST" latency "$TBF_LATENCY"
    done
}

SERVERS=""
# Each server gets two cores of its own where the machine has enough for
# servers and workers (a quiet 16+ core host); on a small box all share 0-1.
spread=0; [ "$(nproc)" -ge $((HOSTS * 4)) ] && spread=1
for i in $(seq 0 $((HOSTS - 1))); do
    a="$(addr_of "s$i")"
    lc="0-1"; [ "$spread" = 1 ] && lc="$((2 * i))-$((2 * i + 1))"
    ip netns exec "${PFX}s$i" env TALLY_LOG=warn TALLY_ADAPTIVE_SPIN="${TALLY_ADAPTIVE_SPIN:-16}" "$TALLY" server --listen "$a:7400" --lcores "$lc" --provider tcp \
        --poll adaptive --slab-size 128M >"$WORK/s$i.out" 2>"$WORK/s$i.err" &
    PIDS+=($!)
    SERVERS="${SERVERS:+$SERVERS,}$a:7400"
done
for i in $(seq 0 $((HOSTS - 1))); do
    for _ in $(seq 100); do grep -q "ready" "$WORK/s$i.out" 2>/dev/null && break; sleep 0.1; done
    grep -q "ready" "$WORK/s$i.out" || { echo "server s$i did not start:"; cat "$WORK/s$i.err"; exit 1; }
done

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
IFS=',' read -r -a RATE_LIST <<<"$RATES"
for rate in "${RATE_LIST[@]}"; do
    shape "$rate"
    log "# link rate $rate Gbit/s: $HOSTS servers + $HOSTS workers, tcp;ofi_rxm, adaptive polling"
    job=$((RANDOM * 65536 + RANDOM + 1))
    port=$((29000 + RANDOM % 1000))
    boot="$(addr_of w0):$port"
    RANK_PIDS=()
    for i in $(seq 0 $((HOSTS - 1))); do
        ip netns exec "${PFX}w$i" env TALLY_LOG=warn TALLY_ADAPTIVE_SPIN="${TALLY_ADAPTIVE_SPIN:-16}" timeout 600 "$TALLY" bench allreduce --rank "$i" --ranks "$HOSTS" \
            --bootstrap "$boot" --job-id "$job" --servers "$SERVERS" --provider tcp --fabric-addr "$(addr_of "w$i")" \
            --mode agg,ring --sizes "$SIZES" --iters "$ITERS" --warmup 1 --chunk "${CHUNK:-512K}" --window "${WINDOW:-4}" --send-credits "${SEND_CREDITS:-1}" \
            >"$WORK/w$i.out" 2>"$WORK/w$i.err" &
        RANK_PIDS+=($!)
        PIDS+=($!)
    done
    for i in "${!RANK_PIDS[@]}"; do
        wait "${RANK_PIDS[$i]}" || { echo "worker $i failed:"; tail -5 "$WORK/w$i.err"; exit 1; }
    done
    grep '^RESULT ' "$WORK/w0.out" | sed "s/^RESULT /$rate /" >>"$RESULTS"
done

python3 - "$RESULTS" "$HOSTS" "$JSON" <<'PY'
import json, sys
path, n, as_json = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
rows = []
for line in open(path):
    rate, js = line.split(" ", 1)
    r = json.loads(js)
    rate = float(rate)
    link = rate * 1e9 / 8 / 1e9  # GB/s per link
    bound = link if r["mode"] == "agg" else link * n / (2 * (n - 1))
    rows.append({"link_gbit": rate, "mode": r["mode"], "bytes": r["bytes"], "algbw_GBps": r["algbw_GBps"],
                 "busbw_GBps": r["busbw_GBps"], "bound_GBps": bound, "fraction": r["algbw_GBps"] / bound, "wrong": r["wrong"]})
wrong = sum(r["wrong"] for r in rows)
if as_json:
    for rate in sorted({r["link_gbit"] for r in rows}, reverse=True):
        print(json.dumps({"link_gbit": rate, "results": [ {k: v for k, v in r.items() if k != "link_gbit"} for r in rows if r["link_gbit"] == rate]}))
else:
    print(f"{'Gbit/s':>7} {'mode':>5} {'size':>9} {'algbw GB/s':>11} {'busbw GB/s':>11} {'bound GB/s':>11} {'fraction':>9} {'agg/ring':>9} {'#wrong':>7}")
    for r in rows:
        ring = [x for x in rows if x["mode"] == "ring" and x["bytes"] == r["bytes"] and x["link_gbit"] == r["link_gbit"]]
        ratio = f"{r['algbw_GBps'] / ring[0]['algbw_GBps']:.2f}" if r["mode"] == "agg" and ring else ""
        print(f"{r['link_gbit']:>7} {r['mode']:>5} {r['bytes'] // (1<<20):>7}Mi {r['algbw_GBps']:>11.4f} {r['busbw_GBps']:>11.4f} {r['bound_GBps']:>11.4f} {r['fraction']:>9.2f} {ratio:>9} {r['wrong']:>7}")
    print(f"# bounds: agg <= R (servers together have the workers' bandwidth), ring <= R x n/(2(n-1)); ideal agg/ring = 2(n-1)/n = {2*(n-1)/n:.2f}")
sys.exit(1 if wrong else 0)
PY
