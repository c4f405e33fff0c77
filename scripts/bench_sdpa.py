#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention at laga's 192/128 shapes (bf16, causal): the peer of the
GPUPERF lines of tests/gpu/test_cuda_perf.cpp (DISABLED_AttentionBf16LongSequences).

Times forward and forward+backward with CUDA events (median of --reps after --warmup), backward as the
difference, and prints TFLOP/s with the convention of src/cuda/NOTES.md: forward 2 (d_qk + d_v), backward 2 (3 d_qk + 2 d_v)
per unmasked (query, key, head). Tries cuDNN first, then PyTorch's default choice, and says which ran.

    python3 scripts/bench_sdpa.py [--shapes h16_s8k,h128_s8k,...] [--reps 5]
"""
import argparse
import contextlib
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {  # name: (heads, seq)
    "h16_s8k": (16, 8192),
    "h128_s8k": (128, 8192),
    "h16_s32k": (16, 32768),
    "h128_s32k": (128, 32768),
}
D_QK, D_V = 192, 128


def median_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(name, heads, seq, backends, warmup, reps):
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape_qk, shape_v = (1, heads, seq, D_QK), (1, heads, seq, D_V)
    q = (torch.rand(shape_qk, device="cuda", generator=gen, dtype=torch.bfloat16) * 2 - 1).requires_grad_()
    k = (torch.rand(shape_qk, device="cuda", generator=gen, dtype=torch.bfloat16) * 2 - 1).requires_grad_()
    v = (torch.rand(shape_v, device="cuda", generator=gen, dtype=torch.bfloat16) * 2 - 1).requires_grad_()
    dout = torch.rand(shape_v, device="cuda", generator=gen, dtype=torch.bfloat16) * 2 - 1
    pairs = seq * (seq + 1) / 2 * heads
    fwd_flops, bwd_flops = 2 * (D_QK + D_V) * pairs, 2 * (3 * D_QK + 2 * D_V) * pairs
    for label, backend in backends:
        try:
            ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
            with ctx:
                def fwd():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def fwd_bwd():
                    q.grad = k.grad = v.grad = None
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)

                t_fwd = median_ms(fwd, warmup, reps)
                t_all = median_ms(fwd_bwd, warmup, reps)
        except RuntimeError as e:  # backend not available for these shapes
            print(f"SDPA {name} {label}: not available ({str(e).splitlines()[0][:100]})", flush=True)
            torch.cuda.empty_cache()
            continue
        t_bwd = t_all - t_fwd
        print(f"SDPA mha_192_128_{name:<10} {label:<8} fwd {t_fwd:9.3f} ms {fwd_flops / t_fwd / 1e9:7.1f} TFLOP/s"
              f"   bwd {t_bwd:9.3f} ms {bwd_flops / t_bwd / 1e9:7.1f} TFLOP/s", flush=True)
        break
    del q, k, v, dout
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}", flush=True)
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("default", None)]
    for name in args.shapes.split(","):
        heads, seq = SHAPES[name]
        run(name, heads, seq, backends, args.warmup, args.reps)


if __name__ == "__main__":
    main()
