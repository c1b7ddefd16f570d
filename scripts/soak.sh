#!/usr/bin/env bash
# Soak a reduction server: verified agg all-reduces with random sizes, types,
# ops and rank counts against one long-running `tally server`, while rank
# processes of other runs are SIGKILLed at random.
#
#   scripts/soak.sh [--duration SECONDS] [--provider shm|tcp] [--lcores 0-1]
#
# Environment: TALLY=path/to/tally (default: build target/release/tally).
#
# Clean runs: `tally bench allreduce --servers ADDR --mode agg` with random
# --dtype/--op/--sizes/--ranks; the bench checks every element of every rank's
# result against an exact reference and reports `wrong`.
# Faults (in parallel): such a run with one of its rank processes SIGKILLed
# mid-run; the surviving ranks must exit with an error (bounded by `timeout`:
# a hang counts as a failure), then a clean run must pass (the server still
# serves). Prints operations, bytes, faults, wrong results (must be 0) and the
# server's VmRSS at start and end. Exit status 0 only if nothing went wrong.
set -euo pipefail

DURATION=600
PROVIDER=shm
LCORES=0-1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --duration) DURATION="$2"; shift 2 ;;
        --provider) PROVIDER="$2"; shift 2 ;;
        --lcores) LCORES="$2"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
if [[ -z "${TALLY:-}" ]]; then
    cargo build --release -q -p tally-cli
    TALLY="${CARGO_TARGET_DIR:-target}/release/tally"
fi
TALLY="$(realpath "$TALLY")"

