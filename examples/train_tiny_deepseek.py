"""Train a tiny DeepSeek-style decoder (byte embedding, layers of MLA + SwiGLU MLP, LM head) on the text of
this repository's docs, with laga's MLA under sequence parallelism, or with a pure-PyTorch MLA written below.

    torchrun --nproc_per_node 4 examples/train_tiny_deepseek.py --mla laga --form laga --out out/laga.json
    torchrun --nproc_per_node 4 examples/train_tiny_deepseek.py --mla laga --form explicit --out out/explicit.json
    python3 examples/train_tiny_deepseek.py --mla torch --out out/torch.json       # one process, whole sequence
    python3 examples/train_tiny_deepseek.py --plot docs/img/train_tiny_deepseek.png out/*.json

Every run starts from the same weights (seeded) and sees the same batches. Under torchrun each rank holds a
contiguous chunk of every sequence (rank r: tokens r*S/P .. (r+1)*S/P - 1); every layer but attention works
token by token, attention is laga's MultiheadLatentAttention over the group; the loss is the mean over all
tokens of all ranks, and every gradient is summed over the group before the optimizer step, so each run
computes the same function as the one-process pure-PyTorch run and the loss curves agree within float32
rounding. --device cuda runs the same on a GPU (one rank, or ranks sharing it with --backend nccl);
--checkpoint puts each layer under activation checkpointing and --compile the model under torch.compile.
"""

import argparse
import glob
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

MLA_CONFIG = {"hidden_size": 64, "num_attention_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
              "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "rope_theta": 10000.0,
              "rope_scaling": None, "rms_norm_eps": 1e-6}


def corpus_bytes():
    """The repository's own prose (README and docs), as bytes: a small text every checkout has."""
    paths = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    return b"\n".join(open(p, "rb").read() for p in paths if os.path.exists(p))


def build(args):
    import torch
    import torch.utils.checkpoint
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, n, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    class TorchMLA(nn.Module):
        """DeepSeek-V3 attention in plain PyTorch (Hugging Face's parameter names, interleaved RoPE, causal
        scaled_dot_product_attention), over the whole sequence on one process."""

        def __init__(self, c):
            super().__init__()
            d, nh, rq, rkv = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
            self.nh, self.dn, self.dr, self.dv, self.rkv = nh, c["qk_nope_head_dim"], c["qk_rope_head_dim"], \
                c["v_head_dim"], rkv
            self.q_a_proj = nn.Linear(d, rq, bias=False)
            self.q_a_layernorm = RMSNorm(rq, c["rms_norm_eps"])
            self.q_b_proj = nn.Linear(rq, nh * (self.dn + self.dr), bias=False)
            self.kv_a_proj_with_mqa = nn.Linear(d, rkv + self.dr, bias=False)
            self.kv_a_layernorm = RMSNorm(rkv, c["rms_norm_eps"])
            self.kv_b_proj = nn.Linear(rkv, nh * (self.dn + self.dv), bias=False)
            self.o_proj = nn.Linear(nh * self.dv, d, bias=False)
            self.inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, self.dr, 2, dtype=torch.float64) / self.dr))

        def rope(self, t, cos, sin):
            b, h, s, d = t.shape
            t = t.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
            rot = torch.cat((-t[..., d // 2:], t[..., : d // 2]), dim=-1)
            return t * cos + rot * sin

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, s, self.nh, -1).transpose(1, 2)
            q_pass, q_rot = q.split([self.dn, self.dr], dim=-1)
            k_pass, k_rot = self.kv_a_proj_with_mqa(x).split([self.rkv, self.dr], dim=-1)
            kv = self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(b, s, self.nh, -1).transpose(1, 2)
            k_pass, v = kv.split([self.dn, self.dv], dim=-1)
            freqs = torch.arange(s, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1).to(x.device)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
            q_rot = self.rope(q_rot, cos, sin)
            k_rot = self.rope(k_rot.view(b, 1, s, self.dr), cos, sin).expand(b, self.nh, s, self.dr)
            q = torch.cat((q_pass, q_rot), dim=-1)
            k = torch.cat((k_pass, k_rot), dim=-1)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                 scale=(self.dn + self.dr) ** -0.5)
            return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))

    class Layer(nn.Module):
        def __init__(self, attention, d):
            super().__init__()
            self.input_layernorm = RMSNorm(d)
            self.self_attn = attention
            self.post_attention_layernorm = RMSNorm(d)
            self.gate_proj = nn.Linear(d, 4 * d, bias=False)
            self.up_proj = nn.Linear(d, 4 * d, bias=False)
            self.down_proj = nn.Linear(4 * d, d, bias=False)

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))

    class Decoder(nn.Module):
        def __init__(self, make_attention, d, layers, vocab=256):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, d)
            self.layers = nn.ModuleList(Layer(make_attention(), d) for _ in range(layers))
            self.norm = RMSNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed_tokens(tokens)
            for layer in self.layers:
                if args.checkpoint:  # the layer's activations dropped after forward, recomputed in backward
                    x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
                else:
                    x = layer(x)
            return self.lm_head(self.norm(x))

    return TorchMLA, Decoder


