# shellcheck shell=bash
# profile: host facts (clock source, core siblings), ping-pong between
# several core pairs, a 1-rank agg loop (one hop through a server against one
# ping-pong), and perf profiles (perf carried in devlib/perf.tar.xz) of the
# 2-rank 4 KiB agg loop and of the emulated cluster at its highest rate.
# Knobs: PF_CLUSTER (1; 0 leaves out the cluster's profile), PF_RATE (16
# Gbit/s, the cluster's links), PF_LAT (1; 0 leaves out the ping-pongs, the
# small all-reduces and their profile), PF_LINES (25 symbols a core). Writes profile.err, perf-lat.txt, perf-cluster.json.
say ""
say "## host facts"
say "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource 2>/dev/null))"
say "model: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
say "siblings: $(for c in 0 1 2 8 14; do printf 'cpu%s:%s ' "$c" "$(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>/dev/null)"; done)"
say "numa nodes: $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l); isolated: $(cat /sys/devices/system/cpu/isolated 2>/dev/null); nohz_full: $(cat /sys/devices/system/cpu/nohz_full 2>/dev/null)"
say ""
if [ "${PF_LAT:-1}" = 1 ]; then
    say "## shm ping-pong 4 KiB between core pairs (half round trip, us)"
    for pair in 14,15 2,8 8,9 2,3 0,8; do
        shm_pingpong "$pair" "$OUT/pingpong-$pair.json" 8,4K
        say "cores $pair: $(python3 "$DEVICE_DIR/summarise.py" p2p-pairs "$OUT/pingpong-$pair.json")"
    done
    say ""
    say "## 2 ranks, agg 4 KiB, busy: lcore 2, ranks (and their rails with TALLY_SHM_RAIL=1) on 8-11 and on 12-15"
    for rc in 8-11 12-15; do
        timeout 120 "$TALLY" bench allreduce --ranks 2 --lcores 2 --cores $rc --poll busy --provider shm --sizes 4K --iters 20000 --warmup 1000 \
            --mode agg,ring 2>>"$OUT/profile.err" | grep -E "^ +(agg|ring)" | sed "s/^/ranks $rc /" | tee -a "$S"
    done
    say "## one hop through a server: agg, 1 rank (core 8), lcore 2, busy, 4 KiB, back-to-back (vs ping-pong round trip cores 2,8)"
    timeout 120 "$TALLY" bench allreduce --ranks 1 --lcores 2 --cores 8,9 --poll busy --provider shm --sizes 4K,64K --iters 20000 --warmup 1000 \
        --mode agg 2>>"$OUT/profile.err" | grep -E "^ +agg" | tee -a "$S"
fi
perf_unpack
if [ -n "$PERF" ] && ! $PERF --version >/dev/null 2>&1; then
    say "perf does not run here: $($PERF --version 2>&1 | head -2)"; PERF=""
fi
[ -n "$PERF" ] || return 0
if [ "${PF_LAT:-1}" = 1 ]; then
    say ""
    say "## perf: 2 ranks (cores 8 and 9; with TALLY_SHM_RAIL=1 cores 8 and 10, their rails 9 and 11), lcore 2, 4 KiB agg loop; cycles by core and symbol"
    perf_during 2 4 "$OUT/perf-lat.data" -F 9999 -C 2,8,9,10,11 -- "$TALLY" bench allreduce --ranks 2 --lcores 2 --cores 8-11 --poll busy \
        --provider shm --sizes 4K --iters 400000 --warmup 1000 --mode agg >"$OUT/perf-lat.txt" 2>>"$OUT/profile.err"
    grep -E "^ +agg" "$OUT/perf-lat.txt" | tee -a "$S"
    for c in 2 8 9; do
        say "core $c:"
        $PERF report -i "$OUT/perf-lat.data" --cpu $c --no-children --sort dso,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -"${PF_LINES:-25}" | tee -a "$S"
    done
fi
if [ "${PF_CLUSTER:-1}" = 1 ]; then
    say ""
    say "## perf: emulated cluster 4 + 4 hosts, ${PF_RATE:-16} Gbit/s, 64 MiB agg; whole machine, 6 s"
    perf_during 6 5 "$OUT/perf-cluster.data" -F 999 -a -- timeout -k 5 200 "$TALLY" bench cluster --hosts 4 --rates "${PF_RATE:-16}" --sizes 64M \
        --iters 200 --mode agg --timeout 150 --json >"$OUT/perf-cluster.json" 2>>"$OUT/profile.err"
    summarise cluster-fractions "$OUT/perf-cluster.json"
    say "by command and object:"
    $PERF report -i "$OUT/perf-cluster.data" --no-children --sort comm,dso --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -25 | tee -a "$S"
    say "by symbol:"
    $PERF report -i "$OUT/perf-cluster.data" --sort dso,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -50 | tee -a "$S"
fi
rm -f "$OUT"/perf-*.data
