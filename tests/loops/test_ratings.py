"""Ratings (openskill underneath): updates, win probabilities, PFSP pairing, follow_ through evolve_, checkpoints."""

import math
import sys

import pytest
import torch
from models import mlp

pytest.importorskip("openskill")

from populora import Population
from populora.checkpoint import atomic_save, load_checkpoint
from populora.errors import CheckpointError, InvalidIndexError, InvalidTypeError, InvalidValueError
from populora.loops.ratings import MODELS, Ratings
from populora.operators.selection import SelectionResult


def snapshot(r):
    return {n: (r.mu(n), r.sigma(n), r.matches(n)) for n in r.sizes}, r.played


def assert_same(a, b):
    (ta, pa), (tb, pb) = a, b
    assert pa == pb and ta.keys() == tb.keys()
    for n in ta:
        for x, y in zip(ta[n], tb[n]):
            assert torch.equal(x, y), n


def with_mu(r, name, mu, sigma=None):
    """Set ``name``'s ratings through the checkpoint path (the only writer besides matches)."""
    state = r.state_dict()
    state["mu"][name] = torch.tensor(mu, dtype=torch.float64)
    if sigma is not None:
        state["sigma"][name] = torch.full((len(mu),), float(sigma), dtype=torch.float64)
    r.load_state_dict(state)
    return r


# ------------------------------------------------------------------ updates
@pytest.mark.parametrize("model", MODELS)
def test_decisive_match_moves_winner_up_loser_down_and_shrinks_sigma(model):
    r = Ratings({"t": 2, "s": 3}, model=model)
    r.rate_(("t", 1), ("s", 2), 1.0)
    mu_t, mu_s, sig_t, sig_s = r.mu("t"), r.mu("s"), r.sigma("t"), r.sigma("s")
    assert mu_t[1] > 25.0 and mu_s[2] < 25.0
    assert sig_t[1] < 25 / 3 and sig_s[2] < 25 / 3
    # the others are untouched, bit for bit
    assert mu_t[0] == 25.0 and sig_t[0] == 25 / 3 and torch.all(mu_s[:2] == 25.0)
    assert r.matches("t").tolist() == [0, 1] and r.matches("s").tolist() == [0, 0, 1] and r.played == 1
    r.rate_(("s", 0), ("t", 0), 0.0)  # score 0: b (t0) won
    assert r.mu("t")[0] > 25.0 and r.mu("s")[0] < 25.0


@pytest.mark.parametrize("model", MODELS)
def test_draw_moves_ratings_toward_each_other(model):
    r = with_mu(Ratings({"p": 2}, model=model), "p", [30.0, 20.0], sigma=4.0)
    r.rate_(("p", 0), ("p", 1), 0.5)
    mu = r.mu("p")
    assert 20.0 < mu[1] < mu[0] < 30.0
    assert torch.all(r.sigma("p") < 4.0 + 1e-9)


def test_draw_between_equals_keeps_mu_and_is_symmetric():
    r = Ratings({"p": 2})
    r.rate_(("p", 0), ("p", 1), 0.5)
    mu = r.mu("p")
    assert mu[0] == pytest.approx(25.0, abs=1e-9) and mu[1] == pytest.approx(25.0, abs=1e-9)
    assert r.sigma("p")[0] < 25 / 3


def test_many_wins_rank_a_player_first():
    r = Ratings({"p": 4})
    for _ in range(5):
        for i in range(4):
            for j in range(i + 1, 4):
                # player 2 beats everyone; others draw among themselves
                score = 1.0 if i == 2 else 0.0 if j == 2 else 0.5
                r.rate_(("p", i), ("p", j), score)
    assert int(torch.argmax(r.ordinal("p"))) == 2 and int(torch.argmax(r.mu("p"))) == 2
    assert r.summary("p")["best"] == 2
    assert r.win_probability(("p", 2), ("p", 0)) > 0.9


