"""laga's block inside a Hugging Face transformers model: ``replace_attention`` swaps every DeepSeek-V2/V3
attention of a ``transformers`` model (DeepseekV2Attention, DeepseekV3Attention: DeepSeek-V2, V2-Lite, V3, and the
checkpoints that load as them, such as Kimi-K2) for laga's ``MultiheadLatentAttention`` on the same parameters,
so that the model trains under sequence parallelism with each rank holding its tokens of every sequence
(``laga.torch.shard_sequence``)."""

import torch

import laga
from laga.torch import MultiheadLatentAttention, shard_sequence

__all__ = ["LatentAttentionForTransformers", "replace_attention", "shard_sequence"]

# transformers' own classes, whose call (keyword arguments from the decoder layer, an (output, weights) pair back)
# and math (interleaved RoPE pairs, YaRN's softmax scale, norms of eps 1e-6) the tests compare laga with.
_CLASSES = {"DeepseekV3Attention": "transformers.models.deepseek_v3.",
            "DeepseekV2Attention": "transformers.models.deepseek_v2."}
# The block's parameters, by their Hugging Face names (q_proj where the query is not compressed).
_PARAMETER_MODULES = ("q_a_proj", "q_a_layernorm", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
                      "kv_b_proj", "o_proj")


def _is_supported(module):
    prefix = _CLASSES.get(type(module).__name__)
    return prefix is not None and type(module).__module__.startswith(prefix)


class LatentAttentionForTransformers(MultiheadLatentAttention):
    """laga's block in the place of a transformers DeepSeek attention: made from that module (its config and its
    parameter modules themselves, so nothing is copied and an optimizer, FSDP or a state dict sees the same
    parameters under the same names) and called as the decoder layer calls it.

    ``forward(hidden_states, attention_mask=None, cache=None, ...)`` returns ``(output, None)``. The sequence is
    this rank's tokens ``laga.rank_positions(layout, S, P, r)``; RoPE is applied at those global positions, so the
    model's own ``position_embeddings`` (computed for local positions) are not used, and ``position_ids`` other than
    the model's default or those global positions are refused (checked at the first call). Attention is causal
    over the whole sequence: an ``attention_mask`` tensor (padding) and a KV cache (generation) are refused."""

    def __init__(self, attention, **options):
        if not _is_supported(attention):
            raise ValueError(f"{type(attention).__module__}.{type(attention).__name__}: laga replaces transformers' "
                             f"{' and '.join(_CLASSES)} only")
        config = attention.config.to_dict()
        # transformers makes the attention's norms with their default eps (1e-6), not config.rms_norm_eps.
        eps = {m.variance_epsilon for m in (attention.q_a_layernorm, attention.kv_a_layernorm) if m is not None}
        if len(eps) != 1:
            raise ValueError(f"the attention's norms have different eps {sorted(eps)}: laga's block takes one")
        config["rms_norm_eps"] = eps.pop()
        weight = attention.kv_a_proj_with_mqa.weight
        super().__init__(config, device="meta", dtype=weight.dtype, **options)
        for name in _PARAMETER_MODULES:  # the meta parameters made above give way to the model's own
            module = getattr(attention, name, None)
            if module is not None:
                setattr(self, name, module)
        self.layer_idx = getattr(attention, "layer_idx", None)
        self._positions_checked = False

    def forward(self, hidden_states, attention_mask=None, cache=None, past_key_values=None, position_ids=None,
                **kwargs):
        if cache is not None or past_key_values is not None:
            raise ValueError("a KV cache was passed (use_cache=True or past_key_values): laga's block trains over "
                             "whole sequences and keeps no cache; call the model with use_cache=False")
        if attention_mask is not None:
            raise ValueError(f"attention_mask is a {type(attention_mask).__name__}: laga's attention is causal over "
                             "each whole sequence (no padding or packed-document masks); pass no attention_mask, "
                             "with an attention implementation that leaves the causal mask implicit ('sdpa', "
                             "which replace_attention sets where the model had 'eager'). Right-padded batches need "
                             "no mask: no token sees the padding after it; label the padding -100")
        if position_ids is not None and not self._positions_checked:
            self._check_positions(position_ids, hidden_states.size(1))
        return super().forward(hidden_states), None

    def _check_positions(self, position_ids, s_local):
        """Positions other than the model's default (0 .. s_local - 1 on every rank) or this rank's global ones,
        such as packed documents' restarts, would be silently replaced by laga's: refused. Read once per module,
        since reading them from a GPU waits for it."""
        rows = position_ids.detach().reshape(-1, s_local).cpu()
        default = torch.arange(s_local)
        mine = torch.tensor(laga.rank_positions(self.layout, s_local * self.world, self.world, self.rank))
        if not all(torch.equal(r, default) or torch.equal(r, mine) for r in rows.long()):
            raise ValueError(f"position_ids {rows[0].tolist()[:8]}...: laga applies RoPE at this rank's global "
                             f"positions in the {self.layout} layout (or takes the model's default 0 .. s_local - 1 "
                             "as meaning them); other positions, such as packed documents' restarts, are not "
                             "supported")
        self._positions_checked = True


def replace_attention(model, group=None, **options):
    """Swaps every transformers DeepseekV2Attention / DeepseekV3Attention in ``model`` for laga's block on the same
    parameters (``LatentAttentionForTransformers``), in place, and returns the number swapped.

    ``group``: the sequence-parallel ``torch.distributed`` group (None: one rank); ``options``: those of
    ``laga.torch.MultiheadLatentAttention`` (``form``, ``layout``, ``kernel``, ``overlap``, ...). Every rank
    then feeds the model its tokens of each sequence, ``shard_sequence(input_ids, layout, group)`` (and the
    labels, shifted over the whole sequence before they are sharded), and sums its parameters' gradients over the
    group (``dist.all_reduce``, or data parallelism over the data- and sequence-parallel ranks together, dividing
    by the data-parallel size only). The model is set not to use a KV cache (``config.use_cache = False``), and
    an ``'eager'`` attention implementation becomes ``'sdpa'``, so that the causal mask stays implicit (the
    attention implementation is used for nothing else once laga runs every attention). Raises ValueError where
    the model has none of these modules (a model loaded with ``trust_remote_code`` runs its own code: load it with
    transformers' implementation) or its config asks for what laga does not compute."""
    found = [(name, module) for name, module in model.named_modules() if _is_supported(module)]
    if not found:
        seen = sorted({f"{type(m).__module__}.{type(m).__name__}" for _, m in model.named_modules()
                       if type(m).__name__ in _CLASSES})
        raise ValueError(f"no transformers {' or '.join(_CLASSES)} in {type(model).__name__}"
                         + (f" (found {', '.join(seen)}: remote code; load the model without trust_remote_code)"
                            if seen else ""))
    # Every block is made before any is swapped in: a refusal leaves the model as it was.
    swapped = {name: LatentAttentionForTransformers(module, group=group, **options) for name, module in found}
    for name, new in swapped.items():
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    config = getattr(model, "config", None)
    if config is not None:
        config.use_cache = False
        if getattr(config, "_attn_implementation", None) == "eager" and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("sdpa")
    return len(swapped)
