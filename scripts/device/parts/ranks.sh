# shellcheck shell=bash
# ranks: many ranks (issue 18): one server (lcores 0-3, tcp, adaptive), 8 and
# then 1024 ranks (threads, 64 per process, on the other cores), 4 KiB and
# 1 MiB, every element checked: p50, the time from the bench's start to the
# job running, and the server's threads and VmRSS (sampled every 0.2 s, the
# highest seen). Writes ranksN.{json,err}, ranks-serverN.{out,log}, ranks-peakN.
say ""
say "## many ranks: one server (lcores 0-3, tcp, adaptive), ranks on cores 4-$((C-1)), window 2, 4 KiB and 1 MiB, 20 iterations"
for n in 8 1024; do
    TALLY_LOG=info "$TALLY" server --listen 127.0.0.1:7480 --lcores 0-3 --provider tcp --poll adaptive \
        >"$OUT/ranks-server$n.out" 2>"$OUT/ranks-server$n.log" &
    spid=$!
    wait_ready "$OUT/ranks-server$n.out"
    ( peak_t=0; peak_r=0
      while kill -0 "$spid" 2>/dev/null; do
          t=$(awk '/^Threads:/ {print $2}' "/proc/$spid/status" 2>/dev/null || echo 0)
          r=$(awk '/^VmRSS:/ {print $2}' "/proc/$spid/status" 2>/dev/null || echo 0)
          [ "${t:-0}" -gt "$peak_t" ] && peak_t=$t; [ "${r:-0}" -gt "$peak_r" ] && peak_r=$r
          echo "$peak_t $peak_r" >"$OUT/ranks-peak$n"; sleep 0.2
      done ) &
    sampler=$!
    t0=$(date +%s.%N)
    timeout -k 5 400 taskset -c 4-$((C-1)) "$TALLY" bench allreduce --servers 127.0.0.1:7480 --provider tcp --ranks "$n" \
        --mode agg --sizes 4K,1M --iters 20 --warmup 2 --window 2 --json >"$OUT/ranks$n.json" 2>"$OUT/ranks$n.err"
    rc=$?
    t1=$(date +%s.%N)
    sleep 0.5
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    summarise ranks "$n" "$rc" "$t0" "$t1" "$OUT/ranks$n.json" "$OUT/ranks-server$n.log" "$OUT/ranks-peak$n"
done
