"""What the Python tests share: configurations, seeded data, the comparison."""

import copy
import itertools

import torch

import laga

FORMS = ("explicit", "absorbed", "laga")
LAYOUTS = ("a2a", "all_gather")
KERNELS = ("eager", "fused")
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def variants():
    """(form, recompute, absorbed_attention) of every strategy laga runs."""
    return [("explicit", None, "mqa"), ("absorbed", None, "mqa"), ("absorbed", None, "expanded"), ("laga", None, "mqa"),
            ("laga", "kv", "mqa")]


def every_case():
    """Every (variant, layout, kernel) laga runs: the ring (p2p) runs explicit and laga, fused."""
    grid = [(v, layout, kernel) for v, layout, kernel in itertools.product(variants(), LAYOUTS, KERNELS)]
    return grid + [(v, "p2p", "fused") for v in (("explicit", None, "mqa"), ("laga", None, "mqa"))]


def configs():
    """tiny (YaRN), tiny without query compression (q_lora_rank null), tiny with plain RoPE."""
    tiny = laga.config("tiny")
    no_q_lora = dict(copy.deepcopy(tiny), q_lora_rank=None, name="tiny-no-q-lora")
    plain = dict(copy.deepcopy(tiny), rope_scaling=None, name="tiny-plain-rope")
    return {"tiny": tiny, "no_q_lora": no_q_lora, "plain_rope": plain}


def rel_error(a, b):
    a, b = a.double(), b.double()
    den = b.norm()
    return float((a - b).norm() / den) if den > 0 else float((a - b).norm())


def seeded(shape, seed, dtype, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).mul(scale).to(dtype)


def init_reference(ref, seed):
    """Trained-model-like weights: U(-1,1)/sqrt(fan_in); norms 1 + 0.1 U(-1,1)."""
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(ref.named_parameters())):
            if p.dim() == 2:
                p.copy_(seeded(p.shape, seed + i, p.dtype, p.shape[1] ** -0.5))
            else:
                p.copy_(1 + seeded(p.shape, seed + i, p.dtype, 0.1))
