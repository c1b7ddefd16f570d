#!/usr/bin/env bash
# Builds a libfabric release from source with only the providers tally uses
# off EFA (tcp, ofi_rxm, shm) and installs it under /opt/libfabric-VERSION,
# beside the distribution's (Debian 12 ships 1.17). tally's binaries built
# against the distribution's headers run on it unchanged (libfabric keeps
# its ABI), so one build can be compared on both:
#
#   scripts/build/libfabric.sh 1.22.0
#   LD_LIBRARY_PATH=/opt/libfabric-1.22/lib tally server ...
#
# Why: libfabric 1.17's tcp provider walks (and locks) every connection of
# an endpoint on every completion-queue read; 1.18 and later poll only the
# sockets epoll reports ready. With a thousand ranks per lcore that walk is
# a third of the lcore's time (docs/measurements.md, "Many ranks").
#
# LIBFABRIC_SRC=DIR uses a checkout instead of cloning from GitHub.
set -euo pipefail
VERSION="${1:-1.22.0}"
SHORT="${VERSION%.*}"
PREFIX="${2:-/opt/libfabric-$SHORT}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for tool in autoreconf libtoolize make gcc; do
    command -v "$tool" >/dev/null || { echo "build-libfabric: needs autoconf, automake, libtool, make and gcc (apt-get install autoconf automake libtool build-essential)" >&2; exit 1; }
done
if [ -n "${LIBFABRIC_SRC:-}" ]; then
    git -C "$LIBFABRIC_SRC" archive "v$VERSION" | tar -x -C "$work"
else
    git clone -q --depth 1 --branch "v$VERSION" https://github.com/ofiwg/libfabric "$work"
fi
cd "$work"
./autogen.sh >autogen.log 2>&1 || { tail -20 autogen.log >&2; exit 1; }
off=""
for p in efa verbs psm2 psm3 sockets usnic udp mrail rxd sm2 ucx perf trace profile hook_debug hook_hmem dmabuf_peer_mem opx cxi lpp lnx; do
    off="$off --disable-$p"
done
# shellcheck disable=SC2086
./configure --prefix="$PREFIX" --enable-tcp=yes --enable-rxm=yes --enable-shm=yes $off >configure.log 2>&1 \
    || { tail -20 configure.log >&2; exit 1; }
make -j"$(nproc)" >make.log 2>&1 || { tail -20 make.log >&2; exit 1; }
make install >/dev/null
echo "libfabric $VERSION in $PREFIX, providers: $(LD_LIBRARY_PATH=$PREFIX/lib "$PREFIX/bin/fi_info" -l | awk -F: '/:$/ {printf "%s ", $1}')"
