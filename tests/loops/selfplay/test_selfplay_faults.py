"""SelfPlay under faults: a step that fails at any step count restores everything (populations, ratings, the
generator, the counters) so that a retry is bitwise the step of an untouched twin; a loaded history is checked
field by field before anything is written."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("openskill")

from parity_task import BLOCK, ParityTask

from populora import Population
from populora.errors import CheckpointError
from populora.llm import tiny_chat_model
from populora.loops.selfplay import loop as selfplay_module  # the one loop's module
from populora.loops.selfplay.selfplay import SelfPlay


def make(**kwargs) -> SelfPlay:
    model, tokenizer = tiny_chat_model(seed=0)
    teachers = Population(model, 4, 2, BLOCK, seed=1, init_scale=0.5)
    students = Population(model, 4, 2, BLOCK, seed=2, init_scale=0.5)
    opts = dict(
        proposals=2,
        anchors=2,
        teacher_generate=dict(max_new_tokens=5, do_sample=True, temperature=1.0),
        student_generate=dict(max_new_tokens=4, do_sample=False),
        evolve_kwargs={"teachers": {"epsilon": 0.2}, "students": {"epsilon": 0.2}},
        seed=3,
    )
    opts.update(kwargs)
    return SelfPlay(teachers, students, tokenizer, ParityTask(), **opts)


def assert_equal_states(a: dict, b: dict, where: str = "") -> None:
    """Two nested states (dicts, lists, tensors, numbers) are bitwise equal."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_equal_states(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_states(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, where


def deterministic_state(sp: SelfPlay) -> dict:
    """``sp.state_dict()`` without the wall-clock fields of the history (they differ between identical runs)."""
    state = sp.state_dict()
    for record in state["history"]:
        record["seconds"] = record["tokens_per_s"] = 0.0
    return state


def assert_same_outcome(a, b) -> None:
    for field in ("opponents", "valid", "solved", "anchor_solved", "teacher_fitness", "student_fitness"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.proposals == b.proposals and a.answers == b.answers
    assert a.record.deterministic == b.record.deterministic


# ---------------------------------------------------------------------------------------------- rollback


def _fail_students_evolve(sp: SelfPlay, monkeypatch) -> None:
    """The students' evolve_ raises after the teachers evolved and the matches were rated."""
    real = sp.students.evolve_

    def failing(*args, **kwargs):
        real(*args, **kwargs)  # the students evolve too: every write of the step has happened
        raise RuntimeError("injected failure after the students evolved")

    monkeypatch.setattr(sp.students, "evolve_", failing)


def _fail_ratings_follow(sp: SelfPlay, monkeypatch) -> None:
    """The ratings follow the teachers' culled slots, then raise on following the students'."""
    real = sp.ratings.follow_

    def failing(name, result):
        real(name, result)
        if name == "students":
            raise RuntimeError("injected failure in follow_")

    monkeypatch.setattr(sp.ratings, "follow_", failing)


def _fail_after_policy_gradient(sp: SelfPlay, monkeypatch) -> None:
    """The students' policy-gradient step moves them, then raises (before either population evolves)."""
    real = selfplay_module.policy_gradient_step_

    def failing(*args, **kwargs):
        real(*args, **kwargs)
        raise RuntimeError("injected failure after the policy-gradient step")

    monkeypatch.setattr(selfplay_module, "policy_gradient_step_", failing)


FAULTS = {
    "students_evolve": (_fail_students_evolve, {}),
    "ratings_follow": (_fail_ratings_follow, {}),
    "policy_gradient": (_fail_after_policy_gradient, {"student_pg_lr": 0.05}),
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("failed_step", [2, 3])
def test_a_failed_later_step_changes_nothing_and_its_retry_is_the_twins_step(fault, failed_step, monkeypatch):
    inject, options = FAULTS[fault]
    sp, twin = make(**options), make(**options)
    for _ in range(failed_step - 1):
        sp.step()
        twin.step()
    before = deterministic_state(sp)
    assert_equal_states(before, deterministic_state(twin))
    with monkeypatch.context() as patch:
        inject(sp, patch)
        with pytest.raises(RuntimeError, match="injected failure"):
            sp.step()
    # everything the step wrote is undone: adapters, population generators and counters, ratings, generator
    assert_equal_states(deterministic_state(sp), before, "after the failed step")
    assert sp.steps == failed_step - 1 and len(sp.history) == failed_step - 1
    assert sp.teachers.generation == sp.students.generation == failed_step - 1
    # the retry draws the same opponents and seeds as the twin's step, and ends in the same state, bit for bit
    assert_same_outcome(sp.step(), twin.step())
    assert_equal_states(deterministic_state(sp), deterministic_state(twin), "after the retry")


# ---------------------------------------------------------------------------------------------- history


def _history_state() -> tuple[SelfPlay, dict]:
    sp = make()
    sp.step()
    sp.step()
    return sp, sp.state_dict()


BAD_RECORDS = {
    "validity_garbage": ("validity", "garbage", "validity"),
    "validity_above_one": ("validity", 1.5, "validity"),
    "validity_nan": ("validity", float("nan"), "validity"),
    "step_negative": ("step", -1, "step"),
    "step_bool": ("step", True, "step"),
    "step_float": ("step", 1.0, "step"),
    "student_mean_negative": ("student_mean", -0.5, "student_mean"),
    "teacher_best_beyond_float64": ("teacher_best", 10**400, "teacher_best"),
    "anchor_accuracy_text": ("anchor_accuracy", "most", "anchor_accuracy"),
    "teacher_mu_inf": ("teacher_mu", float("inf"), "teacher_mu"),
    "student_ordinal_best_none": ("student_ordinal_best", None, "student_ordinal_best"),
    "matches_negative": ("matches", -3, "matches"),
    "tokens_float": ("tokens", 12.5, "tokens"),
    "seconds_negative": ("seconds", -1.0, "seconds"),
    "tokens_per_s_nan": ("tokens_per_s", float("nan"), "tokens_per_s"),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_history_entry_with_a_bad_field_is_refused_before_anything_is_written(case):
    field, value, named = BAD_RECORDS[case]
    source, state = _history_state()
    state["history"][1][field] = value
    sp = make(seed=11)
    sp.step()
    before = deterministic_state(sp)
    with pytest.raises(CheckpointError, match=rf"history.*\b{named}\b"):
        sp.load_state_dict(state)
    assert_equal_states(deterministic_state(sp), before)


@pytest.mark.parametrize(
    "history, match",
    [
        ("not a list", "history"),
        ([{"step": 0}], "history"),
        (None, "history"),
    ],
)
def test_a_history_of_the_wrong_shape_is_refused(history, match):
    _, state = _history_state()
    state["history"] = history
    sp = make(seed=11)
    before = deterministic_state(sp)
    with pytest.raises(CheckpointError, match=match):
        sp.load_state_dict(state)
    assert_equal_states(deterministic_state(sp), before)


def test_history_steps_must_be_increasing_and_below_the_step_count():
    _, state = _history_state()
    sp = make(seed=11)
    before = deterministic_state(sp)
    swapped = dict(state, history=[state["history"][1], state["history"][0]])
    with pytest.raises(CheckpointError, match="history.*step"):
        sp.load_state_dict(swapped)
    beyond = dict(state, steps=1)  # two records of steps 0 and 1, but only one step done
    with pytest.raises(CheckpointError, match="history.*step"):
        sp.load_state_dict(beyond)
    assert_equal_states(deterministic_state(sp), before)
    sp.load_state_dict(state)  # the untouched state loads
    assert sp.steps == 2 and [r.step for r in sp.history] == [0, 1]
