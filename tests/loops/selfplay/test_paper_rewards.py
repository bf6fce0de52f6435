"""The paper's reward table (every cell), the form check, rating matches and the draw margin."""

from __future__ import annotations

import math

import pytest
import torch

from populora.errors import InvalidTypeError, InvalidValueError
from populora.loops.selfplay.rewards import (
    draw_margin,
    match_outcomes,
    student_rewards,
    teacher_rewards,
    well_formed,
)
from populora.tasks import Problem


def t(*values: bool) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bool)


class TestStudentTable:
    def test_paper_every_cell(self):
        right = t(True, True, False, False)
        formed = t(True, False, True, False)
        # right (formed or not) +1; wrong but well formed -0.5; format error -1
        assert student_rewards(right, formed).tolist() == [1.0, 1.0, -0.5, -1.0]
        assert student_rewards(right, formed).dtype == torch.float64

    def test_binary_every_cell(self):
        right = t(True, True, False, False)
        formed = t(True, False, True, False)
        assert student_rewards(right, formed, "binary").tolist() == [1.0, 1.0, 0.0, 0.0]

    def test_bad_input(self):
        with pytest.raises(InvalidValueError, match="student_reward"):
            student_rewards(t(True), t(True), "dense")
        with pytest.raises(InvalidTypeError, match="`right` must be a bool tensor"):
            student_rewards(torch.ones(1), t(True))
        with pytest.raises(InvalidValueError, match="one shape"):
            student_rewards(t(True, False), t(True))


class TestTeacherTable:
    # teacher 0: invalid (its "solved" ignored), valid and never solved, valid solved 1 of 4, valid always solved
    valid = torch.tensor([[False, True, True, True]])
    solved = torch.tensor(
        [[[True, True, True, True], [False] * 4, [True, False, False, False], [True] * 4]], dtype=torch.bool
    )

    def test_paper_every_cell(self):
        r = teacher_rewards(self.valid, self.solved)
        assert r.tolist() == [[-1.0, 0.0, 0.75, 0.0]]
        assert r.dtype == torch.float64 and r.shape == (1, 4)

    def test_failures_every_cell(self):
        assert teacher_rewards(self.valid, self.solved, "failures").tolist() == [[0.0, 1.0, 0.75, 0.0]]

    def test_learnability_every_cell(self):
        assert teacher_rewards(self.valid, self.solved, "learnability").tolist() == [[0.0, 0.0, 0.75, 0.0]]

    def test_bad_shapes(self):
        with pytest.raises(InvalidValueError, match=r"\(p_t, k, a >= 1\)"):
            teacher_rewards(self.valid, self.solved[:, :2])
        with pytest.raises(InvalidValueError, match="teacher_reward"):
            teacher_rewards(self.valid, self.solved, "wins")


class TestWellFormed:
    @pytest.mark.parametrize(
        "task, reply, expected",
        [
            ("arithmetic", "The answer is 7.", True),
            ("arithmetic", "I do not know", False),
            ("linear", "x = -3", True),
            ("successor", "", False),
            ("sorting", "[1, 2, 3]", True),
            ("sorting", "one two", False),
            ("countdown", "3 * 4 + 1", True),
            ("countdown", "13", False),
            ("code_o", "Output: [1, 2]", True),
            ("code_o", "   ", False),
            ("code_i", "Input: 3", True),
            ("code_f", "```python\ndef f(x):\n    return x\n```", True),
            ("code_f", "return x", False),
            ("parity", "anything", True),
            ("parity", " \n", False),
        ],
    )
    def test_families(self, task, reply, expected):
        assert well_formed(Problem(task, "q", 0, {}), reply) is expected

    def test_bad_input(self):
        with pytest.raises(InvalidTypeError, match="`reply` must be a str"):
            well_formed(Problem("arithmetic", "q", 0, {}), 7)


class TestMatches:
    opponents = torch.tensor([2, 0, 1])
    valid = torch.tensor([[True, True], [False, False], [True, False]])
    solved = torch.tensor(
        [[[True, False], [True, True]], [[True, True], [True, True]], [[False, False], [True, True]]],
        dtype=torch.bool,
    )

    def test_pair(self):
        tid, sid, score = match_outcomes(self.opponents, self.valid, self.solved, "pair")
        assert tid.tolist() == [0, 1, 2] and sid.tolist() == [2, 0, 1]
        # teacher 0: 3 of 4 attempts solved -> 0.25; teacher 1: no valid problem -> the student's win (0);
        # teacher 2: its one valid problem never solved -> 1 (the invalid one's attempts are ignored)
        assert score.tolist() == [0.25, 0.0, 1.0]

    def test_problem(self):
        tid, sid, score = match_outcomes(self.opponents, self.valid, self.solved, "problem")
        assert tid.tolist() == [0, 0, 1, 2] and sid.tolist() == [2, 2, 0, 1]
        assert score.tolist() == [0.5, 0.0, 0.0, 1.0]


def test_draw_margin_is_trueskills():
    eps = draw_margin(0.1, 25 / 6)
    # TrueSkill: P(draw) = 2 Phi(eps / (sqrt(2) beta)) - 1 for two equal players of sigma 0
    assert 2 * 0.5 * (1 + math.erf(eps / (math.sqrt(2) * 25 / 6) / math.sqrt(2))) - 1 == pytest.approx(0.1, abs=1e-12)
    assert eps == pytest.approx(0.7405, abs=1e-4)
    assert draw_margin(0.0, 1.0) == 0.0
    with pytest.raises(InvalidValueError, match="draw_probability"):
        draw_margin(1.0, 1.0)
