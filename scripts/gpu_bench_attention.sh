#!/usr/bin/env bash
# The fused attention on a GPU machine, in one go: correctness of every attention case against the CPU in
# float64 (scripts/gpu_check.sh), the timings of tests/gpu/test_cuda_perf.cpp's attention shapes, and PyTorch's
# scaled_dot_product_attention at the 192/128 shapes as the peer (scripts/bench_sdpa.py).
#
#   scripts/gpu_bench_attention.sh [dist-dir] [perf-filter]     (there; dist from `scripts/gpu_check.sh pack`)
#
# Logs go to $OUT (or /tmp/laga_gpu_bench); the last lines are the table to copy into src/cuda/NOTES.md.
set -uo pipefail
cd "$(dirname "$0")/.."
dist=${1:-build-gpu/dist}
perf=${2:-CudaPerf.DISABLED_Attention*LongSequences}
out=${OUT:-/tmp/laga_gpu_bench}
mkdir -p "$out"
export OUT=$out

echo "== correctness (CudaAttention*) =="
timeout 300 bash scripts/gpu_check.sh run "$dist" '*CudaAttention*' | tail -25
echo
echo "== timings ($perf) =="
timeout 300 "$dist/laga_gpu_tests" --gtest_also_run_disabled_tests --gtest_filter="$perf" 2>&1 |
  tee "$out/perf.log" | grep -E '^GPUPERF|FAILED|rror'
echo
echo "== PyTorch SDPA (192/128) =="
PYTHONUNBUFFERED=1 timeout 200 python3 scripts/bench_sdpa.py 2>&1 | tee "$out/sdpa.log" | grep -vE '^\s*$' | tail -8
