#!/usr/bin/env bash
# Cross-builds tally-engine's reduction kernels for aarch64 (Graviton) and runs
# their tests under qemu-user, so the NEON path is checked from an x86 machine.
# Emulated timings mean nothing; only correctness is checked here.
#
#   scripts/build/test-aarch64.sh            install what is missing, then test
#   scripts/build/test-aarch64.sh --build-only    only build the tests (scripts/build/prebuild.sh)
#   TALLY_SKIP_AARCH64=1 scripts/...   skip (prints a WARNING)
#
# Extra arguments go to the integration test binary (e.g. a test name filter).
set -euo pipefail
BUILD_ONLY=0
[[ "${1:-}" != "--build-only" ]] || { BUILD_ONLY=1; shift; }

AARCH64_WHO="aarch64"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/build/aarch64-lib.sh
source "$ROOT/scripts/build/aarch64-lib.sh"
aarch64_begin "the aarch64 (NEON) kernels were" "$ROOT/target-reduce"
TARGET="$AARCH64_TARGET"
aarch64_toolchain

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# Pin the library path to the cross libc as well as the loader: once arm64
# multiarch packages are installed (libfabric-dev:arm64 brings libc6:arm64),
# the cross loader would otherwise pick up /lib/aarch64-linux-gnu's libc, a
# different build, and the first thread a test spawns hangs.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib"

if ((BUILD_ONLY)); then
    # Both test binaries in one cargo run; the runs below then find them built.
    cargo test -p tally-engine --no-default-features --features std --target "$TARGET" --lib --test reduce --no-run ||
        fail "the tests did not build"
    exit 0
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# `std` without `fabric`: the kernels need no libfabric, so nothing arm64
# beyond libc. First the kernels' own unit tests (conversions, detection;
# the other modules' unit tests are not this script's business), then the
# integration test, which runs every kernel against the reference.
run_tests() {
    cargo test -p tally-engine --no-default-features --features std --target "$TARGET" "$@" 2>&1 | tee -a "$log"
}
if ! run_tests --lib -- reduce:: || ! run_tests --test reduce -- "$@"; then
    fail "tests failed or did not build (see above)"
fi

passed=$(awk '/^test result: ok\./ { for (i = 1; i <= NF; i++) if ($i == "passed;") n += $(i - 1) } END { print n + 0 }' "$log")
((passed > 0)) || fail "no tests ran"
# The integration test prints what it ran: "isas under test: scalar, neon (cpu: neon fp16 ...)".
under_test=$(sed -n 's/.*isas under test: //p' "$log" | head -n1)
[[ "$under_test" == *neon* ]] || fail "the NEON kernels were not exercised"
kernels=${under_test%% (*}
cpu=$(sed -n 's/.*(cpu: \(.*\))$/\1/p' <<<"$under_test")
echo "aarch64: $passed tests passed under qemu (kernels: $kernels; cpu: ${cpu// /, })"
