#!/usr/bin/env bash
# Where the time goes when one server scales over shm: a system-wide
# `perf record` (cpu-clock, call graphs) while a server with L lcores serves
# RANKS (8) pinned ranks, 64 MiB f32 sums. PERF is the perf to run (default
# `perf`); for a host without perf installed, carry one and its libraries and
# set PERF and LD_LIBRARY_PATH (devlib/perf.tar.xz is such a perf: the
# session's profile part unpacks it).
#   scripts/device/profile.sh [L ...]      (default: 8 1)
# Writes $OUT/profile-L.txt (default ./out): top (process, symbol) and the
# callers of the top symbols; $OUT/profile-L.json, the run's own figures.
set -uo pipefail
# shellcheck source=scripts/device/lib.sh
. "$(dirname "$0")/lib.sh"
PERF="${PERF:-perf}"
OUT="${OUT:-./out}"
RANKS="${RANKS:-8}"
mkdir -p "$OUT"
for L in "${@:-8 1}"; do
    iters=$((L >= 4 ? 300 : 60))
    perf_during 3 3 "/tmp/tally-profile-$L.data" -a -g -e cpu-clock -F 499 -- "$TALLY" bench allreduce --mode agg --ranks "$RANKS" \
        --lcores "0-$((L - 1))" --cores "$L-$(($(nproc) - 1))" --poll busy --sizes 64M --iters "$iters" --warmup 3 --chunk 256K --window 8 \
        --provider shm --json >"$OUT/profile-$L.json" 2>/dev/null
    {
        echo "# L=$L lcores, $RANKS ranks: $(cat "$OUT/profile-$L.json")"
        "$PERF" report -i "/tmp/tally-profile-$L.data" --stdio --no-children --sort comm,sym --percent-limit 0.8 -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
        "$PERF" report -i "/tmp/tally-profile-$L.data" --stdio --no-children --sort sym --percent-limit 4 -g caller,2,callee,function 2>/dev/null | grep -v '^#' | grep -v '^$' | head -60
    } >"$OUT/profile-$L.txt"
done
