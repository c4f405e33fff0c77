#!/usr/bin/env bash
# Every check and measurement of one GPU machine, in one script, each part with its own time limit:
#   1. the GPU test suite (every kernel against the CPU in float64, the block per form x layout x kernel,
#      LAGA bit-identical to explicit at P = 1)                                  -> scripts/gpu_check.sh run
#   2. the CLI end to end: P = 1 checks, phantom rank 7 of 8 at DeepSeek-V3 (saved bytes EQUAL to the plan),
#      mpirun -np 2|4|8 on the one GPU with --check (LAGA vs explicit at the same P, 1e-3 in bf16)
#                                                                                 -> scripts/gpu_run_check.sh run
#   3. the attention kernels' TFLOP/s next to PyTorch's scaled_dot_product_attention (cuDNN) at the same
#      shapes, measured in this call                                              -> test_cuda_perf + bench_sdpa.py
#   4. the block's cuBLASLt GEMMs in the block vs alone (phantom rank 7 of 8, DeepSeek-V3 S = 16384)
#                                                                                 -> laga bench --gemm-check
#   5. the committed H200 documents, re-measured: bench/results/h200-deepseek-v3-{fused,eager}.json
#   6. explicit vs LAGA attention on a phantom rank with the SM clock and power sampled (nvidia-smi, 50 ms)
#
#   (here)  cmake -B build-nccl -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build-nccl laga laga_gpu_tests
#           bash scripts/gpu_run_check.sh pack build-nccl                         # carry build-nccl/dist-run
#   (there) bash scripts/gpu_all.sh build-nccl/dist-run [parts, default 1234]
#
# The summary goes to stdout; to $OUT (or /tmp/laga_gpu_all): the JSON documents and all logs in one archive
# (logs.tar.gz: the device returns few files).
set -uo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-build-nccl/dist-run}" && pwd)
parts=${2:-123456}
final=${OUT:-/tmp/laga_gpu_all}
mkdir -p "$final"
out=$(mktemp -d /tmp/laga_gpu_all.XXXXXX)
finish() {
  tar -czf "$final/logs.tar.gz" -C "$out" . 2>/dev/null
  cp "$out"/*.json "$final/" 2>/dev/null
}
trap finish EXIT
. scripts/gpu_env.sh  # libraries, NVLink multicast off
elapsed() { echo "($(( $(date +%s) - $1 )) s)"; }

if [[ $parts == *1* ]]; then
  t=$(date +%s)
  echo "== 1. GPU test suite"
  OUT=$out/tests timeout 420 bash scripts/gpu_check.sh run "$dist" '*:-*DISABLED*' >"$out/tests.txt" 2>&1
  grep -E '^\[  FAILED  \]' "$out/tests.txt" | sort -u | head -20
  grep -A12 -E 'Failure' "$out/tests/gpu_tests.log" | head -60
  grep -E '^\[  PASSED  \]|^exit code' "$out/tests.txt"
  echo "part 1 $(elapsed "$t")"
fi
if [[ $parts == *2* ]]; then
  t=$(date +%s)
  echo; echo "== 2. the CLI on the GPU"
  OUT=$out/run timeout 540 bash scripts/gpu_run_check.sh run "$dist"
  echo "part 2 $(elapsed "$t")"
fi
if [[ $parts == *3* ]]; then
  t=$(date +%s)
  echo; echo "== 3. attention TFLOP/s (ours, then PyTorch SDPA at the 192/128 shapes)"
  timeout 300 "$dist/laga_gpu_tests" --gtest_also_run_disabled_tests \
    --gtest_filter='CudaPerf.DISABLED_Attention*LongSequences' >"$out/perf.log" 2>&1
  grep -E '^GPUPERF' "$out/perf.log" | sed 's/^GPUPERF //'
  grep -E 'FAILED|rror' "$out/perf.log" | head -5
  # PyTorch with its own libraries: the system's cuDNN (found through our LD_LIBRARY_PATH) is older.
  env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 timeout 200 python3 scripts/bench_sdpa.py >"$out/sdpa.log" 2>&1
  grep -vE '^\s*$' "$out/sdpa.log" | tail -8
  echo "part 3 $(elapsed "$t")"
fi
if [[ $parts == *4* ]]; then
  t=$(date +%s)
  echo; echo "== 4. cuBLASLt GEMMs in the block vs alone (phantom rank 7 of 8, DeepSeek-V3, S = 16384, bf16)"
  timeout 300 "$dist/laga" bench --device cuda --model deepseek-v3 --phantom --seq 16384 --sp 8 \
    --form explicit,laga,absorbed --kernel fused --layout a2a,all_gather --repeat 3 --gemm-check \
    --out "$out/gemm_check_dsv3_s16k_p8.json" >"$out/gemm_check.log" 2>&1
  echo "exit $?"
  grep -E 'gemms:|a2a|all_gather' "$out/gemm_check.log" | tail -14
  echo "part 4 $(elapsed "$t")"
fi
if [[ $parts == *5* ]]; then
  t=$(date +%s)
  echo; echo "== 5. bench documents (phantom rank P-1, DeepSeek-V3, bf16)"
  timeout 240 "$dist/laga" bench --model deepseek-v3 --device cuda --dtype bfloat16 --seq 4096,8192,16384,32768 \
    --sp 8 --batch 1 --form all --layout all --kernel fused --repeat 5 --warmup 1 --seed 1 --phantom \
    --out "$out/h200-deepseek-v3-fused.json" >"$out/bench_fused.log" 2>&1
  echo "fused: exit $?"
  timeout 240 "$dist/laga" bench --model deepseek-v3 --device cuda --dtype bfloat16 --seq 4096,8192,16384 \
    --sp 4,8,16 --batch 1 --form all --layout all --kernel eager --repeat 3 --warmup 1 --seed 1 --phantom \
    --out "$out/h200-deepseek-v3-eager.json" >"$out/bench_eager.log" 2>&1
  echo "eager: exit $?"
  echo "part 5 $(elapsed "$t")"
fi
if [[ $parts == *6* ]]; then
  t=$(date +%s)
  echo; echo "== 6. phantom explicit vs LAGA (a2a, fused, S = 16384): attention time, SM clock, power"
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 50 >"$out/clock.csv" 2>&1 &
  smi=$!
  for form in explicit laga explicit laga; do
    echo "$form start $(date +%s.%N)" >>"$out/clock_marks.txt"
    timeout 120 "$dist/laga" bench --model deepseek-v3 --device cuda --seq 16384 --sp 8 --phantom --form "$form" \
      --layout a2a --kernel fused --repeat 10 --warmup 2 --out "$out/clock_$form.json" >/dev/null 2>&1
    echo "$form end $(date +%s.%N)" >>"$out/clock_marks.txt"
  done
  kill "$smi" 2>/dev/null
  python3 - "$out" <<'PY'
import csv, datetime, json, sys
out = sys.argv[1]
marks = [l.split() for l in open(f"{out}/clock_marks.txt")]
rows = []
for r in csv.reader(open(f"{out}/clock.csv")):
    try:
        ts = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        rows.append((ts, float(r[1].split()[0]), float(r[2].split()[0])))
    except Exception:
        pass
for i in range(0, len(marks), 2):
    form, t0, t1 = marks[i][0], float(marks[i][2]), float(marks[i + 1][2])
    inside = [r for r in rows if t0 <= r[0] <= t1]
    d = json.load(open(f"{out}/clock_{form}.json"))
    att = d["points"][0]["time"]["forward"]["by_phase"]["attention"]["median"] * 1e3
    attb = d["points"][0]["time"]["backward"]["by_phase"]["attention"]["median"] * 1e3
    if inside:
        print(f"{form:9s} attention fwd {att:6.2f} ms bwd {attb:6.2f} ms | SM clock median {sorted(r[1] for r in inside)[len(inside)//2]:.0f} MHz,"
              f" min {min(r[1] for r in inside):.0f}; power max {max(r[2] for r in inside):.0f} W ({len(inside)} samples)")
    else:
        print(f"{form:9s} attention fwd {att:6.2f} ms bwd {attb:6.2f} ms | no clock samples")
PY
  echo "part 6 $(elapsed "$t")"
fi
