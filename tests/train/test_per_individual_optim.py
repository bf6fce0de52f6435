"""Optimizers per individual: ClipUp(per_individual=True) against P separate ClipUps, and LRMultipliers against
P separate optimizers with their own learning rates."""

from __future__ import annotations

import copy

import pytest
import torch
from models import mlp
from torch import nn

from populora import Population
from populora.errors import CheckpointError, InvalidIndexError, InvalidTypeError, InvalidValueError
from populora.optim import ClipUp
from populora.train import LRMultipliers

P = 4


def stacked(seed: int = 0) -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [
        nn.Parameter(torch.randn(P, 3, 2, generator=g, dtype=torch.float64)),
        nn.Parameter(torch.randn(P, 5, generator=g, dtype=torch.float64)),
    ]


def gradients(steps: int, seed: int = 1) -> list[list[torch.Tensor]]:
    """Per step, a gradient per stacked parameter; individual 3's rows are 1000x larger, individual 2's are zero
    at step 1."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for step in range(steps):
        grads = [
            torch.randn(P, 3, 2, generator=g, dtype=torch.float64),
            torch.randn(P, 5, generator=g, dtype=torch.float64),
        ]
        for t in grads:
            t[3] *= 1000.0
            if step == 1:
                t[2] = 0.0
        out.append(grads)
    return out


def separate(params: list[nn.Parameter], make, steps: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Individual i alone: its rows as parameters of its own optimizer; the stacks rebuilt from them."""
    rows = [[nn.Parameter(p.detach()[i].clone()) for p in params] for i in range(P)]
    opts = [make(r, i) for i, r in enumerate(rows)]
    for grads in steps:
        for i in range(P):
            for q, g in zip(rows[i], grads):
                q.grad = g[i].clone()
            opts[i].step()
    return [torch.stack([rows[i][k].detach() for i in range(P)]) for k in range(len(params))]


def batched(params: list[nn.Parameter], opt: torch.optim.Optimizer, steps, lr: LRMultipliers | None = None):
    for grads in steps:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        if lr is None:
            opt.step()
        else:
            lr.step(opt, params)
    return [p.detach() for p in params]


# ---------------------------------------------------------------------------------------------- ClipUp


def test_clipup_per_individual_equals_p_separate_clipups():
    params, steps = stacked(), gradients(4)
    options = dict(lr=0.3, momentum=0.8, max_speed=0.45)  # the speed clip triggers from the second step
    want = separate(params, lambda r, i: ClipUp(r, **options), steps)
    opt = ClipUp(params, per_individual=True, **options)
    got = batched(params, opt, steps)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    speeds = torch.cat([opt.state[p]["velocity"].flatten(1) for p in params], 1).norm(dim=1)
    assert any(abs(float(s) - 0.45) < 1e-12 for s in speeds) and any(float(s) < 0.44 for s in speeds)


def test_clipup_default_couples_the_individuals():
    """One norm over the whole stack: individual 3's large gradient shrinks everyone else's step."""
    params, steps = stacked(), gradients(1)
    start = [p.detach().clone() for p in params]
    got = batched(params, ClipUp(params, lr=0.3, max_speed=10.0), steps)
    want = separate(stacked(), lambda r, i: ClipUp(r, lr=0.3, max_speed=10.0), steps)
    moved = [float(torch.cat([(a - s)[0].flatten() for a, s in zip(got, start)]).norm()) for got in (got, want)]
    assert moved[0] < 1e-3 * moved[1] and moved[1] == pytest.approx(0.3)


def test_clipup_per_individual_refuses_unstacked_groups_and_non_finite_rows_before_moving():
    a, b = nn.Parameter(torch.zeros(P, 2)), nn.Parameter(torch.zeros(P + 1, 2))
    opt = ClipUp([a, b], lr=0.1, per_individual=True)
    a.grad, b.grad = torch.ones(P, 2), torch.ones(P + 1, 2)
    with pytest.raises(InvalidValueError, match="stacked over the same individuals"):
        opt.step()
    params = stacked()
    opt = ClipUp(params, lr=0.1, per_individual=True)
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    params[1].grad[2, 0] = float("nan")
    with pytest.raises(InvalidValueError, match=r"of individuals \[2\]"):
        opt.step()
    assert all(torch.equal(p.detach(), q) for p, q in zip(params, before)) and not opt.state
    with pytest.raises(InvalidTypeError, match="`per_individual` must be a bool"):
        ClipUp(params, lr=0.1, per_individual=1)


