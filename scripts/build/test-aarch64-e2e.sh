#!/usr/bin/env bash
# The aarch64 (Graviton) build end to end under qemu-user: the `tally`
# command and the NCCL plugin, cross-built as `make dist` builds them
# (cargo-zigbuild, glibc 2.28 floor; the `ci` profile: release code without
# thin LTO), against Debian's arm64 libfabric unpacked into target-aarch64/
# (scripts/build/aarch64-lib.sh; nothing arm64 is installed on the host).
#
#   scripts/build/test-aarch64-e2e.sh      (make test-aarch64-e2e; part of make test)
#   scripts/build/test-aarch64-e2e.sh --build-only    the build alone (scripts/build/prebuild.sh)
#   TALLY_SKIP_AARCH64=1 ...              skip (prints a WARNING)
#
# What runs, every process emulated (qemu-aarch64; the ranks too, through
# TALLY_EXEC_WRAPPER):
#   - a server and 4 rank processes, agg and ring, f32 and bf16, over
#     tcp;ofi_rxm and shm (`tally bench allreduce`: every element checked);
#   - CollNet through the aarch64 plugin, as NCCL drives it (`--mode
#     agg-plugin`), over tcp;
#   - failover: two `tally server` processes, 4 ranks striped over both;
#     one server is SIGKILLed once the job runs; the run must finish with
#     every element right, its ranks having recovered on the other server;
#   - the aarch64 wheel (manylinux_2_28_aarch64) packed from this build,
#     installed by pip for that platform, its tally and plugin run;
#   - the plugin's ncclNet harness (ffi-plugin/tests: abi, net_tcp, net_shm)
#     cross-built and run against the aarch64 .so (net_shm runs shm without
#     cross-memory attach, which qemu-user does not give; see below).
# Sizes are small and loops short: emulation is 10-50x slower, and its
# timings mean nothing; only correctness is checked. Prints
#   aarch64 end to end: N all-reduces (agg, ring; tcp, shm; f32, bf16), 1 failover, 0 wrong
# and exits non-zero on any wrong element or failed step.
set -euo pipefail
BUILD_ONLY=0
[[ "${1:-}" != "--build-only" ]] || BUILD_ONLY=1

AARCH64_WHO="aarch64 end to end"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/build/aarch64-lib.sh
source "$ROOT/scripts/build/aarch64-lib.sh"
# A target directory of its own: a cross build also locks the host profile's
# directory (target/ci), which `cargo test` holds while the x86 suites run,
# and this builds beside them (scripts/build/prebuild.sh).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/aarch64-e2e"
aarch64_begin "the aarch64 build was" "$CARGO_TARGET_DIR"
CACHE="$ROOT/target-aarch64"

aarch64_toolchain
aarch64_sysroot "$CACHE"
aarch64_env "$CACHE"
[[ -x "$ROOT/target/py-tools/bin/cargo-zigbuild" ]] || fail "cargo-zigbuild is missing: run 'make deps'"
export PATH="$ROOT/target/py-tools/bin:$PATH"

t0=$SECONDS
ZTARGET="$AARCH64_TARGET.2.28"
OUT="$CARGO_TARGET_DIR/$AARCH64_TARGET/ci"
echo "aarch64: building tally, the plugin, its ncclNet harness and the kernels' tests for $AARCH64_TARGET (glibc 2.28)"
# One cargo run for all of it: the harness built on its own (-p
# tally-nccl-plugin) resolved other features (log's, and syn's for the proc
# macros) and compiled the engine and its derives a second time, most of a
# minute and a half; the kernels' tests (engine/tests/reduce.rs,
# test-aarch64.sh runs them) built on their own, in another profile, cost
# CI three minutes more. (Built with test targets, cargo adds the
# dev-dependencies' features: yaml-rust2's turn on hashbrown's default-hasher.)
# The test binaries' names and paths, from cargo's JSON (build scripts are
# executables too), listed in $TESTS for test-aarch64.sh.
TESTS="$CARGO_TARGET_DIR/aarch64-tests.list"
mkdir -p "$CARGO_TARGET_DIR"
cargo zigbuild -q --profile ci --target "$ZTARGET" -p tally-cli -p tally-nccl-plugin -p tally-engine --lib --bins \
    --test abi --test net_tcp --test net_shm --test reduce --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m.get("executable"):
        print(m["target"]["name"], m["executable"])' >"$TESTS.new" || fail "the cross build failed"
