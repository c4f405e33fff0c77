#!/usr/bin/env bash
# Bitwise reruns: the same `laga run ... --save DIR` twice writes byte-identical .npy files (inputs, weights,
# output and every gradient), for every form and layout, with thread ranks (--sp 4) and on one rank; and the
# comparison can fail (another seed differs).   usage: bash bitwise_rerun.sh <path-to-laga>
set -u
LAGA=${1:?usage: bitwise_rerun.sh <path-to-laga>}
export OPENBLAS_NUM_THREADS=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# same_files A B: every .npy of A is in B with the same bytes, and B has no other.
same_files() {
  diff -q <(cd "$1" && ls) <(cd "$2" && ls) >/dev/null || return 1
  local f
  for f in "$1"/*.npy; do cmp -s "$f" "$2/$(basename "$f")" || return 1; done
  return 0
}

twice() {  # twice NAME ARGS...: runs `laga run ARGS --save` twice into $TMP/NAME.a and $TMP/NAME.b
  local name=$1
  shift
  for run in a b; do
    "$LAGA" run "$@" --save "$TMP/$name.$run" >"$TMP/out" 2>&1 || { fail "laga run $*: exit $?"; cat "$TMP/out"; return 1; }
  done
  same_files "$TMP/$name.a" "$TMP/$name.b" || { fail "laga run $* --save: the two runs' files differ"; return 1; }
  echo "ok: laga run $* --save twice: $(ls "$TMP/$name.a" | wc -l) files byte-identical"
}

for layout in a2a all_gather; do
  for form in explicit absorbed laga; do
    twice "$form-$layout" --model small --seq 64 --sp 4 --form "$form" --layout "$layout" --kernel fused
  done
  twice "eager-$layout" --model small --seq 64 --sp 4 --form laga --layout "$layout" --kernel eager
done
twice single --model small --seq 64 --form laga --dtype float64

# The comparison can fail: another seed gives other bytes.
"$LAGA" run --model small --seq 64 --sp 4 --seed 2 --save "$TMP/seed2" >/dev/null 2>&1
if same_files "$TMP/laga-a2a.a" "$TMP/seed2"; then fail "another seed wrote the same bytes (the comparison cannot fail)"; fi

[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all reruns byte-identical"
