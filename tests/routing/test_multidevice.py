"""Routing across devices: a model spread by ``device_map`` has targets on several devices.

Each target reads the route's index tensors on its own output's device
(``route_on``, one copy per device and route), and outputs unsorted
on whatever device they come out on. CPU-only machines fake the second
device with ``meta`` (shapes only, no values): the layers there run, every
cross-device index op would raise.
"""

import numpy as np
import pytest
import torch
from models import routed_call
from torch import nn

from populora.adapters import Adapter
from populora.routing.plan import PLANNER
from populora.routing.route import Route, route_on
from populora.routing.router import Router

CPU, META = torch.device("cpu"), torch.device("meta")


@pytest.fixture(autouse=True)
def padded(monkeypatch):
    """The padded (k c) layout (index, dest, ids, offs tensors) unless a test asks for one row per group."""
    monkeypatch.setattr(PLANNER, "per_row", 0)


IDS = [3, 0, 0, 4, 3, 3, 1, 0, 3]  # unequal groups (padded chunks: index, dest, ids, offs tensors)


def test_route_on_moves_every_index_tensor_once():
    route, _ = PLANNER.plan(np.array(sorted(IDS)), 5, CPU)
    assert route.dest is not None and route.offs is not None
    moved = route_on(route, META)
    for name in ("index", "dest", "ids", "offs"):
        assert getattr(moved, name).device == META and getattr(route, name).device == CPU
        assert getattr(moved, name).shape == getattr(route, name).shape
    assert (moved.n, moved.groups, moved.chunk) == (route.n, route.groups, route.chunk)
    assert route_on(route, CPU) is route  # already there: the same object, nothing copied
    one = Route(n=4, groups=1, chunk=4, index=slice(2, 3))
    assert route_on(one, META) is one  # a slice index has no device


def test_router_keeps_one_copy_per_device_and_route():
    router = Router({"a": nn.Linear(2, 2)})
    route, _ = PLANNER.plan(np.array(sorted(IDS)), 5, CPU)
    first = router._local(route, META)
    assert first.index.device == META
    assert router._local(route, META) is first  # cached: moved once per forward, not per target
    other, _ = PLANNER.plan(np.array([0, 0, 1]), 5, CPU)
    assert router._local(other, META) is not first and router._local(other, META).index.device == META


class Spread(nn.Module):
    """Two Linears, the second on ``meta``; the activation moves between them (as accelerate's hooks do)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4, device=META)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)).to(META))


def spread_adapters(P=5, r=2):
    gen = torch.Generator().manual_seed(1)
    a = Adapter(torch.randn(P, r, 8, generator=gen), torch.randn(P, r, 16, generator=gen))
    b = Adapter(torch.empty(P, r, 16, device=META), torch.empty(P, r, 4, device=META))
    return a, b


def route_spread(ids) -> Router:
    """Route 9 rows through :class:`Spread` by ``ids``; check the meta output's shape and the cpu target's
    values (row ``j`` through individual ``ids[j]``: its output must be in input order). Returns the router."""
    model = Spread()
    router = Router({"a": model.a, "b": model.b})
    adapters = spread_adapters()
    seen = []
    model.a.register_forward_hook(lambda m, args, out: seen.append(out))
    x = torch.randn(9, 8)
    out = routed_call(model, router, adapters, 5, (x,), {}, individuals=ids)
    assert out.device == META and out.shape == (9, 4)
    down, up, _ = adapters[0]
    expected = torch.stack([model.a(x[j]) + (down[i] @ x[j]) @ up[i] for j, i in enumerate(ids)])
    torch.testing.assert_close(seen[0], expected, rtol=1e-5, atol=1e-5)
    return router


def test_routing_across_devices_values_on_the_first_device():
    router = route_spread(sorted(IDS))  # sorted: the rows are not permuted, so `a`'s output is in input order
    assert set(router._moved) == {META}  # the cpu target used the route as planned, the meta one a copy


def test_routing_across_devices_every_layout():
    model = Spread()
    router = Router({"a": model.a, "b": model.b})
    adapters = spread_adapters()
    x = torch.randn(9, 8)
    for routing_kw, n_rows in [
        (dict(individuals=IDS), 9),
        (dict(individuals=[4, 1, 2]), 9),
        (dict(individuals=torch.tensor(IDS)), 9),
        (dict(all_individuals=True, broadcast=True), 45),
        (dict(individual=2), 9),
        (dict(individuals=[1, 3], broadcast=True), 18),
    ]:
        out = routed_call(model, router, adapters, 5, (x,), {}, **routing_kw)
        assert out.device == META and out.shape == (n_rows, 4), routing_kw
    # rows kept in input order (a KV cache in play): packed through `order` on each device
    route, _ = PLANNER.plan(np.array(IDS), 5, CPU, keep_order=True)
    assert route.order is not None
    out = router.run(route, adapters, model, (x,))
    assert out.device == META and out.shape == (9, 4)


def test_one_row_per_group_across_devices(monkeypatch):
    """A few rows per id on CPU: each row its own group; the meta target reads the index on its device."""
    monkeypatch.setattr(PLANNER, "per_row", 4)
    route, perm = PLANNER.plan(np.array(IDS), 5, CPU)
    assert perm is None and route.dest is None and (route.groups, route.chunk) == (9, 1)
    assert route.index.tolist() == IDS
    router = route_spread(IDS)  # one row per group: no permutation, `a`'s output is in input order
    assert router._moved[META][1].index.device == META
