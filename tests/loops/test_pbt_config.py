"""PBT's config and loop surface: PBTConfig checked when built, JSON round trip, the 0.5.0 keywords deprecated
and equal, a resume with another config refused naming the field, run / callback / history / save / load,
and a step (``train=`` included) rolled back whole."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import warnings

import pytest
import torch
from models import mlp

from populora import Population
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.loops.base import Budget, Loop
from populora.train import PBT, LRMultipliers, PBTConfig, PBTRecord

P = 8
X = torch.randn(2 * P, 4, generator=torch.Generator().manual_seed(5))
TARGET = torch.randn(2 * P, 2, generator=torch.Generator().manual_seed(6))


def population() -> Population:
    torch.manual_seed(0)
    return Population(mlp(4, 8, 2), pop_size=P, low_rank=2, seed=0, init_scale=0.5, requires_grad=True)


def train(pbt: PBT) -> torch.Tensor:
    """One gradient step of every individual (through its multipliers); ``(P,)`` minus each one's loss."""
    pop, opt = pbt.population, pbt.optimizers[0]
    opt.zero_grad()
    per_row = (pop(X, all_individuals=True) - TARGET).square().sum(1)
    per_row.sum().backward()
    pbt.lr_multipliers.step(opt, pop.adapter_parameters())
    return -per_row.detach().view(P, 2).sum(1)


CONFIG = PBTConfig(interval=3, fraction=0.25, decay=0.5, crossover_rate=0.5, epsilon=0.05, seed=4)


def build(config: PBTConfig = CONFIG, **kw) -> PBT:
    pop = population()
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-2)
    return PBT(pop, opt, config, lr_multipliers=LRMultipliers(P, seed=1), train=kw.pop("train", train), **kw)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def everything(pbt: PBT) -> dict:
    return copy.deepcopy(pbt.state_dict())


# ---------------------------------------------------------------------------------------------- the config


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("interval", 0, InvalidValueError),
        ("fraction", 0.75, InvalidValueError),
        ("decay", 1.0, InvalidValueError),
        ("crossover_rate", 1.5, InvalidValueError),
        ("crossover", "no_such_crossover", InvalidValueError),
        ("crossover_kwargs", {"no_such_option": 1}, InvalidTypeError),
        ("mutation", 3, InvalidTypeError),
        ("epsilon", -0.1, InvalidValueError),
        ("optimizer_state", "keep", InvalidValueError),
        ("perturb_lr", 1, InvalidTypeError),
        ("seed", 1.5, InvalidTypeError),
    ],
)
def test_a_bad_field_is_refused_when_built_naming_it(field, value, error):
    with pytest.raises(error, match=field):
        PBTConfig(**{field: value})
    with pytest.raises(error, match=field):
        dataclasses.replace(PBTConfig(), **{field: value})


def test_the_config_round_trips_through_json_and_is_frozen():
    config = PBTConfig(interval=4, crossover="average", mutation_kwargs={}, perturb_lr=False, seed=7)
    assert PBTConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert dataclasses.replace(config, interval=5).interval == 5 and config.interval == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.interval = 3  # type: ignore[misc]


def test_the_constructor_takes_at_most_twelve_parameters_and_the_config_whole():
    assert len(inspect.signature(PBT.__init__).parameters) - 1 <= 12
    pbt = build()
    assert pbt.config is CONFIG and (pbt.interval, pbt.decay, pbt.seed) == (3, 0.5, 4)
    assert isinstance(pbt, Loop)
    with pytest.raises(InvalidTypeError, match="config="):
        PBT(population(), CONFIG)  # the config in the optimizer's place


def test_the_050_keywords_warn_and_equal_the_config_form():
    def steps(pbt: PBT) -> PBT:
        for _ in range(4):
            pbt.step()
        return pbt

    with pytest.warns(DeprecationWarning, match=r"config=PBTConfig\(interval=..., fraction=..., decay=..."):
        old = build(config=None, interval=3, fraction=0.25, decay=0.5, crossover_rate=0.5, epsilon=0.05, seed=4)
    assert old.config == CONFIG
    assert same(everything(steps(old)), everything(steps(build())))
    with pytest.raises(InvalidTypeError, match="'intervall'.*'interval'"), warnings.catch_warnings():
        build(config=None, intervall=3)


# ---------------------------------------------------------------------------------------------- the surface


