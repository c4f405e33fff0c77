#!/usr/bin/env python3
"""laga's PyTorch module on one GPU (bf16), in one process, writing one JSON document:

1. check: the module against `laga run --device cuda --save DIR` for the same seed and weights (the CLI's
   weights loaded into the module through the Hugging Face layout): output, input gradient and every
   weight gradient (the CLI's float32 gradients rounded to bf16, the dtype the module writes them in),
   relative error;
2. bench: forward + backward time (CUDA events around each of --reps steps run back to back after --warmup,
   median) and peak memory
   (torch.cuda.max_memory_allocated above what was allocated before forward) of the module for every
   variant, of a pure-PyTorch MLA module using scaled_dot_product_attention, and laga's own block time for
   the same configuration from `laga run --device cuda --warmup N --grad-dtype bfloat16 --json` (the module's
   overhead over it);
3. the module's step against the C++ block called straight through torch.ops.laga on the same tensors, in
   alternating rounds of back-to-back steps in this process (the same clocks for both): the module's own cost;
4. cuda_graph: the module's step (LAGA, S = 4096) captured in a CUDA graph and replayed, against an eager step:
   the same bits, and the replay's time over the eager step's;
5. autocast: the module with float32 parameters under torch.autocast(bfloat16) (S = 4096) against a bfloat16
   module on the rounded parameters: the same bits, and both steps' times;
6. saved_tensor_hooks: the module's step (LAGA, S = 4096) under activation checkpointing (non-reentrant) and under
   save_on_cpu against the plain step: the same bits, and the device memory its forward leaves allocated; and a
   forward under torch.no_grad (which keeps nothing): the plain forward's output bits, its peak;
7. nccl_group: the module over a one-rank NCCL process group against the module without one.

    python3 scripts/gpu_torch.py --cli build/laga --out torch_gpu.json [--seqs 4096,16384] [--model deepseek-v3]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

import laga
import laga.torch as lt

VARIANTS = [("explicit", None, "mqa"), ("absorbed", None, "mqa"), ("absorbed", None, "expanded"), ("laga", None, "mqa"),
            ("laga", "kv", "mqa")]


def variant_name(form, recompute, absorbed):
    return form + ("_" + absorbed if form == "absorbed" else "") + ("_recompute_kv" if recompute else "")


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm()) if b.norm() > 0 else float((a - b).norm())


HF_NAMES = ("q_a_proj", "q_a_layernorm", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
            "o_proj")


def hf_state_from_npy(d, prefix=""):
    """The CLI's weights (README's table: Hugging Face's names and layout) as a state dict."""
    return {n + ".weight": torch.from_numpy(np.load(os.path.join(d, prefix + n + ".npy"))) for n in HF_NAMES
            if os.path.exists(os.path.join(d, prefix + n + ".npy"))}


def check(args, form, seq):
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([args.cli, "run", "--device", "cuda", "--model", args.model, "--seq", str(seq), "--form", form,
                        "--seed", "1", "--save", d], check=True, capture_output=True, text=True)
        sd = hf_state_from_npy(d)
        load = lambda n: torch.from_numpy(np.load(os.path.join(d, n + ".npy")))  # noqa: E731
        x, dy, y_cli, dx_cli = load("x"), load("dy"), load("y"), load("dx")
        mod = lt.MultiheadLatentAttention(args.model, form=form, dtype=torch.bfloat16, device="cuda")
        mod.load_state_dict({k: v.to(torch.bfloat16) for k, v in sd.items()})
        xg = x.to("cuda", torch.bfloat16).requires_grad_(True)
        y = mod(xg)
        y.backward(dy.to("cuda", torch.bfloat16))
        errors = {"y": rel(y.detach().float().cpu(), y_cli), "dx": rel(xg.grad.float().cpu(), dx_cli)}
        grads_cli = hf_state_from_npy(d, "grad_")
        for name, p in mod.named_parameters():
            errors[name] = rel(p.grad.float().cpu(), grads_cli[name].to(torch.bfloat16).float())
        return {"form": form, "seq": seq, "rel_error": errors, "max_rel_error": max(errors.values())}


