#!/usr/bin/env bash
# Soak a reduction server: verified agg all-reduces with random sizes, types,
# ops and rank counts against one long-running `tally server`, while rank
# processes of other runs are SIGKILLed at random.
#
#   scripts/bench/soak.sh [--duration SECONDS] [--provider shm|tcp] [--lcores 0-1]
#                   [--servers N] [--server-kills SECONDS] [--server-faults kill,stop,cut]
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
# With --servers N every run uses N servers; with --server-kills S (needs
# N >= 2 and tcp: failover is off over shm) one server, chosen at random, is
# SIGKILLed every S seconds and restarted on the same port a second later.
# Runs in progress then fail over to the others: none may fail or be wrong
# while a server of theirs is alive. The summary counts the recoveries the
# ranks logged. --server-faults picks, at random each time, among: kill (as
# above), stop (SIGSTOP for 6 s, then SIGCONT: a frozen server; the ranks
# hear no heartbeat and fail over, then take it back) and cut (its link down
# for 6 s, then up: the servers then run in network namespaces behind a
# bridge, the ranks in this one; needs root and iproute2). The summary gives
# the longest single all-reduce of any clean run (the stall a fault cost).
set -euo pipefail

DURATION=600
PROVIDER=shm
LCORES=0-1
NSERVERS=1
SERVER_KILLS=0
SERVER_FAULTS=kill
FREEZE_S=6
while [[ $# -gt 0 ]]; do
    case "$1" in
        --duration) DURATION="$2"; shift 2 ;;
        --provider) PROVIDER="$2"; shift 2 ;;
        --lcores) LCORES="$2"; shift 2 ;;
        --servers) NSERVERS="$2"; shift 2 ;;
        --server-kills) SERVER_KILLS="$2"; shift 2 ;;
        --server-faults) SERVER_FAULTS="$2"; shift 2 ;;
        -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
        *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/../.."
if [[ -z "${TALLY:-}" ]]; then
    cargo build --release -q -p tally-cli
    TALLY="${CARGO_TARGET_DIR:-target}/release/tally"
fi
TALLY="$(realpath "$TALLY")"

if [[ $SERVER_KILLS != 0 && ( $NSERVERS -lt 2 || $PROVIDER != tcp ) ]]; then
    echo "soak.sh: --server-kills needs --servers 2 or more and --provider tcp" >&2
    exit 2
fi

IFS=, read -r -a FAULT_KINDS <<<"$SERVER_FAULTS"
for k in "${FAULT_KINDS[@]}"; do
    [[ $k == kill || $k == stop || $k == cut ]] || { echo "soak.sh: unknown server fault $k (kill, stop, cut)" >&2; exit 2; }
done
# With link cuts the servers sit in namespaces behind a bridge (see --help).
NETNS=""
RANKS_ADDR=""
if [[ $SERVER_KILLS != 0 && ",$SERVER_FAULTS," == *,cut,* ]]; then
    NETNS="tsk$$"
    RANKS_ADDR=198.18.7.1
fi

WORK="$(mktemp -d /tmp/tally-soak.XXXXXX)"
SERVER_PID=""
FAULT_PID=""
KILLER_PID=""
cleanup() {
    [[ -n "$FAULT_PID" ]] && kill "$FAULT_PID" 2>/dev/null || true
    [[ -n "$KILLER_PID" ]] && kill "$KILLER_PID" 2>/dev/null || true
    [[ -n "${STEADY_PID:-}" ]] && kill "$STEADY_PID" 2>/dev/null || true
    for f in "$WORK"/server*.pid; do
        [[ -f "$f" ]] || continue
        kill -TERM "$(cat "$f")" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    if [[ -n "$NETNS" ]]; then
        for ns in $(ip netns list | awk -v p="$NETNS" 'index($1, p) == 1 {print $1}'); do ip netns del "$ns" 2>/dev/null || true; done
    fi
    [[ "${PASSED:-0}" == 1 ]] && rm -rf "$WORK"
}
trap cleanup EXIT

# The switch: a bridge in its own namespace, this namespace attached to it.
if [[ -n "$NETNS" ]]; then
    ip netns add "${NETNS}sw"
    ip -n "${NETNS}sw" link add br0 type bridge
    ip -n "${NETNS}sw" link set br0 up
    ip link add "${NETNS}r" type veth peer name "${NETNS}rt" netns "${NETNS}sw"
    ip -n "${NETNS}sw" link set "${NETNS}rt" master br0 up
    ip addr add "$RANKS_ADDR/24" dev "${NETNS}r"
    ip link set "${NETNS}r" up
