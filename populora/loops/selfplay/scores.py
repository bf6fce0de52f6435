"""The self-play fitness rule (PopuLoRA) as a pure function, and the per-step record of :class:`SelfPlay`.

:func:`selfplay_fitnesses` turns one step's outcomes into the teachers' and
the students' fitnesses (higher is better); :func:`match_scores` turns them
into rating matches. Both are pure functions of tensors, so the rule can be
checked on hand-made outcomes.

Shapes: ``p_t`` teachers, ``k`` proposals per teacher, ``a`` attempts per
problem, ``p_s`` students, ``m`` anchor problems per student.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from populora.checks import check_float, check_int, check_one_of
from populora.errors import InvalidTypeError, InvalidValueError

__all__ = ["TEACHER_REWARDS", "SelfPlayRecord", "match_scores", "selfplay_fitnesses"]

TEACHER_REWARDS = ("failures", "learnability")
# the ranges of SelfPlayRecord's fields (checked when a record is read back: SelfPlayRecord.from_dict)
_RECORD_INTS = ("step", "matches", "tokens")
_RECORD_FRACTIONS = ("validity", "student_mean", "student_best", "teacher_mean", "teacher_best")
_RECORD_NONNEGATIVE = ("seconds", "tokens_per_s")


def _bool_tensor(name: str, value: Any, dims: int) -> Tensor:
    if not isinstance(value, Tensor):
        raise InvalidTypeError(f"`{name}` must be a bool tensor, got {type(value).__name__}")
    if value.dtype != torch.bool:
        raise InvalidTypeError(f"`{name}` must be a bool tensor, got dtype {value.dtype}")
    if value.dim() != dims:
        raise InvalidValueError(f"`{name}` must have {dims} dims, got shape {tuple(value.shape)}")
    return value


def _check_outcomes(
    opponents: Any, valid: Any, solved: Any, num_students: Any, anchor_solved: Any
) -> tuple[Tensor, Tensor, Tensor, int, Tensor | None]:
    num_students = check_int("num_students", num_students, low=1)
    if not isinstance(opponents, Tensor) or opponents.dtype not in (torch.int64, torch.int32) or opponents.dim() != 1:
        raise InvalidTypeError(
            "`opponents` must be a (p_t,) int64 tensor of student ids, got "
            + (
                f"{opponents.dtype} {tuple(opponents.shape)}"
                if isinstance(opponents, Tensor)
                else type(opponents).__name__
            )
        )
    valid = _bool_tensor("valid", valid, 2)
    solved = _bool_tensor("solved", solved, 3)
    p_t = opponents.numel()
    if valid.shape[0] != p_t or solved.shape[:2] != valid.shape:
        raise InvalidValueError(
            f"`valid` must be (p_t, k) and `solved` (p_t, k, a) with p_t = {p_t} teachers, got "
            f"{tuple(valid.shape)} and {tuple(solved.shape)}"
        )
    if solved.shape[2] < 1:
        raise InvalidValueError(f"`solved` must hold at least one attempt per problem, got shape {tuple(solved.shape)}")
    if p_t and (int(opponents.min()) < 0 or int(opponents.max()) >= num_students):
        raise InvalidValueError(f"`opponents` must hold student ids in [0, {num_students}), got {opponents.tolist()}")
    if anchor_solved is not None:
        anchor_solved = _bool_tensor("anchor_solved", anchor_solved, 3)
        if anchor_solved.shape[0] != num_students:
            raise InvalidValueError(
                f"`anchor_solved` must be (p_s, m, a) with p_s = {num_students}, got {tuple(anchor_solved.shape)}"
            )
    return opponents.long(), valid, solved, num_students, anchor_solved


def selfplay_fitnesses(
    opponents: Tensor,
    valid: Tensor,
    solved: Tensor,
    num_students: int,
    anchor_solved: Tensor | None = None,
    *,
    teacher_reward: str = "failures",
) -> tuple[Tensor, Tensor]:
    """Teachers' and students' fitnesses from one step's outcomes (PopuLoRA's rule; higher is better).

    Args:
        opponents: ``(p_t,)`` int64, the student matched with each teacher.
        valid: ``(p_t, k)`` bool, whether proposal ``j`` of teacher ``i`` passed the verifier.
        solved: ``(p_t, k, a)`` bool, whether attempt ``l`` of the matched student solved it
            (ignored where the proposal is invalid).
        num_students: ``p_s``.
        anchor_solved: ``(p_s, m, a)`` bool or ``None``: each student's attempts at the
            step's task-sampled anchor problems (the same ``m`` problems for every student).
        teacher_reward: ``'failures'`` or ``'learnability'``.

    Returns:
        ``(teacher_fitness (p_t,), student_fitness (p_s,))``, float32.

    The rule, with ``s_ij`` the solve rate ``mean_l solved[i, j, l]`` of a
    valid problem:

    - teacher ``i`` (``'failures'``): ``sum_j valid_ij * (1 - s_ij) / k``, the
      fraction of its ``k`` proposals that are valid AND that its matched
      student failed (with several attempts, the failed fraction of them);
      an invalid proposal scores 0.
    - teacher ``i`` (``'learnability'``, Absolute Zero Reasoner):
      ``sum_j valid_ij * r(s_ij) / k`` with ``r(s) = 1 - s`` when
      ``0 < s < 1`` and ``r(s) = 0`` when the problem was always or never
      solved (too easy, or too hard to learn from). Needs ``a >= 2``
      attempts to be non-zero.
    - student ``j``: the fraction of its attempts that were right, over the
      valid problems of every teacher matched with it plus its anchor
      problems. A student with no problem at all (no anchors, no valid
      proposal from a matched teacher) scores the mean of the scored
      students (neutral: neither favoured nor culled by selection), or 0 if
      no student was scored.

    Example:
        >>> opponents = torch.tensor([0, 0])
        >>> valid = torch.tensor([[True, False], [True, True]])
        >>> solved = torch.tensor([[[False], [True]], [[True], [False]]])
        >>> t, s = selfplay_fitnesses(opponents, valid, solved, num_students=2)
        >>> t.tolist(), s.tolist()
        ([0.5, 0.5], [0.3333333432674408, 0.3333333432674408])
    """
    teacher_reward = check_one_of("teacher_reward", teacher_reward, TEACHER_REWARDS)
    opponents, valid, solved, p_s, anchor_solved = _check_outcomes(
        opponents, valid, solved, num_students, anchor_solved
    )
    _, k, a = solved.shape
    rate = solved.double().mean(2)  # (p_t, k)
    if teacher_reward == "failures":
        reward = 1.0 - rate
    else:
        reward = torch.where((rate > 0) & (rate < 1), 1.0 - rate, torch.zeros_like(rate))
    teacher = (reward * valid).sum(1) / max(k, 1)

    right = torch.zeros(p_s, dtype=torch.float64)
    count = torch.zeros(p_s, dtype=torch.float64)
    per_teacher_right = (solved.double().sum(2) * valid).sum(1)  # (p_t,)
    per_teacher_count = valid.double().sum(1) * a
    right.index_add_(0, opponents, per_teacher_right)
    count.index_add_(0, opponents, per_teacher_count)
    if anchor_solved is not None:
        right += anchor_solved.double().sum((1, 2))
        count += anchor_solved.shape[1] * anchor_solved.shape[2]
    scored = count > 0
    student = torch.where(scored, right / count.clamp(min=1), torch.zeros_like(right))
    if not bool(scored.all()):
        student[~scored] = student[scored].mean() if bool(scored.any()) else 0.0
    return teacher.float(), student.float()


def match_scores(opponents: Tensor, valid: Tensor, solved: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The rating matches of a step: one per valid problem, teacher vs its matched student.

    Returns:
        ``(teacher_ids (q,), student_ids (q,), scores (q,) float64)`` in teacher-then-proposal
        order, ``q`` the number of valid problems; score 1 = the teacher won (the student failed
        every attempt), 0 = the student won (solved every attempt), 0.5 = a draw (solved some).
        Invalid proposals are no match (they change no rating).
    """
    p_t, k, _ = solved.shape
    rate = solved.double().mean(2)
    teacher_ids = torch.arange(p_t).repeat_interleave(k).view(p_t, k)[valid]
    student_ids = opponents.long().view(p_t, 1).expand(p_t, k)[valid]
    score = torch.where(rate == 0, 1.0, torch.where(rate == 1, 0.0, 0.5))[valid]
    return teacher_ids, student_ids, score


