#!/usr/bin/env bash
# Issue 55's measurements on the device, in one call of the device tool
# (about 6 minutes), each part bounded in time; a summary per part in
# $OUT/<part>.txt and one line each in $OUT/summary.txt:
#   heal  HOSTS 3 + 3 at HEAL_RATE Gbit/s (2), 16 MiB agg: one server's link
#         cut for 20 s and healed (soak-rate.sh FAULTS=cut CUT_S=20): the
#         loop's slowest all-reduce, when the server was lost, when it was
#         taken back after the heal (the ranks' "is back in job" lines)
#   loss  `bench cluster --hosts 4 --rates LOSS_RATE (8) --sizes 16M --mode
#         agg,agg-plugin,ring --loss 0,0.1,1`: the table and what TCP did
#   soak  soak-rate.sh at SOAK_RATE (8) for SOAK_S (240) s, a fault every 45 s
#         (kill and restart, SIGSTOP 10 s, cut 10 s, 1% loss 45 s)
#
#   OUT=$OUT/f TALLY=$PWD/devlib/bin/tally PARTS="heal loss soak" scripts/device/faults-at-rate.sh
#
# On the device: carry devlib (scripts/device/pack.sh: ip, tc and nft) and set
# LD_LIBRARY_PATH=$PWD/devlib/lib TALLY_IPROUTE=$PWD/devlib/iproute.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
TALLY="${TALLY:-$PWD/target/release/tally}"
OUT="${OUT:-/tmp/faults-at-rate}"
PARTS="${PARTS:-heal loss soak}"
mkdir -p "$OUT"
S="$OUT/summary.txt"
: >"$S"
echo "# faults at rate on $(hostname): $(nproc) cores, $(uname -r), parts: $PARTS" | tee -a "$S"

part() { [[ " $PARTS " == *" $1 "* ]]; }

if part heal; then
    d="$OUT/heal"
    mkdir -p "$d"
    HOSTS=3 RATE="${HEAL_RATE:-2}" SIZE=16M FAULTS=cut CUT_S=20 FAULT_EVERY=25 DURATION=70 WARM_S=5 \
        OUT="$d" TALLY="$TALLY" timeout 150 scripts/device/soak-rate.sh >"$d/run.out" 2>&1
    echo "heal: rc $?" | tee -a "$S"
    grep -E 'longest stall|wrong elements|failed operations|faults injected' "$d/soak-rate.txt" 2>/dev/null | sed 's/^/heal: /' | tee -a "$S"
    grep -hE 'cut|heal|link' "$d/soak-rate.txt" 2>/dev/null | grep -vE 'faults injected' | head -6 | sed 's/^/heal: /' | tee -a "$S"
    log="$d/cluster.log"
    [[ -f "$log" ]] && grep -hE ' lost \(|is back in job|took [0-9.]+ s|still wait' "$log" | cut -c1-200 | head -20 | sed 's/^/heal: /' | tee -a "$S"
fi

if part loss; then
    timeout 330 "$TALLY" bench cluster --hosts 4 --rates "${LOSS_RATE:-8}" --sizes 16M --mode agg,agg-plugin,ring \
        --loss 0,0.1,1 --log "$OUT/loss.log" >"$OUT/loss.txt" 2>"$OUT/loss.err"
    echo "loss: rc $?" | tee -a "$S"
    grep -vE '^\s*$' "$OUT/loss.txt" | sed 's/^/loss: /' | tee -a "$S"
    tail -3 "$OUT/loss.err" | sed 's/^/loss: /' | tee -a "$S"
fi

if part soak; then
    d="$OUT/soak"
    mkdir -p "$d"
    RATE="${SOAK_RATE:-8}" DURATION="${SOAK_S:-240}" FAULT_EVERY=45 OUT="$d" TALLY="$TALLY" \
        timeout $((${SOAK_S:-240} + 120)) scripts/device/soak-rate.sh >"$d/run.out" 2>&1
    echo "soak: rc $?" | tee -a "$S"
    sed 's/^/soak: /' "$d/soak-rate.txt" 2>/dev/null | tee -a "$S"
fi
