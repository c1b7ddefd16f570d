# shellcheck shell=bash
# configs (linerate.sh's cluster part): tally bench cluster, LR_HOSTS (4) + as
# many hosts,
# LR_RATES (16,32) Gbit/s, LR_SIZES (16M,64M), agg and ring in every run,
# LR_ROUNDS (2) rounds of LR_CONFIGS alternated ("rails1 rails rails-fo0"):
# rails1 = TALLY_RAILS=1 (one endpoint on the worker's thread, as before
# rails), rails = the default (auto), -fo0 adds TALLY_FAILOVER=0. A config may
# carry more variables after '@' and bench cluster arguments after '+',
# comma-separated (e.g. rails-c256@TALLY_WINDOW=8+--chunk=256K, or
# on+--tcp-autocork=on for the kernel's TCP autocorking, which bench cluster
# turns off in its hosts, and rps+--rps=on for in-order veths). LR_MODES
# (agg,ring), LR_ITERS (bench cluster's default). Writes
# cluster-ROUND-NAME.{json,log}, cluster.err. Each round opens with the
# host's load and pressure (lib.sh host_state). A config's TALLY=path runs
# another build (e.g. the last commit's, beside this one). LR_THREADS=1
# samples every tally thread's CPU during each run (threads.py) into
# threads-ROUND-NAME.txt and says the busiest five. A config with
# TALLY_PIECE_TIMES=1 puts ranks 0 and 1's piece round trips in the summary.
# A config whose name ends -hog runs beside LR_HOG_CORES (8) niced
# single-core copies of 256 MiB on the host's last cores (`membw` says what
# each draws): which settings a memory-bound neighbour costs more. One
# ending -spin runs beside LR_HOG_CORES (8) spinning shell loops, neither
# niced nor pinned: more busy threads than the run's own, as eight rails a
# worker add (does the emulated network's kernel work then starve into
# retransmissions and timeouts?). After
# two rounds or more, each configuration's median over them, its range and
# its ratio to the first configuration's (summarise.py configs_rounds).
say ""
say "## emulated cluster ${LR_HOSTS:-4} + ${LR_HOSTS:-4} hosts, fraction of the link bound (agg: R, ring: R n/2(n-1)), configs alternated"
rounds="${LR_ROUNDS:-2}"
configs="${LR_CONFIGS:-rails1 rails rails-fo0}"
for round in $(seq 1 "$rounds"); do
    say "# round $round, host before it: $(host_state)"
    for cfg in $configs; do
        # name[@VAR=v,VAR=v][+--arg=v,--arg=v]
        name="${cfg%%[@+]*}"
        vars=()
        extra=()
        if [[ "$cfg" == *+* ]]; then IFS=',' read -ra extra <<<"${cfg#*+}"; fi
        body="${cfg%%+*}"
        if [[ "$body" == *@* ]]; then IFS=',' read -ra vars <<<"${body#*@}"; fi
        case "$name" in
            rails1*) vars+=(TALLY_RAILS=1) ;;
        esac
        # -fo0, before any -hog or -spin.
        plain="${name%-hog}"
        [[ "${plain%-spin}" == *-fo0 ]] && vars+=(TALLY_FAILOVER=0)
        j="$OUT/cluster-$round-$name.json"
        vars+=(TALLY_LR_CONFIG="$cfg")
        exe="$TALLY"
        for v in "${vars[@]}"; do [[ "$v" == TALLY=* ]] && exe="${v#TALLY=}"; done
        sampler=""
        if [ "${LR_THREADS:-0}" = 1 ]; then
            python3 "$DEVICE_DIR/threads.py" "$OUT/threads-$round-$name.txt" 1 &
            sampler=$!
        fi
        hogs=()
        if [[ "$name" == *-hog ]]; then
            ncores=$(nproc)
            for c in $(seq $((ncores - ${LR_HOG_CORES:-8})) $((ncores - 1))); do
                nice -n 19 taskset -c "$c" "$exe" bench reduce --dtype f32 --inputs 2 --sizes 256M --reps 1000000 --warmup 0 >/dev/null 2>&1 &
                hogs+=($!)
            done
            sleep 2
        elif [[ "$name" == *-spin ]]; then
            for _ in $(seq 1 "${LR_HOG_CORES:-8}"); do
                bash -c 'while :; do :; done' &
                hogs+=($!)
            done
        fi
        env "${vars[@]}" timeout -k 5 240 "$exe" bench cluster --hosts "${LR_HOSTS:-4}" --rates "${LR_RATES:-16,32}" --sizes "${LR_SIZES:-16M,64M}" \
            ${LR_ITERS:+--iters "$LR_ITERS"} --timeout 120 --mode "${LR_MODES:-agg,ring}" "${extra[@]}" --json --log "$OUT/cluster-$round-$name.log" >"$j" 2>>"$OUT/cluster.err" \
            || { say "FAILED $cfg (round $round)"; mv "$j" "$j.failed"; [ -n "$sampler" ] && kill "$sampler"; [ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}"; continue; }
        if [ ${#hogs[@]} -gt 0 ]; then
            kill "${hogs[@]}"
            wait "${hogs[@]}" 2>/dev/null
        fi
        if [ -n "$sampler" ]; then
            kill "$sampler" && wait "$sampler"
            say "# threads, $cfg r$round (peak % of a core over 1 s windows): $(awk 'NR > 3 && NR <= 8 {printf "%s %s %s; ", $1, $4, $5}' "$OUT/threads-$round-$name.txt")"
        fi
        [ "$round" = 1 ] && [ "$cfg" = "${configs%% *}" ] && say "# placement: $(python3 "$DEVICE_DIR/summarise.py" placement "$j")"
        summarise configs "$j" "$cfg r$round"
        # TALLY_PIECE_TIMES=1 in a config: each client's piece round trips (ranks 0 and 1).
        grep -ohE "rank [01]: piece round trips.*" "$OUT/cluster-$round-$name.log" 2>/dev/null | head -4 | sed "s/^/# $name r$round /" | tee -a "$S"
    done
done
if [ "$rounds" -gt 1 ]; then
    say "# over the rounds: median fraction (range), against the first configuration's median"
    # shellcheck disable=SC2086 # one argument per configuration
    summarise configs-rounds "$OUT" $configs
fi
