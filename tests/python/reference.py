"""The tests' own pure-PyTorch DeepSeek-V3 attention, written after Hugging Face's DeepseekV3Attention
(transformers' modeling_deepseek_v3.py): the same parameter names and shapes, interleaved RoPE, YaRN
frequencies and mscale, causal softmax attention. It computes in the input's dtype throughout (Hugging Face's
RMSNorm rounds through float32, which would hide float64 agreement)."""

import math

import torch
from torch import nn


def yarn_get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq_and_scale(cfg):
    """inv_freq [d_r/2] and the cos/sin scale, as transformers' _compute_default/_compute_yarn_parameters."""
    dim, base = cfg["qk_rope_head_dim"], cfg["rope_theta"]
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    rs = cfg.get("rope_scaling")
    if not rs:
        return 1.0 / pos_freqs, 1.0
    factor = rs["factor"]
    mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    else:
        attention_factor = yarn_get_mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast", 32), rs.get("beta_slow", 1)
    max_pos = rs["original_max_position_embeddings"]

    def correction_dim(num_rotations):
        return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, attention_factor


def softmax_scale(cfg):
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        m = yarn_get_mscale(rs["factor"], rs["mscale_all_dim"])
        scale = scale * m * m
    return scale


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb_interleave(q, k, cos, sin):
    b, h, s, d = q.shape
    q = q.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    b, h, s, d = k.shape
    k = k.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class RMSNorm(nn.Module):
    def __init__(self, n, eps, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n, dtype=dtype))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class ReferenceDeepseekV3Attention(nn.Module):
    def __init__(self, cfg, dtype=None):
        super().__init__()
        self.cfg = cfg
        d, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        rq, rkv = cfg["q_lora_rank"], cfg["kv_lora_rank"]
        dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        self.nh, self.dn, self.dr, self.dv, self.rkv = nh, dn, dr, dv, rkv
        if rq is None:
            self.q_proj = nn.Linear(d, nh * (dn + dr), bias=False, dtype=dtype)
        else:
            self.q_a_proj = nn.Linear(d, rq, bias=False, dtype=dtype)
            self.q_a_layernorm = RMSNorm(rq, cfg["rms_norm_eps"], dtype)
            self.q_b_proj = nn.Linear(rq, nh * (dn + dr), bias=False, dtype=dtype)
        self.kv_a_proj_with_mqa = nn.Linear(d, rkv + dr, bias=False, dtype=dtype)
        self.kv_a_layernorm = RMSNorm(rkv, cfg["rms_norm_eps"], dtype)
        self.kv_b_proj = nn.Linear(rkv, nh * (dn + dv), bias=False, dtype=dtype)
        self.o_proj = nn.Linear(nh * dv, d, bias=False, dtype=dtype)
        self.inv_freq, self.attention_scaling = rope_inv_freq_and_scale(cfg)
        self.scaling = softmax_scale(cfg)

    def forward(self, x, position_offset=0):
        b, s, _ = x.shape
        if self.cfg["q_lora_rank"] is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, s, self.nh, self.dn + self.dr).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [self.dn, self.dr], dim=-1)
        ckv = self.kv_a_proj_with_mqa(x)
        k_pass, k_rot = torch.split(ckv, [self.rkv, self.dr], dim=-1)
        k_pass = self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(b, s, self.nh, self.dn + self.dv).transpose(1, 2)
        k_pass, value = torch.split(k_pass, [self.dn, self.dv], dim=-1)
        k_rot = k_rot.view(b, 1, s, self.dr)
        pos = torch.arange(position_offset, position_offset + s, dtype=torch.float64)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(x.dtype)
        sin = (emb.sin() * self.attention_scaling).to(x.dtype)
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
        k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
        query = torch.cat((q_pass, q_rot), dim=-1)
        key = torch.cat((k_pass, k_rot), dim=-1)
        scores = torch.matmul(query, key.transpose(2, 3)) * self.scaling
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, value).transpose(1, 2).reshape(b, s, self.nh * self.dv)
        return self.o_proj(out)
