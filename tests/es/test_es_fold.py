"""The folded ES stacks: ``up`` and the bias noise of an nn.Linear in one buffer, read in place by the forward.

The folded path must give bitwise the generic routing path's output (same product, same operands), and
must step aside wherever its layout does not hold.
"""

from __future__ import annotations

import pytest
import torch
from models import TinyTransformer, mlp
from torch import nn

import populora.es.members as members_module
from populora import EggrollES
from populora.es.fold import folded_apply, folded_stack
from populora.routing.route import Route


@pytest.fixture(autouse=True)
def _no_shared_rows(monkeypatch):
    """The first layer of a shared batch has its own path (test_es_shared.py): off here."""
    monkeypatch.setattr(members_module.ESRouter, "share_rows", False)


def _generic(monkeypatch):
    """Route every target through the routing layer's generic path."""
    monkeypatch.setattr(members_module, "folded_apply", lambda *args, **kwargs: None)


def _count(monkeypatch) -> list[int]:
    """Record the targets the folded path served."""
    served: list[int] = []

    def counting(module, x, out, route, adapter):
        result = folded_apply(module, x, out, route, adapter)
        served.append(result is not None)
        return result

    monkeypatch.setattr(members_module, "folded_apply", counting)
    return served


def _mlp_es(pop: int = 8, **kwargs) -> tuple[EggrollES, torch.Tensor]:
    torch.manual_seed(0)
    return EggrollES(mlp(), pop, 0.3, 0.1, 3, seed=4, **kwargs), torch.randn(5, 6)


def test_up_and_bias_noise_are_views_of_one_stack():
    es, _ = _mlp_es()
    for adapter, module in zip(es.ask()._target.adapters, es._targets.values()):
        folded = folded_stack(adapter.up, adapter.bias)
        assert folded is not None and folded.shape == (8, 4, module.out_features)  # (N, r + 1, e)
        assert torch.equal(folded[:, :3], adapter.up) and torch.equal(folded[:, 3], adapter.bias)
        assert folded.is_contiguous()


def test_separate_stacks_are_not_taken_for_a_folded_one():
    up, bias = torch.randn(4, 2, 5), torch.randn(4, 5)
    assert folded_stack(up, bias) is None
    assert folded_stack(up, None) is None
    buf = torch.randn(4, 3, 5)
    assert folded_stack(buf[:, :2], buf[:, 2]) is not None
    assert folded_stack(buf[:, :2], buf[:, 1]) is None  # a row of the stack, but not the one after up
    assert folded_stack(buf[:, :2], buf[:, 2].to(torch.float64)) is None


@pytest.mark.parametrize("how", ["all", "subset", "one", "per_individual", "split_false"])
def test_folded_forward_is_bitwise_the_generic_path(monkeypatch, how):
    es, x = _mlp_es()
    members = es.ask()
    xs = torch.randn(8, 5, 6)
    call = {
        "all": lambda: members(x),
        "subset": lambda: members(x, individuals=range(2, 6)),  # a contiguous range: a slice of the stacks
        "one": lambda: members(x, individual=5),
        "per_individual": lambda: members(xs, per_individual=True),
        "split_false": lambda: members(x, split=False),
    }[how]
    served = _count(monkeypatch)
    folded = call()
    if how != "one":
        assert served and all(served)  # both Linears took the folded path
    _generic(monkeypatch)
    assert torch.equal(folded, call())


def test_losses_and_a_whole_run_are_bitwise_the_generic_path(monkeypatch):
    def run():
        es, x = _mlp_es()
        y = torch.zeros(5, 3)
        for _ in range(3):
            es.step(x, lambda out, t: (out - t).square().mean(), y, max_rows=10)  # chunks of 2 members
        return [p.detach().clone() for p in es.model.parameters()], es.losses(x, lambda o, t: o.square().mean())

    params, losses = run()
    _generic(monkeypatch)
    params_g, losses_g = run()
    assert all(torch.equal(a, b) for a, b in zip(params, params_g)) and torch.equal(losses, losses_g)


