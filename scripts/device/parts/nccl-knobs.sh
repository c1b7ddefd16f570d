# shellcheck shell=bash
# nccl-knobs (linerate.sh): NCCL modes LR_NCCL_KNOB_MODES (collnet: forced),
# LR_NCCL_KNOB_DTYPES (f32), LR_NCCL_KNOB_SIZES (16M,64M), at LR_NCCL_RATE (32) Gbit/s and half,
# once per setting in LR_NCCL_KNOBS (space separated, name@VAR=v,VAR=v;
# "base" alone for the defaults; a knob's own MODES, SIZES, DTYPES or HALF=0
# (32 Gbit/s only) win), each line with the channels NCCL used and the
# machine's CPU over each timed loop; a knob with TALLY_PIECE_TIMES=1 adds
# the plugin's piece round trips.
# Writes knob-NAME/ (cluster_proof.sh's files) and knob-NAME.out.
say ""
say "## NCCL ${LR_NCCL_KNOB_MODES:-collnet} (collnet: forced), ${LR_NCCL_KNOB_DTYPES:-f32}, at ${LR_NCCL_RATE:-32} Gbit/s and half, one setting at a time"
for knob in ${LR_NCCL_KNOBS:-base}; do
    name="${knob%%@*}" vars=()
    [[ "$knob" == *@* ]] && IFS=',' read -ra vars <<<"${knob#*@}"
    o="$OUT/knob-$name"
    cluster_proof "$o" 120 MODES="${LR_NCCL_KNOB_MODES:-collnet}" SIZES="${LR_NCCL_KNOB_SIZES:-16M,64M}" DTYPES="${LR_NCCL_KNOB_DTYPES:-f32}" "${vars[@]}"
    rc=$?
    ch=$(grep -ohE "[0-9]+ coll channels, [0-9]+ collnet channels" "$o"/*.nccl.*.log 2>/dev/null | sort -u | paste -sd/)
    summarise nccl-knobs "$o" "$knob" "$rc" "$ch"
    # A knob with TALLY_PIECE_TIMES=1: the plugin's piece round trips, logged
    # when NCCL closes its CollNet communicators (two ranks' lines).
    grep -ohE "CollNet rank [0-9]+: piece round trips.*" "$o"/*.nccl.*.log 2>/dev/null | head -2 | sed "s/^/# $name /" | tee -a "$S"
done
