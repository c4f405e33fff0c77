"""Run under torchrun (gloo): every form x layout x kernel (and recompute, absorbed attention; overlap on the
fused kernel in float32) at this world size against the tests' reference on the whole sequence: this rank's
output and input-gradient chunks, and the parameter gradients summed over ranks; float64 <= 1e-10, float32 <=
1e-5; a forward under torch.no_grad the training forward's bits, keeping nothing. Prints one line per case on
rank 0 and exits 1 on any failure."""

import sys

import torch
import torch.distributed as dist

import laga
import laga.torch as lt
from common import TOLERANCE, configs, every_case, init_reference, rel_error, seeded
from reference import ReferenceDeepseekV3Attention


def check(cfg, case, dtype, group, batch=2, seq=32, seed=5, overlap=False):
    (form, recompute, absorbed), layout, kernel = case
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = laga.rank_positions(layout, seq, world, rank)  # this rank's tokens in the layout
    ref = ReferenceDeepseekV3Attention(cfg, dtype=dtype)
    init_reference(ref, seed)
    mod = lt.MultiheadLatentAttention(cfg, form=form, layout=layout, kernel=kernel, recompute=recompute,
                                      absorbed_attention=absorbed, group=group, dtype=dtype, overlap=overlap)
    mod.load_state_dict(ref.state_dict())
    x = seeded((batch, seq, cfg["hidden_size"]), seed + 1, dtype)
    dy = seeded((batch, seq, cfg["hidden_size"]), seed + 2, dtype)
    xr = x.clone().requires_grad_(True)
    yr = ref(xr)
    (yr * dy).sum().backward()
    xl = x[:, mine].clone().requires_grad_(True)
    yl = mod(xl)
    (yl * dy[:, mine]).sum().backward()
    mod.reduce_gradients()
    step = mod.last_step
    # A forward no backward follows (evaluation): the training forward's bits, nothing kept.
    with torch.no_grad():
        y_eval = mod(x[:, mine].clone())
    kept_nothing = mod.last_step["saved_bytes"] == 0
    errors = {"y_no_grad": 0.0 if torch.equal(y_eval, yl.detach()) and kept_nothing else float("inf"),
              "y": rel_error(yl.detach(), yr.detach()[:, mine]),
              "dx": rel_error(xl.grad, xr.grad[:, mine])}
    ref_params = dict(ref.named_parameters())
    for name, p in mod.named_parameters():
        errors[name] = rel_error(p.grad, ref_params[name].grad)
    worst = torch.tensor([max(errors.values())], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return float(worst), step


def main():
    dist.init_process_group("gloo")
    group = dist.new_group(list(range(dist.get_world_size())), backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    failed = passed = 0
    for cname in ("tiny", "no_q_lora"):
        cfg = configs()[cname]
        # float32 runs twice: collectives in line, and under compute (overlap=True)
        runs = [(torch.float64, False), (torch.float32, False), (torch.float32, True)]
        for dtype, overlap in runs:
            for case in every_case():
                if overlap and (cname != "tiny" or case[2] != "fused"):
                    continue
                err, step = check(cfg, case, dtype, group, overlap=overlap)
                ok = err <= TOLERANCE[dtype]
                sent = step["bytes_sent"]
                if world > 1 and sent == 0:
                    ok = False  # P > 1 must have exchanged something
                passed += ok
                failed += not ok
                if rank == 0:
                    (form, recompute, absorbed), layout, kernel = case
                    print(f"P={world} {cname} {str(dtype)[6:]} {form}{'+kv' if recompute else ''}"
                          f"{'(' + absorbed + ')' if form == 'absorbed' else ''} {layout} {kernel}"
                          f"{' overlap' if overlap else ''}: "
                          f"max rel error {err:.2e} (bytes sent {sent}) {'ok' if ok else 'FAILED'}", flush=True)
    if rank == 0:
        print(f"{passed} passed, {failed} failed")
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
