"""laga: Multi-head Latent Attention for training under sequence parallelism, from PyTorch.

``laga.torch.MultiheadLatentAttention`` is the block as an ``nn.Module`` (Hugging Face DeepSeek-V3 parameter
names); ``laga.hf.replace_attention(model, ...)`` puts it in place of a transformers DeepSeek-V2/V3 model's
attention; ``laga.plan(...)`` is the per-rank plan of ``laga plan --json`` as a dict; ``laga.config(...)``
resolves a preset name, a ``config.json`` path or a dict into the validated configuration;
``laga.rank_positions(...)`` says which tokens of the sequence each rank holds in a layout; ``laga.build_info()``
says whether the extension has CUDA and cuDNN's attention.
"""

import json
import os

import torch as _torch

__version__ = "0.1.0"

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "liblaga_torch.so")
if not os.path.exists(_LIBRARY):  # a build tree: LAGA_TORCH_LIBRARY names the extension
    _LIBRARY = os.environ.get("LAGA_TORCH_LIBRARY", _LIBRARY)
_torch.ops.load_library(_LIBRARY)


def config(config):
    """The validated configuration (a dict with Hugging Face field names) of a preset name (``"deepseek-v3"``,
    ``"tiny"``, ...), a path to a ``config.json``, or a dict of its fields. Raises ValueError naming the
    field, its value and the rule."""
    if isinstance(config, dict):
        return json.loads(_torch.ops.laga.parse_config(json.dumps(config)))
    if isinstance(config, (str, os.PathLike)):
        return json.loads(_torch.ops.laga.resolve_config(os.fspath(config)))
    raise TypeError(f"config = {config!r}: expected a preset name, a config.json path or a dict")


def build_info():
    """What this package's extension was built with and runs with: ``{"cuda": bool, "cudnn": {"compiled": bool,
    "loaded": bool, "version": int, "compiled_version": int, "error": str}}``. ``cudnn.compiled`` is False when the
    build found no cudnn-frontend headers (``pip install nvidia-cudnn-frontend`` before building): then
    ``attention_provider="auto"`` always runs laga's own attention kernels and ``"cudnn"`` is refused."""
    return json.loads(_torch.ops.laga.build_info())


def rank_positions(layout, seq, world, rank):
    """The global positions of the tokens rank ``rank`` of ``world`` holds of a sequence of ``seq`` tokens, in
    local order: laga's token map (``include/laga/token_map.hpp``). ``"a2a"`` and ``"all_gather"``: the
    consecutive ``seq/world`` tokens from ``rank*seq/world``; ``"p2p"`` (the ring): chunks ``rank`` and
    ``2*world-1-rank`` of ``seq/(2*world)`` tokens (the zigzag that balances causal attention). A rank's input is
    ``x[:, laga.rank_positions(layout, S, P, r)]``. Raises ValueError when the layout cannot split ``seq``."""
    return list(_torch.ops.laga.rank_positions(layout, int(seq), int(world), int(rank)))


def plan(model="deepseek-v3", seq=16384, sp=8, batch=1, layout="a2a", kernel="fused", dtype="bfloat16", layers=1,
         gpu_mem=None, kv_grad_reduce_fp32=False):
    """The document of ``laga plan --json`` as a dict: per-rank saved tensors, peaks, traffic and FLOPs of every
    variant at every (seq, sp) point, computed by laga's own orchestration on a shape-only backend.

    ``model`` as for :func:`config`; ``seq`` and ``sp`` an int or a list; ``gpu_mem`` bytes or a text such as
    ``"141GB"`` (the device-fit column)."""
    seqs = [int(s) for s in (seq if isinstance(seq, (list, tuple)) else [seq])]
    sps = [int(p) for p in (sp if isinstance(sp, (list, tuple)) else [sp])]
    text = _torch.ops.laga.plan_json(json.dumps(config(model)), layout, kernel, dtype, int(batch), seqs, sps,
                                     int(layers), "" if gpu_mem is None else str(gpu_mem), bool(kv_grad_reduce_fp32))
    return json.loads(text)


__all__ = ["build_info", "config", "plan", "rank_positions", "__version__"]
