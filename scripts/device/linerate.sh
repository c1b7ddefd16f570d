#!/usr/bin/env bash
# Issue 30's measurements on a many-core host (the device kinds with 64
# cores): builds nothing, needs the built binaries and devlib/
# (scripts/device/pack.sh), writes a summary to $OUT/summary.txt and every
# part's files into $OUT/details.tar.gz.
#
#   LD_LIBRARY_PATH=$PWD/devlib/lib TALLY_IPROUTE=$PWD/devlib/iproute OUT=/tmp/out scripts/device/linerate.sh [parts]
#
# Parts (default: cluster p2p), run in this order; each is a file of parts/
# (named after the colon below) whose header says what it measures, its knobs
# and the files it writes:
#   membw                  the host's memory bandwidth: k single-core copies at once (LR_MEMBW_K)
#   cluster:configs        configurations alternated at 16-32 Gbit/s (LR_CONFIGS, LR_ROUNDS, LR_RATES,
#                          LR_THREADS=1 for each thread's CPU, threads.py; a config's TALLY=path for another build;
#                          a config named ...-hog beside LR_HOG_CORES memory-bound copies, ...-spin beside
#                          as many spinning loops)
#   cpu                    CPU seconds per GB, adaptive polling (LR_CPU_RATES)
#   libs                   the cluster part once per libfabric build (LR_LIBS, LR_LIB_CONFIGS)
#   p2p:tcp-ceiling        tcp p2p ceiling beside plain TCP sockets
#   perf:cluster-perf      perf of the whole host during a 32 Gbit/s run (LR_PERF_MODE, LR_PERF_CONFIGS)
#   nccl, nccl-sync:nccl   real NCCL (tests/nccl/cluster_proof.sh; LR_NCCL_*; LR_STALLS=1 for
#                          the threads kept off a CPU meanwhile, stalls.py; LR_LINKS=1 for each
#                          emulated host's link and sockets, links.py)
#   nccl-knobs             NCCL settings one at a time (LR_NCCL_KNOBS, ...)
#   nccl-perf              perf of the host during real NCCL CollNet at 32 Gbit/s
#   demo                   `tally demo` as a user runs it
# Environment: TALLY (default target/release/tally), DEVLIB (devlib), OUT (./out).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=scripts/device/lib.sh
. scripts/device/lib.sh
session_begin linerate "line-rate session" "cluster p2p" "$@"
say "# $("$TALLY" --version); libfabric $(fabric_version) (what fi_version() says; the file name's number is libtool's, 1.20.0 for 1.17)"
for part in membw cluster:configs cpu libs p2p:tcp-ceiling perf:cluster-perf nccl nccl-sync:nccl nccl-knobs nccl-perf demo; do
    run_part "${part%%:*}" "${part#*:}"
done
