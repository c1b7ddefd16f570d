#!/usr/bin/env bash
# Release tarballs for x86-64 and aarch64 (Graviton), and a check that the
# aarch64 build is sound: its loopback fabric tests run under qemu-user.
#
#   make dist                           (installs what is missing, as root)
#   scripts/build/dist.sh
#   TALLY_DIST_SKIP_TESTS=1 scripts/build/dist.sh    tarballs only
#
# Both architectures' binaries need at most glibc 2.28 (scripts/build/release.sh).
#
# Output: dist/tally-<version>-<arch>.tar.gz, each holding
#   tally-<version>-<arch>/bin/tally
#   tally-<version>-<arch>/lib/libnccl-net-tally.so
#   tally-<version>-<arch>/config/...
#   tally-<version>-<arch>/share/doc/tally/README.md, nccl.md
#
# Cross-building: the engine links libfabric, so the aarch64 build needs
# Debian's arm64 libfabric (multiarch: libfabric-dev:arm64, libibverbs-dev:arm64,
# co-installable with the amd64 ones), found through pkg-config's per-target
# variables so that the host's build scripts still see the host's libraries.
# bindgen is told the target through BINDGEN_EXTRA_CLANG_ARGS_<target>.
# Under qemu the emulated process loads the arm64 multiarch glibc, libfabric
# and rdma-core from /usr/lib/aarch64-linux-gnu (qemu -L /), nothing of the host's.
# Emulated timings mean nothing; passing tests mean the Graviton build is sound.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
CARGO="${CARGO:-cargo}"
DIST="$ROOT/dist"
CROSS=aarch64-unknown-linux-gnu
CROSS_LIBDIR=/usr/lib/aarch64-linux-gnu
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version *= *"\(.*\)"/\1/p' Cargo.toml)"
HOST_ARCH="$(uname -m)"
[[ -n "$VERSION" ]] || { echo "dist: no [workspace.package] version in Cargo.toml" >&2; exit 1; }

log() { echo "dist: $*"; }
fail() {
    echo "dist: FAILED: $*" >&2
    exit 1
}

SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO=sudo

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# The cross toolchain, qemu, and the arm64 libraries the engine links.
cross_prerequisites() {
    if ! rustup target list --installed 2>/dev/null | grep -qx "$CROSS"; then
        log "installing the Rust target $CROSS"
        rustup target add "$CROSS" >/dev/null || fail "rustup target add $CROSS failed (offline?)"
    fi
    local missing=()
    for p in gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user; do
        installed "$p" || missing+=("$p")
    done
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        log "enabling the arm64 architecture for multiarch packages"
        $SUDO dpkg --add-architecture arm64
        missing+=(libfabric-dev:arm64 libibverbs-dev:arm64)
    else
        for p in libfabric-dev:arm64 libibverbs-dev:arm64; do
            installed "$p" || missing+=("$p")
        done
    fi
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        $SUDO apt-get update -qq
        # Multiarch packages must sit beside the host's, never replace them.
        if $SUDO apt-get install -s -y "${missing[@]}" 2>/dev/null | grep -q '^Remv'; then
            fail "installing ${missing[*]} would remove packages; install them by hand"
        fi
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null ||
            fail "apt-get install ${missing[*]} failed"
    fi
    command -v aarch64-linux-gnu-gcc >/dev/null || fail "aarch64-linux-gnu-gcc not found"
    command -v qemu-aarch64 >/dev/null || fail "qemu-aarch64 not found"
    [[ -f "$CROSS_LIBDIR/pkgconfig/libfabric.pc" ]] || fail "no arm64 libfabric.pc in $CROSS_LIBDIR/pkgconfig"
}

