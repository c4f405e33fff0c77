#!/usr/bin/env bash
# The GPU suites on a machine with an NVIDIA GPU, and a short table of what they measured.
#
#   scripts/gpu_check.sh pack [build-dir]          (here) copy the GPU test binary and the shared libraries
#                                                  a bare GPU machine may lack (OpenBLAS and its Fortran
#                                                  runtime) into <build-dir>/dist, the folder to carry
#   scripts/gpu_check.sh run [dist-dir] [filter]   (there) run the tests (plus the disabled timing tests),
#                                                  print PASS/FAIL counts, the worst relative error per op
#                                                  and dtype, and the timings; full logs go to $OUT or /tmp
#   scripts/gpu_check.sh sanitize [dist-dir]       (there) compute-sanitizer memcheck and racecheck over
#                                                  small cases of every kernel
#
# The build: cmake -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-gpu laga_gpu_tests
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}

if [[ $mode == pack ]]; then
  build=${2:-build-gpu}
  dist=$build/dist
  rm -rf "$dist" && mkdir -p "$dist/libs"
  cp "$build/tests/gpu/laga_gpu_tests" "$dist/"
  ldd "$build/tests/gpu/laga_gpu_tests" | awk '/=> \// {print $3}' | grep -E 'openblas|gfortran|quadmath|gomp' |
    while read -r lib; do cp -L "$lib" "$dist/libs/"; done
  du -sh "$dist"; ls "$dist/libs"
  exit 0
fi

dist=${2:-build-gpu/dist}
filter=${3:-*}
out=${OUT:-/tmp/laga_gpu_check}
mkdir -p "$out"
bin=$dist/laga_gpu_tests
# cuBLASLt comes from the machine: the toolkit's lib64, or the pip wheel nvidia-cublas.
cublas_dirs=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib /opt /usr/local/lib -name 'libcublasLt.so.13*' \
  -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$dist/libs:${cublas_dirs}${LD_LIBRARY_PATH:-}"
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-8}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader || true
if ldd "$bin" | grep -q 'not found'; then
  echo "missing libraries:"; ldd "$bin" | grep 'not found'; exit 1
fi

if [[ $mode == sanitize ]]; then
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  [[ -n $cs ]] || { echo "compute-sanitizer not found"; exit 1; }
  mem='*CudaGemm*f32*:*CudaCopy*bf16*:*CudaRmsNorm*small*:*CudaRope*query*:*CudaAttention*tiny_mha*:*CudaAttention*gqa_offset*:*CudaAttention*single_query*:*CudaAttention*negative*:*CudaAttention*dims_264*'
  race='*CudaAttention.*/gqa_offset_fused_f32:*CudaAttention.*/dims_264_large_tiles_fused_bf16:*CudaAttention.*/mha_offset_unseen_keys_fused_bf16:*CudaRmsNorm*small_strided_f32'
  for tool in memcheck racecheck; do
    f=$mem; [[ $tool == racecheck ]] && f=$race
    timeout 300 "$cs" --tool "$tool" --error-exitcode 3 "$bin" --gtest_filter="$f" >"$out/sanitize_$tool.log" 2>&1
    echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_$tool.log" | tail -1)" \
      "$(grep -cE '^\[       OK \]' "$out/sanitize_$tool.log") tests ok"
    grep -E '^=========' "$out/sanitize_$tool.log" | head -20
  done
  exit 0
fi

start=$(date +%s)
"$bin" --gtest_filter="$filter" --gtest_also_run_disabled_tests >"$out/gpu_tests.log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
# (the host-staging suite's lines have another layout: scripts/gpu_run_check.sh reads them)
grep '^GPUCHECK' "$out/gpu_tests.log" | grep -v '^GPUCHECK HostStaging' >"$out/gpu_checks.txt"
grep -E '^\[  FAILED  \]' "$out/gpu_tests.log" | sort -u | head -40
grep -B3 -E 'Failure|error:' "$out/gpu_tests.log" | head -60

echo
echo "== worst relative error per suite, output and dtype (against CPU float64) =="
awk -f scripts/gpu_check_summary.awk \
  "$out/gpu_checks.txt" | sort
echo
echo "== timings =="
grep '^GPUPERF' "$out/gpu_tests.log" | sed 's/^GPUPERF //'
echo
grep -E '^\[  PASSED  \]|^\[  FAILED  \] [0-9]+ test|^\[  SKIPPED \] [0-9]+ test|tests? ran' "$out/gpu_tests.log"
echo "exit code $rc, ${secs}s"
exit $rc
