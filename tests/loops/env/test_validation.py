"""Validated champions of evolve_with_env: the robust individual wins over the lucky one.

The mock env is deterministic and one step long. The "lucky" individual
scores 100 on the episodes whose seeds are this run's TRAINING seeds and 0
on every other episode; the "robust" one scores 50 on every episode; the
others score 0. An individual is recognised by its (distinct) action, the
output of its routed forward on the constant observation.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from populora import GenerationStats, evolve_with_env, interact_with_env
from populora.envs.schedule import REPORTING_STREAM, VALIDATION_STREAM, episode_seeds, stream_seeds, training_seeds
from populora.errors import InvalidValueError
from populora.loops.env.options import Episodes, Validation

POP, SEED = 8, 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 1))


class _Oracle(gym.Env):
    """Reward by (individual, seed); the individual is the one whose action is nearest."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
    action_space = gym.spaces.Box(-100.0, 100.0, (1,), np.float32)

    def __init__(self, actions: np.ndarray, lucky: int, robust: int, train: set[int], log: list):
        self.actions, self.lucky, self.robust, self.train, self.log = actions, lucky, robust, train, log
        self.seed_now = None

    def reset(self, *, seed=None, options=None):
        self.seed_now = seed
        return np.ones(1, np.float32), {}

    def step(self, action):
        who = int(np.argmin(np.abs(self.actions - float(np.asarray(action).reshape(-1)[0]))))
        self.log.append((who, self.seed_now))
        if abs(self.actions[who] - float(np.asarray(action).reshape(-1)[0])) > 1e-4:
            who = -1  # an individual of a later generation
        reward = 100.0 if who == self.lucky and self.seed_now in self.train else 50.0 if who == self.robust else 0.0
        return np.ones(1, np.float32), reward, True, False, {}


def _setup(seeding: str):
    """Actions of generation 0's individuals (the same population evolve_with_env builds), lucky / robust ids."""
    probe = interact_with_env([gym.make("Pendulum-v1")])  # any env: only builds the population
    pop = probe.population(_model(), POP, 1, seed=SEED)
    with torch.no_grad():
        actions = np.array([float(pop(torch.ones(1, 1), individual=i)[0, 0]) for i in range(POP)])
    pop.close()
    probe.close()
    assert len(set(np.round(actions, 4))) == POP  # every individual recognisable
    lucky, robust = int(np.argmax(actions)), int(np.argmin(actions))
    train = set(np.asarray(training_seeds(SEED, list(range(POP)), 1, seeding)).reshape(-1).tolist())
    return actions, lucky, robust, train


def _run(seeding: str, **kwargs):
    actions, lucky, robust, train = _setup(seeding)
    log: list = []
    envs = [_Oracle(actions, lucky, robust, train, log) for _ in range(4)]
    policy, history = evolve_with_env(
        envs, _model(), POP, 1, action=lambda out: out, seed=SEED, episodes=Episodes(seeding=seeding), **kwargs
    )
    with torch.no_grad():
        out = float(policy(torch.ones(1, 1))[0, 0])
    return out, actions, lucky, robust, history, log


@pytest.mark.parametrize("seeding", ["independent", "common"])
def test_the_robust_individual_is_returned_not_the_lucky_one(seeding):
    out, actions, lucky, robust, history, log = _run(
        seeding, num_generations=1, validation=Validation(episodes=3, top=2)
    )
    assert history[0].best == 100.0  # the lucky one wins the training episode ...
    assert history[0].validated == 50.0  # ... and scores 0 on the validation episodes
    assert out == pytest.approx(actions[robust], abs=1e-5)
    assert out != pytest.approx(actions[lucky], abs=1e-3)
    validation = {s for who, s in log if s in set(stream_seeds(SEED, VALIDATION_STREAM, 3))}
    assert len(validation) == 3


def test_without_validation_the_lucky_one_is_returned():  # the 0.1 rule, which the validation replaces
    out, actions, lucky, robust, history, _ = _run("independent", num_generations=1, validation=Validation(episodes=0))
    assert history[0].validated is None
    assert out == pytest.approx(actions[lucky], abs=1e-5)


def test_target_fitness_is_not_reached_from_one_lucky_training_episode():
    _, _, _, _, history, _ = _run("independent", num_generations=3, target_fitness=90.0)
    assert history[0].best == 100.0 >= 90.0  # the training best reached the target at generation 0
    assert len(history) == 3  # but no validated score did: the run went on
    assert all(h.validated is None or h.validated < 90.0 for h in history)


