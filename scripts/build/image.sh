#!/usr/bin/env bash
# Builds the tally server image (docker/Dockerfile) with whichever container
# engine works here: docker (its daemon must answer), podman, or buildah.
#
#   make image                                   this host's architecture
#   make image PLATFORMS=linux/amd64,linux/arm64 PUSH=1
#   make image BINARIES=prebuilt BASE=localhost/debian:bookworm-slim
#
# Variables (from make or the environment):
#   IMAGE      name:tag (default registry.example.com/tally:<workspace version>,
#              the name config/k8s/tally-server.yaml runs)
#   ENGINE     docker, podman or buildah: skip the detection
#   PLATFORMS  comma-separated (linux/amd64,linux/arm64); empty: this host's.
#              Several platforms make a manifest list: docker buildx needs PUSH=1
#              (or a containerd image store), podman/buildah keep it locally as
#              a manifest. A foreign platform's RUN steps in the runtime stage
#              need qemu-user binfmt (apt-get install qemu-user-static).
#   PUSH=1     push IMAGE after building
#   BINARIES   build (default: compile in RUST_IMAGE) or prebuilt (binaries
#              built on this host: target/release, and for arm64
#              target/aarch64-unknown-linux-gnu/release from `make dist`;
#              PREBUILT_DIR overrides the target directory)
#   BASE       runtime base image (default debian:bookworm-slim)
#   RUST_IMAGE build stage image (default rust:1-bookworm)
#   EFA_INSTALLER  AWS EFA installer version to put in the image (docker/Dockerfile)
#   BUILD_NETWORK  network of RUN steps, e.g. host (default: the engine's)
#   CARGO_FLAGS    more `cargo build` flags in the build stage (e.g. --offline)
#   BUILD_FLAGS    more flags for the engine's build command, word-split
#                  (e.g. --volume $HOME/.cargo/registry:/usr/local/cargo/registry)
#   SMOKE=0    skip the check run of the built image (--version, server --check)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version *= *"\(.*\)"/\1/p' Cargo.toml)"
IMAGE="${IMAGE:-registry.example.com/tally:$VERSION}"
BINARIES="${BINARIES:-build}"
PLATFORMS="${PLATFORMS:-}"
PUSH="${PUSH:-0}"
SMOKE="${SMOKE:-1}"

log() { echo "image: $*"; }
fail() {
    echo "image: FAILED: $*" >&2
    exit 1
}

# --- the engine -------------------------------------------------------------
works() {
    case "$1" in
        docker) docker info >/dev/null 2>&1 ;;
        podman) podman info >/dev/null 2>&1 ;;
        buildah) buildah info >/dev/null 2>&1 ;;
    esac
}

ENGINE="${ENGINE:-}"
if [[ -n "$ENGINE" ]]; then
    command -v "$ENGINE" >/dev/null || fail "ENGINE=$ENGINE: not found on PATH"
    works "$ENGINE" || fail "ENGINE=$ENGINE does not work here ('$ENGINE info' fails)"
else
    tried=()
    for e in docker podman buildah; do
        if ! command -v "$e" >/dev/null; then
            tried+=("$e: not installed")
        elif ! works "$e"; then
            if [[ "$e" == docker ]]; then
                tried+=("docker: installed but 'docker info' fails (no daemon reachable?)")
            else
                tried+=("$e: installed but '$e info' fails")
            fi
        else
            ENGINE="$e"
            break
        fi
    done
    if [[ -z "$ENGINE" ]]; then
        echo "image: no working container engine. Tried:" >&2
        printf '  %s\n' "${tried[@]}" >&2
        echo "  Install one (Debian/Ubuntu: apt-get install -y podman), or start the docker daemon," >&2
        echo "  or name one with ENGINE=docker|podman|buildah." >&2
        exit 1
    fi
    for t in "${tried[@]}"; do log "skipped $t"; done
fi
log "using $ENGINE ($("$ENGINE" --version 2>/dev/null | head -1))"

# --- prebuilt binaries --------------------------------------------------------
stage_prebuilt() {
    local dir="${PREBUILT_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}}"
    local want=("${@}") p arch src
    rm -rf "$ROOT/image-prebuilt"
    # Only for this build: no binaries left in the working tree.
    trap 'rm -rf "$ROOT/image-prebuilt"' EXIT
    for p in "${want[@]}"; do
        arch="${p#linux/}"
        case "$arch" in
            amd64) [[ "$(uname -m)" == x86_64 ]] && src="$dir/release" || src="$dir/x86_64-unknown-linux-gnu/release" ;;
            arm64) [[ "$(uname -m)" == aarch64 ]] && src="$dir/release" || src="$dir/aarch64-unknown-linux-gnu/release" ;;
            *) fail "platform $p: only linux/amd64 and linux/arm64" ;;
        esac
        for f in tally libnccl_net_tally.so; do
            [[ -f "$src/$f" ]] || fail "BINARIES=prebuilt: no $src/$f (make build; for arm64 on x86-64: make dist)"
        done
        mkdir -p "$ROOT/image-prebuilt/$arch"
        install -m 755 "$src/tally" "$ROOT/image-prebuilt/$arch/tally"
        install -m 755 "$src/libnccl_net_tally.so" "$ROOT/image-prebuilt/$arch/libnccl-net-tally.so"
        log "prebuilt $arch: $src/{tally,libnccl_net_tally.so} ($(file -b "$src/tally" 2>/dev/null | cut -d, -f1-2))"
    done
}

