"""Zero weights and zero adapters still evolve; `epsilon` is the relative change of a layer's output.

Issue 9, item 3. A target whose weight is zero (a zero-initialised policy head)
used to get `down = up = 0` for every individual and a mutation floor of 0, so
the population was identical forever. Now every target has a reference weight
RMS `w = max(rms(W), 1/sqrt(d))` (`Population.weight_scales`), and the additive
mutations move each mutated layer's output by `epsilon` relative to
`max(rms(W x), rms(x))` for unit-variance isotropic `x`, from a zero adapter
(`init_scale=0`) as from a trained one. The environment version of the
zero-last-layer test is tests/test_zero_init_env.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from populora import Population

ADDITIVE = ["full_gaussian", "layer_selective_gaussian", "neftune_style"]
P, N = 64, 2048


def one_layer(weight_std: float, d: int = 64, e: int = 32) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    layer = nn.Linear(d, e, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(e, d, generator=g) * weight_std)
    return nn.Sequential(layer)


def outputs(pop: Population, x: torch.Tensor) -> torch.Tensor:
    """``(P, n, e)``: every individual's output on the same rows ``x (n, d)``."""
    with torch.no_grad():
        return pop(x, all_individuals=True, broadcast=True).view(pop.pop_size, x.shape[0], -1)


def measured_relative_change(pop: Population, mutation: str, epsilon: float, x: torch.Tensor) -> float:
    """RMS over individuals of ``rms(y' - y) / max(rms(W x), rms(x))`` for one ``mutate_``."""
    with torch.no_grad():
        reference = max(pop.model(x).square().mean().sqrt().item(), x.square().mean().sqrt().item())
    before = outputs(pop, x)
    pop.mutate_(mutation, all_individuals=True, epsilon=epsilon)
    change = (outputs(pop, x) - before).square().mean((1, 2)).sqrt() / reference  # (P,)
    return change.square().mean().sqrt().item()


@pytest.mark.parametrize("mutation", ADDITIVE)
@pytest.mark.parametrize("weight_std", [0.3, 0.0], ids=["trained_weight", "zero_weight"])
@pytest.mark.parametrize("start", ["zero_adapter", "trained_adapter"])
def test_epsilon_is_the_relative_change_of_the_layer_output(mutation, weight_std, start):
    """Measured with x ~ N(0, I): about epsilon, whatever the weight (zero: relative to rms(x)) and adapter."""
    x = torch.randn(N, 64, generator=torch.Generator().manual_seed(1))
    pop = Population(
        one_layer(weight_std), pop_size=P, low_rank=4, seed=0, init_scale=0.0 if start == "zero_adapter" else 0.5
    )
    if start == "trained_adapter":  # adapters grown by selection, far from their initial scale
        for generation in range(5):
            pop.evolve_(outputs(pop, x[:64]).square().mean((1, 2)), epsilon=0.5)
    for epsilon in (0.05, 0.3):
        assert measured_relative_change(pop, mutation, epsilon, x) == pytest.approx(epsilon, rel=0.15)


def test_init_scale_is_the_relative_change_at_initialisation():
    x = torch.randn(N, 64, generator=torch.Generator().manual_seed(1))
    for weight_std, reference in ((0.3, 0.3 * 8), (0.0, 1.0)):  # rms(W x) = 0.3 sqrt(64); zero weight: rms(x)
        pop = Population(one_layer(weight_std), pop_size=P, low_rank=4, seed=0, init_scale=0.2)
        with torch.no_grad():
            base = pop.model(x)
        change = (outputs(pop, x) - base).square().mean().sqrt().item()
        assert change / reference == pytest.approx(0.2, rel=0.15)


def zero_last_layer_policy() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    nn.init.zeros_(model[2].weight)
    nn.init.zeros_(model[2].bias)
    return model


def test_zero_last_layer_gives_distinct_individuals():
    pop = Population(zero_last_layer_policy(), pop_size=16, low_rank=2, seed=0)
    assert pop.weight_scales[1] == pytest.approx(1 / math.sqrt(16))  # the fan-in floor
    y = outputs(pop, torch.randn(32, 4, generator=torch.Generator().manual_seed(0)))[..., 0]  # (P, 32)
    assert (y.std(0) > 1e-3).all()  # individuals differ on every row
    assert torch.unique(y[:, 0]).numel() == 16


def test_mutate_moves_a_zero_last_layer_from_init_scale_zero():
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    for mutation in ADDITIVE:
        pop = Population(zero_last_layer_policy(), pop_size=16, low_rank=2, seed=0, init_scale=0.0)
        assert (outputs(pop, x) == 0).all()  # everyone is the zero policy
        options = {"fraction": 1.0} if mutation == "layer_selective_gaussian" else {}  # else 1 of the 2 targets
        pop.mutate_(mutation, all_individuals=True, **options)
        y = outputs(pop, x)[..., 0]
        assert (y.abs().amax(1) > 1e-3).all() and torch.unique(y[:, 0]).numel() == 16, mutation


@pytest.mark.parametrize("mutation", ["svd_structured", "component_masking"])
def test_svd_mutations_cannot_move_a_zero_adapter(mutation):
    """As documented: they act within the adapter's own singular subspace."""
    pop = Population(zero_last_layer_policy(), pop_size=4, low_rank=2, seed=0, init_scale=0.0)
    pop.mutate_(mutation, all_individuals=True)
    assert all((f.up == 0).all() for f in pop.factors())


# the env of tests/test_zero_init_env.py as a fixed batch: 60 steps of observation [1, t/60, 1, -1],
# reward 1 - |action - 0.5| per step, so the zero policy scores 30
OBS = torch.stack([torch.tensor([1.0, t / 60, 1.0, -1.0]) for t in range(60)])


def fitness(pop: Population) -> torch.Tensor:
    actions = outputs(pop, OBS)[..., 0]  # (P, 60)
    return (1 - (actions - 0.5).abs()).sum(1)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("init_scale", [0.1, 0.0])
def test_evolve_moves_a_zero_last_layer_to_the_target(seed, init_scale):
    """Best fitness >= 48 (0.8 per step) within 10 generations of evolve_ defaults, from the zero policy
    (>= 40 from init_scale=0, where generation 0 is 16 copies of the zero policy)."""
    pop = Population(zero_last_layer_policy(), pop_size=16, low_rank=2, seed=seed, init_scale=init_scale)
    best = []
    for _ in range(10):
        f = fitness(pop)
        best.append(round(f.max().item(), 2))
        pop.evolve_(f)
    if init_scale == 0.0:  # every individual starts as the zero policy: only the children's mutation moves them
        assert best[0] == 30.0 and max(best) >= 40, best
    else:
        assert max(best) >= 48, best
