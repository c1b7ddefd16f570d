#!/usr/bin/env bash
# Emulated cluster: N server hosts and N worker hosts, each a network namespace
# with one link to a bridge, shaped with tc tbf to RATE in both directions.
# A thin wrapper over `tally bench cluster` (tools/src/bench/cluster/), which does
# the work: placement, shaping, agg and ring, the table, cleanup.
#
#   scripts/bench/cluster.sh [--rates 1,0.5] [--hosts 4] [--sizes 16M,64M] [--iters 5] [--json] [--plot FILE.svg]
#
# Environment: TALLY (binary, default target/release/tally), CHUNK (default
# auto: 32 KiB up to 8 Gbit/s, then 16 KiB per Gbit/s), WINDOW (4), SEND_CREDITS (1), MTU (9000), TBF_BURST, TBF_LATENCY,
# TALLY_IPROUTE (a folder with Debian's iproute2 unpacked, for hosts without
# ip and tc), LOG (file for server and worker log lines).
set -euo pipefail

TALLY="${TALLY:-$(dirname "$0")/../../target/release/tally}"
[ -x "$TALLY" ] || { echo "cluster-bench: build first (make): $TALLY missing" >&2; exit 1; }
RATES=1,0.5 SIZES=16M,64M ITERS=5
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --rates) RATES="$2"; shift 2 ;;
        --sizes) SIZES="$2"; shift 2 ;;
        --iters) ITERS="$2"; shift 2 ;;
        --hosts|--plot|--mode) extra+=("$1" "$2"); shift 2 ;;
        --json) extra+=("$1"); shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "cluster-bench: unknown argument $1" >&2; exit 2 ;;
    esac
done
exec "$TALLY" bench cluster --rates "$RATES" --sizes "$SIZES" --iters "$ITERS" "${extra[@]}" \
    --chunk "${CHUNK:-auto}" --window "${WINDOW:-4}" --send-credits "${SEND_CREDITS:-1}" --mtu "${MTU:-9000}" \
    --tbf-burst "${TBF_BURST:-auto}" --tbf-latency "${TBF_LATENCY:-50ms}" ${LOG:+--log "$LOG"}