mv "$TESTS.new" "$TESTS"
harness="$(awk '$1 != "reduce" { print $2 }' "$TESTS")"
[[ $(wc -l <<<"$harness") -eq 3 ]] || fail "expected 3 harness binaries, got: $harness"
TALLY="$OUT/tally"
PLUGIN="$OUT/libnccl_net_tally.so"
file -b "$TALLY" | grep -q aarch64 || fail "$TALLY is not an aarch64 binary"
build_s=$((SECONDS - t0))
((!BUILD_ONLY)) || exit 0

# Every process under emulation: the binaries we start and the ranks they start.
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
export QEMU_SET_ENV="LD_LIBRARY_PATH=$AARCH64_LIBS"
export TALLY_EXEC_WRAPPER=qemu-aarch64
export TALLY_LOG="${TALLY_LOG:-warn}" TALLY_LOG_STYLE=never
WORK="$(mktemp -d /tmp/tally-aarch64.XXXXXX)"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

ops=0
wrong=0
# bench_run NAME ARGS...: one `tally bench allreduce --json` run, which checks
# every element of every rank's result; its output goes to $WORK/NAME.*.
bench_run() {
    local name="$1"
    shift
    timeout -k 5 "${TALLY_AARCH64_RUN_TIMEOUT_S:-300}" qemu-aarch64 "$TALLY" bench allreduce --ranks 4 --json --warmup 1 "$@" \
        >"$WORK/$name.json" 2>"$WORK/$name.err"
}
# bench_count NAME STATUS: fails on a failed run or a wrong element, else
# adds its all-reduces (timed and the one warm-up, every mode and size).
bench_count() {
    local name="$1" st="$2" got n w rows
    got="$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["results"]
print(sum(x["iters"] + 1 for x in r), sum(x["wrong"] for x in r), len(r))' "$WORK/$name.json" 2>/dev/null)" || got=""
    if [[ $st -ne 0 || -z "$got" ]]; then
        cat "$WORK/$name.err" >&2
        fail "$name: exit status $st"
    fi
    read -r n w rows <<<"$got"
    ops=$((ops + n))
    wrong=$((wrong + w))
    echo "aarch64: $name: $rows results, $n all-reduces, $w wrong"
    ((w == 0)) || fail "$name: $w wrong elements"
}
bench() {
    local st=0
    bench_run "$@" || st=$?
    bench_count "$1" "$st"
}

t1=$SECONDS
for provider in tcp shm; do
    for dtype in f32 bf16; do
        bench "$provider-$dtype" --provider "$provider" --dtype "$dtype" --mode agg,ring --sizes 4K,256K --iters 3 --lcores 0-1 --poll adaptive
    done
done
bench "tcp-collnet" --provider tcp --dtype bf16 --mode agg-plugin --plugin "$PLUGIN" --sizes 256K --iters 3 --lcores 0 --poll adaptive

# Failover: two servers, one killed once the job runs on it.
start_server() {
    local i="$1"
    TALLY_LOG=info qemu-aarch64 "$TALLY" server --listen 127.0.0.1:0 --lcores 0 --provider tcp --poll adaptive --slab-size 16M \
        >"$WORK/server$i.out" 2>"$WORK/server$i.log" &
    PIDS+=($!)
    echo $! >"$WORK/server$i.pid"
    # Killed on purpose (server 1) or by cleanup: no job notice from bash.
    disown $!
    local k
    for k in $(seq 600); do
        [[ -s "$WORK/server$i.out" ]] && break
        sleep 0.1
    done
    sed -n 's/^tally server ready on \([^ ]*\).*/\1/p' "$WORK/server$i.out" >"$WORK/server$i.addr"
    [[ -s "$WORK/server$i.addr" ]] || { cat "$WORK/server$i.log" >&2; fail "server $i did not start"; }
}
start_server 0
start_server 1
servers="$(cat "$WORK/server0.addr"),$(cat "$WORK/server1.addr")"
TALLY_LOG=info bench_run failover --provider tcp --dtype f32 --mode agg --sizes 64K --iters 200 --servers "$servers" --poll adaptive &
run=$!
for k in $(seq 1200); do
    grep -q ': running' "$WORK/server1.log" 2>/dev/null && break
    kill -0 "$run" 2>/dev/null || break
    sleep 0.1