# Environment for building and running the aarch64 target.
cross_env() {
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
    # pkg-config reads the _<target> forms for the cross build only.
    export PKG_CONFIG_ALLOW_CROSS=1
    export PKG_CONFIG_LIBDIR_aarch64_unknown_linux_gnu="$CROSS_LIBDIR/pkgconfig:/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR_aarch64_unknown_linux_gnu=/
    # bindgen's clang: the target's ABI, the cross libc's headers, and
    # /usr/include for the (architecture-independent) libfabric headers.
    export BINDGEN_EXTRA_CLANG_ARGS_aarch64_unknown_linux_gnu="--target=aarch64-linux-gnu -I/usr/aarch64-linux-gnu/include -I/usr/include"
    # The emulated process takes its loader and every library from the arm64
    # multiarch tree (libc6:arm64 came with libfabric1:arm64): `-L /`. Mixing
    # the cross toolchain's loader (-L /usr/aarch64-linux-gnu) with the
    # multiarch libc that an LD_LIBRARY_PATH for libfabric drags in hangs the
    # first pthread_create: ld.so and libc.so must come from one glibc build.
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /"
    [[ -e /lib/ld-linux-aarch64.so.1 ]] || fail "no arm64 loader /lib/ld-linux-aarch64.so.1 (libc6:arm64 missing)"
}

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
summary+=("$HOST_ARCH   $(basename "$tarball") ($(du -h "$tarball" | cut -f1)); bin/tally: $(describe "$native_out/tally")")

# 2. The aarch64 cross build, and its fabric tests under qemu.
if [[ "$HOST_ARCH" == "x86_64" ]]; then
    cross_prerequisites
    cross_env
    log "building $CROSS release binaries and the plugin (glibc floor 2.28)"
    # zig links the shipped binaries (its own aarch64 linker and glibc 2.28
    # stubs); the cross gcc stays for the test binaries run under qemu below.
    env -u CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER -u CC_aarch64_unknown_linux_gnu -u AR_aarch64_unknown_linux_gnu \
        scripts/build/release.sh "$CROSS"
    cross_out="$CARGO_TARGET_DIR/$CROSS/release"
    tarball="$(pack aarch64 "$cross_out")"
    summary+=("aarch64  $(basename "$tarball") ($(du -h "$tarball" | cut -f1)); bin/tally: $(describe "$cross_out/tally")")

    if [[ "${TALLY_DIST_SKIP_TESTS:-}" == "1" ]]; then
        summary+=("aarch64 fabric tests: SKIPPED (TALLY_DIST_SKIP_TESTS=1)")
    else
        log "running the aarch64 loopback fabric tests under qemu (slow; timings meaningless)"
        testlog="$(mktemp)"
        set +e
        # Bounded: a hang under emulation must end as a failure, not a stuck build.
        timeout "${TALLY_DIST_TEST_TIMEOUT_S:-1200}" \
            $CARGO test --release --target "$CROSS" -p tally-engine --test fabric -- --test-threads=1 2>&1 | tee "$testlog"
        test_status=${PIPESTATUS[0]}
        set -e
        ((test_status != 124)) || summary+=("aarch64 fabric tests: TIMED OUT under qemu")
        results="$(grep -E '^test [a-z0-9_]+ \.\.\. ' "$testlog" || true)"
        rm -f "$testlog"
        [[ -n "$results" ]] || fail "the aarch64 fabric tests did not run (build or runner failure above)"
        while read -r _ name _ result; do
            summary+=("aarch64 under qemu: $name ... $result")
        done <<<"$results"
        # tcp;ofi_rxm is what the release needs; shm relies on cross-process
        # memory access (CMA), which emulation may not give: reported, not fatal.
        tcp_bad="$(grep -E '^test tcp_[a-z0-9_]+ \.\.\. ' <<<"$results" | grep -vc ' ok$' || true)"
        tcp_ok="$(grep -cE '^test tcp_[a-z0-9_]+ \.\.\. ok$' <<<"$results" || true)"
        other_bad="$(grep -vE '^test tcp_' <<<"$results" | grep -vc ' ok$' || true)"
        if ((tcp_ok == 0 || tcp_bad > 0)); then
            summary+=("aarch64 tcp;ofi_rxm: FAILED ($tcp_ok passed, $tcp_bad failed): the Graviton build is not sound")
            status=1
        else
            summary+=("aarch64 tcp;ofi_rxm: ok ($tcp_ok tests)")
        fi
        if ((other_bad > 0)); then
            summary+=("aarch64 other fabric tests: $other_bad failed under qemu (shm needs cross-process memory access; check on real Graviton)")
        elif ((test_status == 0)); then
            summary+=("aarch64 fabric tests: all passed under qemu")
        fi
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
