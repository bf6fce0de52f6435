"""Crossovers: the common contract, then each one's semantics (X1-X4, the paper's; `xes`, our extension)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from populora.errors import FitnessError, InvalidValueError
from populora.operators import CROSSOVERS, Factors, svd_factors

P = 8


def call(name, stacks, parents, seed=0, fitnesses="default", **kw):
    if isinstance(fitnesses, str):
        fitnesses = torch.linspace(-1.0, 2.0, stacks[0].down.shape[0])
    gen = torch.Generator().manual_seed(seed)
    return CROSSOVERS[name](stacks, parents, fitnesses=fitnesses, generator=gen, **kw)


def parents_for(name, c=5, k=3, seed=1):
    k = 2 if name in {"svd_subspace", "extrapolative"} else k
    return torch.randint(0, P, (c, k), generator=torch.Generator().manual_seed(seed))


class TestContract:
    def test_shapes_dtype_device(self, crossover_name, dtype, helpers):
        stacks = helpers.random_stacks(P, dtype=dtype)
        out = call(crossover_name, stacks, parents_for(crossover_name))
        assert len(out) == len(stacks)
        for child, stack in zip(out, stacks):
            assert isinstance(child, Factors)
            assert child.down.shape == (5, *stack.down.shape[1:])
            assert child.up.shape == (5, *stack.up.shape[1:])
            assert child.down.dtype == child.up.dtype == dtype
            assert child.down.device == stack.down.device
            assert torch.isfinite(child.down).all() and torch.isfinite(child.up).all()

    def test_surplus_columns_stay_zero(self, crossover_name, helpers):
        """Columns beyond the effective rank min(r, d, e) stay zero (target (7, 2, 4): rank 2)."""
        stacks = helpers.random_stacks(P)
        child = call(crossover_name, stacks, parents_for(crossover_name))[3]
        assert (child.down[..., 2:] == 0).all() and (child.up[..., 2:] == 0).all()

    def test_global_rng_untouched(self, crossover_name, helpers):
        stacks, parents = helpers.random_stacks(P), parents_for(crossover_name)
        state = torch.get_rng_state()
        call(crossover_name, stacks, parents)
        assert torch.equal(torch.get_rng_state(), state)

    def test_pure(self, crossover_name, helpers):
        stacks = helpers.random_stacks(P)
        parents, fit = parents_for(crossover_name), torch.randn(P)
        before = (helpers.clone(stacks), parents.clone(), fit.clone())
        call(crossover_name, stacks, parents, fitnesses=fit)
        helpers.assert_same(stacks, before[0])
        assert torch.equal(parents, before[1]) and torch.equal(fit, before[2])

    def test_seeded(self, crossover_name, helpers):
        stacks, parents = helpers.random_stacks(P), parents_for(crossover_name, c=8)
        a = call(crossover_name, stacks, parents, seed=3)
        helpers.assert_same(a, call(crossover_name, stacks, parents, seed=3))
        b = call(crossover_name, stacks, parents, seed=4)
        if crossover_name in helpers.DETERMINISTIC:
            helpers.assert_same(a, b)
        else:
            with pytest.raises(AssertionError):
                helpers.assert_same(a, b)

    def test_no_children(self, crossover_name, helpers):
        stacks = helpers.random_stacks(P)
        out = call(crossover_name, stacks, parents_for(crossover_name, c=0))
        assert [tuple(c.down.shape) for c in out] == [(0, *s.down.shape[1:]) for s in stacks]

    def test_bad_parents(self, crossover_name, helpers):
        stacks = helpers.random_stacks(P)
        bad = parents_for(crossover_name).clone()
        bad[0, 0] = P
        with pytest.raises(InvalidValueError, match=rf"population ids in \[0, {P}\)"):
            call(crossover_name, stacks, bad)


@pytest.mark.parametrize("name", ["average", "average_delta", "layer_wise", "svd_subspace", "extrapolative"])
def test_identical_parents_give_the_parent(name, helpers):
    """A child of one individual with itself has that individual's dW."""
    stacks = helpers.random_stacks(P, dtype=torch.float64)
    parents = torch.tensor([[2, 2], [5, 5]])
    for child, stack in zip(call(name, stacks, parents), stacks):
        assert torch.allclose(helpers.delta(child), helpers.delta(stack)[parents[:, 0]], atol=1e-9)


