#!/usr/bin/env bash
# One host with several GPUs: real NCCL, one rank per GPU (mpirun -np P, --comm nccl).
#   1. correctness: every form x layout (fused; eager for explicit and LAGA; p2p: explicit and LAGA) at each P, model small,
#      S = 256, batch 2, bf16, `--check` against the single-rank explicit result, LAGA and absorbed also
#      against explicit at the same P (1e-3 for LAGA), and against the CPU's float64 result;
#   2. DeepSeek-V3 size, fused, explicit and LAGA in the three layouts, S = 4k..32k at each P: the block's time per
#      phase after one warm-up pass, every collective's time and bus bandwidth, LAGA / explicit speed-up, and
#      the alpha-beta model's prediction for the same points (scripts/multi_gpu_table.py).
# NVLink multicast stays off (the device notes: it can take the host's GPUs out of service).
#
#   (here)  ninja -C build laga && bash scripts/gpu_run_check.sh pack build     # carry build/dist-run
#   (there) bash scripts/gpu_multi.sh build/dist-run ["2 4 8"] [parts, default 12] ["4096 8192 16384 32768"]
# (the second argument: the P to run, default the number of GPUs; the fourth: the sequence lengths of part 2)
# Summary to stdout; JSON documents, logs (logs.tar.gz) and multi-gpu.json to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-build/dist-run}" && pwd)
gpus=$(nvidia-smi -L | grep -c GPU)
ps=${2:-$gpus}
parts=${3:-12}
seqs=${4:-4096 8192 16384 32768}
final=${OUT:-/tmp/laga_gpu_multi}
mkdir -p "$final"
out=$(mktemp -d /tmp/laga_gpu_multi.XXXXXX)
trap 'tar -czf "$final/logs.tar.gz" -C "$out" . 2>/dev/null; cp "$out"/multi-gpu*.json "$final/" 2>/dev/null' EXIT
. scripts/gpu_env.sh  # libraries, NVLink multicast off
export OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_DEBUG=WARN OPENBLAS_NUM_THREADS=4
LAGA=$dist/laga
mpi() { timeout "$1" mpirun -np "$2" --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_DEBUG \
          -x OPENBLAS_NUM_THREADS "$LAGA" run --device cuda --comm nccl "${@:3}"; }
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -6

if [[ $parts == *1* ]]; then
  t=$(date +%s)
  echo; echo "== 1. correctness with NCCL, one rank per GPU (model small, S = 256, batch 2, bf16)"
  docs=()
  for P in $ps; do
    for layout in a2a all_gather; do
      for variant in "explicit" "laga" "laga --recompute kv" "absorbed --absorbed-attention mqa" \
                     "absorbed --absorbed-attention expanded" "explicit --kernel eager" "laga --kernel eager"; do
        tag=check_p${P}_$(echo "$variant $layout" | tr -c 'a-z0-9\n' '_')
        # shellcheck disable=SC2086
        mpi 90 "$P" --model small --seq 256 --batch 2 --form $variant --layout "$layout" --check \
          --json "$out/$tag.json" >"$out/$tag.log" 2>&1 || echo "  exit $? for P=$P $variant $layout"
        docs+=("$out/$tag.json")
      done
    done
  done
  for P in $ps; do  # the ring (p2p): explicit and laga, fused
    for form in explicit laga; do
      tag=check_p${P}_${form}_p2p
      mpi 90 "$P" --model small --seq 256 --batch 2 --form "$form" --layout p2p --check \
        --json "$out/$tag.json" >"$out/$tag.log" 2>&1 || echo "  exit $? for P=$P $form p2p"
      docs+=("$out/$tag.json")
    done
  done
  python3 scripts/check_table.py "${docs[@]}"
  grep -h -m1 -iE 'error|warn' "$out"/check_*.log | sort -u | head -5
  echo "part 1 ($(( $(date +%s) - t )) s)"
fi

if [[ $parts == *2* ]]; then
  t=$(date +%s)
  echo; echo "== 2. DeepSeek-V3, bf16, fused: block time, collectives, LAGA vs explicit (one warm-up pass)"
  docs=()
  for P in $ps; do
    for seq in $seqs; do
      for layout in a2a all_gather p2p; do
        for form in explicit laga; do
          tag=dsv3_p${P}_s${seq}_${layout}_${form}
          mpi 120 "$P" --model deepseek-v3 --seq "$seq" --form "$form" --layout "$layout" --kernel fused \
            --warmup 1 --json "$out/$tag.json" >"$out/$tag.log" 2>&1 || echo "  exit $? for $tag"
          docs+=("$out/$tag.json")
        done
      done
    done
  done
  python3 scripts/multi_gpu_table.py "${docs[@]}" --laga "$LAGA" --json "$out/multi-gpu-dsv3.json"
  echo "part 2 ($(( $(date +%s) - t )) s)"
fi
