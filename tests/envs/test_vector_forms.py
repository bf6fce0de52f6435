"""Every vector env form a maintained simulator ships (issue 25, item 2).

Forms that reset one slot with a seed (gymnasium's Sync / Async vector envs,
pufferlib's ``Serial``, ale-py's ``AtariVectorEnv``) must play exactly the
episodes a list of the same envs plays (common random numbers). Forms reset
as a whole (gymnasium's native vector envs in every autoreset mode,
pufferlib's ``Multiprocessing``, envpool) must count only steps inside
episodes and replay the same returns for the same seeds; given seeds
(``episode_returns(seeds=...)``) they play on single envs made from their
spec, the same episodes as the list. Forms that cannot serve
slots raise naming the form. pufferlib (the ``pufferlib-core`` package),
ale-py and envpool are skipped where they are not installed.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from torch import nn

from populora.envs.interactor import EnvInteractor, interact_with_env
from populora.envs.slots import build_slots
from populora.envs.vector import VectorSource
from populora.errors import InvalidTypeError

SEEDS = [3, 8, 21]
HORIZON = 80


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def policy(inp: int = 4, out: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(inp, 8), nn.Tanh(), nn.Linear(8, out))


def returns_of(interactor: EnvInteractor, seeds=SEEDS, horizon=HORIZON, inp=4, out=2) -> torch.Tensor:
    pop = interactor.population(policy(inp, out), pop_size=5, low_rank=2, seed=1)
    return interactor.episode_returns(pop, list(range(5)), horizon=horizon, seeds=seeds)


@pytest.fixture(scope="module")
def reference() -> torch.Tensor:
    """The returns of a list of 4 CartPole envs (each slot reset with its episode's seed)."""
    return returns_of(interact_with_env([cartpole() for _ in range(4)]))


def puffer_env(buf=None, seed=0):
    import pufferlib.emulation

    return pufferlib.emulation.GymnasiumPufferEnv(env=cartpole(), buf=buf, seed=seed)


def check_cartpole_returns(interactor: EnvInteractor, returns: torch.Tensor) -> None:
    """CartPole pays 1 per step: every return is an episode length, and only those steps are counted."""
    assert returns.shape == (5, len(SEEDS))
    assert bool(((returns >= 8) & (returns <= HORIZON)).all())
    assert interactor.counters["env_steps"] == int(returns.sum())


# ----------------------------------------------------------------------------- per-slot seeded forms


def test_gymnasium_sync_vector_env(reference):
    returns = returns_of(interact_with_env(SyncVectorEnv([cartpole for _ in range(4)])))
    assert torch.equal(returns, reference)


def test_gymnasium_vector_env_stepped_as_a_whole(reference):
    interactor = interact_with_env(gym.vector.VectorWrapper(SyncVectorEnv([cartpole for _ in range(4)])))
    assert type(interactor._slots.sources[0]) is VectorSource
    assert torch.equal(returns_of(interactor), reference)


def test_gymnasium_async_vector_env(reference):
    env = AsyncVectorEnv([cartpole for _ in range(2)], context="fork")
    try:
        assert torch.equal(returns_of(interact_with_env(env)), reference)
    finally:
        env.close()


def test_pufferlib_serial(reference):
    vector = pytest.importorskip("pufferlib.vector")
    env = vector.make(puffer_env, num_envs=3, backend=vector.Serial)
    interactor = interact_with_env(env)
    source = interactor._slots.sources[0]
    assert type(source) is VectorSource and source.puffer and source.autoresets and not source.whole
    assert torch.equal(returns_of(interactor), reference)  # slots reset with their own seeds, as a list is
    check_cartpole_returns(interactor, reference)


# ----------------------------------------------------------------------------- forms reset as a whole


MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_gymnasium_make_vec_in_every_autoreset_mode(reference, mode, wrapped):
    """``make_vec(..., 'sync')``: its sub-envs stepped, or (wrapped) the vector env itself, in each mode."""
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode})
    interactor = interact_with_env(gym.vector.VectorWrapper(env) if wrapped else env)
    assert (type(interactor._slots.sources[0]) is VectorSource) == wrapped
    assert torch.equal(returns_of(interactor), reference)


def test_gymnasium_native_vector_env(reference):
    """``make_vec``'s default for CartPole: ``CartPoleVectorEnv``, one random generator for all slots."""
    interactor = interact_with_env(gym.make_vec("CartPole-v1", num_envs=4))
    assert interactor._slots.round_based
    returns = returns_of(interactor)  # given seeds: single CartPole envs made from its spec
    check_cartpole_returns(interactor, returns)
    assert torch.equal(returns, reference)


