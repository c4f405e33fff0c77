#!/usr/bin/env bash
# laga bench: a small CPU sweep writes a document that validates against docs/bench-schema.json (and its
# figures add up); the table shows progress and labels modeled figures; the plotting script makes non-empty
# PNGs from it (skipped, with a message, when matplotlib is absent); bad input exits 2.
set -u
laga="$1"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s)
out=$("$laga" bench --model tiny --seq 32,64 --sp 1,2 --layout all --kernel all --form all --repeat 3 --warmup 1 \
      --check --out "$tmp/bench.json") || fail "bench exited $?: $out"
# 2 seq x 2 sp x 2 layouts x 2 kernels x 5 variants
grep -qF "80 points" <<<"$out" || fail "bench did not announce 80 points"
grep -qE '^80/80 +0 ' <<<"$out" || fail "no progress line '80/80  0 (left)'"
grep -qE '^1/80 +79 ' <<<"$out" || fail "no progress line '1/80  79 (left)'"
grep -qF "MODELED, not measured" <<<"$out" || fail "the table does not label the modeled columns"
grep -qF "NVLink 450 GB/s" <<<"$out" || fail "the model's bandwidths are not stated"
grep -qF "bitwise = explicit" <<<"$out" || fail "LAGA at P = 1 not reported bit-identical to explicit"
python3 "$root/scripts/check_bench.py" "$tmp/bench.json" || fail "the document does not validate"

python3 - "$tmp/bench.json" <<'PY' || fail "the document's content is wrong"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["complete"] is True and d["schema"] == "laga-bench/2"
assert d["machine"]["cpu_cores"] >= 1 and d["machine"]["hostname"]
assert d["build"]["commit"]
assert d["config"]["device"] == "cpu" and d["config"]["repeat"] == 3
pts = d["points"]
assert len(pts) == 80, len(pts)
def pick(**kw):
    return [p for p in pts if all(p[k] == v for k, v in kw.items())]
def rank_of(p):
    return next(r for r in p["ranks"] if r["rank"] == p["rank"])
for p in pts:
    (check,) = p["check"]  # as laga run --check writes it
    assert check["reference"] == "explicit P=1, same device" and check["tolerance"] == 1e-5, check
    assert all(t["ok"] and t["rel_error"] <= 1e-5 for t in check["tensors"]), (p["variant"], check)
    assert p["repeats"]["block"]["n"] == 3
    if p["form"] == "laga" and p["sp"] == 1:
        assert p["bit_identical_to_explicit"] is True, p["variant"]
    assert [pl["placement"] for pl in p["modeled"]["placements"]] == ["node", "cross-node"]
# LAGA moves the latent, explicit per-head K/V: fewer bytes in every layout at P = 2.
for layout in ("a2a", "all_gather"):
    ex = pick(seq=64, sp=2, layout=layout, kernel="fused", variant="explicit")[0]
    la = pick(seq=64, sp=2, layout=layout, kernel="fused", variant="laga")[0]
    assert rank_of(la)["bytes_sent"] < rank_of(ex)["bytes_sent"], layout
    assert ex["modeled"]["placements"][1]["collective_s"] > la["modeled"]["placements"][1]["collective_s"]
# Threads measure every rank: a record each, in rank order, and each one's block.
p2 = pick(sp=2)[0]
assert [r["rank"] for r in p2["ranks"]] == [0, 1] and len(p2["repeats"]["block_by_rank"]) == 2
assert "block_slowest_rank" in p2["repeats"]
PY

# The ring (p2p): its ring shifts in a document that validates.
"$laga" bench --model tiny --sweep seq=64 --sweep sp=2 --form explicit,laga --layout p2p --kernel fused \
  --repeat 1 --warmup 0 --out "$tmp/ring.json" >/dev/null || fail "bench --layout p2p exited $?"
python3 "$root/scripts/check_bench.py" "$tmp/ring.json" >/dev/null || fail "the p2p document does not validate"
grep -q '"ring_shift"' "$tmp/ring.json" || fail "the p2p document has no ring shift"

# --sweep and --phantom: one rank of 4 alone.
out=$("$laga" bench --model tiny --sweep seq=64 --sweep sp=4 --form explicit,laga --layout a2a --kernel fused \
      --phantom --repeat 2 --warmup 0 --out "$tmp/phantom.json") || fail "bench --phantom exited $?"
python3 "$root/scripts/check_bench.py" "$tmp/phantom.json" >/dev/null || fail "the phantom document does not validate"
python3 - "$tmp/phantom.json" <<'PY' || fail "the phantom document's content is wrong"
import json, sys
d = json.load(open(sys.argv[1]))
assert [p["variant"] for p in d["points"]] == ["explicit", "laga"]
for p in d["points"]:
    assert p["ranks_run"] == "phantom" and p["rank"] == 3 and p["sp"] == 4 and [r["rank"] for r in p["ranks"]] == [3]
    assert p["ranks"][0]["bytes_sent"] > 0  # counted, though not performed
PY

# The schema checker itself refuses a broken document.
python3 - "$tmp/bench.json" "$tmp/broken.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["points"][0]["ranks"][0]["saved_bytes"] += 1
del d["machine"]["hostname"]
json.dump(d, open(sys.argv[2], "w"))
PY
python3 "$root/scripts/check_bench.py" "$tmp/broken.json" >/dev/null && fail "check_bench.py accepted a broken document"

# Plots: with matplotlib (Debian's python3-matplotlib), non-empty PNGs; without it, a skip message.
py=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null && "$cand" -c "import matplotlib" 2>/dev/null; then py="$cand"; break; fi
done
if [ -n "$py" ]; then
  "$py" "$root/scripts/plot_bench.py" "$tmp/bench.json" --outdir "$tmp/img" || fail "plot_bench.py exited $?"
  n=0
  for f in "$tmp"/img/*.png; do
    [ -s "$f" ] || fail "empty plot $f"
    head -c 8 "$f" | od -An -tx1 | tr -d ' \n' | grep -q '^89504e470d0a1a0a$' || fail "$f is not a PNG"
    n=$((n + 1))
  done
  [ "$n" -ge 4 ] || fail "expected at least 4 plots, got $n"
  echo "plots: $n non-empty PNGs"
else
  echo "SKIP plots: matplotlib is not importable (apt-get install python3-matplotlib)"
fi

expect_error() {  # expected message fragment, then the arguments
  local msg="$1"; shift
  err=$("$laga" bench "$@" 2>&1 >/dev/null); code=$?
  [ "$code" -eq 2 ] || fail "bench $* exited $code, expected 2"
  grep -qF -- "$msg" <<<"$err" || fail "bench $*: message '$err' lacks '$msg'"
}
expect_error "form = 'mla'" --model tiny --form mla
expect_error "sweep key 'heads'" --model tiny --sweep heads=4
expect_error "repeat = 0" --model tiny --repeat 0
expect_error "num_attention_heads = 4 is not divisible by sp = 3" --model tiny --seq 48 --sp 3 --layout a2a
expect_error "device = 'tpu'" --model tiny --device tpu
expect_error "check with phantom" --model tiny --sp 2 --phantom --check
expect_error "dtype = bfloat16" --model tiny --dtype bfloat16
if ! "$laga" bench --model tiny --device cuda --repeat 1 >/dev/null 2>&1; then
  expect_error "device = cuda" --model tiny --device cuda
fi
secs=$(( $(date +%s) - start ))
echo "bench CLI: ok (${secs} s)"