def test_fractional_scores_interpolate_between_openskill_outcomes():
    base = with_mu(Ratings({"a": 1, "b": 1}), "a", [27.0], sigma=5.0)

    def after(score):
        r = Ratings({"a": 1, "b": 1})
        r.load_state_dict(base.state_dict())
        r.rate_(("a", 0), ("b", 0), score)
        return torch.cat([r.mu("a"), r.sigma("a"), r.mu("b"), r.sigma("b")])

    win, draw, loss = after(1.0), after(0.5), after(0.0)
    assert torch.allclose(after(0.75), 0.5 * draw + 0.5 * win, rtol=0, atol=1e-12)
    assert torch.allclose(after(0.25), 0.5 * loss + 0.5 * draw, rtol=0, atol=1e-12)
    assert torch.allclose(after(0.9), 0.2 * draw + 0.8 * win, rtol=0, atol=1e-12)
    mus = [after(s)[0].item() for s in (0.0, 0.1, 0.3, 0.5, 0.6, 0.8, 1.0)]
    assert mus == sorted(mus) and mus[0] < mus[-1]
    assert win[0] > draw[0] > loss[0] and win[2] < draw[2] < loss[2]


def test_rate_many_equals_the_same_matches_one_by_one():
    a, b = Ratings({"t": 3, "s": 4}), Ratings({"t": 3, "s": 4})
    ids_t, ids_s, scores = [0, 1, 2, 0, 2], [3, 3, 1, 0, 2], [1.0, 0.0, 0.5, 0.25, 1.0]
    a.rate_many_("t", torch.tensor(ids_t), "s", torch.tensor(ids_s), torch.tensor(scores, dtype=torch.float64))
    for x, y, s in zip(ids_t, ids_s, scores):
        b.rate_(("t", x), ("s", y), s)
    assert_same(snapshot(a), snapshot(b))
    assert a.played == 5 and a.matches("t").tolist() == [2, 1, 2]


def test_win_probability_favours_the_stronger_and_matches_the_matrix():
    r = with_mu(Ratings({"t": 3, "s": 2}), "t", [20.0, 25.0, 32.0])
    p = r.win_probability(("t", 2), ("s", 0))
    assert p > 0.5 and r.win_probability(("t", 0), ("s", 0)) < 0.5
    assert r.win_probability(("t", 1), ("s", 1)) == pytest.approx(0.5, abs=1e-12)
    assert p + r.win_probability(("s", 0), ("t", 2)) == pytest.approx(1.0, abs=1e-12)
    m = r.win_matrix("t", "s")
    assert m.shape == (3, 2) and m.dtype == torch.float64
    assert m[2, 0].item() == p and torch.all(m[:, 0].diff() > 0)
    # openskill's formula for two single players: Phi((mu_a - mu_b) / sqrt(2 beta^2 + sa^2 + sb^2))
    z = (32.0 - 25.0) / math.sqrt(2 * (25 / 6) ** 2 + 2 * (25 / 3) ** 2)
    assert p == pytest.approx(0.5 * (1 + math.erf(z / math.sqrt(2))), abs=1e-12)


def test_same_matches_give_bitwise_identical_ratings():
    runs = []
    for _ in range(2):
        r = Ratings({"t": 4, "s": 4}, model="ThurstoneMostellerFull")
        g = torch.Generator().manual_seed(3)
        for _ in range(3):
            opp = r.pair("t", "s", g)
            r.rate_many_("t", list(range(4)), "s", opp, torch.rand(4, generator=g))
        runs.append(snapshot(r))
    assert_same(*runs)


# ------------------------------------------------------------------ pairing
def spread():
    """500 identical players of "a" (mu 25, sigma 2) against opponents of mu 25, 31, 40, 10."""
    r = Ratings({"a": 500, "b": 4})
    with_mu(r, "a", [25.0] * 500, sigma=2.0)
    return with_mu(r, "b", [25.0, 31.0, 40.0, 10.0], sigma=2.0)


@pytest.mark.parametrize("mode", ["pfsp", "pfsp_hard"])
def test_pfsp_frequencies_follow_the_documented_weights(mode):
    r = spread()
    p = r.win_matrix("a", "b")[0]  # P(a beats b_j)
    w = p * (1 - p) if mode == "pfsp" else (1 - p) ** 2
    expected = w / w.sum()
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4, dtype=torch.float64)
    for _ in range(8):
        counts += torch.bincount(r.pair("a", "b", g, mode=mode), minlength=4)
    freq = counts / counts.sum()
    tol = 4 * torch.sqrt(expected * (1 - expected) / counts.sum()) + 1e-3
    assert torch.all((freq - expected).abs() <= tol), (freq, expected)
    if mode == "pfsp":  # the balanced opponent (mu 25) most, the far ones (40, 10) rarely
        assert int(torch.argmax(counts)) == 0 and freq[2] < 0.05 and freq[3] < 0.05
        assert freq[0] > freq[1] > freq[2]
    else:  # the strongest opponent most
        assert int(torch.argmax(counts)) == 2 and freq[3] < 0.01