def test_pufferlib_multiprocessing(reference):
    vector = pytest.importorskip("pufferlib.vector")
    env = vector.make(puffer_env, num_envs=2, num_workers=2, backend=vector.Multiprocessing, overwork=True)
    try:
        interactor = interact_with_env(env)
        source = interactor._slots.sources[0]
        assert source.puffer and source.whole and source.autoresets
        returns = returns_of(interactor)  # given seeds: a Serial env over copies of its driver env
        check_cartpole_returns(interactor, returns)
        assert torch.equal(returns, reference)
        pop = interactor.population(policy(), pop_size=5, low_rank=2, seed=1)
        rounds = interactor.episode_returns(pop, list(range(5)), horizon=HORIZON, num_episodes=2)
        assert torch.equal(interactor.episode_returns(pop, list(range(5)), horizon=HORIZON, num_episodes=2), rounds)
    finally:
        env.close()


def test_ale_atari_vector_env():
    """ale-py's ``AtariVectorEnv`` resets one slot with a seed (a masked reset): slot 1 replays a 1-slot env."""
    vector_env = pytest.importorskip("ale_py.vector_env")
    env = vector_env.AtariVectorEnv(game="pong", num_envs=2)
    twin = vector_env.AtariVectorEnv(game="pong", num_envs=1)
    try:
        slots = build_slots(env)
        assert not slots.round_based and slots.obs_space.shape == (4, 84, 84)
        slot = np.array([1])
        slots.reset(np.array([0, 1]), [3, 4])
        slots.reset(slot, [7])  # masked: slot 0 plays on
        frames, _ = twin.reset(seed=np.array([7]))
        assert torch.equal(slots.take(slot), torch.from_numpy(frames.reshape(1, -1)).float())
        for action in [1, 2, 3, 2, 0]:
            slots.step(torch.tensor([action]), slot)
            frames, *_ = twin.step(np.array([action]))
            assert torch.equal(slots.take(slot), torch.from_numpy(frames.reshape(1, -1)).float())
    finally:
        env.close()
        twin.close()


def test_envpool():
    envpool = pytest.importorskip("envpool")
    interactor = interact_with_env(envpool.make_gymnasium("CartPole-v1", num_envs=4, seed=0))
    assert interactor._slots.round_based
    returns = returns_of(interactor)
    check_cartpole_returns(interactor, returns)


# ----------------------------------------------------------------------------- forms refused


def test_pufferlib_multiprocessing_with_partial_batches_is_refused():
    vector = pytest.importorskip("pufferlib.vector")
    env = vector.make(
        puffer_env, num_envs=2, num_workers=2, batch_size=1, backend=vector.Multiprocessing, overwork=True
    )
    try:
        with pytest.raises(InvalidTypeError, match=r"returns 1 of its 2 envs per step.*batch_size=num_envs"):
            build_slots(env)
    finally:
        env.close()


def test_multi_agent_pufferlib_envs_are_refused():
    vector = pytest.importorskip("pufferlib.vector")
    env = vector.make(puffer_env, num_envs=2, backend=vector.Serial)
    env.driver_env.num_agents = 2  # as a multi-agent env reports itself
    with pytest.raises(InvalidTypeError, match=r"runs 2 agents per env.*multi-agent pufferlib envs are not supported"):
        build_slots(env)


class StableBaselinesLikeVecEnv:
    """The stable-baselines3 ``VecEnv`` interface (``step_async`` / ``step_wait``; ``reset()`` takes no seed)."""

    num_envs = 2
    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self):
        return np.zeros((2, 4), np.float32)

    def step_async(self, actions):
        self.actions = actions

    def step_wait(self):
        return np.zeros((2, 4), np.float32), np.zeros(2), np.zeros(2, bool), [{}, {}]

    def step(self, actions):
        self.step_async(actions)
        return self.step_wait()

    def env_method(self, name, *args, **kwargs):
        return [None, None]


def test_stable_baselines_vec_envs_are_refused_with_the_alternatives():
    with pytest.raises(
        InvalidTypeError,
        match=r"stable-baselines3 VecEnv, which is not supported.*pass its env "
        r"factory, a list of envs, or a gymnasium vector env",
    ):
        build_slots(StableBaselinesLikeVecEnv())
