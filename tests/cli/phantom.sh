#!/usr/bin/env bash
# `laga run --phantom-rank R --sp P` on the CPU: rank R of P alone says plainly that no collective was
# performed, and what it measures equals `laga plan` for the same configuration: the saved bytes (and the
# saved tensors and traffic) of every variant, layout and kernel. Bad phantom input exits 2.
# Usage: bash phantom.sh <path-to-laga>
set -u
LAGA=${1:?usage: phantom.sh <path-to-laga>}
HERE=$(cd "$(dirname "$0")" && pwd)
COMPARE="$HERE/../../scripts/phantom_vs_plan.py"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
NOTICE="phantom rank 3 of 8: collectives were NOT performed; received data is synthetic"

# The default variant (laga, a2a, fused, float32), as the brief's example.
if "$LAGA" run --phantom-rank 3 --sp 8 --model small --seq 256 --json "$TMP/one.json" >"$TMP/out" 2>"$TMP/err"; then
  grep -qF "$NOTICE" "$TMP/out" || fail "no phantom notice in: $(head -3 "$TMP/out")"
  "$LAGA" plan --model small --seq 256 --sp 8 --dtype float32 --layout a2a --kernel fused --json >"$TMP/plan_one.json" ||
    fail "laga plan exited $?"
  python3 "$COMPARE" "$TMP/one.json" "$TMP/plan_one.json" >"$TMP/cmp" || fail "phantom laga/a2a/fused differs from the plan: $(cat "$TMP/cmp")"
  saved=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["runs"][0]["ranks"][0]["saved_bytes"])' "$TMP/one.json")
  grep -qF "saved $saved bytes" "$TMP/out" || fail "the printed saved bytes are not the JSON's $saved"
else
  fail "laga run --phantom-rank 3 --sp 8 exited non-zero: $(cat "$TMP/err")"
fi

# Every variant x layout x kernel in one process, against the plan of each layout and kernel.
if "$LAGA" run --phantom-rank 3 --sp 8 --model small --seq 256 --form all --layout all --kernel all \
     --json "$TMP/all.json" >"$TMP/out" 2>"$TMP/err"; then
  [ "$(grep -cF "$NOTICE" "$TMP/out")" -ge 1 ] || fail "sweep: no phantom notice"
  plans=()
  for layout in a2a all_gather; do
    for kernel in eager fused; do
      "$LAGA" plan --model small --seq 256 --sp 8 --dtype float32 --layout "$layout" --kernel "$kernel" --json \
        >"$TMP/plan_${layout}_${kernel}.json" || fail "laga plan $layout $kernel exited $?"
      plans+=("$TMP/plan_${layout}_${kernel}.json")
    done
  done
  python3 - "$TMP/all.json" <<'PY' || fail "the sweep's JSON is not the expected document"
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["runs"]) == 20, len(d["runs"])
assert d["phantom"]["rank"] == 3 and d["phantom"]["ranks"] == 8, d["phantom"]
assert "NOT performed" in d["phantom"]["note"]
assert d["machine"]["communicator"] == "phantom" and d["machine"]["commit"]
for r in d["runs"]:
    (rank,) = r["ranks"]
    assert rank["saved_bytes"] == sum(t["bytes"] for t in rank["saved"]) > 0
    assert set(rank["seconds_forward"]) == {"projections", "up_projections", "attention", "communication", "other"}
PY
  if python3 "$COMPARE" "$TMP/all.json" "${plans[@]}" >"$TMP/cmp"; then
    tail -1 "$TMP/cmp"
  else
    fail "phantom sweep differs from the plan:
$(cat "$TMP/cmp")"
  fi
else
  fail "laga run --phantom-rank 3 --sp 8 --form all --layout all --kernel all exited non-zero: $(cat "$TMP/err")"
fi

# Bad input: exit 2 naming the value.
expect_error() {  # fragment, then the arguments
  local msg="$1" rc=0
  shift
  "$LAGA" run "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  [ "$rc" -eq 2 ] || { fail "laga run $*: exit $rc, expected 2"; return; }
  grep -qF -- "$msg" "$TMP/err" || fail "laga run $*: stderr '$(cat "$TMP/err")' lacks '$msg'"
}
expect_error "phantom-rank = 8" --phantom-rank 8 --sp 8 --model small --seq 256
expect_error "--check, --save and --load do not apply" --phantom-rank 1 --sp 8 --model small --seq 256 --check
expect_error "add --phantom-rank" --model small --seq 256 --form all
expect_error "dtype = bfloat16" --phantom-rank 1 --sp 8 --model small --seq 256 --dtype bfloat16
expect_error "GPU ranks are processes" --device cuda --sp 4 --model small --seq 256
expect_error "device = 'gpu'" --device gpu --model small --seq 256

[ "$failures" -eq 0 ] && echo "phantom CLI: ok" || { echo "phantom CLI: $failures failure(s)"; exit 1; }
