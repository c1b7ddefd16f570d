#!/usr/bin/env bash
# Core scaling in detail (parts/scale-grid.sh says what and its knobs:
# RANKS, LCORES_LIST, COPIES, SIZES, PLACES, HUGES, CHUNKS, WINDOW, PROCS),
# on a 16+ core host with only the built `tally` binary. Everything straight
# into $OUT (default ./out): the table in $OUT/scale-summary.txt, per-run JSON
# under RAW (default $OUT). The session runs the same part:
# scripts/device/session.sh scale-grid.
#   OUT=/tmp/out scripts/device/scale.sh
set -uo pipefail
# shellcheck source=scripts/device/lib.sh
. "$(dirname "$0")/lib.sh"
OUT="${OUT:-./out}"
mkdir -p "$OUT"
S="$OUT/scale-summary.txt"
export TALLY_LOG=warn
PARTS=scale-grid run_part scale-grid