def test_target_fitness_stops_on_a_validated_score():
    _, _, _, _, history, _ = _run("independent", num_generations=3, target_fitness=50.0, validation=Validation(top=2))
    assert len(history) == 1 and history[0].validated == 50.0


def test_validation_seeds_are_fixed_and_apart_from_training_and_reporting():
    val = stream_seeds(SEED, VALIDATION_STREAM, 50)
    assert val == stream_seeds(SEED, VALIDATION_STREAM, 50)  # reproducible from the run's seed
    assert val != stream_seeds(SEED + 1, VALIDATION_STREAM, 50)
    report = set(stream_seeds(SEED, REPORTING_STREAM, 50))
    train = set()
    for gen in range(30):  # eval_seed = seed + generation
        train |= set(episode_seeds(SEED + gen, 50))
        train |= set(np.asarray(training_seeds(SEED + gen, list(range(64)), 2, "independent")).reshape(-1).tolist())
    assert not (set(val) & report) and not (set(val) & train) and not (report & train)


def test_independent_seeds_differ_per_individual_and_common_ones_do_not():
    ind = np.asarray(training_seeds(7, [0, 1, 5], 2, "independent"))
    assert ind.shape == (3, 2) and len(set(ind.reshape(-1).tolist())) == 6
    assert training_seeds(7, [0, 1, 5], 2, "common") == episode_seeds(7, 2)
    assert ind[2].tolist() == np.asarray(training_seeds(7, [5], 2, "independent"))[0].tolist()  # not by position


def test_generation_stats_stay_positional_with_defaults():
    g = GenerationStats(1, 2.0, 1.5)
    assert (g.std, g.validated, g.env_steps) == (None, None, None)
    assert tuple(GenerationStats(1, 2.0, 1.5, 0.5))[:4] == (1, 2.0, 1.5, 0.5)
    generation, best, mean, std, validated, steps, *_ = GenerationStats(0, 1.0, 0.5, 0.1, 0.9, 100)
    assert (validated, steps) == (0.9, 100)


def test_bad_validation_options_are_named_before_any_episode():
    with pytest.raises(InvalidValueError, match=r"`Validation\.episodes`"):
        evolve_with_env("CartPole-v1", _model(), 4, 1, validation=Validation(episodes=-1))
    with pytest.raises(InvalidValueError, match=r"`Validation\.top`"):
        evolve_with_env("CartPole-v1", _model(), 4, 1, validation=Validation(top=0))
    with pytest.raises(InvalidValueError, match=r"`Episodes\.seeding`"):
        evolve_with_env("CartPole-v1", _model(), 4, 1, episodes=Episodes(seeding="shared"))
    with pytest.raises(InvalidValueError, match="algorithm"):
        evolve_with_env("CartPole-v1", _model(), 4, 1, algorithm="cma")


def test_plot_history_draws_the_validated_scores():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from populora import plot_history

    ax = plot_history(
        [
            GenerationStats(0, 3.0, 1.0, 0.5, 2.0, 10),
            GenerationStats(1, 4.0, 2.0, 0.5, None, 20),
            GenerationStats(2, 5.0, 3.0, 0.5, 4.5, 30),
        ]
    )
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == ["best", "mean", "validated"]
    assert list(lines["validated"].get_xdata()) == [0.0, 2.0] and list(lines["validated"].get_ydata()) == [2.0, 4.5]
    ax = plot_history([GenerationStats(0, 3.0, 1.0)])
    assert sorted(line.get_label() for line in ax.get_lines()) == ["best", "mean"]


def test_a_champion_reaching_the_target_is_confirmed_on_more_episodes_before_the_run_stops():
    actions, lucky, robust, train = _setup("independent")
    val = stream_seeds(SEED, VALIDATION_STREAM, 9)
    log: list = []
    envs = [_Oracle(actions, lucky, robust, train | set(val[:3]), log) for _ in range(4)]  # lucky on the 3 too
    policy, history = evolve_with_env(
        envs,
        _model(),
        POP,
        1,
        action=lambda out: out,
        seed=SEED,
        num_generations=3,
        target_fitness=90.0,
        validation=Validation(episodes=3, top=2),
    )
    assert history[0].best == 100.0
    assert history[0].validated == 50.0  # the lucky one: 100 on 3 episodes, 0 on the 6 confirmation ones: 33.3
    assert len(history) == 3  # the run did not stop
    assert {s for _, s in log} >= set(val)  # the 6 confirmation seeds were played
    with torch.no_grad():
        assert float(policy(torch.ones(1, 1))[0, 0]) == pytest.approx(actions[robust], abs=1e-5)  # robust: 50
