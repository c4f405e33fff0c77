"""laga.torch.MultiheadLatentAttention on one rank against the tests' own Hugging Face-style reference:
output, input gradient and every parameter gradient, every form x layout x kernel, float64 and float32."""

import gc
import json
import os
import subprocess
import weakref

import numpy as np

import pytest
import torch
import torch.utils.checkpoint

import laga
import laga.torch as lt
from common import TOLERANCE, configs, every_case, init_reference, rel_error, seeded
from reference import ReferenceDeepseekV3Attention


def run_pair(cfg, case, dtype, batch=2, seq=16, seed=7, **options):
    (form, recompute, absorbed), layout, kernel = case
    ref = ReferenceDeepseekV3Attention(cfg, dtype=dtype)
    init_reference(ref, seed)
    mod = lt.MultiheadLatentAttention(cfg, form=form, layout=layout, kernel=kernel, recompute=recompute,
                                      absorbed_attention=absorbed, dtype=dtype, **options)
    mod.load_state_dict(ref.state_dict())
    x = seeded((batch, seq, cfg["hidden_size"]), seed + 100, dtype)
    dy = seeded((batch, seq, cfg["hidden_size"]), seed + 200, dtype)
    out = {}
    for name, m in (("ref", ref), ("laga", mod)):
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        (y * dy).sum().backward()
        out[name] = {"y": y.detach(), "dx": xi.grad, **{k: p.grad for k, p in m.named_parameters()}}
    return out, mod


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", every_case(), ids=lambda c: f"{c[0][0]}-{c[0][1] or 'none'}-{c[0][2]}-{c[1]}-{c[2]}")
@pytest.mark.parametrize("config", ["tiny", "no_q_lora", "plain_rope"])
def test_matches_reference(config, case, dtype):
    out, _ = run_pair(configs()[config], case, dtype)
    ref, got = out["ref"], out["laga"]
    assert set(ref) == set(got)
    errors = {k: rel_error(got[k], ref[k]) for k in ref}
    assert max(errors.values()) <= TOLERANCE[dtype], errors


@pytest.mark.parametrize("case", [c for c in every_case() if c[2] == "fused"],
                         ids=lambda c: f"{c[0][0]}-{c[0][1] or 'none'}-{c[0][2]}-{c[1]}")
def test_overlap_and_provider_keep_results_bitwise(case):
    # overlap=True moves collectives under compute and attention_provider='laga' pins what 'auto' runs on the
    # CPU: the same ops on the same data, so the same bits.
    base, _ = run_pair(configs()["tiny"], case, torch.float32)
    for options in (dict(overlap=True), dict(attention_provider="laga"), dict(timing=True)):
        got, mod = run_pair(configs()["tiny"], case, torch.float32, **options)
        assert f"overlap={options.get('overlap', False)}" in repr(mod)
        for k, v in base["laga"].items():
            assert torch.equal(got["laga"][k], v), (options, k)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("case", [c for c in every_case() if c[2] == "fused"],
                         ids=lambda c: f"{c[0][0]}-{c[0][1] or 'none'}-{c[0][2]}-{c[1]}")
