# Set-up shared by the NCCL proof scripts (sourced, not run): $here (the
# calling script's folder), $root (the checkout), $OUT (created, absolute),
# $PYTHON, first_existing, and $PLUGIN / $TALLY_BIN (default: this
# checkout's release build, else the files next to the script, as in a
# tarball).
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
root=$(cd "$here/../.." && pwd)
OUT=${OUT:-./out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PYTHON=${PYTHON:-python3}

first_existing() {
    for f in "$@"; do
        if [ -e "$f" ]; then
            readlink -f "$f"
            return 0
        fi
    done
    return 1
}
PLUGIN=${PLUGIN:-$(first_existing "$root/target/release/libnccl-net-tally.so" "$here/libnccl-net-tally.so" || echo missing)}
TALLY_BIN=${TALLY_BIN:-$(first_existing "$root/target/release/tally" "$here/tally" || echo missing)}
