#!/usr/bin/env bash
# What `make test` does beside the x86 suites (the Makefile starts this
# beside test-rust, make -j2), in the CPU they leave idle:
#   - the aarch64 build: tally, the plugin, its harness and the kernels'
#     tests, one cross build (test-aarch64-e2e.sh --build-only; its runs come
#     after the suites, and find everything built);
#   - the aarch64 kernels' tests under qemu (test-aarch64.sh): computation
#     only, no server and no deadline, so a busy host only slows them;
#   - the no_std core type-checked (a target directory of its own:
#     `cargo test` holds target/'s lock while the suites run).
# The x86 shipped binaries are test-rust's own build (the Makefile says why).
# At nice 10: the suites, several of which bound a stall or an error's delay
# in seconds, get about nine tenths of a core they share with the builds
# (CFS weights 1024 to 110) and preempt them on waking; the builds take what
# the suites leave idle (they wait on sockets and timers much of the time).
# Nice 19 hands the suites nearly all of it, but on a machine shared with
# other nice 10 builds it starved the prebuild for minutes.
#
#   scripts/build/prebuild.sh          output in target/prebuild.log; a line here
set -euo pipefail
cd "$(dirname "$0")/../.."

TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
mkdir -p "$TARGET"
LOG="$TARGET/prebuild.log"
: >"$LOG"
t0=$SECONDS
step() {
    local t=$SECONDS
    echo "prebuild: $*" >>"$LOG"
    if ! nice -n "10" "$@" >>"$LOG" 2>&1; then
        tail -n 60 "$LOG" >&2
        echo "prebuild: FAILED: $* (whole log: $LOG)" >&2
        exit 1
    fi
    echo "prebuild: $1: $((SECONDS - t)) s" >>"$LOG"
}
# Started from make -j2: cargo must not take make's job slots for its own.
unset MAKEFLAGS MFLAGS
step scripts/build/test-aarch64-e2e.sh --build-only
step scripts/build/test-aarch64.sh
grep '^aarch64: .* tests passed under qemu' "$LOG" || true
CARGO_TARGET_DIR="$TARGET/nostd" step cargo check -q -p tally-engine --no-default-features
echo "no_std core (reduce, wire) builds without std: ok"
echo "prebuild: the aarch64 build and kernels' tests, and the no_std check, beside the x86 suites ($((SECONDS - t0)) s, nice 10; log $LOG)"
