#!/usr/bin/env bash
# Core scaling in detail, on a 16+ core host with only the built `tally`
# binary: one server with 1, 2, 4, 8 lcores (busy, pinned), RANKS ranks over
# shm, for each combination of
#   - copy path: shm's default (CMA: the receiver copies with
#     process_vm_readv, taking the other process's mm lock) or
#     FI_SHM_DISABLE_CMA=1 (segmented copies through shared bounce buffers);
#   - size per rank: 64 MiB (streams from DRAM) and 4 MiB (mostly in the LLC);
#   - ranks placed by the scheduler, or pinned to cores of their own;
#   - with PROCS=1: L server processes of one lcore each (the client spreads
#     over servers x lcores the same way), to separate per-process kernel
#     costs (one mm shared by every lcore's CMA traffic) from the lcores';
#   - slab pages (hugepages prefer: THP or hugetlb; off: 4 KiB) and chunk size.
# Prints server input GB/s (ranks x size / time) and the fraction of linear
# (L x the 1-lcore figure of the same row). Output under $OUT.
set -uo pipefail
TALLY="${TALLY:-./target/release/tally}"
OUT="${OUT:-./out}"
RANKS="${RANKS:-8}"
LCORES_LIST="${LCORES_LIST:-1 2 4 8}"
RAW="${RAW:-$OUT}"   # per-run JSON
mkdir -p "$OUT" "$RAW"
S="$OUT/scale-summary.txt"
say() { echo "$@" | tee -a "$S"; }
export TALLY_LOG=warn
say "# core scaling on $(hostname): $(nproc) cores; NUMA: $(cat /sys/devices/system/node/node*/cpulist 2>/dev/null | tr '\n' ' ')"
# Physical cores (first hardware thread of each), from sysfs: lcores take
# the first L physical cores, pinned ranks the physical cores after the
# largest L, so no two busy pollers share a core through SMT.
phys="$(python3 - <<'PY'
import glob, re
seen, firsts = set(), []
for d in sorted(glob.glob('/sys/devices/system/cpu/cpu[0-9]*'), key=lambda p: int(re.findall(r'\d+$', p)[0])):
    try:
        sib = open(d + '/topology/thread_siblings_list').read().strip()
    except OSError:
        continue
    if sib not in seen:
        seen.add(sib); firsts.append(int(re.findall(r'\d+$', d)[0]))
print(' '.join(map(str, firsts)))
PY
)"
read -r -a PHYS <<<"$phys"
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
        env_cma=""; [ "$copy" = nocma ] && env_cma="FI_SHM_DISABLE_CMA=1"
        pin=""; [ "$place" = pinned ] && pin="--cores $rank_cores"
        f="$RAW/scale-$copy-$size-$place-$huge-$chunk-$L.json"
        srv=""; spids=()
        if [ -n "${PROCS:-}" ]; then
            # L server processes of one lcore each instead of one with L lcores.
            for k in $(seq 0 $((L - 1))); do
                env $env_cma "$TALLY" server --listen "127.0.0.1:$((7500 + k))" --lcores "${PHYS[$k]}" --poll busy --provider shm \
                    --hugepages "$huge" --slab-size 256M >"$RAW/srv$k.out" 2>>"$OUT/scale.err" &
                spids+=($!); srv="${srv:+$srv,}127.0.0.1:$((7500 + k))"
            done
            for k in $(seq 0 $((L - 1))); do
                for _ in $(seq 100); do grep -q ready "$RAW/srv$k.out" 2>/dev/null && break; sleep 0.1; done
            done
            srv="--servers $srv"
        fi
        env $env_cma timeout 300 "$TALLY" bench allreduce --mode agg --ranks "$RANKS" --lcores "$(lcores_of "$L")" --poll busy $pin $srv \
            --hugepages "$huge" --sizes "$size" --iters "$iters" --warmup 3 --chunk "$chunk" --window "${WINDOW:-8}" --provider shm --json >"$f" 2>>"$OUT/scale.err" \
            || { say "$copy $size $place L=$L failed: $(tail -2 "$OUT/scale.err" | tr '\n' ' ')"; kill "${spids[@]}" 2>/dev/null; wait 2>/dev/null; continue; }
        if [ ${#spids[@]} -gt 0 ]; then kill "${spids[@]}" 2>/dev/null; wait "${spids[@]}" 2>/dev/null; fi
        line=$(python3 - "$f" "$L" "$RANKS" "${base:-0}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]; L = int(sys.argv[2]); n = int(sys.argv[3]); base = float(sys.argv[4])
thr = n * r["bytes"] / (r["time_us"] * 1e-6) / 1e9
lin = thr / (base * L) if base else 1.0
print(f"{thr:.3f} {L:>6} {r['time_us']/1e3:>9.2f} {thr:>11.2f} {thr/L:>10.2f} {lin:>10.2f} {r['wrong']:>6}")
PY
)
        thr="${line%% *}"; [ -z "$base" ] && base="$thr"
        say "$(printf '%-5s %-5s %-7s %-7s %-5s' "$copy" "$size" "$place" "$huge" "$chunk") ${line#* }"
      done
      done
     done
    done
  done
done
