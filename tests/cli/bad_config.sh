#!/usr/bin/env bash
# Bad model configurations: `laga run --model X` exits with code 2 (invalid input) and stderr names the
# offending field and value. Usage: bash bad_config.sh <path-to-laga>
set -u
LAGA=${1:?usage: bad_config.sh <path-to-laga>}
DATA=$(cd "$(dirname "$0")/../data" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# A valid config.json with one field replaced: write_config NAME KEY VALUE (VALUE as JSON text).
write_config() {
  local name=$1 key=$2 value=$3
  local hidden=32 heads=4 qr=16 kvr=16 dn=8 dr=8 dv=8
  case $key in
    hidden_size) hidden=$value ;; num_attention_heads) heads=$value ;; kv_lora_rank) kvr=$value ;;
    qk_nope_head_dim) dn=$value ;; qk_rope_head_dim) dr=$value ;; v_head_dim) dv=$value ;; q_lora_rank) qr=$value ;;
    none) ;; *) echo "write_config: unknown key $key" >&2; exit 3 ;;
  esac
  cat > "$TMP/$name.json" <<JSON
{
  "model_type": "deepseek_v3",
  "hidden_size": $hidden,
  "num_attention_heads": $heads,
  "q_lora_rank": $qr,
  "kv_lora_rank": $kvr,
  "qk_nope_head_dim": $dn,
  "qk_rope_head_dim": $dr,
  "v_head_dim": $dv,
  "rope_theta": 10000.0,
  "rms_norm_eps": 1e-06
}
JSON
  echo "$TMP/$name.json"
}

# expect_invalid WHAT MODEL PATTERN...: exit code 2 and every grep -F pattern in stderr.
expect_invalid() {
  local what=$1 model=$2
  shift 2
  local rc=0
  "$LAGA" run --model "$model" --seq 16 --sp 1 >"$TMP/out" 2>"$TMP/err" || rc=$?
  if [ "$rc" -ne 2 ]; then
    fail "$what: exit code $rc, expected 2 (stderr: $(cat "$TMP/err"))"
    return
  fi
  local pattern
  for pattern in "$@"; do
    grep -qF -- "$pattern" "$TMP/err" || fail "$what: stderr does not contain '$pattern': $(cat "$TMP/err")"
  done
}

# The baseline file is accepted: the failures below come from the one field each changes.
good=$(write_config good none 0)
rc=0
"$LAGA" run --model "$good" --seq 16 --sp 1 >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" -eq 0 ] || fail "valid config $good: exit code $rc (stderr: $(cat "$TMP/err"))"

expect_invalid "zero hidden_size" "$(write_config zero hidden_size 0)" "hidden_size = 0" "positive"
expect_invalid "zero v_head_dim" "$(write_config zero_v v_head_dim 0)" "v_head_dim = 0"
expect_invalid "negative kv_lora_rank" "$(write_config neg kv_lora_rank -16)" "kv_lora_rank = -16" "positive"
expect_invalid "negative num_attention_heads" "$(write_config neg_h num_attention_heads -4)" "num_attention_heads = -4"
expect_invalid "odd qk_rope_head_dim" "$(write_config odd qk_rope_head_dim 7)" "qk_rope_head_dim = 7" "even"
expect_invalid "zero q_lora_rank" "$(write_config zero_q q_lora_rank 0)" "q_lora_rank = 0"
expect_invalid "non-integer hidden_size" "$(write_config str hidden_size '"32"')" "hidden_size"
expect_invalid "missing kv_lora_rank" "$DATA/config_missing_kv_lora_rank.json" "kv_lora_rank" "missing"
expect_invalid "unknown preset" "deepseek-v9" "deepseek-v9" "preset"
printf '{"hidden_size": 32,' > "$TMP/malformed.json"
expect_invalid "malformed JSON" "$TMP/malformed.json" "malformed.json"

if [ "$failures" -ne 0 ]; then
  echo "bad_config.sh: $failures check(s) failed" >&2
  exit 1
fi
echo "bad_config.sh: all checks passed"