WORK="$(mktemp -d /tmp/tally-soak.XXXXXX)"
SERVER_PID=""
FAULT_PID=""
cleanup() {
    [[ -n "$FAULT_PID" ]] && kill "$FAULT_PID" 2>/dev/null || true
    if [[ -n "$SERVER_PID" ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

rss() { awk '/^VmRSS:/ {print $2 " " $3}' "/proc/$1/status" 2>/dev/null || echo "gone"; }
now() { date +%s.%N; }
rand() { echo $(( RANDOM % $1 )); }   # 0 .. $1-1

# The server: one for the whole soak.
TALLY_LOG=info "$TALLY" server --listen 127.0.0.1:0 --lcores "$LCORES" --provider "$PROVIDER" \
    --slab-size 64M >"$WORK/server.out" 2>"$WORK/server.log" &
SERVER_PID=$!
line=""
for _ in $(seq 600); do
    line="$(head -1 "$WORK/server.out")"
    [[ -n "$line" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
done
[[ -n "$line" ]] || { echo "soak: server did not start"; cat "$WORK/server.log"; exit 1; }
ADDR="$(sed -n 's/^tally server ready on \([^ ]*\).*/\1/p' <<<"$line")"
[[ -n "$ADDR" ]] || { echo "soak: unexpected first line: $line"; exit 1; }
RSS_START="$(rss "$SERVER_PID")"
echo "soak: server pid $SERVER_PID on $ADDR ($PROVIDER), VmRSS $RSS_START; running ${DURATION}s; work dir $WORK"

DTYPES=(i8 u8 i32 u32 i64 u64 f16 f32 f64 bf16)
OPS=(sum prod max min avg)
SIZES=(4K 12K 64K 100K 256K 1M 3M 4M 8M 16M)
END=$(( $(date +%s) + DURATION ))

# One verified run; appends "ok|fail OPS BYTES WRONG args" to $2. Returns the bench's status.
clean_run() {
    local tag="$1" log="$2"
    local d=${DTYPES[$(rand ${#DTYPES[@]})]} o=${OPS[$(rand ${#OPS[@]})]} s=${SIZES[$(rand ${#SIZES[@]})]}
    local r=$(( 2 + $(rand 3) )) k=$(( 1 + $(rand 5) ))
    local out st=0
    out="$(timeout -k 5 120 "$TALLY" bench allreduce --servers "$ADDR" --provider "$PROVIDER" --ranks "$r" --mode agg \
        --dtype "$d" --op "$o" --sizes "$s" --iters "$k" --warmup 0 --json 2>"$WORK/$tag.err")" || st=$?
    local bytes wrong
    bytes="$(grep -o '"bytes":[0-9]*' <<<"$out" | head -1 | cut -d: -f2)"
    wrong="$(grep -o '"wrong":[0-9]*' <<<"$out" | head -1 | cut -d: -f2)"
    if [[ $st -eq 0 && -n "$bytes" ]]; then
        echo "ok $k $(( bytes * k )) ${wrong:-0} $d $o $s r$r" >>"$log"
    else
        echo "fail $k 0 ${wrong:-0} $d $o $s r$r status=$st $(tr '\n' ' ' <"$WORK/$tag.err" | cut -c1-300)" >>"$log"
    fi
    return $st
}

# The fault loop: a run whose rank process is SIGKILLed, then a clean run.
fault_loop() {
    local n=0
    while [[ $(date +%s) -lt $(( END - 20 )) ]]; do
        sleep "$(( 1 + $(rand 4) )).$(rand 10)"
        n=$((n + 1))
        local r=$(( 2 + $(rand 3) ))
        timeout -k 5 60 "$TALLY" bench allreduce --servers "$ADDR" --provider "$PROVIDER" --ranks "$r" --mode agg \
            --dtype f32 --op sum --sizes 16M --iters 200 --warmup 0 --json >/dev/null 2>"$WORK/fault$n.err" &
        local tpid=$! launcher="" ranks="" victim="" t0 t1 st=0
        # timeout -> launcher -> rank processes; wait until the ranks exist.
        for _ in $(seq 100); do
            launcher="$(pgrep -P "$tpid" | head -1 || true)"
            [[ -n "$launcher" ]] && ranks="$(pgrep -P "$launcher" || true)"
            [[ $(wc -w <<<"$ranks") -eq $r ]] && break
            sleep 0.05
        done
    # Late enough that the ranks joined and are all-reducing (seconds on a loaded host).
    sleep "$(( 2 + $(rand 3) )).$(rand 10)"
        victim="$(shuf -n1 <<<"$ranks" 2>/dev/null || true)"
        if [[ -z "$victim" ]] || ! kill -KILL "$victim" 2>/dev/null; then
            wait "$tpid" || true
            echo "missed - - no rank process to kill" >>"$WORK/faults"
            continue
        fi
        t0=$(now)
        wait "$tpid" || st=$?
        t1=$(now)
        local outcome
        case $st in
            0) outcome="missed" ;;            # the run finished before the kill landed
            124|137) outcome="hang" ;;        # survivors did not notice within 60 s
            *) outcome="error" ;;             # survivors exited with an error: expected
        esac
        local after="fail"
        clean_run "after$n" "$WORK/after" >/dev/null 2>&1 && after="ok"
        echo "$outcome $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') $after ranks=$r status=$st" >>"$WORK/faults"
    done
}

touch "$WORK/runs" "$WORK/faults" "$WORK/after"
fault_loop &
FAULT_PID=$!
# A progress line on a terminal (standard error), nothing in a pipe or a log.
START=$(date +%s)
progress() {
    [[ -t 2 ]] || return 0
    local t=$(( $(date +%s) - START )) ok fail kills
    ok=$(grep -c '^ok' "$WORK/runs" || true); fail=$(grep -c '^fail' "$WORK/runs" || true)
    kills=$(grep -vc '^missed' "$WORK/faults" || true)
    printf '\r\033[2K[%4ds/%ds] clean runs %d ok, %d failed; %d rank kills' "$t" "$DURATION" "$ok" "$fail" "$kills" >&2
}
i=0
while [[ $(date +%s) -lt $END ]]; do
    i=$((i + 1))
    progress
    clean_run "run$i" "$WORK/runs" || true
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "soak: the server died"; break; }
done
[[ -t 2 ]] && printf '\r\033[2K' >&2
wait "$FAULT_PID" || true
FAULT_PID=""

RSS_END="$(rss "$SERVER_PID")"
cat "$WORK/after" >>"$WORK/runs"
read -r ops bytes wrong < <(awk '$1 == "ok" { o += $2; b += $3; w += $4 } END { printf "%d %.0f %d\n", o, b, w }' "$WORK/runs")
clean_ok=$(grep -c '^ok' "$WORK/runs" || true)
clean_fail=$(grep -c '^fail' "$WORK/runs" || true)
faults=$(grep -vc '^missed' "$WORK/faults" || true)
errors=$(grep -c '^error' "$WORK/faults" || true)
hangs=$(grep -c '^hang' "$WORK/faults" || true)
missed=$(grep -c '^missed' "$WORK/faults" || true)
after_fail=$(awk '$1 != "missed" && $3 == "fail"' "$WORK/faults" | wc -l)
tte="$(awk '$1 == "error" { n++; s += $2; if ($2 > m) m = $2 } END { if (n) printf "mean %.2fs, max %.2fs", s / n, m; else print "-" }' "$WORK/faults")"
alive="yes"; kill -0 "$SERVER_PID" 2>/dev/null || alive="no"

echo "soak summary (${DURATION}s, $PROVIDER, server $ADDR)"
echo "  clean runs:         $clean_ok passed, $clean_fail failed"
echo "  all-reduces:        $ops (every element verified)"
echo "  bytes all-reduced:  $bytes per rank ($(awk -v b="$bytes" 'BEGIN {printf "%.1f GiB", b / 2^30}'))"
echo "  wrong results:      $wrong"
echo "  faults injected:    $faults rank SIGKILLs ($errors survivors errored, $hangs hung; $missed runs ended before the kill)"
echo "  time to error:      $tte (kill to the run's exit)"
echo "  clean run after a fault failed: $after_fail"
echo "  server alive:       $alive"
echo "  server VmRSS:       $RSS_START at start, $RSS_END at end"
if [[ $clean_fail -gt 0 ]]; then echo "  failed runs:"; grep '^fail' "$WORK/runs" | head -5 | sed 's/^/    /'; fi
grep -c 'ended' "$WORK/server.log" | sed 's/^/  server log: jobs ended: /'
if [[ "$wrong" -ne 0 || $clean_fail -ne 0 || $hangs -ne 0 || $after_fail -ne 0 || $alive != yes ]]; then
    echo "soak: FAILED (logs in $WORK)"
    exit 1
fi
echo "soak: passed"
rm -rf "$WORK"
