"""The environment objects' API: state_dict / load_state_dict, EvolveResult, slot sources."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import SyncVectorEnv
from test_interact import SeededLengthEnv, argmax, cartpole_net, length_of, tiny_net
from torch import nn

from populora import EvolveResult, GenerationStats, evolve_with_env, interact_with_env
from populora.checkpoint import atomic_save, load_checkpoint
from populora.envs.interactor import episode_seed, vector_reset_seed
from populora.envs.normalize import ObsStatistics
from populora.envs.slots import EnvStepError as EnvStepErrorFromEnvs
from populora.envs.slots import build_slots
from populora.envs.sources import SingleEnvs, SubEnvSource
from populora.envs.vector import VectorSource
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.loops.env.evolve import CHECKPOINT_NAME
from populora.loops.env.loop import EnvLoop
from populora.loops.env.options import Checkpointing, EnvOptions, Episodes, Validation


def normalizing(num: int = 2):
    return interact_with_env([gym.make("CartPole-v1") for _ in range(num)], normalize_obs=True)


def advanced(interactor, pop) -> None:
    """Evaluate twice with an evolve_ between, so the statistics hold folded and pending observations."""
    interactor.evaluate(pop, action=argmax, horizon=30)
    pop.evolve_(torch.arange(float(pop.pop_size)))
    interactor.evaluate(pop, action=argmax, horizon=30)


# ----------------------------------------------------------------------------- state_dict / load_state_dict


def test_interactor_state_dict_is_a_snapshot_and_resumes_exactly():
    source = normalizing()
    pop = source.population(cartpole_net(), 4, 2, seed=1, init_scale=2.0)
    advanced(source, pop)
    state = source.state_dict()
    assert set(state) == {"obs_stats"} and state["obs_stats"]["pending"].shape == (2 * 4 + 1,)
    frozen = {k: v.clone() for k, v in state["obs_stats"]["normalizer"].items()}
    pending = state["obs_stats"]["pending"].clone()
    pop_state = pop.state_dict(include_model=False)
    pop_state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in pop_state.items()}

    pop.evolve_(torch.arange(4.0))
    expected = source.evaluate(pop, action=argmax, horizon=30)  # folds and observes: the live state moves on
    assert not torch.equal(source.state_dict()["obs_stats"]["pending"], pending)
    for key, value in frozen.items():  # ... the snapshot does not
        assert torch.equal(state["obs_stats"]["normalizer"][key], value), key
    assert torch.equal(state["obs_stats"]["pending"], pending)

    target = normalizing()
    target.load_state_dict(state)
    twin = target.population(cartpole_net(), 4, 2, seed=1, init_scale=2.0)
    twin.load_state_dict(pop_state)
    twin.evolve_(torch.arange(4.0))
    assert torch.equal(target.evaluate(twin, action=argmax, horizon=30), expected)
    assert torch.equal(target.normalizer.mean, source.normalizer.mean)
    state["obs_stats"]["pending"].add_(1.0)  # the loaded copy is not the caller's tensor
    assert not torch.equal(target.state_dict()["obs_stats"]["pending"], state["obs_stats"]["pending"])
    plain = interact_with_env(gym.make("CartPole-v1"))
    assert plain.state_dict() == {"obs_stats": None}
    plain.load_state_dict({"obs_stats": None})


def test_interactor_load_state_dict_checks_everything_before_writing():
    source = normalizing()
    advanced(source, source.population(cartpole_net(), 4, 2, seed=1, init_scale=2.0))
    good = source.state_dict()
    target = normalizing()
    before = target.state_dict()

    def unchanged() -> None:
        after = target.state_dict()["obs_stats"]
        assert torch.equal(after["pending"], before["obs_stats"]["pending"]) and after["generation"] is None
        for key, value in before["obs_stats"]["normalizer"].items():
            assert torch.equal(after["normalizer"][key], value), key

    other = {"obs_stats": {**good["obs_stats"], "pending": torch.zeros(7, dtype=torch.float64)}}
    with pytest.raises(CheckpointError, match=r"'pending' has shape \(7,\), expected \(9,\)"):
        target.load_state_dict(other)
    unchanged()
    wrong_mean = {**good["obs_stats"]["normalizer"], "mean": torch.zeros(3, dtype=torch.float64)}
    with pytest.raises(CheckpointError, match=r"'normalizer.mean' has shape \(3,\), expected \(4,\)"):
        target.load_state_dict({"obs_stats": {**good["obs_stats"], "normalizer": wrong_mean}})
    unchanged()
    with pytest.raises(CheckpointError, match=r"lacks \['clip'\]"):
        target.load_state_dict({"obs_stats": {k: v for k, v in good["obs_stats"].items() if k != "clip"}})
    with pytest.raises(CheckpointError, match="'clip' must be a number > 0"):
        target.load_state_dict({"obs_stats": {**good["obs_stats"], "clip": -1.0}})
    with pytest.raises(
        CheckpointError, match="holds no observation statistics; this interactor has normalize_obs=True"
    ):
        target.load_state_dict({"obs_stats": None})
    with pytest.raises(CheckpointError, match="must be a dict with 'obs_stats'"):
        target.load_state_dict(good["obs_stats"])
    unchanged()
    with pytest.raises(CheckpointError, match="holds observation statistics; this interactor has normalize_obs=False"):
        interact_with_env(gym.make("CartPole-v1")).load_state_dict(good)
    target.load_state_dict(good)
    assert torch.equal(target.normalizer.mean, source.normalizer.mean)


def test_obs_statistics_state_dict_is_a_snapshot():
    stats = ObsStatistics(3)
    stats.advance(0)
    stats.observe(torch.arange(6.0).view(2, 3))
    stats.advance(1)
    stats.observe(torch.ones(1, 3))
    state = stats.state_dict()
    saved = {k: v.clone() for k, v in state["normalizer"].items()}, state["pending"].clone()
    stats.observe(torch.ones(4, 3))
    stats.advance(2)
    assert torch.equal(state["pending"], saved[1]) and state["generation"] == 1
    for key, value in saved[0].items():
        assert torch.equal(state["normalizer"][key], value), key
    twin = ObsStatistics(3)
    twin.load_state_dict(state)
    assert torch.equal(twin.pending, saved[1]) and twin.pending is not state["pending"]
    assert torch.equal(twin.normalizer.mean, saved[0]["mean"]) and twin.generation == 1


# ----------------------------------------------------------------------------- evolve_with_env's result


def test_evolve_with_env_returns_evolve_result_with_std_and_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no internal call uses a deprecated name
        result = evolve_with_env(
            gym.make("CartPole-v1"),
            cartpole_net(),
            4,
            2,
            num_generations=2,
            episodes=Episodes(fitness=lambda population, idx: float(idx)),
        )
        explicit = evolve_with_env(
            gym.make("CartPole-v1"),
            cartpole_net(),
            4,
            2,
            num_generations=2,
            episodes=Episodes(fitness=lambda population, idx: float(idx)),
            return_history=True,
        )
    assert isinstance(result, EvolveResult) and isinstance(explicit, EvolveResult)
    policy, history = result  # the seed README's unpacking
    assert isinstance(policy, nn.Module) and result.policy is policy and result.history is history
    expected_std = float(torch.arange(4.0).std(correction=0))
    # validated: the custom fitness on the validation seeds (it ignores them); env_steps: none taken
    assert history == [
        GenerationStats(0, 3.0, 1.5, expected_std, 3.0, 0),
        GenerationStats(1, 3.0, 1.5, expected_std, 3.0, 0),
    ]
    assert history == explicit.history


def test_return_history_false_returns_the_same_policy_without_a_warning():
    def run(**kwargs):
        return evolve_with_env(
            [SeededLengthEnv() for _ in range(2)], tiny_net(), 4, 2, num_generations=2, horizon=3, seed=5, **kwargs
        )

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the seed README's semantics: the policy alone, not deprecated
        alone = run(return_history=False)
    result = run()
    assert isinstance(alone, nn.Module) and not isinstance(alone, tuple)
    for (name, a), (_, b) in zip(alone.state_dict().items(), result.policy.state_dict().items()):
        assert torch.equal(a, b), name


def test_resume_reads_version_1_checkpoints(tmp_path):
    """0.1's file: 'normalizer' instead of 'interactor', (generation, best, mean) history entries."""

    def run(gens, resume, folder):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
        return evolve_with_env(
            gym.make_vec("CartPole-v1", 4, vectorization_mode="sync"),
            model,
            8,
            2,
            action=argmax,
            num_generations=gens,
            horizon=40,
            seed=9,
            checkpointing=Checkpointing(dir=folder, resume=resume),
            env_options=EnvOptions(normalize_obs=True),
            validation=Validation(episodes=0),
        )  # 0.1's rule

    straight = run(3, False, None)
    run(2, False, tmp_path)
    path = tmp_path / CHECKPOINT_NAME
    state = load_checkpoint(path, kind="evolve_with_env")
    assert state["format"] == "populora.evolve_with_env/3" and len(state["history"][0]) == 6
    # 0.1 wrote the population after its generation's evolve_ (0.6.0 writes it before, with the fitnesses)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    envs = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync")
    options = dict(action=argmax, horizon=40, seed=9, validation=Validation(episodes=0))
    with EnvLoop(envs, model, 8, 2, env_options=EnvOptions(normalize_obs=True), **options) as loop:
        loop.load(path)
        loop.optimizer.evolve_(loop.pending, loop.setup.evolve)
        loop.interactor.update_obs_stats(loop.optimizer)
        evolved, obs_stats = loop.optimizer.snapshot("cpu"), loop.interactor.state_dict()["obs_stats"]
    old = {
        "format": "populora.evolve_with_env/1",
        "population": evolved,
        "normalizer": obs_stats,
        "history": [h[:3] for h in state["history"]],
        "base_checksum": state["base_checksum"],
    }
    atomic_save(old, path, kind="evolve_with_env")
    resumed = run(3, True, tmp_path)
    assert [h[:3] for h in resumed.history] == [h[:3] for h in straight.history]
    assert resumed.history[0].std is None and resumed.history[-1][:4] == straight.history[-1][:4]
    for (name, a), (_, b) in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().items()):
        assert torch.equal(a, b), name
    atomic_save({**old, "history": [(0, 1.0)]}, path, kind="evolve_with_env")
    with pytest.raises(CheckpointError, match="damaged history: an entry has 2 values, expected 3 to 6"):
        run(3, True, tmp_path)


