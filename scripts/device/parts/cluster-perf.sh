# shellcheck shell=bash
# cluster-perf (linerate.sh's perf part): perf (devlib/perf.tar.xz) of the
# whole host during one 32 Gbit/s run with the default rails, started
# LR_PERF_AFTER (5) seconds in: top symbols per thread kind. LR_PERF_MODE
# (agg; agg-plugin drives the NCCL plugin as NCCL does), LR_PERF_SIZE (64M),
# LR_PERF_ITERS (400), once per LR_PERF_CONFIGS (space separated,
# name@VAR=v,VAR=v; default "default", no variables), so that two settings
# (e.g. "on off@TALLY_FAILOVER=0") are profiled in one call. The run is
# timed for at least LR_PERF_AFTER + 4 + 3 s (--min-time), so that perf's 4 s
# fall inside it: 400 all-reduces of 16 MiB at 32 Gbit/s take 2 s, and a
# profile started after them saw only idle cores (twice, 2026-11-27).
# Writes perf-NAME-run.json, perf-NAME.data, cluster.err.
perf_unpack || { say "no $DEVLIB/perf.tar.xz"; return 0; }
perf_ms=$(((${LR_PERF_AFTER:-5} + 4 + 3) * 1000))
for cfg in ${LR_PERF_CONFIGS:-default}; do
    name="${cfg%%@*}" vars=()
    [[ "$cfg" == *@* ]] && IFS=',' read -ra vars <<<"${cfg#*@}"
    say ""
    say "## perf of the host during a 32 Gbit/s ${LR_PERF_MODE:-agg} run at ${LR_PERF_SIZE:-64M} (default rails; $cfg), self time by thread kind"
    perf_during "${LR_PERF_AFTER:-5}" 4 "$OUT/perf-$name.data" -a -g -F 499 -- env "${vars[@]}" "$TALLY" bench cluster --hosts 4 --rates 32 \
        --sizes "${LR_PERF_SIZE:-64M}" --iters "${LR_PERF_ITERS:-400}" --min-time "$perf_ms" --timeout 120 --mode "${LR_PERF_MODE:-agg}" --json \
        >"$OUT/perf-$name-run.json" 2>>"$OUT/cluster.err"
    summarise configs "$OUT/perf-$name-run.json" "perf $name"
    $PERF report -i "$OUT/perf-$name.data" --stdio --no-children -g none --sort comm,symbol --percent-limit 0.7 2>/dev/null | grep -v '^#' | grep -v '^$' | head -45 | tee -a "$S"
    say "# the workers' threads alone (rails and the caller's), self time"
    $PERF report -i "$OUT/perf-$name.data" --stdio --no-children -g none --sort comm,dso,symbol --percent-limit 0.5 \
        --comms tally,tally-rail0,tally-rail1,tally-rail2,tally-rail3,tally-rail4,tally-rail5,tally-rail6,tally-rail7 2>/dev/null \
        | grep -v '^#' | grep -v '^$' | head -30 | tee -a "$S"
done
