#!/usr/bin/env bash
# Makes the runtime base image from Debian packages, for hosts that reach
# Debian's mirrors but no image registry (Docker Hub): mmdebstrap builds a
# bookworm minbase root (what debian:bookworm-slim is: apt, dash, mawk, no
# docs/man/locales) and the container engine imports it.
#
#   scripts/build/image-local-base.sh                   -> localhost/debian:bookworm-slim
#   make image BINARIES=prebuilt BASE=localhost/debian:bookworm-slim
#
# Variables: BASE_IMAGE (the name to create), MIRROR (default
# http://deb.debian.org/debian), ENGINE (docker, podman or buildah; default:
# the first that works), WORKDIR (where the root tarball is made; default
# /var/tmp/tally-image, kept out of the repository). As root (mmdebstrap
# --mode=root; apt-get install mmdebstrap if missing).
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-localhost/debian:bookworm-slim}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
WORKDIR="${WORKDIR:-/var/tmp/tally-image}"

log() { echo "image-local-base: $*"; }
fail() {
    echo "image-local-base: FAILED: $*" >&2
    exit 1
}

[[ $(id -u) -eq 0 ]] || fail "run as root (mmdebstrap --mode=root, image import)"
if ! command -v mmdebstrap >/dev/null; then
    log "installing mmdebstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null ||
        fail "apt-get install mmdebstrap failed"
fi

ENGINE="${ENGINE:-}"
if [[ -z "$ENGINE" ]]; then
    for e in docker podman buildah; do
        command -v "$e" >/dev/null && "$e" info >/dev/null 2>&1 && { ENGINE="$e"; break; }
    done
    [[ -n "$ENGINE" ]] || fail "no working container engine (docker with a daemon, podman or buildah): apt-get install -y podman"
fi

mkdir -p "$WORKDIR"
tarball="$WORKDIR/bookworm-minbase.tar"
log "mmdebstrap bookworm minbase from $MIRROR -> $tarball"
# The dpkg excludes and apt options stay in the image (/etc/dpkg/dpkg.cfg.d,
# /etc/apt/apt.conf.d), so packages installed on top of it leave their docs
# out too and apt writes no binary caches (pkgcache.bin), as in debian:*-slim.
# merged-usr hook: /usr merged by mmdebstrap itself, so the usrmerge package
# (and the perl it pulls in) stays out, as in the official images.
mmdebstrap --variant=minbase --mode=root --quiet \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='Acquire::Languages "none"' \
    --aptopt='APT::Install-Recommends "false"' \
    --aptopt='Dir::Cache::pkgcache ""' \
    --aptopt='Dir::Cache::srcpkgcache ""' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$tarball" \
    "deb $MIRROR bookworm main" \
    "deb $MIRROR bookworm-updates main" \
    "deb ${MIRROR%/debian}/debian-security bookworm-security main"
log "root tarball: $(du -h "$tarball" | cut -f1)"

case "$ENGINE" in
    docker | podman)
        "$ENGINE" import --change 'CMD ["bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
        ;;
    buildah)
        c="$(buildah from scratch)"
        buildah add "$c" "$tarball" / >/dev/null
        buildah config --cmd bash "$c"
        buildah commit --rm "$c" "$BASE_IMAGE" >/dev/null
        ;;
    *) fail "ENGINE=$ENGINE: docker, podman or buildah" ;;
esac
rm -f "$tarball"
log "$ENGINE: $BASE_IMAGE imported"
"$ENGINE" images "$BASE_IMAGE"
