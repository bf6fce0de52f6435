"""populora.train.PBT: who is replaced and by whom, what the children inherit, ratings as the key, all or nothing,
and an exact resume."""

from __future__ import annotations

import copy

import pytest
import torch
from models import mlp

from populora import Population, register_mutation
from populora.errors import CheckpointError, FitnessError, InvalidTypeError, InvalidValueError
from populora.loops.ratings import Ratings
from populora.train import PBT, LRMultipliers, PBTConfig

P = 8


def population(seed: int = 0) -> Population:
    torch.manual_seed(0)
    return Population(mlp(4, 8, 2), pop_size=P, low_rank=2, seed=seed, init_scale=0.5, requires_grad=True)


X = torch.randn(2 * P, 4, generator=torch.Generator().manual_seed(5))
TARGET = torch.randn(2 * P, 2, generator=torch.Generator().manual_seed(6))


def train(pop: Population, opt: torch.optim.Optimizer, lr: LRMultipliers | None = None) -> torch.Tensor:
    """One gradient step of every individual on its two rows; returns ``(P,)`` fitnesses (minus its loss)."""
    opt.zero_grad()
    per_row = (pop(X, all_individuals=True) - TARGET).square().sum(1)  # rows laid out (p b)
    per_row.sum().backward()
    if lr is None:
        opt.step()
    else:
        lr.step(opt, pop.adapter_parameters())
    return -per_row.detach().view(P, 2).sum(1)


def stacks(pop: Population) -> list[torch.Tensor]:
    return [p.detach().clone() for p in pop.adapter_parameters()]


def test_every_interval_the_bottom_fraction_is_replaced_by_children_of_the_top():
    pop = population()
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
    lr = LRMultipliers(P, values=torch.arange(1.0, P + 1), factors=(0.5, 2.0), bounds=(1e-3, 1e3))
    config = PBTConfig(interval=3, fraction=0.25, crossover_rate=0.5, epsilon=0.0, seed=1)
    pbt = PBT(pop, opt, config, lr_multipliers=lr)
    fitness = torch.tensor([5.0, 1.0, 7.0, 0.0, 3.0, 6.0, -2.0, 4.0], dtype=torch.float64)
    for _ in range(2):
        assert not pbt.ready()
        train(pop, opt)
        assert pbt.step(fitness) is None
    assert pbt.ready()  # the next step is the third
    train(pop, opt)
    before, rows = stacks(pop), [{k: v.clone() for k, v in opt.state[p].items()} for p in pop.adapter_parameters()]
    lr_before = lr.values.clone()
    result = pbt.step(fitness)
    assert result is not None and result.step == 3 and pbt.steps == 3
    assert result.children.tolist() == [3, 6]  # the two lowest moving averages, ascending
    assert set(result.parents.flatten().tolist()) <= {2, 5}  # the top max(2, 2)
    survivors = [i for i in range(P) if i not in (3, 6)]
    for now, old in zip(stacks(pop), before):
        assert torch.equal(now[survivors], old[survivors])
    for p, old in zip(pop.adapter_parameters(), rows):
        assert torch.equal(opt.state[p]["exp_avg"][survivors], old["exp_avg"][survivors])
        for child, (first, second), crossed in zip(result.children, result.parents, result.crossed):
            assert torch.equal(opt.state[p]["exp_avg"][child], old["exp_avg"][first])  # "inherit": first parent's
            if crossed:
                assert first != second
            else:  # a mutated copy (epsilon 0: the parent itself)
                assert first == second
                assert torch.equal(p.detach()[child], p.detach()[first])
    for child, first in zip(result.children, result.parents[:, 0]):
        assert float(lr.values[child]) / float(lr_before[first]) in (0.5, 2.0)
    assert torch.equal(lr.values[survivors], lr_before[survivors])
    assert pbt.counts[result.children].tolist() == [0, 0] and bool((pbt.counts[survivors] == 3).all())
    assert torch.equal(pbt.fitness[result.children], pbt.fitness[result.parents[:, 0]])


def test_crossover_children_mix_two_distinct_parents_and_reset_zeros_their_rows():
    pop = population()
    opt = torch.optim.SGD(pop.adapter_parameters(), lr=1e-2, momentum=0.9)
    config = PBTConfig(interval=1, fraction=0.5, crossover_rate=1.0, crossover="average", optimizer_state="reset")
    pbt = PBT(pop, opt, config)
    train(pop, opt)
    before = stacks(pop)
    result = pbt.step(torch.arange(float(P)))
    assert result.children.tolist() == [0, 1, 2, 3] and bool(result.crossed.all())
    for now, old in zip(stacks(pop), before):
        for child, (a, b) in zip(result.children, result.parents):
            assert a != b and a >= 4 and b >= 4
            torch.testing.assert_close(now[child], (old[a] + old[b]) / 2)
    for p in pop.adapter_parameters():
        assert not opt.state[p]["momentum_buffer"][result.children].any()


