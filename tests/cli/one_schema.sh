#!/usr/bin/env bash
# One schema for a run: a `laga bench --out` point and a `laga run --json` run entry of the same configuration
# (thread ranks with --check, and one phantom rank) carry the same options under the same names and values, and
# their rank records and checks have the same keys, recursively. The comparison is shown to fail on a record
# that lost or renamed a nested key.   Usage: bash one_schema.sh <path-to-laga>
set -u
LAGA=${1:?usage: one_schema.sh <path-to-laga>}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

common=(--model tiny --seq 64 --sp 2 --form laga --layout all_gather --kernel fused)
"$LAGA" run "${common[@]}" --check --json "$TMP/run.json" >/dev/null 2>"$TMP/err" || fail "laga run exited $?: $(cat "$TMP/err")"
"$LAGA" run "${common[@]}" --phantom-rank 1 --json "$TMP/run_phantom.json" >/dev/null 2>"$TMP/err" ||
  fail "laga run --phantom exited $?: $(cat "$TMP/err")"
"$LAGA" bench "${common[@]}" --check --repeat 1 --warmup 0 --out "$TMP/bench.json" >/dev/null 2>"$TMP/err" ||
  fail "laga bench exited $?: $(cat "$TMP/err")"
"$LAGA" bench "${common[@]}" --phantom --repeat 1 --warmup 0 --out "$TMP/bench_phantom.json" >/dev/null 2>"$TMP/err" ||
  fail "laga bench --phantom exited $?: $(cat "$TMP/err")"

python3 - "$TMP" <<'PY' || fail "the bench point and the run differ in schema"
import copy, json, os, sys
tmp = sys.argv[1]
load = lambda name: json.load(open(os.path.join(tmp, name)))


def keys(v, path="$"):
    """Every key path under v; a list's elements share the path '[]'."""
    out = set()
    if isinstance(v, dict):
        for k, x in v.items():
            out.add(f"{path}.{k}")
            out |= keys(x, f"{path}.{k}")
    elif isinstance(v, list):
        for x in v:
            out |= keys(x, f"{path}[]")
    return out


def same(a, b, what):
    ka, kb = keys(a), keys(b)
    if ka != kb:
        return f"{what}: only in bench {sorted(ka - kb)}, only in run {sorted(kb - ka)}"
    return None


def compare(run_doc, bench_doc):
    (run,) = run_doc["runs"]
    (point,) = bench_doc["points"]
    problems = []
    if [r["rank"] for r in run["ranks"]] != [r["rank"] for r in point["ranks"]]:
        problems.append(f"ranks {[r['rank'] for r in run['ranks']]} in run, {[r['rank'] for r in point['ranks']]} in bench")
    for r, b in zip(run["ranks"], point["ranks"]):
        problems.append(same(b, r, f"rank {r['rank']}'s record"))
    for k, v in run.items():
        if k not in point:
            problems.append(f"{k}: in run, not in bench")
        elif k == "check":
            problems.append(same(point[k], v, "check"))
        elif k != "ranks" and point[k] != v:
            problems.append(f"option {k}: {v!r} in run, {point[k]!r} in bench")
    return [p for p in problems if p]


for run_name, bench_name in (("run.json", "bench.json"), ("run_phantom.json", "bench_phantom.json")):
    run_doc, bench_doc = load(run_name), load(bench_name)
    problems = compare(run_doc, bench_doc)
    assert not problems, (bench_name, problems)
    # The comparison catches a record that lost a nested key (here: the collectives' seconds).
    broken = copy.deepcopy(bench_doc)
    for c in broken["points"][0]["ranks"][-1]["traffic"]:
        del c["seconds"]
    assert compare(run_doc, broken), "a missing nested key went unnoticed"
    renamed = copy.deepcopy(bench_doc)
    renamed["points"][0]["ranks"][0]["flops_forward"]["attn"] = renamed["points"][0]["ranks"][0]["flops_forward"].pop("attention")
    assert compare(run_doc, renamed), "a renamed nested key went unnoticed"
assert "check" in load("run.json")["runs"][0], "the threads run has no check to compare"
print("one schema: bench points and run entries agree (threads with --check, and phantom)")
PY
echo "one schema: ok"