def test_average_is_the_mean_of_parents(helpers):
    stacks = helpers.random_stacks(P, dtype=torch.float64)
    parents = torch.tensor([[0, 1, 2], [3, 3, 7]])
    for child, stack in zip(call("average", stacks, parents), stacks):
        for j, ids in enumerate(parents):
            assert torch.allclose(child.down[j], stack.down[ids].mean(0))
            assert torch.allclose(child.up[j], stack.up[ids].mean(0))


def test_average_delta_is_the_best_rank_r_approximation(helpers):
    """Eckart-Young: the child's dW is the truncated SVD of the parents' mean dW."""
    stacks = helpers.random_stacks(P, dtype=torch.float64)
    parents = torch.tensor([[0, 1, 2], [4, 6, 7], [1, 1, 3]])
    for child, stack in zip(call("average_delta", stacks, parents), stacks):
        r = min(stack.down.shape[-1], stack.down.shape[-2], stack.up.shape[-2])
        mean = helpers.delta(stack)[parents].mean(1)  # (c, e, d)
        u, s, vh = torch.linalg.svd(mean)
        best = u[..., :r] @ torch.diag_embed(s[..., :r]) @ vh[..., :r, :]
        assert torch.allclose(helpers.delta(child), best, atol=1e-9)
        assert torch.allclose(child.down.mT @ child.down, child.up.mT @ child.up, atol=1e-9)  # balanced


def test_dare_keeps_the_expected_value(helpers):
    stacks = helpers.random_stacks(P, shapes=[(4, 3, 2)], dtype=torch.float64)
    parents = torch.tensor([[1, 6]]).expand(20000, 2)
    child = call("dare", stacks, parents, drop_rate=0.7)[0]
    mean = stacks[0].down[[1, 6]].mean(0)
    assert torch.allclose(child.down.mean(0), mean, atol=0.05 * stacks[0].down.abs().max())
    a, b = stacks[0].down[1], stacks[0].down[6]
    allowed = torch.stack([torch.zeros_like(a), a, b, a + b]) / (2 * 0.3)
    assert ((child.down.unsqueeze(1) - allowed).abs().amin(1) < 1e-12).all()  # drop or keep-and-rescale
    assert (child.down == 0).double().mean().item() == pytest.approx(0.49, abs=0.02)  # 0.7 ** 2


def test_dare_without_drops_is_average(helpers):
    stacks, parents = helpers.random_stacks(P, dtype=torch.float64), parents_for("dare")
    for x, y in zip(call("dare", stacks, parents, drop_rate=0.0), call("average", stacks, parents)):
        assert torch.allclose(x.down, y.down) and torch.allclose(x.up, y.up)
    with pytest.raises(InvalidValueError, match=r"`drop_rate` must be in \[0, 1\), got 1.0"):
        call("dare", stacks, parents, drop_rate=1.0)


def test_layer_wise_copies_one_parent_per_target(helpers):
    stacks = helpers.random_stacks(P)
    parents = torch.tensor([[0, 1]]).expand(40, 2)
    for child, stack in zip(call("layer_wise", stacks, parents), stacks):
        from0 = (child.down == stack.down[0]).flatten(1).all(1) & (child.up == stack.up[0]).flatten(1).all(1)
        from1 = (child.down == stack.down[1]).flatten(1).all(1) & (child.up == stack.up[1]).flatten(1).all(1)
        assert (from0 ^ from1).all() and from0.any() and from1.any()


