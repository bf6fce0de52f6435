"""ES names say individuals (deprecated member names still work, with a warning), epoch, and es.history."""

import math

import pytest
import torch
from torch import nn

import populora.es as pes
import populora.es.shaping as es_shaping
from populora import EggrollES, TorchEggrollES
from populora.errors import CheckpointError, InvalidValueError
from populora.es import Individuals
from populora.stats import GenerationStats


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def make(**kwargs):
    return EggrollES(mlp(), pop_size=6, sigma=0.1, lr=0.05, rank=2, seed=4, **kwargs)


def mse(out, target):
    return (out - target).square().mean()


def test_member_params_is_a_deprecated_name_of_individual_params():
    es = make()
    new = es.individual_params(3)
    with pytest.warns(DeprecationWarning, match="member_params is deprecated: use individual_params"):
        old = es.member_params(3)
    assert new.keys() == old.keys() and all(torch.equal(new[k], old[k]) for k in new)


def test_per_member_is_a_deprecated_name_of_per_individual():
    xs, ys = torch.randn(6, 2, 5), torch.zeros(6, 2, 3)
    es = make()
    new_out = es.ask()(xs, per_individual=True)
    with pytest.warns(DeprecationWarning, match="`per_member=` is deprecated: use `per_individual=`"):
        old_out = es.ask()(xs, per_member=True)
    assert torch.equal(new_out, old_out)
    new = es.losses(xs, mse, ys, per_individual=True)
    with pytest.warns(DeprecationWarning, match="per_member"):
        old = es.losses(xs, mse, ys, per_member=True)
    assert torch.equal(new, old)
    a, b = make(), make()
    a.step(xs, mse, ys, per_individual=True)
    with pytest.warns(DeprecationWarning, match="per_member"):
        b.step(xs, mse, ys, per_member=True)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    with pytest.raises(InvalidValueError, match="not both"), pytest.warns(DeprecationWarning):
        es.losses(xs, mse, ys, per_individual=True, per_member=True)


def test_members_keyword_of_perturbations_and_population_params_is_deprecated():
    es = make()
    with pytest.warns(DeprecationWarning, match="`members=` is deprecated: use `individuals=`"):
        old = es.perturbations(members=[1, 4])
    new = es.perturbations(individuals=[1, 4])
    assert all(torch.equal(new[k], old[k]) for k in new)
    with pytest.warns(DeprecationWarning, match="`members=`"):
        old = es.population_params(members=[2])
    new = es.population_params([2])
    assert all(torch.equal(new[k], old[k]) for k in new)


def test_members_class_is_a_deprecated_name_of_individuals():
    with pytest.warns(DeprecationWarning, match="Members is deprecated"):
        cls = pes.Members
    assert cls is Individuals and isinstance(make().ask(), cls)
    with pytest.warns(DeprecationWarning, match="Members is deprecated"):
        from populora.es.members import Members
    assert Members is Individuals


def test_best_member_is_a_deprecated_name_of_best_individual():
    es = make()
    es.tell(torch.arange(6.0))
    assert es.best_individual == (0, 5)
    with pytest.warns(DeprecationWarning, match="best_member is deprecated: use best_individual"):
        assert es.best_member == (0, 5)


def test_epoch_means_the_step_count_the_noise_epoch_is_noise_epoch():
    es = make(noise_reuse=2)
    for _ in range(3):
        es.tell(torch.randn(6))
    assert (es.generation, es.noise_epoch) == (3, 1)
    with pytest.warns(DeprecationWarning, match="noise_epoch"):
        assert es.epoch == 1  # the old meaning, for one release
    tegg = TorchEggrollES(mlp(), pop_size=4)
    tegg.step(torch.randn(2, 5), mse, torch.zeros(2, 3))
    assert tegg.epoch == tegg.es.generation == 1  # torcheggroll's epoch: steps taken


# --------------------------------------------------------------------------------------- history


def test_tell_and_step_record_the_history():
    es = make()
    fits = [torch.randn(6, dtype=torch.float64) for _ in range(2)]
    stats = [es.tell(f) for f in fits]
    stats.append(es.step(torch.randn(4, 5), mse, torch.zeros(4, 3)))
    assert [h.generation for h in es.history] == [0, 1, 2]
    assert all(isinstance(h, GenerationStats) for h in es.history)
    for h, s in zip(es.history, stats):
        assert (h.best, h.mean) == (s.best, s.mean)
    for h, f in zip(es.history, fits):
        assert h.std == pytest.approx(float(f.std(correction=0)))


def test_history_is_in_the_state_and_old_states_load_with_an_empty_one(tmp_path):
    es = make()
    for _ in range(2):
        es.tell(torch.randn(6))
    state = es.state_dict()
    assert state["history"] == [[h.generation, h.best, h.mean, h.std] for h in es.history]
    other = make()
    other.load_state_dict(state)
    assert other.history == es.history
    other.load(es.save(tmp_path / "es.ckpt"))
    assert other.history == es.history
    old = dict(state)
    del old["history"]  # written before the history existed
    fresh = make()
    fresh.load_state_dict(old)
    assert fresh.history == [] and fresh.generation == 2


@pytest.mark.parametrize(
    "bad", ["x", [[0, 1.0, 0.5]], [[0, 1.0, 0.5, -1.0]], [[-1, 1.0, 0.5, 0.1]], [[0, 1.0, 0.5, math.nan]]]
)
def test_a_bad_history_raises_and_changes_nothing(bad):
    es = make()
    es.tell(torch.randn(6))
    state = es.state_dict()
    state["history"] = bad
    other = make()
    with pytest.raises(CheckpointError, match="bad 'history'"):
        other.load_state_dict(state)
    assert other.generation == 0 and other.history == []


def test_tell_validates_fitnesses_once_through_the_shared_validation(monkeypatch):
    calls = []
    original = es_shaping.validate_fitnesses
    monkeypatch.setattr(es_shaping, "validate_fitnesses", lambda *a, **k: calls.append(1) or original(*a, **k))
    es = make()
    es.step(torch.randn(4, 5), mse, torch.zeros(4, 3))
    assert len(calls) == 1