def test_uniform_pairing_is_uniform():
    r = spread()
    g = torch.Generator().manual_seed(1)
    counts = sum(torch.bincount(r.pair("a", "b", g, mode="uniform"), minlength=4) for _ in range(8))
    freq = counts.double() / counts.sum()
    assert torch.all((freq - 0.25).abs() < 4 * math.sqrt(0.25 * 0.75 / 4000))


@pytest.mark.parametrize("mode", ["pfsp", "pfsp_hard", "uniform"])
def test_pairing_is_reproducible_from_the_generator(mode):
    r = with_mu(Ratings({"t": 6, "s": 5}), "s", [20.0, 24.0, 25.0, 27.0, 33.0])
    x = r.pair("t", "s", torch.Generator().manual_seed(7), mode=mode)
    y = r.pair("t", "s", torch.Generator().manual_seed(7), mode=mode)
    assert x.shape == (6,) and x.dtype == torch.int64 and torch.equal(x, y)
    assert torch.all((x >= 0) & (x < 5))
    draws = {tuple(r.pair("t", "s", torch.Generator().manual_seed(s), mode=mode).tolist()) for s in range(6)}
    assert len(draws) > 1  # the seed matters
    g = torch.Generator().manual_seed(7)
    r.pair("t", "s", g, mode=mode)
    assert not torch.equal(g.get_state(), torch.Generator().manual_seed(7).get_state())  # it draws from g


@pytest.mark.parametrize("mode", ["pfsp", "pfsp_hard", "uniform", "round_robin"])
def test_pairing_within_one_population_never_picks_oneself(mode):
    r = with_mu(Ratings({"p": 5}), "p", [10.0, 20.0, 25.0, 30.0, 40.0])
    g = torch.Generator().manual_seed(0)
    ids = torch.arange(5)
    for offset in range(6):
        opp = r.pair("p", "p", g, mode=mode, offset=offset)
        assert torch.all(opp != ids) and torch.all((opp >= 0) & (opp < 5))
    two = Ratings({"p": 2})
    assert two.pair("p", "p", g, mode=mode).tolist() == [1, 0]


def test_round_robin_is_deterministic_and_rotates():
    r = Ratings({"t": 5, "s": 3, "p": 4})
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    assert r.pair("t", "s", g, mode="round_robin").tolist() == [0, 1, 2, 0, 1]
    assert r.pair("t", "s", g, mode="round_robin", offset=1).tolist() == [1, 2, 0, 1, 2]
    assert r.pair("p", "p", g, mode="round_robin").tolist() == [1, 2, 3, 0]
    assert r.pair("p", "p", g, mode="round_robin", offset=1).tolist() == [2, 3, 0, 1]
    assert r.pair("p", "p", g, mode="round_robin", offset=3).tolist() == [1, 2, 3, 0]
    assert torch.equal(g.get_state(), state)  # no randomness used


def test_pfsp_falls_back_to_uniform_when_every_weight_vanishes():
    r = Ratings({"a": 1, "b": 3})
    with_mu(r, "a", [1e6], sigma=1.0)  # a beats everyone surely: p = 1, p (1 - p) = 0
    assert torch.all(r.win_matrix("a", "b") == 1.0)
    seen = {int(r.pair("a", "b", torch.Generator().manual_seed(s))) for s in range(40)}
    assert seen == {0, 1, 2}


def test_pairing_rejects_bad_arguments():
    r = Ratings({"t": 2, "one": 1})
    g = torch.Generator()
    with pytest.raises(InvalidValueError, match="`mode` must be one of .*'pfsp'.*got 'best'"):
        r.pair("t", "t", g, mode="best")
    with pytest.raises(InvalidValueError, match="'one' has a single individual"):
        r.pair("one", "one", g)
    with pytest.raises(InvalidTypeError, match="`generator` must be a torch.Generator, got int"):
        r.pair("t", "one", 0)
    with pytest.raises(
        InvalidValueError, match=r"`name_b` must be one of the rated populations \['t', 'one'\], got 'x'"
    ):
        r.pair("t", "x", g)
    with pytest.raises(InvalidValueError, match="`offset` must be an int >= 0, got -1"):
        r.pair("t", "one", g, mode="round_robin", offset=-1)