def test_fuse_wgrad_accumulation_adds_to_main_grad(case, checkpointed):
    # Megatron-style gradient-accumulation fusion: two steps add 2 g to what main_grad held; .grad stays None,
    # or is a placeholder where the parameter carries grad_added_to_main_grad (then set to True). Under
    # activation checkpointing autograd hands backward detached copies of the parameters: main_grad and the
    # flags are the module's parameters' still.
    cfg, dtype = configs()["tiny"], torch.float64
    base, _ = run_pair(cfg, case, dtype)
    (form, recompute, absorbed), layout, kernel = case
    mod = lt.MultiheadLatentAttention(cfg, form=form, layout=layout, kernel=kernel, recompute=recompute,
                                      absorbed_attention=absorbed, dtype=dtype, fuse_wgrad_accumulation=True)
    ref = ReferenceDeepseekV3Attention(cfg, dtype=dtype)
    init_reference(ref, 7)
    mod.load_state_dict(ref.state_dict())
    for name, p in mod.named_parameters():
        p.main_grad = torch.ones_like(p)
    mod.o_proj.weight.grad_added_to_main_grad = False
    mod.o_proj.weight.zero_out_wgrad = True
    x = seeded((2, 16, cfg["hidden_size"]), 107, dtype)
    dy = seeded((2, 16, cfg["hidden_size"]), 207, dtype)
    for step in (1, 2):
        xi = x.clone().requires_grad_(True)
        y = torch.utils.checkpoint.checkpoint(mod, xi, use_reentrant=False) if checkpointed else mod(xi)
        (y * dy).sum().backward()
        assert rel_error(xi.grad, base["laga"]["dx"]) <= 1e-12
    for name, p in mod.named_parameters():
        assert rel_error(p.main_grad - 1, 2 * base["laga"][name]) <= 1e-12, name
        if p is mod.o_proj.weight:
            assert p.grad_added_to_main_grad is True and torch.count_nonzero(p.grad) == 0
        else:
            assert p.grad is None, name
    del mod.kv_b_proj.weight.main_grad
    with pytest.raises(ValueError, match="kv_b_proj.weight.main_grad is none"):
        mod(x)


def test_gradcheck_float64():
    cfg = configs()["tiny"]
    mod = lt.MultiheadLatentAttention(cfg, dtype=torch.float64)
    mod.retain_saved = True  # gradcheck runs backward more than once per graph
    params = [p for _, p in mod.named_parameters()]
    x = seeded((1, 8, cfg["hidden_size"]), 3, torch.float64).requires_grad_(True)

    def f(x, *ps):
        with torch.no_grad():
            for p, v in zip(params, ps):
                p.copy_(v)
        return lt._LatentAttention.apply(mod, x.transpose(0, 1).contiguous(), None, *ps)

    inputs = (x,) + tuple(p.detach().clone().requires_grad_(True) for p in params)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def step_results(mod, xi, y, dy):
    """Backward of (y * dy).sum() from y = mod(xi) (mod's gradients zeroed first): y, dx and every parameter
    gradient."""
    mod.zero_grad(set_to_none=True)
    (y * dy).sum().backward()
    return {"y": y.detach(), "dx": xi.grad, **{k: p.grad for k, p in mod.named_parameters()}}


def grads_of(mod, x, dy, wrap=None):
    """y, dx and every parameter gradient of one step, the module called through `wrap` (a checkpoint) if
    given."""
    xi = x.clone().requires_grad_(True)
    return step_results(mod, xi, wrap(mod, xi) if wrap else mod(xi), dy)


def tiny_case(case):
    """The tiny configuration's module for one case of every_case() in float64, an input and an output gradient."""
    (form, recompute, absorbed), layout, kernel = case
    cfg = configs()["tiny"]
    mod = lt.MultiheadLatentAttention(cfg, form=form, layout=layout, kernel=kernel, recompute=recompute,
                                      absorbed_attention=absorbed, dtype=torch.float64)
    return mod, seeded((2, 16, cfg["hidden_size"]), 3, torch.float64), seeded((2, 16, cfg["hidden_size"]), 4,
                                                                              torch.float64)


