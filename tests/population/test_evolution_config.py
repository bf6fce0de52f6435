"""Evolution: evolve_'s options as one config (checked when built, JSON round trip, 0.5.0 keywords deprecated)."""

import dataclasses
import inspect
import json
import warnings

import pytest
import torch
from models import mlp

from populora import Population
from populora.errors import InvalidTypeError, InvalidValueError
from populora.population.evolution import EVOLVE_KEYWORDS, Evolution

P = 12
FITNESS = torch.tensor([3.0, -1.0, 7.0, 0.5, 2.0, 9.0, -4.0, 1.0, 6.0, 5.0, -2.0, 4.0])


def make():
    torch.manual_seed(0)
    return Population(mlp(), pop_size=P, low_rank=3, seed=0, init_scale=0.5)


def state(pop):
    return [t.clone() for f in pop.factors() for t in (f.down, f.up)] + [pop.generator.get_state()]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize(
    "fields, error, message",
    [
        ({"survive_frac": 1.0}, InvalidValueError, r"`Evolution\.survive_frac` must be a finite number in \(0, 1\)"),
        ({"elite_frac": -0.1}, InvalidValueError, r"`Evolution\.elite_frac`"),
        ({"num_groups": 0}, InvalidValueError, r"`Evolution\.num_groups` must be an int >= 1"),
        ({"num_parents_per_child": 0}, InvalidValueError, r"`Evolution\.num_parents_per_child`"),
        ({"mutation_type": "gauss"}, InvalidValueError, r"Unknown mutation `gauss`"),
        ({"crossover_kwargs": 3}, InvalidTypeError, r"`Evolution\.crossover_kwargs` must be a dict"),
        ({"mutation_kwargs": {"sigma": 1}}, InvalidTypeError, r"sigma"),
        ({"optimizer_state": "keep"}, InvalidValueError, r"`optimizer_state` must be one of"),
        ({"epsilon": -1.0}, InvalidValueError, r"`epsilon` must be >= 0"),
    ],
)
def test_a_bad_field_is_refused_when_built_and_named(fields, error, message):
    with pytest.raises(error, match=message):
        Evolution(**fields)
    with pytest.raises(error, match=message):
        dataclasses.replace(Evolution(), **fields)


def test_json_round_trip_and_replace():
    config = Evolution(crossover_type="layer_wise", mutation_kwargs={}, num_groups=2, epsilon=0.25)
    back = Evolution.from_dict(json.loads(json.dumps(config.to_dict())))
    assert back == config
    assert dataclasses.replace(config, epsilon=0.5).epsilon == 0.5 and config.epsilon == 0.25
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epsilon = 1.0  # type: ignore[misc]
    with pytest.raises(InvalidValueError, match="'epsilom'.*did you mean 'epsilon'"):
        Evolution.from_dict({"epsilom": 0.1})


def test_evolve_signature_is_within_the_cap_and_keeps_the_seed_keywords():
    params = [p for p in inspect.signature(Population.evolve_).parameters if p != "self"]
    assert len(params) <= 12, params
    for seed_keyword in ("survive_frac", "elite_frac", "mutation_type", "epsilon"):  # the seed README's
        assert seed_keyword in params
    assert set(params) - {"legacy"} <= set(EVOLVE_KEYWORDS) | {"fitnesses"}


def test_config_form_and_keyword_form_give_the_same_generation():
    a, b, c = make(), make(), make()
    config = Evolution(survive_frac=0.5, elite_frac=0.2, mutation_type="full_gaussian", epsilon=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither form warns
        a.evolve_(FITNESS, config)
        b.evolve_(FITNESS, survive_frac=0.5, elite_frac=0.2, mutation_type="full_gaussian", epsilon=0.2)
        c.evolve_(FITNESS, Evolution(epsilon=0.9, elite_frac=0.2), epsilon=0.2)  # a keyword overrides the config
    assert same(state(a), state(b)) and same(state(a), state(c))


def test_deprecated_flat_keywords_warn_and_give_the_same_result_bit_for_bit():
    legacy = dict(num_parents_per_child=3, crossover_kwargs={}, mutation_kwargs={}, optimizer_state="reset")
    old, new = make(), make()
    with pytest.warns(DeprecationWarning, match=r"config=Evolution\(num_parents_per_child=\.\.\."):
        old.evolve_(FITNESS, crossover_type="average", **legacy)
    new.evolve_(FITNESS, Evolution(crossover_type="average", **legacy))
    assert same(state(old), state(new)) and old.generation == new.generation == 1


def test_deprecated_keywords_keep_their_0_5_0_errors_and_a_typo_is_named():
    pop = make()
    before = state(pop)
    with pytest.raises(ValueError, match=r"`num_parents_per_child` must be an int >= 1, got 0"):
        pop.evolve_(FITNESS, num_parents_per_child=0)
    with pytest.raises(TypeError, match=r"'num_parent_per_child' \(did you mean 'num_parents_per_child'\?\)"):
        pop.evolve_(FITNESS, num_parent_per_child=2)
    with pytest.raises(InvalidTypeError, match="must be a Evolution"):
        pop.evolve_(FITNESS, {"epsilon": 0.1})
    assert same(state(pop), before) and pop.generation == 0
