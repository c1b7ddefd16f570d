# shellcheck shell=bash
# cluster: emulated cluster (tally bench cluster): 4 + 4 and 8 + 8 hosts,
# 2-16 Gbit/s, 16 and 64 MiB, agg, agg through the NCCL plugin, ring.
# Writes clusterH.{json,svg,log}, cluster.err.
for h in 4 8; do
    say ""
    say "## emulated cluster, $h + $h hosts"
    timeout -k 5 280 "$TALLY" bench cluster --hosts "$h" --rates 16,8,4,2 --sizes 16M,64M --iters 5 --timeout 120 --mode agg,agg-plugin,ring \
        --plot "$OUT/cluster$h.svg" --log "$OUT/cluster$h.log" --json >"$OUT/cluster$h.json" 2>>"$OUT/cluster.err" || say "FAILED (see cluster.err)"
    summarise cluster "$OUT/cluster$h.json"
done
