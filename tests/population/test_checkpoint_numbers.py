"""Numbers beyond float64 where a population state holds floats (weight scales, history): the argument checks say
so instead of raising OverflowError, and a state or file holding them is refused before anything is written, in
both file formats."""

from __future__ import annotations

import math

import pytest
import torch
from models import mlp

from populora import Population
from populora.checks import check_float, is_real
from populora.errors import CheckpointError, InvalidValueError

HUGE = 10**400  # an int that float() cannot convert


# ---------------------------------------------------------------------------------------------- the checks


@pytest.mark.parametrize("value", [HUGE, -HUGE, 2**1024])
def test_check_float_says_an_int_beyond_float64_is_not_a_finite_number(value):
    with pytest.raises(InvalidValueError, match=r"`x` must be a finite number, got an int of \d+ bits"):
        check_float("x", value)
    with pytest.raises(InvalidValueError, match="`x` must be a finite number"):
        check_float("x", value, low=0.0, high=1.0)


def test_is_real_finite_is_false_for_an_int_beyond_float64():
    assert is_real(HUGE) is True  # a real number all the same
    assert is_real(HUGE, finite=True) is False and is_real(-HUGE, finite=True) is False
    assert is_real(2**1023, finite=True) is True  # the largest power of two float64 holds


# ---------------------------------------------------------------------------------------------- states


def population(seed: int = 0) -> Population:
    torch.manual_seed(seed)
    return Population(mlp(), 4, 2, seed=seed, init_scale=0.5)


def trained(seed: int = 1) -> Population:
    pop = population(seed)
    pop.evolve_(torch.arange(4.0))
    return pop


def everything(pop: Population) -> dict:
    state = pop.snapshot()
    extra = state.pop("_extra_state")
    return {"tensors": state, "extra": extra}


def assert_unchanged(pop: Population, before: dict) -> None:
    after = everything(pop)
    assert after["tensors"].keys() == before["tensors"].keys()
    assert all(torch.equal(after["tensors"][k], before["tensors"][k]) for k in before["tensors"])
    a, b = after["extra"], before["extra"]
    assert torch.equal(a["generator"], b["generator"])
    assert {k: v for k, v in a.items() if k != "generator"} == {k: v for k, v in b.items() if k != "generator"}


def _scales(value):
    return lambda extra: extra.__setitem__("weight_scales", [value, *extra["weight_scales"][1:]])


def _history(position: int, value):
    def damage(extra):
        entry = list(extra["history"][0])
        entry[position] = value
        extra["history"] = [entry]

    return damage


DAMAGE = {
    "weight_scale_beyond_float64": _scales(HUGE),
    "weight_scale_inf": _scales(math.inf),
    "weight_scale_nan": _scales(math.nan),
    "history_best_beyond_float64": _history(1, HUGE),
    "history_mean_beyond_float64": _history(2, -HUGE),
    "history_std_beyond_float64": _history(3, HUGE),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_state_with_a_number_beyond_float64_is_refused_before_anything_is_written(case):
    state = trained().state_dict(include_model=False)
    state["_extra_state"] = dict(state["_extra_state"])
    DAMAGE[case](state["_extra_state"])
    pop = population(seed=2)
    pop.evolve_(torch.arange(4.0).flip(0))
    before = everything(pop)
    with pytest.raises(CheckpointError):
        pop.load_state_dict(state)
    assert_unchanged(pop, before)


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_file_with_a_number_beyond_float64_is_refused_before_anything_is_written(tmp_path, fmt, case):
    if fmt == "safetensors":
        pytest.importorskip("safetensors")
    source = trained()
    extra = source.get_extra_state()
    DAMAGE[case](extra)
    source.weight_scales = extra["weight_scales"]  # the file is written from the live population
    if extra["history"] and extra["history"][0] != list(source.history[0]):
        source.history = [tuple(extra["history"][0])]
    path = source.save(tmp_path / f"pop.{fmt}", format=fmt)
    pop = population(seed=2)
    before = everything(pop)
    with pytest.raises(CheckpointError, match=str(path.name)):
        pop.load(path)
    assert_unchanged(pop, before)
    with pytest.raises(CheckpointError):
        Population.from_checkpoint(path, mlp())
