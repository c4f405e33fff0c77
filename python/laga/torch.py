"""laga's MLA block as a PyTorch module: Hugging Face DeepSeek-V3 parameters, sequence parallelism over a
torch.distributed group, memory from PyTorch's allocators, autograd through laga's own backward."""

import json
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

import laga as _laga

__all__ = ["MultiheadLatentAttention", "shard_sequence"]

_FORMS = ("explicit", "absorbed", "laga")
_LAYOUTS = ("a2a", "all_gather", "p2p")
_KERNELS = ("eager", "fused")
_RECOMPUTE = (None, "none", "kv")
_ABSORBED = ("mqa", "expanded")
_PROVIDERS = ("auto", "laga", "cudnn")
_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} = {value!r}: must be one of {', '.join(repr(a) for a in allowed)}")


class _Weight(nn.Module):
    """A norm's scale, stored as ``<name>.weight`` like Hugging Face's DeepseekV3RMSNorm."""

    def __init__(self, n, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n, device=device, dtype=dtype))


_top_saved_tensors_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def _saved_tensors_hooks_active():
    """Whether saved-tensor hooks are in force (torch.utils.checkpoint without reentrant autograd,
    torch.autograd.graph.save_on_cpu, any saved_tensors_hooks): where this PyTorch cannot tell, assume so."""
    return _top_saved_tensors_hooks is None or _top_saved_tensors_hooks(False) is not None


_AGREE_GROUPS = {}


def _agree_group_of(group):
    """The CPU group over ``group``'s ranks for the input checks: the group itself where it is gloo (or MPI), else
    one gloo group made once per group and shared by every module on it (a model of many layers makes one)."""
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or "mpi" in backend:
        return group
    made = _AGREE_GROUPS.get(group.group_name)
    if made is None or made[0] is not group:  # a name reused after destroy_process_group is another group
        made = (group, dist.new_group(ranks=dist.get_process_group_ranks(group), backend="gloo",
                                      use_local_synchronization=True))
        _AGREE_GROUPS[group.group_name] = made
    return made[1]


class _LatentAttention(torch.autograd.Function):
    """laga's forward and backward (torch.ops.laga.mla_forward / mla_backward) on the Hugging Face parameters
    as they are: the block reads them in place and writes their gradients in their layout.

    ``dtype``: None, or the dtype to compute in where it is not the parameters' (torch.autocast): x and the
    parameters are cast to it here, and dx and the gradients cast back to theirs (main_grad takes the sums in its
    own dtype).

    What forward keeps for backward: by default laga holds it and frees each tensor as soon as its backward no
    longer needs it. Under saved-tensor hooks (activation checkpointing, offloading) laga hands it to autograd
    instead (save_for_backward), so that the hooks can drop, recompute or move it like any other saved tensor,
    and backward takes back what they return. The parameters themselves are not handed to the hooks (the module
    holds them anyway: offloading would copy every weight to the host and back each step); backward refuses them
    if they were modified in place since forward, as autograd does for what it saves. Their casts under autocast
    are the step's own tensors and go through the hooks."""

    @staticmethod
    def forward(ctx, module, x, dtype, *params):
        ctx.x_dtype, ctx.param_dtypes = x.dtype, [p.dtype for p in params]
        if dtype is not None:
            x, params = x.to(dtype), [p.to(dtype) for p in params]
        expose = _saved_tensors_hooks_active()
        y, saved, kept = torch.ops.laga.mla_forward(module._block, x, list(params), expose)
        ctx.module = module
        ctx.saved = saved
        ctx.n_params = len(params)
        if dtype is None:  # the module's own parameters: held here, their versions checked in backward
            ctx.params, ctx.param_versions = list(params), [p._version for p in params]
            ctx.save_for_backward(x, *kept)
        else:
            ctx.params = None
            ctx.save_for_backward(x, *params, *kept)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, *rest = ctx.saved_tensors
        if ctx.params is None:
            params, rest = rest[:ctx.n_params], rest[ctx.n_params:]
        else:
            params = ctx.params
            for p, version in zip(params, ctx.param_versions):
                if p._version != version:
                    name = next(n for n, q in ctx.module.named_parameters() if q is p)
                    raise RuntimeError(f"one of the variables needed for gradient computation has been modified by "
                                       f"an inplace operation: parameter {name} of laga's MultiheadLatentAttention is "
                                       f"at version {p._version}; expected version {version} instead (its forward "
                                       "used the values it had then)")
        kept = [t.contiguous() for t in rest]
        # main_grad and the flags live on the module's parameters (autograd may hand back copies: the casts under
        # autocast, detached ones under activation checkpointing).
        owners = ctx.module._hf_params()
        retain = ctx.module.retain_saved
        fused = ctx.module.fuse_wgrad_accumulation
        main_grads = [p.main_grad for p in owners] if fused else []
        dy = dy.to(x.dtype).contiguous()
        dx, grads = torch.ops.laga.mla_backward(ctx.saved, dy, x, list(params), main_grads, retain, kept)
        dx = dx.to(ctx.x_dtype)
        if not retain and not kept:  # laga's own saved tensors are gone (autograd's stay its to keep or free)
            ctx.saved = None
        if not fused:  # in the parameters' dtype, written there by the block (or cast to it)
            return (None, dx, None, *(g.to(t) for g, t in zip(grads, ctx.param_dtypes)))
        # The gradients went into main_grad. As TransformerEngine does for Megatron-Core's DDP, whose hooks
        # fire when a gradient reaches the parameter: flag the parameter and hand autograd a placeholder.
        out = []
        for p in owners:
            if hasattr(p, "grad_added_to_main_grad"):
                p.grad_added_to_main_grad = True
                zero = getattr(p, "zero_out_wgrad", False)
                out.append(torch.zeros_like(p) if zero else torch.empty_like(p))
            else:
                out.append(None)
        return (None, dx, None, *out)


