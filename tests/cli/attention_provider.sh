#!/usr/bin/env bash
# --attention-provider on `laga run` and `laga bench`: bad values and cuDNN on the CPU are refused with exit
# code 2 and a message naming the value; laga and auto run on the CPU (the provider concerns the GPU's fused
# attention); `laga plan` and `laga bench-attention --help` work without a GPU.
# Usage: bash attention_provider.sh <path-to-laga>
set -u
LAGA=${1:?usage: attention_provider.sh <path-to-laga>}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect_exit CODE PATTERN -- ARGS...: exit code CODE and PATTERN (grep -F) in stderr.
expect_exit() {
  local code=$1 pattern=$2; shift 3
  "$LAGA" "$@" >"$TMP/out" 2>"$TMP/err"
  local got=$?
  [ "$got" -eq "$code" ] || fail "laga $*: exit $got, expected $code ($(head -c 300 "$TMP/err"))"
  [ -z "$pattern" ] || grep -qF -- "$pattern" "$TMP/err" || fail "laga $*: stderr lacks '$pattern': $(head -c 300 "$TMP/err")"
}

expect_exit 2 "attention provider = 'flash': must be one of auto, laga, cudnn" -- \
  run --model tiny --seq 16 --attention-provider flash
expect_exit 2 "attention-provider = cudnn: cuDNN runs on the GPU" -- \
  run --model tiny --seq 16 --attention-provider cudnn
expect_exit 2 "attention provider = 'x'" -- bench --model tiny --seq 16 --repeat 1 --attention-provider x
expect_exit 0 "" -- run --model tiny --seq 16 --attention-provider laga
expect_exit 0 "" -- run --model tiny --seq 16 --attention-provider auto
expect_exit 0 "" -- bench-attention --help
expect_exit 2 "warmup-seconds = -1: must be from 0 to 600" -- bench-attention --warmup-seconds -1
expect_exit 0 "" -- plan --model deepseek-v3 --seq 16384 --sp 8 --kernel fused

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "attention_provider: all checks passed"
