#!/usr/bin/env bash
# Timed phantom collectives: `laga bench --phantom --phantom-comm timed` measures each point again with
# collectives that hold the queue for the alpha-beta model's time, and reports the exposed communication per
# placement (the document validates); `laga run --phantom-rank --phantom-comm timed` runs; bad values exit 2.
set -u
laga="$1"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$("$laga" bench --model tiny --seq 64 --sp 1,4 --phantom --phantom-comm timed --phantom-link node,cross-node \
      --form explicit,laga --layout a2a --kernel fused --repeat 2 --warmup 1 --out "$tmp/b.json") \
  || fail "bench exited $?: $out"
grep -qE "timed node +block" <<<"$out" || fail "no timed node line: $out"
grep -qE "timed cross-node block" <<<"$out" || fail "no timed cross-node line"
python3 "$root/scripts/check_bench.py" "$tmp/b.json" || fail "the document does not validate"
python3 - "$tmp/b.json" <<'PY' || fail "the document's content is wrong"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["config"]["phantom_comm"] == "timed" and d["config"]["phantom_links"] == ["node", "cross-node"]
assert "--phantom-comm timed --phantom-link node,cross-node" in d["config"]["command"]
for p in d["points"]:
    if p["sp"] == 1:
        assert "exposed_communication" not in p
        continue
    e = p["exposed_communication"]
    assert [l["placement"] for l in e["links"]] == ["node", "cross-node"]
    assert e["links"][0]["ranks_per_node"] == 4 and e["links"][1]["ranks_per_node"] == 1
    for l in e["links"]:
        assert l["timed_block"]["n"] == 2 and l["modeled_collective_s"] > 0
        assert abs(l["exposed_s"] - (l["timed_block"]["median"] - e["instant_block"]["median"])) < 2e-9
PY

"$laga" run --model tiny --seq 64 --sp 4 --phantom-rank 3 --phantom-comm timed --phantom-link cross-node \
  --json "$tmp/r.json" >"$tmp/run.txt" 2>&1 || fail "run exited $?: $(cat "$tmp/run.txt")"
grep -qF "held the queue for the model's time" "$tmp/run.txt" || fail "run does not say the collectives were timed"

# The ring: its shifts are timed as one step each, held on the same queue.
"$laga" run --model tiny --seq 64 --sp 4 --phantom-rank 3 --phantom-comm timed --phantom-link node --layout p2p \
  --form laga --json "$tmp/ring.json" >"$tmp/ring.txt" 2>&1 || fail "run --layout p2p exited $?: $(cat "$tmp/ring.txt")"
python3 - "$tmp/ring.json" <<'PY' || fail "the p2p run's document has no ring shifts"
import json, sys
d = json.load(open(sys.argv[1]))
text = json.dumps(d["runs"])
assert text.count('"collective": "ring_shift"') == 3, text[:400]  # kv_latent forward; resend, gradient backward
PY

expect2() {
  local what="$1" pattern="$2"; shift 2
  local msg rc
  msg=$("$laga" "$@" 2>&1); rc=$?
  [ "$rc" -eq 2 ] || fail "$what: exit $rc, expected 2: $msg"
  grep -qF -- "$pattern" <<<"$msg" || fail "$what: message lacks '$pattern': $msg"
}
expect2 "timed without phantom" "add --phantom" bench --model tiny --seq 64 --sp 2 --phantom-comm timed
expect2 "bad phantom-comm" "phantom-comm = 'slow'" bench --model tiny --seq 64 --sp 2 --phantom --phantom-comm slow
expect2 "bad link" "phantom-link = 'moon'" bench --model tiny --seq 64 --sp 2 --phantom --phantom-comm timed --phantom-link moon
expect2 "run timed without phantom rank" "add --phantom-rank" run --model tiny --seq 64 --phantom-comm timed
expect2 "run bad link" "phantom-link = 'moon'" run --model tiny --seq 64 --sp 2 --phantom-rank 1 --phantom-comm timed --phantom-link moon
echo "ok"