def test_svd_subspace_takes_leading_components_from_parent_0(helpers):
    """Each child's components are parent 0's for j < m and parent 1's for j >= m, 1 <= m < r."""
    stacks = helpers.random_stacks(P, shapes=[(9, 7, 5)], dtype=torch.float64)
    parents = torch.randint(0, P, (60, 2), generator=torch.Generator().manual_seed(0))
    parents = parents[parents[:, 0] != parents[:, 1]]
    child = call("svd_subspace", stacks, parents)[0]
    u, s, v = svd_factors(stacks[0].down, stacks[0].up)
    cols = u * s.sqrt().unsqueeze(1)  # balanced down of every individual, (P, d, r)
    first = (child.down - cols[parents[:, 0]]).abs().amax(1) < 1e-9  # (c, r) column j from parent 0
    second = (child.down - cols[parents[:, 1]]).abs().amax(1) < 1e-9
    assert (first ^ second).all()
    m = first.sum(1)
    assert ((m >= 1) & (m <= 4)).all() and len(m.unique()) == 4
    assert torch.equal(first, torch.arange(5) < m[:, None])


def test_svd_subspace_rank_one_clones_parent_0(helpers):
    stacks = helpers.random_stacks(P, shapes=[(6, 5, 1)])
    child = call("svd_subspace", stacks, torch.tensor([[3, 4]]))[0]
    assert torch.equal(child.down, stacks[0].down[[3]]) and torch.equal(child.up, stacks[0].up[[3]])


@pytest.mark.parametrize("name", ["svd_subspace", "extrapolative"])
def test_two_parent_crossovers_reject_other_k(name, helpers):
    with pytest.raises(
        InvalidValueError, match=rf"{name} needs exactly 2 parents per child, got parents of shape \(4, 3\)"
    ):
        call(name, helpers.random_stacks(P), torch.zeros(4, 3, dtype=torch.long))


def test_extrapolative_steps_past_the_better_parent(helpers):
    stacks = helpers.random_stacks(P, dtype=torch.float64)
    fit = torch.arange(P, dtype=torch.float64)  # higher id = better
    parents = torch.tensor([[1, 5], [6, 2], [3, 3]])
    better, worse = torch.tensor([5, 6, 3]), torch.tensor([1, 2, 3])
    out = call("extrapolative", stacks, parents, fitnesses=fit)
    etas = []
    for child, stack in zip(out, stacks):
        for new, old in ((child.down, stack.down), (child.up, stack.up)):
            step = old[better] - old[worse]
            eta = ((new - old[worse]) * step).flatten(1).sum(1) / step.square().flatten(1).sum(1)
            assert torch.allclose(new[:2], old[worse][:2] + eta[:2, None, None] * step[:2], atol=1e-12)
            etas.append(eta[:2])
    etas = torch.stack(etas)
    assert torch.allclose(etas, etas[:1].expand_as(etas))  # one eta per child, every target and factor
    assert ((etas >= 1) & (etas <= 1.5)).all()
    assert torch.equal(out[0].down[2], stacks[0].down[3])  # a parent with itself


def test_extrapolative_without_fitness_trusts_parent_0(helpers):
    stacks = helpers.random_stacks(P, shapes=[(4, 3, 2)], dtype=torch.float64)
    child = call("extrapolative", stacks, torch.tensor([[6, 2]]), fitnesses=None, eta_min=2.0, eta_max=2.0)[0]
    assert torch.allclose(child.down[0], 2 * stacks[0].down[6] - stacks[0].down[2])


def one_hot_stacks():
    """Individual i's down is the unit vector e_i: a child's down IS its coefficient per individual."""
    return [Factors(torch.eye(P, dtype=torch.float64).unsqueeze(-1), torch.ones(P, 1, 1, dtype=torch.float64))]


def test_xes_needs_fitnesses(helpers):
    with pytest.raises(FitnessError, match="crossover `xes` needs `fitnesses`"):
        call("xes", helpers.random_stacks(P), parents_for("xes"), fitnesses=None)


def test_xes_steps_from_the_bad_toward_the_good():
    fit = torch.tensor([5.0, 4.0, 0.0, 1.0, 2.0, 3.0, -1.0, -2.0], dtype=torch.float64)
    parents = torch.tensor([[0, 1]])
    coef = call("xes", one_hot_stacks(), parents, fitnesses=fit, tournament_size=P)[0].down[0, :, 0]
    # contenders = all 6 others; the 2 worst (ids 7, 6) are the bad ones; n = 4
    f = fit[[0, 1, 6, 7]]
    z = (f - f.mean()) / (f.std(unbiased=False) + 1e-8)
    expected = torch.zeros(P, dtype=torch.float64)
    expected[[0, 1, 6, 7]] = (1 + z) / 4
    assert torch.allclose(coef, expected)
    assert coef.sum().item() == pytest.approx(1.0)
    assert (coef[:2] > 0.25).all() and (coef[6:] < 0.25).all()  # toward the good, away from the bad


