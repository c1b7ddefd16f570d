# shellcheck shell=bash
# demo: `tally demo` as a user runs it; its whole output into the summary.
# Writes demo/ (its plots), demo.txt, demo.err.
say ""
say "## tally demo"
timeout 300 "$TALLY" demo --out "$OUT/demo" >"$OUT/demo.txt" 2>>"$OUT/demo.err"
say "exit $?"
# The figures first, then the whole output.
grep -E "^ +(0\.|[0-9]+ )|agg reaches|verified|Part" "$OUT/demo.txt" >>"$S"
cat "$OUT/demo.txt" >>"$S"
