"""Name registries: registration, lookup errors with suggestions, option checking."""

from __future__ import annotations

import pytest
import torch

from populora.errors import InvalidTypeError, InvalidValueError
from populora.operators import (
    CROSSOVERS,
    MUTATIONS,
    PARENT_SELECTIONS,
    SELECTIONS,
    Factors,
    base,
    check_options,
    get_operator,
    option_names,
    register_crossover,
    register_mutation,
    register_parent_selection,
    register_selection,
)


@pytest.fixture(autouse=True)
def restore_registries():
    """Registrations made by a test never leak into the others."""
    saved = [dict(r) for r in (SELECTIONS, PARENT_SELECTIONS, CROSSOVERS, MUTATIONS)]
    validators = dict(base._VALIDATORS)
    yield
    base._VALIDATORS.clear()
    base._VALIDATORS.update(validators)
    for registry, before in zip((SELECTIONS, PARENT_SELECTIONS, CROSSOVERS, MUTATIONS), saved):
        registry.clear()
        registry.update(before)


def test_builtin_names():
    """Keys are the function names, and every spec operator is there."""
    assert set(SELECTIONS) == {"deterministic", "probabilistic", "fuss"}
    assert set(PARENT_SELECTIONS) == {"tournament", "roulette", "fuss", "queen_bee"}
    assert set(CROSSOVERS) == {"average", "average_delta", "dare", "layer_wise", "svd_subspace", "extrapolative", "xes"}
    assert set(MUTATIONS) == {
        "svd_structured",
        "layer_selective_gaussian",
        "component_masking",
        "full_gaussian",
        "neftune_style",
    }
    for registry in (SELECTIONS, PARENT_SELECTIONS, CROSSOVERS, MUTATIONS):
        assert all(fn.__name__ == name for name, fn in registry.items())


def test_register_directly_and_as_decorator():
    def keep_first(fitnesses, num, *, generator):
        return torch.arange(num).expand(fitnesses.shape[0], num)

    assert register_selection("keep_first", keep_first) is keep_first
    assert get_operator("selection", "keep_first") is keep_first

    @register_mutation("identity")
    def identity(factors, *, epsilon, weight_scales, generator):
        return [Factors(f.down.clone(), f.up.clone()) for f in factors]

    assert MUTATIONS["identity"] is identity
    out = get_operator("mutation", "identity")(
        [Factors(torch.ones(2, 3, 1), torch.ones(2, 4, 1))],
        epsilon=0.1,
        weight_scales=[1.0],
        generator=torch.Generator(),
    )
    assert torch.equal(out[0].down, torch.ones(2, 3, 1))


def test_mutation_with_floors_instead_of_weight_scales_is_refused():
    """`floors` is no keyword the population passes: a mutation without `weight_scales` is refused like any."""

    def old_style(factors, *, epsilon, floors, generator):
        return [Factors(f.down * 2, f.up) for f in factors]

    message = r"mutation 'old_style' must accept the keyword argument\(s\) \['weight_scales'\]; its signature is"
    with pytest.raises(InvalidTypeError, match=message):
        register_mutation("old_style", old_style)
    with pytest.raises(InvalidTypeError, match=message):
        register_mutation("old_style")(old_style)
    assert "old_style" not in MUTATIONS


def test_duplicate_needs_overwrite():
    def mine(stacks, parents, *, fitnesses, generator, num_groups=1):
        return []

    with pytest.raises(InvalidValueError, match="crossover 'average' is already registered; pass `overwrite=True`"):
        register_crossover("average", mine)
    register_crossover("average", mine, overwrite=True)
    assert CROSSOVERS["average"] is mine


def test_registration_checks_the_callable():
    with pytest.raises(InvalidTypeError, match=r"must accept the keyword argument\(s\) \['num_groups'\]"):
        register_crossover("bad", lambda stacks, parents, *, fitnesses, generator: [])
    with pytest.raises(InvalidTypeError, match="must be callable"):
        register_parent_selection("bad", 3)
    with pytest.raises(InvalidTypeError, match="non-empty str"):
        register_selection("", lambda f, n, *, generator: f)
    register_parent_selection("anything", lambda *a, **kw: None)  # **kwargs accepts every keyword


def test_unknown_name_lists_and_suggests():
    with pytest.raises(
        InvalidValueError,
        match=r"Unknown mutation `ful_gaussian`; available: \['component_masking', 'full_gaussian', "
        r"'layer_selective_gaussian', 'neftune_style', 'svd_structured'\]\. Did you mean `full_gaussian`\?",
    ):
        get_operator("mutation", "ful_gaussian")
    with pytest.raises(InvalidValueError, match=r"Unknown crossover `zzz`; available: \[.*'xes'\]\.$"):
        get_operator("crossover", "zzz")


