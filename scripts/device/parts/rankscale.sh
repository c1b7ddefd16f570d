# shellcheck shell=bash
# rankscale: issue 18's target, throughput per lcore with many ranks: one
# server (lcores 0-3, tcp, adaptive), ranks (threads above 64) on the other
# cores; 8 ranks against 1024 at the same total bytes per operation (8 x 64 MiB
# against 1024 x 512 KiB), once with the default chunk (the server shrinks
# 1024 ranks' pieces to fit its slab budget) and once with every run at the
# piece 1024 ranks get (32 KiB: the same number of messages). Figure: server
# input GB/s per lcore = ranks x bytes per rank / time (loop mean) / lcores,
# and its ratio to 8 ranks' (issue 18 asks >= 0.8). Each pair is run twice
# (8, N, 8, N) so the spread shows. Knobs (to shrink it on a small host):
# RS_LCORES (0-3), RS_RANKS ("8 1024", the first is the baseline; RANKS:WINDOW
# sets one count's window), RS_TOTAL (512M), RS_PIECE (32K), RS_WINDOW (2),
# RS_ITERS (10), RS_REPEAT (2), RS_SLAB (256M), RS_CASES ("chunk piece"),
# RS_DTYPE (f32; bf16 etc.), RS_LIBS (library folders put first on
# LD_LIBRARY_PATH, one pass each, e.g. "devlib/lib devlib/libfabric-1.22":
# libfabric builds side by side; default the inherited path only; ",VAR=value"
# after a folder sets variables for that pass; RPS=1 there steers loopback's
# receive processing to the ranks' cores, STAGE=N gives the server
# --stage-buffers N), RS_PERF (1: perf profile of the lcores in each run, from
# devlib/perf.tar.xz). Writes rs*.json, rs-server*.{out,log}, rs-cpu*,
# rs-perf*.txt.
RS_LCORES="${RS_LCORES:-0-3}"; RS_RANKS="${RS_RANKS:-8 1024}"; RS_TOTAL="${RS_TOTAL:-512M}"
RS_PIECE="${RS_PIECE:-32K}"; RS_WINDOW="${RS_WINDOW:-2}"; RS_ITERS="${RS_ITERS:-10}"
RS_REPEAT="${RS_REPEAT:-2}"; RS_SLAB="${RS_SLAB:-256M}"; RS_CASES="${RS_CASES:-chunk piece}"; RS_LIBS="${RS_LIBS:--}"
LD0="${LD_LIBRARY_PATH:-}"
L=$(( ${RS_LCORES#*-} - ${RS_LCORES%-*} + 1 ))
# Ranks on the cores the lcores leave; a host with no others shares them.
if [ "$C" -gt $(( ${RS_LCORES#*-} + 1 )) ]; then RCORES="$(( ${RS_LCORES#*-} + 1 ))-$((C-1))"; else RCORES="0-$((C-1))"; fi
total=$(numfmt --from=iec "$RS_TOTAL")
say ""
say "## rank scaling (issue 18): one server (lcores $RS_LCORES, tcp, adaptive, slab $RS_SLAB), ranks on cores $RCORES;"
say "## $RS_TOTAL in per operation (ranks x size), window $RS_WINDOW, $RS_ITERS back-to-back all-reduces after 2 warm-up, every element checked;"
say "## per-lcore GB/s = ranks x size / loop mean / $L lcores; ratio = against the first rank count's of the same case and round"
say "## lc cpu = cores the lcore threads used while bytes came in (of $L; well below $L: the ranks, not the server, set the figure);"
say "## rk cpu = busy cores among the ranks' cores $RCORES over the same span (near all of them: the load generator is the limit)"
say "$(printf '%5s %6s %8s %9s %9s %10s %9s %8s %7s %7s %6s %6s %s' round case ranks/win size piece 'mean ms' 'GB/s/lc' ratio 'lc cpu' 'rk cpu' wrong exit libfabric)"
# PERF set: RS_PERF asked for profiles and devlib carries perf.
PERF=""; [ -n "${RS_PERF:-}" ] && perf_unpack
port=7481
for round in $(seq "$RS_REPEAT"); do
    for case in $RS_CASES; do
      for entry in $RS_LIBS; do
        lib="${entry%%,*}"; extra=""; [ "$entry" != "$lib" ] && extra="${entry#*,}"
        LD_LIBRARY_PATH="$LD0"; [ "$lib" = - ] || LD_LIBRARY_PATH="$(realpath "$lib")${LD0:+:$LD0}"
        export LD_LIBRARY_PATH
        for kv in ${extra//,/ }; do export "${kv?}"; done
        # RPS=1 among a pass's variables: loopback's receive processing
        # (the TCP input path, waking the reader) runs on the ranks'
        # cores, as a NIC's would run off the sender's, instead of inside
        # the sender's send; left alone, lcores pay for the ranks' side.
        rps=/sys/class/net/lo/queues/rx-0/rps_cpus
        if [ "${RPS:-0}" = 1 ] && [ -w "$rps" ]; then
            rps0=$(cat "$rps"); m=0; for c in $(seq "${RCORES%-*}" "${RCORES#*-}"); do m=$(( m | 1 << c )); done
            printf '%x' "$m" >"$rps"
        fi
        libv="libfabric-$(fabric_version)"; [ "$libv" = libfabric- ] && libv="libfabric-?"
        libv="$libv${extra:+,$extra}"
        for nw in $RS_RANKS; do
            # RANKS:WINDOW gives that rank count its own window.
            n=${nw%%:*}; w=${nw#*:}; [ "$w" = "$nw" ] && w=$RS_WINDOW
            size=$(( total / n ))
            chunk=256K; [ "$case" = piece ] && chunk=$RS_PIECE
            tag="$round-$case-$libv-$n-w$w"
            TALLY_LOG=info "$TALLY" server --listen 127.0.0.1:$port --lcores "$RS_LCORES" --provider tcp --poll adaptive \
                ${STAGE:+--stage-buffers "$STAGE"} --slab-size "$RS_SLAB" --metrics 127.0.0.1:$((port + 100)) >"$OUT/rs-server$tag.out" 2>"$OUT/rs-server$tag.log" &
            spid=$!
            wait_ready "$OUT/rs-server$tag.out"
            probe lcore-sampler "$spid" "$((port + 100))" "$RCORES" >"$OUT/rs-cpu$tag" 2>/dev/null &
            sampler=$!
            timeout -k 5 500 taskset -c "$RCORES" "$TALLY" bench allreduce --servers 127.0.0.1:$port --provider tcp --ranks "$n" \
                --mode agg --dtype "${RS_DTYPE:-f32}" --sizes "$size" --chunk "$chunk" --window "$w" --iters "$RS_ITERS" --warmup 2 --json \
                >"$OUT/rs$tag.json" 2>"$OUT/rs$tag.err" &
            bpid=$!
            if [ -n "${PERF:-}" ]; then
                # RS_PERF=1: the lcores' profile once bytes flow (the
                # second half of the run's expected span).
                for _ in $(seq 600); do [ "$(wc -l <"$OUT/rs-cpu$tag" 2>/dev/null || echo 0)" -gt 2 ] && \
                    awk 'NR > 1 && $3 > p {f = 1} {p = $3} END {exit !f}' "$OUT/rs-cpu$tag" && break; sleep 0.1; done
                $PERF record -F 1999 -C "$RS_LCORES" -o "$OUT/rs-perf$tag.data" -- sleep 3 >/dev/null 2>>"$OUT/rs-perf.err"
                $PERF report -i "$OUT/rs-perf$tag.data" --no-children --sort dso --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -8 >"$OUT/rs-perf$tag.txt"
                $PERF report -i "$OUT/rs-perf$tag.data" --no-children --sort dso,sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -30 >>"$OUT/rs-perf$tag.txt"
                rm -f "$OUT/rs-perf$tag.data"
            fi
            wait "$bpid"
            rc=$?
            kill "$spid" 2>/dev/null; wait "$spid" "$sampler" 2>/dev/null
            port=$((port + 1))
            summarise rankscale "$round" "$case" "$n:$w" "$L" "$rc" "$OUT/rs$tag.json" "$OUT/rs-server$tag.log" "$OUT/rs-base-$round-$case-$libv" "$OUT/rs-cpu$tag" "$libv"
        done
        [ -n "${rps0:-}" ] && { echo "$rps0" >"$rps"; rps0=""; }
        for kv in ${extra//,/ }; do unset "${kv%%=*}"; done
      done
    done
done
export LD_LIBRARY_PATH="$LD0"
for f in "$OUT"/rs-perf*.txt; do
    [ -f "$f" ] || continue
    say ""; say "## lcore profile (perf, self time by library, then by symbol): $(basename "$f" .txt)"; head -28 "$f" | tee -a "$S"
done