# ----------------------------------------------------------------------------- slot sources


def sources_of(envs):
    return build_slots(envs).sources


def test_slot_sources_share_one_interface():
    """Each kind resets and steps any local slots: (k, D) observations, (k,) rewards and done flags."""
    kinds = {
        SingleEnvs: [SeededLengthEnv() for _ in range(3)],
        SubEnvSource: SyncVectorEnv([SeededLengthEnv for _ in range(3)]),
        VectorSource: gym.vector.VectorWrapper(SyncVectorEnv([SeededLengthEnv for _ in range(3)])),
    }
    for kind, envs in kinds.items():
        (src,) = sources_of(envs)
        assert type(src) is kind and (src.start, src.stop, src.num, src.whole) == (0, 3, 3, False)
        every = np.arange(3, dtype=np.int64)
        first = src.reset(every, [0, 1, 2])
        assert first.shape == (3, 2) and first.dtype == torch.float32
        assert first[:, 1].tolist() == [3.0 + s % 5 for s in (0, 1, 2)]
        local = np.array([2, 0], dtype=np.int64)
        obs, written, reward, done = src.step(local, torch.zeros(2, dtype=torch.int64))
        assert reward.tolist() == [1.0, 1.0] and done.tolist() == [False, False] and reward.dtype == np.float64
        rows = list(range(written.size))
        assert obs.shape == (written.size, 2) and obs[rows, 0].tolist() == [1.0] * written.size
        assert written is local if kind is not VectorSource else written.tolist() == [0, 1, 2]
        again = src.reset(np.array([1], dtype=np.int64), [4])
        assert again.shape == (1, 2) and again[0].tolist() == [0.0, 7.0]
        assert src.raw_env(1) is (envs[1] if kind is SingleEnvs else envs)


