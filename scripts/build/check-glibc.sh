#!/usr/bin/env bash
# Fails when a binary needs a newer glibc than the floor tally promises.
#
#   scripts/build/check-glibc.sh [--floor 2.28] FILE...
#
# Reads each ELF file's dynamic symbol versions (objdump -T) and its version
# needs (the GLIBC_x.y each needed library must provide), takes the highest
# GLIBC_ version, and compares it with the floor: glibc 2.28 covers Amazon
# Linux 2023 (2.34), Ubuntu 20.04 (2.31), Debian 10 (2.28) and RHEL 8 (2.28).
# Prints one line per file; above the floor it names the symbols that need
# more, and the exit status is 1.
set -euo pipefail

FLOOR=2.28
if [[ "${1:-}" == "--floor" ]]; then
    FLOOR="$2"
    shift 2
fi
[[ $# -gt 0 ]] || { echo "usage: $0 [--floor X.Y] FILE..." >&2; exit 2; }
command -v objdump >/dev/null || { echo "check-glibc: objdump not found (binutils)" >&2; exit 2; }

# newer A B: A is a newer version than B.
newer() { [[ "$1" != "$2" && "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -1)" == "$1" ]]; }

status=0
for f in "$@"; do
    [[ -f "$f" ]] || { echo "check-glibc: $f: no such file" >&2; status=1; continue; }
    versions="$( { objdump -T "$f"; objdump -p "$f"; } 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV)"
    [[ -n "$versions" ]] || { echo "check-glibc: $f: no GLIBC symbol versions (not a dynamic glibc binary?)" >&2; status=1; continue; }
    top="$(tail -1 <<<"$versions")"
    if newer "$top" "$FLOOR"; then
        status=1
        echo "check-glibc: $f needs GLIBC_$top, above the floor $FLOOR; symbols that need more than $FLOOR:" >&2
        objdump -T "$f" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /GLIBC_[0-9]/) { v = $i; gsub(/[()]/, "", v); print v, $NF } }' |
            sed 's/^GLIBC_//' | while read -r v sym; do newer "$v" "$FLOOR" && echo "    $sym (GLIBC_$v)"; done | sort -u | head -20 >&2
    else
        echo "check-glibc: $f: highest GLIBC_$top <= $FLOOR ok"
    fi
done
exit "$status"
