# Sourced, not run: what the aarch64 (Graviton) scripts share.
#   test-aarch64.sh      the reduction kernels under qemu-user (test-aarch64-e2e.sh builds them)
#   test-aarch64-e2e.sh  tally, the plugin and its harness under qemu-user
#   dist.sh              the aarch64 tarball, started under qemu-user
#
# aarch64_toolchain: the Rust target, the cross gcc and libc, qemu-user.
# aarch64_sysroot DIR: Debian's arm64 libfabric and what it loads, unpacked
#   into DIR/root (never installed: an arm64 multiarch libc6 beside the cross
#   toolchain's makes the emulated loader mix two glibc builds, and the first
#   pthread_create hangs). The .debs and apt's arm64 lists stay in DIR, so a
#   rerun downloads nothing.
# aarch64_env DIR: pkg-config for the cross build (the arm64 libfabric.pc,
#   its paths under DIR/root) and AARCH64_RUN, the qemu-aarch64 command line
#   that starts an aarch64 binary with the cross libc and that libfabric.
#
# aarch64_begin WHAT DIR: with TALLY_SKIP_AARCH64=1, say WHAT was not tested
#   and exit 0; else cd to the checkout (ROOT) and build in DIR unless
#   CARGO_TARGET_DIR says otherwise.
#
# fail MESSAGE: says "$AARCH64_WHO: FAILED: MESSAGE" and exits 1, unless the
# caller defined its own fail() before sourcing.

AARCH64_TARGET=aarch64-unknown-linux-gnu
# libfabric1 and its arm64 dependencies, without libc6 and libatomic1, which
# the cross toolchain brings (/usr/aarch64-linux-gnu/lib).
AARCH64_DEBS=(libfabric1 libfabric-dev libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200 ibverbs-providers)

declare -F fail >/dev/null || fail() {
    echo "${AARCH64_WHO:-aarch64}: FAILED: $*" >&2
    exit 1
}

aarch64_begin() {
    if [[ "${TALLY_SKIP_AARCH64:-}" == "1" ]]; then
        echo "WARNING: TALLY_SKIP_AARCH64=1: $1 NOT tested" >&2
        exit 0
    fi
    cd "$ROOT"
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$2}"
}

aarch64_toolchain() {
    if ! rustup target list --installed 2>/dev/null | grep -qx "$AARCH64_TARGET"; then
        echo "aarch64: installing the Rust target $AARCH64_TARGET"
        rustup target add "$AARCH64_TARGET" >/dev/null ||
            fail "cannot install the Rust target $AARCH64_TARGET (rustup target add failed; offline?)"
    fi
    local missing=() pkg
    for pkg in gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        echo "aarch64: installing ${missing[*]}"
        local sudo=""
        [[ $(id -u) -eq 0 ]] || sudo=sudo
        { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"; } >/dev/null ||
            fail "cannot install ${missing[*]} with apt-get"
    fi
    command -v qemu-aarch64 >/dev/null || fail "qemu-aarch64 not found after installing qemu-user"
    command -v aarch64-linux-gnu-gcc >/dev/null || fail "aarch64-linux-gnu-gcc not found"
}

aarch64_sysroot() {
    local dir="$1"
    local want="${AARCH64_DEBS[*]}"
    if [[ -f "$dir/root/.debs" && "$(cat "$dir/root/.debs")" == "$want" ]]; then
        return 0
    fi
    echo "aarch64: downloading Debian's arm64 ${AARCH64_DEBS[*]} into $dir"
    # apt with private state: arm64 package lists of this host's sources,
    # read by this apt-get only; dpkg's architectures stay as they are.
    mkdir -p "$dir/apt/lists/partial" "$dir/apt/archives/partial" "$dir/debs"
    : >"$dir/apt/status"
    local apt=(-o "Dir::State=$dir/apt" -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::State::status=$dir/apt/status"
        -o "Dir::Cache=$dir/apt" -o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o Debug::NoLocking=1
        -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false -o APT::Sandbox::User=root)
    apt-get -qq "${apt[@]}" update >/dev/null || fail "apt-get update of the arm64 lists failed (network to the Debian mirror?)"
    rm -f "$dir/debs/"*.deb
    (cd "$dir/debs" && apt-get -qq "${apt[@]}" download "${AARCH64_DEBS[@]}" >/dev/null) ||
        fail "apt-get download ${AARCH64_DEBS[*]} (arm64) failed"
    rm -rf "$dir/root.new"
    local deb
    for deb in "$dir/debs/"*.deb; do
        dpkg-deb -x "$deb" "$dir/root.new" || fail "cannot unpack $deb"
    done
    echo "$want" >"$dir/root.new/.debs"
    rm -rf "$dir/root"
    mv "$dir/root.new" "$dir/root"
}

aarch64_env() {
    local root="$1/root"
    local lib="$root/usr/lib/aarch64-linux-gnu"
    [[ -f "$lib/pkgconfig/libfabric.pc" ]] || fail "no arm64 libfabric.pc under $lib (aarch64_sysroot not run?)"
    # pkg-config reads the _<target> forms for the cross build only, so the
    # host's build scripts still see the host's libraries. The .pc says
    # /usr; the sysroot puts its paths under DIR/root, headers included
    # (bindgen then reads the arm64 package's own libfabric headers).
    export PKG_CONFIG_ALLOW_CROSS=1
    export PKG_CONFIG_LIBDIR_aarch64_unknown_linux_gnu="$lib/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR_aarch64_unknown_linux_gnu="$root"
    # The cross toolchain's loader and libc (one glibc build), then the
    # unpacked libraries; libnl-3 sits under lib/, the rest under usr/lib/.
    AARCH64_LIBS="/usr/aarch64-linux-gnu/lib:$lib:$root/lib/aarch64-linux-gnu"
    AARCH64_RUN=(qemu-aarch64 -L /usr/aarch64-linux-gnu -E "LD_LIBRARY_PATH=$AARCH64_LIBS")
    export AARCH64_LIBS
}
