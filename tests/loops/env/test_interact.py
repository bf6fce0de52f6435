"""populora.interact: EnvInteractor, interact_with_env, evolve_with_env.

Real gymnasium CartPole-v1 and Pendulum-v1 for the invariants (fitness equals
a hand-rolled rollout with the same seeds; list, vector env and factory
agree), a tiny seeded env whose episode lengths are known for the
scheduling invariants, and env-ssl-wrapper's mock envs for the adapters.
Every env run here is small: the whole file takes seconds.
"""

from __future__ import annotations

import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch import nn

from populora import EvolveResult, GenerationStats, Population, evolve_with_env, interact_with_env
from populora.envs.schedule import REPORTING_STREAM, VALIDATION_STREAM, WorkQueue, stream_seeds
from populora.envs.slots import DEFAULT_NUM_ENVS, REPLAY_RUNS
from populora.errors import FitnessError, InvalidIndexError, InvalidTypeError, InvalidValueError
from populora.interact import EnvStepError, ObsNormalizer, episode_seed, episode_seeds
from populora.loops.env.evolve import validation_defaults
from populora.loops.env.options import GA, Checkpointing, EnvOptions, Episodes

# ----------------------------------------------------------------------------- helpers


class SeededLengthEnv(gym.Env):
    """Episode length ``3 + seed % 5``; reward 1 per step inside it, 1000 per step after it.

    Observation ``[t, length]``; any action of Discrete(2). ``log`` collects
    ``(env id, seed)`` of every reset; ``steps`` counts every step. A step
    after the end (an autoreset step, or a slot nobody uses) returns reward
    1000 and stays terminated, so any reward counted after the end shows in
    the fitness.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, log: list | None = None, nan_at: int | None = None, raise_at: int | None = None):
        self.log = log if log is not None else []
        self.nan_at, self.raise_at = nan_at, raise_at
        self.length, self.t, self.steps = 0, 0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.length], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.log.append((id(self), seed))
        self.length, self.t = 3 + (seed or 0) % 5, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.steps += 1
        if self.raise_at is not None and self.t == self.raise_at:
            raise RuntimeError("boom")
        if self.t > self.length:
            return self._obs(), 1000.0, True, False, {}
        reward = math.nan if self.t == self.nan_at else 1.0
        return self._obs(), reward, self.t >= self.length, False, {}


def length_of(eval_seed: int, episode: int) -> int:
    return 3 + episode_seed(eval_seed, episode) % 5


def tiny_net(inp: int = 2, out: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(inp, 8), nn.Tanh(), nn.Linear(8, out))


def cartpole_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


def pendulum_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))


def hand_rolled(pop: Population, make_env, action, horizon: int, num_episodes: int) -> list[float]:
    """Per-individual rollouts, one env, one row at a time, the same episode seeds."""
    env = make_env()
    seeds = episode_seeds(pop.eval_seed, num_episodes)
    fitness = []
    for i in range(pop.pop_size):
        returns = []
        for e in range(num_episodes):
            obs, _ = env.reset(seed=seeds[e])
            total = 0.0
            for _ in range(horizon):
                with torch.inference_mode():
                    out = pop(torch.as_tensor(obs, dtype=torch.float32)[None], individual=i)
                act = action(out)[0].numpy()
                obs, reward, terminated, truncated, _ = env.step(act if act.ndim else act.item())
                total += float(reward)
                if terminated or truncated:
                    break
            returns.append(total)
        fitness.append(sum(returns) / num_episodes)
    return fitness


def seeded_length_envs(kind: str, num: int) -> tuple[object, list]:
    """``num`` SeededLengthEnvs as a list or a SyncVectorEnv (whose sub-envs step one by one), and the envs."""
    if kind == "list":
        envs = [SeededLengthEnv() for _ in range(num)]
        return envs, envs
    vec = SyncVectorEnv([SeededLengthEnv for _ in range(num)])
    return vec, vec.envs


class DictObsEnv(gym.Env):
    """Dict observations ``{'pos': (2,), 'vel': (1,)}`` (keys in the space's order); reward depends on action and state."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
            "vel": gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(2)

    def _obs(self) -> dict:
        return {"pos": self.state[:2].astype(np.float32), "vel": self.state[2:].astype(np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state, self.t = self.np_random.uniform(-1, 1, 3), 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.state = self.state + (0.1 if action else -0.1) * np.array([1.0, -0.5, 0.3])
        return self._obs(), float(self.state.sum()), bool(abs(self.state[0]) > 1.5), self.t >= 30, {}


def argmax(out: torch.Tensor) -> torch.Tensor:
    return out.argmax(-1)


class MarginArgmax:
    """``argmax(-1)`` (times ``scale`` plus ``shift``) that records the smallest gap between the two top outputs.

    Forwards of different row counts (a slot count, a hand-rolled one-row
    rollout) may differ in the last bits (BLAS picks kernels by shape), so
    their discrete actions agree only where no output is a near tie. With
    every gap above ``SAFE_MARGIN`` no action can flip, and the integer-valued
    returns derived from them compare exactly; the tests assert that first.
    """

    def __init__(self, scale: int = 1, shift: int = 0):
        self.margin = math.inf
        self.scale, self.shift = scale, shift

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        top = out.topk(2, dim=-1).values
        self.margin = min(self.margin, float((top[..., 0] - top[..., 1]).min()))
        return out.argmax(-1) * self.scale + self.shift


SAFE_MARGIN = 1e-4  # float32 forwards of other shapes differ by ~1e-6 here: far below


def torque(out: torch.Tensor) -> torch.Tensor:
    return 2 * torch.tanh(out)


# ----------------------------------------------------------------------------- real envs: invariants


def test_cartpole_fitness_equals_hand_rolled_rollout():
    """Routed, scheduled evaluation gives each individual exactly its own per-env rollout."""
    interactor = interact_with_env([gym.make("CartPole-v1") for _ in range(3)])
    pop = interactor.population(cartpole_net(), pop_size=6, low_rank=2, seed=1, init_scale=3.0)
    act = MarginArgmax()
    fitness = interactor.evaluate(pop, action=act, horizon=150, num_episodes=2)
    expected = hand_rolled(pop, lambda: gym.make("CartPole-v1"), act, 150, 2)
    assert fitness.shape == (6,) and fitness.dtype == torch.float32
    assert act.margin > SAFE_MARGIN  # no near tie: batched and one-row forwards take the same actions
    assert fitness.tolist() == expected  # integer episode lengths
    assert len(set(expected)) > 2, "the test population should differ"


def test_pendulum_fitness_equals_hand_rolled_rollout():
    """Continuous (n, 1) actions; Pendulum's float64 rewards pass through float32, hence the tolerance."""
    interactor = interact_with_env(gym.make_vec("Pendulum-v1", 3, vectorization_mode="sync"))
    pop = interactor.population(pendulum_net(), pop_size=4, low_rank=2, seed=2, init_scale=3.0)
    fitness = interactor.evaluate(pop, action=torque, horizon=40, num_episodes=2)
    expected = hand_rolled(pop, lambda: gym.make("Pendulum-v1"), torque, 40, 2)
    assert fitness.tolist() == pytest.approx(expected, rel=1e-4)
    # (k,) actions for the 1-dim Box are reshaped to (k, 1); to_range rescales from (-1, 1)
    flat = interactor.evaluate(pop, action=lambda out: torque(out)[:, 0], horizon=40, num_episodes=2)
    ranged = interactor.evaluate(pop, action=torch.tanh, to_range=(-2.0, 2.0), horizon=40, num_episodes=2)
    assert torch.equal(flat, fitness)
    assert ranged.tolist() == pytest.approx(fitness.tolist(), rel=1e-5)
    # single envs add the same float32 rewards as the vector env (bitwise here; a different batch composition
    # could move the last bit of an action in principle, hence approx)
    listed = interact_with_env([gym.make("Pendulum-v1") for _ in range(2)])
    assert listed.evaluate(pop, action=torque, horizon=40, num_episodes=2).tolist() == pytest.approx(
        fitness.tolist(), rel=1e-6
    )


def test_list_vector_env_factory_and_slot_count_give_the_same_fitness():
    """Common random numbers: fitness does not depend on how envs are given or how many slots run."""
    kinds = {
        "list": ([gym.make("CartPole-v1") for _ in range(3)], {}),
        "vector": (gym.make_vec("CartPole-v1", 3, vectorization_mode="sync"), {}),
        "wrapped vector": (gym.vector.VectorWrapper(gym.make_vec("CartPole-v1", 3, vectorization_mode="sync")), {}),
        "factory": (lambda: gym.make("CartPole-v1"), {"num_envs": 3}),
        "id": ("CartPole-v1", {"num_envs": 5}),
        "one env": (gym.make("CartPole-v1"), {}),
        "vector + single": ([gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"), gym.make("CartPole-v1")], {}),
    }
    results = {}
    act = MarginArgmax()
    for name, (envs, kwargs) in kinds.items():
        interactor = interact_with_env(envs, **kwargs)
        pop = interactor.population(cartpole_net(), pop_size=5, low_rank=2, seed=3, init_scale=3.0)
        results[name] = interactor.evaluate(pop, action=act, horizon=100, num_episodes=2)
    assert act.margin > SAFE_MARGIN  # slot counts differ (batches of other shapes): no action is a near tie
    for name, fitness in results.items():
        assert torch.equal(fitness, results["list"]), name  # integer episode lengths
    # the same seed gives the same fitness; the next generation meets new episodes
    assert torch.equal(interactor.evaluate(pop, action=argmax, horizon=100, num_episodes=2), results["one env"])
    assert episode_seeds(pop.eval_seed, 2) != episode_seeds(pop.eval_seed + 1, 2)


def test_dict_observations_are_flattened_by_default():
    from dm_control import suite

    interactor = interact_with_env([suite.load("cartpole", "balance", task_kwargs={"random": i}) for i in range(2)])
    pop = interactor.population(tiny_net(5, 2), pop_size=3, low_rank=2)
    act = MarginArgmax(scale=2, shift=-1)
    fitness = interactor.evaluate(pop, action=act, horizon=20)
    assert fitness.shape == (3,) and bool(torch.all(fitness > 0))
    assert interactor._slots.obs.shape == (2, 5)
    again = interact_with_env(suite.load("cartpole", "balance"))
    pop = again.population(tiny_net(5, 2), pop_size=3, low_rank=2)
    replay = again.evaluate(pop, action=act, horizon=20)  # 1 slot instead of 2: other forward shapes
    assert act.margin > SAFE_MARGIN  # so the same actions, the same rewards added in the same order
    assert torch.equal(replay, fitness)


def test_unflattened_dict_observations_reach_the_model_as_dicts():
    from dm_control import suite

    class DictNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = tiny_net(5, 2)

        def forward(self, obs: dict) -> torch.Tensor:
            return self.body(torch.cat([obs["position"], obs["velocity"]], dim=-1))

    act = lambda out: out.argmax(-1) * 2 - 1
    results = []
    for flatten, model in ((False, DictNet()), (True, tiny_net(5, 2))):
        interactor = interact_with_env([suite.load("cartpole", "balance") for _ in range(2)], flatten_obs=flatten)
        pop = interactor.population(model, pop_size=3, low_rank=2, seed=1)
        results.append(interactor.evaluate(pop, action=act, horizon=15, num_episodes=2))
    assert torch.equal(results[0], results[1])


def test_dict_observations_of_a_sync_vector_env_match_a_list():
    """gymnasium's concatenate batches the sub-envs' dict observations; list, sync and wrapped vector env agree."""
    sources = {
        "list": [DictObsEnv() for _ in range(3)],
        "sync vector": SyncVectorEnv([DictObsEnv for _ in range(3)]),
        "wrapped vector": gym.vector.VectorWrapper(SyncVectorEnv([DictObsEnv for _ in range(3)])),
    }
    results = {}
    for name, source in sources.items():
        interactor = interact_with_env(source)
        pop = interactor.population(tiny_net(3, 2), pop_size=4, low_rank=2, seed=2)  # init_scale 1: distinct
        results[name] = interactor.evaluate(pop, horizon=25, num_episodes=2)
    assert len(set(results["list"].tolist())) > 1
    for name, fitness in results.items():
        assert torch.equal(fitness, results["list"]), name
    seen = []
    interactor = interact_with_env(SyncVectorEnv([DictObsEnv for _ in range(2)]), flatten_obs=False)
    interactor.play(lambda obs: seen.append(obs) or torch.zeros(obs["pos"].shape[0], 2), horizon=3)
    assert set(seen[0]) == {"pos", "vel"} and seen[0]["pos"].shape == (1, 2) and seen[0]["vel"].dtype == torch.float32


def test_population_defaults_and_model_mode_restored():
    interactor = interact_with_env(gym.make("CartPole-v1"), device="cpu")
    model = cartpole_net().train()
    pop = interactor.population(model, 3, 2)
    assert pop.init_scale == 1.0 and pop.device == torch.device("cpu") and pop.target_names == ["0", "2"]
    interactor.evaluate(pop, horizon=5)
    assert model.training and all(m.training for m in model.modules())
    with pytest.raises(TypeError, match="`population` must be a populora Population"):
        interactor.evaluate(model, horizon=5)


# ----------------------------------------------------------------------------- scheduling, done, seeds


@pytest.mark.parametrize("wrapped", [False, True], ids=["sub-envs", "vector step"])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_rewards_after_done_and_autoreset_steps_are_never_counted(mode, wrapped):
    """SeededLengthEnv pays 1000 per step after the end: none of it may reach the fitness.

    A plain SyncVectorEnv steps only its playing sub-envs (no step after an
    end at all); behind a vector wrapper the vector env steps every slot,
    idle ones and autoreset steps included, and none of that may count.
    """
    log: list = []
    vec = SyncVectorEnv([lambda: SeededLengthEnv(log) for _ in range(4)], autoreset_mode=mode)
    interactor = interact_with_env(gym.vector.VectorWrapper(vec) if wrapped else vec)
    interactor.check_replay()  # its steps before the episodes' (counted apart below)
    for env in vec.envs:
        env.steps = 0
    pop = interactor.population(tiny_net(), pop_size=3, low_rank=2, seed=5)
    fitness = interactor.evaluate(pop, horizon=50, num_episodes=3)  # 9 items on 4 slots: some slots idle
    lengths = [length_of(pop.eval_seed, e) for e in range(3)]
    assert fitness.tolist() == pytest.approx([sum(lengths) / 3] * 3)
    stepped = sum(env.steps for env in vec.envs)
    assert stepped > 3 * sum(lengths) if wrapped else stepped == 3 * sum(lengths)
    short = interactor.evaluate(pop, horizon=3, num_episodes=3)  # horizon ends every episode at 3 steps
    assert short.tolist() == [3.0] * 3


def test_every_episode_of_a_generation_uses_the_same_seed():
    log: list = []
    envs = [SeededLengthEnv(log) for _ in range(3)]
    interactor = interact_with_env(envs)
    interactor.check_replay()  # its own resets, with a seed of its own
    log.clear()
    pop = interactor.population(tiny_net(), pop_size=4, low_rank=2, seed=7)
    interactor.evaluate(pop, horizon=20, num_episodes=2)
    seeds = [seed for _, seed in log]
    assert sorted(seeds) == sorted(episode_seeds(7, 2) * 4)  # each individual meets seed_0 and seed_1 once
    pop.evolve_(torch.arange(4.0))
    log.clear()
    interactor.evaluate(pop, horizon=20, num_episodes=2)
    assert sorted(seed for _, seed in log) == sorted(episode_seeds(8, 2) * 4)


@pytest.mark.parametrize("kind", ["list", "sync vector"])
def test_all_slots_stay_busy_until_the_queue_is_empty(kind):
    """One forward per timestep; every slot plays while work remains; no step is wasted on idle slots."""
    source, envs = seeded_length_envs(kind, 3)
    interactor = interact_with_env(source)
    checked = interactor.counters["check_steps"] if interactor.check_replay() is None else -1
    assert 0 < checked <= 24 and interactor.counters["env_steps"] == 0  # the replay check: slot 0, apart
    for env in envs:
        env.log.clear()
        env.steps = 0
    model = tiny_net()
    pop = interactor.population(model, pop_size=5, low_rank=2, seed=11)
    batch_sizes: list[int] = []
    model.register_forward_pre_hook(lambda module, args: batch_sizes.append(args[0].shape[0]))
    interactor.evaluate(pop, horizon=50, num_episodes=4)  # 20 work items on 3 slots
    lengths = [length_of(11, e) for e in range(4)] * 5
    assert sum(batch_sizes) == sum(lengths) == interactor.counters["env_steps"]
    assert len(batch_sizes) == interactor.counters["timesteps"]
    first_short = next(i for i, b in enumerate(batch_sizes) if b < 3)
    tail = batch_sizes[first_short:]
    assert all(a >= b for a, b in zip(tail, tail[1:])), "a slot went idle while work remained"
    assert len(tail) < max(lengths), "the tail is at most one episode long"
    # 20 resets, and each env stepped exactly its episodes' lengths
    assert sum(len(e.log) for e in envs) == 20 and sum(e.steps for e in envs) == sum(lengths)


def test_work_queue_prefers_individuals_not_playing():
    queue = WorkQueue(3, 2)
    first = [queue.take() for _ in range(3)]
    assert first == [(0, 0), (1, 0), (2, 0)]
    assert queue.take() == (0, 1)  # all three are playing: double up
    queue.finish(1)
    assert queue.take() == (1, 1)
    queue.finish(2)
    assert queue.take() == (2, 1)
    assert queue.take() is None


# ----------------------------------------------------------------------------- evolution


def test_evolve_with_env_improves_cartpole():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    result = evolve_with_env(
        gym.make_vec("CartPole-v1", 8, vectorization_mode="sync"),
        model,
        pop_size=16,
        low_rank=2,
        action=argmax,
        num_generations=6,
        horizon=200,
        seed=0,
        episodes=Episodes(num_episodes=2),
        algorithm=GA(evolve_kwargs=dict(epsilon=0.3)),
    )
    assert isinstance(result, EvolveResult)
    policy, history = result
    assert all(isinstance(h, GenerationStats) for h in history) and [h.generation for h in history] == list(range(6))
    assert history[-1].best > history[0].best
    assert max(h.mean for h in history[3:]) > history[0].mean
    assert isinstance(policy, nn.Sequential) and not isinstance(policy, Population)


def test_evolved_policy_acts_as_during_evolution():
    """policy(raw_obs) replays the best individual's last-generation episodes, normaliser included."""
    for normalize in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        policy, history = evolve_with_env(
            [gym.make("CartPole-v1") for _ in range(4)],
            model,
            8,
            2,
            action=argmax,
            num_generations=3,
            horizon=120,
            seed=4,
            episodes=Episodes(num_episodes=2),
            env_options=EnvOptions(normalize_obs=normalize),
        )
        assert isinstance(policy[0], ObsNormalizer) == normalize
        # the returned policy is the validated champion: it replays its validation episodes exactly
        replay = interact_with_env(gym.make("CartPole-v1")).play(
            policy, action=argmax, horizon=120, seeds=stream_seeds(4, VALIDATION_STREAM, validation_defaults(8, 2)[0])
        )
        assert replay.mean().item() == pytest.approx(max(h.validated for h in history if h.validated is not None))


def test_target_fitness_stops_early_and_return_history_false():
    log: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the seed README's return_history=False: the policy alone, no warning
        policy = evolve_with_env(
            [SeededLengthEnv(log)],
            tiny_net(),
            4,
            2,
            num_generations=10,
            horizon=2,
            target_fitness=2.0,
            return_history=False,
        )
    assert isinstance(policy, nn.Module) and not isinstance(policy, tuple)
    assert (
        len(log) == REPLAY_RUNS + 4 + 3 + 9
    )  # the replay check; one generation: 4 training episodes (4 individuals x 1), the top candidate's
    # 3 validation episodes (validation_defaults(4, 1)), then, as it reached the target, its confirmation: the 3
    # again and 6 more (every return is 2: the mean minus two standard errors is 2)


def test_checkpoint_and_exact_resume(tmp_path):
    def run(gens: int, resume: bool, folder):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        return evolve_with_env(
            gym.make_vec("CartPole-v1", 4, vectorization_mode="sync"),
            model,
            8,
            2,
            action=argmax,
            num_generations=gens,
            horizon=60,
            seed=9,
            checkpointing=Checkpointing(dir=folder, resume=resume),
            env_options=EnvOptions(normalize_obs=True),
        )

    straight = run(4, False, None)
    run(2, False, tmp_path)
    assert (tmp_path / "evolve_with_env.pt").is_file()
    resumed = run(4, True, tmp_path)
    assert resumed.history == straight.history
    for (name, a), (_, b) in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="differs from the one"):
        torch.manual_seed(1)
        evolve_with_env(
            gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"),
            nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)),
            8,
            2,
            action=argmax,
            num_generations=3,
            horizon=10,
            seed=9,
            checkpointing=Checkpointing(dir=tmp_path, resume=True),
            env_options=EnvOptions(normalize_obs=True),
        )


def test_observation_statistics_are_frozen_within_a_generation():
    interactor = interact_with_env([gym.make("CartPole-v1") for _ in range(2)], normalize_obs=True)
    pop = interactor.population(cartpole_net(), 4, 2, init_scale=2.0)
    first = interactor.evaluate(pop, action=argmax, horizon=50)
    assert interactor.normalizer.count.item() == 0  # generation 0 normalises with the identity
    again = interactor.evaluate(pop, action=argmax, horizon=50)
    assert torch.equal(first, again) and interactor.normalizer.count.item() == 0
    pop.evolve_(first)
    interactor.evaluate(pop, action=argmax, horizon=50)
    seen = interactor.counters["env_steps"]
    assert 0 < interactor.normalizer.count.item() < seen  # only generation 0's observations were folded in
    assert not torch.equal(interactor.normalizer.mean, torch.zeros(4, dtype=torch.float64))


def test_custom_fitness_in_the_three_signatures():
    interactor = interact_with_env(gym.make("CartPole-v1"))
    pop = interactor.population(cartpole_net(), 4, 2)
    forms = [
        lambda population, individuals: [float(i) for i in individuals],
        lambda population, idx: float(idx),
        lambda population: torch.arange(4.0),
    ]
    for fn in forms:
        assert interactor.evaluate(pop, fitness=fn).tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(TypeError, match="cannot tell how to call"):
        interactor.evaluate(pop, fitness=lambda: 0)
    policy, history = evolve_with_env(
        gym.make("CartPole-v1"),
        cartpole_net(),
        4,
        2,
        num_generations=2,
        episodes=Episodes(fitness=lambda population, idx: float(idx)),
    )
    assert [h.best for h in history] == [3.0, 3.0]


def test_episode_returns_and_play():
    interactor = interact_with_env([SeededLengthEnv() for _ in range(2)])
    pop = interactor.population(tiny_net(), 4, 2, seed=3)
    returns = interactor.episode_returns(pop, [1, 3], horizon=50, num_episodes=3)
    expected = [float(length_of(3, e)) for e in range(3)]
    assert returns.shape == (2, 3) and returns.tolist() == [expected, expected]
    played = interactor.play(nn.Sequential(nn.Linear(2, 2)), horizon=50, seeds=episode_seeds(3, 3))
    assert played.tolist() == expected
    fresh = interactor.play(nn.Sequential(nn.Linear(2, 2)), horizon=50, num_episodes=3, seed=3)  # reporting seeds
    assert fresh.tolist() == [float(3 + s % 5) for s in stream_seeds(3, REPORTING_STREAM, 3)]


def test_env_ssl_wrapper_mock_envs_of_other_simulators():
    """dm_env TimeSteps, legacy 4-tuple steps and gymnasium-style mocks all play through the adapters."""
    from env_ssl_wrapper import DMControlMockEnv, GymnasiumMockEnv, LegacyGymMockEnv

    for cls in (DMControlMockEnv, GymnasiumMockEnv, LegacyGymMockEnv):
        interactor = interact_with_env([cls() for _ in range(2)])
        pop = interactor.population(tiny_net(4, 2), 3, 2)
        fitness = interactor.evaluate(pop, action=torch.tanh, horizon=30)
        assert fitness.tolist() == [30.0] * 3, cls.__name__


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kind", ["list", "sync vector"])
def test_env_step_error_names_slot_and_individual(kind):
    envs = [SeededLengthEnv(), SeededLengthEnv(raise_at=2)]
    interactor = interact_with_env(envs if kind == "list" else SyncVectorEnv([lambda e=e: e for e in envs]))
    pop = interactor.population(tiny_net(), 4, 2)
    with pytest.raises(EnvStepError, match=r"env step failed at slot 1 \(individual 1, episode 0, step 2\).*boom"):
        interactor.evaluate(pop, horizon=10)


@pytest.mark.parametrize("kind", ["list", "sync vector"])
def test_nan_reward_raises_or_scores_worst(kind):
    envs = [SeededLengthEnv(), SeededLengthEnv(nan_at=2)]
    interactor = interact_with_env(envs if kind == "list" else SyncVectorEnv([lambda e=e: e for e in envs]))
    pop = interactor.population(tiny_net(), 3, 2)
    with pytest.raises(
        FitnessError, match=r"NaN reward at slot 1 \(individual 1, episode 0, step 2\).*nan_policy='worst'"
    ):
        interactor.evaluate(pop, horizon=10)
    pop = interactor.population(tiny_net(), 3, 2, nan_policy="worst")
    fitness = interactor.evaluate(pop, horizon=10)
    assert math.isnan(fitness[1]) and not math.isnan(fitness[0])
    assert int(pop.validate_fitnesses(fitness).argmin()) == 1
    pop.evolve_(fitness)  # evolve_ applies the worst policy


def test_wrong_action_shapes_name_both_shapes():
    interactor = interact_with_env([gym.make("Pendulum-v1") for _ in range(2)])
    pop = interactor.population(tiny_net(3, 2), 2, 2)
    with pytest.raises(ValueError, match=r"outputs have shape \(2, 2\) \(2 per slot\).*takes 1 output per slot"):
        interactor.evaluate(pop, horizon=5)
    with pytest.raises(ValueError, match=r"shape \(4,\) for 2 slot\(s\)"):
        interactor.evaluate(pop, action=lambda out: out.reshape(-1), horizon=5)
    cart = interact_with_env(gym.make("CartPole-v1"))
    pop = cart.population(tiny_net(4, 2), 2, 2)
    with pytest.raises(ValueError, match=r"actions from -1 to -?1, outside the action space Discrete\(2\)"):
        cart.evaluate(pop, action=lambda out: out.argmax(-1) * 0 - 1, horizon=5)
    with pytest.raises(TypeError, match=r"takes integer actions.*float32.*argmax"):
        cart.evaluate(pop, action=lambda out: out[:, 0], horizon=5)
    with pytest.raises(ValueError, match=r"shape \(1, 2\) for 1 slot\(s\).*needs shape \(1,\).*argmax"):
        cart.evaluate(pop, action=lambda out: out, horizon=5)
    with pytest.raises(ValueError, match="`to_range` rescales continuous"):
        cart.evaluate(pop, to_range=(-1, 1))


def test_bad_envs_and_arguments():
    with pytest.raises(InvalidValueError, match="`envs` is an empty list"):
        interact_with_env([])
    with pytest.raises(InvalidValueError, match="`num_envs` must be an int >= 1, got 0"):
        interact_with_env(lambda: gym.make("CartPole-v1"), num_envs=0)
    with pytest.raises(InvalidTypeError, match="`num_envs` must be an int, got str"):
        interact_with_env("CartPole-v1", num_envs="4")
    with pytest.raises(InvalidValueError, match="`num_envs=2` only applies to a factory"):
        interact_with_env(gym.make("CartPole-v1"), num_envs=2)
    with pytest.raises(InvalidTypeError, match=r"`envs\[1\]` is function, not an environment"):
        interact_with_env([gym.make("CartPole-v1"), lambda: gym.make("CartPole-v1")])
    interactor = interact_with_env(gym.make("CartPole-v1"))
    pop = interactor.population(cartpole_net(), 2, 2)
    with pytest.raises(InvalidValueError, match="`horizon` must be an int >= 1 or None, got 0"):
        interactor.evaluate(pop, horizon=0)
    with pytest.raises(InvalidValueError, match="`num_episodes` must be an int >= 1, got 0"):
        interactor.evaluate(pop, num_episodes=0)
    with pytest.raises(InvalidTypeError, match="`num_episodes` must be an int >= 1, got 1.5"):
        interactor.evaluate(pop, num_episodes=1.5)
    with pytest.raises(InvalidTypeError, match="`population` must be a populora Population"):
        interactor.evaluate(cartpole_net(), horizon=5)
    with pytest.raises(InvalidTypeError, match="`action` must be a callable"):
        interactor.evaluate(pop, action=3, horizon=5)
    with pytest.raises(InvalidIndexError, match="`individuals` holds id 7, out of range"):
        interactor.episode_returns(pop, [0, 7], horizon=5)
    with pytest.raises(InvalidTypeError, match="`policy` must be callable"):
        interactor.play(3, horizon=5)
    with pytest.raises(InvalidValueError, match="`num_generations` must be an int >= 1"):
        evolve_with_env(gym.make("CartPole-v1"), cartpole_net(), 2, 2, num_generations=0)
    with pytest.raises(InvalidValueError, match=r"`Checkpointing\(resume=True\)` needs `dir`"):
        evolve_with_env(gym.make("CartPole-v1"), cartpole_net(), 2, 2, checkpointing=Checkpointing(resume=True))
    with pytest.raises(InvalidTypeError, match="`target_fitness` must be a real number"):
        evolve_with_env(gym.make("CartPole-v1"), cartpole_net(), 2, 2, target_fitness="high")


def test_a_factory_without_num_envs_makes_the_default_number_of_envs():
    """interact_with_env: 16 envs (DEFAULT_NUM_ENVS); evolve_with_env: one per individual, at most 16."""
    made = []

    def factory():
        made.append(SeededLengthEnv())
        return made[-1]

    interactor = interact_with_env(factory)
    assert DEFAULT_NUM_ENVS == 16 and interactor.num_slots == 16 and len(made) == 16
    assert interact_with_env("CartPole-v1").num_slots == 16
    made.clear()
    result = evolve_with_env(factory, tiny_net(), pop_size=4, low_rank=1, num_generations=1, horizon=5)
    assert len(made) == 4 and len(result.history) == 1
    made.clear()
    evolve_with_env(factory, tiny_net(), pop_size=40, low_rank=1, num_generations=1, horizon=5)
    assert len(made) == 16


def test_same_env_object_repeated_becomes_copies_with_one_warning():
    """[env for _ in range(4)] is 4 slots made of deep copies, with ONE warning; the fitness is unchanged."""
    env = SeededLengthEnv()
    with pytest.warns(UserWarning) as caught:
        interactor = interact_with_env([env for _ in range(4)])
    mine = [w for w in caught if "same environment object" in str(w.message)]
    messages = [str(w.message) for w in mine]
    assert len(messages) == 1 and "deep copy" in messages[0] and "(4 slot(s) from 4 entries)" in messages[0]
    assert mine[0].filename == __file__  # the warning points at the caller's line
    assert interactor.num_slots == 4
    raws = [interactor._slots.raw_env(slot) for slot in range(4)]
    assert raws[0] is env and len({id(raw) for raw in raws}) == 4
    pop = interactor.population(tiny_net(), 6, 2, seed=3)
    fitness = interactor.evaluate(pop, horizon=50, num_episodes=2)
    distinct = interact_with_env([SeededLengthEnv() for _ in range(4)])
    assert torch.equal(fitness, distinct.evaluate(pop, horizon=50, num_episodes=2))  # same shapes, same rollouts
    assert all(raw.steps > 0 for raw in raws)  # every copy played
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert interact_with_env([gym.make("CartPole-v1") for _ in range(3)]).num_slots == 3


class UncopyableEnv(SeededLengthEnv):
    def __deepcopy__(self, memo):
        raise TypeError("cannot copy a simulator handle")


def test_same_env_object_that_cannot_be_copied_stays_one_slot():
    env = UncopyableEnv()
    other = SeededLengthEnv()
    with pytest.warns(UserWarning) as caught:
        interactor = interact_with_env([env, env, env, other, other])
    messages = [str(w.message) for w in caught if "same environment object" in str(w.message)]
    assert len(messages) == 1
    assert "could not be copied" in messages[0] and "cannot copy a simulator handle" in messages[0]
    assert "ONE slot" in messages[0] and "(3 slot(s) from 5 entries)" in messages[0]
    assert interactor.num_slots == 3  # env once, other and its copy


def test_failed_evolution_gives_the_model_back_unwrapped():
    """An exception inside evolve_with_env (here from `action`) must not leave the model frozen or wrapped."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))

    def action(logits):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evolve_with_env(
            gym.make("CartPole-v1"), model, pop_size=4, low_rank=1, action=action, num_generations=2, horizon=5
        )
    assert all(p.requires_grad for p in model.parameters())
    assert "forward" not in vars(model[0]) and "forward" not in vars(model[2])


def test_a_checkpoint_written_by_050_resumes_into_this_versions_run(tmp_path):
    """tests/loops/data/evolve_with_env_050.pt: generations 0-1 of this run, written by populora 0.5.0
    (populora.evolve_with_env/2, commit 1496bc6); resumed here, the run is this version's uninterrupted run."""
    import shutil
    from pathlib import Path

    def run(folder, init=0):
        torch.manual_seed(init)
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        return evolve_with_env(
            gym.make_vec("CartPole-v1", 4, vectorization_mode="sync"),
            model,
            8,
            2,
            action=argmax,
            num_generations=4,
            horizon=60,
            seed=9,
            checkpointing=Checkpointing(dir=folder, resume=folder is not None),
            env_options=EnvOptions(normalize_obs=True),
        )

    shutil.copy(Path(__file__).parents[1] / "data" / "evolve_with_env_050.pt", tmp_path / "evolve_with_env.pt")
    with pytest.raises(ValueError, match="differs from the one"):  # the file is read: it names its base model
        run(tmp_path, init=1)
    resumed = run(tmp_path)
    straight = run(None)
    assert resumed.history == straight.history and len(resumed.history) == 4
    for (name, a), (_, b) in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().items()):
        assert torch.equal(a, b), name
