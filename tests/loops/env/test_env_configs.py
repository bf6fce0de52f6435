"""The option objects of evolve_with_env as Configs: JSON round trip, typed GA / ES fields, deprecated dict
aliases (same run bit for bit), the loops' Budget, the run's options stored in its checkpoint."""

from __future__ import annotations

import dataclasses
import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from populora import evolve_with_env
from populora.checkpoint import atomic_save, load_checkpoint
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.loops import base
from populora.loops.env.evolve import CHECKPOINT_NAME
from populora.loops.env.options import (
    ENV_EVOLUTION,
    ES,
    GA,
    Budget,
    Checkpointing,
    EnvOptions,
    Episodes,
    Validation,
)
from populora.loops.env.presets import Preset
from populora.population.evolution import Evolution


class AlternateEnv(gym.Env):
    """Observation ``[t, 1]``; reward 1 when the action is ``t % 2``, for 6 steps (individuals differ)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 1.0], dtype=np.float32), {}

    def step(self, action):
        reward = float(int(action) == self.t % 2)
        self.t += 1
        return np.array([self.t, 1.0], dtype=np.float32), reward, self.t >= 6, False, {}


def go(algorithm=None, generations=3, checkpointing=None, **options):
    torch.manual_seed(0)
    return evolve_with_env(
        [AlternateEnv() for _ in range(2)],
        nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2)),
        pop_size=4,
        low_rank=1,
        num_generations=generations,
        horizon=6,
        seed=3,
        algorithm=algorithm if algorithm is not None else GA(),
        checkpointing=checkpointing,
        **options,
    )


def same_run(a, b):
    assert [tuple(h) for h in a.history] == [tuple(h) for h in b.history]
    for x, y in zip(a.policy.parameters(), b.policy.parameters()):
        assert torch.equal(x, y)


@pytest.mark.parametrize(
    "option",
    [
        Episodes(num_episodes=2, seeding="common"),
        Validation(episodes=3, top=1),
        Checkpointing("runs/x", resume=True),
        EnvOptions(num_envs=2, normalize_obs=True, to_range=(-2.0, 2.0), drop_obs_keys=("mission",)),
        Budget(max_env_steps=100, max_seconds=5.0),
        GA(evolution=dataclasses.replace(ENV_EVOLUTION, survive_frac=0.25), population_kwargs={"init_scale": 0.5}),
        GA(population_kwargs={"dtype": torch.float64}),  # a dtype by its name
        ES(sigma=0.1, optimizer="clipup", max_speed=0.2, antithetic=True, noise_reuse=2),
    ],
    ids=lambda option: type(option).__name__,
)
def test_every_option_object_round_trips_through_json(option):
    back = type(option).from_dict(json.loads(json.dumps(option.to_dict())))
    assert back == option


def test_budget_is_the_loops_budget_and_max_steps_is_refused_by_evolve_with_env():
    assert Budget is base.Budget
    with pytest.raises(InvalidValueError, match=r"`Budget\.max_steps` does not apply to evolve_with_env"):
        go(budget=Budget(max_steps=2))


def test_ga_fields_are_checked_when_built():
    with pytest.raises(InvalidValueError, match=r"`Evolution\.survive_frac`"):
        GA(evolution=dataclasses.replace(ENV_EVOLUTION, survive_frac=1.5))
    with pytest.raises(InvalidTypeError, match=r"`GA\.evolution` must be"):
        GA(evolution={"epsilon": 0.3})  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match=r"'init_scal' \(did you mean 'init_scale'\?\)"):
        GA(population_kwargs={"init_scal": 1.0})
    with pytest.raises(InvalidValueError, match="not both"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            GA(evolution=Evolution(), evolve_kwargs={"epsilon": 0.5})


def test_deprecated_evolve_kwargs_warn_and_give_the_same_run_bit_for_bit():
    with pytest.warns(DeprecationWarning, match=r"GA\(evolve_kwargs=\) is deprecated"):
        old = GA(evolve_kwargs={"epsilon": 0.5, "survive_frac": 0.25})
    new = GA(evolution=dataclasses.replace(ENV_EVOLUTION, epsilon=0.5, survive_frac=0.25))
    assert old == new and old.evolution.epsilon == 0.5
    with pytest.raises(InvalidTypeError, match=r"'epsilonn'"):
        GA(evolve_kwargs={"epsilonn": 0.1})  # still checked key by key when built
    same_run(go(old), go(new))


def test_deprecated_es_extra_moves_into_the_typed_fields():
    with pytest.warns(
        DeprecationWarning, match=r"ES\(extra=\) is deprecated.*ES\(noise_reuse=\.\.\., antithetic=\.\.\.\)"
    ):
        old = ES(extra={"noise_reuse": 2, "antithetic": True})
    assert old == ES(noise_reuse=2) and old.extra == {}
    with pytest.raises(InvalidValueError, match=r"`ES\.noise_reuse` must be an int >= 1"):
        ES(noise_reuse=0)
    with pytest.raises(InvalidTypeError, match="'elite_frac'"):
        ES(extra={"elite_frac": 0.2})


def test_a_resume_with_other_options_is_refused_naming_the_field(tmp_path):
    go(checkpointing=Checkpointing(tmp_path), generations=2)
    stored = load_checkpoint(tmp_path / CHECKPOINT_NAME, kind="evolve_with_env")["config"]
    assert stored["algorithm"]["kind"] == "GA" and stored["algorithm"]["evolution"]["epsilon"] == 0.3
    other = GA(evolution=dataclasses.replace(ENV_EVOLUTION, epsilon=0.5))
    with pytest.raises(
        CheckpointError,
        match=r"evolve_with_env\.algorithm\.evolution\.epsilon=0\.3; this run has "
        r"evolve_with_env\.algorithm\.evolution\.epsilon=0\.5",
    ):
        go(other, checkpointing=Checkpointing(tmp_path, resume=True))
    with pytest.raises(CheckpointError, match=r"evolve_with_env\.episodes\.num_episodes=1"):
        go(checkpointing=Checkpointing(tmp_path, resume=True), episodes=Episodes(num_episodes=2))
    go(checkpointing=Checkpointing(tmp_path, resume=True), generations=3)  # more generations: the same run


def test_a_checkpoint_without_the_config_resumes_as_before(tmp_path):
    straight = go(generations=3)
    go(checkpointing=Checkpointing(tmp_path), generations=2)
    path = tmp_path / CHECKPOINT_NAME
    state = load_checkpoint(path, kind="evolve_with_env")
    del state["config"]  # what 0.5.0 wrote
    atomic_save(state, path, kind="evolve_with_env")
    same_run(go(checkpointing=Checkpointing(tmp_path, resume=True), generations=3), straight)


def test_a_preset_checks_its_keys_when_built():
    with pytest.raises(InvalidTypeError, match=r"'num_generation' \(did you mean 'num_generations'\?\)"):
        Preset("X", "X", nn.Linear, {"num_generation": 3})
    with pytest.raises(InvalidTypeError, match=r"kwargs\['algorithm'\]"):
        Preset("X", "X", nn.Linear, {"algorithm": "ga"})
    with pytest.raises(InvalidTypeError, match=r"'episodes'.*EnvInteractor\.play"):
        Preset("X", "X", nn.Linear, {}, play={"episodes": 3})