@pytest.mark.parametrize("case", every_case(), ids=lambda c: f"{c[0][0]}-{c[0][1] or 'none'}-{c[0][2]}-{c[1]}-{c[2]}")
def test_saved_tensors_go_through_hooks(case):
    """Under saved-tensor hooks laga hands what forward keeps to autograd: the hooks see every byte laga
    counts as saved and the input, no parameter (an offloading hook would copy every weight to the host and back),
    laga keeps none of it (the tensors it handed over die once the hook has packed a copy), and backward runs on
    what the hooks give back, to the same bits as without hooks."""
    mod, x, dy = tiny_case(case)
    base = grads_of(mod, x, dy)
    params = {id(p) for p in mod.parameters()}
    packed, handed = [], []

    def pack(t):
        assert id(t) not in params, "a parameter went through the saved-tensor hooks"
        packed.append(t.numel() * t.element_size())
        handed.append(weakref.ref(t))
        return t.clone()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        xi = x.clone().requires_grad_(True)
        y = mod(xi)
    saved_bytes = mod.last_step["saved_bytes"]
    gc.collect()
    assert sum(packed) == saved_bytes + xi.numel() * xi.element_size(), (packed, saved_bytes)
    assert sum(r() is not None for r in handed) == 0  # x's copy and laga's tensors: only the hook's copies live
    got = step_results(mod, xi, y, dy)
    for k, v in base.items():
        assert torch.equal(got[k], v), k


@pytest.mark.parametrize("case", every_case(), ids=lambda c: f"{c[0][0]}-{c[0][1] or 'none'}-{c[0][2]}-{c[1]}-{c[2]}")
def test_forward_without_gradients_keeps_nothing(case):
    """Where no backward can follow (torch.no_grad, torch.inference_mode, nothing that requires a gradient) the
    block keeps nothing: the output bits of a training forward, no saved tensor and a forward peak no higher
    than the training forward's; the next training step is unchanged."""
    mod, x, dy = tiny_case(case)
    base = grads_of(mod, x, dy)
    kept = mod.last_step
    assert kept["saved_bytes"] > 0
    frozen = [torch.no_grad, torch.inference_mode]
    for context in frozen:
        with context():
            y = mod(x.clone().requires_grad_(context is torch.no_grad))
        step = mod.last_step
        assert not y.requires_grad and torch.equal(y, base["y"]), context.__name__
        assert step["saved_bytes"] == 0 and step["saved"] == [], (context.__name__, step["saved"])
        assert 0 < step["peak_forward_bytes"] <= kept["peak_forward_bytes"], context.__name__
        assert step["peak_backward_bytes"] == 0 and sum(step["flops_backward"].values()) == 0
    for p in mod.parameters():  # nothing requires a gradient: the same
        p.requires_grad_(False)
    y = mod(x)
    assert not y.requires_grad and torch.equal(y, base["y"]) and mod.last_step["saved_bytes"] == 0
    for p in mod.parameters():
        p.requires_grad_(True)
    got = grads_of(mod, x, dy)
    for k, v in base.items():
        assert torch.equal(got[k], v), k


@pytest.mark.parametrize("hooks", [False, True], ids=["plain", "hooks"])
def test_parameter_modified_in_place_before_backward_is_refused(hooks):
    """A parameter changed in place between forward and backward (its forward used the old values) is refused by
    backward, with or without saved-tensor hooks, as autograd refuses what it saved."""
    cfg = configs()["tiny"]
    mod = lt.MultiheadLatentAttention(cfg, dtype=torch.float64)
    x = seeded((2, 16, cfg["hidden_size"]), 1, torch.float64).requires_grad_(True)
    if hooks:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            y = mod(x)
    else:
        y = mod(x)
    with torch.no_grad():
        mod.o_proj.weight.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation: parameter o_proj.weight"):
        y.sum().backward()


def test_saved_tensors_hooks_and_retain_graph():
    """Under saved-tensor hooks autograd owns what forward kept: a second backward through a retained graph runs
    (and adds the same gradient again), without retain_graph autograd refuses it."""
    cfg = configs()["tiny"]
    mod = lt.MultiheadLatentAttention(cfg, dtype=torch.float64)
    x = seeded((2, 16, cfg["hidden_size"]), 1, torch.float64).requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        y = mod(x)
    y.sum().backward(retain_graph=True)
    once = x.grad.clone()
    y.sum().backward()
    assert torch.equal(x.grad, 2 * once)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_activation_checkpointing(reentrant):
    """torch.utils.checkpoint around the module: forward again in backward, the same bits as without it."""
    cfg = configs()["tiny"]
    mod = lt.MultiheadLatentAttention(cfg, dtype=torch.float64)
    x = seeded((2, 16, cfg["hidden_size"]), 5, torch.float64)
    dy = seeded((2, 16, cfg["hidden_size"]), 6, torch.float64)
    base = grads_of(mod, x, dy)
    got = grads_of(mod, x, dy, lambda m, xi: torch.utils.checkpoint.checkpoint(m, xi, use_reentrant=reentrant))
    for k, v in base.items():
        assert torch.equal(got[k], v), k


