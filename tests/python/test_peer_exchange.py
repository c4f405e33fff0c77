"""The PyTorch peer's emulated all-to-alls (scripts/peer_torch_block.py): with `--exchange copy` each exchange is
a device copy of the whole buffer, each way, as laga's phantom rank's, and torch.compile keeps it."""
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import peer_torch_block as peer  # noqa: E402

P = 4


def round_trip(mode):
    """Tokens to heads, a per-element weight, heads back to tokens: both all-to-alls of one mode."""
    def f(x, w):
        return peer.a2a_heads_to_tokens(peer.a2a_tokens_to_heads(x, P, "phantom", mode) * w, P, "phantom", mode)
    return f


def test_exchange_is_a_copy_each_way():
    t = torch.randn(8, 1, 4, 3, requires_grad=True)
    y = peer.exchange(t)
    assert y.data_ptr() != t.data_ptr()
    assert torch.equal(y, t.detach())
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.equal(t.grad, g)


@pytest.mark.parametrize("compiled", [False, True])
def test_copy_mode_computes_what_the_packing_alone_does(compiled):
    torch.manual_seed(0)
    x = torch.randn(6, 1, 8, 5, requires_grad=True)
    w = torch.randn(24, 1, 2, 5)
    results = {}
    for mode in ("copy", "none"):
        f = round_trip(mode)
        if compiled:
            f = torch.compile(f)
        x.grad = None
        y = f(x, w)
        y.backward(torch.ones_like(y))
        results[mode] = (y.detach().clone(), x.grad.clone())
    assert torch.equal(results["copy"][0], results["none"][0])
    assert torch.equal(results["copy"][1], results["none"][1])


def test_torch_compile_keeps_the_exchange():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(round_trip("copy"), backend=backend)
    f(torch.randn(6, 1, 8, 5), torch.randn(24, 1, 2, 5))
    calls = [n for gm in graphs for n in gm.graph.nodes
             if n.op == "call_function" and n.target is torch.ops.laga_peer.exchange.default]
    assert len(calls) == 2, [str(n.target) for gm in graphs for n in gm.graph.nodes]
