"""Faults and bad input around environments (issue 10, items 1, 4, 8, 14, 15).

* ``evolve_with_env(checkpointing=Checkpointing(dir, resume=True))`` on a damaged or foreign checkpoint raises
  ``CheckpointError`` naming the file, and gives the model back unwrapped
  with the user's ``requires_grad`` flags;
* bad ``GA(evolve_kwargs=...)`` fail before the first env step;
* an inf reward is traced to the env, slot and individual, and the advice
  printed for it works;
* bad input raises ``PopuloraError`` subclasses that are also the builtin.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from populora import evolve_with_env, interact_with_env
from populora.checkpoint import atomic_save
from populora.errors import CheckpointError, FitnessError, PopuloraError
from populora.loops.env.evolve import CHECKPOINT_NAME
from populora.loops.env.options import GA, Checkpointing


class CountingEnv(gym.Env):
    """Observation ``[t, 1]``; reward ``rewards[t - 1]`` (default 1) for 8 steps. ``steps`` counts every step."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    total_steps = 0

    def __init__(self, rewards: dict[int, float] | None = None):
        self.rewards = rewards or {}
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 1.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        CountingEnv.total_steps += 1
        obs = np.array([self.t, 1.0], dtype=np.float32)
        return obs, self.rewards.get(self.t, 1.0), self.t >= 8, False, {}

    def __repr__(self) -> str:
        return f"CountingEnv(rewards={self.rewards})"


def model_with_a_frozen_layer() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))
    model[0].bias.requires_grad_(False)  # the user's own flag: must come back as it was
    return model


def flags(model: nn.Module) -> dict[str, bool]:
    return {name: p.requires_grad for name, p in model.named_parameters()}


def assert_given_back(model: nn.Module, before: dict[str, bool]) -> None:
    assert flags(model) == before
    assert all("forward" not in vars(m) for m in model.modules())  # no routed wrapper left