fi
# Server $1's namespace and address (link cuts), made on first use.
server_host() {
    local i="$1" ns="${NETNS}s$1"
    if ! ip netns list | grep -q "^$ns\b"; then
        ip netns add "$ns"
        ip -n "${NETNS}sw" link add "${NETNS}p$i" type veth peer name eth0 netns "$ns"
        ip -n "${NETNS}sw" link set "${NETNS}p$i" master br0 up
        ip -n "$ns" addr add "198.18.7.$(( 10 + i ))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    fi
    echo "198.18.7.$(( 10 + i ))"
}

rss() { awk '/^VmRSS:/ {print $2 " " $3}' "/proc/$1/status" 2>/dev/null || echo "gone"; }
now() { date +%s.%N; }
rand() { echo $(( RANDOM % $1 )); }   # 0 .. $1-1

# Starts server $1 (on port $2, or a free one); waits until it is ready and
# writes its pid and address under $WORK.
start_server() {
    local i="$1" port="${2:-0}" line="" host=127.0.0.1 wrap=()
    if [[ -n "$NETNS" ]]; then
        host="$(server_host "$i")"
        port=7400
        wrap=(ip netns exec "${NETNS}s$i")
    fi
    TALLY_LOG=info "${wrap[@]}" "$TALLY" server --listen "$host:$port" --lcores "$LCORES" --provider "$PROVIDER" \
        --slab-size 64M >"$WORK/server$i.out" 2>>"$WORK/server$i.log" &
    local pid=$!
    for _ in $(seq 600); do
        line="$(head -1 "$WORK/server$i.out")"
        [[ -n "$line" ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    [[ -n "$line" ]] || { echo "soak: server $i did not start"; cat "$WORK/server$i.log"; return 1; }
    sed -n 's/^tally server ready on \([^ ]*\).*/\1/p' <<<"$line" >"$WORK/server$i.addr"
    [[ -s "$WORK/server$i.addr" ]] || { echo "soak: unexpected first line: $line"; return 1; }
    echo "$pid" >"$WORK/server$i.pid"
}

# The servers: for the whole soak (restarted on the same port after a kill).
for i in $(seq 0 $(( NSERVERS - 1 ))); do
    start_server "$i" || exit 1
done
SERVER_PID="$(cat "$WORK/server0.pid")"
ADDR="$(cat "$WORK"/server*.addr | paste -sd,)"
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
    out="$(timeout -k 5 120 "$TALLY" bench allreduce --servers "$ADDR" --provider "$PROVIDER" "${FABRIC_ARGS[@]}" --ranks "$r" --mode agg \
        --dtype "$d" --op "$o" --sizes "$s" --iters "$k" --warmup 0 --json 2>"$WORK/$tag.err")" || st=$?
    local bytes wrong max
    bytes="$(grep -o '"bytes":[0-9]*' <<<"$out" | head -1 | cut -d: -f2)"
    wrong="$(grep -o '"wrong":[0-9]*' <<<"$out" | head -1 | cut -d: -f2)"
    max="$(grep -o '"max_us":[0-9.]*' <<<"$out" | head -1 | cut -d: -f2)"
    if [[ $st -eq 0 && -n "$bytes" ]]; then
        echo "ok $k $(( bytes * k )) ${wrong:-0} $d $o $s r$r max_us=${max:-0}" >>"$log"
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
        # The ranks log "rank N: joined" at debug: the kill waits for all of them.
        TALLY_LOG="${TALLY_LOG:-info},tally_cli::bench::allreduce::rank=debug" \
            timeout -k 5 60 "$TALLY" bench allreduce --servers "$ADDR" --provider "$PROVIDER" "${FABRIC_ARGS[@]}" --ranks "$r" --mode agg \
            --dtype f32 --op sum --sizes 16M --iters 200 --warmup 0 --json >/dev/null 2>"$WORK/fault$n.err" &
        local tpid=$! launcher="" ranks="" victim="" t0 t1 st=0
        # timeout -> launcher -> rank processes; wait until the ranks exist.
        for _ in $(seq 100); do
            launcher="$(pgrep -P "$tpid" | head -1 || true)"
            [[ -n "$launcher" ]] && ranks="$(pgrep -P "$launcher" || true)"
            [[ $(wc -w <<<"$ranks") -eq $r ]] && break
            sleep 0.05
        done
        # Once every rank joined (a rank killed before it reached the servers is
        # one they never saw: the launcher stops the others after 10 s, and that
        # says nothing about how servers report a death), then into the loop.
        for _ in $(seq 600); do
            [[ $(grep -c ': joined' "$WORK/fault$n.err" 2>/dev/null || true) -ge $r ]] && break
            kill -0 "$tpid" 2>/dev/null || break
            sleep 0.05
        done
        sleep "$(rand 2).$(rand 10)"
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
            124|137) outcome="hang" ;;        # survivors did not notice within 60 s (nor the launcher)
            *) outcome="error" ;;             # survivors exited with an error: expected
        esac
        # Survivors the launcher had to stop (rank_watch.rs) did not notice by themselves.
        grep -q 'had not exited' "$WORK/fault$n.err" && outcome="hang"
        local after="fail"
        clean_run "after$n" "$WORK/after" >/dev/null 2>&1 && after="ok"
        echo "$outcome $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') $after ranks=$r status=$st run=$n" >>"$WORK/faults"
    done
}

