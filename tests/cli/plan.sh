#!/usr/bin/env bash
# laga plan: answers fast at DeepSeek-V3 size, prints every form, refuses bad input with exit code 2.
set -u
laga="$1"
fail() { echo "FAIL: $*"; exit 1; }

start=$(date +%s%N)
out=$("$laga" plan --model deepseek-v3 --seq 16384 --sp 8 --layout a2a --kernel eager --gpu-mem 141GB --layers 61) ||
  fail "plan exited $?"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
# A guard against a plan that walks the sequence token by token (tens of seconds), not a timing: room is left
# for a loaded machine. LAGA_TIME_SCALE stretches it for slowed builds (scripts/sanitize.sh: AddressSanitizer).
[ "$ms" -lt $((10000 * ${LAGA_TIME_SCALE:-1})) ] || fail "plan took $ms ms (expected about a second at most)"
for form in "explicit" "absorbed (mqa)" "absorbed (expanded)" "laga" "laga +recompute kv"; do
  grep -qF "$form" <<<"$out" || fail "plan output lacks '$form'"
done
grep -q "fits 141GB" <<<"$out" || fail "plan output lacks the fit column"

json=$(mktemp)
trap 'rm -f "$json"' EXIT
"$laga" plan --model tiny --seq 64,128 --sp 1,2 --dtype float32 --json >"$json" || fail "plan --json exited $?"
python3 - "$json" <<'PY' || fail "plan --json is not the expected document"
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["points"]) == 4, d["points"]
for p in d["points"]:
    assert set(p["variants"]) == {"explicit", "absorbed (mqa)", "absorbed (expanded)", "laga", "laga +recompute kv"}
    for v in p["variants"].values():
        assert v["saved_bytes"] == sum(t["bytes"] for t in v["saved"])
PY

# The ring: explicit and laga only, each with its ring shifts; LAGA's peak below LAGA all_gather's.
"$laga" plan --model deepseek-v3 --seq 16384 --sp 8 --layout p2p --json >"$json" || fail "plan --layout p2p exited $?"
"$laga" plan --model deepseek-v3 --seq 16384 --sp 8 --layout all_gather --json >"$json.ag" ||
  fail "plan --layout all_gather exited $?"
python3 - "$json" "$json.ag" <<'PY' || fail "plan --layout p2p is not the expected document"
import json, sys
d, ag = (json.load(open(f)) for f in sys.argv[1:3])
assert d["layout"] == "p2p"
v = d["points"][0]["variants"]
assert set(v) == {"explicit", "laga"}, set(v)
for name in v:
    assert {t["collective"] for t in v[name]["traffic"]} == {"ring_shift"}, v[name]["traffic"]
peak = lambda p: max(p["peak_forward_bytes"], p["peak_backward_bytes"])
assert peak(v["laga"]) < peak(ag["points"][0]["variants"]["laga"]) / 2
PY
rm -f "$json.ag"

# The model's layer count and the whole-model totals: in the document, which the report scripts read instead of
# a constant of their own.
"$laga" plan --model deepseek-v3 --seq 16384 --sp 8 --json >"$json" || fail "plan --model deepseek-v3 --json exited $?"
python3 - "$json" <<'PY' || fail "plan --json lacks the model's layer count, its totals or the traffic what-ifs"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"]["num_hidden_layers"] == 61 and d["layers"] == 1, (d["model"], d["layers"])
for name, v in d["points"][0]["variants"].items():
    t = v["model_total"]
    assert t["num_hidden_layers"] == 61 and t["saved_bytes"] == 61 * v["saved_bytes"], (name, t)
    w, r = v["traffic_what_if"], v["explicit_over_this"]
    assert w["latent_as_all_to_all_bytes_sent"] <= w["latent_grad_in_dtype_bytes_sent"] <= v["bytes_sent"], (name, w)
    assert r["bytes_sent"] <= r["latent_grad_in_dtype_bytes_sent"] <= r["latent_as_all_to_all_bytes_sent"], (name, r)
PY
root=$(cd "$(dirname "$0")/../.." && pwd)
for script in plan_table.py results.py; do
  ! grep -nE '(^|[^0-9.])61([^0-9]|$)' "$root/scripts/$script" ||
    fail "scripts/$script holds DeepSeek-V3's layer count; read model.num_hidden_layers from laga plan --json"
  grep -q '"num_hidden_layers"' "$root/scripts/$script" || fail "scripts/$script does not read num_hidden_layers"
done

expect_error() {  # expected message fragment, then the arguments
  local msg="$1"; shift
  err=$("$laga" plan "$@" 2>&1 >/dev/null); code=$?
  [ "$code" -eq 2 ] || fail "plan $* exited $code, expected 2"
  grep -qF -- "$msg" <<<"$err" || fail "plan $*: message '$err' lacks '$msg'"
}
expect_error "memory size 'abc'" --gpu-mem abc
expect_error "sp = '0'" --sp 0
expect_error "seq = 1001 is not divisible by sp = 8" --seq 1001 --sp 8
expect_error "num_attention_heads = 128 is not divisible by sp = 3" --seq 3072 --sp 3 --layout a2a
expect_error "layout = 'ring'" --layout ring
expect_error "not divisible by 2 x sp = 16" --seq 1000 --sp 8 --layout p2p
expect_error "kernel = eager with layout = p2p" --seq 1024 --sp 8 --layout p2p --kernel eager
echo "plan CLI: ok"
