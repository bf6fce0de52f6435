"""Routing and checkpoint errors in the user's words: one populora error family, messages naming the argument the
user passed (`individuals=`) and the target paths on both sides of a checkpoint that does not fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from models import mlp

from populora import Population
from populora.errors import CheckpointError, PopuloraError, RouteError


def population(targets=None, seed: int = 0) -> Population:
    torch.manual_seed(seed)
    return Population(mlp(), 4, 2, lora_targets=targets, seed=seed, init_scale=0.5)


# ---------------------------------------------------------------------------------------------- route blocks


def test_calling_a_population_inside_its_own_route_block_is_a_route_error():
    pop = population()
    x = torch.randn(3, 6)
    with pop.route(individuals=[0, 1, 2]):
        for call in (
            lambda: pop(x, individual=1),
            lambda: pop(x, individuals=[0, 1, 2]),
            lambda: pop(x, all_individuals=True, broadcast=True),
        ):
            with pytest.raises(RouteError, match="a population cannot be called inside one of its own route"):
                call()
        with pytest.raises(RouteError, match="do not nest"):
            with pop.route(individual=0):
                pass
    assert issubclass(RouteError, PopuloraError)
    with torch.no_grad():  # the block is undone: routed calls work again
        assert pop(x, individuals=[0, 1, 2]).shape == (3, 3)


# ---------------------------------------------------------------------------------------------- empty ids


@pytest.mark.parametrize("ids", [[], np.array([], dtype=np.int64), torch.tensor([], dtype=torch.long)])
def test_empty_individuals_on_a_non_empty_batch_names_individuals(ids):
    pop = population()
    with pytest.raises(RouteError) as info:
        pop(torch.randn(3, 6), individuals=ids)
    text = str(info.value)
    assert "`individuals=`" in text and "3 rows" in text and "empty" in text
    assert "divisible by 0" not in text  # no advice that cannot be followed


def test_empty_individuals_in_a_route_block_names_individuals():
    pop = population()
    with pytest.raises(RouteError) as info:
        with pop.route(individuals=[]):
            pop.model(torch.randn(3, 6))
    text = str(info.value)
    assert "`individuals=`" in text and "3 rows" in text and "empty" in text
    assert "k * 0" not in text


def test_ids_that_do_not_divide_the_batch_still_name_individuals():
    pop = population()
    with pytest.raises(RouteError, match=r"batch of 5 rows does not fit 2 individual ids of `individuals=`"):
        pop(torch.randn(5, 6), individuals=[0, 1])


# ---------------------------------------------------------------------------------------------- checkpoints


def test_a_state_of_another_target_set_names_the_targets_on_both_sides():
    source, pop = population(), population(["0"])
    before = pop.snapshot()
    with pytest.raises(CheckpointError, match=r"checkpoint has lora_targets=\['0', '2'\], this population has \['0'\]"):
        pop.load_state_dict(source.state_dict(include_model=False))
    _assert_unchanged(pop, before)


def test_a_state_of_another_target_set_without_extra_state_names_what_it_can():
    source, pop = population(), population(["0"])
    state = source.state_dict(include_model=False)
    del state["_extra_state"]
    before = pop.snapshot()
    with pytest.raises(CheckpointError) as info:
        pop.load_state_dict(state)
    text = str(info.value)
    assert "unexpected key" not in text
    # the state's side: its adapters by target index (no paths: it carries no config); this side: its paths
    assert "2 target(s)" in text and "target indices [0, 1]" in text and "'_downs.1'" in text
    assert "this population has 1: ['0']" in text and "no extra state" in text
    _assert_unchanged(pop, before)


def test_a_state_with_a_stack_missing_names_the_target_not_another_target_set():
    source, pop = population(), population()
    state = source.state_dict(include_model=False)
    del state["_ups.1"]
    before = pop.snapshot()
    with pytest.raises(CheckpointError) as info:
        pop.load_state_dict(state)
    text = str(info.value)
    assert "another lora_targets" not in text
    assert "'_ups.1'" in text and "up adapter of '2'" in text
    _assert_unchanged(pop, before)


def test_a_state_with_a_stack_beyond_its_own_config_names_both():
    source, pop = population(), population()
    state = source.state_dict(include_model=False)
    state["_downs.2"], state["_ups.2"] = state["_downs.1"].clone(), state["_ups.1"].clone()
    before = pop.snapshot()
    with pytest.raises(CheckpointError) as info:
        pop.load_state_dict(state)
    text = str(info.value)
    assert "3 target(s)" in text and "['0', '2']" in text and "'_downs.2'" in text
    _assert_unchanged(pop, before)


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_a_file_of_another_target_set_names_the_file_and_both_target_sets(tmp_path, fmt):
    if fmt == "safetensors":
        pytest.importorskip("safetensors")
    path = population().save(tmp_path / f"pop.{fmt}", format=fmt)
    pop = population(["2"])
    before = pop.snapshot()
    with pytest.raises(CheckpointError) as info:
        pop.load(path)
    text = str(info.value)
    assert str(path) in text and "['0', '2']" in text and "['2']" in text
    _assert_unchanged(pop, before)


def _assert_unchanged(pop: Population, before: dict) -> None:
    after = pop.snapshot()
    assert after.keys() == before.keys()
    for key in before:
        if isinstance(before[key], torch.Tensor):
            assert torch.equal(after[key], before[key]), key
    assert torch.equal(after["_extra_state"]["generator"], before["_extra_state"]["generator"])


def test_generate_on_a_model_without_generate_names_the_class_and_what_is_needed():
    from populora.errors import InvalidTypeError

    pop = Population(mlp(), 3, 1, seed=0)
    with pytest.raises(
        InvalidTypeError, match=r"Sequential has none: routed generation needs a model with a Hugging Face"
    ):
        pop.generate(torch.zeros(2, 3, dtype=torch.long), all_individuals=True)
    with pytest.raises(InvalidTypeError, match=r"call the population itself, pop\(x, individuals=ids\)"):
        pop.generate(torch.zeros(2, 3, dtype=torch.long), individual=0)  # before the routing checks
