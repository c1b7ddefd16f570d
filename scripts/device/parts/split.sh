# shellcheck shell=bash
# split: small all-reduces split by rank over lcores, alternated beside the
# ring: SP_ROUNDS (4) rounds of SP_CASES ("4:2-3 8:2-3 8:2-5", ranks:server
# lcores), 4 KiB, SP_ITERS (10000) back-to-back, shm, busy: mean, p50, p99,
# p99/p50, agg/ring. SP_MODES ("split whole"): split by rank (TALLY_SPLIT=1),
# whole on one lcore per operation (TALLY_SPLIT=0). SP_LIBS (library folders
# put first on LD_LIBRARY_PATH, one pass each inside every round; default the
# inherited path). A mode may end in @VAR=value,VAR=value: variables for its
# runs (e.g. split@TALLY_MIN_PIECE=2K). Writes split-*.json, split.err.
say ""
say "## split small all-reduces, modes alternated (split: TALLY_SPLIT=1; whole: TALLY_SPLIT=0); shm, busy, ranks on 8-15"
say "## 4 KiB, ${SP_ITERS:-10000} back-to-back; the ring in the same round and library; ratio = agg mean / ring mean"
say "$(printf '%5s %6s %7s %-22s %-8s | %9s %9s %9s %7s %7s %6s' round ranks lcores lib mode 'mean us' 'p50 us' 'p99 us' p99/p50 ratio wrong)"
base_ld="${LD_LIBRARY_PATH:-}"
for round in $(seq "${SP_ROUNDS:-4}"); do
    for lib in ${SP_LIBS:-inherited}; do
        ld="$base_ld"; [ "$lib" != inherited ] && ld="$PWD/$lib:$base_ld"
        for nl in ${SP_CASES:-4:2-3 8:2-3 8:2-5}; do
            n=${nl%%:*}; lc=${nl#*:}; tag="$round-$(basename "$lib")-$n-$lc"
            ring="$OUT/split-$tag-ring.json"
            LD_LIBRARY_PATH="$ld" timeout 60 "$TALLY" bench allreduce --ranks "$n" --lcores 2 --cores 8-15 --poll busy --provider shm \
                --sizes 4K --iters "${SP_ITERS:-10000}" --warmup 300 --mode ring --json >"$ring" 2>>"$OUT/split.err"
            for mode in ${SP_MODES:-split whole}; do
                case ${mode%%@*} in
                    split) env=(TALLY_SPLIT=1) ;;
                    *) env=(TALLY_SPLIT=0) ;;
                esac
                # MODE@VAR=value,VAR=value: more variables for that run.
                [[ $mode == *@* ]] && IFS=, read -ra more <<<"${mode#*@}" && env+=("${more[@]}")
                env LD_LIBRARY_PATH="$ld" "${env[@]}" timeout 60 "$TALLY" bench allreduce --ranks "$n" --lcores "$lc" --cores 8-15 --poll busy --provider shm \
                    --sizes 4K --iters "${SP_ITERS:-10000}" --warmup 300 --mode agg --json >"$OUT/split-$tag-$mode.json" 2>>"$OUT/split.err"
                summarise split "$OUT/split-$tag-$mode.json" "$ring" "$round" "$n" "$lc" "$(basename "$lib")" "$mode"
            done
            # The ring's own row (its ratio to itself is 1).
            summarise split "$ring" "$ring" "$round" "$n" "$lc" "$(basename "$lib")" ring
        done
    done
done
