#!/usr/bin/env bash
# Figures that need more cores than a development box, on a 16+ core host
# with only the built `tally` binary (no toolchain, no network): the session's
# parts (session.sh) that make them, so that each is measured one way:
#   - latency: the shm ping-pong, then 2 ranks (LAT_RANKS), 4 KiB agg against
#     the ring, in shm round trips (parts/latency.sh; LAT_LARGE=0);
#   - core scaling in detail (parts/scale-grid.sh; RANKS and its knobs);
#   - `tally demo` (parts/demo.sh), unless SKIP_DEMO is set.
# Writes $OUT/summary.txt (default ./out) and the details into
# $OUT/details.tar.gz.
#   OUT=/tmp/out scripts/device/bench.sh
set -uo pipefail
parts=(latency scale-grid)
[ -n "${SKIP_DEMO:-}" ] || parts+=(demo)
LAT_RANKS="${LAT_RANKS:-2}" LAT_LARGE="${LAT_LARGE:-0}" exec "$(dirname "$0")/session.sh" "${parts[@]}"
