#!/usr/bin/env bash
# Packs what a bare many-core host (the GPU device image: no toolchain, no
# network, no iproute2, no libfabric) needs to run tally's benchmarks, into
# devlib/ (git-ignored; carry it with the device tool):
#   devlib/lib/       libfabric and the libraries it loads, as real files
#   devlib/iproute/   Debian's iproute2 (ip, tc, ss), nftables (nft: `bench cluster --loss`)
#                     and their libraries, unpacked with dpkg -x
#                     (`tally bench cluster --iproute devlib/iproute`)
#   devlib/bin/       tally and the plugin, debug info stripped (symbols kept,
#                     so perf still names functions)
#   devlib/libfabric-X.Y/  other libfabric builds found under /opt
#                     (scripts/build/libfabric.sh), for side-by-side runs
#   devlib/perf.tar.xz  this host's perf and its libraries (the session's
#                     `profile` part unpacks it), when perf is installed here
# Run it here after `make build`; then on the host:
#   LD_LIBRARY_PATH=$PWD/devlib/lib TALLY_IPROUTE=$PWD/devlib/iproute scripts/device/session.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
TALLY=target/release/tally
[ -x "$TALLY" ] || { echo "pack.sh: build first (make)" >&2; exit 1; }
rm -rf devlib
mkdir -p devlib/lib devlib/iproute devlib/debs
# libfabric and its run-time dependencies, minus the C runtime every host has.
ldd "$TALLY" target/release/libnccl_net_tally.so | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so*|libm.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) continue ;;
    esac
    cp -L "$lib" devlib/lib/
done
# libfabric's providers load verbs providers at run time; none are needed for shm/tcp.
# iproute2 from Debian's packages (the same way a host without apt access would get it).
# ss (links.py's view of a receiving socket) needs the selinux, tirpc and kerberos libraries too;
# nft (bench cluster --loss: the device's kernel has nf_tables but the image no nft) libnftables and
# what `ldd nft` lists besides the libraries iproute2 brings.
pkgs=(iproute2 libbpf1 libelf1 libmnl0 libxtables12 libcap2 libbsd0 libmd0 zlib1g
    libselinux1 libpcre2-8-0 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1
    nftables libnftables1 libnftnl11 libjansson4 libedit2 libgmp10 libtinfo6)
(cd devlib/debs && apt-get download "${pkgs[@]}" >/dev/null)
for d in devlib/debs/*.deb; do dpkg -x "$d" devlib/iproute/x; done
mkdir -p devlib/iproute/sbin devlib/iproute/lib
cp -L devlib/iproute/x/usr/bin/ip devlib/iproute/x/usr/sbin/tc devlib/iproute/x/usr/bin/ss devlib/iproute/sbin/ 2>/dev/null \
    || cp -L devlib/iproute/x/bin/ip devlib/iproute/x/sbin/tc devlib/iproute/x/bin/ss devlib/iproute/sbin/
cp -L devlib/iproute/x/usr/sbin/nft devlib/iproute/sbin/
# Libraries as real files (symlinks do not travel to the device).
find devlib/iproute/x -name '*.so*' \( -type f -o -type l \) | while read -r f; do cp -L "$f" devlib/iproute/lib/"$(basename "$f")"; done
rm -rf devlib/iproute/x devlib/debs
# The binaries, small enough to carry (the device tool takes 64 MiB in all).
mkdir -p devlib/bin
for f in "$TALLY" target/release/libnccl_net_tally.so; do
    strip --strip-debug -o "devlib/bin/$(basename "$f")" "$f"
done
# Other libfabric builds (scripts/build/libfabric.sh installs them under
# /opt/libfabric-VERSION): one folder each, for the session's RS_LIBS.
for d in /opt/libfabric-*/lib; do
    [ -f "$d/libfabric.so.1" ] || continue
    v=$(basename "$(dirname "$d")")
    mkdir -p "devlib/$v"
    cp -L "$d/libfabric.so.1" "devlib/$v/"
done
# perf, for profiles on hosts that have none. Compressed: libpython and
# libperl alone are 11 MiB.
if command -v perf >/dev/null; then
    p=$(mktemp -d)
    mkdir -p "$p/perf/lib"
    cp -L "$(command -v perf)" "$p/perf/perf"
    ldd "$(command -v perf)" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) continue ;;
        esac
        cp -L "$lib" "$p/perf/lib/"
    done
    tar -C "$p" -cJf devlib/perf.tar.xz perf
    rm -rf "$p"
fi
du -sh devlib devlib/lib devlib/iproute