def nccl_group_check(args, seq=1024):
    """The module over a one-rank NCCL process group (laga's collectives through torch.distributed) against the
    module without a group: the same bits for the output and every gradient, and the group's traffic counted."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    out = {}
    for name, group in (("none", None), ("nccl", dist.group.WORLD)):
        torch.manual_seed(0)
        mod = lt.MultiheadLatentAttention(args.model, form="laga", group=group, dtype=torch.bfloat16, device="cuda")
        gen = torch.Generator(device="cuda").manual_seed(1)
        x = (torch.rand((1, seq, mod.config["hidden_size"]), device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)
        x.requires_grad_(True)
        y = mod(x)
        y.backward(torch.ones_like(y))
        out[name] = ([y.detach(), x.grad] + [p.grad for p in mod.parameters()], mod.last_step["traffic"])
    same = all(torch.equal(a, b) for a, b in zip(out["none"][0], out["nccl"][0]))
    return {"seq": seq, "bitwise_equal": same, "collectives": [t["collective"] for t in out["nccl"][1]]}


def alternating_ms(runs, reps):
    """Each callable of `runs` (name -> run) timed by CUDA events `reps` times, the runs taking turns (the same
    clocks for all): the median milliseconds per name."""
    times = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            torch.cuda.synchronize()
            times[name].append(a.elapsed_time(b))
    return {name: statistics.median(t) for name, t in times.items()}


def graph_check(args, seq, reps=20):
    """The module's training step (LAGA, forward and backward) captured in a CUDA graph as PyTorch's whole-network
    capture does it (warm-up steps on a side stream, then torch.cuda.graph on its own stream) and replayed: the
    output and every gradient against the last warm-up step's, bitwise (deterministic attention), and the
    replay's time against the eager step's (events, alternating, median)."""
    torch.manual_seed(0)
    mod = lt.MultiheadLatentAttention(args.model, form="laga", dtype=torch.bfloat16, device="cuda")
    x, dy, _ = module_inputs(mod, seq, mod.config["hidden_size"])

    def step():  # module_inputs' step, returning the output the capture keeps
        mod.zero_grad(set_to_none=True)
        x.grad = None
        y = mod(x)
        y.backward(dy)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            y = step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    eager = [y.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in mod.parameters()]
    mod.zero_grad(set_to_none=True)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = step()
    graph.replay()
    torch.cuda.synchronize()
    got = [y_static.detach(), x.grad] + [p.grad for p in mod.parameters()]
    same = all(torch.equal(a, b) for a, b in zip(eager, got))
    times = alternating_ms({"eager": step, "replay": graph.replay}, reps)
    eager_ms, replay_ms = times["eager"], times["replay"]
    return {"seq": seq, "form": "laga", "bitwise_equal": same, "eager_ms_median": eager_ms,
            "replay_ms_median": replay_ms, "replay_over_eager": replay_ms / eager_ms}


def hooks_check(args, seq):
    """The module's step (LAGA) as it is, under activation checkpointing (non-reentrant) and under
    torch.autograd.graph.save_on_cpu: the output and every gradient bitwise against the plain step's, and the
    device memory the forward leaves allocated (its output and what is kept for backward), the forward's peak and
    the step's, all above what was allocated before it; then a forward under torch.no_grad against the plain one."""
    torch.manual_seed(0)
    mod = lt.MultiheadLatentAttention(args.model, form="laga", dtype=torch.bfloat16, device="cuda")
    x, dy, _ = module_inputs(mod, seq, mod.config["hidden_size"])
    ways = {"plain": lambda: mod(x),
            "checkpoint": lambda: torch.utils.checkpoint.checkpoint(mod, x, use_reentrant=False)}

    def on_cpu():
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return mod(x)
    ways["save_on_cpu"] = on_cpu
    out, results = {}, None
    for name, forward in ways.items():
        for _ in range(2):  # the second step is measured (buffers sized, cuDNN plans made)
            mod.zero_grad(set_to_none=True)
            x.grad = None
            torch.cuda.synchronize()
            start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            y = forward()
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() - start
            forward_peak = torch.cuda.max_memory_allocated() - start
            y.backward(dy)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - start
        got = [y.detach(), x.grad] + [p.grad for p in mod.parameters()]
        if results is None:
            results = [t.clone() for t in got]
        out[name] = {"held_after_forward_bytes": held, "forward_peak_bytes_above_start": forward_peak,
                     "peak_bytes_above_start": peak,
                     "bitwise_equal_to_plain": all(torch.equal(a, b) for a, b in zip(results, got))}
        del y, got
    # A forward no backward follows (evaluation): it keeps nothing, the plain forward's bits.
    for _ in range(2):
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            y = mod(x)
        torch.cuda.synchronize()
        out["no_grad_forward"] = {"held_after_forward_bytes": torch.cuda.memory_allocated() - start,
                                  "forward_peak_bytes_above_start": torch.cuda.max_memory_allocated() - start,
                                  "saved_bytes": mod.last_step["saved_bytes"],
                                  "bitwise_equal_to_plain": torch.equal(y, results[0])}
        del y
    return {"seq": seq, "form": "laga", **out}


