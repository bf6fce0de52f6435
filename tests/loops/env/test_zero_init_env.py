"""A policy whose last layer is zero-initialised still evolves against an env (issue 9, item 3).

Zero-initialising the last layer of a policy is common in RL. The policy
``Linear(4, 16) - ReLU - Linear(16, 1)`` with the last layer zeroed acts 0
everywhere; on ``HalfEnv`` (reward ``1 - |action - 0.5|`` per step, 60 steps)
it scores 30. Within 10 generations the best individual must reach 48 (0.8
per step), both with ``interact_with_env`` + ``evolve_`` and with
``evolve_with_env``'s defaults. Before the fix every individual was the base
model (adapters ``0``, mutation floor ``0`` for a weight of RMS 0), every
fitness 30, forever.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from populora import evolve_with_env, interact_with_env

HORIZON = 60


class HalfEnv(gym.Env):
    """Reward ``1 - |action - 0.5|`` per step for 60 steps; observation ``[1, t / 60, 1, -1]``."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([1.0, self.t / HORIZON, 1.0, -1.0], dtype=np.float32)

    def step(self, action):
        self.t += 1
        reward = 1.0 - abs(float(np.asarray(action).reshape(())) - 0.5)
        return self._obs(), reward, False, self.t >= HORIZON, {}


def zero_last_layer_policy() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    nn.init.zeros_(model[2].weight)
    nn.init.zeros_(model[2].bias)
    return model


def test_the_zero_policy_scores_30():
    interactor = interact_with_env([HalfEnv()])
    assert interactor.play(zero_last_layer_policy(), horizon=HORIZON).tolist() == [30.0]


def test_interact_with_env_and_evolve_move_a_zero_last_layer():
    interactor = interact_with_env([HalfEnv() for _ in range(8)])
    pop = interactor.population(zero_last_layer_policy(), pop_size=16, low_rank=2, seed=0)
    best = []
    for _ in range(10):
        fitnesses = interactor.evaluate(pop, horizon=HORIZON)
        best.append(float(fitnesses.max()))
        if len(best) == 1:
            assert float(fitnesses.std()) > 0  # individuals differ from generation 0 on
        pop.evolve_(fitnesses)
    assert max(best) >= 48, best


def test_evolve_with_env_defaults_move_a_zero_last_layer():
    result = evolve_with_env(
        [HalfEnv() for _ in range(8)],
        zero_last_layer_policy(),
        pop_size=16,
        low_rank=2,
        num_generations=10,
        horizon=HORIZON,
        seed=0,
    )
    best = [h.best for h in result.history]
    assert max(best) >= 48, best
    assert result.policy(torch.ones(1, 4)).shape == (1, 1)


def test_mutation_alone_moves_a_zero_last_layer():
    """``init_scale=0`` (every individual starts as the model): the mutation floor alone must move it."""
    interactor = interact_with_env([HalfEnv() for _ in range(8)])
    pop = interactor.population(zero_last_layer_policy(), pop_size=16, low_rank=2, seed=0, init_scale=0.0)
    best = []
    for _ in range(10):
        fitnesses = interactor.evaluate(pop, horizon=HORIZON)
        best.append(float(fitnesses.max()))
        pop.evolve_(fitnesses)
    assert best[0] == 30.0 and max(best) > 35, best
