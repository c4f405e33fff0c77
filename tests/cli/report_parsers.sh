#!/usr/bin/env bash
# The GPU check summary (`bash scripts/gpu.sh check-summary`) reads the GPUCHECK lines as the GPU tests print them
# (formats of tests/gpu/gpu_test_util.hpp, the block conformance suite and test_nccl.cpp): the worst error per
# suite (the conformance suite: per platform), output and dtype,
# and one row per LagaVsExplicitSameP configuration with its own error (a "P=4" in the line is not an
# error of 4).   usage: bash report_parsers.sh <path-to-laga>
set -u
cd "$(dirname "$0")/../.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

cat >"$TMP/checks.txt" <<'LOG'
GPUCHECK Bf16/CudaBlockVsCpu.MatchesFloat64/laga_a2a_fused y bf16 rel_err=3.200e-03 tol=3.0e-02
GPUCHECK Bf16/CudaBlockVsCpu.MatchesFloat64/explicit_a2a_fused y bf16 rel_err=2.500e-03 tol=3.0e-02
GPUCHECK Bf16/CudaBlockVsCpu.MatchesFloat64/laga_a2a_fused dx bf16 rel_err=4.000e-03 tol=3.0e-02
GPUCHECK Block/cuda_host_staging.tiny_P2_S64_B1_a2a_bf16_fused_laga dx bf16 rel_err=5.000e-03 tol=3.0e-02
GPUCHECK Block/cuda_host_staging.tiny_P4_S64_B1_a2a_bf16_fused_explicit dx bf16 rel_err=7.000e-03 tol=3.0e-02
GPUCHECK LagaVsExplicitSameP/all_gather fused kv-grad-fp32 P=4 worst_rel_error=1.200e-04
GPUCHECK LagaVsExplicitSameP/a2a eager P=2 worst_rel_error=6.000e-05
GPUCHECK fused_dq deepseek dq_fused_vs_separate_rel=1.000e-07
GPUCHECK scratch slot scores held=1024 peak=2048
LOG
bash scripts/gpu.sh check-summary "$TMP/checks.txt" | sort >"$TMP/summary.txt"
cat "$TMP/summary.txt"
expect() {  # expect KEY ERROR: the row starting with KEY reports ERROR
  local row
  row=$(grep -F -- "$1 " "$TMP/summary.txt" | head -n1)
  [ -n "$row" ] || { fail "no row for '$1'"; return; }
  awk -v want="$2" '{ if ($0 !~ want) exit 1 }' <<<"$row" || fail "row for '$1' lacks $2: $row"
}
expect "CudaBlockVsCpu y bf16" "3.20e-03"
expect "CudaBlockVsCpu dx bf16" "4.00e-03"
expect "cuda_host_staging dx bf16" "7.00e-03"
expect "LagaVsExplicitSameP/all_gather fused kv-grad-fp32 P=4" "1.20e-04"
expect "LagaVsExplicitSameP/a2a eager P=2" "6.00e-05"
[ "$(grep -c . "$TMP/summary.txt")" -eq 5 ] || fail "expected 5 rows (scratch and flag lines are not errors)"
[ "$failures" -eq 0 ] || exit 1
echo "summary parser ok"