def test_clipup_per_individual_velocity_rows_follow_evolution_and_resume():
    torch.manual_seed(0)
    pop = Population(mlp(6, 8, 3), pop_size=P, low_rank=2, seed=0, init_scale=0.5, requires_grad=True)
    opt = ClipUp(pop.adapter_parameters(), lr=0.05, per_individual=True)
    pop(torch.randn(8, 6), all_individuals=True).square().sum().backward()
    opt.step()
    before = [opt.state[p]["velocity"].clone() for p in pop.adapter_parameters()]
    result = pop.evolve_(torch.arange(4.0), optimizer=opt, survive_frac=0.5, elite_frac=0.25)
    culled = result.selected_out_indices
    for p, old in zip(pop.adapter_parameters(), before):
        kept = result.selected_in_indices
        assert torch.equal(opt.state[p]["velocity"][kept], old[kept])
        assert not torch.equal(opt.state[p]["velocity"][culled], old[culled]) or not old[culled].any()
    twin = ClipUp(pop.adapter_parameters(), lr=0.05)
    twin.load_state_dict(opt.state_dict())
    assert twin.param_groups[0]["per_individual"] is True


# ---------------------------------------------------------------------------------------------- multipliers


@pytest.mark.parametrize(
    "make",
    [
        lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9),
        lambda ps, lr: torch.optim.Adam(ps, lr=lr),
        lambda ps, lr: torch.optim.AdamW(ps, lr=lr, weight_decay=0.5),
        lambda ps, lr: torch.optim.RMSprop(ps, lr=lr),
        lambda ps, lr: torch.optim.Adagrad(ps, lr=lr),
    ],
    ids=["sgd_momentum", "adam", "adamw", "rmsprop", "adagrad"],
)
def test_multipliers_equal_separate_optimizers_with_their_own_learning_rates(make):
    values = [1.0, 0.5, 2.0, 0.1]
    params, steps = stacked(), gradients(3)
    want = separate(params, lambda r, i: make(r, 0.01 * values[i]), steps)
    got = batched(params, make(params, 0.01), steps, LRMultipliers(P, values=values))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_multiplier_of_one_keeps_the_optimizers_bits():
    params, plain, steps = stacked(), stacked(), gradients(2)
    got = batched(params, torch.optim.Adam(params, lr=0.01), steps, LRMultipliers(P, values=[1.0, 1.0, 3.0, 1.0]))
    want = batched(plain, torch.optim.Adam(plain, lr=0.01), steps)
    for a, b in zip(got, want):
        assert torch.equal(a[[0, 1, 3]], b[[0, 1, 3]]) and not torch.equal(a[2], b[2])


def test_inherit_perturb_and_resume():
    lr = LRMultipliers(P, values=[1.0, 2.0, 4.0, 8.0], factors=(0.5, 2.0), bounds=(0.1, 10.0), seed=3)
    lr.inherit_([0, 1], [3, 2])
    assert lr.values.tolist() == [8.0, 4.0, 4.0, 8.0]
    state = copy.deepcopy(lr.state_dict())
    drawn = lr.perturb_([0, 1, 3])
    assert set(drawn.tolist()) <= {0.5, 2.0}
    assert lr.values.tolist() == [
        min(8.0 * float(drawn[0]), 10.0),
        4.0 * float(drawn[1]),
        4.0,
        min(8 * float(drawn[2]), 10),
    ]
    twin = LRMultipliers(P, factors=(0.5, 2.0), bounds=(0.1, 10.0), seed=99)
    twin.load_state_dict(state)
    assert torch.equal(twin.perturb_([0, 1, 3]), drawn) and torch.equal(twin.values, lr.values)
    with pytest.raises(CheckpointError, match="pop_size"):
        LRMultipliers(P + 1).load_state_dict(state)
    with pytest.raises(InvalidIndexError):
        lr.inherit_([4], [0])
    with pytest.raises(InvalidValueError, match="finite and > 0"):
        LRMultipliers(P, values=[1.0, 0.0, 1.0, 1.0])
    with pytest.raises(InvalidValueError, match="first dimension must be the 4 individuals"):
        lr.step(torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1), [nn.Parameter(torch.zeros(3))])
