"""The README's two "Environment Evolution" blocks run as written.

The blocks below are copied verbatim from the API contract
(``shared/seeds/populora-0.1.18-README.txt``). They run in order in one
namespace, on real dm_control cartpole-balance, with the substitutions the
spec allows: ``torch``, ``backbone`` and ``num_generations`` defined
beforehand, smaller ``num_generations`` / ``horizon``. Then the same calls
run on gymnasium's CartPole-v1, whose actions are ``{0, 1}`` (so the action
map is ``argmax`` there) and whose observations have 4 numbers.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from populora import GenerationStats

BLOCK_EVOLVE = """\
from torch import nn
from dm_control import suite
from populora import evolve_with_env

env = suite.load('cartpole', 'balance')  # any env from any sim

# evolve the population in one call - `action` maps the model's outputs to the
# env's actions; `lora_targets` auto-discovers every Linear layer when omitted.
# pass `target_fitness` to stop early once it is reached, and
# `return_history = True` for the per-generation best / mean

policy, history = evolve_with_env(
    [env for _ in range(16)],             # one env, a list, a vector env, or a factory
    nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2)),
    pop_size = 16,
    low_rank = 16,
    action = lambda logits: logits.argmax(-1) * 2 - 1,  # discrete bang-bang
    num_generations = 25,
    horizon = 1000,
    seed = 0,
    progress = True
)
"""

BLOCK_INTERACT = """\
from populora import interact_with_env

interactor = interact_with_env(
    [env for _ in range(16)],
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
)

population = interactor.population(backbone, pop_size = 16, low_rank = 16)

for gen in range(num_generations):
    fitnesses = interactor.evaluate(
        population,
        action = lambda logits: logits.argmax(-1) * 2 - 1,
        horizon = 1000,
        num_episodes = 1
    )

    population.evolve_(fitnesses, survive_frac = 0.5, elite_frac = 0.2, mutation_type = 'full_gaussian', epsilon = 0.2)

policy = population.select_and_merge_best_(fitnesses)
"""

SMALLER = {"num_generations = 25": "num_generations = 2", "horizon = 1000": "horizon = 30"}


def _smaller(block: str) -> str:
    for old, new in SMALLER.items():
        block = block.replace(old, new)
    return block


def _run_blocks(blocks: list[str], namespace: dict) -> dict:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*same environment object several times.*deep copy")
        for block in blocks:
            exec(compile(block, "<README block>", "exec"), namespace)
    return namespace


def test_blocks_are_verbatim():
    assert "suite.load('cartpole', 'balance')" in BLOCK_EVOLVE
    assert "for gen in range(num_generations):" in BLOCK_INTERACT
    for old in SMALLER:
        assert old in BLOCK_EVOLVE or old in BLOCK_INTERACT


def test_environment_blocks_on_dm_control_cartpole():
    pytest.importorskip("dm_control")
    torch.manual_seed(0)
    namespace = {
        "torch": torch,
        "backbone": nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2)),
        "num_generations": 2,
    }
    ns = _run_blocks([_smaller(BLOCK_EVOLVE), _smaller(BLOCK_INTERACT)], namespace)
    history = ns["history"]
    assert [h.generation for h in history] == [0, 1] and all(isinstance(h, GenerationStats) for h in history)
    assert all(0 < h.mean <= h.best <= 30 for h in history)  # cartpole-balance pays at most 1 per step
    assert ns["interactor"].num_slots == 16  # [env for _ in range(16)]: the env and 15 deep copies of it
    for policy in (ns["policy"],):
        out = policy(torch.zeros(3, 5))
        assert out.shape == (3, 2)
    assert ns["fitnesses"].shape == (16,)


def test_the_same_calls_on_gymnasium_cartpole():
    gym = pytest.importorskip("gymnasium")
    torch.manual_seed(0)
    block_evolve = (
        _smaller(BLOCK_EVOLVE)
        .replace("from dm_control import suite\n", "import gymnasium as gym\n")
        .replace("suite.load('cartpole', 'balance')", "gym.make('CartPole-v1')")
        .replace("nn.Linear(5, 32)", "nn.Linear(4, 32)")
        .replace("logits.argmax(-1) * 2 - 1", "logits.argmax(-1)")
    )
    block_interact = _smaller(BLOCK_INTERACT).replace("logits.argmax(-1) * 2 - 1", "logits.argmax(-1)")
    namespace = {
        "torch": torch,
        "backbone": nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2)),
        "num_generations": 2,
    }
    ns = _run_blocks([block_evolve, block_interact], namespace)
    assert isinstance(ns["env"], gym.Env)
    assert [h.generation for h in ns["history"]] == [0, 1]
    assert all(1 <= h.mean <= h.best <= 30 for h in ns["history"])
    assert ns["policy"](torch.zeros(1, 4)).shape == (1, 2)
    assert ns["fitnesses"].shape == (16,)