def test_ratings_rank_by_mu_minus_three_sigma_and_children_restart():
    pytest.importorskip("openskill")
    pop = population()
    ratings = Ratings({"students": P, "teachers": 2})
    for i in range(P):  # student i beats the teacher i times: higher ids rate higher
        for k in range(P - 1):
            ratings.rate_(("students", i), ("teachers", 0), 1.0 if k < i else 0.0)
    pbt = PBT(pop, None, PBTConfig(interval=1, fraction=0.25, crossover_rate=0.0), ratings=ratings, name="students")
    ordinal = ratings.ordinal("students")
    result = pbt.step()
    assert torch.equal(result.keys, ordinal)
    assert result.children.tolist() == torch.sort(ordinal).indices[:2].sort().values.tolist()
    assert ratings.mu("students")[result.children].tolist() == [25.0, 25.0]
    assert ratings.matches("students")[result.children].tolist() == [0, 0]
    with pytest.raises(InvalidValueError, match="takes no fitnesses"):
        pbt.step(torch.zeros(P))


def test_a_failing_replacement_changes_nothing_and_the_retry_replaces(request):
    calls = {"n": 0}

    def flaky(factors, *, epsilon, weight_scales, generator):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("flaky mutation")
        return [type(f)(f.down + 0.01, f.up) for f in factors]

    from populora.operators.base import MUTATIONS

    register_mutation("flaky_for_pbt", flaky)
    request.addfinalizer(lambda: MUTATIONS.pop("flaky_for_pbt"))  # the registry is global: leave it as found
    pop = population()
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
    lr = LRMultipliers(P)
    pbt = PBT(pop, opt, PBTConfig(interval=1, crossover_rate=0.0, mutation="flaky_for_pbt"), lr_multipliers=lr)
    train(pop, opt)
    state = copy.deepcopy(pbt.state_dict())
    with pytest.raises(RuntimeError, match="flaky mutation"):
        pbt.step(torch.arange(float(P)))
    after = pbt.state_dict()
    assert after["steps"] == state["steps"] == 0 and torch.equal(after["generator"], state["generator"])
    assert all(torch.equal(v, after["population"][k]) for k, v in state["population"].items() if torch.is_tensor(v))
    assert torch.equal(after["lr_multipliers"]["values"], state["lr_multipliers"]["values"])
    assert bool(torch.isnan(after["fitness"]).all()) and not after["counts"].any()  # the fitnesses were not folded in
    for k, entry in state["optimizers"][0]["state"].items():
        assert all(torch.equal(entry[key], after["optimizers"][0]["state"][k][key]) for key in entry)
    assert pbt.step(torch.arange(float(P))) is not None and pbt.steps == 1


def run(split: int | None, tmp_path, total: int = 7) -> PBT:
    """``total`` training steps with PBT every 3; at ``split`` the run is saved and continued by a fresh twin."""

    def build(seed: int) -> tuple[Population, torch.optim.Optimizer, LRMultipliers, PBT]:
        pop = population(seed=seed)
        opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        lr = LRMultipliers(P, seed=seed)
        config = PBTConfig(interval=3, fraction=0.25, seed=seed, decay=0.5)
        pbt = PBT(pop, opt, config, schedulers=sched, lr_multipliers=lr)
        return pop, opt, lr, pbt

    pop, opt, lr, pbt = build(0)
    for step in range(total):
        if step == split:
            path = pbt.save(tmp_path / "pbt.ckpt")
            pop, opt, lr, pbt = build(9)  # other seeds: everything must come from the file
            pbt.load(path)
        fitness = train(pop, opt, lr)
        pbt.schedulers[0].step()
        pbt.step(fitness)
    return pbt


def test_resume_is_bit_for_bit_the_straight_run(tmp_path):
    straight, resumed = run(None, tmp_path), run(4, tmp_path)
    a, b = straight.state_dict(), resumed.state_dict()
    assert a["steps"] == b["steps"] == 7
    for key in ("generator", "fitness", "counts"):
        assert torch.equal(a[key], b[key])
    assert all(torch.equal(v, b["population"][k]) for k, v in a["population"].items() if torch.is_tensor(v))
    assert torch.equal(a["lr_multipliers"]["values"], b["lr_multipliers"]["values"])
    assert a["schedulers"] == b["schedulers"]
    assert a["optimizers"][0]["param_groups"] == b["optimizers"][0]["param_groups"]
    for k, entry in a["optimizers"][0]["state"].items():
        assert all(torch.equal(entry[key], b["optimizers"][0]["state"][k][key]) for key in entry)
    assert not torch.equal(a["lr_multipliers"]["values"], torch.ones(P))  # children were perturbed


