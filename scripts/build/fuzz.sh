#!/usr/bin/env bash
# Fuzz everything tally parses from the network or its configuration file.
#
#   scripts/build/fuzz.sh [SECONDS] [TARGET...]     (default: 60 s each, every target)
#
# Targets (fuzz/fuzz_targets/): handshake (Hello/Header as the server reads
# them), reject (Reject/NameRecord as clients read them), config (the server's
# TOML file, parsed and resolved). Needs the nightly toolchain; installs
# cargo-fuzz if missing. Builds without libfabric (tally-engine's "std" feature).
# Prints executions per target and findings; a crashing input is left under
# fuzz/artifacts/TARGET/ (add it to engine/tests/wire_props.rs as a regression case).
set -uo pipefail

SECONDS_EACH="${1:-60}"
shift || true
cd "$(dirname "$0")/../../fuzz" || exit 1
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(handshake reject config)

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: needs the nightly toolchain (rustup toolchain install nightly)" >&2
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz"
    cargo install cargo-fuzz --locked || exit 2
fi

status=0
summary=()
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="$(mktemp /tmp/tally-fuzz-$t.XXXXXX)"
    echo "== $t: ${SECONDS_EACH}s"
    before=$(find "artifacts/$t" -type f | wc -l)
    cargo +nightly fuzz run "$t" -- -max_total_time="$SECONDS_EACH" -print_final_stats=1 >"$log" 2>&1
    st=$?
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
    found=$(( $(find "artifacts/$t" -type f | wc -l) - before ))
    if [[ $st -ne 0 || $found -gt 0 ]]; then
        status=1
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -10
        echo "   full log: $log"
    else
        rm -f "$log"
    fi
    summary+=("$(printf '%-10s %12s executions  %8s/s  %d findings  (exit %d)' "$t" "${execs:-?}" "${rate:-?}" "$found" "$st")")
done
echo
echo "fuzz summary (${SECONDS_EACH}s per target):"
printf '  %s\n' "${summary[@]}"
exit $status