def test_unknown_kind():
    with pytest.raises(
        InvalidValueError,
        match=r"`kind` must be one of \['crossover', 'mutation', 'parent_selection', "
        r"'selection'\], got 'mutations'",
    ):
        get_operator("mutations", "full_gaussian")


def test_option_names_come_from_the_signature():
    assert option_names("crossover", "xes") == ["eta", "tournament_size"]
    assert option_names("crossover", "average") == []
    assert option_names("parent_selection", "tournament") == ["tournament_size"]
    assert option_names("selection", "probabilistic") == ["temperature"]
    assert option_names("mutation", "component_masking") == ["rho"]


def test_check_options_unknown_keyword():
    with pytest.raises(
        InvalidTypeError,
        match=r"parent_selection `tournament` got unexpected option\(s\) \['tournament_sise'\]; "
        r"accepted options: \['tournament_size'\]",
    ):
        check_options("parent_selection", "tournament", {"tournament_sise": 4})
    with pytest.raises(InvalidTypeError, match=r"option\(s\) \['epsilon'\] are passed by the population itself"):
        check_options("mutation", "full_gaussian", {"epsilon": 0.2})
    with pytest.raises(InvalidTypeError, match="must be a dict, got list"):
        check_options("mutation", "full_gaussian", [("rho", 1)])
    with pytest.raises(InvalidValueError, match="Did you mean `dare`"):
        check_options("crossover", "dara", {})


def test_check_options_accepts_good_options_without_running_the_operator():
    calls = []

    @register_crossover("spy")
    def spy(stacks, parents, *, fitnesses, generator, num_groups=1, strength=1.0):
        calls.append(1)
        return []

    assert check_options("crossover", "spy", {"strength": 2.0}) is spy
    assert check_options("crossover", "spy", None) is spy
    assert check_options("crossover", "dare", {"drop_rate": 0.5}) is CROSSOVERS["dare"]
    assert calls == []


def test_check_options_with_var_keywords():
    register_mutation("loose", lambda factors, **kw: factors)
    check_options("mutation", "loose", {"whatever": 1})


@pytest.mark.parametrize(
    "kind,name,options,error,message",
    [
        ("mutation", "component_masking", {"rho": 2}, InvalidValueError, r"`rho` must be in \[0, 1\], got 2"),
        (
            "mutation",
            "layer_selective_gaussian",
            {"fraction": 0.0},
            InvalidValueError,
            r"`fraction` must be in \(0, 1\]",
        ),
        (
            "parent_selection",
            "tournament",
            {"tournament_size": "3"},
            InvalidTypeError,
            "`tournament_size` must be an int >= 1, got str '3'",
        ),
        ("parent_selection", "queen_bee", {"tournament_size": 0}, InvalidValueError, "must be an int >= 1, got 0"),
        ("parent_selection", "roulette", {"temperature": float("nan")}, InvalidValueError, "`temperature` must be > 0"),
        ("selection", "probabilistic", {"temperature": -1}, InvalidValueError, "`temperature` must be > 0, got -1"),
        ("crossover", "dare", {"drop_rate": 1.0}, InvalidValueError, r"`drop_rate` must be in \[0, 1\), got 1.0"),
        ("crossover", "extrapolative", {"eta_min": 2.0}, InvalidValueError, r"`eta_max` must be >= `eta_min` \(2.0\)"),
        ("crossover", "xes", {"eta": True}, InvalidTypeError, "`eta` must be a real number"),
        ("crossover", "dare", {"drop_rate": "0.5"}, InvalidTypeError, "`drop_rate` must be a real number"),
    ],
)
def test_check_options_validates_values_before_running(kind, name, options, error, message):
    """A bad option value is caught by check_options, before the population changes anything."""
    with pytest.raises(error, match=message):
        check_options(kind, name, options)


def test_custom_validator_runs_in_check_options():
    def positive(strength=1.0):
        if strength <= 0:
            raise ValueError(f"`strength` must be > 0, got {strength}")

    @register_crossover("strong", validate=positive)
    def strong(stacks, parents, *, fitnesses, generator, num_groups=1, strength=1.0):
        return []

    check_options("crossover", "strong", {"strength": 2.0})
    with pytest.raises(ValueError, match="`strength` must be > 0, got -1"):
        check_options("crossover", "strong", {"strength": -1})
    register_crossover("strong", strong, overwrite=True)  # re-registered without: the old validator goes
    check_options("crossover", "strong", {"strength": -1})
