"""The first ES layer of a shared batch: one base product over the user's rows instead of one per member."""

from __future__ import annotations

import pytest
import torch
from models import mlp
from torch import nn

import populora.es.members as members_module
from populora import EggrollES
from populora.es.shared import shared_rows_linear


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _count(monkeypatch) -> list[bool]:
    served: list[bool] = []

    def counting(*args, **kwargs):
        result = shared_rows_linear(*args, **kwargs)
        served.append(result is not None)
        return result

    monkeypatch.setattr(members_module, "shared_rows_linear", counting)
    return served


def _es(model=None, pop: int = 8, **kwargs) -> EggrollES:
    torch.manual_seed(0)
    return EggrollES(mlp() if model is None else model, pop, 0.3, 0.1, 3, seed=2, **kwargs)


def _both(es: EggrollES, call):
    es.router.share_rows = True
    shared = call()
    es.router.share_rows = False
    plain = call()
    es.router.share_rows = True
    return shared, plain


@pytest.mark.parametrize("how", ["all", "range", "ids", "one_row", "perturb_vectors_off", "bias_free"])
def test_shared_first_layer_equals_the_per_individual_forward(monkeypatch, how):
    kwargs = {"perturb_vectors": False} if how == "perturb_vectors_off" else {}
    model = mlp()
    if how == "bias_free":
        model = nn.Sequential(nn.Linear(6, 16, bias=False), nn.GELU(), nn.Linear(16, 3))
    es = _es(model, **kwargs)
    x = torch.randn(1 if how == "one_row" else 5, 6)
    members = es.ask()
    ids = {"range": range(2, 7), "ids": [6, 1, 3]}.get(how)
    served = _count(monkeypatch)
    shared, plain = _both(es, lambda: members(x, individuals=ids))
    assert served[0] is True and len(served) == 1  # the first target only, tried once per forward
    close(shared, plain)
    for j, member in enumerate(range(8) if ids is None else ids):
        with torch.no_grad():
            close(shared[j], torch.func.functional_call(es.model, es.individual_params(member), (x,)))


def test_rows_that_differ_before_the_first_layer_take_the_ordinary_path(monkeypatch):
    class RowDependent(nn.Module):  # a shared batch whose rows are made to differ by position in the batch
        def __init__(self):
            super().__init__()
            self.body = mlp()

        def forward(self, x):
            return self.body(x + torch.arange(x.shape[0], dtype=x.dtype)[:, None])

    es = _es(RowDependent())
    x = torch.randn(5, 6)
    served = _count(monkeypatch)
    shared, plain = _both(es, lambda: es.ask()(x))
    assert served == [False]  # the check saw differing copies
    assert torch.equal(shared, plain)


def test_per_individual_rows_and_a_single_member_are_not_shared(monkeypatch):
    es = _es()
    served = _count(monkeypatch)
    es.ask()(torch.randn(8, 5, 6), per_individual=True)
    es.ask()(torch.randn(5, 6), individual=3)
    assert served == []  # nothing repeated: not even tried


def test_steps_are_deterministic_and_close_to_the_per_individual_forward():
    def run(share: bool):
        es = _es()
        es.router.share_rows = share
        x, y = torch.randn(5, 6, generator=torch.Generator().manual_seed(1)), torch.zeros(5, 3)
        for _ in range(3):
            es.step(x, lambda out, t: (out - t).square().mean(), y, max_rows=15)  # chunks of 3 members
        return [p.detach().clone() for p in es.model.parameters()]

    first, again, plain = run(True), run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    for a, b in zip(first, plain):
        close(a, b, tol=1e-4)


def test_a_linear_subclass_or_a_wrapped_forward_is_left_alone(monkeypatch):
    class MyLinear(nn.Linear):
        pass

    es = _es(nn.Sequential(MyLinear(6, 16), nn.GELU(), nn.Linear(16, 3)))
    x = torch.randn(5, 6)
    served = _count(monkeypatch)
    shared, plain = _both(es, lambda: es.ask()(x))
    assert served == [False] and torch.equal(shared, plain)
