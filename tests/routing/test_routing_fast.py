"""The fast paths of a routed forward give what the general ones give.

- the kernel forms of the per-group product (``delta.down_product`` / ``add_product`` / ``product``): a
  broadcast multiply below ATen's unblocked-loop size, ``x @ down.T`` for a few rows per group,
  ``down @ x.T`` above; each equals the float64 product, forward and backward;
- the single-tensor branch of the front end (``run_route``'s first branch, taken by ``pop(x, all_individuals=True)`` and
  ``pop(x, individuals=ids)``) returns bitwise what the general front end returns for the same call,
  and refuses bad ids with the same errors before anything runs.
"""

import numpy as np
import pytest
import torch
from torch import nn

from populora import Population
from populora.errors import InvalidIndexError, InvalidTypeError, RouteError
from populora.routing import delta, front, plan
from populora.routing.request import parse_route

# (k groups, t rows per group, d, r, e): every form of both products
SHAPES = [
    (16, 1, 4, 1, 16),  # tiny in all: bmm's own loop for down, addcmul for a rank-1 up
    (256, 1, 64, 1, 64),  # down below the unblocked size per group, large in all: broadcast multiply
    (64, 1, 16, 4, 64),  # up below the size per group, large in all, r > 1: multiply and sum
    (8, 1, 8, 2, 12),  # small in all: bmm for both
    (16, 1, 256, 1, 256),  # down above the size (a few rows: x @ down.T), rank-1 up: addcmul
    (4, 3, 64, 4, 64),  # a few rows, both blocked
    (4, 9, 32, 3, 40),  # more rows: down @ x.T
]


@pytest.mark.parametrize("k, t, d, r, e", SHAPES)
def test_every_product_form_equals_the_float64_product(k, t, d, r, e):
    gen = torch.Generator().manual_seed(k * 1000 + t * 100 + r)
    x = torch.randn(k * t, d, generator=gen, requires_grad=True)
    down = torch.randn(k, r, d, generator=gen, requires_grad=True)
    up = torch.randn(k, r, e, generator=gen, requires_grad=True)
    base = torch.randn(k * t, e, generator=gen)
    want = base.double() + (x.double().view(k, t, d) @ down.double().transpose(1, 2) @ up.double()).view(k * t, e)

    h = delta.down_product(down, x, k)
    assert h.shape == (k, t, r)
    out = base.clone().requires_grad_(False) + 0 * x.sum()  # a non-leaf, as a Linear's output is
    got = delta.add_product(out.view(k, t, e), h, up).view(k * t, e)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        delta.product(h, up).reshape(k * t, e).double(), want - base.double(), rtol=1e-5, atol=1e-4
    )
    weights = torch.randn(k * t, e, generator=gen)
    (got * weights).sum().backward()
    xd, dd, ud = (v.detach().double().requires_grad_() for v in (x, down, up))
    ref = (xd.view(k, t, d) @ dd.transpose(1, 2) @ ud).view(k * t, e)
    (ref * weights.double()).sum().backward()
    for mine, theirs in ((x, xd), (down, dd), (up, ud)):
        torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=1e-5, atol=1e-4)


def test_the_forms_are_chosen_by_size():
    """A product ATen would loop over unblocked runs as a broadcast multiply when it is large in all."""
    calls = []
    real = torch.bmm

    def spy(*args, **kwargs):
        calls.append(tuple(a.shape for a in args))
        return real(*args, **kwargs)

    torch.bmm = spy
    try:
        x, down, up = torch.randn(256, 64), torch.randn(256, 1, 64), torch.randn(256, 1, 64)
        delta.add_product(torch.zeros(256, 1, 64), delta.down_product(down, x, 256), up)  # 16384 each: no bmm
        assert calls == []
        delta.down_product(torch.randn(16, 4, 4), torch.randn(16, 4), 16)  # 256 in all: bmm's loop is cheaper
        delta.down_product(torch.randn(4, 8, 64), torch.randn(4 * 2, 64), 4)  # 2 rows per group: x @ down.T
        delta.down_product(torch.randn(4, 8, 64), torch.randn(4 * 8, 64), 4)  # 8 rows: down @ x.T
    finally:
        torch.bmm = real
    assert calls == [((16, 1, 4), (16, 4, 4)), ((4, 2, 64), (4, 64, 8)), ((4, 8, 64), (4, 64, 8))]


def population(P=6, d=8, seed=0, **kw):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(d, 16), nn.GELU(), nn.Linear(16, 3))
    return Population(model, pop_size=P, low_rank=2, init_scale=0.5, seed=seed, **kw)


def general(pop, x, **routing):
    """The general branch of the front end, which the single-tensor branch must match."""
    return front._run_general(pop._routing_target(), parse_route(pop.pop_size, **routing), (x,), {})


