#!/usr/bin/env bash
# Installs what tally needs to build and test on Debian/Ubuntu, if missing.
# Idempotent: when everything is present it only checks (a second or so).
set -euo pipefail

# shellcheck and python3-venv: tools/tests/manifests/ (scripts/build/deps-py.sh makes the venv).
# nftables: `tally bench cluster --loss` drops packets with nft.
PKGS=(libfabric-dev libfabric-bin libibverbs-dev libclang-dev clang pkg-config build-essential iproute2 nftables procps python3 python3-venv shellcheck)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ! command -v cargo >/dev/null 2>&1; then
    echo "deps: cargo not found. Install a Rust toolchain (rustup, stable >= 1.80) first." >&2
    exit 1
fi

if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all present (${PKGS[*]})"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: this is not an apt-based system. Install the equivalents of: ${missing[*]}" >&2
    echo "      (libfabric >= 1.14 with headers and pkg-config file, libibverbs headers, libclang for bindgen)" >&2
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing packages: ${missing[*]}" >&2
    echo "      run as root (sudo make deps) or: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: installed ${missing[*]}"
