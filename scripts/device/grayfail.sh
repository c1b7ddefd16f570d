#!/usr/bin/env bash
# Issue 31's hung-server measurement alone (parts/grayfail.sh says what it
# does): everything straight into $OUT (default /tmp/grayfail), the summary
# into $OUT/grayfail.txt, as when it was first measured.
#
#   OUT=/tmp/out STOP_S=40 TALLY=devlib/bin/tally scripts/device/grayfail.sh
#
# On the device: carry devlib (scripts/device/pack.sh) and set
# LD_LIBRARY_PATH=$PWD/devlib/lib TALLY_IPROUTE=$PWD/devlib/iproute.
# The session runs the same part: scripts/device/session.sh grayfail.
set -uo pipefail
# shellcheck source=scripts/device/lib.sh
. "$(dirname "$0")/lib.sh"
OUT="${OUT:-/tmp/grayfail}"
mkdir -p "$OUT"
S="$OUT/grayfail.txt"
: >"$S"
PARTS=grayfail run_part grayfail