@pytest.mark.parametrize("grad", [False, True])
def test_single_tensor_calls_equal_the_general_front_end_bitwise(grad):
    pop = population()
    x = torch.randn(12, 8)
    ids_np = np.array([5, 0, 3, 3, 1, 2, 0, 4, 5, 1, 2, 4])
    with torch.set_grad_enabled(grad):
        for _ in range(2):  # the second call reuses the cached plan of the ids
            assert torch.equal(pop(x, all_individuals=True), general(pop, x, all_individuals=True))
            assert torch.equal(pop(x, individuals=ids_np), general(pop, x, individuals=ids_np))
            ids_t = torch.from_numpy(ids_np)
            assert torch.equal(pop(x, individuals=ids_t), general(pop, x, individuals=ids_t))
            assert torch.equal(pop(x, individual=3), general(pop, x, individual=3))
            assert torch.equal(pop(x, individual=np.int64(3)), general(pop, x, individual=3))  # (general path)
            assert torch.equal(
                pop(x[:6], individuals=np.sort(ids_np[:6])), general(pop, x[:6], individuals=np.sort(ids_np[:6]))
            )
    # the rows really are routed: row j of the fast call is individual ids[j]'s output
    for j, i in enumerate(ids_np):
        torch.testing.assert_close(
            pop(x, individuals=ids_np)[j], pop(x[j : j + 1], individual=int(i))[0], rtol=1e-5, atol=1e-6
        )


def test_single_tensor_calls_after_the_adapters_change():
    pop = population()
    x = torch.randn(6, 8)
    before = pop(x, all_individuals=True).clone()
    with torch.no_grad():
        pop.factors()[0].up.add_(1.0)  # in place: the cached plan must not cache values
    after = pop(x, all_individuals=True)
    assert not torch.equal(before, after)
    assert torch.equal(after, general(pop, x, all_individuals=True))


def test_single_tensor_calls_refuse_bad_ids_as_the_general_path_does():
    pop = population()
    x = torch.randn(4, 8)
    with pytest.raises(InvalidIndexError, match="individual"):
        pop(x, individual=6)
    with pytest.raises(InvalidIndexError, match="individual"):
        pop(x, individual=-1)
    with pytest.raises(InvalidIndexError, match="id 6, out of range"):
        pop(x, individuals=np.array([0, 1, 6, 2]))
    with pytest.raises(InvalidIndexError, match="id -1, out of range"):
        pop(x, individuals=torch.tensor([0, -1, 2, 3]))
    with pytest.raises(InvalidTypeError, match="integer ids"):
        pop(x, individuals=torch.tensor([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(RouteError, match="cannot be split among pop_size=6"):
        pop(x, all_individuals=True)
    with pytest.raises(RouteError, match="does not fit 3 individual ids"):
        pop(x, individuals=np.array([0, 1, 2]))


def test_other_calls_still_take_the_general_path():
    pop = population()
    x = torch.randn(1, 8)
    # a 1-row batch is seen by every individual (broadcast), split and an (m, b) input keep their layouts
    assert pop(x, all_individuals=True).shape == (6, 3)
    assert pop(torch.randn(12, 8), all_individuals=True, split=True).shape == (6, 2, 3)
    torch.testing.assert_close(pop(x, all_individuals=True)[2], pop(x, individual=2)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keep_order", [False, True])
def test_one_row_per_group_equals_the_padded_layout(monkeypatch, keep_order):
    """Unequal groups of a few rows per id route one row per group (no permutation, no packing) on CPU."""
    ids = np.array([3, 0, 0, 4, 3, 3, 1, 0, 3, 5, 5])  # 11 rows, 5 ids: 2.2 rows per id, unequal
    route, perm = plan.Planner().plan(ids, 6, torch.device("cpu"), keep_order=keep_order)
    assert perm is None and route.dest is None and route.order is None
    assert (route.groups, route.chunk) == (11, 1) and route.index.tolist() == ids.tolist()
    many = np.repeat(ids, 3)  # 6.6 rows per id: the padded layout
    assert plan.Planner().plan(many, 6, torch.device("cpu"))[0].dest is not None

    def run(per_row):
        monkeypatch.setattr(plan.PLANNER, "per_row", per_row)
        pop = population(requires_grad=True)
        x = torch.randn(11, 8, generator=torch.Generator().manual_seed(0))
        out = pop(x, individuals=ids)
        grads = torch.autograd.grad(out.square().sum(), [p for p in pop.parameters() if p.requires_grad])
        return out.detach(), grads

    (out, grads), (padded, padded_grads) = run(4), run(0)
    torch.testing.assert_close(out, padded, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, padded_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
