#!/usr/bin/env bash
# The release binaries as tally ships them: `tally` and the NCCL plugin,
# linked against glibc 2.28 so that they load on Amazon Linux 2023 (glibc
# 2.34, the c7gn AMIs), Ubuntu 20.04+ (2.31), Debian 10+ and RHEL 8+ (2.28),
# whatever glibc the build host has.
#
#   scripts/build/release.sh [TRIPLE]        (default: this host's, e.g. x86_64-unknown-linux-gnu)
#   GLIBC_FLOOR=2.31 scripts/build/release.sh
#
# How: cargo-zigbuild links with zig's linker against stubs of that glibc
# version (the binaries reference no symbol version newer than the floor);
# libfabric and everything else stay the host's, found through pkg-config as
# before. scripts/build/deps-py.sh installs cargo-zigbuild and zig (PyPI: ziglang)
# into target/py-tools. scripts/build/check-glibc.sh then reads the binaries'
# symbol versions and fails above the floor.
#
# Output: target/TRIPLE/release/{tally,libnccl_net_tally.so}; for this host's
# triple also copied to target/release/ (where the demo, the scripts and the
# docs look), with the libnccl-net-tally.so name NCCL looks for.
set -euo pipefail
cd "$(dirname "$0")/../.."

FLOOR="${GLIBC_FLOOR:-2.28}"
NATIVE="$(uname -m)-unknown-linux-gnu"
TRIPLE="${1:-$NATIVE}"
TOOLS="$PWD/target/py-tools/bin"
TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

if [[ ! -x "$TOOLS/cargo-zigbuild" ]]; then
    echo "build: cargo-zigbuild is missing: run 'make deps' (scripts/build/deps-py.sh installs it and zig into target/py-tools)" >&2
    exit 1
fi
# The venv's python3 first: cargo-zigbuild runs zig as `python3 -m ziglang`.
export PATH="$TOOLS:$PATH"
cargo zigbuild --release --workspace --target "$TRIPLE.$FLOOR"

out="$TARGET_DIR/$TRIPLE/release"
scripts/build/check-glibc.sh --floor "$FLOOR" "$out/tally" "$out/libnccl_net_tally.so"
if [[ "$TRIPLE" == "$NATIVE" ]]; then
    mkdir -p "$TARGET_DIR/release"
    cp -f "$out/tally" "$out/libnccl_net_tally.so" "$TARGET_DIR/release/"
    # NCCL looks for libnccl-net-<name>.so; cargo names cdylibs with underscores.
    ln -sf libnccl_net_tally.so "$TARGET_DIR/release/libnccl-net-tally.so"
fi
