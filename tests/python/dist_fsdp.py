"""Run under torchrun (gloo), 4 ranks: laga's module under FSDP2 (fully_shard) with sequence parallelism, as
torchtitan shards a model with context parallelism: ranks in a (dp = 2, sp = 2) grid, laga's group the sp ranks,
the parameters sharded over all four, so that FSDP's reduce-scatter also sums the sp ranks' partial gradients
(divided by dp: set_gradient_divide_factor). Each dp replica takes its own batch, each sp rank its chunk of the
sequence. Against the tests' reference on one process: the mean over the dp batches of the whole-sequence
gradients, every parameter (gathered from its shards), and each rank's output chunk; float64 <= 1e-10. Prints one
line on rank 0 and exits 1 on any failure."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import laga
import laga.torch as lt
from common import TOLERANCE, configs, init_reference, rel_error, seeded
from reference import ReferenceDeepseekV3Attention


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "run with --nproc_per_node 4"
    dp, sp = 2, 2
    grid = init_device_mesh("cpu", (dp, sp), mesh_dim_names=("dp", "sp"))
    every = init_device_mesh("cpu", (world,), mesh_dim_names=("all",))
    d_rank, s_rank = rank // sp, rank % sp
    cfg, dtype, seq, layout = configs()["tiny"], torch.float64, 32, "a2a"
    ref = ReferenceDeepseekV3Attention(cfg, dtype=dtype)
    init_reference(ref, 5)
    mod = lt.MultiheadLatentAttention(cfg, layout=layout, group=grid["sp"].get_group(), dtype=dtype)
    mod.load_state_dict(ref.state_dict())
    fully_shard(mod, mesh=every)
    mod.set_gradient_divide_factor(float(dp))  # sum over the sp ranks' partials, mean over the dp batches
    mine = laga.rank_positions(layout, seq, sp, s_rank)
    errors = {}
    batches = [seeded((2, seq, cfg["hidden_size"]), 10 + b, dtype) for b in range(dp)]
    dys = [seeded((2, seq, cfg["hidden_size"]), 20 + b, dtype) for b in range(dp)]
    y = mod(batches[d_rank][:, mine].clone())
    (y * dys[d_rank][:, mine]).sum().backward()
    for b in range(dp):
        yr = ref(batches[b])
        (yr * dys[b] / dp).sum().backward()
        if b == d_rank:
            errors["y"] = rel_error(y.detach().full_tensor() if hasattr(y, "full_tensor") else y.detach(),
                                    yr.detach()[:, mine])
    ref_params = dict(ref.named_parameters())
    for name, p in mod.named_parameters():
        errors[name] = rel_error(p.grad.full_tensor(), ref_params[name].grad)
    worst = torch.tensor([max(errors.values())], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    ok = float(worst) <= TOLERANCE[dtype]
    if rank == 0:
        print(f"fsdp2 dp={dp} sp={sp}: worst relative error {float(worst):.2e} "
              f"({'passed' if ok else 'FAILED'}): {errors}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
