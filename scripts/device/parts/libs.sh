# shellcheck shell=bash
# libs (linerate.sh): the configs part (linerate.sh cluster) once per
# libfabric in LR_LIBS (folders put first on LD_LIBRARY_PATH; "system": the
# host's own, found by leaving devlib's libfabric out), configs LR_LIB_CONFIGS
# ("rails rails1"). Writes lib-NAME/ (that run's summary and details).
say ""
say "## libfabric builds side by side (LR_LIBS: folders put first on LD_LIBRARY_PATH; 'system' = the host's own libfabric)"
# devlib's libraries without its libfabric: what every build below needs beside its own.
rest="$OUT/lib-nofabric"
mkdir -p "$rest" && cp "$DEVLIB"/lib/* "$rest"/ && rm -f "$rest"/libfabric.so*
for lib in ${LR_LIBS:-system}; do
    dir="$lib:$rest"
    [ "$lib" = system ] && dir="$rest"
    v=$(LD_LIBRARY_PATH="$dir" ldd "$TALLY" | awk '/libfabric/ {print $3}')
    say "# $lib: $v, libfabric $(LD_LIBRARY_PATH="$dir" fabric_version)"
    OUT2="$OUT/lib-$(basename "$lib")"
    mkdir -p "$OUT2"
    LD_LIBRARY_PATH="$dir" OUT="$OUT2" LR_ROUNDS=1 LR_CONFIGS="${LR_LIB_CONFIGS:-rails rails1}" bash "$DEVICE_DIR/linerate.sh" cluster >/dev/null 2>&1
    sed -n '/configs alternated/,$p' "$OUT2/summary.txt" | grep -v '^#' | grep -v configs | sed "s|^|$(basename "$lib") |" | tee -a "$S"
done