@dataclass(frozen=True)
class SelfPlayRecord:
    """One :meth:`SelfPlay.step`, as it went (an entry of ``SelfPlay.history``).

    Attributes:
        step: the step's index (0 for the first).
        validity: fraction of the teachers' proposals that passed the verifier.
        student_mean / student_best: mean / best student fitness (the fraction of
            verified answers correct, anchors included).
        anchor_accuracy: mean student accuracy on the step's anchor problems (``None`` without anchors).
        teacher_mean / teacher_best: mean / best teacher fitness.
        teacher_mu / student_mu: mean rating ``mu`` of each population after the step's matches
            (before ``evolve_`` resets culled slots).
        teacher_ordinal_best / student_ordinal_best: the best conservative rating
            (``mu - 3 sigma``) of each population after the matches.
        matches: rated matches played (valid problems).
        tokens: tokens generated in the step (teachers' and students' new tokens up to their
            end-of-sequence, every rank).
        seconds: wall-clock seconds spent generating (never compared across runs).
        tokens_per_s: ``tokens / seconds`` (wall clock).
    """

    step: int
    validity: float
    student_mean: float
    student_best: float
    anchor_accuracy: float | None
    teacher_mean: float
    teacher_best: float
    teacher_mu: float
    student_mu: float
    teacher_ordinal_best: float
    student_ordinal_best: float
    matches: int
    tokens: int
    seconds: float
    tokens_per_s: float

    def as_dict(self) -> dict[str, float]:
        """The fields that hold a number, ``{name: number}`` (``anchor_accuracy`` is left out without anchors).

        Numbers only, so logging is one line: ``writer.add_scalars("selfplay", record.as_dict(), record.step)``
        (TensorBoard), ``wandb.log(record.as_dict())``, a ``csv.DictWriter`` row. :meth:`from_dict` reads it back.
        """
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, d: Any) -> SelfPlayRecord:
        """A record from :meth:`as_dict`'s dict, every field checked (a checkpoint's history is read with it).

        ``anchor_accuracy`` may be absent or ``None`` (a step without anchors); every other field must be there.

        Raises:
            InvalidTypeError, InvalidValueError: not a dict of exactly the record's fields, or a field of the
                wrong type or out of its range (named): ``step``, ``matches``, ``tokens`` ints ``>= 0``;
                ``validity``, the fitness means and bests and ``anchor_accuracy`` (or ``None``) in ``[0, 1]``;
                the rating means and ordinals finite; ``seconds``, ``tokens_per_s`` finite and ``>= 0``.
        """
        names = [f.name for f in fields(cls)]
        if not isinstance(d, dict):
            raise InvalidTypeError(f"a history entry must be a dict with the keys {names}, got {type(d).__name__}")
        if sorted(d, key=str) != sorted(names) and sorted(d, key=str) != sorted(set(names) - {"anchor_accuracy"}):
            raise InvalidValueError(f"a history entry must be a dict with the keys {names}, got {list(d)}")
        values: dict[str, Any] = {}
        for name in names:
            value = d.get(name)  # only anchor_accuracy may be absent (None: a step without anchors)
            if name in _RECORD_INTS:
                values[name] = check_int(name, value, low=0)
            elif name in _RECORD_FRACTIONS or (name == "anchor_accuracy" and value is not None):
                values[name] = check_float(name, value, low=0.0, high=1.0)
            elif name in _RECORD_NONNEGATIVE:
                values[name] = check_float(name, value, low=0.0)
            elif name != "anchor_accuracy":
                values[name] = check_float(name, value)
            else:
                values[name] = None
        return cls(**values)

    @property
    def deterministic(self) -> tuple:
        """Every field but the wall-clock ones (``seconds``, ``tokens_per_s``): equal across identical runs."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.name not in ("seconds", "tokens_per_s"))
