# shellcheck shell=bash
# cpu16: 4 + 4 and 8 + 8 hosts at 16 Gbit/s (CPU-bound on a 16-core host), 30
# all-reduces per figure: busy against adaptive polling, 1 against 2 lcores
# per server. Writes cpu16-H-POLL-L.json, cluster.err.
say ""
say "## 16 Gbit/s, 64 MiB, 30 back-to-back all-reduces per figure: polling and lcores per server (the machine's CPU is the limit here)"
for v in "4 busy 2" "4 adaptive 2" "4 busy 1" "8 busy 1" "8 adaptive 1"; do
    read -r hosts poll lcores <<<"$v"
    j="$OUT/cpu16-$hosts-$poll-$lcores.json"
    timeout -k 5 200 "$TALLY" bench cluster --hosts "$hosts" --rates 16 --sizes 64M --iters 30 --timeout 150 --mode agg,agg-plugin,ring \
        --poll "$poll" --server-lcores "$lcores" --json >"$j" 2>>"$OUT/cluster.err" || say "FAILED $v"
    summarise cpu16 "$j" "$hosts" "$poll" "$lcores"
done
