"""Seeds that mean what they say, whatever the env form (issue 25, item 3).

A vector env that resets only as a whole (gymnasium's native
``CartPoleVectorEnv`` from ``gym.make_vec('CartPole-v1', num_envs=4)``) plays
its training episodes in rounds seeded apart from the episode seeds. What
names its episodes by their seeds must still play exactly those: the
validation episodes of ``evolve_with_env`` (fixed, disjoint from training)
and ``EnvInteractor.play(seeds=)``; they run on single envs made from the
vector env's spec, and equal a plain ``reset(seed=s)`` / ``step`` loop.
Where no single env can be made, they are refused naming the env and the
fix. A simulator that does not replay an episode from its seed is named in
one warning.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from torch import nn

from populora import evolve_with_env, interact_with_env
from populora.envs.schedule import VALIDATION_STREAM, stream_seeds
from populora.envs.slots import REPLAY_RUNS
from populora.errors import InvalidTypeError
from populora.loops.env.options import Validation

HORIZON = 60


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


def plain_loop(act, seeds: list[int], horizon: int = HORIZON) -> list[float]:
    """Returns of ``act(obs (1, 4)) -> action`` on ``gym.make('CartPole-v1')``, reset with each seed."""
    env = gym.make("CartPole-v1")
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total = 0.0
        for _ in range(horizon):
            obs, reward, terminated, truncated, _ = env.step(act(torch.as_tensor(obs).unsqueeze(0)))
            total += float(reward)
            if terminated or truncated:
                break
        out.append(total)
    return out


class Margin:
    """``argmax`` of the policy's two logits, recording the smallest gap (rounding could flip a near tie)."""

    def __init__(self, policy):
        self.policy, self.margin = policy, float("inf")

    def __call__(self, obs: torch.Tensor) -> int:
        with torch.inference_mode():
            out = self.policy(obs)[0]
        self.margin = min(self.margin, float((out[0] - out[1]).abs()))
        return int(out.argmax())


@pytest.fixture
def seed_log(monkeypatch):
    """Every seed CartPole is reset with: ``{'vector': [...], 'single': [...]}`` (None: unseeded)."""
    log = {"vector": [], "single": []}
    vector_reset, single_reset = CartPoleVectorEnv.reset, CartPoleEnv.reset

    def logged_vector(self, *, seed=None, options=None):
        log["vector"].append(seed)
        return vector_reset(self, seed=seed, options=options)

    def logged_single(self, *, seed=None, options=None):
        log["single"].append(seed)
        return single_reset(self, seed=seed, options=options)

    monkeypatch.setattr(CartPoleVectorEnv, "reset", logged_vector)
    monkeypatch.setattr(CartPoleEnv, "reset", logged_single)
    return log


def test_play_honours_its_seeds_on_a_whole_reset_vector_env(seed_log):
    interactor = interact_with_env(gym.make_vec("CartPole-v1", num_envs=4))
    assert interactor._slots.round_based
    policy = mlp()
    first = interactor.play(policy, horizon=HORIZON, seeds=[1, 2, 3]).tolist()
    second = interactor.play(policy, horizon=HORIZON, seeds=[7, 8, 9]).tolist()
    act = Margin(policy)
    assert first == plain_loop(act, [1, 2, 3]) and second == plain_loop(act, [7, 8, 9])
    assert act.margin > 1e-4  # a (1, 4) row and a batched forward take the same actions
    assert first != second
    assert [s for s in seed_log["single"] if s is not None][-6:] == [1, 2, 3, 7, 8, 9]
    assert not {1, 2, 3, 7, 8, 9} & set(seed_log["vector"])  # the vector env never met them
    interactor.close()


def test_episode_returns_with_seeds_play_them_on_a_whole_reset_vector_env():
    interactor = interact_with_env(gym.make_vec("CartPole-v1", num_envs=3))
    pop = interactor.population(mlp(), 4, 2, seed=2)
    seeds = [11, 12]
    returns = interactor.episode_returns(pop, [0, 1, 2, 3], horizon=HORIZON, seeds=seeds)
    for i in range(4):
        act = Margin(lambda obs, i=i: pop(obs, individual=i))
        assert returns[i].tolist() == plain_loop(act, seeds)
        assert act.margin > 1e-4
    # training (no seeds): rounds of the vector env itself, other episodes
    rounds = interactor.episode_returns(pop, [0, 1, 2, 3], horizon=HORIZON, num_episodes=2)
    assert not torch.equal(rounds, returns)
    interactor.close()


