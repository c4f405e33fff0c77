#!/usr/bin/env python3
"""The PyTorch peer of `laga bench --device cuda --phantom`: the whole MLA block of one a2a (Ulysses) rank
of a DeepSeek-class model, written in plain PyTorch as a user would, forward + backward time and peak memory.

Per rank (s = S / P local tokens, H / P heads after the exchange), bf16 weights and activations:
  q = RoPE(RMSNorm(x W_DQ) W_UQ)             [c_kv | k_pe] = x W_DKV; c_kv = RMSNorm(c_kv); k_pe = RoPE(k_pe)
  explicit: K, V = up-projection of the rank's latent (all heads); all-to-all of Q, K, V (tokens -> heads)
  laga:     all-to-all of Q; all-gather of the latent; K, V = up-projection of the gathered latent (own heads)
  o = scaled_dot_product_attention(q, k, v, is_causal=True)   (PyTorch picks the kernel: cuDNN, flash, ...)
  all-to-all of O (heads -> tokens); y = o W_O
The exchanges are emulated by local copies, as laga's phantom rank emulates them (`--standin phantom`): chunk p
of what the rank receives is chunk p of what it sends (its own tokens with rank p's heads for the all-to-all of
Q, K, V; its head slice of chunk p's queries in head slot p for the all-to-all of O; its own latent for every
chunk of the all-gather); `--standin repeat` gives every chunk the rank's own head slice of its own tokens. Each
all-to-all costs what it costs laga's phantom (`--exchange copy`): its packing (the concatenation of the chunks
by destination) or unpacking, and the exchange itself as a device copy of the whole buffer, in both directions
(an op torch.compile cannot see into or remove), where a collective would write its receive buffer; the
all-gather's concatenation is its exchange. `--exchange none` leaves the all-to-alls' exchange out (the packed
buffer stands for the received one). Forward and backward (autograd, upstream gradient dy) are timed with
CUDA events (median of --repeat after --warmup; the timed passes queued back to back as a training loop runs
them, or with --sync-each-pass each waited for, which idles the GPU between passes); peak memory is torch.cuda.max_memory_allocated over the
pass, minus what was allocated before it (weights, x, dy). With --compile the non-attention parts run under
torch.compile too (the attention call stays SDPA).

    python3 scripts/peer_torch_block.py --seq 4096,16384,32768 --sp 8 --form explicit,laga --out peer.json
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess

import torch
import torch.nn.functional as F

DSV3 = dict(hidden=7168, heads=128, q_lora=1536, kv_lora=512, d_nope=128, d_rope=64, d_v=128, theta=10000.0,
            factor=40.0, mscale=1.0, mscale_all_dim=1.0, beta_fast=32, beta_slow=1, orig_max_pos=4096, eps=1e-6)


def yarn_inv_freq_and_mscale(c):
    """DeepSeek-V3's YaRN frequencies and attention scale (Hugging Face DeepseekV3YarnRotaryEmbedding)."""
    dim, base, factor = c["d_rope"], c["theta"], c["factor"]
    freq_extra = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freq_inter = 1.0 / (factor * base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def corr_dim(rot):
        return (dim * math.log(c["orig_max_pos"] / (rot * 2 * math.pi))) / (2 * math.log(base))
    low = max(math.floor(corr_dim(c["beta_fast"])), 0)
    high = min(math.ceil(corr_dim(c["beta_slow"])), dim - 1)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3), 0, 1)
    mask = 1.0 - ramp
    inv_freq = freq_inter * (1 - mask) + freq_extra * mask

    def get_mscale(scale, m):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    rope_mscale = get_mscale(factor, c["mscale"]) / get_mscale(factor, c["mscale_all_dim"])
    attn_mscale = get_mscale(factor, c["mscale_all_dim"])
    return inv_freq, rope_mscale, attn_mscale


