# Set-up shared by the scripts in tests/nccl (sourced, not run): $here (the
# calling script's folder), $root (the checkout), $PYTHON, first_existing,
# $PLUGIN / $TALLY_BIN (default: this checkout's release build, else the
# files next to the script, as in a tarball), use_out (creates $OUT, made
# absolute) and stop_server (ends the tally server in $server_pid, if any).
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
root=$(cd "$here/../.." && pwd)
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

use_out() {
    OUT=${OUT:-./out}
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
}

server_pid=""
stop_server() {
    if [ -n "$server_pid" ]; then
        kill -TERM "$server_pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$server_pid" 2>/dev/null
        wait "$server_pid" 2>/dev/null
        server_pid=""
    fi
}
