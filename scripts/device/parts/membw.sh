# shellcheck shell=bash
# membw (linerate.sh): the host's memory bandwidth as tally's copies meet
# it: k single-core copies at once (`tally bench reduce`'s memcpy of 256 MiB,
# each pinned to its own core, k in LR_MEMBW_K, "1 8 16 32 48"), the sum
# and the share of one. A copy of a staged result, the kernel's socket
# copies and the servers' reduce all draw on it; hosts that differ here may
# differ in everything else. Writes membw-K/ (each copy's output).
say ""
say "## memory bandwidth: k single-core memcpy of 256 MiB at once, bytes moved (read + write), GB/s"
for k in ${LR_MEMBW_K:-1 8 16 32 48}; do
    d="$OUT/membw-$k"
    mkdir -p "$d"
    for i in $(seq 0 $((k - 1))); do
        taskset -c "$i" "$TALLY" bench reduce --dtype f32 --inputs 2 --sizes 256M --reps 30 --warmup 2 >"$d/$i.txt" 2>/dev/null &
    done
    wait
    awk -v k="$k" '/memcpy .* GB\/s copied/ { for (i = 1; i <= NF; i++) if ($i == "copied,") { s += $(i + 1); n++ } }
        END { if (n) printf "k=%d: %d copies, %.1f GB/s in all, %.1f each\n", k, n, s, s / n; else printf "k=%d: no figure\n", k }' "$d"/*.txt | tee -a "$S"
done
