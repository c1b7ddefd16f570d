#!/usr/bin/env bash
# The tally-nccl wheel from the binaries `make build` made: no compile here.
#
#   scripts/build/wheel.sh [TRIPLE]     (default: this host's; aarch64-unknown-linux-gnu
#                                        after `scripts/build/release.sh aarch64-unknown-linux-gnu`)
#   WHEEL_BIN=DIR scripts/build/wheel.sh   the binaries in DIR instead
#
# Checks the binaries' glibc floor (scripts/build/check-glibc.sh, 2.28: the
# manylinux_2_28 tag promises it), then scripts/build/wheel.py writes
# target/wheels/tally_nccl-VERSION-py3-none-manylinux_2_28_ARCH.whl and prints its path.
# Not maturin: maturin compiles the crates itself, and CI must package what
# `make build` already linked rather than build the workspace a second time.
set -euo pipefail
cd "$(dirname "$0")/../.."

TRIPLE="${1:-$(uname -m)-unknown-linux-gnu}"
# WHEEL_BIN: where the binaries are, when not release.sh's output (make test
# packs its own ci-profile build, linked the same way: see the Makefile).
BIN="${WHEEL_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/$TRIPLE/release}"
for f in tally libnccl_net_tally.so; do
    [[ -f "$BIN/$f" ]] || { echo "wheel: $BIN/$f is missing: run 'make build' (or scripts/build/release.sh $TRIPLE) first" >&2; exit 1; }
done
scripts/build/check-glibc.sh --floor 2.28 "$BIN/tally" "$BIN/libnccl_net_tally.so" >&2
python3 scripts/build/wheel.py --tally "$BIN/tally" --plugin "$BIN/libnccl_net_tally.so" \
    --out "${CARGO_TARGET_DIR:-$PWD/target}/wheels" --glibc 2.28