@pytest.mark.parametrize("algorithm", ["ga", "es"])
def test_validation_on_a_whole_reset_vector_env_plays_its_own_fixed_episodes(seed_log, algorithm):
    """The validation episodes: the run's fixed validation seeds, on single envs, never a training round."""
    seed, episodes = 3, 4
    scores = []
    policy, history = evolve_with_env(
        gym.make_vec("CartPole-v1", num_envs=4),
        mlp(),
        pop_size=6,
        low_rank=2,
        num_generations=3,
        horizon=HORIZON,
        seed=seed,
        validation=Validation(episodes=episodes, top=1),
        algorithm=algorithm,
        callback=lambda info: scores.append(info.stats.validated),
    )
    validation = stream_seeds(seed, VALIDATION_STREAM, episodes)
    single = [s for s in seed_log["single"] if s is not None]
    assert single and set(single) == set(validation)  # single envs play the validation seeds, and only those
    vector = [s for s in seed_log["vector"] if s is not None]
    assert len(vector) >= 3 * 2 and not set(vector) & set(validation)  # training rounds: seeded apart
    # the champion's validated score is its mean return over those seeds in a plain loop
    act = Margin(policy)
    best = max(s for s in scores if s is not None)
    assert float(np.mean(plain_loop(act, validation))) == pytest.approx(best, abs=1e-9)
    assert act.margin > 1e-4


class SharedRng(VectorEnv):
    """A vector env with one random generator and no spec: no seeded reset of one slot, no single envs."""

    def __init__(self, num_envs: int = 2):
        self.num_envs = num_envs
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = np.zeros(self.num_envs)
        return self.np_random.standard_normal((self.num_envs, 4)).astype(np.float32), {}

    def step(self, actions):
        self.steps += 1
        self.t += 1
        done = self.t >= 5
        self.t[done] = 0
        obs = self.np_random.standard_normal((self.num_envs, 4)).astype(np.float32)
        return obs, np.ones(self.num_envs), done, np.zeros(self.num_envs, bool), {}


def test_a_whole_reset_env_without_single_envs_is_refused_where_seeds_name_episodes():
    env = SharedRng()
    with pytest.raises(
        InvalidTypeError,
        match=r"validation plays the episodes its reset seeds name, but the vector env SharedRng\(num_envs=2\) resets "
        r"only as a whole.*no single envs can be made of it: it has no gymnasium spec.*pass a list of envs or a "
        r"factory.*Validation\(episodes=0\)",
    ):
        evolve_with_env(env, mlp(), pop_size=4, low_rank=2, num_generations=2, horizon=10)
    assert env.steps <= 3 * 8  # at most the replay check's steps: no episode was played
    result = evolve_with_env(
        env, mlp(), pop_size=4, low_rank=2, num_generations=2, horizon=10, validation=Validation(episodes=0)
    )
    assert len(result.history) == 2
    interactor = interact_with_env(SharedRng())
    with pytest.raises(InvalidTypeError, match=r"play\(seeds=\.\.\.\) plays the episodes.*SharedRng"):
        interactor.play(mlp(), horizon=10, seeds=[1, 2])


class Forgetful(gym.Env):
    """An env that draws its start state from its own generator, ignoring ``reset(seed=)`` (as envpool does)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.rng.standard_normal(4).astype(np.float32), {}

    def step(self, action):
        self.t += 1
        return self.rng.standard_normal(4).astype(np.float32), 1.0, self.t >= 5, False, {}


class ThirdTimeOff(gym.Env):
    """Replays its seeded episode twice, then drifts (as Box2D's BipedalWalker does on the third reset)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.resets = 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        self.x = np.full(4, float(seed or 0) % 7, np.float32)
        return self.x.copy(), {}

    def step(self, action):
        self.x = self.x + (0.5 if self.resets % 3 == 0 else 0.25) + int(action)
        return self.x.copy(), 1.0, False, False, {}


@pytest.mark.parametrize("make", [Forgetful, ThirdTimeOff], ids=["ignores-seed", "drifts"])
def test_a_simulator_that_does_not_replay_is_named_in_one_warning(make):
    interactor = interact_with_env([make() for _ in range(2)])
    pop = interactor.population(mlp(), 4, 2, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interactor.evaluate(pop, horizon=5)
        interactor.evaluate(pop, horizon=5)
        interactor.play(mlp(), horizon=5, num_episodes=2)
    replay = [w for w in caught if "does not replay an episode from its reset seed" in str(w.message)]
    assert len(replay) == 1
    message = str(replay[0].message)
    assert make.__name__ in message
    assert ("it ignores the seed" in message) == (make is Forgetful)
    if make is ThirdTimeOff:
        assert f"run {REPLAY_RUNS}" in message


@pytest.mark.parametrize(
    "make",
    [
        lambda: [gym.make("CartPole-v1") for _ in range(2)],
        lambda: gym.make_vec("CartPole-v1", num_envs=2),  # rounds: the whole reset replays
        lambda: gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync"),
    ],
    ids=["list", "native-vector", "sync-vector"],
)
def test_simulators_that_replay_raise_no_warning(make):
    interactor = interact_with_env(make())
    inp, out = (3, 1) if "Pendulum" in repr(interactor._slots.raw_env(0)) else (4, 2)
    torch.manual_seed(0)
    pop = interactor.population(nn.Sequential(nn.Linear(inp, 8), nn.Tanh(), nn.Linear(8, out)), 2, 2, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interactor.evaluate(pop, horizon=5)
    assert not [w for w in caught if "replay" in str(w.message)]
    interactor.close()
