#!/usr/bin/env bash
# Where one rank's block spends its time, op by op, on one GPU (parts by letter):
#   t. the GPU tests of the cuDNN provider, its non-deterministic backward among them;
#   b. `laga run --check` of the whole block (DeepSeek-V3, S = 512, LAGA) with cuDNN's non-deterministic backward;
#   a. `laga bench-attention` (a2a shapes): laga's kernels, cuDNN's deterministic and non-deterministic backward;
#   o. `laga bench --phantom --op-profile`, DeepSeek-V3, a2a, P = 8, LAGA and explicit, with cuDNN's deterministic
#      and non-deterministic backward: every op's median time -> ops-<mode>.json;
# with `nvidia-smi dmon` (power, clocks) sampled throughout into dmon.txt. Everything in $OUT/profile.tar.gz.
#
#   (here)  ninja -C build laga laga_gpu_tests && bash scripts/gpu_run_check.sh pack build
#   (there) bash scripts/gpu_block_profile.sh build/dist-run [parts, default tbao] [seqs, default 4096,16384,32768]
set -uo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-build/dist-run}" && pwd)
parts=${2:-tbao}
seqs=${3:-4096,16384,32768}
final=${OUT:-/tmp/laga_gpu_profile}
mkdir -p "$final"
out=$(mktemp -d /tmp/laga_gpu_profile.XXXXXX)
trap 'kill $dmon 2>/dev/null; tar -czf "$final/profile.tar.gz" -C "$out" .' EXIT
python=/opt/torch/.venv/bin/python
[ -x "$python" ] || python=python3
source scripts/gpu_env.sh
torch_cudnn=$("$python" -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$torch_cudnn" ] && export LD_LIBRARY_PATH="$torch_cudnn:$LD_LIBRARY_PATH"
laga=$dist/laga
nvidia-smi dmon -s pc -d 1 >"$out/dmon.txt" 2>&1 &
dmon=$!
t0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }

if [[ $parts == *t* ]]; then
  stamp tests
  "$dist/laga_gpu_tests" --gtest_filter='*Cudnn*:*AttentionProvider*' >"$out/tests.txt" 2>&1
  echo "exit $?"
  grep -E '^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \]' "$out/tests.txt" | sort -u | head -20
  grep -E 'GPUCHECK .*mha_192_128.*workspace' "$out/tests.txt" | head -6
fi
if [[ $parts == *b* ]]; then
  stamp block-check
  "$laga" run --device cuda --model deepseek-v3 --seq 512 --form laga --attention-provider cudnn --nondeterministic \
    --check --json "$out/check-nondet.json" >"$out/check-nondet.txt" 2>&1
  echo "exit $?"; grep -E "check|rel|attention calls|error" "$out/check-nondet.txt" | tail -6
fi
if [[ $parts == *a* ]]; then
  stamp bench-attention
  "$laga" bench-attention --model deepseek-v3 --seq "$seqs" --sp 8 --layout a2a --out "$out/attention.json" \
    2>&1 | tee "$out/bench-attention.txt" | grep -vE '^done'
  # The same with 30 repeats: does a longer stretch of back-to-back calls run slower (power, clocks)?
  "$laga" bench-attention --model deepseek-v3 --seq "${seqs##*,}" --sp 8 --layout a2a --repeat 30 \
    --out "$out/attention-long.json" 2>&1 | tee "$out/bench-attention-long.txt" | grep -vE '^done'
fi
if [[ $parts == *o* ]]; then
  for mode in det nondet; do
    flag=""
    [ $mode = nondet ] && flag=--nondeterministic
    stamp "op profile $mode"
    "$laga" bench --device cuda --phantom --model deepseek-v3 --seq "$seqs" --sp 8 --layout a2a --kernel fused \
      --form laga,explicit --attention-provider cudnn $flag --repeat 5 --warmup 1 --op-profile \
      --out "$out/ops-$mode.json" >"$out/ops-$mode.txt" 2>&1
    echo "exit $?"; grep -vE '^ +(fwd|bwd) #' "$out/ops-$mode.txt" | tail -16
  done
fi
stamp done