def rope(x, cos, sin):
    """DeepSeek's interleaved pairing: (x[2i], x[2i+1]) rotated into (y[i], y[i + d/2])."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@torch.library.custom_op("laga_peer::exchange", mutates_args=())
def exchange(t: torch.Tensor) -> torch.Tensor:
    """An all-to-all's exchange on one GPU: the received buffer as a device copy of the sent one (what laga's
    phantom rank does), opaque to torch.compile so that it is neither fused nor removed."""
    return t.clone()


@exchange.register_fake
def _exchange_fake(t):
    return torch.empty_like(t)


exchange.register_autograd(lambda ctx, g: exchange(g))  # the reverse all-to-all: the same copy


def a2a_tokens_to_heads(t, P, standin, mode):
    """[s, B, H, d] -> [S, B, H/P, d]: the rank's head slice of every rank's tokens (others' emulated: chunk p is
    the rank's tokens with rank p's heads, as laga's phantom; or with `repeat` its own heads every time). The
    chunks packed by destination, then (mode "copy") exchanged."""
    hp = t.shape[2] // P
    if standin == "repeat":
        packed = torch.cat([t[:, :, :hp]] * P, dim=0)
    else:
        packed = torch.cat([t[:, :, p * hp:(p + 1) * hp] for p in range(P)], dim=0)
    return exchange(packed) if mode == "copy" else packed


def a2a_heads_to_tokens(t, P, standin, mode):
    """[S, B, H/P, d] -> [s, B, H, d]: the rank's tokens of every head slice (others' emulated: head slot p is
    chunk p's rows, as laga's phantom; or with `repeat` chunk 0's every time). Exchanged (mode "copy"), then
    the received chunks unpacked."""
    s = t.shape[0] // P
    if mode == "copy":
        t = exchange(t)
    if standin == "repeat":
        return torch.cat([t[:s]] * P, dim=2)
    return torch.cat([t[p * s:(p + 1) * s] for p in range(P)], dim=2)


def all_gather(t, P):
    return torch.cat([t] * P, dim=0)


def make_block(c, S, P, B, form, compile_parts, init="randn", standin="phantom", exchange_mode="copy"):
    s, H, hp = S // P, c["heads"], c["heads"] // P
    d_qk, dn, dr, dv, r_kv = c["d_nope"] + c["d_rope"], c["d_nope"], c["d_rope"], c["d_v"], c["kv_lora"]
    inv_freq, rope_mscale, attn_mscale = yarn_inv_freq_and_mscale(c)
    scale = attn_mscale ** 2 / math.sqrt(d_qk)
    rank = P - 1  # the rank laga's --phantom measures
    pos_local = torch.arange(rank * s, rank * s + s, dtype=torch.float64)

    def cos_sin(pos):
        ang = pos[:, None] * inv_freq[None, :]
        return ((torch.cos(ang) * rope_mscale).to("cuda", torch.bfloat16)[:, None, None, :],
                (torch.sin(ang) * rope_mscale).to("cuda", torch.bfloat16)[:, None, None, :])
    cos_l, sin_l = cos_sin(pos_local)

    def draw(*shape):  # "uniform": U(-1, 1), as laga's synthetic data; "randn": N(0, 1)
        if init == "uniform":
            return torch.rand(*shape, device="cuda", dtype=torch.float32) * 2 - 1
        return torch.randn(*shape, device="cuda", dtype=torch.float32)

    def w(*shape):  # [in, out], scaled by 1 / sqrt(fan_in)
        return (draw(*shape) / math.sqrt(shape[0])).to(torch.bfloat16).requires_grad_()

    def norm(n):  # the norms' scales: ones, or 1 + 0.1 U(-1, 1) as laga's
        g = torch.ones(n, device="cuda") + (0.1 * draw(n) if init == "uniform" else 0)
        return g.to(torch.bfloat16).requires_grad_()
    W = dict(dq=w(c["hidden"], c["q_lora"]), q_norm=norm(c["q_lora"]),
             uq=w(c["q_lora"], H * d_qk), dkv=w(c["hidden"], r_kv + dr),
             kv_norm=norm(r_kv),
             uk=w(r_kv, H * dn), uv=w(r_kv, H * dv), o=w(H * dv, c["hidden"]))
    eps = c["eps"]

    def front(x):
        cq = F.rms_norm(x @ W["dq"], (c["q_lora"],), W["q_norm"], eps)
        q = (cq @ W["uq"]).view(s, B, H, d_qk)
        q = torch.cat((q[..., :dn], rope(q[..., dn:], cos_l, sin_l)), dim=-1)
        lat = x @ W["dkv"]
        ckv = F.rms_norm(lat[..., :r_kv], (r_kv,), W["kv_norm"], eps)
        kpe = rope(lat[..., r_kv:].view(s, B, 1, dr), cos_l, sin_l)
        return q, ckv, kpe

    def explicit_kv(q, ckv, kpe):  # K, V for every head of the local tokens, then all-to-all of Q, K, V
        k = torch.cat(((ckv @ W["uk"]).view(s, B, H, dn), kpe.expand(s, B, H, dr)), dim=-1)
        v = (ckv @ W["uv"]).view(s, B, H, dv)
        return a2a_tokens_to_heads(q, P, standin, exchange_mode), a2a_tokens_to_heads(k, P, standin, exchange_mode), \
            a2a_tokens_to_heads(v, P, standin, exchange_mode)

    def laga_kv(q, ckv, kpe):  # all-to-all of Q, all-gather of the latent, K, V for this rank's heads
        ckv_all, kpe_all = all_gather(ckv, P), all_gather(kpe, P)
        uk = W["uk"].view(r_kv, H, dn)[:, :hp].reshape(r_kv, hp * dn)
        uv = W["uv"].view(r_kv, H, dv)[:, :hp].reshape(r_kv, hp * dv)
        k = torch.cat(((ckv_all @ uk).view(S, B, hp, dn), kpe_all.expand(S, B, hp, dr)), dim=-1)
        v = (ckv_all @ uv).view(S, B, hp, dv)
        return a2a_tokens_to_heads(q, P, standin, exchange_mode), k, v

    def back(o):  # [S, B, hp, dv] -> y [s, B, hidden]
        return a2a_heads_to_tokens(o, P, standin, exchange_mode).reshape(s, B, H * dv) @ W["o"]

    pre = explicit_kv if form == "explicit" else laga_kv
    if compile_parts:
        front, pre, back = torch.compile(front), torch.compile(pre), torch.compile(back)

    def block(x):
        q, k, v = pre(*front(x))
        # SDPA wants [B, heads, tokens, d]: strided views of the [tokens, B, heads, d] tensors.
        o = F.scaled_dot_product_attention(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3),
                                           is_causal=True, scale=scale)
        return back(o.permute(2, 0, 1, 3))
    return block, W


def measure(c, S, P, B, form, compile_parts, warmup, repeat, sync_each_pass=False, init="randn", standin="phantom",
            exchange_mode="copy"):
    """Forward and backward times (CUDA events) and the peak memory of `repeat` passes after `warmup`. The timed
    passes are queued back to back, as a training loop runs them (the host waits once, at the end); with
    sync_each_pass the host waits for the GPU after every pass, which leaves the GPU idle between passes and so
    lets it hold higher clocks under its power limit than a training loop would."""
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    block, W = make_block(c, S, P, B, form, compile_parts, init, standin, exchange_mode)
    s = S // P
    if init == "uniform":  # x and dy in U(-1, 1), as laga's
        x = (torch.rand(s, B, c["hidden"], device="cuda") * 2 - 1).to(torch.bfloat16).requires_grad_()
        dy = (torch.rand(s, B, c["hidden"], device="cuda") * 2 - 1).to(torch.bfloat16)
    else:
        x = torch.randn(s, B, c["hidden"], device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(s, B, c["hidden"], device="cuda", dtype=torch.bfloat16)
    timed, peaks = [], []
    for it in range(warmup + repeat):
        for t in list(W.values()) + [x]:
            t.grad = None
        if sync_each_pass or it <= warmup:  # the warm-ups (compilation) settle before the first timed pass
            torch.cuda.synchronize()
        # The caching allocator counts on the host, in stream order: no wait is needed for the peak.
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        y = block(x)
        e1.record()
        y.backward(dy)
        e2.record()
        if sync_each_pass:
            torch.cuda.synchronize()
        if it >= warmup:
            timed.append((e0, e1, e2))
            peaks.append(torch.cuda.max_memory_allocated() - base)
        del y
    torch.cuda.synchronize()
    fwd_ms = [e0.elapsed_time(e1) for e0, e1, _ in timed]
    bwd_ms = [e1.elapsed_time(e2) for _, e1, e2 in timed]
    # Which kernels ran and their GPU time per pass, from the profiler over `repeat` more passes after `warmup`
    # (each waited for, so that a pass's kernels fall in its profiler step): the attention kernels by name, and
    # the GPU time per pass by class (attention, GEMM, the rest), to set beside `laga bench --op-profile`.
    kernels, kernel_ms, by_class = set(), {}, {}
    try:
        from torch.profiler import profile, ProfilerActivity, schedule
        with profile(activities=[ProfilerActivity.CUDA], acc_events=True,
                     schedule=schedule(wait=0, warmup=warmup, active=repeat)) as prof:
            for _ in range(warmup + repeat):
                for t in list(W.values()) + [x]:
                    t.grad = None
                block(x).backward(dy)
                torch.cuda.synchronize()  # each pass's kernels within its profiler step
                prof.step()
        for ev in prof.key_averages():
            us = getattr(ev, "device_time_total", None)
            if us is None:
                us = getattr(ev, "cuda_time_total", 0)
            if not us:
                continue
            n = ev.key.lower()
            if any(tag in n for tag in ("cudnn", "flash", "fmha", "attention", "sdpa")):
                kind = "attention"
                kernels.add(ev.key[:120])
                kernel_ms[ev.key[:120]] = round(us / 1e3 / repeat, 4)
            elif any(tag in n for tag in ("gemm", "nvjet", "cutlass", "xmma", "cublas")):
                kind = "gemm"
            else:
                kind = "other"
            by_class[kind] = by_class.get(kind, 0.0) + us / 1e3 / repeat
    except Exception as e:  # the profiler is a nicety here
        kernels.add(f"profiler unavailable: {e}")
    by_class = {k: round(v, 4) for k, v in sorted(by_class.items())}
    del block, W, x, dy
    return {"forward_ms": statistics.median(fwd_ms), "backward_ms": statistics.median(bwd_ms),
            "block_ms": statistics.median([f + b for f, b in zip(fwd_ms, bwd_ms)]),
            "forward_ms_all": fwd_ms, "backward_ms_all": bwd_ms,
            "peak_bytes": max(peaks), "attention_kernels": sorted(kernels),
            "attention_kernel_ms": kernel_ms,
            "gpu_ms_by_class": by_class}


def source_tree():
    """(commit, dirty) of the code measured: what `scripts/gpu.sh` exports from the carried build's BUILD
    (LAGA_BUILD_COMMIT, LAGA_BUILD_DIRTY 1/0) where it ran this, else git's where this is a checkout; dirty is
    None when unknown."""
    if os.environ.get("LAGA_BUILD_COMMIT"):
        return os.environ["LAGA_BUILD_COMMIT"], {"0": False, "1": True}.get(os.environ.get("LAGA_BUILD_DIRTY", ""))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        if commit and status.returncode == 0:
            return commit, bool(status.stdout.strip())
    except OSError:
        pass
    return "unknown", None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", default="4096,16384,32768")
    ap.add_argument("--sp", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--form", default="explicit,laga")
    ap.add_argument("--compile", default="off", help="off, on, or both")
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed passes first (PyTorch's cuDNN attention backward settles after several)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--init", choices=("randn", "uniform"), default="randn",
                    help="the data: weights N(0,1) / sqrt(fan_in), unit norm scales, x and dy N(0,1); or laga's: "
                         "U(-1,1) / sqrt(fan_in) (as torch.nn.Linear's default), 1 + 0.1 U(-1,1), U(-1,1)")
    ap.add_argument("--standin", choices=("phantom", "repeat"), default="phantom",
                    help="what the emulated exchanges deliver: laga's phantom's stand-ins (chunk p received = chunk p "
                         "sent), or the rank's own head slice of its own tokens in every chunk")
    ap.add_argument("--exchange", choices=("copy", "none"), default="copy",
                    help="an all-to-all's exchange: a device copy of the whole buffer, each way, as laga's phantom "
                         "rank's; or none (the packed buffer stands for the received one)")
    ap.add_argument("--sync-each-pass", action="store_true",
                    help="wait for the GPU after every timed pass (idle gaps: higher clocks than a training loop)")
    ap.add_argument("--out")
    a = ap.parse_args()
    c = DSV3
    commit, dirty = source_tree()
    doc = {"schema": "laga-peer/1", "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": "python3 scripts/peer_torch_block.py " + " ".join(
               f"--{k} {v}" for k, v in [("seq", a.seq), ("sp", a.sp), ("batch", a.batch), ("form", a.form),
                                         ("compile", a.compile), ("warmup", a.warmup), ("repeat", a.repeat)]) +
               (" --sync-each-pass" if a.sync_each_pass else "") + (f" --init {a.init}" if a.init != "randn" else "") + (" --standin repeat" if a.standin == "repeat" else "") +
               (" --exchange none" if a.exchange == "none" else ""),
           "machine": {"hostname": platform.node(), "device_name": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "cuda": torch.version.cuda,
                       "cudnn": torch.backends.cudnn.version()},
           "commit": commit, "dirty": dirty, "model": "deepseek-v3", "dtype": "bfloat16", "layout": "a2a",
           "rank": "P-1 of P, exchanges emulated by local copies",
           "timed_passes": "each pass waited for" if a.sync_each_pass else "queued back to back",
           "init": a.init, "standin": a.standin, "exchange": a.exchange, "points": []}
    compiles = {"off": [False], "on": [True], "both": [False, True]}[a.compile]
    for S in [int(v) for v in a.seq.split(",")]:
        for form in a.form.split(","):
            for comp in compiles:
                try:
                    m = measure(c, S, a.sp, a.batch, form, comp, a.warmup, a.repeat, a.sync_each_pass, a.init, a.standin,
                                a.exchange)
                except torch.cuda.OutOfMemoryError as e:
                    m = {"error": f"out of memory: {str(e).splitlines()[0][:160]}"}
                pt = {"seq": S, "sp": a.sp, "batch": a.batch, "form": form, "compile": comp, **m}
                doc["points"].append(pt)
                if "error" in m:
                    print(f"peer S={S} P={a.sp} {form} compile={comp}: {m['error']}", flush=True)
                else:
                    print(f"peer S={S} P={a.sp} {form:8} compile={str(comp):5} fwd {m['forward_ms']:8.2f} ms  bwd "
                          f"{m['backward_ms']:8.2f} ms  block {m['block_ms']:8.2f} ms  peak "
                          f"{m['peak_bytes'] / 2**30:6.2f} GiB  GPU ms per pass {m['gpu_ms_by_class']}", flush=True)
                if a.out:
                    with open(a.out, "w") as f:
                        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
