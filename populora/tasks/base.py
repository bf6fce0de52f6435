"""The task interface: :class:`Problem` (one instance), :class:`Task` (a generator and exact checker
with a difficulty knob) and :class:`Mixture` (several tasks, one drawn per problem).

Every task is pure Python plus ``torch.Generator`` draws: ``task.sample(n, generator)`` gives the
same problems for the same generator state, and ``problem.check(reply)`` works on a problem whose
task object is gone (a problem rebuilt from its fields after a checkpoint): each family registers
its checker under its name when its class is defined.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from populora.checks import check_int
from populora.errors import InvalidTypeError, InvalidValueError
from populora.tasks.parsing import proposal_segments

__all__ = ["Mixture", "Problem", "Task", "check_replies", "randint"]

_CHECKERS: dict[str, Callable[[Problem, str], bool]] = {}
_FORMS: dict[str, Callable[[Problem, str], bool]] = {}


def register_checker(family: str, checker: Callable[[Problem, str], bool]) -> None:
    """Make ``Problem.check`` of the ``family`` call ``checker(problem, reply)`` (a later call replaces it)."""
    _CHECKERS[family] = checker


@dataclass(frozen=True)
class Problem:
    """One task instance.

    ``task`` is the family name (``"arithmetic"``, ``"linear"``, ``"sorting"``, ``"successor"``,
    ``"comparison"``, ``"countdown"``, ...), ``question`` the problem text, ``answer`` the canonical
    answer (an int, a tuple of ints for sorting; countdown: the target, where :meth:`check` verifies
    an expression; a reasoning-gym problem: the dataset's answer string) and ``data`` the
    structured fields (numbers, target, expression, ...). Problems compare by all four fields and
    hash by the first three (``data`` is a dict); ``Problem(**dataclasses.asdict(p))`` rebuilds one.
    """

    task: str
    question: str
    answer: int | tuple[int, ...] | Any
    data: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for name in ("task", "question"):
            if not isinstance(getattr(self, name), str):
                raise InvalidTypeError(f"`{name}` must be a str, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.data, Mapping):
            raise InvalidTypeError(f"`data` must be a mapping, got {type(self.data).__name__}")

    def check(self, reply: str) -> bool:
        """Whether ``reply`` answers this problem: its family's lenient parse, then an exact comparison."""
        checker = _CHECKERS.get(self.task)
        if checker is None:
            raise InvalidValueError(f"no checker for the task family {self.task!r}; known: {sorted(_CHECKERS)}")
        if not isinstance(reply, str):
            raise InvalidTypeError(f"`reply` must be a str, got {type(reply).__name__}")
        return bool(checker(self, reply))


def randint(generator: torch.Generator, low: int, high: int) -> int:
    """One integer drawn uniformly from ``[low, high]`` (both included) with ``generator``."""
    return int(torch.randint(low, high + 1, (1,), generator=generator).item())


def check_generator(generator: Any) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise InvalidTypeError(f"`generator` must be a torch.Generator, got {type(generator).__name__}")
    return generator


class Task:
    """A family of verifiable problems with a difficulty knob (``1 .. max_difficulty``, documented by
    each subclass).

    Subclasses set ``name`` and ``max_difficulty`` and implement ``_sample_one(generator)``,
    the static ``check_reply(problem, reply)`` (registered for :meth:`Problem.check`),
    ``instruction`` (appended to the question in :meth:`prompt`), :meth:`proposal_prompt` and
    ``_proposal(segment)`` (one candidate line of a teacher's text -> a Problem, or raise
    ``ValueError`` / return None).
    """

    name: ClassVar[str] = ""
    max_difficulty: ClassVar[int] = 1
    instruction: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        checker = cls.__dict__.get("check_reply")
        if cls.name and checker is not None:
            register_checker(cls.name, checker.__func__ if isinstance(checker, staticmethod) else checker)
        form = cls.__dict__.get("well_formed_reply")
        if cls.name and form is not None:
            _FORMS[cls.name] = form.__func__ if isinstance(form, staticmethod) else form

    def __init__(self, difficulty: int = 1) -> None:
        self.difficulty = check_int("difficulty", difficulty, low=1, high=self.max_difficulty)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(difficulty={self.difficulty})"

    def sample(self, n: int, generator: torch.Generator) -> list[Problem]:
        """``n`` problems drawn with ``generator`` (same generator state, same problems)."""
        n = check_int("n", n, low=0)
        generator = check_generator(generator)
        return [self._sample_one(generator) for _ in range(n)]

    def _sample_one(self, generator: torch.Generator) -> Problem:
        raise NotImplementedError(f"{type(self).__name__} must implement _sample_one")

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        raise NotImplementedError("a task family must implement check_reply")

    def check(self, problem: Problem, reply: str) -> bool:
        """Whether ``reply`` answers ``problem`` (a problem of this task's family)."""
        if not isinstance(problem, Problem):
            raise InvalidTypeError(f"`problem` must be a Problem, got {type(problem).__name__}")
        if problem.task != self.name:
            raise InvalidValueError(f"{self!r} checks {self.name!r} problems, got a {problem.task!r} problem")
        return problem.check(reply)

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        """Whether ``reply`` gives an answer in the form this family reads, right or wrong (registered, like
        :meth:`check_reply`, under the family's name). A family overrides it; the default is a non-blank reply."""
        return bool(reply.strip())

    def well_formed(self, problem: Problem, reply: str) -> bool:
        """Whether ``reply`` answers ``problem`` in a form its family reads (right or wrong): the paper's student
        reward tells a wrong answer (-0.5) from a format error (-1) by it. Works for a problem of any family
        (its registered :meth:`well_formed_reply`; a family that registers none: a non-blank reply)."""
        if not isinstance(problem, Problem):
            raise InvalidTypeError(f"`problem` must be a Problem, got {type(problem).__name__}")
        if not isinstance(reply, str):
            raise InvalidTypeError(f"`reply` must be a str, got {type(reply).__name__}")
        return reply_is_well_formed(problem, reply)

    def prompt(self, problem: Problem) -> str:
        """The solver's user message: the question and how to give the answer."""
        if not isinstance(problem, Problem):
            raise InvalidTypeError(f"`problem` must be a Problem, got {type(problem).__name__}")
        return f"{problem.question} {self.instruction}".strip()

    def phrasings(self) -> tuple[Callable[[Problem], str], ...]:
        """The user messages a student may be asked a problem in during training (one drawn per problem and
        step when there are several): by default the task's template alone, ``(self.prompt,)``."""
        return (self.prompt,)

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:
        """The teacher's user message: propose ONE new problem in the format :meth:`parse_proposal` reads.

        ``examples``: problems asked before (AZR's reference tasks), shown instead of the fixed example so that
        a teacher sees what it should not repeat; a family that cannot write its problems as proposal lines
        (:meth:`proposal_line` is None) ignores them. A family implements it with :meth:`format_line`.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement proposal_prompt")

    def proposal_line(self, problem: Problem) -> str | None:
        """``problem`` as the text after ``Problem:`` that :meth:`parse_proposal` reads back into it (``None``: this
        family cannot write one, and its prompt keeps its fixed example)."""
        return None

    def format_line(self, examples: Sequence[Problem], default: str) -> str:
        """The end of a proposal prompt: the format with ``default`` as its example or, given ``examples`` of this
        family, those problems as the ones to write a new problem unlike (the first one as the format)."""
        lines = [line for line in (self.proposal_line(p) for p in examples if p.task == self.name) if line]
        if not lines:
            return f"Reply with one line in exactly this format: Problem: {default}"
        shown = "; ".join(f"Problem: {line}" for line in lines)
        return (
            f"Problems asked before: {shown}. Write a new one, different from these. "
            f"Reply with one line in exactly this format: Problem: {lines[0]}"
        )

    def parse_proposal(self, text: str) -> Problem | None:
        """A teacher's ``text`` -> a verified, in-bounds :class:`Problem` with the answer computed here,
        or None (never raises on model output). The first candidate segment
        (:func:`~populora.tasks.parsing.proposal_segments`) that is a valid instance wins."""
        if not isinstance(text, str):
            raise InvalidTypeError(f"`text` must be a str, got {type(text).__name__}")
        for segment in proposal_segments(text):
            try:
                problem = self._proposal(segment)
            except (ValueError, ArithmeticError):  # InvalidValueError included
                continue
            if problem is not None:
                return problem
        return None

    def _proposal(self, segment: str) -> Problem | None:
        raise NotImplementedError(f"{type(self).__name__} must implement _proposal")


def proposal_prompt(task: Task, examples: Sequence[Problem] = ()) -> str:
    """``task.proposal_prompt(examples)``, or ``task.proposal_prompt()`` for a task whose method takes no examples
    (a user's task of before 0.6.0 keeps its prompt)."""
    import inspect

    if examples and "examples" in inspect.signature(task.proposal_prompt).parameters:
        return task.proposal_prompt(examples=examples)
    return task.proposal_prompt()


def reply_is_well_formed(problem: Problem, reply: str) -> bool:
    """``reply`` read by the well-formedness rule of ``problem``'s family (:meth:`Task.well_formed_reply`)."""
    return _FORMS.get(problem.task, Task.well_formed_reply)(problem, reply)


def check_replies(problems: Sequence[Problem], replies: Sequence[str]) -> torch.Tensor:
    """``(n,)`` bool: whether ``replies[i]`` answers ``problems[i]``."""
    if len(problems) != len(replies):
        raise InvalidValueError(f"got {len(problems)} problems but {len(replies)} replies")
    return torch.tensor([problem.check(reply) for problem, reply in zip(problems, replies)], dtype=torch.bool)


def _weight(i: int, w: Any) -> float:
    """``weights[i]`` as a finite float >= 0: a Python or NumPy real number or a 0-d real tensor (not a bool)."""
    if isinstance(w, torch.Tensor) and w.ndim == 0 and not (w.dtype.is_complex or w.dtype == torch.bool):
        w = w.item()
    if not isinstance(w, bool) and isinstance(w, numbers.Real):
        try:
            value = float(w)
        except OverflowError:  # an int beyond float64
            value = math.inf
        if 0 <= value < math.inf:
            return value
    shown = f"an int of {w.bit_length()} bits" if isinstance(w, int) and w.bit_length() > 64 else repr(w)
    raise InvalidValueError(f"`weights[{i}]` must be a finite number >= 0, got {shown}")


class Mixture(Task):
    """Several tasks: each problem's task is drawn with probability proportional to ``weights``
    (uniform when None); :meth:`check` and :meth:`prompt` delegate to the problem's family.

    A weight is a finite number >= 0: a Python or NumPy number or a 0-d real tensor (a 1-D tensor or
    array of them works as ``weights``); not all zero, and their sum must be finite in float64.

    Member names must differ. ``difficulty`` is None (each member has its own). The teacher's
    :meth:`proposal_prompt` lists every member's format; :meth:`parse_proposal` tries the members in
    order and the first that accepts the text wins.
    """

    name = "mixture"

    def __init__(self, tasks: Sequence[Task], weights: Sequence[float] | None = None) -> None:
        tasks = list(tasks)
        if not tasks:
            raise InvalidValueError("`tasks` must hold at least one Task, got none")
        for i, task in enumerate(tasks):
            if not isinstance(task, Task) or isinstance(task, Mixture):
                raise InvalidTypeError(f"`tasks[{i}]` must be a Task (not a Mixture), got {type(task).__name__}")
        names = [task.name for task in tasks]
        if len(set(names)) != len(names):
            raise InvalidValueError(f"`tasks` must have distinct names, got {names}")
        if weights is None:
            weights = [1.0] * len(tasks)
        weights = list(weights)
        if len(weights) != len(tasks):
            raise InvalidValueError(f"`weights` must have {len(tasks)} entries (one per task), got {len(weights)}")
        values = [_weight(i, w) for i, w in enumerate(weights)]
        total = sum(values)
        if total <= 0:
            raise InvalidValueError(f"`weights` must not all be zero, got {values}")
        if not math.isfinite(total):  # multinomial would then see inf and draw a single task
            raise InvalidValueError(
                f"`weights` sum to {total} (float64 overflow), got {values}; only their ratios "
                "matter, so scale them down"
            )
        self.tasks: tuple[Task, ...] = tuple(tasks)
        self.weights = torch.tensor(values, dtype=torch.float64)
        self.difficulty = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Mixture({list(self.tasks)}, weights={self.weights.tolist()})"

    def task(self, name: str) -> Task:
        """The member task of family ``name``."""
        for task in self.tasks:
            if task.name == name:
                return task
        raise InvalidValueError(f"this Mixture has no task {name!r}; it has {[t.name for t in self.tasks]}")

    def sample(self, n: int, generator: torch.Generator) -> list[Problem]:
        n = check_int("n", n, low=0)
        generator = check_generator(generator)
        if n == 0:
            return []
        which = torch.multinomial(self.weights, n, replacement=True, generator=generator).tolist()
        return [self.tasks[i].sample(1, generator)[0] for i in which]

    def check(self, problem: Problem, reply: str) -> bool:
        if not isinstance(problem, Problem):
            raise InvalidTypeError(f"`problem` must be a Problem, got {type(problem).__name__}")
        return self.task(problem.task).check(problem, reply)

    def prompt(self, problem: Problem) -> str:
        if not isinstance(problem, Problem):
            raise InvalidTypeError(f"`problem` must be a Problem, got {type(problem).__name__}")
        return self.task(problem.task).prompt(problem)

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:
        kinds = "\n".join(f"- {proposal_prompt(task, examples)}" for task in self.tasks)
        return f"Write one new problem of ONE of these kinds, following its instructions:\n{kinds}"

    def parse_proposal(self, text: str) -> Problem | None:
        if not isinstance(text, str):
            raise InvalidTypeError(f"`text` must be a str, got {type(text).__name__}")
        for task in self.tasks:
            problem = task.parse_proposal(text)
            if problem is not None:
                return problem
        return None
