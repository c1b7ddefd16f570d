#!/usr/bin/env bash
# Release tarballs for x86-64 and aarch64 (Graviton), and a check that the
# aarch64 tarball's own `tally demo --cluster off` runs under qemu-user (the
# aarch64 code's tests are make test's: scripts/build/test-aarch64-e2e.sh).
#
#   make dist                           (installs what is missing, as root)
#   scripts/build/dist.sh
#   TALLY_DIST_SKIP_TESTS=1 scripts/build/dist.sh    tarballs only (no demo under qemu)
#
# Both architectures' binaries need at most glibc 2.28 (scripts/build/release.sh).
#
# Output: dist/tally_nccl-<version>-py3-none-manylinux_2_28_<arch>.whl (the
# wheel of scripts/build/wheel.sh, for pip) and dist/tally-<version>-<arch>.tar.gz, each holding
#   tally-<version>-<arch>/bin/tally
#   tally-<version>-<arch>/lib/libnccl-net-tally.so
#   tally-<version>-<arch>/config/...
#   tally-<version>-<arch>/share/doc/tally/README.md, nccl.md
#
# Cross-building: the engine links libfabric, so the aarch64 build needs an
# arm64 libfabric: Debian's packages, downloaded and unpacked into
# target-aarch64/ (never installed: scripts/build/aarch64-lib.sh says why),
# found through pkg-config's per-target variables so that the host's build
# scripts still see the host's libraries. Under qemu the emulated process
# loads the cross toolchain's glibc and that libfabric.
# Emulated timings mean nothing; passing tests mean the Graviton build is sound.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
CARGO="${CARGO:-cargo}"
DIST="$ROOT/dist"
CROSS=aarch64-unknown-linux-gnu
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version *= *"\(.*\)"/\1/p' Cargo.toml)"
HOST_ARCH="$(uname -m)"
[[ -n "$VERSION" ]] || { echo "dist: no [workspace.package] version in Cargo.toml" >&2; exit 1; }

log() { echo "dist: $*"; }
fail() {
    echo "dist: FAILED: $*" >&2
    exit 1
}

# shellcheck source=scripts/build/aarch64-lib.sh
source "$ROOT/scripts/build/aarch64-lib.sh"

# pack ARCH OUTDIR: the tarball for one architecture.
pack() {
    local arch="$1" out="$2"
    local name="tally-$VERSION-$arch"
    local stage
    stage="$(mktemp -d)"
    mkdir -p "$stage/$name/bin" "$stage/$name/lib"
    install -m 755 "$out/tally" "$stage/$name/bin/tally"
    install -m 755 "$out/libnccl_net_tally.so" "$stage/$name/lib/libnccl-net-tally.so"
    cp -r "$ROOT/config" "$stage/$name/config"
    # The guide and the README, where config/tally-server.service's Documentation= points once installed.
    install -D -m 644 -t "$stage/$name/share/doc/tally" "$ROOT/README.md" "$ROOT/docs/nccl.md"
    mkdir -p "$DIST"
    tar -C "$stage" -czf "$DIST/$name.tar.gz" "$name"
    rm -rf "$stage"
    echo "$DIST/$name.tar.gz"
}

describe() {
    file -b "$1" 2>/dev/null | cut -d, -f1-2 || echo "?"
}

summary=()
status=0

# 1. The native build (x86-64 here; aarch64 when run on Graviton itself),
# linked against glibc 2.28 (scripts/build/release.sh says how and checks it).
log "building $HOST_ARCH release binaries and the plugin (glibc floor 2.28)"
scripts/build/release.sh
native_out="$CARGO_TARGET_DIR/$HOST_ARCH-unknown-linux-gnu/release"
tarball="$(pack "$HOST_ARCH" "$native_out")"
wheel="$(WHEEL_BIN="$native_out" scripts/build/wheel.sh)"
cp "$wheel" "$DIST/"
summary+=("$HOST_ARCH   $(basename "$wheel") (pip install)")
summary+=("$HOST_ARCH   $(basename "$tarball") ($(du -h "$tarball" | cut -f1)); bin/tally: $(describe "$native_out/tally")")

# 2. The aarch64 cross build, and its tarball's demo under qemu.
if [[ "$HOST_ARCH" == "x86_64" ]]; then
    aarch64_toolchain
    aarch64_sysroot "$ROOT/target-aarch64"
    aarch64_env "$ROOT/target-aarch64"
    # Every aarch64 process under qemu-user, the ranks tally starts too.
    export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu QEMU_SET_ENV="LD_LIBRARY_PATH=$AARCH64_LIBS"
    export TALLY_EXEC_WRAPPER=qemu-aarch64 CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64
    log "building $CROSS release binaries and the plugin (glibc floor 2.28)"
    # zig links the shipped binaries (its own aarch64 linker and glibc 2.28
    # stubs), and the test binaries run under qemu below.
    scripts/build/release.sh "$CROSS"
    cross_out="$CARGO_TARGET_DIR/$CROSS/release"
    tarball="$(pack aarch64 "$cross_out")"
    wheel="$(WHEEL_BIN="$cross_out" scripts/build/wheel.sh "$CROSS")"
    cp "$wheel" "$DIST/"
    summary+=("aarch64  $(basename "$wheel") (pip install)")
    summary+=("aarch64  $(basename "$tarball") ($(du -h "$tarball" | cut -f1)); bin/tally: $(describe "$cross_out/tally")")

    if [[ "${TALLY_DIST_SKIP_TESTS:-}" == "1" ]]; then
        summary+=("aarch64 tarball's demo under qemu: SKIPPED (TALLY_DIST_SKIP_TESTS=1)")
    else
        # The aarch64 code's tests under qemu are make test's (test-aarch64-e2e.sh:
        # a server, ranks, failover and the plugin's harness, the ci profile);
        # what is the tarball's alone is that its own binary starts and serves.
        # The tarball itself, unpacked, as a user would start it.
        log "running the aarch64 tarball's tally demo --cluster off under qemu"
        unpacked="$(mktemp -d)"
        tar -C "$unpacked" -xzf "$tarball"
        demo_bin="$unpacked/tally-$VERSION-aarch64/bin/tally"
        set +e
        timeout "${TALLY_DIST_TEST_TIMEOUT_S:-1200}" qemu-aarch64 "$demo_bin" demo --cluster off --json --out "$unpacked/demo" \
            >"$unpacked/demo.json" 2>"$unpacked/demo.err"
        demo_status=$?
        set -e
        demo_wrong="$(python3 -c 'import json,sys; print(sum(r["wrong"] for r in json.load(open(sys.argv[1]))["results"]))' "$unpacked/demo.json" 2>/dev/null || echo "?")"
        if ((demo_status == 0)) && [[ "$demo_wrong" == 0 ]]; then
            summary+=("aarch64 tarball: tally demo --cluster off under qemu: 0 wrong")
        else
            tail -20 "$unpacked/demo.err" >&2
            summary+=("aarch64 tarball: tally demo --cluster off under qemu FAILED (status $demo_status, wrong $demo_wrong)")
            status=1
        fi
        rm -rf "$unpacked"
    fi
else
    summary+=("cross build: skipped on a $HOST_ARCH host (the native tarball is the $HOST_ARCH one)")
fi

echo
echo "==== tally $VERSION dist summary ===="
for line in "${summary[@]}"; do
    echo "  $line"
done
if ((status == 0)); then
    echo "dist: ok"
else
    echo "dist: FAILED" >&2
fi
exit "$status"
