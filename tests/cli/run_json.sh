#!/usr/bin/env bash
# `laga run --json FILE` with thread ranks (no mpirun): one document with every rank's measurements, the
# check and the machine; a FILE that cannot be written exits 2.   Usage: bash run_json.sh <path-to-laga>
set -u
LAGA=${1:?usage: run_json.sh <path-to-laga>}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

if "$LAGA" run --model tiny --seq 64 --sp 4 --form explicit --kernel eager --check --warmup 1 --json "$TMP/run.json" >"$TMP/out" 2>"$TMP/err"; then
  python3 - "$TMP/run.json" <<'PY' || fail "the document is not as expected"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["command"] == "run" and d["options"]["sp"] == 4 and d["options"]["dtype"] == "float32", d["options"]
assert d["machine"]["communicator"] == "threads" and d["machine"]["device"] == "cpu", d["machine"]
(run,) = d["runs"]
assert run["variant"] == "explicit" and run["kernel"] == "eager", run
assert [r["rank"] for r in run["ranks"]] == [0, 1, 2, 3]
names = {t["name"] for t in run["ranks"][0]["saved"]}
assert "probs" in " ".join(names), names  # the eager kernel keeps the softmax output
for r in run["ranks"]:
    assert r["saved_bytes"] == sum(t["bytes"] for t in r["saved"]) > 0
    assert r["peak_backward_bytes"] >= r["saved_bytes"]
assert d["options"]["warmup"] == 1
# Every collective carries its time on the queue; with real (thread) traffic each took some, and the bus
# bandwidth is bytes sent over that time.
for r in run["ranks"]:
    assert r["traffic"], r["rank"]
    for c in r["traffic"]:
        assert c["seconds"] > 0, c
        assert abs(c["bus_bytes_per_s"] - c["bytes_sent"] / c["seconds"]) <= 1e-9 * c["bus_bytes_per_s"], c
    comm = r["seconds_forward"]["communication"] + r["seconds_backward"]["communication"]
    assert sum(c["seconds"] for c in r["traffic"]) <= comm * (1 + 1e-9), (r["traffic"], comm)
(check,) = run["check"]
assert check["reference"] == "explicit P=1, same device" and check["tolerance"] == 1e-5
assert all(t["ok"] for t in check["tensors"]) and {t["tensor"] for t in check["tensors"]} >= {"y", "dx", "grad_o_proj"}
PY
else
  fail "laga run --sp 4 --json exited non-zero: $(cat "$TMP/err")"
fi

rc=0
"$LAGA" run --model tiny --seq 64 --json "$TMP/no/such/dir/run.json" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -eq 2 ] || fail "--json into a missing directory: exit $rc, expected 2"
grep -qF "json = '$TMP/no/such/dir/run.json'" "$TMP/err" || fail "--json into a missing directory: $(cat "$TMP/err")"

rc=0
"$LAGA" run --model tiny --seq 64 --warmup -1 >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -eq 2 ] || fail "--warmup -1: exit $rc, expected 2"
grep -qF "warmup = -1: must be in [0, 100]" "$TMP/err" || fail "--warmup -1: $(cat "$TMP/err")"

[ "$failures" -eq 0 ] && echo "run --json: ok" || { echo "run --json: $failures failure(s)"; exit 1; }