# ------------------------------------------------------------------ follow_
def evolved(pop_size=8, seed=0):
    torch.manual_seed(0)
    pop = Population(mlp(), pop_size=pop_size, low_rank=2, seed=seed, init_scale=0.5)
    fitness = torch.arange(pop_size, dtype=torch.float32).flip(0)  # ids 0.. best first
    return pop, pop.evolve_(fitness, survive_frac=0.5, elite_frac=0.25)


def played_ratings(inherit):
    r = Ratings({"pop": 8, "other": 3}, inherit=inherit)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        r.rate_many_(
            "pop", list(range(8)), "other", r.pair("pop", "other", g, mode="uniform"), torch.rand(8, generator=g)
        )
    return r


def test_follow_resets_exactly_the_culled_slots():
    pop, result = evolved()
    culled = result.selected_out_indices.tolist()
    assert culled == [4, 5, 6, 7]  # fitness 7..0: ids 4..7 are the worst
    r = played_ratings("reset")
    before = snapshot(r)
    r.follow_("pop", result)
    kept = result.selected_in_indices
    assert torch.all(r.mu("pop")[culled] == 25.0) and torch.all(r.sigma("pop")[culled] == 25 / 3)
    assert torch.all(r.matches("pop")[culled] == 0)
    (old, _), (new, _) = before, snapshot(r)
    for x, y in zip(old["pop"], new["pop"]):
        assert torch.equal(x[kept], y[kept])  # survivors and elites keep their ratings
    for x, y in zip(old["other"], new["other"]):
        assert torch.equal(x, y)
    assert not torch.all(old["pop"][0][culled] == 25.0)  # they had moved before


def test_follow_mean_gives_children_the_survivors_mean_and_the_prior_sigma():
    _, result = evolved()
    r = played_ratings("mean")
    mu_before = r.mu("pop")
    r.follow_("pop", result)
    culled, kept = result.selected_out_indices, result.selected_in_indices
    expected = float(mu_before[kept].mean())
    assert torch.all(r.mu("pop")[culled] == expected) and torch.all(r.sigma("pop")[culled] == 25 / 3)
    assert torch.equal(r.mu("pop")[kept], mu_before[kept])


def test_follow_rejects_a_result_of_another_population_before_changing_anything():
    _, result = evolved(pop_size=6)
    r = played_ratings("reset")
    before = snapshot(r)
    with pytest.raises(InvalidValueError, match=r"does not partition the 8 ids of 'pop'"):
        r.follow_("pop", result)
    _, big = evolved(pop_size=12)
    with pytest.raises(InvalidIndexError, match=r"result.selected_(in|out)_indices\[\d+\]` must be an id in \[0, 8\)"):
        r.follow_("pop", big)
    with pytest.raises(InvalidTypeError, match="must be the SelectionResult returned by evolve_, got tuple"):
        r.follow_("pop", tuple(result))
    with pytest.raises(InvalidValueError, match="got 'nope'"):
        r.follow_("nope", result)
    assert_same(before, snapshot(r))


def test_follow_with_nothing_culled_changes_nothing():
    r = played_ratings("reset")
    before = snapshot(r)
    ids = torch.arange(8)
    r.follow_("pop", SelectionResult(ids, ids[:0], ids[:2]))
    assert_same(before, snapshot(r))


def test_reset_sets_the_prior():
    r = played_ratings("reset")
    r.reset_("pop", [1, 3])
    assert r.mu("pop")[[1, 3]].tolist() == [25.0, 25.0] and r.matches("pop")[[1, 3]].tolist() == [0, 0]
    with pytest.raises(InvalidIndexError, match=r"`ids\[1\]` must be an id in \[0, 8\), got 8"):
        r.reset_("pop", [0, 8])


