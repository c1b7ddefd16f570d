#!/usr/bin/env bash
# Installs the wheel into a fresh virtual environment and tests the installed
# copy only (python/tests/installed.py: tally --version, the env block, the
# preflight's passes and failures, all-reduces through two servers started
# from the installed tally), then runs the plugin harness (ffi-plugin/tests:
# the ABI and the ncclNet suite over shm, each table version) against the
# installed .so. (The tcp suite runs the same bytes in test-rust: 19 s more.)
#
#   scripts/build/test-wheel.sh [WHEEL]    (default: scripts/build/wheel.sh's)
#
# Offline: pip installs the local file (--no-index). The venv has no pip of
# its own (ensurepip took most of this test's time): target/py-tools' pip
# (scripts/build/deps-py.sh), else python3's, installs into it with --python.
set -euo pipefail
cd "$(dirname "$0")/../.."

TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
WHEEL="${1:-$(scripts/build/wheel.sh)}"
VENV="$TARGET/wheel-venv"
PIP=("$PWD/target/py-tools/bin/pip")
[[ -x "${PIP[0]}" ]] || PIP=(python3 -m pip)

rm -rf "$VENV"
python3 -m venv --without-pip "$VENV"
"${PIP[@]}" --python "$VENV/bin/python" install --quiet --no-index --disable-pip-version-check "$WHEEL"
echo "test-wheel: installed $(basename "$WHEEL") into $VENV"

# Nothing of the checkout on the paths: only the venv and the system's.
so="$("$VENV/bin/python" -I -m tally_nccl path | head -1)"
(cd "$VENV" && env -u LD_LIBRARY_PATH -u PYTHONPATH PATH="$VENV/bin:/usr/bin:/bin" \
    "$VENV/bin/python" -I "$OLDPWD/python/tests/installed.py")

# The plugin harness, loading the installed library: --workspace, as test-rust
# built it (one package alone unifies features otherwise and recompiles).
# As test-rust built the harness (the Makefile's CI_CARGO): the same
# command finds it built.
PATH="$PWD/target/py-tools/bin:$PATH" TALLY_PLUGIN_SO="$so" cargo-zigbuild test --profile ci --target "$(uname -m)-unknown-linux-gnu.2.28" \
    --workspace --test abi --test net_shm -- --test-threads="${TEST_THREADS:-2}"
echo "test-wheel: the plugin harness passed against $so"
