# shellcheck shell=bash
# fostage: what failover's staging copy costs: 8 ranks (cores 8-15) against 3
# servers (tcp, busy, lcores 0-1, 2-3, 4-5), 4 KiB, 1 MiB and 64 MiB, with
# TALLY_FAILOVER=0 and =1 alternated, same run. Writes fo[01]-*.json, fo.err,
# fo-serverK.{out,log}.
say ""
say "## failover staging cost: 8 ranks (cores 8-15), 3 servers (tcp, busy, lcores 0-1, 2-3, 4-5)"
pids=(); addrs=""
for k in 0 1 2; do
    "$TALLY" server --listen 127.0.0.1:$((7490 + k)) --lcores $((2 * k))-$((2 * k + 1)) --provider tcp --poll busy \
        >"$OUT/fo-server$k.out" 2>"$OUT/fo-server$k.log" &
    pids+=($!); addrs="$addrs,127.0.0.1:$((7490 + k))"
done
addrs="${addrs#,}"
sleep 2
for fo in 0 1 0 1; do
    TALLY_FAILOVER=$fo timeout -k 5 300 "$TALLY" bench allreduce --servers "$addrs" --provider tcp --ranks 8 --cores 8-15 \
        --poll busy --mode agg --sizes 4K,1M,64M --iters 20 --warmup 3 --json >"$OUT/fo$fo-$RANDOM.json" 2>>"$OUT/fo.err" || say "FAILED (fo.err)"
done
kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null
summarise fostage "$OUT"
