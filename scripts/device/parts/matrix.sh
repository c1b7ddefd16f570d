# shellcheck shell=bash
# matrix: 4 KiB agg vs ring, busy, back-to-back: 2, 4, 8 ranks against server
# lcore sets of 1, 2 and 4 cores and TALLY_MIN_PIECE 4K, 2K, 1K (how far a
# small all-reduce is spread over lcores). Summary only (matrix.err aside).
say ""
say "## 4 KiB matrix: shm, busy, ranks on cores 8-15, back-to-back 20000 (mean / p50 / p99 us)"
say "$(printf '%5s %6s %6s %9s %24s %24s %8s' ranks lcores minpc mode agg ring agg/ring)"
for n in 2 4 8; do
    for lc in 2 2-3 2-5; do
        for mp in 4K 2K 1K; do
            [ "$lc" = 2 ] && [ "$mp" != 4K ] && continue
            TALLY_MIN_PIECE=$mp timeout 120 "$TALLY" bench allreduce --ranks "$n" --lcores "$lc" --cores 8-15 --poll busy --provider shm \
                --sizes 4K --iters 20000 --warmup 500 --mode agg,ring --json 2>>"$OUT/matrix.err" \
                | python3 "$DEVICE_DIR/summarise.py" matrix "$n" "$lc" "$mp" - | tee -a "$S"
        done
    done
done
