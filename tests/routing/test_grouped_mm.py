"""Unequal groups through torch.nn.functional.grouped_mm (``PLANNER.grouped_mm``) equal the padded path.

``grouped_mm`` has a fused kernel on sm90 / sm100 with bfloat16; it runs on
CPU too, so forcing it (``PLANNER.grouped_mm = True``) checks both paths agree here.
"""

import pytest
import torch
from models import TinyTransformer
from torch import nn

import populora.routing.delta as delta
from populora import Population
from populora.routing.plan import PLANNER


@pytest.fixture(autouse=True)
def padded(monkeypatch):
    """The padded (k c) layout on CPU (not one row per group): the layout grouped_mm replaces."""
    monkeypatch.setattr(PLANNER, "per_row", 0)


@pytest.fixture
def calls(monkeypatch):
    """Counts the targets whose delta ran on grouped_mm."""
    seen = []
    inner = delta.grouped_delta
    monkeypatch.setattr(delta, "grouped_delta", lambda *a: seen.append(1) or inner(*a))
    return seen


def both_paths(monkeypatch, fn):
    monkeypatch.setattr(PLANNER, "grouped_mm", False)
    padded = fn()
    monkeypatch.setattr(PLANNER, "grouped_mm", True)
    return padded, fn()


def population(d=8, h=16, e=4, P=5, r=4, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d, h), nn.GELU(), nn.Linear(h, e))
    return Population(model, pop_size=P, low_rank=r, init_scale=0.5, seed=3, **kw)


UNEQUAL = torch.tensor([3, 0, 0, 4, 3, 3, 1, 0, 3])  # groups of 3, 1, 4, 1 rows; id 2 absent


@pytest.mark.parametrize("ids", [UNEQUAL, torch.tensor([4, 0, 2, 2, 1, 3, 2, 0, 4])], ids=["subset", "every_id"])
def test_grouped_mm_equals_the_padded_path(monkeypatch, calls, ids):
    pop = population()
    x = torch.randn(9, 8)
    padded, grouped = both_paths(monkeypatch, lambda: pop(x, individuals=ids))
    assert len(calls) == 2  # both targets ran on grouped_mm, and only when forced
    torch.testing.assert_close(grouped, padded, rtol=1e-5, atol=1e-6)
    one = torch.stack([pop(x[j : j + 1], individual=int(i))[0] for j, i in enumerate(ids)])
    torch.testing.assert_close(grouped, one, rtol=1e-5, atol=1e-6)


def test_grouped_mm_rows_in_input_order_with_a_cache(monkeypatch, calls):
    """A route that keeps the rows in input order (KV cache in play) gathers and scatters through `order`."""

    class CacheModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x, use_cache=None):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    pop = Population(CacheModel(), pop_size=5, low_rank=4, init_scale=0.5, seed=3)
    x = torch.randn(9, 8)
    padded, grouped = both_paths(monkeypatch, lambda: pop(x, individuals=UNEQUAL, use_cache=True))
    assert len(calls) == 2
    torch.testing.assert_close(grouped, padded, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grouped, pop(x, individuals=UNEQUAL), rtol=1e-5, atol=1e-6)


def test_grouped_mm_with_tokens_per_row(monkeypatch, calls):
    """(n, t, d) inputs: each row's t tokens belong to its id (offsets scaled by t)."""
    torch.manual_seed(0)
    model = TinyTransformer(vocab=12, dim=16, heads=2, depth=1, seq=8)
    pop = Population(model, pop_size=5, low_rank=4, init_scale=0.5, seed=3, lora_targets=["blocks.*.attn.*", "head"])
    tokens = torch.randint(0, 12, (9, 6), generator=torch.Generator().manual_seed(0))
    padded, grouped = both_paths(monkeypatch, lambda: pop(tokens, individuals=UNEQUAL))
    assert len(calls) == 5  # q k v o and the head (vocab 12: 16-byte aligned in float32)
    torch.testing.assert_close(grouped, padded, rtol=1e-5, atol=1e-5)


def test_grouped_mm_gradients_equal_the_padded_path(monkeypatch, calls):
    pop = population(requires_grad=True)
    x = torch.randn(9, 8, requires_grad=True)

    def grads():
        out = pop(x, individuals=UNEQUAL)
        return torch.autograd.grad(out.square().sum(), [x, *pop._downs, *pop._ups])

    padded, grouped = both_paths(monkeypatch, grads)
    assert len(calls) == 2
    for a, b in zip(grouped, padded):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert a.abs().sum() > 0


def test_grouped_mm_is_skipped_where_it_cannot_run(monkeypatch, calls):
    x6 = torch.randn(9, 6)
    monkeypatch.setattr(PLANNER, "grouped_mm", True)
    pop = population(d=6, h=16, e=4)  # 6 float32 features: rows of 24 bytes, not 16-byte aligned
    out = pop(x6, individuals=UNEQUAL)
    assert len(calls) == 1  # only the second target (16 -> 4) is aligned
    monkeypatch.setattr(PLANNER, "grouped_mm", False)
    torch.testing.assert_close(out, pop(x6, individuals=UNEQUAL), rtol=1e-5, atol=1e-6)
    calls.clear()
    pop = population(r=3)  # rank 3: h is (n, 3), 12-byte rows
    monkeypatch.setattr(PLANNER, "grouped_mm", True)
    pop(torch.randn(9, 8), individuals=UNEQUAL)
    assert calls == []
    pop = population()
    pop(torch.randn(10, 8), individuals=[0, 1, 2, 3, 4] * 2)  # equal groups: the batched (k c) path
    pop(torch.randn(9, 8), all_individuals=True, broadcast=True)
    assert calls == []


def test_grouped_mm_default_is_off_on_cpu(monkeypatch, calls):
    assert PLANNER.grouped_mm is None
    pop = population()
    pop(torch.randn(9, 8), individuals=UNEQUAL)
    assert calls == []  # auto: only on CUDA sm90 / sm100 with bfloat16
    x = torch.randn(4, 8)
    assert not delta.grouped_ok(x, torch.randn(4, 16), pop.adapters()[0], None)
    monkeypatch.setattr(PLANNER, "grouped_mm", True)
    assert delta.grouped_ok(x, torch.randn(4, 16), pop.adapters()[0], True)
    assert not delta.grouped_ok(x.double(), torch.randn(4, 16).double(), pop.adapters()[0], True)  # dtype mismatch


def test_route_carries_group_offsets():
    import numpy as np

    route, perm = PLANNER.plan(UNEQUAL.numpy(), 5, torch.device("cpu"))
    assert route.ids.tolist() == [0, 1, 3, 4] and route.offs.dtype == torch.int32
    assert route.offs.tolist() == [3, 4, 8, 9]  # ends of each id's rows, sorted
    assert torch.equal(UNEQUAL[perm], torch.tensor(np.sort(UNEQUAL.numpy())))
    equal, _ = PLANNER.plan(np.array([0, 0, 1, 1]), 2, torch.device("cpu"))
    assert equal.offs is None and equal.ids is None  # equal groups need no offsets
