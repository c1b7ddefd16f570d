# shellcheck shell=bash
# grayfail: the hung-server loop of issue 31, as it was first measured, on the
# emulated cluster: `tally bench cluster --hosts 3 --rates 2 --sizes 16M
# --mode agg` with a loop of 700 timed all-reduces; one `tally server` is
# SIGSTOPped for STOP_S seconds (40) mid-loop, then SIGCONTed. The loop's
# slowest all-reduce (max_us in the JSON row) is the stall the freeze cost:
# the whole stop before heartbeats, the ranks' liveness time (2 s) and a
# recovery with them. Every element is checked (#wrong). The resumed server's
# log says whether it was fenced and taken back. Writes cluster.{out,err,log}.
STOP_S="${STOP_S:-40}"
"$TALLY" bench cluster --hosts 3 --rates 2 --sizes 16M --mode agg --iters 700 --json --log "$OUT/cluster.log" \
    >"$OUT/cluster.out" 2>"$OUT/cluster.err" &
bench=$!
# The loop is running once every rank joined: wait for the servers' jobs.
# The victim is the second of this bench's own servers (its children): a
# host may run other tally servers, which are not to be stopped.
victim=""
for _ in $(seq 600); do
    victim="$(pgrep -P "$bench" -f 'tally server' | sort -n | sed -n 2p)"
    [[ -n "$victim" ]] && grep -q 'running,' "$OUT/cluster.log" 2>/dev/null && break
    sleep 0.1
done
sleep 5
if [[ -z "$victim" ]]; then
    say "grayfail: no server process found"
else
    say "SIGSTOP server pid $victim for ${STOP_S}s at $(date +%T.%N)"
    kill -STOP "$victim"
    sleep "$STOP_S"
    kill -CONT "$victim"
    say "SIGCONT at $(date +%T.%N)"
fi
wait "$bench"
say "bench cluster exit $?"
# The loop's row: mean, p50, p99 and max per operation, wrong elements.
grep -oE '"(mode|bytes|iters|time_us|p50_us|p99_us|max_us|wrong|fraction)":[^,}]*' "$OUT/cluster.out" | paste -sd' ' | tee -a "$S"
tail -5 "$OUT/cluster.err" | tee -a "$S"
grep -E 'lost|fenc|rejoined|recovered|back in job|heartbeat|disconnected' "$OUT/cluster.log" | cut -c1-240 | head -40 | tee -a "$S"
