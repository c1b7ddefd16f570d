# shellcheck shell=bash
# tail: 4 KiB loop alone, then beside a job streaming 64 MiB all-reduces
# through the same server (p50, p99 of the small job), with the lcores shared
# and with a latency lcore. Writes tail-*.json, tail-server-*.{out,err}, tail.err.
say ""
say "## tail: 4 KiB agg loop (2 ranks, cores 8,9) alone and beside a 64 MiB agg job (2 ranks, cores 10,11), one server, busy, shm."
say "## shared: lcores 2-3 serve both jobs. latency lcore: lcores 2-4 with --latency-lcores 1 (lcore 2 takes operations"
say "## of at most 64 KiB, lcores 3-4 the larger ones: the big job has two lcores either way)."
small() { timeout -k 5 120 "$TALLY" bench allreduce --servers 127.0.0.1:7470 --provider shm --ranks 2 --cores "$1" --poll busy \
    --sizes 4K --iters 5000 --warmup 100 --mode agg --timeout 30 --json 2>>"$OUT/tail.err"; }
for cfg in shared latency; do
    case $cfg in
        shared) lc=(--lcores 2-3) ;;
        latency) lc=(--lcores 2-4 --latency-lcores 1 --latency-max 64K) ;;
    esac
    "$TALLY" server --listen 127.0.0.1:7470 "${lc[@]}" --poll busy --provider shm --slab-size 512M >"$OUT/tail-server-$cfg.out" 2>"$OUT/tail-server-$cfg.err" &
    SP=$!
    wait_ready "$OUT/tail-server-$cfg.out" 300
    small 8,9 >"$OUT/tail-alone-$cfg.json"
    # The big job ends by itself (bounded iterations), long after the small
    # loop. Its chunk and window set how many bytes wait in an lcore's shm
    # queue ahead of a small job's piece: run it with two of each.
    for big in "256K 4" "64K 2"; do
        read -r chunk window <<<"$big"
        timeout -k 5 120 "$TALLY" bench allreduce --servers 127.0.0.1:7470 --provider shm --ranks 2 --cores 10,11 --poll busy \
            --sizes 64M --iters 150 --warmup 2 --mode agg --chunk "$chunk" --window "$window" --timeout 30 --json \
            >"$OUT/tail-big-$cfg-$chunk.json" 2>>"$OUT/tail.err" &
        BP=$!
        sleep 1.5
        small 8,9 >"$OUT/tail-loaded-$cfg-$chunk.json"
        wait "$BP"
        summarise tail "$OUT/tail-alone-$cfg.json" "$OUT/tail-loaded-$cfg-$chunk.json" "$OUT/tail-big-$cfg-$chunk.json" "$chunk" "$window" "$cfg"
    done
    kill "$SP"; sleep 2; kill -9 "$SP" 2>/dev/null; wait "$SP" 2>/dev/null
done
