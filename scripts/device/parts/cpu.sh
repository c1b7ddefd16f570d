# shellcheck shell=bash
# cpu (linerate.sh): adaptive polling at LR_CPU_RATES ("16 32") Gbit/s, 64M:
# worker and server CPU seconds per GB all-reduced, and cores per 100 Gbit/s.
# Writes cpu-RATE.json, cluster.err.
say ""
say "## CPU cost, adaptive polling (a poller's work, not its spin), default rails: CPU seconds per GB all-reduced"
for rate in ${LR_CPU_RATES:-16 32}; do
    j="$OUT/cpu-$rate.json"
    timeout -k 5 200 "$TALLY" bench cluster --hosts 4 --rates "$rate" --sizes 64M --mode agg,ring --poll adaptive --json >"$j" 2>>"$OUT/cluster.err" \
        || { say "FAILED cpu $rate"; continue; }
    summarise cpu "$j"
done
