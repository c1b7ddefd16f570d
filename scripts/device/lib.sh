# shellcheck shell=bash
# What the device drivers (session.sh, linerate.sh, grayfail.sh, bench.sh,
# scale.sh, profile.sh) and their parts (parts/*.sh) share; sourced, from the
# repository root.
#
# session_begin NAME TITLE DEFAULT_PARTS [PARTS...] reads TALLY (the binary,
# default target/release/tally), OUT (where the results go, default ./out) and
# DEVLIB (devlib/, scripts/device/pack.sh); it sets PARTS, FINAL (the folder
# OUT named), OUT (a work folder under /tmp that the parts write their files
# to, packed into $FINAL/details.tar.gz on exit: the device tool brings back
# only a few files), S ($FINAL/summary.txt, emptied, then its first line:
# TITLE, host, parts) and C (cores), and
# exports TALLY_LOG=warn (the runs' own log lines, not the tables, on stderr).
# run_part NAME [FILE] runs parts/FILE.sh (default NAME) if NAME is in PARTS,
# in a subshell, so that a part's variables and exports end with it.
DEVICE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TALLY="${TALLY:-$PWD/target/release/tally}"
DEVLIB="${DEVLIB:-$PWD/devlib}"
# shellcheck disable=SC2034 # C and PART are for the parts
C=$(nproc)

session_begin() { # NAME TITLE DEFAULT_PARTS [PARTS...]
    local name=$1 title=$2 default=$3
    shift 3
    FINAL="${OUT:-./out}"
    PARTS="${*:-$default}"
    OUT="$(mktemp -d "/tmp/tally-$name.XXXXXX")"
    mkdir -p "$FINAL"
    S="$FINAL/summary.txt"
    trap 'tar -C "$OUT" -czf "$FINAL/details.tar.gz" . 2>/dev/null' EXIT
    : >"$S"
    export TALLY_LOG=warn
    say "# tally $title on $(hostname): $(nproc) cores, $(uname -r), TCP $(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo "?") (the emulated hosts: what their headers say); parts: $PARTS"
}

say() { echo "$@" | tee -a "$S"; }
has() { [[ " $PARTS " == *" $1 "* ]]; }

run_part() { # NAME [FILE]
    has "$1" || return 0
    # shellcheck disable=SC1090,SC2034
    ( PART=$1; . "$DEVICE_DIR/parts/${2:-$1}.sh" )
}

# summarise KIND ARG...: summarise.py's table for a part, onto the summary
# (an error too: the summary then says why a row is missing).
summarise() { python3 "$DEVICE_DIR/summarise.py" "$@" 2>&1 | tee -a "$S"; }
# host_state: the load and the kernel's pressure figures (share of the last
# 10 s some task waited for CPU, memory, io), one line: to tell a slow call
# from a slow configuration (the same settings moved 0.77 -> 0.97 between calls).
host_state() {
    local psi=""
    for r in cpu memory io; do
        [ -r "/proc/pressure/$r" ] && psi+=" $r $(awk '/^some/ {sub("avg10=", "", $2); print $2; exit}' "/proc/pressure/$r")%"
    done
    echo "load $(cut -d' ' -f1 /proc/loadavg);${psi:- no /proc/pressure}"
}
probe() { python3 "$DEVICE_DIR/probes.py" "$@"; }

# wait_ready FILE [TENTHS]: until a server's stdout says ready (10 s default).
wait_ready() {
    for _ in $(seq "${2:-100}"); do grep -q ready "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}

# shm_pingpong CORES FILE [SIZES]: the shm ping-pong between two cores, busy,
# median of 20000 (1000 varied by 20% from run to run on the device VM), as
# JSON: `summarise.py rtt FILE` is the round trip the latency ratios use.
shm_pingpong() {
    timeout 120 "$TALLY" bench p2p --provider shm --sizes "${3:-4K}" --iters 20000 --cores "$1" --json 2>/dev/null >"$2"
}

# perf_unpack: PERF names a perf that runs here: devlib's (devlib/perf.tar.xz,
# unpacked once under /tmp/tally-perf: the bare host has none), else empty.
perf_devlib() { LD_LIBRARY_PATH="/tmp/tally-perf/perf/lib:${LD_LIBRARY_PATH:-}" /tmp/tally-perf/perf/perf "$@"; }
perf_unpack() {
    PERF=""
    [ -f "$DEVLIB/perf.tar.xz" ] || return 1
    [ -x /tmp/tally-perf/perf/perf ] || { mkdir -p /tmp/tally-perf && tar -C /tmp/tally-perf -xJf "$DEVLIB/perf.tar.xz"; }
    PERF=perf_devlib
}

# perf_during AFTER SECONDS DATA RECORD-ARGS... -- COMMAND...: COMMAND in the
# background (its output, and perf's errors, where the caller sends this
# function's), and a `$PERF record RECORD-ARGS` of SECONDS once AFTER seconds
# have passed (the run's start and join left out); waits for COMMAND.
perf_during() {
    local after=$1 secs=$2 data=$3 rec=() pid
    shift 3
    while [ "$1" != -- ]; do rec+=("$1"); shift; done
    shift
    "$@" &
    pid=$!
    sleep "$after"
    $PERF record "${rec[@]}" -o "$data" -- sleep "$secs" >/dev/null
    wait "$pid"
}

# The libfabric version fi_version() reports (the file name's number is
# libtool's: 1.20.0 for 1.17).
fabric_version() { "$TALLY" doctor 2>/dev/null | awk '$1 == "libfabric" {gsub(";", "", $3); print $3; exit}'; }

# cluster_proof DIR STEP_TIMEOUT [VAR=value...]: real NCCL on the emulated
# cluster (tests/nccl/cluster_proof.sh) at LR_NCCL_RATE (32) Gbit/s and half,
# its files under DIR, its output in DIR.out; returns its status.
cluster_proof() {
    local o=$1 step=$2
    shift 2
    env "$@" RATE="${LR_NCCL_RATE:-32}" OUT="$o" TALLY_BIN="$TALLY" STEP_TIMEOUT="$step" \
        PLUGIN="${PLUGIN:-$(dirname "$TALLY")/libnccl_net_tally.so}" bash tests/nccl/cluster_proof.sh >"$o.out" 2>&1
}
