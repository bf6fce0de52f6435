"""The environment loop's fast paths give exactly what the plain paths give.

* ``ActionFormat.convert``: int64 CPU actions of a Discrete space take a
  one-reduction range check; the values and the errors are those of the
  general path.
* ``WorkQueue`` keeps its counters in Python lists: the same work items, in
  the same order, as the numpy reference it replaced.
* the horizon is checked only when the longest-running playing episode can
  reach it: staggered episodes are cut exactly at the horizon.
* a ``SyncVectorEnv`` of a flat float32 Box hands its batch to the model
  without ``ObsLayout.from_batch``: the same returns as a list of envs and the vector
  env's own step.
"""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import SyncVectorEnv
from torch import nn

from populora import interact_with_env
from populora.envs.actions import ActionFormat
from populora.envs.normalize import ObsStatistics
from populora.envs.schedule import WorkQueue
from populora.errors import InvalidTypeError, InvalidValueError


class LongSeededEnv(gym.Env):
    """Episode length ``2 + seed % 9`` (2 to 10 steps), reward 1 per step; observation ``[t, length]``."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, dtype: type = np.float32):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), dtype)
        self.length, self.t = 0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.length], dtype=self.observation_space.dtype)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.length, self.t = 2 + (seed or 0) % 9, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


def tiny_net(inp: int = 2, out: int = 2) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(inp, 8), nn.Tanh(), nn.Linear(8, out))


# ----------------------------------------------------------------------------- actions


@pytest.mark.parametrize("start", [0, -1, 3])
def test_discrete_fast_path_gives_the_general_paths_actions(start):
    fmt = ActionFormat(gym.spaces.Discrete(4, start=start))
    values = torch.tensor([start, start + 3, start + 1, start + 2, start])
    fast = fmt.convert(values, 5, None)  # int64 on the CPU: the fast path
    general = fmt.convert(values.to(torch.int32), 5, None)  # int32: the general path (then .long())
    assert fast.dtype == general.dtype == torch.int64
    assert torch.equal(fast, general) and torch.equal(fast, values)
    assert fmt.convert(values[::2], 3, None).tolist() == values[::2].tolist()  # a strided view
    assert fmt.convert(torch.zeros(0, dtype=torch.int64) + start, 0, None).shape == (0,)


@pytest.mark.parametrize("start", [0, -1, 3])
@pytest.mark.parametrize("bad", ["below", "above", "int64 min", "int64 max"])
def test_discrete_fast_path_refuses_the_same_actions(start, bad):
    fmt = ActionFormat(gym.spaces.Discrete(4, start=start))
    value = {"below": start - 1, "above": start + 4, "int64 min": -(2**63), "int64 max": 2**63 - 1}[bad]
    actions = torch.tensor([start, value, start + 1], dtype=torch.int64)
    lo, hi = min(start, value), max(start + 1, value)
    message = f"returned actions from {lo} to {hi}, outside the action space"
    with pytest.raises(InvalidValueError, match=message):
        fmt.convert(actions, 3, None)
    if bad in ("below", "above"):  # the general path (int32 actions) says the same
        with pytest.raises(InvalidValueError, match=message):
            fmt.convert(actions.to(torch.int32), 3, None)


def test_discrete_fast_path_keeps_the_shape_and_type_checks():
    fmt = ActionFormat(gym.spaces.Discrete(2))
    with pytest.raises(InvalidValueError, match=r"shape \(2, 2\) for 2 slot\(s\).*forget `.argmax\(-1\)`"):
        fmt.convert(torch.zeros(2, 2, dtype=torch.int64), 2, None)
    with pytest.raises(InvalidValueError, match=r"shape \(3,\) for 2 slot"):
        fmt.convert(torch.zeros(3, dtype=torch.int64), 2, None)
    with pytest.raises(InvalidTypeError, match="takes integer actions"):
        fmt.convert(torch.zeros(2), 2, None)
    with torch.enable_grad():
        logits = torch.zeros(2, 2, requires_grad=True)
        out = fmt.convert((logits * 2).argmax(-1), 2, None)
    assert not out.requires_grad and out.tolist() == [0, 0]


@pytest.mark.parametrize("n", [2, 5])
def test_default_argmax_skips_only_checks_it_cannot_fail(n):
    fmt = ActionFormat(gym.spaces.Discrete(n))
    g = torch.Generator().manual_seed(n)
    logits = torch.randn(7, n, generator=g)
    logits[3] = float("nan")  # a NaN row: its argmax is still an index of the row
    fast = fmt.default_actions(logits, 7)
    assert fast.dtype == torch.int64 and fast.shape == (7,)
    assert torch.equal(fast, fmt.convert(fmt.default_action(logits), 7, None))
    wide = torch.zeros(2, n + 1)  # one logit too many: refused by its width, whichever action the argmax picks
    message = rf"outputs have shape \(2, {n + 1}\).*Discrete\({n}\) takes {n} logits"
    with pytest.raises(InvalidValueError, match=message):
        fmt.default_actions(wide, 2)
    with pytest.raises(InvalidValueError, match=r"shape \(3,\) for 2 slot"):
        fmt.default_actions(torch.zeros(3, n), 2)
    shifted = ActionFormat(gym.spaces.Discrete(n, start=1))  # the argmax in [0, n) is shifted to [1, n + 1)
    assert shifted.default_actions(torch.eye(n)[:2], 2).tolist() == [1, 2]


# ----------------------------------------------------------------------------- work queue


class NumpyWorkQueue:
    """The numpy WorkQueue the list-based one replaced (the reference)."""

    def __init__(self, k: int, num_episodes: int):
        self.num_episodes = num_episodes
        self.next_episode = np.zeros(k, dtype=np.int64)
        self.playing = np.zeros(k, dtype=np.int64)
        self.ready: deque[int] = deque(range(k))
        self.left = k * num_episodes

    def take(self):
        if self.left == 0:
            return None
        if self.ready:
            row = self.ready.popleft()
        else:
            row = int(np.argmax(self.num_episodes - self.next_episode))
        episode = int(self.next_episode[row])
        self.next_episode[row] += 1
        self.playing[row] += 1
        self.left -= 1
        return row, episode

    def finish(self, row: int) -> None:
        self.playing[row] -= 1
        if self.playing[row] == 0 and self.next_episode[row] < self.num_episodes and row not in self.ready:
            self.ready.append(row)


@pytest.mark.parametrize("k, episodes, slots", [(5, 3, 2), (3, 4, 7), (16, 2, 16), (1, 5, 3)])
def test_work_queue_hands_out_the_reference_items(k, episodes, slots):
    rng = np.random.default_rng(k * 100 + episodes * 10 + slots)
    new, ref = WorkQueue(k, episodes), NumpyWorkQueue(k, episodes)
    running: list[int] = []
    items = []
    for _ in range(slots):
        item = new.take()
        assert item == ref.take()
        if item is not None:
            running.append(item[0])
            items.append(item)
    while running:  # episodes end in a random order; the freed slot takes the next item
        row = running.pop(int(rng.integers(len(running))))
        new.finish(row)
        ref.finish(row)
        item = new.take()
        assert item == ref.take()
        if item is not None:
            running.append(item[0])
            items.append(item)
    assert sorted(items) == [(r, e) for r in range(k) for e in range(episodes)]
    assert new.take() is None and new.left == 0


# ----------------------------------------------------------------------------- horizon


@pytest.mark.parametrize("kind", ["list", "sync"])
def test_horizon_cuts_staggered_episodes_exactly(kind):
    num, horizon = 3, 6
    envs = (
        [LongSeededEnv() for _ in range(num)] if kind == "list" else SyncVectorEnv([LongSeededEnv for _ in range(num)])
    )
    interactor = interact_with_env(envs)
    pop = interactor.population(tiny_net(), pop_size=4, low_rank=2, seed=0)
    seeds = [3, 8, 13, 5, 9]  # lengths 5, 10, 6, 7, 2: cut at 6 or not, starting at different timesteps
    before = interactor.counters["env_steps"]
    returns = interactor.episode_returns(pop, [0, 1, 2, 3], horizon=horizon, seeds=seeds)
    expected = [float(min(2 + s % 9, horizon)) for s in seeds]
    assert returns.shape == (4, 5)
    assert returns.tolist() == [expected] * 4
    assert interactor.counters["env_steps"] - before == 4 * sum(expected)
    uncut = interactor.episode_returns(pop, [0, 1, 2, 3], seeds=seeds)
    assert uncut.tolist() == [[float(2 + s % 9) for s in seeds]] * 4


# ----------------------------------------------------------------------------- observations


def test_sync_vector_env_float32_box_skips_as_batch_with_the_same_returns():
    make = lambda: gym.make("CartPole-v1")
    sync = interact_with_env(SyncVectorEnv([make for _ in range(4)]))
    assert sync._slots.sources[0]._direct
    listed = interact_with_env([make() for _ in range(4)])
    vector = interact_with_env(gym.vector.VectorWrapper(SyncVectorEnv([make for _ in range(4)])))
    fits = []
    for interactor in (sync, listed, vector):
        pop = interactor.population(tiny_net(4, 2), pop_size=6, low_rank=2, seed=0)
        fits.append(interactor.episode_returns(pop, list(range(6)), horizon=60, num_episodes=2))
    assert fits[0].shape == (6, 2)
    assert torch.equal(fits[0], fits[1]) and torch.equal(fits[0], fits[2])
    assert fits[0].min() >= 8 and fits[0].max() <= 60


def test_float64_box_keeps_the_general_batching():
    sync = interact_with_env(SyncVectorEnv([lambda: LongSeededEnv(np.float64) for _ in range(3)]))
    assert not sync._slots.sources[0]._direct
    listed = interact_with_env([LongSeededEnv(np.float64) for _ in range(3)])
    out = []
    for interactor in (sync, listed):
        pop = interactor.population(tiny_net(), pop_size=4, low_rank=2, seed=0)
        out.append(interactor.episode_returns(pop, [0, 1, 2, 3], seeds=[3, 8, 13]))
        assert interactor._slots.obs.dtype == torch.float32
    assert torch.equal(out[0], out[1])
    assert out[0].tolist() == [[5.0, 10.0, 6.0]] * 4


# ----------------------------------------------------------------------------- observation statistics


@pytest.mark.parametrize("fold_rows", [4096, 4])
def test_obs_statistics_sum_copies_of_the_rows_like_per_step_sums(fold_rows):
    stats = ObsStatistics(3)
    stats.FOLD_ROWS = fold_rows  # 4: folded in the middle too
    stats.normalizer.update_(
        10.0, torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    )
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(k, 3, generator=g) for k in (1, 5, 2, 7)]
    reference = torch.zeros(7, dtype=torch.float64)  # the per-step sums observe() used to keep
    for batch in batches:
        x = batch.to(torch.float64) - stats.normalizer.mean
        reference[:3] += x.sum(0)
        reference[3:6] += x.pow(2).sum(0)
        reference[-1] += x.shape[0]
    buffer = torch.zeros(7, 3)
    for batch in batches:
        buffer[: len(batch)] = batch
        stats.observe(buffer[: len(batch)])
        buffer.fill_(99.0)  # the slots' buffer is written in place after each step
    pending = stats.pending
    assert pending.dtype == torch.float64 and pending.shape == (7,)
    assert pending[-1].item() == 15.0
    torch.testing.assert_close(pending, reference, rtol=1e-12, atol=1e-12)
    assert torch.equal(stats.pending, pending)  # reading again folds nothing new


def test_normalised_evaluation_folds_each_rollout_and_resumes_exactly():
    def run(read_between: bool):
        with interact_with_env([gym.make("CartPole-v1") for _ in range(3)], normalize_obs=True) as interactor:
            pop = interactor.population(tiny_net(4, 2), pop_size=4, low_rank=2, seed=0)
            fits = []
            for generation in range(3):
                fits.append(interactor.evaluate(pop, horizon=40))
                if read_between:  # a checkpoint between generations reads the sums
                    interactor.load_state_dict(interactor.state_dict())
                pop.generation += 1
            return torch.stack(fits), interactor.state_dict()["obs_stats"]

    plain, plain_state = run(False)
    read, read_state = run(True)
    assert torch.equal(plain, read)
    assert torch.equal(plain_state["pending"], read_state["pending"])
    assert plain_state["pending"][-1].item() > 0
    assert plain_state["normalizer"]["count"].item() > 0  # generations 0 and 1 were folded into the normaliser


# ----------------------------------------------------------------------------- the benchmark's bound


def test_benchmark_critical_path_interpolates_the_measured_step_costs():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "interact.py"
    spec = importlib.util.spec_from_file_location("interact_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    costs = {1: 1.0, 2: 2.0, 4: 3.0, 8: 7.0}
    assert bench.critical_path(np.array([1.0, 3.0, 4.0, 6.0, 8.0]), costs) == pytest.approx(1 + 2.5 + 3 + 5 + 7)
    assert bench.critical_path(np.array([], dtype=np.float64), costs) == 0.0
