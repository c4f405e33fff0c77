"""Run under torchrun (gloo), P ranks: a transformers DeepSeek-V3 causal language model with laga's block in place of
its attention (laga.hf.replace_attention) trained under sequence parallelism, each rank feeding the model its
tokens of every sequence (laga.hf.shard_sequence over input ids and the labels shifted over the whole sequence),
against the same model unchanged on the whole sequence in this process: the loss (each rank's sum of token losses,
summed over the ranks, over the labelled positions) and every parameter's gradient (summed over the ranks) for
each layout, with and without transformers' activation checkpointing. transformers computes its norms and RoPE in
float32, so the bound against it is 1e-5 (see test_hf.py); against the same replaced model on one rank, 1e-10. Prints "<n> passed, <m> failed" on rank 0; exits 1 on a failure."""

import copy
import sys

import torch
import torch.distributed as dist

import laga.hf
from common import rel_error
from hf_models import loss_sum, tiny_model, tokens

BOUND = 1e-5
EXACT = 1e-10


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    ref = tiny_model(3)
    ids, labels = tokens(2, 32, seed=5)
    count = int((labels != -100).sum())

    def whole(model):  # the loss and gradients of the whole sequence in this process
        loss, _ = loss_sum(model, ids, labels)
        (loss / count).backward()
        return loss.item() / count, {n: p.grad for n, p in model.named_parameters()}

    want_loss, want = whole(copy.deepcopy(ref))
    one_rank = {}  # laga's block on one rank: what sequence parallelism must give to float64 rounding
    for form in ("laga", "explicit", "absorbed"):
        model = copy.deepcopy(ref)
        laga.hf.replace_attention(model, form=form)
        one_rank[form] = whole(model)
    results = []
    cases = [(layout, "laga", False) for layout in ("a2a", "all_gather", "p2p")]
    cases += [("a2a", "explicit", False), ("all_gather", "absorbed", False), ("a2a", "laga", True)]
    for layout, form, checkpoint in cases:
        model = copy.deepcopy(ref)
        model.zero_grad(set_to_none=True)
        laga.hf.replace_attention(model, group=group, layout=layout, form=form)
        if checkpoint:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            model.train()
        # The positions, where given, are the tokens' own (the global ones: laga applies RoPE at those).
        positions = laga.hf.shard_sequence(torch.arange(ids.size(1))[None], layout, group) if checkpoint else None
        mine, _ = loss_sum(model, laga.hf.shard_sequence(ids, layout, group),
                           laga.hf.shard_sequence(labels, layout, group), positions)
        (mine / count).backward()
        total = mine.detach().clone()
        dist.all_reduce(total)
        loss_one, grads_one = one_rank[form]
        errors = {"loss": abs(total.item() / count - want_loss) / abs(want_loss)}
        exact = {"loss": abs(total.item() / count - loss_one) / abs(loss_one)}
        for name, p in model.named_parameters():
            g = p.grad.clone()
            dist.all_reduce(g)
            errors[name], exact[name] = rel_error(g, want[name]), rel_error(g, grads_one[name])
        worst, worst_exact = max(errors, key=errors.get), max(exact, key=exact.get)
        ok = errors[worst] < BOUND and exact[worst_exact] < EXACT
        results.append(ok)
        if rank == 0:
            print(f"{layout:10s} {form:8s} checkpoint={checkpoint!s:5s} against transformers: {worst} "
                  f"{errors[worst]:.2e}; against one rank: {worst_exact} {exact[worst_exact]:.2e} "
                  f"{'ok' if ok else 'FAILED'}")
    if rank == 0:
        print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    # The last model (laga's blocks on the group among its modules) outlives the group, as in a training
    # script's end: the exit must not hang.
    dist.destroy_process_group()
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