# ------------------------------------------------------------------ checkpoints
def test_state_dict_round_trip_is_exact_and_a_snapshot():
    r = played_ratings("mean")
    state = r.state_dict()
    twin = Ratings({"pop": 8, "other": 3}, inherit="mean")
    twin.load_state_dict(state)
    assert_same(snapshot(r), snapshot(twin))
    r.rate_(("pop", 0), ("other", 0), 1.0)  # the snapshot shares no storage
    twin2 = Ratings({"pop": 8, "other": 3}, inherit="mean")
    twin2.load_state_dict(state)
    assert_same(snapshot(twin), snapshot(twin2))
    assert repr(twin) == "Ratings(sizes={'pop': 8, 'other': 3}, model='PlackettLuce', inherit='mean', played=24)"


def test_checkpoint_file_round_trip_and_exact_resume(tmp_path):
    r = played_ratings("reset")
    path = atomic_save(r.state_dict(), tmp_path / "ratings.pt", kind="Ratings")
    twin = Ratings({"pop": 8, "other": 3})
    twin.load_state_dict(load_checkpoint(path, kind="Ratings"))
    assert_same(snapshot(r), snapshot(twin))
    r.save(tmp_path / "again.pt")
    third = Ratings({"pop": 8, "other": 3})
    third.load(tmp_path / "again.pt")
    # the resumed objects continue exactly like the original
    for x in (r, twin, third):
        g = torch.Generator().manual_seed(5)
        opp = x.pair("pop", "other", g)
        x.rate_many_("pop", list(range(8)), "other", opp, torch.rand(8, generator=g))
    assert_same(snapshot(r), snapshot(twin))
    assert_same(snapshot(r), snapshot(third))


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda s: s.update(format="other"), "not a Ratings state dict"),
        (lambda s: s.pop("mu"), r"missing \['mu'\]"),
        (
            lambda s: s["config"].update(model="BradleyTerryFull"),
            "checkpoint has model='BradleyTerryFull', these Ratings have 'PlackettLuce'",
        ),
        (lambda s: s["config"].update(sizes={"pop": 9, "other": 3}), "checkpoint has sizes="),
        (lambda s: s["config"].update(inherit="mean"), "checkpoint has inherit='mean'"),
        (lambda s: s["config"].update(tau=0.0), "checkpoint has tau=0.0"),
        (
            lambda s: s["mu"].update(pop=torch.zeros(8)),
            r"mu\['pop'\] must be a torch.float64 tensor of shape \(8,\), "
            "got torch.float32",
        ),
        (lambda s: s["sigma"].update(pop=torch.zeros(8, dtype=torch.float64)), r"sigma\['pop'\] has invalid values"),
        (lambda s: s["mu"].update(pop=torch.full((8,), math.nan, dtype=torch.float64)), r"mu\['pop'\] has invalid"),
        (lambda s: s["matches"].pop("other"), r"'matches' must map \['other', 'pop'\]"),
        (lambda s: s.update(played=-1), "bad 'played'"),
    ],
)
def test_load_state_dict_rejects_bad_states_before_changing_anything(change, match):
    r = played_ratings("reset")
    state = played_ratings("reset").state_dict()
    state["mu"]["pop"] += 1.0
    fresh = Ratings({"pop": 8, "other": 3})
    before = snapshot(fresh)
    change(state)
    with pytest.raises(CheckpointError, match=match):
        fresh.load_state_dict(state)
    assert_same(before, snapshot(fresh))
    assert r.played == 24


def test_load_names_the_file(tmp_path):
    path = Ratings({"a": 2}).save(tmp_path / "r.pt")
    with pytest.raises(CheckpointError, match=r"checkpoint '.*r\.pt': checkpoint has sizes=\{'a': 2\}"):
        Ratings({"a": 3}).load(path)


