"""Actions checked once (issue 25, item 4).

Without an ``action=`` map, a model whose output width cannot map onto the
action space raises at the first step, naming both, whichever actions its
outputs would pick; outputs of the right width map onto every space kind.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from populora.envs.actions import ActionFormat
from populora.envs.interactor import interact_with_env
from populora.errors import InvalidTypeError, InvalidValueError


def policy(inp: int, out: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(inp, 8), nn.Tanh(), nn.Linear(8, out))


# ----------------------------------------------------------------------------- the format alone


@pytest.mark.parametrize(
    "space, width, bad",
    [
        (gym.spaces.Discrete(2), 2, 3),
        (gym.spaces.Discrete(4, start=-1), 4, 2),
        (gym.spaces.Box(-2, 2, (1,)), 1, 2),
        (gym.spaces.Box(-1, 1, (2, 3)), 6, 5),
        (gym.spaces.MultiDiscrete([3, 2, 4]), 9, 3),
        (gym.spaces.MultiBinary(4), 4, 5),
    ],
)
def test_a_wrong_width_raises_naming_both(space, width, bad):
    fmt = ActionFormat(space)
    assert fmt.width == width
    outputs = torch.zeros(3, bad)
    outputs[:, 0] = 1.0  # an argmax inside the space: the width alone is refused
    name = repr(space).replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(
        InvalidValueError,
        match=rf"outputs have shape \(3, {bad}\) \({bad} per slot\); the action "
        rf"space {name} takes {width} (logits|outputs?) per slot",
    ):
        fmt.default_actions(outputs, 3)


def test_the_default_action_of_each_space_kind():
    discrete = ActionFormat(gym.spaces.Discrete(3, start=-1))
    assert discrete.default_actions(torch.eye(3), 3).tolist() == [-1, 0, 1]  # start + argmax
    multi = ActionFormat(gym.spaces.MultiDiscrete([3, 2, 4], start=[0, 1, -1]))
    logits = torch.tensor([[0.0, 5, 0, 1, 0, 0, 0, 0, 9], [7.0, 0, 0, 0, 2, 0, 3, 0, 0]])
    assert multi.default_actions(logits, 2).tolist() == [[1, 1, 2], [0, 2, 0]]
    square = ActionFormat(gym.spaces.MultiDiscrete([[3, 3], [3, 3]]))
    assert square.default_actions(torch.arange(12.0).reshape(1, 12), 1).tolist() == [[[2, 2], [2, 2]]]
    binary = ActionFormat(gym.spaces.MultiBinary([2, 2]))
    assert binary.default_actions(torch.tensor([[1.0, -1, 0, 2]]), 1).tolist() == [[[1, 0], [0, 1]]]
    box = ActionFormat(gym.spaces.Box(-1, 1, (2, 3)))
    out = box.default_actions(torch.arange(6.0).reshape(1, 6), 1)
    assert out.shape == (1, 2, 3) and out.dtype == torch.float32 and out.flatten().tolist() == list(range(6))
    assert box.default_actions(torch.ones(2, 2, 3), 2).shape == (2, 2, 3)
    pendulum = ActionFormat(gym.spaces.Box(-2, 2, (1,)))
    assert pendulum.default_actions(torch.ones(4), 4).shape == (4, 1)  # (k,) outputs of a 1-dim Box
    for space in (gym.spaces.MultiDiscrete([3, 2]), gym.spaces.MultiBinary(2)):  # actions output by the model
        actions = torch.tensor([[1, 0], [0, 1]])
        assert torch.equal(ActionFormat(space).default_actions(actions, 2), actions)


def test_multi_discrete_actions_match_gymnasiums_one_hot_order():
    """The logits of ``MultiDiscrete`` entries follow ``gymnasium.spaces.flatten``'s one-hot layout."""
    space = gym.spaces.MultiDiscrete([4, 2, 3], start=[2, 0, -1])
    fmt = ActionFormat(space)
    space.seed(0)
    for _ in range(5):
        action = space.sample()
        one_hot = torch.from_numpy(gym.spaces.flatten(space, action).astype(np.float32))
        assert fmt.default_actions(one_hot.unsqueeze(0), 1)[0].tolist() == action.tolist()


def test_outputs_that_are_not_a_tensor_are_refused():
    with pytest.raises(
        InvalidTypeError,
        match=r"the model returned tuple; without `action=` the action space "
        r"Discrete\(2\) takes a \(k, 2\) tensor",
    ):
        ActionFormat(gym.spaces.Discrete(2)).default_action((torch.zeros(1, 2),))


def test_a_float_model_for_integer_multi_discrete_actions_needs_the_logit_width():
    fmt = ActionFormat(gym.spaces.MultiDiscrete([3, 2]))
    with pytest.raises(InvalidValueError, match=r"takes 5 logits per slot \(nvec \[3, 2\] concatenated"):
        fmt.default_actions(torch.zeros(2, 2), 2)


# ----------------------------------------------------------------------------- at the first step


class CountingCartPole(gym.Wrapper):
    """CartPole counting its steps (a width error must come before any)."""

    steps = 0

    def step(self, action):
        CountingCartPole.steps += 1
        return super().step(action)


def test_three_logits_for_cartpole_raise_at_the_first_step():
    CountingCartPole.steps = 0
    interactor = interact_with_env([CountingCartPole(gym.make("CartPole-v1")) for _ in range(2)])
    assert interactor.check_replay() is None  # the replay check's own random actions, before any episode
    CountingCartPole.steps = 0
    pop = interactor.population(policy(4, 3), 4, 2, seed=0)
    with pytest.raises(
        InvalidValueError,
        match=r"outputs have shape \(2, 3\) \(3 per slot\); the action space "
        r"Discrete\(2\) takes 2 logits per slot",
    ):
        interactor.evaluate(pop, horizon=50)
    assert CountingCartPole.steps == 0
    mapped = interactor.evaluate(pop, action=lambda out: out[:, :2].argmax(-1), horizon=5)  # `action=` maps them
    assert mapped.tolist() == [5.0] * 4


def test_two_outputs_for_pendulum_raise_at_the_first_step_also_with_to_range():
    interactor = interact_with_env([gym.make("Pendulum-v1") for _ in range(2)])
    pop = interactor.population(policy(3, 2), 2, 2, seed=0)
    for kwargs in ({}, {"to_range": (-2.0, 2.0)}):
        with pytest.raises(
            InvalidValueError,
            match=r"outputs have shape \(2, 2\).*Box\(-2.0, 2.0, \(1,\), float32\) "
            r"takes 1 output per slot",
        ):
            interactor.evaluate(pop, horizon=5, **kwargs)
    fitness = interactor.evaluate(pop, action=lambda out: out[:, :1], horizon=5)
    assert fitness.shape == (2,) and torch.isfinite(fitness).all()