def train(args):
    import torch
    import torch.distributed as dist

    distributed = "WORLD_SIZE" in os.environ  # under torchrun, even one rank: laga's collectives on its group
    if distributed:
        dist.init_process_group(args.backend)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device(args.device)
    torch.set_num_threads(1)
    TorchMLA, Decoder = build(args)
    if args.mla == "torch":
        if world > 1:
            raise SystemExit("--mla torch runs the whole sequence on one process: run it without torchrun")
        make = lambda: TorchMLA(MLA_CONFIG)  # noqa: E731
    else:
        import laga.torch as lt
        group = dist.group.WORLD if distributed else None
        make = lambda: lt.MultiheadLatentAttention(MLA_CONFIG, form=args.form, layout=args.layout,  # noqa: E731
                                                   kernel=args.kernel, recompute=args.recompute, group=group)
    torch.manual_seed(args.seed)  # the same initial weights for every run: parameters are made in one order
    model = Decoder(make, MLA_CONFIG["hidden_size"], args.layers).to(device)
    if args.dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    if args.compile:
        model = torch.compile(model)
    data = torch.tensor(list(corpus_bytes()), dtype=torch.long)
    S, s = args.seq, args.seq // world
    gen = torch.Generator().manual_seed(args.seed + 1)
    losses = []
    t0 = time.time()
    for step in range(args.steps):
        starts = torch.randint(0, len(data) - S - 1, (args.batch,), generator=gen)
        seqs = torch.stack([data[i:i + S + 1] for i in starts.tolist()])
        inputs, targets = seqs[:, :-1], seqs[:, 1:]
        inputs, targets = inputs[:, rank * s:(rank + 1) * s].to(device), targets[:, rank * s:(rank + 1) * s].to(device)
        logits = model(inputs)
        # Sum over this rank's tokens / all tokens: the ranks' losses add up to the mean over the sequence.
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 256), targets.reshape(-1),
                                                 reduction="sum") / (args.batch * S)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        total = loss.detach().clone()
        if distributed:
            for p in model.parameters():
                dist.all_reduce(p.grad)
            dist.all_reduce(total)
        opt.step()
        losses.append(float(total))
        if rank == 0 and (step % 50 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.5f}  ({time.time() - t0:.1f} s)", flush=True)
    if rank == 0 and args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        label = "pure PyTorch MLA" if args.mla == "torch" else f"laga {args.form} {args.layout} {args.kernel}" + (
            f" +recompute {args.recompute}" if args.recompute else "") + f", {world} rank(s)"
        where = machine(args.device)  # before the output is opened: it may be a tracked file of this checkout
        with open(args.out, "w") as f:
            json.dump({"label": label, "mla": args.mla, "form": args.form, "layout": args.layout, "ranks": world,
                       "device": args.device, "dtype": args.dtype, "steps": args.steps, "seq": S, "batch": args.batch,
                       "losses": losses, "seconds": time.time() - t0, "machine": where,
                       "command": " ".join(["torchrun --nproc_per_node", str(world)] if distributed else ["python3"]) +
                       " " + " ".join(sys.argv)}, f)
    if distributed:
        # Every rank reaches here before any tears the group down: a gloo group destroyed on one rank while another
        # is still at work (rank 0 writing the output above) aborts the process now and then, laga or not
        # ("terminate called without an active exception", torch 2.11).
        dist.barrier()
        dist.destroy_process_group()
        # The abort can still come at interpreter exit, from a gloo thread torn down with the process: the work and
        # the output are done, so leave without running the C++ static destructors.
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)


def plot(png, paths):
    """Loss curves of the runs, and each run's difference from the first (the pure-PyTorch run when given)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [json.load(open(p)) for p in paths]
    runs.sort(key=lambda r: r["mla"] != "torch")
    base = runs[0]["losses"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in runs:
        a.plot(r["losses"], label=r["label"], lw=1)
        if r is not runs[0]:
            diff = [abs(x - y) for x, y in zip(r["losses"], base)]
            b.semilogy([max(d, 1e-9) for d in diff], label=r["label"], lw=1)
            print(f"{r['label']}: max |loss - {runs[0]['label']}| = {max(diff):.2e}")
    a.set(xlabel="step", ylabel="training loss (bytes, nats)", title="tiny DeepSeek-style decoder")
    b.set(xlabel="step", ylabel=f"|loss - {runs[0]['label']}|", title="difference from the first run")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def machine(device):
    """Where the run ran and from which code: the host, the device, and the checkout's commit and whether its
    tracked files had uncommitted changes (None where this is not a git checkout)."""
    import torch
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*a):
        r = subprocess.run(["git", "-C", here, *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    name = torch.cuda.get_device_name() if device == "cuda" else f"{platform.processor() or platform.machine()} (CPU)"
    return {"host": platform.node(), "device": name, "torch": torch.__version__, "commit": commit or "unknown",
            "dirty": None if status is None else bool(status)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mla", choices=["laga", "torch"], default="laga")
    ap.add_argument("--form", choices=["explicit", "absorbed", "laga"], default="laga")
    ap.add_argument("--layout", choices=["a2a", "all_gather"], default="a2a")
    ap.add_argument("--kernel", choices=["eager", "fused"], default="fused")
    ap.add_argument("--recompute", choices=["kv"], default=None)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--checkpoint", action="store_true",
                    help="activation checkpointing: each layer under torch.utils.checkpoint (non-reentrant)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (laga's attention runs between the compiled graphs)")
    ap.add_argument("--backend", default=None, help="torch.distributed backend (default: gloo on cpu, nccl on cuda)")
    ap.add_argument("--out", help="write the loss curve (JSON) here")
    ap.add_argument("--plot", nargs="+", metavar=("PNG", "JSON"), help="draw PNG from loss-curve files and stop")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot[0], args.plot[1:])
        return
    args.backend = args.backend or ("nccl" if args.device.startswith("cuda") else "gloo")
    train(args)


if __name__ == "__main__":
    sys.exit(main())
