# shellcheck shell=bash
# scale: core scaling: 8 ranks (cores 8-15), 64 MiB, one server with 1, 2, 4,
# 8 lcores (cores 0-7), against the shm transport ceiling in the same run:
# `tally bench p2p --hubs L --leaves 8`, the same streams each way moving the
# same bytes with no reduce. (scripts/device/scale.sh is the finer grid: copy
# path, size, placement, pages, chunk.) Writes scale-p2p-L.json, scale-agg-L.json.
say ""
say "## core scaling: 8 ranks, 64 MiB f32 sum, chunk 256K, window 4, shm, busy; server input GB/s = 8 x 64 MiB / time"
say "$(printf '%7s %14s %16s %7s' lcores 'agg input' 'p2p ceiling' ratio)"
for L in 1 2 4 8; do
    hub="0-$((L-1))"
    timeout 200 "$TALLY" bench p2p --hubs "$L" --leaves 8 --cores "$hub,8-15" --sizes 64M --chunk 256K --window 4 --iters 5 \
        --poll busy --provider shm --json >"$OUT/scale-p2p-$L.json" 2>>"$OUT/scale.err"
    timeout 200 "$TALLY" bench allreduce --ranks 8 --lcores "$hub" --cores 8-15 --poll busy --provider shm --sizes 64M \
        --chunk 256K --window 4 --iters 10 --warmup 2 --mode agg --json >"$OUT/scale-agg-$L.json" 2>>"$OUT/scale.err"
    summarise scale "$OUT/scale-p2p-$L.json" "$OUT/scale-agg-$L.json" "$L"
done
