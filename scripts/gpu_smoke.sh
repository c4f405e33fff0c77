#!/usr/bin/env bash
# A short check on a GPU machine after a change: the GPU block and attention tests, then phantom rank 7 of 8
# of DeepSeek-V3 (S = 16384, bf16, a2a, every variant and kernel) with time by phase, JSON under $OUT.
#   (here)  cmake -B build-nccl -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-nccl laga laga_gpu_tests
#           bash scripts/gpu_run_check.sh pack build-nccl        # then carry build-nccl/dist-run
#   (there) bash scripts/gpu_smoke.sh build-nccl/dist-run
set -uo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-build-nccl/dist-run}" && pwd)
out=${OUT:-/tmp/laga_gpu_smoke}
mkdir -p "$out"
. scripts/gpu_env.sh  # libraries, NVLink multicast off
export OPENBLAS_NUM_THREADS=8
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 240 "$dist/laga_gpu_tests" --gtest_filter='*CudaBlock*:*CudaAttention*:*CudaLaga*' >"$out/gtest.log" 2>&1
echo "GPU tests exit $?"; grep -E '^\[ +(PASSED|FAILED) +\]' "$out/gtest.log"; grep -A4 Failure "$out/gtest.log" | head -30
timeout 240 "$dist/laga" run --device cuda --model deepseek-v3 --seq 16384 --sp 8 --phantom-rank 7 \
  --form all --layout a2a --kernel all --json "$out/phantom-dsv3-s16k-p8-a2a.json" 2>&1 | tail -25