def test_runs_of_single_envs_between_vector_envs_are_one_source_each():
    envs = [
        SeededLengthEnv(),
        SeededLengthEnv(),
        SyncVectorEnv([SeededLengthEnv for _ in range(2)]),
        gym.vector.VectorWrapper(SyncVectorEnv([SeededLengthEnv for _ in range(2)])),
        SeededLengthEnv(),
    ]
    slots = build_slots(envs)
    assert [(type(s).__name__, s.start, s.stop) for s in slots.sources] == [
        ("SingleEnvs", 0, 2),
        ("SubEnvSource", 2, 4),
        ("VectorSource", 4, 6),
        ("SingleEnvs", 6, 7),
    ]
    assert slots.raw_env(1) is envs[1] and slots.raw_env(3) is envs[2] and slots.raw_env(6) is envs[4]
    interactor = interact_with_env(envs)
    pop = interactor.population(tiny_net(), 9, 2, seed=2)
    fitness = interactor.evaluate(pop, horizon=20, num_episodes=2)
    expected = (length_of(pop.eval_seed, 0) + length_of(pop.eval_seed, 1)) / 2
    assert fitness.tolist() == [expected] * 9  # no reward after an episode's end, whatever the source


def test_public_import_paths_still_work():
    from populora.interact import EnvStepError

    assert EnvStepError is EnvStepErrorFromEnvs
    assert vector_reset_seed(0, 0) == vector_reset_seed(0, 0) != vector_reset_seed(0, 1)
    assert episode_seed(3, 1) == __import__("populora.envs.schedule", fromlist=["x"]).episode_seed(3, 1)


