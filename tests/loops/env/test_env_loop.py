"""EnvLoop: the loop behind evolve_with_env, with every loop's surface (step, run, history, state, save / load)."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from torch import nn

from populora import evolve_with_env
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.loops.base import Budget, Loop
from populora.loops.env import EnvLoop
from populora.loops.env.options import ES, GA, EnvOptions, Validation

OPTIONS = dict(horizon=30, seed=3, validation=Validation(episodes=2, top=1))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def envs():
    return [gym.make("CartPole-v1") for _ in range(2)]


def make(algorithm="ga", **kwargs) -> EnvLoop:
    options = {**OPTIONS, "env_options": EnvOptions(normalize_obs=True), **kwargs}
    return EnvLoop(envs(), model(), 6, 2, algorithm=algorithm, **options)


def same_params(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def tensors_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("algorithm", ["ga", "es"])
def test_a_run_in_pieces_with_a_save_between_is_evolve_with_env(tmp_path, algorithm):
    straight = evolve_with_env(
        envs(), model(), 6, 2, num_generations=4, algorithm=algorithm, env_options=EnvOptions(normalize_obs=True),
        **OPTIONS,
    )  # fmt: skip
    first = make(algorithm)
    assert isinstance(first, Loop)
    records = first.run(2)
    assert len(records) == 2 and first.history == records and [h.generation for h in records] == [0, 1]
    path = first.save(tmp_path / "run.pt")
    first.close()
    with make(algorithm) as second:
        second.load(path)
        assert second.history == records
        second.run(Budget(max_steps=2))
        policy = second.finish()
    assert second.history == straight.history  # every field, env steps included
    same_params(policy, straight.policy)


def test_step_returns_the_record_and_history_holds_its_stats():
    with make() as loop:
        info = loop.step()
        assert loop.history == [info.stats] and info.stats.generation == 0
        assert info.fitnesses.shape == (6,) and info.as_dict()["best"] == pytest.approx(float(info.fitnesses.max()))
        assert info.stats.env_steps == loop.interactor.counters["env_steps"] > 0
        second = loop.step()
        assert second.stats.generation == 1 and second.stats.env_steps > info.stats.env_steps


class FailingAction:
    """argmax, raising ``KeyboardInterrupt`` on its ``fail_at``-th call (mid-generation), once."""

    def __init__(self, fail_at: int | None):
        self.calls, self.fail_at = 0, fail_at

    def __call__(self, outputs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt("stopped mid-generation")
        return outputs.argmax(-1)


@pytest.mark.parametrize("algorithm", ["ga", "es"])
def test_a_step_that_raises_changes_nothing(algorithm):
    action = FailingAction(None)
    with make(algorithm, action=action) as loop, make(algorithm, action=FailingAction(None)) as clean:
        loop.step()
        clean.step()
        before = loop.state_dict()
        action.fail_at = action.calls + 3  # inside the next generation's episodes
        with pytest.raises(KeyboardInterrupt):
            loop.step()
        assert action.calls == action.fail_at and len(loop.history) == 1
        after = loop.state_dict()
        assert tensors_equal(before, after)
        # and the next step is the one a loop that never failed takes
        assert loop.step().stats[:5] == clean.step().stats[:5]
        assert tensors_equal(loop.state_dict()["population"], clean.state_dict()["population"])


def test_the_callback_rule_and_target_fitness():
    with make() as loop:
        with pytest.raises(InvalidTypeError, match=r"returned \[1\]"):
            loop.run(5, callback=lambda info: [1])
        assert len(loop.history) == 1  # the step ran; its record stays
        assert len(loop.run(5, callback=lambda info: True)) == 1
        assert len(loop.run(3, callback=lambda info: None)) == 3
    with make() as loop:  # the first champion is confirmed at once and reaches the target
        assert len(loop.run(10, target_fitness=-1.0)) == 1


def test_budgets_and_bad_input_are_refused_before_a_step():
    with make() as loop:
        with pytest.raises(InvalidValueError, match="no limit"):
            loop.run(Budget())
        with pytest.raises(InvalidValueError, match="needs a budget"):
            loop.run(None)
        with pytest.raises(InvalidTypeError, match="callback"):
            loop.run(2, callback="print")
        with pytest.raises(InvalidValueError, match="target_fitness"):
            loop.step(target_fitness=float("nan"))
        assert loop.history == [] and loop.interactor.counters["env_steps"] == 0
        assert len(loop.run(Budget(max_env_steps=1))) == 1


def test_a_state_of_another_run_is_refused_naming_the_field_and_changes_nothing(tmp_path):
    with make(algorithm=GA()) as other:
        other.run(2)
        state = other.state_dict()
    with make(seed=4) as loop:
        loop.step()
        before = loop.state_dict()
        with pytest.raises(CheckpointError, match=r"evolve_with_env\.seed=3; this run has evolve_with_env\.seed=4"):
            loop.load_state_dict(state)
        with pytest.raises(CheckpointError, match="algorithm='ga', this run uses algorithm='es'"):
            with make(algorithm=ES()) as es:
                es.load_state_dict(state)
        damaged = {**state, "population": {"nonsense": 1}}
        with make() as fresh:
            fresh.step()
            saved = fresh.state_dict()
            with pytest.raises(CheckpointError):
                fresh.load_state_dict({**damaged, "config": saved["config"], "base_checksum": saved["base_checksum"]})
            assert tensors_equal(saved, fresh.state_dict())
        assert tensors_equal(before, loop.state_dict())


def test_finish_merges_and_closes_and_close_unwraps():
    m = model()
    expected = {k: v.clone() for k, v in m.state_dict().items()}
    loop = EnvLoop(envs(), m, 6, 2, **OPTIONS)
    loop.step()
    loop.close()
    loop.close()  # idempotent
    assert all(p.requires_grad for p in m.parameters())
    assert all(torch.equal(v, expected[k]) for k, v in m.state_dict().items())  # unwrapped, not merged
    with pytest.raises(InvalidValueError, match="closed"):
        loop.step()
    with make() as done:
        done.run(2)
        policy = done.finish()
        assert isinstance(policy, nn.Module) and done.closed
        with pytest.raises(InvalidValueError, match="closed"):
            done.run(1)