def test_bad_arguments_and_states_are_refused():
    pop = population()
    with pytest.raises(InvalidValueError, match="`PBTConfig.fraction` must be a finite number in"):
        PBT(pop, config=PBTConfig(fraction=0.75))
    with pytest.raises(InvalidValueError, match="pass `ratings=` too"):
        PBT(pop, name="students")
    with pytest.raises(InvalidValueError, match="crossover"):
        PBT(pop, config=PBTConfig(crossover="no_such_crossover"))
    with pytest.raises(InvalidTypeError, match="optimizer"):
        PBT(pop, "adam")
    one = Population(mlp(4, 8, 2), pop_size=1, low_rank=2)
    with pytest.raises(InvalidValueError, match="2 or more"):
        PBT(one)
    pbt = PBT(pop, config=PBTConfig(interval=1))
    with pytest.raises(FitnessError, match="no fitness yet"):
        pbt.step()
    assert pbt.steps == 0
    with pytest.raises(FitnessError):
        pbt.step(torch.zeros(P + 1))
    state = pbt.state_dict()
    with pytest.raises(CheckpointError, match="holds 1 optimizers"):
        PBT(pop, config=pbt.config).load_state_dict({**state, "optimizers": [{}]})  # (same config: it is checked first)
    with pytest.raises(CheckpointError, match="not a PBT state"):
        pbt.load_state_dict({"format": "other"})


def _everything(pbt: PBT) -> dict:
    """A deep copy of all a PBT holds (its own state dict, which covers the population and every part)."""
    return copy.deepcopy(pbt.state_dict())


def _same(a: dict, b: dict) -> bool:
    def eq(x, y):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype):
                return False
            return bool(((x == y) | (x.isnan() & y.isnan())).all()) if x.is_floating_point() else torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(eq, x, y))
        return x == y

    return eq(a, b)


@pytest.mark.parametrize("damage", ["multipliers", "ratings", "optimizer_groups", "optimizer_state"])
def test_a_damaged_state_is_refused_and_changes_nothing(damage):
    pytest.importorskip("openskill")

    def make(seed):  # (one population seed: the seed a population was built with is its own, not loaded)
        pop = population()
        opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
        ratings = Ratings({"students": P})
        pbt = PBT(pop, opt, PBTConfig(interval=2), lr_multipliers=LRMultipliers(P), ratings=ratings, name="students")
        train(pop, opt)
        ratings.rate_many_("students", [seed, 1 + seed], "students", [3, 4], [1.0, 0.0])
        return pbt, opt

    source, _ = make(1)
    source.step()
    state = copy.deepcopy(source.state_dict())
    if damage == "multipliers":
        state["lr_multipliers"] = {**state["lr_multipliers"], "values": torch.full((P + 3,), float("nan"))}
    elif damage == "ratings":
        state["ratings"] = Ratings({"teachers": 3}).state_dict()  # ratings of another population
    elif damage == "optimizer_groups":
        other = torch.optim.Adam([{"params": [torch.zeros(1)]}, {"params": [torch.zeros(1)]}])
        state["optimizers"] = [other.state_dict()]
    else:  # the groups fit, a state entry does not (torch's own check)
        opt_state = state["optimizers"][0]
        first = next(iter(opt_state["state"]))
        opt_state["state"][first]["exp_avg"] = torch.zeros(3)
    target, opt = make(0)
    before = _everything(target)
    with pytest.raises(CheckpointError):
        target.load_state_dict(state)
    assert _same(_everything(target), before)
    target.load_state_dict(copy.deepcopy(source.state_dict()))  # an undamaged state still loads
    assert _same(_everything(target), _everything(source))


def test_a_checkpoint_written_by_050_loads_and_is_this_versions_run():
    """tests/loops/data/pbt_050.pt was written by populora 0.5.0 (commit 1496bc6) from this run."""
    from pathlib import Path

    def run():
        pop = population()
        opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
        pbt = PBT(pop, opt, PBTConfig(interval=2))
        train(pop, opt)
        pbt.step(torch.arange(float(P)))
        train(pop, opt)
        pbt.step(torch.arange(float(P)).flip(0))
        return pbt

    here = run()
    pop = population()
    twin = PBT(pop, torch.optim.Adam(pop.adapter_parameters(), lr=1e-2), PBTConfig(interval=2))
    twin.load(Path(__file__).parent / "data" / "pbt_050.pt")
    assert twin.steps == 2
    assert twin.history == [] and len(here.history) == 2  # a 0.5.0 file holds no history: it starts empty
    assert _same({**_everything(twin), "history": None}, {**_everything(here), "history": None})
    state = twin.state_dict()
    with pytest.raises(CheckpointError, match="populora.PBT/1"):
        twin.load_state_dict({**state, "format": "populora.PBT/0"})
