#!/usr/bin/env bash
# Every attention path of the CUDA backend under compute-sanitizer at small shapes: memcheck, racecheck
# and synccheck over the GPU attention tests (eager; the generic FMA kernel; the tensor-core kernels at
# 192/128 and 576/512; the fused-dQ backward). Prints each tool's error summary. Then bitwise reruns on the
# GPU: the same `laga run --device cuda ... --save` twice must write byte-identical files. Exit 1 on any
# report or difference.
#   (here)  bash scripts/gpu_run_check.sh pack build                  # carry build/dist-run
#   (there) bash scripts/gpu_sanitize.sh build/dist-run [tools, default "memcheck racecheck synccheck"]
set -uo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-build-nccl/dist-run}" && pwd)
tools=${2:-memcheck racecheck synccheck}
out=${OUT:-/tmp/laga_gpu_sanitize}
mkdir -p "$out"
. scripts/gpu_env.sh  # libraries, NVLink multicast off
# Small shapes of each path, forward and backward, both dtypes (float32 takes the generic kernel, bfloat16 on
# dense views the tensor-core kernels), and the fused dQ against the separate dQ kernel.
filter='Ops/CudaAttention.*/tiny_mha_*:Ops/CudaAttention.*/mha_multi_tile_*:Ops/CudaAttention.*/gqa_offset_*'
filter+=':Ops/CudaAttention.*/mha_192_128_dense_negative_offset_*:Ops/CudaAttention.*/gqa_192_128_dense_multi_tile_*'
filter+=':Ops/CudaAttention.*/mqa_576_512_absorbed_dense_h16_*:Ops/CudaAttention.*/mqa_576_512_separate_v_dense_*'
filter+=':Ops/CudaAttentionFusedDq.*/mha_192_128_dense_negative_offset:Ops/CudaAttentionFusedDq.*/gqa_192_128_dense_multi_tile'
filter+=':-*BitwiseDeterministicOnRerun*'
status=0
for tool in $tools; do
  start=$(date +%s)
  timeout "${TOOL_TIMEOUT:-200}" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
    "$dist/laga_gpu_tests" --gtest_filter="$filter" >"$out/sanitize_$tool.log" 2>&1
  rc=$?
  summary=$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_$tool.log")
  tests=$(grep -m1 -E '^\[  PASSED  \]' "$out/sanitize_$tool.log")
  # Reports inside cuBLASLt's own kernels (nvjet_*: the eager path's GEMMs) are the vendor's, listed apart.
  ours=$(grep -E '^========= +(Invalid|Race|Barrier|Error)' "$out/sanitize_$tool.log" | grep -vc 'nvjet_')
  vendor=$(grep -E '^========= +(Invalid|Race|Barrier|Error)' "$out/sanitize_$tool.log" | grep -c 'nvjet_')
  echo "compute-sanitizer $tool: exit $rc, ${summary:-no summary} ($tests; $(( $(date +%s) - start )) s;" \
       "$(grep -c '^\[       OK' "$out/sanitize_$tool.log") tests done; reports in laga's kernels: $ours, in cuBLASLt's: $vendor)"
  [ "$rc" -eq 0 ] || { status=1; grep -m10 -E '=========  ?(Invalid|Race|Barrier|Error|Program hit)' "$out/sanitize_$tool.log"; tail -5 "$out/sanitize_$tool.log"; }
done

# Bitwise reruns on the GPU (bf16, both kernels, both layouts, LAGA and explicit, P = 1).
for args in "--form laga --layout a2a --kernel fused" "--form explicit --layout all_gather --kernel eager" \
            "--form absorbed --layout a2a --kernel fused"; do
  ok=1
  for run in a b; do
    # shellcheck disable=SC2086
    "$dist/laga" run --device cuda --model small --seq 512 --batch 2 $args --save "$out/rerun_$run" \
      >"$out/rerun_$run.log" 2>&1 || { ok=0; echo "laga run --device cuda $args: exit $?"; tail -3 "$out/rerun_$run.log"; }
  done
  if [ "$ok" -eq 1 ] && diff -r -q "$out/rerun_a" "$out/rerun_b" >/dev/null; then
    echo "bitwise rerun, laga run --device cuda --model small --seq 512 --batch 2 $args: $(ls "$out/rerun_a" | wc -l) files byte-identical"
  else
    status=1
    echo "bitwise rerun, $args: FILES DIFFER (or a run failed)"
  fi
  rm -rf "$out/rerun_a" "$out/rerun_b"
done
exit $status
