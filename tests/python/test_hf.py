"""laga.hf: laga's block in the place of a transformers DeepSeek-V2/V3 attention, against the same model unchanged
(one process here; torchrun at 2 and 4 ranks in test_distributed.py). transformers computes its norms and RoPE
tables in float32 whatever the model's dtype, so a float64 model and laga's float64 block differ by ~1e-7: the
bound below is 1e-5 (a wrong position, head or parameter moves the results by 1e-2 and more)."""

import copy
import itertools

import pytest
import torch

pytest.importorskip("transformers")

import laga.hf  # noqa: E402
from common import rel_error  # noqa: E402
from hf_models import loss_sum, tiny_model, tokens  # noqa: E402

BOUND = 1e-5


def step(model, ids, labels):
    loss, logits = loss_sum(model, ids, labels)
    loss.backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("version,yarn,form,kernel",
                         [(v, y, f, k) for v, y in ((3, True), (3, False), (2, True))
                          for f, k in itertools.product(("explicit", "absorbed", "laga"), ("eager", "fused"))])
def test_replaced_model_matches_transformers(version, yarn, form, kernel):
    ref = tiny_model(version, yarn)
    model = copy.deepcopy(ref)
    assert laga.hf.replace_attention(model, form=form, kernel=kernel) == 2
    assert all(isinstance(layer.self_attn, laga.hf.LatentAttentionForTransformers) for layer in model.model.layers)
    ids, labels = tokens(2, 24, seed=1)
    logits_ref, grads_ref = step(ref, ids, labels)
    logits, grads = step(model, ids, labels)
    assert rel_error(logits, logits_ref) < BOUND
    assert grads.keys() == grads_ref.keys()
    for name, g in grads.items():
        assert rel_error(g, grads_ref[name]) < BOUND, name


def test_parameters_are_the_models_own():
    """Nothing copied: the same parameter objects under the same names, so an optimizer made before the swap,
    a state dict and FSDP see the model as it was."""
    model = tiny_model(3)
    before = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    laga.hf.replace_attention(model)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[n] is p for n, p in before.items())
    assert model.state_dict().keys() == state.keys()
    assert not any(p.is_meta for p in model.parameters())
    assert model.config.use_cache is False


def test_gradient_checkpointing():
    """transformers' activation checkpointing of each decoder layer (laga's forward runs again in backward),
    reentrant and not."""
    ref = tiny_model(3)
    for reentrant in (False, True):
        model = copy.deepcopy(ref)
        laga.hf.replace_attention(model)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
        model.train()
        ids, labels = tokens(1, 16, seed=2)
        logits_ref, grads_ref = step(copy.deepcopy(ref), ids, labels)
        logits, grads = step(model, ids, labels)
        assert rel_error(logits, logits_ref) < BOUND
        for name, g in grads.items():
            assert rel_error(g, grads_ref[name]) < BOUND, (reentrant, name)


def test_right_padding_needs_no_mask():
    """A batch right-padded to one length: laga without a mask gives transformers' loss and gradients with its
    padding mask (no token sees the padding after it; the padding's labels are -100)."""
    ref = tiny_model(3)
    model = copy.deepcopy(ref)
    laga.hf.replace_attention(model)
    ids, labels = tokens(2, 24, seed=6)
    lengths = torch.tensor([24, 15])
    pad = torch.arange(24)[None] >= lengths[:, None]
    ids, labels = ids.masked_fill(pad, 0), labels.masked_fill(pad | (torch.arange(24)[None] == lengths[:, None] - 1), -100)
    logits_ref = ref(input_ids=ids, attention_mask=(~pad).long(), use_cache=False).logits
    loss_ref = torch.nn.functional.cross_entropy(logits_ref.flatten(0, 1), labels.flatten(), reduction="sum")
    loss_ref.backward()
    loss, _ = loss_sum(model, ids, labels)
    loss.backward()
    assert abs(loss.item() - loss_ref.item()) < BOUND * abs(loss_ref.item())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel_error(p.grad, q.grad) < BOUND, name


def test_eager_attention_implementation_becomes_sdpa():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    model = tiny_model(3)
    eager = DeepseekV3ForCausalLM._from_config(DeepseekV3Config(**model.config.to_dict()), attn_implementation="eager",
                                               dtype=torch.float64)
    eager.load_state_dict(model.state_dict())
    laga.hf.replace_attention(eager)
    assert eager.config._attn_implementation == "sdpa"
    ids, labels = tokens(1, 16, seed=3)
    assert rel_error(step(eager, ids, labels)[0], step(model, ids, labels)[0]) < BOUND


def test_what_laga_does_not_compute_is_refused():
    model = tiny_model(3)
    laga.hf.replace_attention(model)
    ids, _ = tokens(2, 16, seed=4)
    with pytest.raises(ValueError, match="attention_mask is a Tensor"):
        model(input_ids=ids, attention_mask=torch.ones_like(ids).index_fill(1, torch.tensor([0]), 0))
    with pytest.raises(ValueError, match="KV cache"):
        model(input_ids=ids, use_cache=True)
    for field, says in (("attention_dropout", "attention_dropout = 0.1"), ("rope_interleave", "rope_interleave = false"),
                        ("attention_bias", "attention_bias = true")):
        value = {"attention_dropout": 0.1, "rope_interleave": False, "attention_bias": True}[field]
        other = tiny_model(3, **{field: value})
        names = [n for n, _ in other.named_modules()]
        with pytest.raises(ValueError, match=says):
            laga.hf.replace_attention(other)
        assert [n for n, _ in other.named_modules()] == names  # left as it was
    restart = torch.cat([torch.arange(8), torch.arange(8)])[None]  # two packed documents: transformers masks them
    with pytest.raises(ValueError, match="packed"):
        model(input_ids=ids, position_ids=restart)
    with pytest.raises(ValueError, match="position_ids"):  # positions laga would not apply
        model(input_ids=ids, position_ids=torch.arange(3, 19)[None])
    from transformers import LlamaConfig, LlamaForCausalLM
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    with pytest.raises(ValueError, match="no transformers DeepseekV3Attention or DeepseekV2Attention"):
        laga.hf.replace_attention(llama)
