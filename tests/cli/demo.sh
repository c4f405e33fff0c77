#!/usr/bin/env bash
# `laga` without arguments runs the demo: exit 0, a table per layout with a row for every form (and the
# absorbed and recompute variants) under both kernels (p2p: explicit and laga, fused), every error within
# float32's 1e-5 bar.
# `laga --help` lists the demo and run subcommands. Usage: bash demo.sh <path-to-laga>
set -u
LAGA=${1:?usage: demo.sh <path-to-laga>}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

rc=0
"$LAGA" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -eq 0 ] || fail "laga (demo) exit code $rc, expected 0; stderr: $(cat "$TMP/err")"

for layout in a2a all_gather p2p; do
  grep -qE "^layout $layout:" "$TMP/out" || fail "demo output has no table for layout $layout"
done
# Each row label appears once per kernel per layout (the ring, p2p: explicit and laga, fused only).
for label in "explicit" "absorbed \(mqa\)" "absorbed \(expanded\)" "laga" "laga \+recompute kv"; do
  for kernel in eager fused; do
    want=2
    [ "$kernel" = fused ] && { [ "$label" = explicit ] || [ "$label" = laga ]; } && want=3
    n=$(grep -cE "^$label +$kernel " "$TMP/out")
    [ "$n" -eq "$want" ] || fail "demo: $n rows for '$label' with kernel $kernel, expected $want (one per layout)"
  done
done
# The error columns (the first two numbers in e-notation of each row) are within 1e-5.
bad=$(grep -E "^(explicit|absorbed|laga)[^:]* (eager|fused) " "$TMP/out" | awk '{
  n = 0
  for (i = 1; i <= NF && n < 2; ++i)
    if ($i ~ /^[0-9]\.[0-9]+e[-+][0-9]+$/) { ++n; if ($i + 0 > 1e-5) print $0 }
  if (n < 2) print "no error columns: " $0
}')
[ -z "$bad" ] || fail "demo rows with an error above 1e-5 or without error columns:
$bad"
rows=$(grep -cE "^(explicit|absorbed|laga)[^:]* (eager|fused) " "$TMP/out")
[ "$rows" -eq 22 ] || fail "demo printed $rows form rows, expected 22 (5 variants x 2 kernels x 2 layouts, and p2p's 2)"

# `laga demo` with options is the same command.
rc=0
"$LAGA" demo --model tiny --seq 32 --sp 2 >"$TMP/out2" 2>"$TMP/err2" || rc=$?
[ "$rc" -eq 0 ] || fail "laga demo --model tiny --seq 32 --sp 2: exit code $rc; stderr: $(cat "$TMP/err2")"
grep -q "model 'tiny'" "$TMP/out2" || fail "laga demo --model tiny does not name the model"

rc=0
"$LAGA" --help >"$TMP/help" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "laga --help exit code $rc, expected 0"
for sub in demo run; do
  grep -qE "^ +$sub +[A-Z]" "$TMP/help" || fail "laga --help does not list the '$sub' subcommand: $(cat "$TMP/help")"
done

if [ "$failures" -ne 0 ]; then
  echo "demo.sh: $failures check(s) failed" >&2
  exit 1
fi
echo "demo.sh: all checks passed"