native_platform() {
    case "$(uname -m)" in
        x86_64) echo linux/amd64 ;;
        aarch64) echo linux/arm64 ;;
        *) fail "host architecture $(uname -m): give PLATFORMS" ;;
    esac
}

IFS=, read -r -a platforms <<<"${PLATFORMS:-$(native_platform)}"
case "$BINARIES" in
    build) ;;
    prebuilt) stage_prebuilt "${platforms[@]}" ;;
    *) fail "BINARIES=$BINARIES: build or prebuilt" ;;
esac

# --- build ----------------------------------------------------------------------
args=(-f docker/Dockerfile --build-arg "BINARIES=$BINARIES")
[[ -z "${BASE:-}" ]] || args+=(--build-arg "BASE=$BASE")
[[ -z "${RUST_IMAGE:-}" ]] || args+=(--build-arg "RUST_IMAGE=$RUST_IMAGE")
[[ -z "${EFA_INSTALLER:-}" ]] || args+=(--build-arg "EFA_INSTALLER=$EFA_INSTALLER")
[[ -z "${CARGO_FLAGS:-}" ]] || args+=(--build-arg "CARGO_FLAGS=$CARGO_FLAGS")
[[ -z "${BUILD_NETWORK:-}" ]] || args+=(--network "$BUILD_NETWORK")
# shellcheck disable=SC2206 # word-split on purpose
[[ -z "${BUILD_FLAGS:-}" ]] || args+=($BUILD_FLAGS)
multi=0
((${#platforms[@]} == 1)) || multi=1

cmd=()
case "$ENGINE" in
    docker)
        if [[ -n "$PLATFORMS" ]]; then
            docker buildx version >/dev/null 2>&1 || fail "PLATFORMS needs docker buildx (the buildx plugin)"
            cmd=(docker buildx build --platform "$PLATFORMS" -t "$IMAGE")
            if [[ "$PUSH" == 1 ]]; then
                cmd+=(--push)
            elif ((multi)); then
                fail "docker buildx keeps a multi-platform image only in a registry: add PUSH=1"
            else
                cmd+=(--load)
            fi
        else
            cmd=(docker build -t "$IMAGE")
        fi
        ;;
    podman | buildah)
        # An explicit platform, also the native one: buildah then sets
        # TARGETARCH itself. Older buildah (podman 4.3) leaves BUILDPLATFORM
        # unset, which would run the build stage emulated: name it.
        cmd=("$ENGINE" build --platform "${PLATFORMS:-$(native_platform)}" --build-arg "BUILDPLATFORM=$(native_platform)")
        if ((multi)); then
            # --manifest adds to an existing list, and refuses a plain image.
            "$ENGINE" manifest rm "$IMAGE" >/dev/null 2>&1 || "$ENGINE" rmi "$IMAGE" >/dev/null 2>&1 || true
            cmd+=(--manifest "$IMAGE")
        else
            cmd+=(-t "$IMAGE")
        fi
        ;;
esac

log "building $IMAGE (BINARIES=$BINARIES, platforms ${PLATFORMS:-$(native_platform)})"
echo "+ ${cmd[*]} ${args[*]} ."
"${cmd[@]}" "${args[@]}" .

if [[ "$PUSH" == 1 && ( "$ENGINE" != docker || -z "$PLATFORMS" ) ]]; then
    if [[ "$ENGINE" == docker ]]; then
        docker push "$IMAGE"
    elif ((multi)); then
        "$ENGINE" manifest push --all "$IMAGE" "docker://$IMAGE"
    else
        "$ENGINE" push "$IMAGE"
    fi
fi

# --- check the result -------------------------------------------------------------
if ((multi)) || [[ "$ENGINE" == docker && "$PUSH" == 1 && -n "$PLATFORMS" ]]; then
    log "built $IMAGE for $PLATFORMS"
    exit 0
fi
size="$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE" 2>/dev/null || echo)"
[[ -z "$size" ]] || log "$IMAGE: $((size / 1024 / 1024)) MiB"
if [[ "$SMOKE" == 1 && "$ENGINE" != buildah ]]; then
    if [[ -z "$PLATFORMS" || "${platforms[0]}" == "$(native_platform)" ]]; then
        log "check: $ENGINE run --rm $IMAGE --version; server --check --config /etc/tally/server.toml"
        "$ENGINE" run --rm "$IMAGE" --version
        "$ENGINE" run --rm "$IMAGE" server --check --config /etc/tally/server.toml
    fi
fi
if [[ "$ENGINE" == buildah ]]; then
    log "ok: $IMAGE (buildah builds only: run it with podman run --rm --network host $IMAGE)"
else
    log "ok: $IMAGE (run: $ENGINE run --rm --network host $IMAGE)"
fi