def autocast_check(args, seq, reps=10):
    """The module with float32 parameters under torch.autocast(bfloat16) against the same module in bfloat16 on
    the rounded parameters: output, input gradient and every parameter gradient bitwise (the bfloat16 module's
    rounded up to float32), and both steps' times (events, alternating, median: the casts' cost)."""
    torch.manual_seed(0)
    wide = lt.MultiheadLatentAttention(args.model, form="laga", dtype=torch.float32, device="cuda")
    narrow = lt.MultiheadLatentAttention(args.model, form="laga", dtype=torch.bfloat16, device="cuda")
    narrow.load_state_dict({k: v.to(torch.bfloat16) for k, v in wide.state_dict().items()})
    x, dy, narrow_step = module_inputs(narrow, seq, narrow.config["hidden_size"])

    def wide_step():
        wide.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = wide(x)
        y.backward(dy)
        return y

    y_wide = wide_step()
    got = [y_wide.detach(), x.grad.clone()] + [p.grad for p in wide.parameters()]
    narrow.zero_grad(set_to_none=True)
    x.grad = None
    y_narrow = narrow(x)
    y_narrow.backward(dy)
    want = [y_narrow.detach(), x.grad] + [p.grad.float() for p in narrow.parameters()]
    same = all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
    times = alternating_ms({"autocast_float32_params": wide_step, "bfloat16_params": narrow_step}, reps)
    return {"seq": seq, "form": "laga", "output_dtype": str(y_wide.dtype), "bitwise_equal": same,
            **{f"{k}_ms_median": v for k, v in times.items()}}