def test_folded_forward_equals_the_materialised_weights():
    es, x = _mlp_es()
    out = es.ask()(x)
    for member in (0, 3, 7):
        with torch.no_grad():
            ref = torch.func.functional_call(es.model, es.individual_params(member), (x,))
        torch.testing.assert_close(out[member], ref, rtol=1e-5, atol=1e-5)


def test_bias_only_evolution_folds_a_rank_zero_up(monkeypatch):
    es, x = _mlp_es(param_filter=lambda name: name.endswith("bias"))
    adapter = es.ask()._target.adapters[0]
    assert adapter.up.shape[1] == 0 and folded_stack(adapter.up, adapter.bias).shape == (8, 1, 16)
    out = es.ask()(x)
    base = es.model[2](es.model[1](es.model[0](x)))
    assert not torch.allclose(out[0], base)  # the bias noise is in
    _generic(monkeypatch)
    assert torch.equal(out, es.ask()(x))


def test_layouts_it_does_not_serve_take_the_generic_path(monkeypatch):
    # frozen biases: no bias noise, nothing folded
    es, x = _mlp_es(perturb_vectors=False)
    assert all(a.bias is None for a in es.ask()._target.adapters)
    served = _count(monkeypatch)
    es.ask()(x)
    assert served == [False, False]
    # shuffled ids (a gather per group), a subclass of nn.Linear, an Embedding
    es, x = _mlp_es()
    served.clear()
    es.ask()(x, individuals=[5, 1, 1, 7])
    assert served == [False, False]

    class MyLinear(nn.Linear):
        pass

    torch.manual_seed(0)
    model = nn.Sequential(MyLinear(6, 4), nn.Tanh(), nn.Linear(4, 3))
    es = EggrollES(model, 4, 0.3, 0.1, 2)
    served.clear()
    es.ask()(x)
    assert served == [False, True]
    torch.manual_seed(0)
    es = EggrollES(TinyTransformer(), 4, 0.3, 0.1, 2, param_filter=lambda n: "ln" not in n and n != "pos")
    served.clear()
    out = es.ask()(torch.randint(0, 11, (3, 8)))
    assert out.shape[0] == 4 and True in served and False in served  # the Embedding is not a Linear


def test_folded_apply_refuses_what_it_cannot_add():
    linear = nn.Linear(3, 2)
    buf = torch.randn(4, 2, 2)
    adapter = (torch.randn(4, 1, 3), buf[:, :1], buf[:, 1])
    x, out = torch.randn(8, 3), torch.randn(8, 2)
    assert folded_apply(linear, x, out, Route(n=8, groups=4, chunk=2, dest=torch.arange(8)), adapter) is None
    assert folded_apply(linear, x, out, Route(n=6, groups=3, chunk=2), adapter) is None  # rows do not fit
    assert folded_apply(linear, x.double(), out.double(), Route(n=8, groups=4, chunk=2), adapter) is None
    before = out.clone()
    done = folded_apply(linear, x, out, Route(n=8, groups=4, chunk=2), adapter)
    assert done is out
    delta = torch.einsum("kcd,krd->kcr", x.view(4, 2, 3), adapter[0]) @ buf[:, :1] + buf[:, 1:]
    torch.testing.assert_close(out, before + delta.reshape(8, 2))
    ids = torch.tensor([3, 0])  # gathered groups
    out2, x2 = torch.randn(4, 2), x[:4]
    expect = out2 + (
        torch.einsum("kcd,krd->kcr", x2.view(2, 2, 3), adapter[0][ids]) @ buf[ids, :1] + buf[ids, 1:]
    ).reshape(4, 2)
    assert folded_apply(linear, x2, out2, Route(n=4, groups=2, chunk=2, index=ids), adapter) is out2
    torch.testing.assert_close(out2, expect)
