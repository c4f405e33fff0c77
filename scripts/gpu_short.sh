#!/usr/bin/env bash
# The GPU checks that fit a few minutes on one GPU, in order of need:
#   A. correctness, three jobs side by side (their timings are not reported, so they may share the GPU):
#      - the GPU test suite (every kernel against the CPU in float64, the block per form x layout x kernel,
#        LAGA bit-identical to explicit at P = 1)                           scripts/gpu_check.sh run
#      - the communicator tests and mpirun -np 2|4|8 --check on the one GPU (host staging; LAGA vs explicit
#        at the same P, 1e-3 in bf16), all_gather again with the K/V
#        gradients reduced in float32                                       scripts/gpu_run_check.sh run, steps 1 4 5
#      - every form x layout through NCCL at P = 1 with --check             scripts/gpu_multi.sh, part 1, P = 1
#   B. measurements, one at a time, each started only if the time left allows it:
#      - phantom rank 7 of 8, DeepSeek-V3, S = 16384: every variant's saved bytes against the plan, device
#        memory with the eager scratch cap                                  scripts/gpu_run_check.sh run, step 3
#      - the block's cuBLASLt GEMMs in the block vs alone                   scripts/gpu_all.sh, part 4
#      - DeepSeek-V3 S = 16384 at P = 1 through NCCL with timed collectives scripts/gpu_multi.sh, part 2, P = 1
#      - attention TFLOP/s next to PyTorch SDPA                             scripts/gpu_all.sh, part 3
#      - the committed H200 bench documents, re-measured (not by default)   scripts/gpu_all.sh, part 5
# Parts by letter: t tests, m mpirun, n NCCL at P = 1, p phantom, g GEMMs, d DeepSeek-V3 through NCCL,
# a attention, b bench documents; the default is tmnpgda.
#
#   (here)  cmake -B build-nccl -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-nccl laga laga_gpu_tests
#           bash scripts/gpu_run_check.sh pack build-nccl                         # carry build-nccl/dist-run
#   (there) bash scripts/gpu_short.sh build-nccl/dist-run [seconds, default 390] [parts, default tmnpgda]
# Summary to stdout; every part's files in $OUT/short.tar.gz, plus the JSON of the multi-GPU table.
set -uo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-build-nccl/dist-run}" && pwd)
budget=${2:-390}
parts=${3:-tmnpgda}
final=${OUT:-/tmp/laga_gpu_short}
mkdir -p "$final"
out=$(mktemp -d /tmp/laga_gpu_short.XXXXXX)
trap 'tar -czf "$final/short.tar.gz" -C "$out" . 2>/dev/null' EXIT
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
# Runs "$@" with OUT=$out/<name> if at least <need> seconds are left; its output to $out/<name>.txt.
part() {
  local name=$1 need=$2; shift 2
  [[ $parts == *${name:0:1}* ]] || return 0
  if (( $(left) < need )); then echo "== $name: skipped ($(left) s left, needs $need)"; return; fi
  mkdir -p "$out/$name"
  OUT=$out/$name timeout "$(( $(left) - 5 ))" "$@" >"$out/$name.txt" 2>&1
  echo "== $name: exit $? at $(( $(date +%s) - t0 )) s"
}

echo "== A. correctness (side by side)"
part tests 60 bash scripts/gpu_check.sh run "$dist" '*:-*DISABLED*' &
part mpirun 60 bash scripts/gpu_run_check.sh run "$dist" 145 &
part nccl_p1 60 bash scripts/gpu_multi.sh "$dist" 1 1 &
wait
grep -E '^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \] [0-9]' "$out/tests.txt" 2>/dev/null | sort -u | head -20
grep -A12 -E '== worst' "$out/tests.txt" 2>/dev/null | head -40
sed -n '/== 1\./,$p' "$out/mpirun.txt" 2>/dev/null | grep -vE '^\s*$' | head -90
grep -vE '^\s*$' "$out/nccl_p1.txt" 2>/dev/null | tail -22

echo; echo "== B. measurements (one at a time)"
part phantom 90 bash scripts/gpu_run_check.sh run "$dist" 3
sed -n '/== 3\./,$p' "$out/phantom.txt" 2>/dev/null | head -40
part gemms 60 bash scripts/gpu_all.sh "$dist" 4
grep -vE '^\s*$' "$out/gemms.txt" 2>/dev/null | tail -12
part dsv3_nccl 45 bash scripts/gpu_multi.sh "$dist" 1 2 16384
grep -vE '^\s*$' "$out/dsv3_nccl.txt" 2>/dev/null | tail -30
cp "$out"/dsv3_nccl/multi-gpu*.json "$final/" 2>/dev/null
part attention 80 bash scripts/gpu_all.sh "$dist" 3
grep -vE '^\s*$' "$out/attention.txt" 2>/dev/null | tail -24
part bench_documents 60 bash scripts/gpu_all.sh "$dist" 5
grep -vE '^\s*$' "$out/bench_documents.txt" 2>/dev/null | tail -8
cp "$out"/bench_documents/h200-*.json "$final/" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