@pytest.mark.parametrize(
    "fitness",
    [
        lambda population, individuals: torch.as_tensor(individuals, dtype=torch.float32),  # a rank's batch
        lambda population, idx: float(idx),  # per index
        lambda population: torch.arange(float(population.pop_size)),  # all at once
    ],
    ids=["individuals", "idx", "all"],
)
def test_the_seeds_fitness_keyword_takes_its_three_signatures(fitness):
    """The seed README's `evolve_with_env(..., fitness=fn)`: fitness i for individual i, in every signature."""
    result = evolve_with_env(gym.make("CartPole-v1"), cartpole_net(), 4, 2, num_generations=2, fitness=fitness)
    same = evolve_with_env(
        gym.make("CartPole-v1"), cartpole_net(), 4, 2, num_generations=2, episodes=Episodes(fitness=fitness)
    )
    assert [s.best for s in result.history] == [3.0, 3.0]
    assert [s.mean for s in result.history] == [1.5, 1.5]
    assert result.history == same.history  # the keyword and Episodes(fitness=) are the same option
    assert result.history[0].env_steps == 0  # no episode was played for training


def test_the_fitness_keyword_refuses_a_second_fitness_and_a_non_callable():
    with pytest.raises(InvalidValueError, match="custom fitness given twice"):
        evolve_with_env(gym.make("CartPole-v1"), cartpole_net(), 4, 2, fitness=len, episodes=Episodes(fitness=len))
    with pytest.raises(InvalidTypeError, match="`fitness` must be callable, got 3"):
        evolve_with_env(gym.make("CartPole-v1"), cartpole_net(), 4, 2, fitness=3)
