# shellcheck shell=bash
# nccl-perf (linerate.sh): perf (devlib/perf.tar.xz) of the whole host
# while real NCCL runs CollNet (forced) at LR_NCCL_RATE (32) Gbit/s: f32,
# LR_NCCL_PERF_SIZE (64M), LR_NCCL_PERF_ITERS (1000) all-reduces, recorded
# for 4 s from LR_PERF_AFTER (20) seconds in (past the testbed's set-up and
# NCCL's init; the half-rate run follows). Self time by thread and symbol:
# which of NCCL's proxy, the plugin's rails and the servers' lcores is busy.
# Writes nccl-perf/ (cluster_proof.sh's files), nccl-perf.data.
say ""
say "## perf of the host during real NCCL CollNet at ${LR_NCCL_RATE:-32} Gbit/s, self time by thread and symbol"
perf_unpack || { say "no $DEVLIB/perf.tar.xz"; return 0; }
perf_during "${LR_PERF_AFTER:-20}" 4 "$OUT/nccl-perf.data" -a -g -F 499 -- \
    cluster_proof "$OUT/nccl-perf" 300 MODES=collnet SIZES="${LR_NCCL_PERF_SIZE:-64M}" DTYPES=f32 ITERS="${LR_NCCL_PERF_ITERS:-1000}"
sed -n '/^=== table/,/^=== proof/p' "$OUT/nccl-perf/summary.txt" | grep -v '^=== proof' | tee -a "$S"
$PERF report -i "$OUT/nccl-perf.data" --stdio --no-children -g none --sort comm,symbol --percent-limit 0.7 2>/dev/null | grep -v '^#' | grep -v '^$' | head -45 | tee -a "$S"
