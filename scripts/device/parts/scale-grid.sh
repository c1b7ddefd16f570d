# shellcheck shell=bash
# scale-grid: core scaling in detail: one server with LCORES_LIST ("1 2 4 8")
# lcores (busy, pinned), RANKS (8) ranks over shm, for each combination of
#   - copy path (COPIES, "cma nocma"): shm's default (CMA: the receiver copies
#     with process_vm_readv, taking the other process's mm lock) or
#     FI_SHM_DISABLE_CMA=1 (segmented copies through shared bounce buffers);
#   - size per rank (SIZES, "64M 4M"): 64 MiB (streams from DRAM) and 4 MiB
#     (mostly in the LLC);
#   - ranks placed by the scheduler, or pinned to cores of their own (PLACES,
#     "sched pinned");
#   - with PROCS=1: L server processes of one lcore each (the client spreads
#     over servers x lcores the same way), to separate per-process kernel
#     costs (one mm shared by every lcore's CMA traffic) from the lcores';
#   - slab pages (HUGES, "prefer": THP or hugetlb; off: 4 KiB) and chunk size
#     (CHUNKS, "256K"); WINDOW (8).
# Prints server input GB/s (ranks x size / time) and the fraction of linear
# (L x the 1-lcore figure of the same row). Writes RAW/scale-*.json (RAW
# defaults to OUT), scale.err. (The session's scale part is the quick one:
# one configuration beside the p2p ceiling.)
RANKS="${RANKS:-8}"
LCORES_LIST="${LCORES_LIST:-1 2 4 8}"
RAW="${RAW:-$OUT}"
mkdir -p "$RAW"
say "# core scaling on $(hostname): $(nproc) cores; NUMA: $(cat /sys/devices/system/node/node*/cpulist 2>/dev/null | tr '\n' ' ')"
# Physical cores (first hardware thread of each), from sysfs: lcores take
# the first L physical cores, pinned ranks the physical cores after the
# largest L, so no two busy pollers share a core through SMT.
read -r -a PHYS <<<"$(probe phys-cores)"
say "# $(nproc) cpus, ${#PHYS[@]} physical cores; SMT siblings of cpu0: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null)"
maxl=0; for L in $LCORES_LIST; do [ "$L" -gt "$maxl" ] && maxl=$L; done
lcores_of() { local IFS=,; echo "${PHYS[*]:0:$1}"; }
rank_cores="$(IFS=,; echo "${PHYS[*]:$maxl}")"
[ -n "$rank_cores" ] || rank_cores="$maxl-$(($(nproc) - 1))"
say "# lcores on physical cores $(lcores_of "$maxl"); pinned ranks: --cores $rank_cores; window ${WINDOW:-8}"
say "copy  size  ranks   pages   chunk  lcores  time(ms)  input GB/s  per-lcore  vs-linear  wrong"
for copy in ${COPIES:-cma nocma}; do
  for size in ${SIZES:-64M 4M}; do
    for place in ${PLACES:-sched pinned}; do
     for huge in ${HUGES:-prefer}; do
      for chunk in ${CHUNKS:-256K}; do
      base=""
      for L in $LCORES_LIST; do
        iters=10; [ "$size" = 4M ] && iters=100
        env_cma=(); [ "$copy" = nocma ] && env_cma=(FI_SHM_DISABLE_CMA=1)
        pin=(); [ "$place" = pinned ] && pin=(--cores "$rank_cores")
        f="$RAW/scale-$copy-$size-$place-$huge-$chunk-$L.json"
        srv=(); spids=()
        if [ -n "${PROCS:-}" ]; then
            # L server processes of one lcore each instead of one with L lcores.
            addrs=""
            for k in $(seq 0 $((L - 1))); do
                env "${env_cma[@]}" "$TALLY" server --listen "127.0.0.1:$((7500 + k))" --lcores "${PHYS[$k]}" --poll busy --provider shm \
                    --hugepages "$huge" --slab-size 256M >"$RAW/srv$k.out" 2>>"$OUT/scale.err" &
                spids+=($!); addrs="${addrs:+$addrs,}127.0.0.1:$((7500 + k))"
            done
            for k in $(seq 0 $((L - 1))); do wait_ready "$RAW/srv$k.out"; done
            srv=(--servers "$addrs")
        fi
        env "${env_cma[@]}" timeout 300 "$TALLY" bench allreduce --mode agg --ranks "$RANKS" --lcores "$(lcores_of "$L")" --poll busy "${pin[@]}" "${srv[@]}" \
            --hugepages "$huge" --sizes "$size" --iters "$iters" --warmup 3 --chunk "$chunk" --window "${WINDOW:-8}" --provider shm --json >"$f" 2>>"$OUT/scale.err" \
            || { say "$copy $size $place L=$L failed: $(tail -2 "$OUT/scale.err" | tr '\n' ' ')"; kill "${spids[@]}" 2>/dev/null; wait 2>/dev/null; continue; }
        if [ ${#spids[@]} -gt 0 ]; then kill "${spids[@]}" 2>/dev/null; wait "${spids[@]}" 2>/dev/null; fi
        line=$(python3 "$DEVICE_DIR/summarise.py" scale-grid "$f" "$L" "$RANKS" "${base:-0}")
        thr="${line%% *}"; [ -z "$base" ] && base="$thr"
        say "$(printf '%-5s %-5s %-7s %-7s %-5s' "$copy" "$size" "$place" "$huge" "$chunk") ${line#* }"
      done
      done
     done
    done
  done
done
