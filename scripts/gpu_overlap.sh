#!/usr/bin/env bash
# Exposed communication on one GPU: DeepSeek-V3, S = 16384, P = 8, phantom rank 7, a2a, explicit and LAGA,
# fused attention, bf16; every point measured with instant collectives and with timed ones (NVLink within a
# node, InfiniBand across: the alpha-beta model of docs/bench.md), with and without --overlap. Then the GPU
# tests of the timed phantom and of the overlapped block (bitwise the blocking order through NCCL and the
# timed phantom).
#   (here)  bash scripts/gpu_run_check.sh pack build     # laga, laga_gpu_tests and libraries in build/dist-run
#   (there) bash scripts/gpu_overlap.sh build/dist-run [seq, default 16384]
# Then the ring (p2p) beside all_gather with the same timed collectives.
# Writes $OUT/exposed.json, $OUT/exposed-overlap.json and $OUT/exposed-ring.json (laga-bench/1 documents) and
# prints their tables.
set -uo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-build/dist-run}" && pwd)
seq=${2:-16384}
out=${OUT:-/tmp/laga_overlap}
mkdir -p "$out"
source scripts/gpu_env.sh
if ldd "$dist/laga" | grep -q 'libmpi.*not found'; then export LD_LIBRARY_PATH="$dist/mpi/lib:$LD_LIBRARY_PATH"; fi
rc=0
for mode in blocking overlap; do
  flag=$([ $mode = overlap ] && echo --overlap)
  name=$([ $mode = overlap ] && echo exposed-overlap || echo exposed)
  timeout 150 "$dist/laga" bench --device cuda --model deepseek-v3 --phantom --phantom-comm timed \
    --phantom-link node,cross-node --seq "$seq" --sp 8 --layout a2a --kernel fused --form explicit,laga \
    --repeat 3 --warmup 1 $flag --out "$out/$name.json" || rc=1
done
# The ring (p2p: its next shift always runs under the chunk in hand) beside all_gather, same timed phantom.
timeout 200 "$dist/laga" bench --device cuda --model deepseek-v3 --phantom --phantom-comm timed \
  --phantom-link node,cross-node --seq "$seq" --sp 8 --layout all_gather,p2p --kernel fused --form explicit,laga \
  --repeat 3 --warmup 1 --out "$out/exposed-ring.json" || rc=1
timeout 120 "$dist/laga_gpu_tests" --gtest_filter='CudaOverlap*:CudaTimedPhantom*:CudaAttentionMerge*:P1/GpuCommP1*' || rc=1
exit $rc
