"""Presets per task and the conv policy path for image observations (issue 25, items 5 and 6)."""

from __future__ import annotations

import contextlib
import inspect

import gymnasium as gym
import numpy as np
import pytest
import torch

from populora import evolve_with_env, interact_with_env
from populora.errors import InvalidTypeError, InvalidValueError
from populora.interact import ES, GA, EnvOptions, Episodes, Validation
from populora.loops.env.presets import PRESETS, ConvPolicy, conv_policy, preset


@pytest.mark.parametrize(
    ("space", "shape", "channels_last"),
    [
        (gym.spaces.Box(0, 255, (96, 96, 3), np.uint8), (96, 96, 3), True),  # CarRacing
        (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), (4, 84, 84), False),  # ale-py's AtariVectorEnv
        (gym.spaces.Box(0, 10, (7, 7, 3), np.uint8), (7, 7, 3), True),  # MiniGrid's view
    ],
)
def test_conv_policy_reads_the_image_layout_from_the_space(space, shape, channels_last):
    torch.manual_seed(0)
    model = conv_policy(space, 5)
    assert model.channels_last == channels_last and model.scale == pytest.approx(1 / float(space.high.max()))
    out = model(torch.rand(3, *shape) * float(space.high.max()))
    assert out.shape == (3, 5) and torch.isfinite(out).all()
    # the head is what adapters evolve: two Linear layers; the convolutions stay random features
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [m.in_features for m in linear] == [model.features, 64]


def test_conv_policy_takes_the_image_entry_of_a_dict():
    space = gym.spaces.Dict({"direction": gym.spaces.Discrete(4), "image": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)})
    model = conv_policy(space, 3, scale=1.0)
    assert model.key == "image"
    obs = {"direction": torch.zeros(2), "image": torch.rand(2, 7, 7, 3)}
    assert model(obs).shape == (2, 3)
    with pytest.raises(InvalidValueError, match=r"needs `key=`.*\['a', 'b'\]"):
        conv_policy(gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)}), 3)


def test_conv_policy_names_what_it_needs():
    model = ConvPolicy((7, 7, 3), 3)
    with pytest.raises(InvalidTypeError, match=r"flatten_obs=False"):
        model(torch.zeros(2, 147))  # a flattened observation
    with pytest.raises(InvalidTypeError, match=r"key='image'.*\['direction'\]"):
        ConvPolicy((7, 7, 3), 3, key="image")({"direction": torch.zeros(2)})
    with pytest.raises(InvalidValueError, match=r"3 positive sizes"):
        ConvPolicy((7, 7), 3)
    with pytest.raises(InvalidValueError, match=r"`out` must be an int >= 1"):
        ConvPolicy((7, 7, 3), 0)
    with pytest.raises(InvalidValueError, match=r"2 widths for a 7x7 image"):
        ConvPolicy((7, 7, 3), 3, channels=[8, 8, 8])


@pytest.mark.parametrize("algorithm", [GA(), ES(sigma=0.1, lr=0.05)], ids=["ga", "es"])
def test_a_conv_policy_evolves_on_image_observations(algorithm):
    """MiniGrid's Dict of a 7x7 image (its text dropped), kept as images: both algorithms play it."""
    p = preset("MiniGrid-Empty-Random-5x5-v0")
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="freezes") if isinstance(algorithm, ES) else contextlib.nullcontext():
        result = evolve_with_env(
            p.env,
            p.model(),
            pop_size=4,
            low_rank=2,
            action=p.kwargs["action"],
            num_generations=2,
            horizon=6,
            algorithm=algorithm,
            episodes=Episodes(num_episodes=1),
            validation=Validation(episodes=2, top=1),
            env_options=EnvOptions(num_envs=2, flatten_obs=False, drop_obs_keys=("mission",)),
        )
    assert len(result.history) == 2 and all(0.0 <= h.best <= 1.0 for h in result.history)
    with interact_with_env(p.env, num_envs=2, **p.interact) as interactor:
        returns = interactor.play(result.policy, num_episodes=3, **p.play)
    assert returns.shape == (3,) and bool(((returns >= 0) & (returns <= 1)).all())


