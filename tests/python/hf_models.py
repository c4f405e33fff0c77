"""Tiny transformers DeepSeek-V2 / V3 causal language models for the tests of laga.hf: float64, dense MLPs
(transformers' MoE runs grouped GEMMs without float64), seeded parameters; the loss over a whole sequence as
sequence-parallel ranks compute it, each over its own tokens."""

import torch

VOCAB = 128
YARN = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 16,
        "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}


def tiny_model(version=3, yarn=True, seed=0, **config):
    """A two-layer model, every parameter drawn from N(0, 0.2) with ``seed``: DeepSeek-V3's with a compressed
    query, or DeepSeek-V2-Lite's shape (no query compression)."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM
    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, first_k_dense_replace=2, kv_lora_rank=32, qk_nope_head_dim=16,
                  qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=64, tie_word_embeddings=False)
    if yarn:
        fields["rope_parameters"] = dict(YARN)
    fields.update(config)
    if version == 3:
        model = DeepseekV3ForCausalLM._from_config(DeepseekV3Config(**dict(dict(q_lora_rank=32), **fields)),
                                                   dtype=torch.float64)
    else:
        model = DeepseekV2ForCausalLM._from_config(DeepseekV2Config(**dict(dict(q_lora_rank=None), **fields)),
                                                   dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.2)
    return model


def tokens(batch, seq, seed):
    """Input ids and the labels each position predicts (the next token; -100 at the last), over the whole sequence,
    so that a rank's share of both is taken by the same positions."""
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
    labels = torch.cat([ids[:, 1:], torch.full((batch, 1), -100)], dim=1)
    return ids, labels


def loss_sum(model, ids, labels, position_ids=None):
    """The sum of the cross-entropies at the tokens given (their mean over a whole sequence is the model's loss
    once divided by the count of labelled positions)."""
    logits = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                             reduction="sum"), logits
