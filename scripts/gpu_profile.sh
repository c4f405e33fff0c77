#!/usr/bin/env bash
# Nsight Compute on the tensor-core attention backward at 192/128, h 16, S 8k (the first backward of the perf
# test's long-sequence run): the fused-dQ dK/dV kernel, then the separate dK/dV and dQ kernels. Clocks are left
# alone (--clock-control none, METHOD.md). Needs a machine where ncu reads the counters (Firecracker kinds).
#
#   (there) bash scripts/gpu_profile.sh build-nccl/dist-run [sections...]
# Reports (text) to stdout and $OUT/profile-*.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-build-nccl/dist-run}" && pwd)
shift || true
# shellcheck source=gpu_env.sh
source scripts/gpu_env.sh
out=${OUT:-/tmp/laga_gpu_profile}
mkdir -p "$out"
sections=("$@")
(( ${#sections[@]} )) || sections=(SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis WarpStateStats SchedulerStats LaunchStats)
args=()
for s in "${sections[@]}"; do args+=(--section "$s"); done
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n $ncu ]] || { echo "no ncu on this machine"; exit 1; }
filter='CudaPerf.DISABLED_AttentionMha192LongSequences'
run() {  # name, kernel regex, launches, LAGA_CUDA_FLASH_DQ
  LAGA_CUDA_FLASH_DQ=$4 timeout 240 "$ncu" --clock-control none -k "regex:$2" -c "$3" "${args[@]}" \
    "$dist/laga_gpu_tests" --gtest_also_run_disabled_tests --gtest_filter="$filter" >"$out/profile-$1.txt" 2>&1
  echo "== $1 (exit $?)"
  grep -vE '^\s*$|^==PROF==|GPUPERF|^\[|^Note' "$out/profile-$1.txt" | grep -vE 'Running|gtest' | head -150
}
run fused 'flash_bwd_dkdv_regs_kernel' 1 fused
run separate 'flash_bwd_dkdv_regs_kernel|flash_bwd_dq_kernel' 2 separate