# The server-fault loop: every SERVER_KILLS seconds, one of SERVER_FAULTS on
# a random server: kill (SIGKILL, restarted on its port a second later), stop
# (SIGSTOP for FREEZE_S, then SIGCONT) or cut (its switch port down for
# FREEZE_S, then up).
server_kill_loop() {
    while [[ $(date +%s) -lt $(( END - SERVER_KILLS / 2 - FREEZE_S - 5 )) ]]; do
        sleep "$SERVER_KILLS"
        local i pid port kind
        i=$(rand "$NSERVERS")
        kind=${FAULT_KINDS[$(rand ${#FAULT_KINDS[@]})]}
        pid="$(cat "$WORK/server$i.pid")"
        port="$(cut -d: -f2 "$WORK/server$i.addr")"
        echo "$kind $i $(now)" >>"$WORK/server_kills"
        case $kind in
            kill)
                kill -KILL "$pid" 2>/dev/null || true
                sleep 1
                start_server "$i" "$port" >>"$WORK/server_kills" 2>&1 || echo "restart-failed $i" >>"$WORK/server_kills" ;;
            stop)
                kill -STOP "$pid" 2>/dev/null || true
                sleep "$FREEZE_S"
                kill -CONT "$pid" 2>/dev/null || true ;;
            cut)
                ip -n "${NETNS}sw" link set "${NETNS}p$i" down
                sleep "$FREEZE_S"
                ip -n "${NETNS}sw" link set "${NETNS}p$i" up ;;
        esac
    done
}

FABRIC_ARGS=()
[[ -n "$RANKS_ADDR" ]] && FABRIC_ARGS=(--fabric-addr "$RANKS_ADDR")
# The steady loop (with server faults): long runs of back-to-back timed
# all-reduces over every server, so that faults land mid-run; the longest
# single all-reduce of these runs is the stall a fault cost.
steady_loop() {
    local n=0
    while [[ $(date +%s) -lt $(( END - 20 )) ]]; do
        n=$((n + 1))
        local out st=0 wrong max
        out="$(timeout -k 5 300 "$TALLY" bench allreduce --servers "$ADDR" --provider "$PROVIDER" "${FABRIC_ARGS[@]}" --ranks 3 \
            --mode agg --dtype f32 --op sum --sizes 1M --iters 3000 --warmup 3 --json 2>"$WORK/steady$n.err")" || st=$?
        wrong="$(grep -o '"wrong":[0-9]*' <<<"$out" | head -1 | cut -d: -f2)"
        max="$(grep -o '"max_us":[0-9.]*' <<<"$out" | head -1 | cut -d: -f2)"
        if [[ $st -eq 0 && -n "$max" ]]; then
            echo "ok ${wrong:-0} $max" >>"$WORK/steady"
        else
            echo "fail ${wrong:-0} 0 status=$st $(tr '\n' ' ' <"$WORK/steady$n.err" | cut -c1-300)" >>"$WORK/steady"
        fi
    done
}

# Every server's VmRSS every 30 s ("seconds server pid kB"), to tell a warm-up
# (pools that fill in the first minute) from growth that goes on.
rss_loop() {
    while [[ $(date +%s) -lt $END ]]; do
        for f in "$WORK"/server*.pid; do
            local i pid
            i="${f##*/server}"; i="${i%.pid}"; pid="$(cat "$f")"
            echo "$(( $(date +%s) - END + DURATION )) $i $pid $(rss "$pid" | cut -d' ' -f1)" >>"$WORK/rss"
        done
        sleep 30
    done
}

touch "$WORK/runs" "$WORK/faults" "$WORK/after" "$WORK/server_kills" "$WORK/steady" "$WORK/rss"
rss_loop &
RSS_PID=$!
fault_loop &
FAULT_PID=$!
STEADY_PID=""
if [[ $SERVER_KILLS != 0 ]]; then
    server_kill_loop &
    KILLER_PID=$!
    steady_loop &
    STEADY_PID=$!
fi
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
    if [[ $SERVER_KILLS == 0 ]]; then
        kill -0 "$SERVER_PID" 2>/dev/null || { echo "soak: the server died"; break; }
    fi
done
[[ -t 2 ]] && printf '\r\033[2K' >&2
wait "$FAULT_PID" || true
FAULT_PID=""
if [[ -n "$KILLER_PID" ]]; then
    wait "$KILLER_PID" || true
    KILLER_PID=""
fi
[[ -n "$STEADY_PID" ]] && { wait "$STEADY_PID" || true; }
kill "$RSS_PID" 2>/dev/null || true
SERVER_PID="$(cat "$WORK/server0.pid")"

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
alive="yes"
for f in "$WORK"/server*.pid; do kill -0 "$(cat "$f")" 2>/dev/null || alive="no"; done
server_kills=$(grep -c '^kill' "$WORK/server_kills" || true)
server_stops=$(grep -c '^stop' "$WORK/server_kills" || true)
link_cuts=$(grep -c '^cut' "$WORK/server_kills" || true)
steady_ok=$(grep -c '^ok' "$WORK/steady" || true)
steady_fail=$(grep -c '^fail' "$WORK/steady" || true)
steady_wrong=$(awk '{ w += $2 } END { print w + 0 }' "$WORK/steady")
stall="$(awk '$1 == "ok" && $3 > m { m = $3 } END { printf "%.2f s", m / 1e6 }' "$WORK/steady")"
longest="$(awk '$1 == "ok" { for (i = 1; i <= NF; i++) if ($i ~ /^max_us=/) { v = substr($i, 8) + 0; if (v > m) m = v } } END { printf "%.2f s", m / 1e6 }' "$WORK/runs")"
restart_failed=$(grep -c '^restart-failed' "$WORK/server_kills" || true)
recoveries=$(cat "$WORK"/*.err 2>/dev/null | grep -c 'recovered from losing' || true)

echo "soak summary (${DURATION}s, $PROVIDER, servers $ADDR)"
echo "  clean runs:         $clean_ok passed, $clean_fail failed"
echo "  all-reduces:        $ops (every element verified)"
echo "  bytes all-reduced:  $bytes per rank ($(awk -v b="$bytes" 'BEGIN {printf "%.1f GiB", b / 2^30}'))"
echo "  wrong results:      $wrong"
echo "  faults injected:    $faults rank SIGKILLs ($errors survivors errored, $hangs hung; $missed runs ended before the kill)"
echo "  time to error:      $tte (kill to the run's exit)"
echo "  clean run after a fault failed: $after_fail"
if [[ $SERVER_KILLS != 0 ]]; then
    echo "  server faults:      every ${SERVER_KILLS}s on 1 of $NSERVERS servers: $server_kills SIGKILLs ($restart_failed restarts failed), $server_stops SIGSTOPs for ${FREEZE_S}s, $link_cuts link cuts for ${FREEZE_S}s"
    echo "  longest all-reduce: $longest (any clean run; includes its join)"
    echo "  steady runs:        $steady_ok passed, $steady_fail failed (3 ranks, 3000 x 1 MiB back to back, faults landing mid-run), $steady_wrong wrong"
    echo "  longest stall:      $stall (the longest single all-reduce of the steady runs)"
    echo "  rank recoveries:    $recoveries (a rank's log line: recovered from losing a server)"
fi
echo "  servers alive:      $alive"
echo "  server VmRSS:       $RSS_START at start, $RSS_END at end"
# Each server process alive at the end: its VmRSS once a minute old, and at the end.
awk '$4 ~ /^[0-9]+$/ { if (!($3 in first)) first[$3] = $1; k = $2 " " $3; last[k] = $4; t[k] = $1
    if (!(k in at60) && $1 - first[$3] >= 60) at60[k] = $4 }
    END { for (k in last) { split(k, a, " "); if (k in at60) printf "  server %s (pid %s): VmRSS %d kB a minute in, %d kB at %d s (%+.1f%%)\n", a[1], a[2], at60[k], last[k], t[k], 100 * (last[k] - at60[k]) / at60[k] } }' \
    "$WORK/rss" | sort
if [[ $hangs -gt 0 ]]; then
    echo "  hung runs (each run=N's ranks logged to fault<N>.err, the servers to server*.log):"
    grep '^hang' "$WORK/faults" | head -5 | sed 's/^/    /'
fi
if [[ $clean_fail -gt 0 ]]; then echo "  failed runs:"; grep '^fail' "$WORK/runs" | head -5 | sed 's/^/    /'; fi
cat "$WORK"/server*.log | grep -c 'ended' | sed 's/^/  server logs: jobs ended: /'
if [[ $SERVER_KILLS != 0 ]] && grep -q '^fail' "$WORK/steady"; then echo "  failed steady runs:"; grep '^fail' "$WORK/steady" | head -3 | sed 's/^/    /'; fi
if [[ "$wrong" -ne 0 || $clean_fail -ne 0 || ${steady_fail:-0} -ne 0 || ${steady_wrong:-0} -ne 0 || $hangs -ne 0 || $after_fail -ne 0 || $alive != yes || $restart_failed -ne 0 ]]; then
    echo "soak: FAILED (logs in $WORK)"
    exit 1
fi
echo "soak: passed"
PASSED=1