def test_computes_in_another_dtype_and_casts_back():
    """The path torch.autocast takes on CUDA (the parameters and x cast to the compute dtype inside the
    autograd function, dx and the gradients cast back), run here with float64 parameters computed in float32:
    the same bits as a float32 module on the rounded parameters, its gradients rounded back."""
    cfg = configs()["tiny"]
    ref = ReferenceDeepseekV3Attention(cfg, dtype=torch.float64)
    init_reference(ref, 8)
    wide = lt.MultiheadLatentAttention(cfg, dtype=torch.float64)
    wide.load_state_dict(ref.state_dict())
    narrow = lt.MultiheadLatentAttention(cfg, dtype=torch.float32)
    narrow.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    x = seeded((2, 16, cfg["hidden_size"]), 9, torch.float64)
    dy = seeded((2, 16, cfg["hidden_size"]), 10, torch.float32)
    base = grads_of(narrow, x.float(), dy)
    xi = x.clone().requires_grad_(True)
    y = lt._LatentAttention.apply(wide, xi.transpose(0, 1).contiguous(), torch.float32, *wide._hf_params())
    y = y.transpose(0, 1)
    assert y.dtype == torch.float32 and torch.equal(y.detach(), base["y"])
    (y * dy).sum().backward()
    assert xi.grad.dtype == torch.float64 and torch.equal(xi.grad, base["dx"].double())
    for k, p in wide.named_parameters():
        assert p.grad.dtype == torch.float64 and torch.equal(p.grad, base[k].double()), k


