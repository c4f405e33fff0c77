#!/usr/bin/env bash
# laga bench --gemm-check: each point gains `gemms` (every distinct GEMM of the block, in block against alone)
# and a line in the table; the document validates, its ratios agree with its times and its GEMM FLOPs with
# the block's; threads and phantom ranks work too; check_bench.py refuses a tampered section.
set -u
laga="$1"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)

out=$("$laga" bench --model tiny --seq 64 --sp 1 --form laga --gemm-check --repeat 2 --out "$tmp/g.json") \
  || fail "bench --gemm-check exited $?: $out"
echo "$out"
# 2 layouts x 2 kernels, one gemms line each
[ "$(grep -cE '^ +gemms: [0-9]+ distinct, [0-9]+ calls a fwd\+bwd; in block / alone: [0-9.]+ time-weighted \((within|NOT within) 10%\), worst [0-9.]+' <<<"$out")" -eq 4 ] \
  || fail "expected one gemms line per point (4)"
python3 "$root/scripts/check_bench.py" "$tmp/g.json" || fail "the --gemm-check document does not validate"

python3 - "$tmp/g.json" <<'PY' || fail "the gemms section's content is wrong"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["config"]["gemm_check"] is True and "--gemm-check" in d["config"]["command"]
for p in d["points"]:
    g = p["gemms"]
    s = g["summary"]
    assert g["repeats_in_block"] == 2 and g["repeats_alone"] == 2 and g["warmup_alone"] >= 1
    assert s["count"] == len(g["list"]) >= 1 and s["calls"] >= s["count"]
    # The time-weighted ratio is a mean of the ratios (weighted by time alone): never above the worst.
    assert 0 < s["time_weighted_ratio"] <= s["worst_ratio"] * (1 + 1e-12)
    # Every GEMM is listed once per distinct argument set.
    keys = [tuple(e[k] for k in ("m", "n", "k", "batch", "trans_a", "trans_b", "dtype", "c_dtype", "lda", "ldb", "ldc",
                                 "stride_a", "stride_b", "stride_c", "alpha", "beta")) for e in g["list"]]
    assert len(keys) == len(set(keys)), "a GEMM listed twice"
    # Weight gradients are float32 transposed-A GEMMs in backward only: written whole (beta 0) or summed into
    # (beta 1: kv_b_proj's head slices), one of each at least.
    dw = [e for e in g["list"] if e["trans_a"]]
    assert dw and all(e["c_dtype"] == "float32" and all(w["pass"] == "backward" for w in e["issued"]) for e in dw)
    assert {e["beta"] for e in dw} == {0.0, 1.0}, sorted({e["beta"] for e in dw})
PY

# P = 2 as threads (rank 1 through the probe) and one phantom rank of 4.
"$laga" bench --model tiny --seq 64 --sp 2 --form explicit,laga --layout a2a --kernel fused --gemm-check --repeat 2 \
  --warmup 0 --out "$tmp/t.json" >/dev/null || fail "bench --gemm-check with threads exited $?"
python3 "$root/scripts/check_bench.py" "$tmp/t.json" >/dev/null || fail "the threads document does not validate"
"$laga" bench --model tiny --seq 64 --sp 4 --phantom --form absorbed,laga-recompute --layout all_gather --kernel eager \
  --gemm-check --repeat 2 --out "$tmp/p.json" >/dev/null || fail "bench --gemm-check --phantom exited $?"
python3 "$root/scripts/check_bench.py" "$tmp/p.json" >/dev/null || fail "the phantom document does not validate"

# Without the option: no section, and the config says so.
"$laga" bench --model tiny --seq 64 --form laga --layout a2a --kernel fused --repeat 1 --out "$tmp/n.json" >/dev/null \
  || fail "bench without --gemm-check exited $?"
python3 - "$tmp/n.json" <<'PY' || fail "a document without --gemm-check carries gemms"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["config"]["gemm_check"] is False and all("gemms" not in p for p in d["points"])
PY

# The checker refuses each kind of tampering.
tamper() {  # a python statement on `g` (the first point's gemms), then what it must be refused for
  python3 - "$tmp/g.json" "$tmp/bad.json" "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
g = d["points"][0]["gemms"]
exec(sys.argv[3])
json.dump(d, open(sys.argv[2], "w"))
PY
  python3 "$root/scripts/check_bench.py" "$tmp/bad.json" >"$tmp/why" && fail "check_bench.py accepted: $2"
  grep -qF "$3" "$tmp/why" || fail "check_bench.py refused '$2' without saying '$3': $(cat "$tmp/why")"
}
tamper 'g["list"][0]["ratio"] *= 1.5' "a ratio not in_block / alone" "ratio"
tamper 'g["list"].pop()' "a GEMM missing" "FLOPs"
tamper 'g["summary"]["within_10pct"] = not g["summary"]["within_10pct"]' "within_10pct flipped" "within_10pct"
tamper 'g["summary"]["time_weighted_ratio"] += 0.5' "time-weighted ratio off" "time_weighted_ratio"
tamper 'g["list"][0]["calls"] = 0' "zero calls" "calls"
tamper 'del d["points"][0]["gemms"]' "a point without gemms under gemm_check" "gemms missing"

echo "bench --gemm-check CLI: ok ($(( $(date +%s) - start )) s)"