def test_run_with_an_int_budget_or_seconds_and_history_records():
    pbt = build()
    records = pbt.run(4)
    assert pbt.steps == 4 and records == pbt.history and [r.step for r in records] == [1, 2, 3, 4]
    assert [r.replaced for r in records] == [0, 0, 2, 0]  # interval 3: the third step replaces
    row = records[2].as_dict()
    assert set(row) == {"step", "replaced", "crossovers", "key_best", "key_mean", "key_worst"}
    assert all(isinstance(v, (int, float)) for v in row.values()) and row["key_best"] >= row["key_worst"]
    assert PBTRecord.from_dict(row) == records[2]
    assert len(pbt.run(Budget(max_seconds=1e-9))) == 1  # at least one step; the time is never compared
    assert len(pbt.run(Budget(max_steps=2, max_seconds=1e6))) == 2 and len(pbt.history) == 7


def test_a_step_before_every_fitness_is_known_records_no_keys():
    pbt = build(train=None)
    pbt.step()
    assert pbt.history[0].key_best is None and pbt.history[0].as_dict()["key_mean"] is None


def test_the_callback_rule():
    seen = []
    pbt = build()
    assert len(pbt.run(3, callback=lambda r: seen.append(r.step))) == 3 and seen == [1, 2, 3]  # None goes on
    assert len(pbt.run(3, callback=lambda r: False)) == 3
    assert len(pbt.run(3, callback=lambda r: r.step == 7)) == 1 and pbt.steps == 7  # True stops

    def listing(record):
        return [1]

    with pytest.raises(InvalidTypeError, match=r"listing returned \[1\]"):
        pbt.run(3, callback=listing)


def test_run_without_train_is_refused_before_any_step():
    pbt = build(train=None)
    with pytest.raises(InvalidValueError, match="train="):
        pbt.run(3)
    assert pbt.steps == 0 and pbt.history == []
    with pytest.raises(InvalidValueError, match="takes no fitnesses"):
        build().step(torch.zeros(P))
    with pytest.raises(InvalidTypeError, match="train"):
        build(train="fit")


def test_save_load_resumes_bit_for_bit(tmp_path):
    straight = build()
    straight.run(7)
    first = build()
    first.run(4)
    path = first.save(tmp_path / "pbt.ckpt")
    resumed = build(config=dataclasses.replace(CONFIG, seed=99))  # the seed only seeded what the file restores
    resumed.load(path)
    assert resumed.history == first.history
    resumed.run(3)
    assert same(everything(resumed)["population"], everything(straight)["population"])
    a, b = everything(resumed), everything(straight)
    assert same({**a, "config": None, "seed": None}, {**b, "config": None, "seed": None})
    assert resumed.history == straight.history


def test_a_resume_with_another_config_is_refused_naming_the_field_and_changes_nothing(tmp_path):
    source = build()
    source.run(4)
    path = source.save(tmp_path / "pbt.ckpt")
    target = build(config=dataclasses.replace(CONFIG, decay=0.7))
    target.run(2)
    before = everything(target)
    with pytest.raises(CheckpointError, match=r"PBTConfig.decay=0.5; this run has PBTConfig.decay=0.7"):
        target.load(path)
    assert same(everything(target), before)
    state = copy.deepcopy(source.state_dict())
    state["history"] = state["history"][:-1]  # a history that does not end at the state's steps
    with pytest.raises(CheckpointError, match="history"):
        build().load_state_dict(state)


@pytest.mark.parametrize("where", ["train", "replacement", "fitness"])
def test_a_step_that_raises_is_rolled_back_whole(where):
    """``train`` raising after its gradient step (the population and optimizer already moved), the replacement
    raising after the fitnesses were folded in, a bad fitness: the PBT and all it holds are as before."""
    calls = [0]

    def flaky(pbt: PBT):
        fitness = train(pbt)
        calls[0] += 1
        if where == "train" and calls[0] == 3:
            raise RuntimeError("train failed after its step")
        if where == "fitness" and calls[0] == 3:
            return torch.full((P,), float("nan"))
        return fitness

    pbt = build(train=flaky)
    pbt.run(2)
    before = everything(pbt)
    if where == "replacement":
        pbt.exploit_and_explore = lambda: (_ for _ in ()).throw(RuntimeError("replacement failed"))
    with pytest.raises(Exception):
        pbt.step()
    assert same(everything(pbt), before) and pbt.steps == 2 and len(pbt.history) == 2