def test_xes_bad_ones_come_from_the_childs_island():
    fit = torch.tensor([5.0, 4.0, 3.0, 2.0, -9.0, -9.0, -9.0, -9.0])  # island 1 is the worst
    parents = torch.tensor([[0, 1], [1, 2], [4, 5]])
    coef = call("xes", one_hot_stacks(), parents, fitnesses=fit, num_groups=2, tournament_size=8)[0]
    coef = coef.down[..., 0]  # (c, P)
    assert (coef[:2, 4:] == 0).all() and (coef[2, :4] == 0).all()
    # the bad ones are the island's others (parents excluded), weighted below the good ones
    assert (coef[0, 2:4] != 0).all() and coef[0, 2:4].max() < coef[0, :2].min()
    # weights follow fitness, not role: child 1's "bad" id 0 is fitter than its parents
    assert (coef[1, :4].diff() < 0).all()
    with pytest.raises(InvalidValueError, match="`num_groups` must be an int >= 1 dividing P=8, got 3"):
        call("xes", one_hot_stacks(), parents, fitnesses=fit, num_groups=3)


def test_xes_island_of_parents_only_averages_them():
    """No others to draw bad ones from: n = k, the child is the good parents' weighted mean."""
    fit = torch.arange(P, dtype=torch.float64)
    coef = call("xes", one_hot_stacks(), torch.tensor([[1, 0]]), fitnesses=fit, num_groups=4)[0].down[0, :, 0]
    # id 1 (fitness 1) and id 0 (fitness 0): z = +1, -1, child = mean + step = id 1
    assert torch.allclose(coef[:2], torch.tensor([0.0, 1.0], dtype=torch.float64), atol=1e-6)
    assert (coef[2:] == 0).all()


@pytest.mark.parametrize("name", ["xes", "extrapolative"])
def test_fitness_aware_crossovers_validate_fitnesses(name, helpers):
    stacks, parents = helpers.random_stacks(P), parents_for(name)
    with pytest.raises(FitnessError, match="`fitnesses` contains NaN"):
        call(name, stacks, parents, fitnesses=torch.full((P,), float("nan")))
    with pytest.raises(FitnessError, match=rf"`fitnesses` must have shape \({P},\), got \(3,\)"):
        call(name, stacks, parents, fitnesses=torch.zeros(3))
    worst = torch.linspace(0.0, 1.0, P)
    worst[0] = -float("inf")  # nan_policy='worst' upstream
    for child in call(name, stacks, parents, fitnesses=worst):
        assert torch.isfinite(child.down).all() and torch.isfinite(child.up).all()


def test_numpy_options_and_num_groups(helpers):
    stacks = helpers.random_stacks(8)
    parents = torch.tensor([[0, 1], [2, 3], [4, 5]])
    f = torch.randn(8, generator=helpers.gen(0))
    for name, options, plain in (
        ("dare", {"drop_rate": np.float32(0.5)}, {"drop_rate": 0.5}),
        ("extrapolative", {"eta_min": np.float64(1.0), "eta_max": np.float32(1.25)}, {"eta_min": 1.0, "eta_max": 1.25}),
        (
            "xes",
            {"eta": np.float64(0.5), "tournament_size": np.int64(2), "num_groups": np.int64(2)},
            {"eta": 0.5, "tournament_size": 2, "num_groups": 2},
        ),
    ):
        a = CROSSOVERS[name](stacks, parents, fitnesses=f, generator=helpers.gen(1), **options)
        b = CROSSOVERS[name](stacks, parents, fitnesses=f, generator=helpers.gen(1), **plain)
        helpers.assert_same(a, b)
