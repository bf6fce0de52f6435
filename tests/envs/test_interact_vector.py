"""Vector envs that cannot reset one slot with a seed: reset as a whole, once per round of episodes.

gymnasium's native ``CartPoleVectorEnv`` (``gym.make_vec('CartPole-v1',
num_envs=4)``) and ``SharedRngVectorEnv`` below (one random generator for
every slot, in each of gymnasium 1.x's autoreset modes) have no per-slot
seeded reset. The interactor plays them in rounds: round ``j`` resets the
whole env with ``vector_reset_seed(eval_seed, j)`` and its ``N`` slots play
the next ``N`` work items until all of them ended. These tests check the
seeding scheme exactly, that no autoreset step or step after an end is ever
counted, and that runs are reproducible.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from torch import nn

from populora import evolve_with_env, interact_with_env
from populora.envs.interactor import vector_reset_seed
from populora.errors import PopuloraError
from populora.interact import EnvStepError

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


class SharedRngVectorEnv(VectorEnv):
    """``num_envs`` slots drawing their episode lengths ``3 + integers(0, 5)`` from ONE generator.

    Reward 1 per step of an episode started by ``reset``; 1000 per step of an
    episode the env started by itself (autoreset), for the autoreset step of
    ``NEXT_STEP``, and for a step after the end (``DISABLED``): any of them
    counted shows in the fitness. ``steps`` counts every step of every slot.
    ``honour_mask=False`` makes a ``DISABLED`` env that ignores
    ``options['reset_mask']`` (it restarts every slot).
    """

    def __init__(self, num_envs: int, mode: AutoresetMode, honour_mask: bool = True):
        self.num_envs = num_envs
        self.metadata = {"autoreset_mode": mode}
        self.mode, self.honour_mask = mode, honour_mask
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.resets: list[int | None] = []

    def _draw(self, mask: np.ndarray) -> None:
        self.length[mask] = 3 + self.np_random.integers(0, 5, size=int(mask.sum()))
        self.t[mask] = 0

    def _obs(self) -> np.ndarray:
        return np.stack([self.t, self.length], axis=1).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets.append(seed)
        mask = (options or {}).get("reset_mask")
        if mask is None or not self.honour_mask:
            self.length = np.zeros(self.num_envs, dtype=np.int64)
            self.t = np.zeros(self.num_envs, dtype=np.int64)
            self.auto = np.zeros(self.num_envs, dtype=bool)
            self.prev_done = np.zeros(self.num_envs, dtype=bool)
            mask = np.ones(self.num_envs, dtype=bool)
        self._draw(np.asarray(mask))
        self.auto[mask] = False
        self.prev_done[mask] = False
        return self._obs(), {}

    def step(self, actions):
        assert np.asarray(actions).shape == (self.num_envs,)
        self.steps += 1
        reward = np.where(self.auto, 1000.0, 1.0)
        terminated = np.zeros(self.num_envs, dtype=bool)
        if self.mode == AutoresetMode.NEXT_STEP and self.prev_done.any():
            self._draw(self.prev_done)  # the autoreset step: no move, reward 1000
            self.auto[self.prev_done] = True
            reward[self.prev_done] = 1000.0
        moving = ~self.prev_done if self.mode == AutoresetMode.NEXT_STEP else np.ones(self.num_envs, dtype=bool)
        self.t[moving] += 1
        after = moving & (self.t > self.length)
        reward[after] = 1000.0
        terminated[moving] = self.t[moving] >= self.length[moving]
        if self.mode == AutoresetMode.NEXT_STEP:
            terminated[self.prev_done] = False
            self.prev_done = terminated.copy()
        elif self.mode == AutoresetMode.SAME_STEP and terminated.any():
            self._draw(terminated)
            self.auto[terminated] = True
        return self._obs(), reward, terminated, np.zeros(self.num_envs, dtype=bool), {}


def tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))


def round_lengths(eval_seed: int, round: int, num_envs: int) -> list[int]:
    """The episode lengths of round ``round``: the env's first draw after the round's whole reset."""
    rng, _ = seeding.np_random(vector_reset_seed(eval_seed, round))
    return (3 + rng.integers(0, 5, size=num_envs)).tolist()


def test_vector_reset_seed_is_a_fixed_mix():
    seeds = {vector_reset_seed(e, r, v) for e in range(3) for r in range(3) for v in range(2)}
    assert len(seeds) == 18 and all(0 <= s < 2**31 for s in seeds)
    assert vector_reset_seed(5, 2, 0) == vector_reset_seed(5, 2)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_rounds_seed_the_whole_env_and_never_count_autoreset_steps(mode):
    vec = SharedRngVectorEnv(4, mode)
    interactor = interact_with_env(vec)
    assert interactor.num_slots == 4 and interactor._slots.round_based
    assert interactor.check_replay() is None  # its whole resets and steps, before the episodes' (counted apart)
    vec.resets.clear()
    vec.steps[:] = 0
    pop = interactor.population(tiny_net(), 4, 2, seed=5)
    returns = interactor.episode_returns(pop, [0, 1, 2, 3], horizon=50, num_episodes=2)
    first, second = (round_lengths(pop.eval_seed, r, 4) for r in range(2))
    assert returns[:, 0].tolist() == first  # round 0: individual j in slot j
    assert sorted(returns[:, 1].tolist()) == sorted(second)  # round 1: the same lengths, slots by end order
    seeded = [seed for seed in vec.resets if seed is not None]
    assert seeded == [vector_reset_seed(pop.eval_seed, 0), vector_reset_seed(pop.eval_seed, 1)]
    # DISABLED: ended slots are reset unseeded through the mask; the autoreset modes reset nothing themselves
    assert (len(vec.resets) > 2) == (mode == AutoresetMode.DISABLED)
    assert interactor.counters["env_steps"] == sum(first) + sum(second)  # idle and autoreset steps not counted
    assert vec.steps.sum() == 4 * (max(first) + max(second))  # every slot stepped while the round lasts


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_rounds_are_reproducible_and_play_more_items_than_slots(mode):
    def run() -> torch.Tensor:
        interactor = interact_with_env(SharedRngVectorEnv(3, mode))
        pop = interactor.population(tiny_net(), 7, 2, seed=1)
        return interactor.evaluate(pop, horizon=50, num_episodes=3)  # 21 items: 7 rounds of 3 slots

    fitness = run()
    assert fitness.shape == (7,) and torch.equal(fitness, run())  # the same computation: bitwise
    assert ((fitness >= 3) & (fitness <= 7)).all()  # a counted autoreset step would add 1000
    short = interact_with_env(SharedRngVectorEnv(3, mode))
    pop = short.population(tiny_net(), 7, 2, seed=1)
    assert short.evaluate(pop, horizon=2, num_episodes=3).tolist() == [2.0] * 7  # horizon ends each round


def test_disabled_env_that_ignores_the_reset_mask_is_refused():
    interactor = interact_with_env(SharedRngVectorEnv(4, AutoresetMode.DISABLED, honour_mask=False))
    pop = interactor.population(tiny_net(), 4, 2, seed=5)
    with pytest.raises(EnvStepError, match=r"changed slots outside options\['reset_mask'\]"):
        interactor.evaluate(pop, horizon=50)


class MarginArgmax:
    """``argmax(-1)`` recording the smallest gap between the two outputs (see tests/test_interact.py)."""

    def __init__(self):
        self.margin = float("inf")

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        self.margin = min(self.margin, float((out[..., 0] - out[..., 1]).abs().min()))
        return out.argmax(-1)


def hand_rolled_cartpole_round(pop, seed: int, horizon: int, act) -> list[float]:
    """One round on a fresh CartPoleVectorEnv reset with ``seed``: individual j acts in slot j, one row at a time."""
    vec = gym.make_vec("CartPole-v1", num_envs=pop.pop_size, vectorization_mode="vector_entry_point")
    obs, _ = vec.reset(seed=seed)
    returns = np.zeros(pop.pop_size)
    alive = np.ones(pop.pop_size, dtype=bool)
    for _ in range(horizon):
        with torch.inference_mode():
            acts = np.array([int(act(pop(torch.as_tensor(obs[j : j + 1]), individual=j))) for j in range(pop.pop_size)])
        obs, reward, terminated, truncated, _ = vec.step(acts)
        returns += np.where(alive, reward, 0.0)
        alive &= ~(terminated | truncated)
        if not alive.any():
            break
    return returns.tolist()


def test_gymnasium_native_cartpole_vector_env():
    """gym.make_vec('CartPole-v1', num_envs=4) -> CartPoleVectorEnv (NEXT_STEP autoreset, no per-slot reset)."""
    vec = gym.make_vec("CartPole-v1", num_envs=4)
    assert type(vec).__name__ == "CartPoleVectorEnv"
    interactor = interact_with_env(vec)
    pop = interactor.population(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)), 4, 2, seed=2)
    act = MarginArgmax()
    fitness = interactor.evaluate(pop, action=act, horizon=60)
    expected = hand_rolled_cartpole_round(pop, vector_reset_seed(pop.eval_seed, 0), 60, act)
    # (1, 4) rows vs one batched forward: the same actions wherever no output is a near tie
    assert act.margin > 1e-4
    assert fitness.tolist() == expected  # integer episode lengths
    assert interactor.counters["env_steps"] == sum(expected)


def test_evolve_with_env_on_make_vec_is_reproducible():
    def run():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        return evolve_with_env(
            gym.make_vec("CartPole-v1", num_envs=4),
            model,
            pop_size=6,
            low_rank=2,
            num_generations=3,
            horizon=40,
            seed=3,
        )

    first, second = run(), run()
    assert [tuple(h) for h in first.history] == [tuple(h) for h in second.history]
    assert all(1 <= h.mean <= h.best <= 40 for h in first.history)
    for a, b in zip(first.policy.parameters(), second.policy.parameters()):
        assert torch.equal(a, b)


def test_vector_env_that_cannot_reset_is_a_populora_error():
    class Broken(SharedRngVectorEnv):
        def reset(self, *, seed=None, options=None):
            raise RuntimeError("simulator down")

    interactor = interact_with_env(Broken(2, AutoresetMode.NEXT_STEP))
    pop = interactor.population(tiny_net(), 2, 2)
    with pytest.raises(EnvStepError, match=r"env reset failed at slot 0 \(individual 0, episode 0\).*simulator down"):
        interactor.evaluate(pop, horizon=5)
    assert issubclass(EnvStepError, PopuloraError) and issubclass(EnvStepError, RuntimeError)
