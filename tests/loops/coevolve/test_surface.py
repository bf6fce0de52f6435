"""Coevolve's loop surface: run (int budget, Budget, the callback rule), a history of records with as_dict (and
0.5.0's dict view, deprecated), save / load resuming bit for bit, a step and a load rolled back whole."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from populora import CheckpointError, Coevolve, HallOfFame, Population
from populora.errors import InvalidTypeError
from populora.loops.base import Budget, Loop
from populora.loops.coevolve.history import CoevolveRecord
from populora.stats import GenerationStats

P = 4


def build(seed: int = 0, fail_at: int | None = None, hall: bool = True) -> Coevolve:
    torch.manual_seed(0)
    a = Population(nn.Linear(1, 1), pop_size=P, low_rank=1, seed=seed)
    b = Population(nn.Linear(1, 1), pop_size=P, low_rank=1, seed=seed + 1)

    def probe_a(coevolve):
        x = torch.randn(1, 1, generator=torch.Generator().manual_seed(coevolve.generation))  # resumable
        return coevolve.a(x, all_individuals=True)

    def fitness_b(b_outputs):
        if fail_at is not None and b.generation == fail_at:
            raise RuntimeError("fitness failed")
        return b_outputs.flatten()

    co = Coevolve(
        populations=dict(
            a=dict(population=a, probe=probe_a, fitness=lambda a_outputs, b_outputs: -(a_outputs - b_outputs.mean()).abs().flatten()),
            b=dict(population=b, probe=lambda coevolve, a_outputs: coevolve.b(a_outputs, all_individuals=True), fitness=fitness_b),
        ),
        hall_of_fame=HallOfFame({"a": a}, capacity=3) if hall else None,
    )  # fmt: skip
    return co


def same(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(same, x, y))
    return x == y


def everything(co: Coevolve) -> dict:
    return copy.deepcopy(co.state_dict())


def test_run_with_an_int_budget_or_seconds_and_records():
    co = build()
    assert isinstance(co, Loop)
    records = co.run(3)
    assert co.generation == 3 and records == co.history and [r.step for r in records] == [0, 1, 2]
    assert isinstance(records[0], CoevolveRecord) and isinstance(records[0]["b"], GenerationStats)
    row = records[-1].as_dict()
    assert set(row) == {"step", "a_best", "a_mean", "a_std", "b_best", "b_mean", "b_std"}
    assert all(isinstance(v, (int, float)) for v in row.values()) and row["b_best"] == records[-1]["b"].best
    assert len(co.run(Budget(max_seconds=1e-9))) == 1  # at least one step; the time is never compared
    assert len(co.run(Budget(max_steps=2, max_seconds=1e6))) == 2 and len(co.history) == 6


def test_the_callback_rule():
    co = build()
    seen = []
    assert len(co.run(2, callback=lambda r: seen.append(r.step))) == 2 and seen == [0, 1]
    assert len(co.run(2, callback=lambda r: False)) == 2
    assert len(co.run(5, callback=lambda r: r.step == 4)) == 1 and co.generation == 5

    def listing(record):
        return [1]

    with pytest.raises(InvalidTypeError, match=r"listing returned \[1\]"):
        co.run(3, callback=listing)


def test_the_050_dict_view_of_the_history_warns_and_is_the_per_population_list():
    co = build()
    co.run(2)
    assert [s.generation for s in co.history.of("b")] == [0, 1]
    assert co.history.by_population() == {"a": co.history.of("a"), "b": co.history.of("b")}
    with pytest.warns(DeprecationWarning, match=r"history\['b'\].*history.of\(name\)"):
        assert co.history["b"] == co.history.of("b")
    with pytest.warns(DeprecationWarning):
        assert dict(co.history.items()) == co.history.by_population()
    with pytest.warns(DeprecationWarning):
        assert co.history.keys() == ["a", "b"] and len(co.history.values()) == 2
    assert co.history[-1].step == 1 and len(co.history[:1]) == 1  # ints and slices: the list
    with pytest.raises(KeyError, match="no population named 'c'"):
        co.history.of("c")


def test_save_load_resumes_bit_for_bit(tmp_path):
    straight = build()
    straight.run(5)
    first = build()
    first.run(2)
    path = first.save(tmp_path / "co.ckpt")
    resumed = build(seed=7)  # other adapters and generators: everything must come from the file
    resumed.load(path)
    assert resumed.history == first.history and resumed.generation == 2
    resumed.run(3)
    a, b = everything(resumed), everything(straight)
    for state in (a, b):  # (the seed a population was built with is its own, not loaded)
        for pop in state["populations"].values():
            pop["_extra_state"]["config"]["seed"] = None
    assert same(a, b) and resumed.history == straight.history


@pytest.mark.parametrize("hall", [True, False])
def test_a_step_that_raises_is_rolled_back_whole(hall):
    co = build(fail_at=2, hall=hall)
    co.run(2)
    before = everything(co)
    with pytest.raises(RuntimeError, match="fitness failed"):
        co.step()
    assert same(everything(co), before) and co.generation == 2 and len(co.history) == 2


def test_a_hall_of_fame_failing_after_the_evolution_rolls_back_the_populations(monkeypatch):
    co = build()
    co.run(1)
    before = everything(co)
    monkeypatch.setattr(co.hall_of_fame, "append", lambda champion: (_ for _ in ()).throw(RuntimeError("full")))
    with pytest.raises(RuntimeError, match="full"):
        co.step()  # the populations had evolved already
    assert same(everything(co), before)


def test_a_load_that_fails_changes_nothing(tmp_path):
    source = build()
    source.run(2)
    state = copy.deepcopy(source.state_dict())
    state["history"]["b"] = state["history"]["b"][:1]  # one population's history a step short
    target = build()
    target.run(1)
    before = everything(target)
    with pytest.raises(CheckpointError, match="one entry per step"):
        target.load_state_dict(state)
    assert same(everything(target), before)