def test_presets_are_evolve_with_env_arguments_and_fresh_copies():
    parameters = set(inspect.signature(evolve_with_env).parameters)
    for task in PRESETS:
        p = preset(task)
        assert p.task == task and p.target is not None
        assert set(p.kwargs) <= parameters, set(p.kwargs) - parameters
        assert {"pop_size", "low_rank"} <= set(p.kwargs)
        assert set(p.play) <= {"action", "to_range", "horizon"}
    first = preset("LunarLander-v3")
    first.kwargs["pop_size"] = 2
    assert preset("LunarLander-v3").kwargs["pop_size"] == 32
    with pytest.raises(InvalidValueError, match=r"no preset for task 'Hopper-v5'.*LunarLander-v3"):
        preset("Hopper-v5")


def test_a_preset_runs_as_documented():
    """The module's usage: ``evolve_with_env(p.env, p.model(), seed=..., **p.kwargs)`` then ``play(**p.play)``."""
    p = preset("CartPole-v1")
    options = {**p.kwargs, "num_generations": 1, "pop_size": 4}
    torch.manual_seed(0)
    policy, history = evolve_with_env(p.env, p.model(), seed=0, horizon=20, **options)
    with interact_with_env(p.env, num_envs=2) as interactor:
        returns = interactor.play(policy, num_episodes=2, horizon=20, **p.play)
    assert len(history) == 1 and bool(((returns >= 1) & (returns <= 20)).all())


def test_the_environment_task_presets_hold_their_documented_settings():
    """The settings docs/guides/environments.md lists for the three-seed tasks (issue 25, item 6)."""
    lander = preset("LunarLander-v3")
    kw = lander.kwargs
    assert (kw["pop_size"], kw["low_rank"], kw["horizon"]) == (32, 4, 1000)
    assert isinstance(kw["algorithm"], GA) and kw["episodes"] == Episodes(num_episodes=2)
    assert kw["env_options"] == EnvOptions(num_envs=16, normalize_obs=True)
    assert "target_fitness" not in kw and lander.target == 200.0  # the whole budget: an early stop cost seed 1
    assert kw["budget"].max_env_steps <= 2_000_000 and lander.play == {"horizon": 1000}

    continuous = preset("LunarLanderContinuous-v3")
    kw = continuous.kwargs
    assert (kw["pop_size"], kw["low_rank"], kw["horizon"]) == (128, 2, 1000)
    assert kw["algorithm"] == ES(sigma=0.1, optimizer="clipup", lr=0.03)
    assert kw["budget"].max_env_steps <= 2_000_000 and continuous.target == 200.0
    model = continuous.model()  # zero-started linear policy: 8 observations -> 2 Box actions
    assert [tuple(p.shape) for p in model.parameters()] == [(2, 8), (2,)]
    assert all(bool((p == 0).all()) for p in model.parameters())

    pendulum = preset("Pendulum-v1")
    kw = pendulum.kwargs
    assert kw["horizon"] == 200 and kw["env_options"].normalize_obs and kw["env_options"].to_range == (-2.0, 2.0)
    assert (kw["pop_size"], kw["low_rank"]) == (64, 2)
    assert kw["algorithm"] == ES(sigma=0.5, optimizer="clipup", lr=0.3)
    # each antithetic pair its own start state (the ES's 'independent'), judged on 30 validation episodes
    assert kw["episodes"] == Episodes(num_episodes=1, seeding="independent")
    assert kw["validation"] == Validation(episodes=30, top=1)
    assert kw["target_fitness"] == pendulum.target == -200.0 and kw["budget"].max_env_steps <= 5_000_000
    out = pendulum.model()(torch.zeros(5, 3))  # Tanh output, scaled to the torque range by to_range
    assert out.shape == (5, 1) and bool((out.abs() < 1).all())
