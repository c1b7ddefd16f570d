#!/usr/bin/env bash
# Installs the Python tools the build and the tests run, from PyPI, if
# missing: cargo-zigbuild and zig (PyPI: ziglang), with which
# scripts/build/release.sh links the shipped binaries against glibc 2.28, and
# kubernetes-validate, which checks config/k8s/ against the Kubernetes API's
# JSON schemas (bundled in the package, so the check runs offline).
#
# They go into a virtual environment of their own, target/py-tools (Debian's
# python3 refuses pip installs into the system, PEP 668); tools/tests/manifests/
# runs them from there. Idempotent: with the pinned versions present it only
# checks. Needs python3 with venv (Debian: python3-venv, which scripts/build/deps.sh
# installs).
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=target/py-tools
# Pinned: a new release bundles other Kubernetes versions' schemas.
TOOLS=(kubernetes-validate==1.37.0 ziglang==0.17.1 cargo-zigbuild==0.24.1)

have() {
    [[ -x "$VENV/bin/pip" ]] || return 1
    local t
    for t in "${TOOLS[@]}"; do
        [[ "$("$VENV/bin/pip" show "${t%%==*}" 2>/dev/null | sed -n 's/^Version: //p')" == "${t##*==}" ]] || return 1
    done
}

if have; then
    echo "deps: python tools present in $VENV (${TOOLS[*]})"
    exit 0
fi

if ! python3 -m venv --help >/dev/null 2>&1; then
    echo "deps: python3 with venv is missing (Debian: apt-get install python3-venv); needed for ${TOOLS[*]}" >&2
    exit 1
fi
[[ -x "$VENV/bin/pip" ]] || python3 -m venv "$VENV"
echo "deps: installing ${TOOLS[*]} into $VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "${TOOLS[@]}"
have || { echo "deps: ${TOOLS[*]} did not install into $VENV" >&2; exit 1; }
echo "deps: installed ${TOOLS[*]}"