def run(folder, model, generations=2, resume=False):
    return evolve_with_env(
        [CountingEnv() for _ in range(2)],
        model,
        pop_size=4,
        low_rank=1,
        num_generations=generations,
        horizon=8,
        checkpointing=Checkpointing(dir=folder, resume=resume),
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The bytes of a real evolve_with_env checkpoint (written after generation 0)."""
    folder = tmp_path_factory.mktemp("ckpt")
    run(folder, model_with_a_frozen_layer())
    return (folder / CHECKPOINT_NAME).read_bytes()


def damaged(data: bytes, how: str) -> bytes:
    if how == "truncated":
        return data[: len(data) // 2]
    if how == "empty":
        return b""
    if how == "text":
        return b"this is a text file, not a checkpoint\n"
    flipped = bytearray(data)
    flipped[len(data) - 200] ^= 0xFF  # inside the payload (the tensors)
    return bytes(flipped)


@pytest.mark.parametrize("how", ["truncated", "empty", "text", "bit-flipped"])
def test_resume_from_a_damaged_checkpoint_raises_checkpoint_error(how, checkpoint, tmp_path):
    path = tmp_path / CHECKPOINT_NAME
    path.write_bytes(damaged(checkpoint, how))
    model = model_with_a_frozen_layer()
    before = flags(model)
    CountingEnv.total_steps = 0
    with pytest.raises(CheckpointError, match=str(path)):
        run(tmp_path, model, resume=True)
    assert CountingEnv.total_steps == 0  # failed before the first episode
    assert_given_back(model, before)


def test_resume_from_a_foreign_checkpoint_names_the_kind(tmp_path):
    path = atomic_save({"format": "populora.population/1"}, tmp_path / CHECKPOINT_NAME, kind="Population")
    model = model_with_a_frozen_layer()
    before = flags(model)
    with pytest.raises(CheckpointError, match=rf"{path}.*Population"):
        run(tmp_path, model, resume=True)
    assert_given_back(model, before)


def test_resume_with_another_model_or_format_raises_checkpoint_error(checkpoint, tmp_path):
    (tmp_path / CHECKPOINT_NAME).write_bytes(checkpoint)
    other = model_with_a_frozen_layer()
    with torch.no_grad():
        other[2].weight.add_(1.0)
    before = flags(other)
    with pytest.raises(CheckpointError, match="differs from the one"):
        run(tmp_path, other, resume=True)
    assert_given_back(other, before)
    atomic_save({"format": "something else"}, tmp_path / CHECKPOINT_NAME, kind="evolve_with_env")
    model = model_with_a_frozen_layer()
    with pytest.raises(CheckpointError, match="is not an evolve_with_env checkpoint"):
        run(tmp_path, model, resume=True)
    assert_given_back(model, flags(model_with_a_frozen_layer()))


def test_a_good_resume_still_continues(checkpoint, tmp_path):
    (tmp_path / CHECKPOINT_NAME).write_bytes(checkpoint)
    result = run(tmp_path, model_with_a_frozen_layer(), generations=3, resume=True)
    assert [h.generation for h in result.history] == [0, 1, 2]


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"mutaton_type": "full_gaussian"}, TypeError, r"'mutaton_type' \(did you mean 'mutation_type'\?\)"),
        ({"fitnesses": [1, 2]}, TypeError, "'fitnesses'"),
        ({"mutation_type": "no_such_mutation"}, ValueError, "no_such_mutation"),
        ({"crossover_type": "no_such_crossover"}, ValueError, "no_such_crossover"),
        ({"epsilon": -1}, ValueError, "epsilon"),
        ({"survive_frac": 0.0}, ValueError, "survive_frac"),
    ],
)
def test_bad_evolve_kwargs_fail_before_the_first_episode(options, error, message):
    model = model_with_a_frozen_layer()
    before = flags(model)
    CountingEnv.total_steps = 0
    with pytest.raises(error, match=message) as caught:
        evolve_with_env(
            [CountingEnv() for _ in range(2)],
            model,
            pop_size=4,
            low_rank=1,
            num_generations=2,
            horizon=8,
            algorithm=GA(evolve_kwargs=options),
        )
    assert isinstance(caught.value, PopuloraError)
    assert CountingEnv.total_steps == 0
    assert_given_back(model, before)


def test_checking_evolve_kwargs_does_not_change_the_run():
    """The up-front check runs one evolve_ and restores the population: the run is the one without it."""

    def go(options):
        return evolve_with_env(
            [CountingEnv({3: 0.5}) for _ in range(2)],
            model_with_a_frozen_layer(),
            pop_size=4,
            low_rank=1,
            num_generations=3,
            horizon=8,
            algorithm=GA(evolve_kwargs=options),
            seed=4,
        )

    with_check = go({"epsilon": 0.1})  # the default value, passed explicitly: the check runs
    without = go({})
    assert [tuple(h) for h in with_check.history] == [tuple(h) for h in without.history]
    for a, b in zip(with_check.policy.parameters(), without.policy.parameters()):
        assert torch.equal(a, b)  # same shapes, same computation


# ----------------------------------------------------------------------------- non-finite rewards


def slots_with(reward: float):
    return [CountingEnv(), CountingEnv({3: reward})]


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))


def test_a_positive_inf_reward_is_traced_and_raises_under_every_nan_policy():
    for policy in ("raise", "worst"):
        interactor = interact_with_env(slots_with(math.inf))
        pop = interactor.population(tiny(), 3, 2, nan_policy=policy)
        with pytest.raises(
            FitnessError,
            match=(
                r"env CountingEnv\(rewards=\{3: inf\}\) returned a \+inf reward at "
                r"slot 1 \(individual 1, episode 0, step 3\).*ClipReward"
            ),
        ):
            interactor.evaluate(pop, horizon=8)


def test_the_advice_for_positive_inf_works():
    envs = [gym.wrappers.ClipReward(env, -10.0, 10.0) for env in slots_with(math.inf)]
    interactor = interact_with_env(envs)
    pop = interactor.population(tiny(), 3, 2)
    fitness = interactor.evaluate(pop, horizon=8)
    assert fitness.tolist() == [8.0, 17.0, 8.0]  # individual 1 played slot 1: 7 x 1 + one clipped 10
    pop.evolve_(fitness)


def test_a_negative_inf_reward_raises_with_advice_that_works():
    interactor = interact_with_env(slots_with(-math.inf))
    pop = interactor.population(tiny(), 3, 2)
    with pytest.raises(
        FitnessError,
        match=r"returned a -inf reward at slot 1 \(individual 1, episode 0, "
        r"step 3\).*nan_policy='worst'",
    ):
        interactor.evaluate(pop, horizon=8)
    worst = interactor.population(tiny(), 3, 2, nan_policy="worst")
    fitness = interactor.evaluate(worst, horizon=8)
    assert fitness[1] == -math.inf and fitness[0] == 8.0
    assert int(worst.validate_fitnesses(fitness).argmin()) == 1
    worst.evolve_(fitness)
    with pytest.raises(FitnessError, match=r"-inf reward at slot 1 \(individual 1"):
        evolve_with_env(slots_with(-math.inf), tiny(), pop_size=3, low_rank=1, num_generations=1, horizon=8)
    result = evolve_with_env(
        slots_with(-math.inf),
        tiny(),
        pop_size=3,
        low_rank=1,
        num_generations=2,
        horizon=8,
        algorithm=GA(population_kwargs=dict(nan_policy="worst")),
    )
    assert len(result.history) == 2


def test_a_nan_reward_names_the_env_too():
    interactor = interact_with_env(slots_with(math.nan))
    pop = interactor.population(tiny(), 3, 2)
    with pytest.raises(
        FitnessError,
        match=r"env CountingEnv\(rewards=\{3: nan\}\) returned a NaN reward at slot 1 "
        r"\(individual 1, episode 0, step 3\)",
    ):
        interactor.evaluate(pop, horizon=8)


# ----------------------------------------------------------------------------- error classes


def bad_calls():
    env = CountingEnv()
    interactor = interact_with_env([CountingEnv(), CountingEnv()])
    pop = interactor.population(tiny(), 2, 1)
    cont = interact_with_env(gym.make("Pendulum-v1"))
    cpop = cont.population(nn.Sequential(nn.Linear(3, 1)), 2, 1)
    return {
        "empty list": (ValueError, lambda: interact_with_env([])),
        "None": (ValueError, lambda: interact_with_env(None)),
        "factory in a list": (TypeError, lambda: interact_with_env([env, CountingEnv])),
        "num_envs for one env": (ValueError, lambda: interact_with_env(env, num_envs=2)),
        "num_envs float": (TypeError, lambda: interact_with_env(CountingEnv, num_envs=2.5)),
        "normalize without flatten": (
            ValueError,
            lambda: interact_with_env(env, normalize_obs=True, flatten_obs=False),
        ),
        "horizon": (ValueError, lambda: interactor.evaluate(pop, horizon=-1)),
        "horizon type": (TypeError, lambda: interactor.evaluate(pop, horizon="10")),
        "action not callable": (TypeError, lambda: interactor.evaluate(pop, action="argmax")),
        "not a population": (TypeError, lambda: interactor.evaluate(tiny())),
        "individuals out of range": (IndexError, lambda: interactor.episode_returns(pop, [5])),
        "individuals floats": (TypeError, lambda: interactor.episode_returns(pop, [0.5])),
        "action shape": (ValueError, lambda: interactor.evaluate(pop, action=lambda out: out, horizon=3)),
        "float action for Discrete": (
            TypeError,
            lambda: interactor.evaluate(pop, action=lambda out: out[:, 0], horizon=3),
        ),
        "action out of range": (
            ValueError,
            lambda: interactor.evaluate(pop, action=lambda out: out.argmax(-1) + 5, horizon=3),
        ),
        "to_range on Discrete": (ValueError, lambda: interactor.evaluate(pop, to_range=(-1, 1))),
        "to_range not a pair": (ValueError, lambda: cont.evaluate(cpop, to_range=(1,), horizon=3)),
        "to_range strings": (TypeError, lambda: cont.evaluate(cpop, to_range=("a", "b"), horizon=3)),
        "to_range lo >= hi": (ValueError, lambda: cont.evaluate(cpop, to_range=(1, -1), horizon=3)),
        "play seed": (TypeError, lambda: interactor.play(tiny(), seed="x")),
        "num_generations": (ValueError, lambda: evolve_with_env(env, tiny(), 2, 1, num_generations=0)),
        "evolve_kwargs type": (TypeError, lambda: evolve_with_env(env, tiny(), 2, 1, algorithm=GA(evolve_kwargs=[1]))),
        "population_kwargs type": (
            TypeError,
            lambda: evolve_with_env(env, tiny(), 2, 1, algorithm=GA(population_kwargs=3)),
        ),
        "target_fitness": (TypeError, lambda: evolve_with_env(env, tiny(), 2, 1, target_fitness="x")),
        "resume without dir": (
            ValueError,
            lambda: evolve_with_env(env, tiny(), 2, 1, checkpointing=Checkpointing(resume=True)),
        ),
        "option object type": (TypeError, lambda: evolve_with_env(env, tiny(), 2, 1, episodes={"num_episodes": 2})),
    }


@pytest.mark.parametrize("case", sorted(bad_calls()))
def test_bad_input_raises_populora_errors_that_are_the_builtin(case):
    builtin, call = bad_calls()[case]
    with pytest.raises(builtin) as caught:
        call()
    assert isinstance(caught.value, PopuloraError), type(caught.value).__mro__
