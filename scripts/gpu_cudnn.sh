#!/usr/bin/env bash
# The cuDNN attention provider and the PyTorch peer on one GPU, in one call (parts by letter):
#   t. the GPU tests of the provider (every attention case under --attention-provider cudnn against the CPU in
#      float64, bitwise reruns, refusals) and laga's 192/128 kernels beside them;
#   b. `laga run --check` of the whole block (DeepSeek-V3, S = 512) with --attention-provider cudnn;
#   a. `laga bench-attention`: both providers' fused attention at DeepSeek-V3's per-rank shapes (S = 4k, 16k,
#      32k, P = 8, a2a and all_gather) -> attention-providers.json, the table `auto` chooses from;
#   p. `laga bench --device cuda --phantom`, DeepSeek-V3, a2a, P = 8, fused, per provider (laga: LAGA,
#      explicit, absorbed; cudnn: LAGA, explicit; auto: LAGA, explicit; cudnn and auto again with
#      --nondeterministic) -> h200-block-<provider>[-nondet].json;
#   c. scripts/peer_torch_block.py: the same rank in plain PyTorch (SDPA), explicit and LAGA, eager and with
#      torch.compile around the attention -> peer.json.
# Everything in $OUT/cudnn.tar.gz ($OUT defaults to /tmp/laga_gpu_cudnn); a summary to stdout.
#
#   (here)  ninja -C build laga laga_gpu_tests && bash scripts/gpu_run_check.sh pack build
#           (carry build/dist-run with this scripts/ folder; tar it if the 64 MiB limit bites)
#   (there) bash scripts/gpu_cudnn.sh build/dist-run [parts, default tbapc] [seqs, default 4096,16384,32768]
# The device machine has two cuDNNs: 9.14 under /usr/lib and 9.19 in PyTorch's wheel; laga is pointed at
# PyTorch's (the one its SDPA runs), and the JSON documents record the version loaded.
set -uo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-build/dist-run}" && pwd)
parts=${2:-tbapc}
seqs=${3:-4096,16384,32768}
final=${OUT:-/tmp/laga_gpu_cudnn}
mkdir -p "$final"
out=$(mktemp -d /tmp/laga_gpu_cudnn.XXXXXX)
trap 'tar -czf "$final/cudnn.tar.gz" -C "$out" .' EXIT
python=/opt/torch/.venv/bin/python
[ -x "$python" ] || python=python3
plain_ld=${LD_LIBRARY_PATH:-}  # the peer runs with the machine's own library path (PyTorch finds its libraries)
source scripts/gpu_env.sh
# laga opens the cuDNN PyTorch ships with (the peer's), ahead of any other copy on the library path.
torch_cudnn=$("$python" -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$torch_cudnn" ] && export LD_LIBRARY_PATH="$torch_cudnn:$LD_LIBRARY_PATH"
laga=$dist/laga
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
t0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }

if [[ $parts == *t* ]]; then
  stamp tests
  "$dist/laga_gpu_tests" --gtest_filter='*Cudnn*:*AttentionProvider*:Ops/CudaAttention.*mha_192_128*fused_bf16' \
    >"$out/tests.txt" 2>&1
  echo "exit $?"
  grep -E '^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \]|GPUCHECK cudnn version' "$out/tests.txt" | sort -u | head -30
  grep -E 'GPUCHECK' "$out/tests.txt" | grep -E 'Cudnn' | awk '{print $3, $4, $5}' | sort -k3 | tail -8
fi
if [[ $parts == *b* ]]; then
  stamp block-check
  # The whole block at DeepSeek-V3's head dims with cuDNN's attention, against explicit on the same backend
  # (bit-identical expected) and the CPU in float64.
  for form in laga explicit; do
    "$laga" run --device cuda --model deepseek-v3 --seq 512 --form $form --attention-provider cudnn --check \
      --json "$out/check-cudnn-$form.json" >"$out/check-cudnn-$form.txt" 2>&1
    echo "$form: exit $?"; grep -E "check|rel|attention calls|error" "$out/check-cudnn-$form.txt" | tail -8
  done
fi
if [[ $parts == *a* ]]; then
  stamp bench-attention
  "$laga" bench-attention --model deepseek-v3 --seq "$seqs" --sp 8 --out "$out/attention-providers.json" \
    2>&1 | tee "$out/bench-attention.txt" | grep -vE '^done'
fi
if [[ $parts == *p* ]]; then
  # cudnn-nondet, auto-nondet: the same with --nondeterministic (cuDNN's non-deterministic backward, as SDPA's).
  for run in laga cudnn auto cudnn-nondet auto-nondet; do
    provider=${run%-nondet}
    flag=""
    [ "$run" != "$provider" ] && flag=--nondeterministic
    forms=laga,explicit
    [ $provider = laga ] && forms=laga,explicit,absorbed
    stamp "bench $run"
    "$laga" bench --device cuda --phantom --model deepseek-v3 --seq "$seqs" --sp 8 --layout a2a --kernel fused \
      --form $forms --attention-provider $provider $flag --repeat 5 --warmup 1 --out "$out/h200-block-$run.json" \
      >"$out/bench-$run.txt" 2>&1
    echo "exit $?"; tail -12 "$out/bench-$run.txt"
  done
fi
if [[ $parts == *c* ]]; then
  stamp peer
  LD_LIBRARY_PATH=$plain_ld "$python" scripts/peer_torch_block.py --seq "$seqs" --sp 8 --form explicit,laga \
    --compile both --out "$out/peer.json" 2>&1 | tee "$out/peer.txt" | grep -E '^peer'
fi
stamp done