done
grep -q ': running' "$WORK/server1.log" || fail "the failover job never ran on server 1"
kill -KILL "$(cat "$WORK/server1.pid")"
st=0
wait "$run" || st=$?
bench_count failover "$st"
recovered="$(grep -c 'recovered from losing' "$WORK/failover.err" || true)"
((recovered > 0)) || { cat "$WORK/failover.err" >&2; fail "no rank recovered from losing server 1 (did the kill land after the run?)"; }
echo "aarch64: failover: server 1 SIGKILLed mid-run; $recovered ranks recovered on server 0"
run_s=$((SECONDS - t1))

# The plugin's ncclNet harness against the aarch64 library.
t2=$SECONDS
# net_shm runs shm without cross-memory attach here (qemu-user has none): it
# failed until the plugin progressed every endpoint of a context on a refused
# send (ffi-plugin/src/net/conn.rs; net_shm_no_cma checks it on x86).
while read -r test; do
    name="$(basename "$test")"
    if ! TALLY_PLUGIN_SO="$PLUGIN" timeout -k 5 300 qemu-aarch64 "$test" --test-threads=1 </dev/null >"$WORK/harness.out" 2>&1; then
        cat "$WORK/harness.out" >&2
        fail "plugin harness $name failed"
    fi
    echo "aarch64: plugin harness $name: $(grep '^test result' "$WORK/harness.out")"
done <<<"$harness"
harness_s=$((SECONDS - t2))

# The aarch64 wheel: this build packed as `make wheel` packs a release
# (scripts/build/wheel.sh: the glibc floor checked, tagged
# manylinux_2_28_aarch64), installed by pip for that platform into a
# directory, and used from there: its `tally` under qemu, `python -m
# tally_nccl` (pure Python: this host's interpreter) naming its plugin, and the
# ABI harness loading that plugin under qemu.
t3=$SECONDS
wheel="$(WHEEL_BIN="$OUT" "$ROOT/scripts/build/wheel.sh" "$AARCH64_TARGET")" || fail "packing the aarch64 wheel failed"
[[ "$wheel" == *-manylinux_2_28_aarch64.whl ]] || fail "the aarch64 wheel has another tag: $wheel"
pip=("$ROOT/target/py-tools/bin/pip")
[[ -x "${pip[0]}" ]] || pip=(python3 -m pip)
"${pip[@]}" install --quiet --no-index --disable-pip-version-check --only-binary=:all: \
    --platform manylinux_2_28_aarch64 --target "$WORK/wheel" "$wheel" ||
    fail "pip did not install $(basename "$wheel") for manylinux_2_28_aarch64"
wheel_so="$(cd "$WORK" && PYTHONPATH="$WORK/wheel" python3 -m tally_nccl path | sed -n 1p)"
if [[ "$wheel_so" != "$WORK/wheel/"* ]] || ! file -b "$wheel_so" | grep -q aarch64; then
    fail "python -m tally_nccl path named $wheel_so, not the wheel's aarch64 plugin"
fi
version="$(qemu-aarch64 "$WORK/wheel/bin/tally" --version)" || fail "the wheel's tally did not start under qemu"
abi="$(awk '$1 == "abi" { print $2 }' "$TESTS")"
if ! TALLY_PLUGIN_SO="$wheel_so" timeout -k 5 300 qemu-aarch64 "$abi" --test-threads=1 </dev/null >"$WORK/wheel-abi.out" 2>&1; then
    cat "$WORK/wheel-abi.out" >&2
    fail "the ABI harness failed against the wheel's plugin"
fi
echo "aarch64: wheel $(basename "$wheel") installed for manylinux_2_28_aarch64: $version; its plugin passed the ABI harness ($((SECONDS - t3))s)"

echo "aarch64 end to end: $ops all-reduces (agg, ring; tcp, shm; f32, bf16), 1 failover, $wrong wrong;" \
    "ncclNet harness (abi, tcp, shm) passed; the wheel installed and ran (build ${build_s}s, runs ${run_s}s, plugin harness ${harness_s}s)"
