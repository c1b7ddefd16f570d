# shellcheck shell=bash
# nccl and nccl-sync (linerate.sh): real NCCL on the host's GPUs
# (tests/nccl/cluster_proof.sh) at LR_NCCL_RATE (32) Gbit/s and half.
#   nccl       LR_NCCL_SIZES (16M,64M,256M), f32 and bf16, cluster_proof.sh's
#              default modes (NCCL's Socket ring at its defaults and, at
#              LR_NCCL_RATE only, tuned: TUNED_RINGS, "2x8 4x4 8x2", empty for
#              none; the ring over tally; CollNet forced and auto), timed as
#              measuring.md says (back to back), each rank's CPU over the
#              loop and IDLE_S (1) s idle after it.
#   nccl-sync  the same timed the old way (a synchronize around every
#              all-reduce, PER_OP_SYNC=1), ring over Socket and CollNet, f32,
#              LR_NCCL_SYNC_SIZES (16M): what the ranks' launch skew costs.
# LR_STALLS=1: stalls.py samples every tally and Python thread meanwhile
# (which were kept off a CPU, how long), into PART-stalls.txt, its busiest
# threads into the summary.
# LR_LINKS=1: links.py samples every emulated host's eth0 and TCP sockets
# meanwhile (PART-links.csv.gz, a timeline with wall-clock times), its
# hosts whose senders stalled or timed out into the summary.
# Writes PART/ (cluster_proof.sh's files) and PART.out.
case $PART in
    nccl) args=(SIZES="${LR_NCCL_SIZES:-16M,64M,256M}" "DTYPES=f32,bf16") ;;
    nccl-sync) args=(PER_OP_SYNC=1 SIZES="${LR_NCCL_SYNC_SIZES:-16M}" DTYPES=f32 MODES="ring-socket collnet") ;;
esac
o="$OUT/$PART"
say ""
say "## $PART: real NCCL, tests/nccl/cluster_proof.sh ${args[*]}"
[ "${LR_STALLS:-0}" = 1 ] && { python3 "$DEVICE_DIR/stalls.py" "$o-stalls.txt" 10 & stalls=$!; }
[ "${LR_LINKS:-0}" = 1 ] && { python3 "$DEVICE_DIR/links.py" "$o-links" 10 & links=$!; }
cluster_proof "$o" 240 "${args[@]}"
say "# exit $?"
if [ -n "${links:-}" ]; then
    kill "$links" && wait "$links"
    # Hosts whose sockets held data while their uplink sent nothing for 30 ms or more, or that timed out.
    # And every run's TCP counters, summed over its hosts.
    awk '!/^#/ && ($5 >= 30 || $10 > 0) || NR <= 2 || /^# run /' "$o-links.txt" | head -40 | sed 's/^/# links /' | tee -a "$S"
fi
if [ -n "${stalls:-}" ]; then
    kill "$stalls" && wait "$stalls"
    # Threads of a tenth of a core or more, the longest waits for a CPU first.
    awk 'NR <= 3 || $5 >= 10' "$o-stalls.txt" | head -30 | sed 's/^/# stalls /' | tee -a "$S"
fi
sed -n '/^=== table/,/^=== proof/p' "$o/summary.txt" | grep -v '^=== proof' | tee -a "$S"
sed -n '/^=== verdicts/,$p' "$o/summary.txt" | tee -a "$S"
grep -h "algorithm per size" -A4 "$o/summary.txt" | head -20 >>"$S"
for f in "$o"/*-"${LR_NCCL_RATE:-32}".nccl.*.log; do
    [ -e "$f" ] || continue
    echo "$(basename "$f" | cut -d. -f1): $(grep -ohE "[0-9]+ coll channels, [0-9]+ collnet channels|NCCL defaults set.*" "$f" | sort -u | paste -sd';')"
done | sort -u | tee -a "$S"
# Timed loops whose slowest operation took more than twice the median: each
# operation in loop order (which one is slow), and what the servers' job-end
# lines say of the rounds of each CollNet run (a late rank's piece).
summarise slow-ops "$o"
for f in "$o"/collnet*.tally.log; do
    [ -e "$f" ] || continue
    grep -h "rounds, first piece in" "$f" | sed -E "s/^(\[server [0-9]+\]).*: ([0-9]+ rounds)/# $(basename "$f" .tally.log) \1 \2/" | tee -a "$S"
done
