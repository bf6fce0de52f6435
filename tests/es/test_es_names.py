"""ES names: the noise epoch is noise_epoch, epoch is TorchEggrollES's step count; tell's stats and es.history."""

import math

import pytest
import torch
from torch import nn

import populora.es.shaping as es_shaping
from populora import EggrollES, TorchEggrollES
from populora.errors import CheckpointError
from populora.stats import GenerationStats


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def make(**kwargs):
    return EggrollES(mlp(), pop_size=6, sigma=0.1, lr=0.05, rank=2, seed=4, **kwargs)


def mse(out, target):
    return (out - target).square().mean()


def test_epoch_means_the_step_count_the_noise_epoch_is_noise_epoch():
    es = make(noise_reuse=2)
    for _ in range(3):
        es.tell(torch.randn(6))
    assert (es.generation, es.noise_epoch) == (3, 1)
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


def test_tell_returns_worst_best_ever_and_grad_norm_the_history_keeps_four_fields():
    import populora

    assert populora.ESStats is GenerationStats
    es = make()
    first = torch.tensor([0.0, 3.0, -2.0, 1.0, 2.0, 0.5], dtype=torch.float64)
    expected = es.estimate_gradient(first)
    stats = es.tell(first)
    assert isinstance(stats, GenerationStats)
    assert (stats.generation, stats.best, stats.worst, stats.best_ever) == (0, 3.0, -2.0, 3.0)
    norm = math.sqrt(sum(float(g.float().square().sum()) for g in expected.values()))
    assert norm > 0 and stats.grad_norm == pytest.approx(norm, rel=1e-6)
    second = es.tell(torch.tensor([1.0, 1.5, 0.0, -4.0, 1.0, 1.0]))
    assert (second.best, second.worst, second.best_ever) == (1.5, -4.0, 3.0)  # best_ever: of any generation
    assert es.best_individual == (0, 1)
    for row in es.history:  # the history rows: generation, best, mean, std only
        assert (row.worst, row.best_ever, row.grad_norm, row.validated, row.env_steps) == (None,) * 5
    assert es.history[1] == second._replace(worst=None, best_ever=None, grad_norm=None)


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
