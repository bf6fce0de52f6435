"""Ratings at the edges of what openskill can compute: priors refused where they enter, loaded tables bounded,
pairing offsets of any size, and a batch of matches rated all or nothing."""

import math

import pytest
import torch

pytest.importorskip("openskill")

from populora.errors import CheckpointError, InvalidValueError
from populora.loops.ratings import MAX_MU_OVER_BETA, MAX_SCALE, MIN_SCALE, MODELS, Ratings


def tables(r: Ratings) -> dict:
    return {n: (r.mu(n), r.sigma(n), r.matches(n)) for n in r.sizes} | {"played": r.played}


def assert_tables_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a["played"] == b["played"]
    for name in a:
        if name != "played":
            assert all(torch.equal(x, y) for x, y in zip(a[name], b[name])), name


def play(r: Ratings, matches: int = 60) -> None:
    """``matches`` decisive matches among 3 + 3 players (the lowest id always wins): every rating moves far."""
    for k in range(matches):
        i, j = k % 3, (k // 3) % 3
        r.rate_(("a", i), ("b", j), 1.0 if i <= j else 0.0)


def assert_finite(r: Ratings) -> None:
    for name in r.sizes:
        assert bool(torch.isfinite(r.mu(name)).all()) and bool((r.sigma(name) > 0).all()), name


# ---------------------------------------------------------------------------------------------- priors


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(prior_mu=1e4), "prior_mu"),  # the example: PlackettLuce's exp(mu / c) overflows at once
        (dict(prior_mu=-1e4), "prior_mu"),  # exp(mu / c) underflows to 0: a division by zero
        (dict(prior_mu=MAX_MU_OVER_BETA * 25 / 6 * 1.01), "prior_mu"),
        (dict(prior_mu=100.0, beta=0.1), "prior_mu"),  # the bound scales with beta
        (dict(beta=1e200), "beta"),  # beta ** 2 overflows
        (dict(beta=1e-200, prior_sigma=1e-200), "prior_sigma"),  # sigma ** 2 + beta ** 2 underflows to 0
        (dict(prior_sigma=1e200), "prior_sigma"),
        (dict(tau=1e200), "tau"),  # sigma ** 2 + tau ** 2 overflows: NaN ratings
        (dict(beta=MAX_SCALE * 2), "beta"),
        (dict(beta=MIN_SCALE / 2), "beta"),
    ],
)
def test_a_prior_openskill_cannot_rate_is_refused_where_it_enters(kwargs, named):
    with pytest.raises(InvalidValueError, match=rf"`{named}` must be .*(\d|e)"):
        Ratings({"a": 3, "b": 3}, **kwargs)


def test_the_prior_mu_bound_names_the_bound_and_the_model():
    with pytest.raises(InvalidValueError) as info:
        Ratings({"a": 2}, prior_mu=1e4)
    text = str(info.value)
    assert "PlackettLuce" in text and "10000.0" in text and f"{MAX_MU_OVER_BETA:g}" in text


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_every_model_rates_at_the_edges_of_the_accepted_priors(model, sign):
    """The most extreme accepted prior of each kind still rates many decisive matches to finite ratings."""
    beta = 25 / 6
    mu_bound = MAX_MU_OVER_BETA * beta if model == "PlackettLuce" else 1e4 * beta
    cases = [
        dict(prior_mu=sign * mu_bound, beta=beta),
        dict(prior_mu=sign * mu_bound, beta=beta, prior_sigma=1e-3 * beta, tau=0.0),
        dict(prior_sigma=MAX_SCALE, beta=MAX_SCALE, tau=MAX_SCALE),
        dict(prior_mu=0.0, prior_sigma=MIN_SCALE, beta=MIN_SCALE, tau=0.0),
    ]
    for kwargs in cases:
        r = Ratings({"a": 3, "b": 3}, model=model, **kwargs)
        play(r)
        assert_finite(r)
        assert math.isfinite(r.win_probability(("a", 0), ("b", 2)))


@pytest.mark.parametrize("model", [m for m in MODELS if m != "PlackettLuce"])
def test_models_without_an_absolute_exponential_take_a_large_prior_mu(model):
    r = Ratings({"a": 3, "b": 3}, model=model, prior_mu=1e4)
    play(r, 12)
    assert_finite(r)


# ---------------------------------------------------------------------------------------------- loaded tables


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("mu", 1e300, "mu"),
        ("sigma", 1e200, "sigma"),
        ("sigma", 1e-200, "sigma"),
    ],
)
def test_a_loaded_rating_beyond_what_openskill_can_rate_is_refused(key, value, match):
    r = Ratings({"a": 3, "b": 3})
    play(r, 6)
    before = tables(r)
    state = r.state_dict()
    state[key]["a"][1] = value
    with pytest.raises(CheckpointError, match=rf"{match}\['a'\]"):
        r.load_state_dict(state)
    assert_tables_equal(tables(r), before)


# ---------------------------------------------------------------------------------------------- rating


def test_rate_many_is_all_or_nothing_when_openskill_cannot_rate_a_match():
    """A match openskill cannot compute (BradleyTerry's exp of a huge mu difference) is refused with a populora
    error naming the players, and the matches before it in the batch are undone."""
    r = Ratings({"a": 3, "b": 3}, model="BradleyTerryFull")
    state = r.state_dict()
    state["mu"]["b"][2] = 25.0 + 1e5  # far beyond the others: exp((mu_a - mu_b) / c) overflows
    r.load_state_dict(state)
    before = tables(r)
    with pytest.raises(
        InvalidValueError, match=r"BradleyTerryFull cannot rate the match of \('a', 1\).*\('b', 2\)"
    ) as info:
        r.rate_many_("a", [0, 1, 2], "b", [0, 2, 1], [1.0, 0.0, 0.5])
    assert info.value.__cause__ is not None  # openskill's own error is chained
    assert_tables_equal(tables(r), before)
    with pytest.raises(InvalidValueError, match="BradleyTerryFull"):
        r.rate_(("a", 0), ("b", 2), 1.0)
    assert_tables_equal(tables(r), before)


# ---------------------------------------------------------------------------------------------- pairing


@pytest.mark.parametrize("offset", [2**63 - 1, 2**63, 2**64 + 5, 10**30 + 7])
def test_round_robin_takes_any_offset(offset):
    r = Ratings({"a": 4, "b": 3})
    gen = torch.Generator().manual_seed(0)
    assert r.pair("a", "b", gen, mode="round_robin", offset=offset).tolist() == [(i + offset) % 3 for i in range(4)]
    assert r.pair("a", "a", gen, mode="round_robin", offset=offset).tolist() == [
        (i + 1 + offset % 3) % 4 for i in range(4)
    ]
    # an offset is only ever used modulo the table size: the small equivalent gives the same pairs
    assert torch.equal(
        r.pair("a", "b", gen, mode="round_robin", offset=offset),
        r.pair("a", "b", gen, mode="round_robin", offset=offset % 3),
    )
