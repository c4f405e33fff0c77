"""Run under torchrun (gloo, 2 ranks): bad input on one rank makes every rank raise a ValueError naming it,
before any of laga's collectives, and the ranks stay usable together afterwards. Exits 1 if a case did not
raise on some rank (a hang is the caller's timeout)."""

import sys

import torch
import torch.distributed as dist

import laga.torch as lt


def expect_error(what, fn, match):
    try:
        fn()
    except ValueError as e:
        ok = match in str(e)
        print(f"rank {dist.get_rank()}: {what}: ValueError: {str(e).splitlines()[0]} {'ok' if ok else 'MISMATCH'}",
              flush=True)
        return ok
    print(f"rank {dist.get_rank()}: {what}: no error FAILED", flush=True)
    return False


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = dist.group.WORLD
    mod = lt.MultiheadLatentAttention("tiny", group=group)
    d = mod.config["hidden_size"]
    results = []
    # Rank 1 alone holds a wrong hidden size: it names its shape, rank 0 names rank 1.
    results.append(expect_error("wrong hidden size on rank 1",
                                lambda: mod(torch.zeros(1, 8, d + 1 if rank == 1 else d)),
                                "hidden_size = 32" if rank == 1 else "rank(s) [1] refused"))
    # Rank 1 alone holds another dtype.
    results.append(expect_error("wrong dtype on rank 1",
                                lambda: mod(torch.zeros(1, 8, d, dtype=torch.float64 if rank == 1 else torch.float32)),
                                "parameters are torch.float32" if rank == 1 else "rank(s) [1] refused"))
    # Rank 1 alone computes in a dtype laga has no kernels for, as under torch.autocast(dtype=torch.float16) on
    # CUDA (the autocast state stood in for: this suite runs on CPU ranks, where autocast leaves the parameters'
    # dtype).
    if rank == 1:
        mod._compute_dtype = lambda x: torch.float16
    results.append(expect_error("autocast float16 on rank 1", lambda: mod(torch.zeros(1, 8, d)),
                                "torch.autocast(dtype=torch.float16)" if rank == 1 else "rank(s) [1] refused"))
    if rank == 1:
        del mod._compute_dtype
    # The ranks' chunks differ in length.
    results.append(expect_error("chunks differ", lambda: mod(torch.zeros(1, 8 + rank, d)), "the ranks' inputs differ"))
    # Heads not divisible by the group size in a2a: refused at construction, on every rank.
    cfg = dict(mod.config, num_attention_heads=3)
    results.append(expect_error("heads not divisible", lambda: lt.MultiheadLatentAttention(cfg, group=group),
                                "num_attention_heads = 3 is not divisible by the group size 2"))
    # Still in step: a good call works on both ranks.
    y = mod(torch.ones(1, 8, d))
    y.sum().backward()
    results.append(bool(torch.isfinite(y).all()))
    dist.barrier()
    ok = all(results)
    print(f"rank {rank}: {sum(results)} passed, {len(results) - sum(results)} failed", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