def shard_sequence(tensor, layout="a2a", group=None, dim=1):
    """This rank's tokens of a whole sequence, for the module's ``forward`` and whatever else is indexed by token
    (input ids, labels, a loss mask): ``tensor`` indexed along ``dim`` (the sequence dimension, 1 for ``[batch,
    seq, ...]``) at ``laga.rank_positions(layout, S, P, r)``, r and P this process's rank in ``group`` and its size
    (None: one rank, the tensor itself). a2a and all_gather give a view of the consecutive chunk, p2p a copy of its
    two chunks. Raises ValueError when the layout cannot split the sequence over the group."""
    _choice("layout", layout, _LAYOUTS)
    if group is None:
        return tensor
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    positions = _laga.rank_positions(layout, tensor.size(dim), world, rank)
    if layout != "p2p":
        return tensor.narrow(dim, positions[0], len(positions))
    return tensor.index_select(dim, torch.tensor(positions, device=tensor.device))


class MultiheadLatentAttention(nn.Module):
    """Multi-head Latent Attention (DeepSeek-V2/V3) under sequence parallelism, run by laga.

    ``config``: a preset name (``"deepseek-v3"``, ``"tiny"``, ...), a path to a Hugging Face ``config.json``
    or a dict of its fields. ``form``: ``"explicit"``, ``"absorbed"`` or ``"laga"``; ``layout``: ``"a2a"``
    (Ulysses), ``"all_gather"`` (context parallel) or ``"p2p"`` (the ring: explicit and laga, fused kernel); ``kernel``: ``"fused"`` or ``"eager"``; ``recompute``:
    None or ``"kv"`` (LAGA only); ``absorbed_attention``: ``"mqa"`` or ``"expanded"`` (absorbed only);
    ``kv_grad_reduce_fp32``: explicit's all_gather sums its K/V gradients in float32 (bf16 only).
    ``overlap``: collectives start as soon as their input exists and run under the compute that does not need
    them (results bitwise the same). ``attention_provider``: who runs the fused attention on CUDA, ``"auto"``
    (per shape and pass, from laga's table of measured times), ``"laga"`` (laga's kernels) or ``"cudnn"`` (cuDNN's graph
    API where it supports the shape, deterministic backward); CPU tensors always run laga's. ``timing``: laga
    times each op on the device's queue and waits for the queue at the end of forward and of backward to read
    the times (``last_step``'s seconds); off (the default) it never waits, as any PyTorch op.
    ``deterministic=False`` lets the attention backward on CUDA sum dQ in any order (reruns differ in the last
    bits): cuDNN's non-deterministic backward (what PyTorch's scaled_dot_product_attention runs: faster, a small
    workspace, so ``"auto"`` can take cuDNN at long sequences) and laga's with its float32 sums across blocks
    added in any order; True (the default) keeps reruns bitwise identical.
    Gradients: by default backward hands autograd each parameter's gradient in the parameter's dtype, written
    there by laga's GEMMs (float32 accumulation, one rounding for bfloat16). ``fuse_wgrad_accumulation=True``
    (TransformerEngine's and Megatron-Core's gradient-accumulation fusion): every parameter carries a
    ``main_grad`` tensor of its shape (float32 for bfloat16 parameters, or the parameter's dtype), which
    backward adds this step's gradient to (no zero fill, no cast); ``.grad`` stays None, or gets a placeholder
    where the parameter has ``grad_added_to_main_grad`` (set to True, as Megatron-Core's DDP expects).
    ``group``: the sequence-parallel ``torch.distributed`` group (gloo for CPU tensors, NCCL for CUDA
    tensors); None = one rank. With an NCCL group the module also makes a gloo group over the same ranks, once,
    for the check of every rank's input before each forward, so that the check never waits for the GPU.

    ``forward(hidden_states)`` takes ``[batch, s_local, hidden_size]``, this rank's tokens of the sequence,
    ``x[:, laga.rank_positions(layout, S, P, r)]`` (a2a and all_gather: the contiguous chunk ``r*s_local ..
    (r+1)*s_local - 1``; p2p: chunks r and 2P-1-r of S/(2P) tokens; RoPE at those global positions; causal)
    and returns the same shape for the same tokens. After backward, each rank's parameter gradients are its local
    partial: their sum over the group is the gradient of the whole sequence, as for any weight replicated
    over a sequence-parallel group; ``reduce_gradients()`` (or a data-parallel reducer over the group) sums
    them. ``last_step`` is laga's accounting of the last forward and backward (saved tensors by name,
    peaks, traffic, FLOPs; seconds with timing=True). A forward no backward can follow (under ``torch.no_grad()``
    or ``torch.inference_mode()``, or where neither the input nor any parameter requires a gradient) keeps
    nothing: each activation is freed as soon as the forward is done with it (``last_step`` then shows no saved
    tensor and no backward). Under ``torch.compile`` the block runs eagerly between the
    compiled graphs (its forward is excluded from tracing: one graph break). Under saved-tensor hooks
    (``torch.utils.checkpoint(..., use_reentrant=False)``, ``torch.autograd.graph.save_on_cpu``) what forward
    keeps goes through autograd's ``save_for_backward``, so the hooks drop, recompute or move it. Under
    ``torch.autocast(device_type="cuda", dtype=torch.bfloat16)`` the block computes in bfloat16 whatever the
    parameters' dtype (the gradients come back in theirs); other autocast dtypes are refused; CPU autocast leaves
    the parameters' dtype.
    """

    def __init__(self, config, form="laga", layout="a2a", kernel="fused", recompute=None, group=None,
                 absorbed_attention="mqa", kv_grad_reduce_fp32=False, overlap=False, attention_provider="auto",
                 timing=False, fuse_wgrad_accumulation=False, deterministic=True, device=None, dtype=None):
        super().__init__()
        cfg = _laga.config(config)
        _choice("form", form, _FORMS)
        _choice("layout", layout, _LAYOUTS)
        _choice("kernel", kernel, _KERNELS)
        _choice("recompute", recompute, _RECOMPUTE)
        _choice("absorbed_attention", absorbed_attention, _ABSORBED)
        _choice("attention_provider", attention_provider, _PROVIDERS)
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError(f"dtype = {dtype}: must be torch.float32, torch.float64 or torch.bfloat16")
        self.config = cfg
        self.form, self.layout, self.kernel = form, layout, kernel
        self.recompute = recompute or "none"
        self.group = group
        # True: what forward keeps survives backward, so backward can run twice through one graph
        # (retain_graph=True, gradcheck), at the cost of that memory until the graph goes.
        self.retain_saved = False
        if group is not None:
            if not dist.is_initialized():
                raise ValueError("group is set but torch.distributed is not initialized")
            self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
            group_name = group.group_name
            # The inputs' agreement before each forward (a few integers a rank) goes over a CPU group: over NCCL,
            # reading its result back would make the host wait for the GPU, the previous step's backward
            # included, at every step. Only the group's own ranks take part in making it.
            self._agree_group = _agree_group_of(group)
        else:
            self.rank, self.world, group_name = 0, 1, ""
        if layout == "a2a" and cfg["num_attention_heads"] % self.world:
            raise ValueError(f"num_attention_heads = {cfg['num_attention_heads']} is not divisible by the group "
                             f"size {self.world}: the a2a layout gives each rank n_h/P heads")
        if layout == "p2p" and (kernel != "fused" or form == "absorbed" or self.recompute == "kv"):
            raise ValueError(f"layout = 'p2p' with form = {form!r}, kernel = {kernel!r}, recompute = "
                             f"{self.recompute!r}: the ring runs the explicit and laga forms with the fused kernel "
                             "(partial results merged by their log-sum-exp) and rebuilds K/V per chunk already")
        if self.recompute == "kv" and form != "laga":
            raise ValueError(f"recompute = 'kv' with form = {form!r}: K/V recomputation is defined for the laga "
                             "form only")
        options = {"form": form, "layout": layout, "kernel": kernel, "recompute": self.recompute,
                   "absorbed_attention": absorbed_attention, "kv_grad_reduce_fp32": bool(kv_grad_reduce_fp32),
                   "overlap": bool(overlap), "attention_provider": attention_provider, "timing": bool(timing),
                   "accumulate_grads": bool(fuse_wgrad_accumulation), "deterministic": bool(deterministic)}
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.overlap, self.attention_provider, self._timing = bool(overlap), attention_provider, bool(timing)
        self._block = torch.classes.laga.Block(json.dumps(cfg), json.dumps(options), group_name, self.rank,
                                               self.world)
        d, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        rq, rkv = cfg["q_lora_rank"], cfg["kv_lora_rank"]
        dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        kw = {"device": device, "dtype": dtype}
        if rq is not None:
            self.q_a_proj = nn.Linear(d, rq, bias=False, **kw)
            self.q_a_layernorm = _Weight(rq, **kw)
            self.q_b_proj = nn.Linear(rq, nh * (dn + dr), bias=False, **kw)
        else:
            self.q_proj = nn.Linear(d, nh * (dn + dr), bias=False, **kw)
        self.kv_a_proj_with_mqa = nn.Linear(d, rkv + dr, bias=False, **kw)
        self.kv_a_layernorm = _Weight(rkv, **kw)
        self.kv_b_proj = nn.Linear(rkv, nh * (dn + dv), bias=False, **kw)
        self.o_proj = nn.Linear(nh * dv, d, bias=False, **kw)

    # ---- parameters, in include/laga/block.hpp's MlaWeights order ----
    def _hf_params(self):
        if self.config["q_lora_rank"] is not None:
            head = [self.q_a_proj.weight, self.q_a_layernorm.weight, self.q_b_proj.weight]
        else:
            head = [self.q_proj.weight]
        return head + [self.kv_a_proj_with_mqa.weight, self.kv_a_layernorm.weight, self.kv_b_proj.weight,
                       self.o_proj.weight]

    # ---- validation: local checks, then one small collective so every rank refuses together ----
    _CHECKS = ("ok", "the input must be [batch, s_local, hidden_size] with s_local >= 1",
               "the input's dtype must be the parameters' (float32, float64 or bfloat16)",
               "the input and the parameters must be on one device (CPU and CUDA tensors mixed)",
               "the group's backend cannot run collectives on the input's device (gloo: CPU, NCCL: CUDA)",
               "fuse_wgrad_accumulation needs every parameter's main_grad (its shape, device and dtype or float32)",
               "torch.autocast's dtype must be bfloat16 (laga computes in float32, float64 or bfloat16)")

    def _compute_dtype(self, x):
        """The dtype laga computes in: the parameters', or under torch.autocast on CUDA its dtype (bfloat16; any
        other is _local_check's to refuse). On the CPU autocast leaves the block in the parameters' dtype: laga's
        CPU backend computes in float32 or float64 only (autocast's rule for an op it has no lower-precision
        kernel for)."""
        return torch.get_autocast_dtype("cuda") if self._autocast(x) else self.kv_a_layernorm.weight.dtype

    @staticmethod
    def _autocast(x):
        return isinstance(x, torch.Tensor) and x.device.type == "cuda" and torch.is_autocast_enabled("cuda")

    def _local_check(self, x):
        p = self.kv_a_layernorm.weight
        d = self.config["hidden_size"]
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.size(2) != d or x.size(1) < 1 or x.size(0) < 1:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            return 1, f"hidden_states has shape {shape}: expected [batch, s_local, hidden_size = {d}]"
        dtype = self._compute_dtype(x)
        if dtype not in _DTYPES:
            return 6, (f"torch.autocast(dtype={dtype}) is in force: laga computes in float32, float64 or "
                       "bfloat16; use torch.autocast(device_type='cuda', dtype=torch.bfloat16)")
        if x.dtype not in _DTYPES or (not self._autocast(x) and x.dtype != p.dtype):
            return 2, (f"hidden_states is {x.dtype} but the parameters are {p.dtype}: one dtype, float32, "
                       "float64 or bfloat16 (under torch.autocast on CUDA: any of them, cast to bfloat16)")
        if any(t.device != x.device for t in self._hf_params()):
            return 3, (f"hidden_states is on {x.device} but a parameter is on "
                       f"{next(t.device for t in self._hf_params() if t.device != x.device)}: CPU and CUDA "
                       "tensors mixed")
        if self.fuse_wgrad_accumulation:
            for name, p in self.named_parameters():
                g = getattr(p, "main_grad", None)
                allowed = (p.dtype, torch.float64 if p.dtype == torch.float64 else torch.float32)
                if not isinstance(g, torch.Tensor) or g.shape != p.shape or g.device != p.device or \
                        g.dtype not in allowed or not g.is_contiguous():
                    got = "none" if not isinstance(g, torch.Tensor) else f"{tuple(g.shape)} {g.dtype} on {g.device}"
                    return 5, (f"fuse_wgrad_accumulation=True: {name}.main_grad is {got}; it must be a contiguous "
                               f"{tuple(p.shape)} tensor on {p.device} in {' or '.join(map(str, set(allowed)))}")
        if self.group is not None:
            backend = str(dist.get_backend(self.group)).lower()
            needs = "nccl" if x.device.type == "cuda" else "gloo"
            if needs not in backend and not (needs == "gloo" and "mpi" in backend):
                return 4, (f"the group's backend is {backend!r}, which cannot run laga's collectives on "
                           f"{x.device.type} tensors: use {needs} for {x.device.type}")
        return 0, ""

    def _agree(self, x, code, message):
        """Every rank learns every rank's check and chunk before laga's first collective."""
        if self.group is None:
            if code:
                raise ValueError(message)
            return
        shape = tuple(x.shape) if code == 0 or code > 1 else (0, 0, 0)
        mine = torch.tensor([code, shape[0], shape[1], _DTYPES.index(self._compute_dtype(x)) if code == 0 else -1],
                            dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine, group=self._agree_group)
        every = torch.stack(every).tolist()
        if code:
            raise ValueError(message)
        bad = [r for r, e in enumerate(every) if e[0]]
        if bad:
            raise ValueError(f"rank(s) {bad} refused their input ({self._CHECKS[every[bad[0]][0]]}); rank "
                             f"{self.rank} stops with them")
        chunks = {(e[1], e[2], e[3]) for e in every}
        if len(chunks) > 1:
            table = ", ".join(f"rank {r}: batch {e[1]}, s_local {e[2]}, {_DTYPES[e[3]]}" for r, e in enumerate(every))
            raise ValueError(f"the ranks' inputs differ ({table}): every rank must hold a chunk of the same "
                             "batch, length and dtype (the dtype laga computes in: autocast's or the parameters')")

    # Under torch.compile the block runs eagerly between the compiled graphs (one graph break, as at
    # TransformerEngine's modules): its checks, collectives and kernels are laga's own, not traced.
    @torch.compiler.disable
    def forward(self, hidden_states):
        code, message = self._local_check(hidden_states)
        self._agree(hidden_states, code, message)
        x = hidden_states.transpose(0, 1).contiguous()  # [s, batch, d]: a view when batch is 1
        params = self._hf_params()
        dtype = self._compute_dtype(x)
        cast = dtype if any(t.dtype != dtype for t in [x, *params]) else None
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
            y = _LatentAttention.apply(self, x, cast, *params)
        else:  # no backward can follow (no_grad, inference_mode, nothing that needs a gradient): keep nothing
            if cast is not None:
                x, params = x.to(cast), [p.to(cast) for p in params]
            y = torch.ops.laga.mla_forward_no_grad(self._block, x, list(params))
        return y.transpose(0, 1)

    def reduce_gradients(self):
        """Sums every parameter's gradient over the group (no-op for one rank)."""
        if self.group is None or self.world == 1:
            return
        for p in self.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)

    @property
    def timing(self):
        """Whether laga times its ops (and waits for the device at the end of each pass); settable."""
        return self._timing

    @timing.setter
    def timing(self, on):
        self._timing = bool(on)
        self._block.set_timing(self._timing)

    @property
    def last_step(self):
        """laga's figures for this rank's last forward and backward, the record ``laga run --json`` writes
        for each rank and ``laga bench`` for each point's ranks (docs/bench.md): ``rank``, ``hostname``,
        ``saved`` (name, shape, dtype, bytes), ``saved_bytes``, ``peak_forward_bytes``, ``peak_backward_bytes``,
        ``bytes_sent``, ``bytes_received``, ``traffic`` (each collective's calls, bytes, seconds and bus
        bandwidth), ``flops_forward``/``flops_backward`` by phase; with ``timing``, ``seconds_forward``/
        ``seconds_backward`` by phase, their ``_total`` and ``_span`` (the first op's start to the last one's
        end)."""
        return json.loads(self._block.stats_json())

    def extra_repr(self):
        return (f"form={self.form}, layout={self.layout}, kernel={self.kernel}, recompute={self.recompute}, "
                f"overlap={self.overlap}, attention_provider={self.attention_provider}, ranks={self.world}")