def test_cpu_autocast_leaves_the_parameters_dtype():
    """torch.autocast on the CPU: laga's CPU backend has no bfloat16 kernels, so the block runs in the
    parameters' dtype, the same bits as without autocast (autocast's rule for an op it does not cover)."""
    cfg = configs()["tiny"]
    mod = lt.MultiheadLatentAttention(cfg, dtype=torch.float32)
    x = seeded((2, 16, cfg["hidden_size"]), 11, torch.float32)
    dy = seeded((2, 16, cfg["hidden_size"]), 12, torch.float32)
    base = grads_of(mod, x, dy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = grads_of(mod, x, dy)
    for k, v in base.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_inside_torch_compile():
    """A model compiled with torch.compile around the module: the block runs eagerly between the compiled
    graphs (forward is excluded from tracing), and the compiled model's output and every gradient equal the
    eager model's (float64; the compiled layers around it may round otherwise by a few ulps)."""
    cfg = configs()["tiny"]
    d = cfg["hidden_size"]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(d, d, dtype=torch.float64)
            self.mla = lt.MultiheadLatentAttention(cfg, dtype=torch.float64)
            self.out = torch.nn.Linear(d, d, dtype=torch.float64)

        def forward(self, x):
            return self.out(torch.nn.functional.gelu(self.mla(torch.tanh(self.inp(x))))).square().sum()

    torch.manual_seed(5)
    net = Net()
    ref = ReferenceDeepseekV3Attention(cfg, dtype=torch.float64)
    init_reference(ref, 9)
    net.mla.load_state_dict(ref.state_dict())
    x = seeded((2, 16, d), 4, torch.float64)
    got = {}
    for name, model in (("eager", net), ("compiled", torch.compile(net))):
        net.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        loss = model(xi)
        loss.backward()
        got[name] = {"loss": loss.detach(), "dx": xi.grad, **{k: p.grad for k, p in net.named_parameters()}}
    assert set(got["compiled"]) == set(got["eager"])
    errors = {k: rel_error(got["compiled"][k], v) for k, v in got["eager"].items()}
    assert max(errors.values()) <= TOLERANCE[torch.float64], errors
    assert net.mla.last_step["saved_bytes"] > 0  # laga's block ran (and accounted) inside the compiled model


def test_state_dict_round_trip():
    for cfg in configs().values():
        ref = ReferenceDeepseekV3Attention(cfg, dtype=torch.float64)
        init_reference(ref, 11)
        mod = lt.MultiheadLatentAttention(cfg, dtype=torch.float64)
        assert sorted(mod.state_dict()) == sorted(ref.state_dict())
        mod.load_state_dict(ref.state_dict())  # strict: the same names and shapes
        back = ReferenceDeepseekV3Attention(cfg, dtype=torch.float64)
        back.load_state_dict(mod.state_dict())
        for k, v in ref.state_dict().items():
            assert torch.equal(back.state_dict()[k], v), k
    names = sorted(lt.MultiheadLatentAttention(configs()["no_q_lora"]).state_dict())
    assert "q_proj.weight" in names and "q_a_proj.weight" not in names


def test_accounting_after_a_step():
    out, mod = run_pair(configs()["tiny"], (("laga", None, "mqa"), "a2a", "fused"), torch.float32)
    step = mod.last_step
    # The record laga run --json writes for a rank (laga::rank_report): the same keys, no device memory.
    assert set(step) == {"rank", "hostname", "saved_bytes", "saved", "peak_forward_bytes", "peak_backward_bytes",
                         "bytes_sent", "bytes_received", "traffic", "flops_forward", "flops_backward",
                         "seconds_forward", "seconds_backward", "seconds_forward_total", "seconds_backward_total",
                         "seconds_forward_span", "seconds_backward_span"}, sorted(step)
    assert step["rank"] == 0 and step["bytes_sent"] == 0
    assert step["saved_bytes"] == sum(t["bytes"] for t in step["saved"]) > 0
    assert {t["name"] for t in step["saved"]} >= {"x_norm_q", "o_att/o"} or step["saved"]
    assert step["peak_forward_bytes"] >= step["saved_bytes"]
    assert sum(step["flops_forward"].values()) > 0 and sum(step["flops_backward"].values()) > 0
    # Untimed by default (laga never waits for the device); timing=True times every op and the passes' spans.
    assert not mod.timing and step["seconds_forward_total"] == 0 == step["seconds_backward_span"]
    mod.timing = True
    mod(seeded((2, 16, mod.config["hidden_size"]), 1, torch.float32)).sum().backward()
    step = mod.last_step
    for p in ("forward", "backward"):
        assert step[f"seconds_{p}_span"] >= step[f"seconds_{p}_total"] > 0, step


def test_rank_positions_is_the_token_map():
    assert laga.rank_positions("a2a", 12, 3, 1) == [4, 5, 6, 7]
    assert laga.rank_positions("all_gather", 12, 3, 2) == [8, 9, 10, 11]
    assert laga.rank_positions("p2p", 8, 2, 0) == [0, 1, 6, 7]
    assert laga.rank_positions("p2p", 8, 2, 1) == [2, 3, 4, 5]
    assert sorted(sum((laga.rank_positions("p2p", 32, 4, r) for r in range(4)), [])) == list(range(32))
    with pytest.raises(ValueError, match="not divisible by 2 x sp = 8"):
        laga.rank_positions("p2p", 12, 4, 0)
    with pytest.raises(ValueError, match="layout = 'ring'"):
        laga.rank_positions("ring", 8, 2, 0)


def test_config_forms():
    tiny = laga.config("tiny")
    assert laga.config(dict(tiny)) == tiny
    with pytest.raises(ValueError, match="kv_lora_rank"):
        laga.config({k: v for k, v in tiny.items() if k != "kv_lora_rank"})
    with pytest.raises(ValueError, match="no-such-model"):
        laga.config("no-such-model")


@pytest.mark.parametrize("bad, match", [
    (dict(form="latent"), "form = 'latent'"),
    (dict(layout="ring"), "layout = 'ring'"),
    (dict(layout="p2p", kernel="eager"), "layout = 'p2p' with form = 'laga', kernel = 'eager'"),
    (dict(layout="p2p", form="absorbed"), "the ring runs the explicit and laga forms"),
    (dict(kernel="flash"), "kernel = 'flash'"),
    (dict(form="explicit", recompute="kv"), "recompute = 'kv' with form = 'explicit'"),
    (dict(dtype=torch.float16), "dtype = torch.float16"),
    (dict(attention_provider="flash"), "attention_provider = 'flash'"),
])
def test_bad_options(bad, match):
    with pytest.raises(ValueError, match=match):
        lt.MultiheadLatentAttention("tiny", **bad)


def test_bad_inputs():
    with pytest.raises(ValueError, match="attention_provider = 'cudnn' on a CPU tensor: cuDNN runs on the GPU"):
        lt.MultiheadLatentAttention("tiny", attention_provider="cudnn")(torch.zeros(1, 8, 32))
    mod = lt.MultiheadLatentAttention("tiny")
    d = mod.config["hidden_size"]
    with pytest.raises(ValueError, match=r"shape \(2, 8, 31\): expected \[batch, s_local, hidden_size = 32\]"):
        mod(torch.zeros(2, 8, d - 1))
    with pytest.raises(ValueError, match="hidden_states is torch.float64 but the parameters are torch.float32"):
        mod(torch.zeros(2, 8, d, dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        mod(torch.zeros(8, d))


def cli_path():
    """The command-line tool of the build tree beside the package's (scripts/test.sh builds it first)."""
    return os.environ.get("LAGA_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build", "laga"))


@pytest.mark.parametrize("args", [
    dict(model="deepseek-v3", seq=[4096, 16384], sp=[1, 8], layout="a2a", kernel="fused", gpu_mem="141GB", layers=61),
    dict(model="tiny", seq=64, sp=4, layout="all_gather", kernel="eager", dtype="float32", kv_grad_reduce_fp32=True),
])
def test_plan_equals_cli(args):
    if not os.path.exists(cli_path()):
        pytest.fail(f"{cli_path()} not found: build the CLI first (scripts/build.sh), or set LAGA_CLI")
    cmd = [cli_path(), "plan", "--json", "--model", args["model"], "--seq", ",".join(map(str, np.atleast_1d(args["seq"]))),
           "--sp", ",".join(map(str, np.atleast_1d(args["sp"]))), "--layout", args["layout"], "--kernel", args["kernel"],
           "--dtype", args.get("dtype", "bfloat16"), "--layers", str(args.get("layers", 1))]
    if "gpu_mem" in args:
        cmd += ["--gpu-mem", args["gpu_mem"]]
    if args.get("kv_grad_reduce_fp32"):
        cmd.append("--kv-grad-reduce-in-fp32")
    expected = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    assert laga.plan(**args) == expected


def test_plan_bad_input():
    with pytest.raises(ValueError, match="layout"):
        laga.plan("tiny", seq=64, sp=4, layout="ring")
    with pytest.raises(ValueError, match="not divisible"):
        laga.plan("tiny", seq=66, sp=4)


def test_build_info_says_what_the_extension_has():
    info = laga.build_info()
    assert set(info) == {"cuda", "cudnn"} and isinstance(info["cuda"], bool)
    cudnn = info["cudnn"]
    assert {"compiled", "loaded"} <= set(cudnn)
    if not info["cuda"]:  # the CPU-only build: no cuDNN, and the reason given
        assert not cudnn["compiled"] and not cudnn["loaded"] and "without CUDA" in cudnn["error"]
    if cudnn["loaded"]:
        assert cudnn["compiled"] and cudnn["version"] >= 90000