# ------------------------------------------------------------------ validation
def test_bad_matches_raise_typed_errors_before_any_change():
    r = played_ratings("reset")
    before = snapshot(r)
    with pytest.raises(InvalidValueError, match=r"`score` must be a finite number in \[0.0, 1.0\], got 1.5"):
        r.rate_(("pop", 0), ("other", 0), 1.5)
    with pytest.raises(InvalidValueError, match="got nan"):
        r.rate_(("pop", 0), ("other", 0), math.nan)
    with pytest.raises(InvalidTypeError, match="`score` must be a real number, got bool"):
        r.rate_(("pop", 0), ("other", 0), True)
    with pytest.raises(InvalidIndexError, match=r"`b\[1\]` must be an id in \[0, 3\), got 3"):
        r.rate_(("pop", 0), ("other", 3), 1.0)
    with pytest.raises(InvalidValueError, match=r"`a\[0\]` must be one of the rated populations .* got 'x'"):
        r.rate_(("x", 0), ("other", 0), 1.0)
    with pytest.raises(InvalidTypeError, match=r"`a` must be a \(population name, id\) tuple, got 'pop'"):
        r.rate_("pop", ("other", 0), 1.0)
    with pytest.raises(InvalidValueError, match=r"cannot play itself, got a == b == \('pop', 2\)"):
        r.rate_(("pop", 2), ("pop", 2), 1.0)
    # a bad entry late in a batch: the earlier matches are not rated either
    with pytest.raises(InvalidValueError, match=r"`scores\[2\]` must be a finite number in \[0.0, 1.0\], got -0.5"):
        r.rate_many_("pop", [0, 1, 2], "other", [0, 1, 2], [1.0, 0.0, -0.5])
    with pytest.raises(InvalidIndexError, match=r"`ids_a\[2\]` must be an id in \[0, 8\), got 9"):
        r.rate_many_("pop", [0, 1, 9], "other", [0, 1, 2], [1.0, 0.0, 0.5])
    with pytest.raises(InvalidValueError, match="same length, got 3, 2 and 3"):
        r.rate_many_("pop", [0, 1, 2], "other", [0, 1], [1.0, 0.0, 0.5])
    with pytest.raises(InvalidValueError, match=r"match 1 pairs \('pop', 4\) with itself"):
        r.rate_many_("pop", [0, 4], "pop", [1, 4], [1.0, 0.0])
    with pytest.raises(InvalidTypeError, match="`ids_b` must be a 1-D integer tensor, got torch.float32"):
        r.rate_many_("pop", [0], "other", torch.tensor([0.0]), [1.0])
    with pytest.raises(InvalidTypeError, match="`scores` must be a sequence or 1-D tensor"):
        r.rate_many_("pop", [0], "other", [0], 1.0)
    assert_same(before, snapshot(r))


def test_constructor_validates_its_arguments():
    with pytest.raises(InvalidValueError, match=r"`model` must be one of \['PlackettLuce', .*got 'TrueSkill'"):
        Ratings({"a": 2}, model="TrueSkill")
    with pytest.raises(InvalidValueError, match=r"`inherit` must be one of \['reset', 'mean'\], got 'parent'"):
        Ratings({"a": 2}, inherit="parent")
    with pytest.raises(InvalidValueError, match="at least one population"):
        Ratings({})
    with pytest.raises(InvalidValueError, match=r"`sizes\['a'\]` must be an int >= 1, got 0"):
        Ratings({"a": 0})
    with pytest.raises(InvalidTypeError, match="non-empty strings, got 3"):
        Ratings({3: 2})
    with pytest.raises(InvalidTypeError, match="`sizes` must be a mapping"):
        Ratings([("a", 2)])
    with pytest.raises(
        InvalidValueError, match=r"`prior_sigma` must be a finite number in \[1e-100, 1e\+100\], got 0.0"
    ):
        Ratings({"a": 2}, prior_sigma=0.0)


def test_priors_and_readers():
    r = Ratings({"a": 3}, prior_mu=10.0, prior_sigma=2.0, model="BradleyTerryPart")
    assert r.mu("a").tolist() == [10.0] * 3 and r.sigma("a").dtype == torch.float64
    assert r.ordinal("a").tolist() == [4.0] * 3
    r.mu("a")[0] = 99.0  # readers return copies
    assert r.mu("a")[0] == 10.0
    assert r.summary("a") == {
        "mu_mean": 10.0,
        "mu_max": 10.0,
        "sigma_mean": 2.0,
        "ordinal_mean": 4.0,
        "ordinal_best": 4.0,
        "best": 0,
    }


def test_missing_openskill_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "openskill.models", None)
    with pytest.raises(ImportError, match="pip install openskill"):
        Ratings({"a": 2})


def test_openskill_is_imported_only_when_ratings_are_built():
    import subprocess

    code = (
        "import sys, populora, populora.loops.ratings as m; assert 'openskill' not in sys.modules; "
        "m.Ratings({'a': 2}); assert 'openskill' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
