#!/usr/bin/env bash
# The reduction kernels' tests (engine/tests/reduce.rs) as aarch64 (Graviton)
# code under qemu-user, so the NEON path is checked from an x86 machine.
# Emulated timings mean nothing; only correctness is checked here.
#
#   scripts/build/test-aarch64.sh            install what is missing, then test
#   scripts/build/test-aarch64.sh --build-only    only build (scripts/build/prebuild.sh)
#   TALLY_SKIP_AARCH64=1 scripts/...   skip (prints a WARNING)
#
# Extra arguments go to the test binary (e.g. a test name filter).
#
# The test binary comes from test-aarch64-e2e.sh's cross build (one cargo
# run for every aarch64 binary make test starts: the ci profile, zig, the
# arm64 libfabric it links), which this runs first (a no-op when it is
# fresh). The engine's own unit tests of the scalar kernels are not run here:
# they are the same Rust on every architecture, and the x86 suites run them.
set -euo pipefail
BUILD_ONLY=0
[[ "${1:-}" != "--build-only" ]] || { BUILD_ONLY=1; shift; }

AARCH64_WHO="aarch64"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Where test-aarch64-e2e.sh builds (it adds aarch64-e2e to CARGO_TARGET_DIR,
# so it is called with the caller's, not the one aarch64_begin exports).
CALLER_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
E2E_DIR="$CALLER_TARGET_DIR/aarch64-e2e"
# shellcheck source=scripts/build/aarch64-lib.sh
source "$ROOT/scripts/build/aarch64-lib.sh"
aarch64_begin "the aarch64 (NEON) kernels were" "$E2E_DIR"

CARGO_TARGET_DIR="$CALLER_TARGET_DIR" "$ROOT/scripts/build/test-aarch64-e2e.sh" --build-only >/dev/null || fail "the aarch64 build failed (scripts/build/test-aarch64-e2e.sh --build-only says why)"
((!BUILD_ONLY)) || exit 0

aarch64_env "$ROOT/target-aarch64"
test_bin="$(awk '$1 == "reduce" { print $2 }' "$E2E_DIR/aarch64-tests.list")"
[[ -x "$test_bin" ]] || fail "no reduce test binary in $E2E_DIR/aarch64-tests.list"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! "${AARCH64_RUN[@]}" "$test_bin" "$@" 2>&1 | tee "$log"; then
    fail "tests failed (see above)"
fi

passed=$(awk '/^test result: ok\./ { for (i = 1; i <= NF; i++) if ($i == "passed;") n += $(i - 1) } END { print n + 0 }' "$log")
((passed > 0)) || fail "no tests ran"
under_test=$(sed -n 's/.*isas under test: //p' "$log" | head -n1)
[[ "$under_test" == *neon* ]] || fail "the NEON kernels were not exercised"
kernels=${under_test%% (*}
cpu=$(sed -n 's/.*(cpu: \(.*\))$/\1/p' <<<"$under_test")
echo "aarch64: $passed tests passed under qemu (kernels: $kernels; cpu: ${cpu// /, })"
