#!/usr/bin/env bash
# One command for a 16+ core host that has only the built binaries and
# devlib/ (scripts/device/pack.sh): builds nothing, writes a summary to
# $OUT/summary.txt and every part's files into $OUT/details.tar.gz.
#
#   LD_LIBRARY_PATH=$PWD/devlib/lib TALLY_IPROUTE=$PWD/devlib/iproute OUT=/tmp/out scripts/device/session.sh [parts]
#
# Parts (default: latency tail cluster demo), run in this order whatever the
# order given; each is parts/NAME.sh, whose header says what it measures,
# its knobs (environment variables) and the files it writes; summarise.py
# turns those files into the summary's tables.
#   latency    shm ping-pong, then 4 KiB agg vs ring back-to-back (LAT_RANKS, LAT_LARGE)
#   scale      8 ranks against 1, 2, 4, 8 lcores, beside the p2p ceiling
#   scale-grid the same in detail: copy path, size, placement, pages, chunk (scale.sh's)
#   matrix     4 KiB: ranks x lcore sets x TALLY_MIN_PIECE
#   profile    host facts, ping-pong per core pair, perf profiles (PF_CLUSTER, PF_LINES)
#   tail       a 4 KiB loop alone and beside a 64 MiB job
#   cluster    emulated cluster 4 + 4 and 8 + 8 hosts, 2-16 Gbit/s
#   cpu16      16 Gbit/s: busy against adaptive polling, 1 against 2 lcores
#   ranks      8 and 1024 ranks on one server: join time, threads, RSS
#   rankscale  GB/s per lcore, 8 ranks against 1024 (RS_*)
#   fostage    what failover's staging copy costs (TALLY_FAILOVER=0 and =1)
#   relay      the two-rank relay against TALLY_RELAY=0 (RL_ROUNDS)
#   split      split small all-reduces against whole and the ring (SP_*)
#   demo       `tally demo` as a user runs it
#   grayfail   a server SIGSTOPped mid-loop on the emulated cluster (STOP_S;
#              scripts/device/grayfail.sh runs it alone, as issue 31 did)
# Environment: TALLY (default target/release/tally), DEVLIB (devlib), OUT (./out).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=scripts/device/lib.sh
. scripts/device/lib.sh
session_begin session "device session" "latency tail cluster demo" "$@"
say "# $("$TALLY" --version)"
for part in latency scale scale-grid matrix profile tail cluster cpu16 ranks rankscale fostage relay split demo grayfail; do
    run_part "$part"
done
say "done"
