"""The paper's reward table and rating matches, as pure functions of one step's outcomes.

Shapes: ``p_t`` teachers, ``k`` proposals per teacher, ``a`` attempts per problem, ``p_s`` students.

Teacher reward of one proposal (``teacher_reward``):

=================  ==================  ====================================  ============================
rule               invalid proposal    valid, solve rate ``s`` of its         valid, ``s = 1``
                                       matched student's attempts
=================  ==================  ====================================  ============================
``"paper"``        -1                  0 if ``s = 0``, else ``1 - s``          0 (``1 - s``)
``"failures"``     0                   ``1 - s``                               0
``"learnability"`` 0                   ``1 - s`` if ``0 < s < 1``, else 0      0
=================  ==================  ====================================  ============================

(``"failures"`` and ``"learnability"`` are :class:`~populora.selfplay.SelfPlay`'s rules, per proposal.)

Student reward of one attempt (``student_reward``):

===========  =====  ==========================  ======================================
rule         right  wrong but well formed        format error (:func:`well_formed` false)
===========  =====  ==========================  ======================================
``"paper"``  +1     -0.5                        -1
``"binary"`` 1      0                           0
===========  =====  ==========================  ======================================

Rating matches (:func:`match_outcomes`): the teacher's score is ``1 - s`` (it wins when its student fails).
``"pair"``: one match per teacher and step against its matched student, ``s`` the solve rate over every
attempt at every valid proposal of the teacher; ``"problem"``: one match per valid proposal. Either way a
teacher with no valid proposal loses one match to its student (score 0).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from populora.checks import check_float, check_one_of
from populora.errors import InvalidTypeError, InvalidValueError
from populora.tasks import Problem
from populora.tasks.base import reply_is_well_formed

__all__ = [
    "MATCH_GRANULARITIES",
    "STUDENT_REWARDS",
    "TEACHER_REWARDS",
    "draw_margin",
    "match_outcomes",
    "student_rewards",
    "teacher_rewards",
    "well_formed",
]

TEACHER_REWARDS = ("paper", "failures", "learnability")
STUDENT_REWARDS = ("paper", "binary")
MATCH_GRANULARITIES = ("pair", "problem")


def well_formed(problem: Problem, reply: str) -> bool:
    """Whether ``reply`` gives an answer in the form ``problem``'s family reads (right or wrong).

    The family's knowledge (:meth:`Task.well_formed_reply <populora.tasks.Task.well_formed_reply>`, registered
    under its name): an integer for the integer families, a list for ``sorting``, an expression for
    ``countdown``, an output / input answer or a program for the code families; a family that defines none
    (a user's task): a non-blank reply.
    """
    if not isinstance(problem, Problem):
        raise InvalidTypeError(f"`problem` must be a Problem, got {type(problem).__name__}")
    if not isinstance(reply, str):
        raise InvalidTypeError(f"`reply` must be a str, got {type(reply).__name__}")
    return reply_is_well_formed(problem, reply)


def _bool(name: str, value: Any, dims: int) -> Tensor:
    if not isinstance(value, Tensor) or value.dtype != torch.bool:
        got = f"dtype {value.dtype}" if isinstance(value, Tensor) else type(value).__name__
        raise InvalidTypeError(f"`{name}` must be a bool tensor, got {got}")
    if value.dim() != dims:
        raise InvalidValueError(f"`{name}` must have {dims} dims, got shape {tuple(value.shape)}")
    return value


def student_rewards(right: Tensor, formed: Tensor, rule: str = "paper") -> Tensor:
    """``(n,)`` float64 rewards of ``n`` attempts (module docstring's table).

    Args:
        right: ``(n,)`` bool, the attempt answers the problem.
        formed: ``(n,)`` bool, the attempt is well formed (:func:`well_formed`); a right attempt counts as
            right whatever this says.
        rule: ``"paper"`` or ``"binary"``.
    """
    rule = check_one_of("student_reward", rule, STUDENT_REWARDS)
    right, formed = _bool("right", right, 1), _bool("formed", formed, 1)
    if right.shape != formed.shape:
        raise InvalidValueError(
            f"`right` and `formed` must have one shape, got {tuple(right.shape)} and {tuple(formed.shape)}"
        )
    if rule == "binary":
        return right.double()
    wrong = torch.where(
        formed, torch.full_like(right, -0.5, dtype=torch.float64), torch.full_like(right, -1.0, dtype=torch.float64)
    )
    return torch.where(right, torch.ones_like(wrong), wrong)


def teacher_rewards(valid: Tensor, solved: Tensor, rule: str = "paper") -> Tensor:
    """``(p_t, k)`` float64 rewards of the teachers' proposals (module docstring's table).

    Args:
        valid: ``(p_t, k)`` bool, the proposal passed the verifier.
        solved: ``(p_t, k, a)`` bool, the matched student's attempts (ignored where invalid).
        rule: ``"paper"``, ``"failures"`` or ``"learnability"``.
    """
    rule = check_one_of("teacher_reward", rule, TEACHER_REWARDS)
    valid, solved = _bool("valid", valid, 2), _bool("solved", solved, 3)
    if solved.shape[:2] != valid.shape or solved.shape[2] < 1:
        raise InvalidValueError(
            f"`solved` must be (p_t, k, a >= 1) with (p_t, k) = {tuple(valid.shape)}, got {tuple(solved.shape)}"
        )
    rate = solved.double().mean(2)
    if rule == "paper":
        reward = torch.where(rate > 0, 1.0 - rate, torch.zeros_like(rate))
        return torch.where(valid, reward, torch.full_like(rate, -1.0))
    if rule == "failures":
        reward = 1.0 - rate
    else:
        reward = torch.where((rate > 0) & (rate < 1), 1.0 - rate, torch.zeros_like(rate))
    return torch.where(valid, reward, torch.zeros_like(rate))


def match_outcomes(
    opponents: Tensor, valid: Tensor, solved: Tensor, granularity: str = "pair"
) -> tuple[Tensor, Tensor, Tensor]:
    """The rated matches of a step: ``(teacher_ids (q,), student_ids (q,), teacher_scores (q,) float64)``.

    ``"pair"``: one match per teacher (ascending), score ``1 - s`` with ``s`` the solve rate over every attempt
    at every valid proposal of that teacher; ``"problem"``: one match per valid proposal (teacher, then proposal
    order), score ``1 - s`` of that proposal, and one match of score 0 for a teacher without a valid proposal.
    A teacher without a valid proposal loses (score 0: "a match with no valid problem is the student's win").
    """
    granularity = check_one_of("granularity", granularity, MATCH_GRANULARITIES)
    valid, solved = _bool("valid", valid, 2), _bool("solved", solved, 3)
    if not isinstance(opponents, Tensor) or opponents.dim() != 1 or opponents.numel() != valid.shape[0]:
        raise InvalidValueError(f"`opponents` must be a ({valid.shape[0]},) int tensor, got {opponents!r}")
    p_t, k, a = solved.shape
    opponents = opponents.long()
    any_valid = valid.any(1)
    if granularity == "pair":
        right = (solved.double().sum(2) * valid).sum(1)
        count = valid.double().sum(1) * a
        score = torch.where(any_valid, 1.0 - right / count.clamp(min=1), torch.zeros(p_t, dtype=torch.float64))
        return torch.arange(p_t), opponents.clone(), score
    teachers: list[int] = []
    students: list[int] = []
    scores: list[float] = []
    rate = solved.double().mean(2)
    for i in range(p_t):
        played = [0.0] if not bool(any_valid[i]) else [float(1.0 - rate[i, j]) for j in range(k) if bool(valid[i, j])]
        teachers += [i] * len(played)
        students += [int(opponents[i])] * len(played)
        scores += played
    return (
        torch.tensor(teachers, dtype=torch.int64),
        torch.tensor(students, dtype=torch.int64),
        torch.tensor(scores, dtype=torch.float64),
    )


def _normal_quantile(p: float) -> float:
    """``Phi^{-1}(p)`` for ``p`` in ``(0, 1)``, by bisection on ``math.erf`` (exact to float precision)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2.0))) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def draw_margin(draw_probability: float, beta: float, players: int = 2) -> float:
    """TrueSkill's draw margin ``eps = Phi^{-1}((1 + p_draw) / 2) * sqrt(players) * beta``.

    It is the ``epsilon`` of openskill's Thurstone-Mosteller models (the half-width of the draw region on the
    performance difference); TrueSkill's default ``p_draw = 0.1`` with ``beta = 25/6`` gives about 0.7405
    (openskill's own default is 0.1).

    Example:
        >>> round(draw_margin(0.1, 25 / 6), 4)
        0.7405
    """
    p = check_float("draw_probability", draw_probability, low=0.0, high=1.0, high_open=True)
    beta = check_float("beta", beta, low=0.0, low_open=True)
    if p == 0.0:
        return 0.0
    return _normal_quantile((1.0 + p) / 2.0) * math.sqrt(players) * beta