class SdpaMLA(torch.nn.Module):
    """DeepSeek-V3 attention in plain PyTorch: the explicit form, scaled_dot_product_attention (causal)."""

    def __init__(self, c, dtype, device):
        super().__init__()
        kw = {"bias": False, "dtype": dtype, "device": device}
        d, nh, rq, rkv = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
        self.nh, self.dn, self.dr, self.dv, self.rkv = nh, c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], rkv
        self.eps = c["rms_norm_eps"]
        self.q_a_proj = torch.nn.Linear(d, rq, **kw)
        self.q_a_norm = torch.nn.Parameter(torch.ones(rq, dtype=dtype, device=device))
        self.q_b_proj = torch.nn.Linear(rq, nh * (self.dn + self.dr), **kw)
        self.kv_a_proj_with_mqa = torch.nn.Linear(d, rkv + self.dr, **kw)
        self.kv_a_norm = torch.nn.Parameter(torch.ones(rkv, dtype=dtype, device=device))
        self.kv_b_proj = torch.nn.Linear(rkv, nh * (self.dn + self.dv), **kw)
        self.o_proj = torch.nn.Linear(nh * self.dv, d, **kw)
        self.inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, self.dr, 2, dtype=torch.float32, device=device) / self.dr))
        self.scale = laga_scale(c)

    def rope(self, t, cos, sin):
        b, h, s, d = t.shape
        t = t.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
        return t * cos + torch.cat((-t[..., d // 2:], t[..., : d // 2]), dim=-1) * sin

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_b_proj(F.rms_norm(self.q_a_proj(x), (self.q_a_norm.numel(),), self.q_a_norm, self.eps))
        q = q.view(b, s, self.nh, -1).transpose(1, 2)
        q_pass, q_rot = q.split([self.dn, self.dr], dim=-1)
        k_pass, k_rot = self.kv_a_proj_with_mqa(x).split([self.rkv, self.dr], dim=-1)
        kv = self.kv_b_proj(F.rms_norm(k_pass, (self.rkv,), self.kv_a_norm, self.eps)).view(b, s, self.nh, -1).transpose(1, 2)
        k_pass, v = kv.split([self.dn, self.dv], dim=-1)
        freqs = torch.arange(s, device=x.device, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        q_rot = self.rope(q_rot, cos, sin)
        k_rot = self.rope(k_rot.reshape(b, 1, s, self.dr), cos, sin).expand(b, self.nh, s, self.dr)
        o = F.scaled_dot_product_attention(torch.cat((q_pass, q_rot), -1), torch.cat((k_pass, k_rot), -1), v,
                                           is_causal=True, scale=self.scale)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


def laga_scale(c):
    scale = (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) ** -0.5
    rs = c.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        import math
        m = 0.1 * rs["mscale_all_dim"] * math.log(rs["factor"]) + 1.0 if rs["factor"] > 1 else 1.0
        scale *= m * m
    return scale


def module_inputs(mod, seq, d):
    """The timed input and output gradient ([1, seq, d], bf16, seed 0), and one training step of `mod` on them."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand((1, seq, d), device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16).requires_grad_(True)
    dy = (torch.rand((1, seq, d), device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)

    def step():
        mod.zero_grad(set_to_none=True)
        x.grad = None
        mod(x).backward(dy)

    return x, dy, step


def time_module(mod, seq, d, warmup, reps):
    x, dy, step = module_inputs(mod, seq, d)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    # Steps back to back, as in a training loop: the host queues step i+1 while the GPU runs step i, so each
    # step's events span its own GPU work plus any time the GPU waited for the host, not the host's start-up
    # before the first kernel of an isolated step.
    # The host's own time to issue each step is kept beside it: where it reaches the GPU's, the GPU waits.
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    host = []
    for a, b in events:
        t0 = time.perf_counter()
        a.record()
        step()
        b.record()
        host.append(1e3 * (time.perf_counter() - t0))
    torch.cuda.synchronize()
    times = [a.elapsed_time(b) for a, b in events]
    mod.zero_grad(set_to_none=True)
    x.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return {"ms_median": statistics.median(times), "ms": times, "host_ms_median": statistics.median(host),
            "peak_bytes_above_start": peak}


def time_interleaved(mod, seq, d, warmup, rounds, per_round):
    """The module's step against the C++ block's own forward and backward called straight through
    torch.ops.laga (no nn.Module, no autograd: the same kernels on the same tensors), in alternating rounds of
    `per_round` back-to-back steps each, so that both see the same clocks: under sustained load the GPU
    settles at its power limit within a few hundred steps' worth of milliseconds, and a figure taken in
    another process or at another moment reads that drift, not the module's cost."""
    x, dy, module_step = module_inputs(mod, seq, d)
    x_sb, dy_sb = x.detach().transpose(0, 1).contiguous(), dy.transpose(0, 1).contiguous()
    params = [p.detach() for p in mod._hf_params()]

    def block_step():
        with torch.no_grad():
            y, saved, kept = torch.ops.laga.mla_forward(mod._block, x_sb, params, False)
            torch.ops.laga.mla_backward(saved, dy_sb, x_sb, params, [], False, kept)

    def timed(step):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(per_round)]
        for a, b in events:
            a.record()
            step()
            b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in events]

    for _ in range(warmup):
        module_step()
        block_step()
    torch.cuda.synchronize()
    mod_ms, block_ms = [], []
    for r in range(rounds):  # ABBA order, so neither always runs first
        first, second = (module_step, block_step) if r % 2 == 0 else (block_step, module_step)
        a, b = timed(first), timed(second)
        mod_ms += a if first is module_step else b
        block_ms += b if first is module_step else a
    mod.zero_grad(set_to_none=True)
    return {"module_ms_median": statistics.median(mod_ms), "block_ms_median": statistics.median(block_ms),
            "module_ms": mod_ms, "block_ms": block_ms,
            "overhead": statistics.median(mod_ms) / statistics.median(block_ms) - 1}


def cli_block(args, form, recompute, absorbed, seq):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [args.cli, "run", "--device", "cuda", "--model", args.model, "--seq", str(seq), "--form", form,
               "--absorbed-attention", absorbed, "--recompute", recompute or "none", "--warmup", str(args.warmup),
               "--grad-dtype", "bfloat16", "--json", out]  # the module's gradients: the parameters' dtype
        cmd += ["--nondeterministic"] if args.nondeterministic else []
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        r = json.load(open(out))["runs"][0]["ranks"][0]
        return {"command": " ".join(cmd[1:]), "ms_fwd_bwd": 1e3 * (r["seconds_forward_total"] + r["seconds_backward_total"]),
                "ms_fwd_bwd_span": 1e3 * (r["seconds_forward_span"] + r["seconds_backward_span"]),
                "peak_forward_bytes": r["peak_forward_bytes"], "peak_backward_bytes": r["peak_backward_bytes"]}


PARTS = ("check", "bench", "graph", "autocast", "hooks", "nccl")  # the numbered parts of the docstring, in order


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--check-seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=8,
                    help="rounds of 5 module steps and 5 steps of the C++ block through torch.ops, alternating")
    ap.add_argument("--variants", default=",".join(variant_name(*v) for v in VARIANTS),
                    help="the variants to time (default: every one)")
    ap.add_argument("--nondeterministic", action="store_true",
                    help="the module and laga run with cuDNN's non-deterministic attention backward (SDPA's)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"what to run, comma separated (default every part: {','.join(PARTS)})")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if not parts <= set(PARTS):
        ap.error(f"--parts {args.parts}: each must be one of {', '.join(PARTS)}")
    cfg = laga.config(args.model)
    doc = {"machine": {"device": torch.cuda.get_device_name(0), "host": platform.node(), "torch": torch.__version__,
                       # the carried build's commit and tree state, as `scripts/gpu.sh` exports them from BUILD
                       "commit": os.environ.get("LAGA_BUILD_COMMIT") or os.environ.get("LAGA_COMMIT", ""),
                       "dirty": {"0": False, "1": True}.get(os.environ.get("LAGA_BUILD_DIRTY", ""))},
           "command": " ".join(sys.argv), "model": args.model, "check": [], "bench": []}
    for form in ("explicit", "laga") if "check" in parts else ():
        try:
            doc["check"].append(check(args, form, args.check_seq))
        except Exception as e:  # noqa: BLE001  (recorded; the bench still runs)
            doc["check"].append({"form": form, "error": repr(e)[:2000]})
        print(json.dumps(doc["check"][-1]), flush=True)
    for seq in [int(s) for s in args.seqs.split(",")] if "bench" in parts else []:
        point = {"seq": seq, "variants": {}}
        try:
            sdpa = SdpaMLA(cfg, torch.bfloat16, "cuda")
            point["sdpa"] = time_module(sdpa, seq, cfg["hidden_size"], args.warmup, args.reps)
            del sdpa
            print(f"S={seq} sdpa module: {point['sdpa']['ms_median']:.2f} ms, peak "
                  f"{point['sdpa']['peak_bytes_above_start'] / 2**30:.2f} GiB", flush=True)
        except Exception as e:  # noqa: BLE001
            point["sdpa"] = {"error": repr(e)[:2000]}
            print(f"S={seq} sdpa module: {e!r}", flush=True)
        torch.cuda.empty_cache()
        for form, recompute, absorbed in [v for v in VARIANTS if variant_name(*v) in args.variants.split(",")]:
            mod = lt.MultiheadLatentAttention(args.model, form=form, recompute=recompute, absorbed_attention=absorbed,
                                              deterministic=not args.nondeterministic, dtype=torch.bfloat16,
                                              device="cuda")
            name = variant_name(form, recompute, absorbed)
            try:
                t = time_module(mod, seq, cfg["hidden_size"], args.warmup, args.reps)
            except Exception as e:  # noqa: BLE001
                point["variants"][name] = {"error": repr(e)[:2000]}
                print(f"S={seq} {name}: {e!r}", flush=True)
                del mod
                torch.cuda.empty_cache()
                continue
            t["interleaved"] = time_interleaved(mod, seq, cfg["hidden_size"], args.warmup, args.rounds, 5)
            t["overhead_vs_block_interleaved"] = t["interleaved"]["overhead"]
            mod.timing = True  # one more step, timed by laga (op by op, waiting at the end of each pass)
            time_module(mod, seq, cfg["hidden_size"], 1, 1)
            step = mod.last_step
            t["block_ms_fwd_bwd"] = 1e3 * (step["seconds_forward_total"] + step["seconds_backward_total"])
            t["block_ms_fwd_bwd_span"] = 1e3 * (step["seconds_forward_span"] + step["seconds_backward_span"])
            t["saved_bytes"] = step["saved_bytes"]
            t["cli"] = cli_block(args, form, recompute, absorbed, seq)
            # The module's step (events around forward + backward) against the C++ block's forward and backward
            # spans (first op's start to last op's end: the same gaps included), then against its ops alone.
            t["overhead_vs_cli"] = t["ms_median"] / t["cli"]["ms_fwd_bwd_span"] - 1
            t["overhead_vs_cli_ops"] = t["ms_median"] / t["cli"]["ms_fwd_bwd"] - 1
            t["overhead_vs_own_block"] = t["ms_median"] / t["block_ms_fwd_bwd"] - 1
            point["variants"][name] = t
            with open(args.out, "w") as f:  # after every variant: a call cut short keeps what it measured
                json.dump({**doc, "bench": doc["bench"] + [point]}, f, indent=1)
            del mod
            torch.cuda.empty_cache()
            print(f"S={seq} {name}: module {t['ms_median']:.2f} ms (its block {t['block_ms_fwd_bwd_span']:.2f} span, "
                  f"{t['block_ms_fwd_bwd']:.2f} ops; interleaved: module {t['interleaved']['module_ms_median']:.2f} ms, block "
                  f"{t['interleaved']['block_ms_median']:.2f} ms, {100 * t['overhead_vs_block_interleaved']:+.1f}%), laga run {t['cli']['ms_fwd_bwd_span']:.2f} span "
                  f"({t['cli']['ms_fwd_bwd']:.2f} ops), overhead {100 * t['overhead_vs_cli']:.1f}%, host "
                  f"{t['host_ms_median']:.2f} ms a step, peak "
                  f"{t['peak_bytes_above_start'] / 2**30:.2f} GiB", flush=True)
        doc["bench"].append(point)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    for seq in (4096,) if "graph" in parts else ():
        try:
            g = graph_check(args, seq)
        except Exception as e:  # noqa: BLE001  (recorded: a capture laga cannot take is a finding, not a crash)
            g = {"seq": seq, "error": repr(e)[:2000]}
        doc.setdefault("cuda_graph", []).append(g)
        print("cuda graph:", json.dumps(g), flush=True)
        torch.cuda.empty_cache()
    for part, key, check_fn in (("autocast", "autocast", autocast_check), ("hooks", "saved_tensor_hooks", hooks_check)):
        if part not in parts:
            continue
        try:
            doc[key] = check_fn(args, 4096)
        except Exception as e:  # noqa: BLE001  (recorded: a failed check is a finding, not a crash)
            doc[key] = {"error": repr(e)[:2000]}
        print(f"{key}:", json.dumps(doc[key]), flush=True)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    # Last: a process group set up before the timings slowed PyTorch's attention peer threefold there.
    if "nccl" in parts:
        try:
            doc["nccl_group"] = nccl_group_check(args)
        except Exception as e:  # noqa: BLE001
            doc["nccl_group"] = {"error": repr(e)[:2000]}
        print("nccl group:", json.dumps(doc["nccl_group"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
