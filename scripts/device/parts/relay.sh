# shellcheck shell=bash
# relay: the two-rank relay against TALLY_RELAY=0, alternated: RL_ROUNDS (8)
# rounds of a 4 KiB ping-pong round trip (cores 2,8), then per setting 2 ranks
# 4 KiB (10,000 back-to-back) and 1 MiB (300), shm, busy, server lcore 2:
# mean, p50 (last rank), rank 0's own p50. Writes relay-*.json, relay.err.
say ""
say "## two-rank relay (TALLY_RELAY=1) against the servers reducing (=0), alternated; shm, busy, lcore 2, ranks on 8-15"
say "$(printf '%5s %6s %8s | %9s %9s %11s %9s | %9s %9s' round relay 'rtt us' '4K mean' '4K p50' 'rank0 p50' 'p50/rtt' '1M mean' '1M p50')"
for round in $(seq "${RL_ROUNDS:-8}"); do
    shm_pingpong 2,8 "$OUT/relay-$round-rtt.json"
    rtt=$(python3 "$DEVICE_DIR/summarise.py" rtt "$OUT/relay-$round-rtt.json" 3)
    for relay in 1 0; do
        run() { # SIZE ITERS WARMUP FILE
            TALLY_RELAY=$relay timeout 60 "$TALLY" bench allreduce --ranks 2 --lcores 2 --cores 8-15 --poll busy --provider shm \
                --sizes "$1" --iters "$2" --warmup "$3" --mode agg --json >"$4" 2>>"$OUT/relay.err"
        }
        run 4K 10000 500 "$OUT/relay-$round-$relay-small.json"
        run 1M 300 20 "$OUT/relay-$round-$relay-large.json"
        summarise relay "$OUT/relay-$round-$relay-small.json" "$OUT/relay-$round-$relay-large.json" "$round" "$relay" "$rtt"
    done
done
