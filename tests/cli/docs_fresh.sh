#!/usr/bin/env bash
# The generated pages are what their generators make of the committed documents (docs/results.md from
# bench/results/, docs/plan-deepseek-v3.md from `laga plan`), the generators' closed forms agree with every
# measured point, and the GPU scripts' table makers read the documents `laga run` writes.
#   Usage: bash docs_fresh.sh <path-to-laga>
set -u
LAGA=${1:?usage: docs_fresh.sh <path-to-laga>}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

mkdir -p "$TMP/docs"
if python3 "$ROOT/scripts/results.py" --laga "$LAGA" --no-plots --out "$TMP/docs/results.md" --img "$TMP/docs/img" >/dev/null; then
  diff -q "$TMP/docs/results.md" "$ROOT/docs/results.md" >/dev/null ||
    fail "docs/results.md is not what scripts/results.py makes of bench/results/ (re-run it): $(diff "$TMP/docs/results.md" "$ROOT/docs/results.md" | head -5)"
  # The Sources tables name every committed measurement document, with its tree state.
  mapfile -t measured < <(cd "$ROOT" && find bench/results -name '*.json' | sort)
  [ "${#measured[@]}" -gt 0 ] || fail "no documents under bench/results"
  for doc in "${measured[@]}"; do
    grep -F "](../$doc) |" "$TMP/docs/results.md" | grep -qE '\| (clean|\*\*uncommitted changes\*\*|not recorded) \|' ||
      fail "docs/results.md's Sources tables have no row with a tree state for $doc"
  done
  # laga plan's closed forms (traffic, and the collectives' modeled time) must agree with every measured point.
  for what in "equals the measured bytes at" "prices"; do
    line=$(grep -o "$what [0-9]* of [0-9]*" "$TMP/docs/results.md" | head -1)
    read -r a b <<<"$(echo "$line" | grep -o '[0-9]*' | tr '\n' ' ')"
    [ -n "$line" ] && [ "$a" = "$b" ] || fail "results.py: '$what' agrees at '$line', not at every point"
  done
else
  fail "scripts/results.py failed"
fi

if python3 "$ROOT/scripts/plan_table.py" --laga "$LAGA" --out "$TMP/plan.md" >/dev/null; then
  diff -q "$TMP/plan.md" "$ROOT/docs/plan-deepseek-v3.md" >/dev/null ||
    fail "docs/plan-deepseek-v3.md is not what scripts/plan_table.py makes of laga plan (re-run it): $(diff "$TMP/plan.md" "$ROOT/docs/plan-deepseek-v3.md" | head -5)"
else
  fail "scripts/plan_table.py failed"
fi

# laga plan --json: the closed form equals the block's own traffic on the meta backend with and without
# --kv-grad-reduce-in-fp32 (no committed document uses it), which doubles explicit's K/V gradient bytes.
for kv in "" --kv-grad-reduce-in-fp32; do
  "$LAGA" plan --model deepseek-v3 --seq 16384 --sp 8 --layout all_gather $kv --json >"$TMP/plan_kv$kv.json" ||
    fail "laga plan $kv --json exited non-zero"
done
python3 - "$TMP/plan_kv.json" "$TMP/plan_kv--kv-grad-reduce-in-fp32.json" <<'PY' || fail "laga plan --json: closed form != plan"
import json, sys
bf16, fp32 = (json.load(open(p))["points"][0]["variants"] for p in sys.argv[1:3])
for v in (bf16, fp32):
    for name in ("explicit", "laga"):
        assert v[name]["closed_form"]["bytes_sent"] == v[name]["bytes_sent"], (name, v[name]["closed_form"]["bytes_sent"])
        assert all(pl["collective_s"] > 0 for pl in v[name]["modeled"]["placements"]), name
kv = lambda v: sum(r["bytes_sent"] for r in v["explicit"]["closed_form"]["traffic"] if r["collective"] == "reduce_scatter")
assert fp32["laga"]["bytes_sent"] == bf16["laga"]["bytes_sent"] and kv(fp32) == 2 * kv(bf16), (kv(bf16), kv(fp32))
PY

# check_table.py and multi_gpu_table.py on documents of thread ranks (the GPU scripts feed them NCCL runs).
for form in explicit laga; do
  "$LAGA" run --model tiny --seq 64 --sp 2 --form "$form" --check --json "$TMP/$form.json" >/dev/null 2>&1 ||
    fail "laga run --form $form --json exited non-zero"
done
python3 "$ROOT/scripts/check_table.py" "$TMP/explicit.json" "$TMP/laga.json" --json "$TMP/checks.json" >"$TMP/checks.txt" ||
  fail "check_table.py failed"
python3 - "$TMP/checks.json" <<'PY' || fail "check_table.py --json is not as expected"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["schema"] == "laga-checks/1" and [r["form"] for r in d["runs"]] == ["explicit", "laga"], d
for r in d["runs"]:
    assert r["sp"] == 2 and r["model"] == "tiny" and r["checks"] and all(c["ok"] for c in r["checks"]), r
PY
python3 "$ROOT/scripts/multi_gpu_table.py" "$TMP/explicit.json" "$TMP/laga.json" --laga "$LAGA" --json "$TMP/multi.json" >"$TMP/multi.txt" ||
  fail "multi_gpu_table.py failed"
python3 - "$TMP/multi.json" <<'PY' || fail "multi_gpu_table.py --json is not as expected"
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["points"]) == 2 and len(d["speedups"]) == 1 and d["time_model"]["label"] == "modeled", d
assert all(c["seconds"] > 0 for c in d["collectives"]), d["collectives"]
PY

[ "$failures" -eq 0 ] && echo "docs fresh: ok" || { echo "docs fresh: $failures failure(s)"; exit 1; }
