# shellcheck shell=bash
# latency: shm, busy, pinned: the ping-pong round trip, then back-to-back
# 4 KiB agg vs ring with 2, 4 and 8 ranks (mean, p50, p99), and 1 MiB /
# 64 MiB so that a change for small sizes shows whether it cost the large
# ones. Knobs: LAT_RANKS ("2 4 8"), LAT_LARGE (1; 0 leaves out 1 MiB / 64 MiB).
# Writes p2p.json, latN-small.json, latN-large.json, lat.err, p2p.err.
say ""
say "## shm ping-pong (busy, cores $((C-2)),$((C-1)))"
timeout 120 "$TALLY" bench p2p --provider shm --sizes 8,4K,64K,1M --cores $((C-2)),$((C-1)) 2>>"$OUT/p2p.err" | tee -a "$S"
# The round trip the ratios use: between the server's core and rank 0's.
shm_pingpong 2,8 "$OUT/p2p.json"
say "round trip for the ratios below (4 KiB, cores 2,8, median of 20000): $(python3 "$DEVICE_DIR/summarise.py" rtt "$OUT/p2p.json") us"
for n in ${LAT_RANKS:-2 4 8}; do
    # Two lcores from 4 ranks on, as issue 54 measured the rail hop: a small
    # all-reduce is split over them ("Several ranks: the split"); with one,
    # 4 ranks gave 0.90-0.93 of the ring against 0.67-0.74 on two (nvidia-h200).
    lc=2; [ "$n" -ge 4 ] && lc=2-3
    say ""
    # Two cores per rank: its own, and its rail thread's where TALLY_SHM_RAIL=1
    # puts shm's one endpoint on one (by default the caller's thread drives it
    # and the second core idles); where the host has fewer, they wrap.
    last=$((8 + 2 * n - 1)); [ "$last" -ge "$C" ] && last=$((C - 1))
    say "## $n ranks (pinned to cores 8-$last, two a rank), server lcores $lc, busy, shm: back-to-back"
    lat() { # FILE BENCH-ARGS...
        local f=$1; shift
        timeout 300 "$TALLY" bench allreduce --ranks "$n" --lcores "$lc" --cores "8-$last" --poll busy --provider shm \
            --mode agg,ring --json "$@" 2>>"$OUT/lat.err" >"$f" || say "FAILED (see lat.err)"
    }
    lat "$OUT/lat$n-small.json" --sizes 4K --iters 10000 --warmup 500
    rm -f "$OUT/lat$n-large.json"
    [ "${LAT_LARGE:-1}" = 1 ] && lat "$OUT/lat$n-large.json" --sizes 1M,64M --iters 20 --warmup 3
    summarise latency "$OUT/p2p.json" "$OUT/lat$n-small.json" "$OUT/lat$n-large.json"
done
