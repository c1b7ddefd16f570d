# shellcheck shell=bash
# cluster-perf (linerate.sh's perf part): perf (devlib/perf.tar.xz) of the
# whole host during one 32 Gbit/s agg run with the default rails, started
# LR_PERF_AFTER (5) seconds in: top symbols per thread kind. Writes
# perf-run.json, perf.data, cluster.err.
say ""
say "## perf of the host during a 32 Gbit/s agg run (default rails), self time by thread kind"
perf_unpack || { say "no $DEVLIB/perf.tar.xz"; return 0; }
perf_during "${LR_PERF_AFTER:-5}" 4 "$OUT/perf.data" -a -g -F 499 -- "$TALLY" bench cluster --hosts 4 --rates 32 --sizes 64M \
    --iters 400 --timeout 120 --mode agg --json >"$OUT/perf-run.json" 2>>"$OUT/cluster.err"
summarise configs "$OUT/perf-run.json" "perf run"
$PERF report -i "$OUT/perf.data" --stdio --no-children -g none --sort comm,symbol --percent-limit 0.7 2>/dev/null | grep -v '^#' | grep -v '^$' | head -45 | tee -a "$S"
