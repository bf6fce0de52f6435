"""Short tasks where a small model starts in a useful band: :class:`Sorting`, :class:`Successor`,
:class:`Comparison`.

Sorting
    Difficulty ``d`` (1 .. 8) sorts ``3 + (d - 1)`` integers drawn uniformly from ``0 .. 99``
    (repeats allowed) in ascending order; the answer is a tuple, the reply is read with
    :func:`~populora.tasks.parsing.parse_int_list`. Teacher format: ``Problem: [5, 2, 8]``
    (2 .. that many integers in ``0 .. 99``).
Successor
    Difficulty ``d`` (1 .. 12) asks for the number after ``N``, a ``d``-digit number
    (``0 .. 9`` at level 1, ``10**(d-1) .. 10**d - 1`` above). Teacher format: ``Problem: 457``
    (exactly one number, ``0 .. 10**d - 1``, in a plain line of at most 100 characters: no brackets
    or operators).
Comparison
    Difficulty ``d`` (1 .. 12): the larger of two distinct ``d``-digit numbers (ranges as for
    Successor). Teacher format: ``Problem: 457 or 812`` (exactly two distinct numbers in
    ``0 .. 10**d - 1``, a plain line as for Successor).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from populora.tasks.base import Problem, Task, randint
from populora.tasks.parsing import find_ints, parse_int, parse_int_list

__all__ = ["Comparison", "Sorting", "Successor"]

SORT_MAX = 99
_EXAMPLE_DIGITS = "457812369012"
_NOT_PLAIN = set("()[]{}+*/=<>^%&|~")


class Sorting(Task):
    """Sort a short list of integers in ascending order (difficulty = list length - 2)."""

    name = "sorting"
    max_difficulty = 8
    instruction = "Give the sorted list in brackets, like [1, 2, 3]."

    @property
    def length(self) -> int:
        return 3 + (self.difficulty - 1)

    def _make(self, values: list[int]) -> Problem:
        shown = ", ".join(map(str, values))
        return Problem(
            self.name,
            f"Sort these numbers in ascending order: [{shown}].",
            tuple(sorted(values)),
            {"numbers": tuple(values)},
        )

    def _sample_one(self, generator: torch.Generator) -> Problem:
        return self._make([randint(generator, 0, SORT_MAX) for _ in range(self.length)])

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        return parse_int_list(reply) is not None

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        values = parse_int_list(reply)
        answer: Any = problem.answer  # a sorting problem's: a sequence of ints
        return values is not None and tuple(values) == tuple(answer)

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:
        return (
            f"Write one new list of 2 to {self.length} whole numbers between 0 and {SORT_MAX} for someone to sort. "
        ) + self.format_line(examples, "[5, 2, 8]")

    def proposal_line(self, problem: Problem) -> str | None:
        return f"[{', '.join(map(str, problem.data['numbers']))}]"

    def _proposal(self, segment: str) -> Problem | None:
        values = parse_int_list(segment)
        if values is None or not 2 <= len(values) <= self.length or not all(0 <= v <= SORT_MAX for v in values):
            return None
        return self._make(values)


class _Digits(Task):
    """Shared by Successor and Comparison: ``d``-digit numbers."""

    max_difficulty = 12

    @property
    def high(self) -> int:
        return 10**self.difficulty - 1

    def _draw(self, generator: torch.Generator) -> int:
        low = 0 if self.difficulty == 1 else 10 ** (self.difficulty - 1)
        return randint(generator, low, self.high)

    def _numbers(self, segment: str) -> list[int]:
        """The numbers of a short plain-text segment; [] for one with brackets or operators."""
        if len(segment) > 100 or any(c in _NOT_PLAIN for c in segment):
            return []
        return find_ints(segment)

    def _example(self, k: int = 0) -> str:
        digits = _EXAMPLE_DIGITS[k:] + _EXAMPLE_DIGITS[:k]
        return digits[: self.difficulty]


class Successor(_Digits):
    """``What number comes after N?`` (difficulty = digits of ``N``)."""

    name = "successor"
    instruction = "Give the answer as a single integer."

    def _make(self, number: int) -> Problem:
        return Problem(self.name, f"What number comes after {number}?", number + 1, {"number": number})

    def _sample_one(self, generator: torch.Generator) -> Problem:
        return self._make(self._draw(generator))

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        return parse_int(reply) is not None

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        return parse_int(reply) == problem.answer

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:
        return (
            f"Write one new whole number with at most {self.difficulty} digit{'s' if self.difficulty > 1 else ''}; "
            "someone will be asked which number comes after it. "
        ) + self.format_line(examples, self._example())

    def proposal_line(self, problem: Problem) -> str | None:
        return str(problem.data["number"])

    def _proposal(self, segment: str) -> Problem | None:
        values = self._numbers(segment)
        if len(values) != 1 or not 0 <= values[0] <= self.high:
            return None
        return self._make(values[0])


class Comparison(_Digits):
    """``Which number is larger: A or B?`` (difficulty = digits of both)."""

    name = "comparison"
    instruction = "Give the larger number as a single integer."

    def _make(self, first: int, second: int) -> Problem:
        return Problem(
            self.name, f"Which number is larger: {first} or {second}?", max(first, second), {"numbers": (first, second)}
        )

    def _sample_one(self, generator: torch.Generator) -> Problem:
        first = self._draw(generator)
        second = self._draw(generator)
        while second == first:
            second = self._draw(generator)
        return self._make(first, second)

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        return parse_int(reply) is not None

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        return parse_int(reply) == problem.answer

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:
        return (
            f"Write two new different whole numbers with at most {self.difficulty} "
            f"digit{'s' if self.difficulty > 1 else ''} each; someone will be asked which is larger. "
        ) + self.format_line(examples, f"{self._example()} or {self._example(3)}")

    def proposal_line(self, problem: Problem) -> str | None:
        first, second = problem.data["numbers"]
        return f"{first} or {second}"

    def _proposal(self, segment: str) -> Problem | None:
        values = self._numbers(segment)
        if len(values) != 2 or values[0] == values[1] or not all(0 <= v <= self.high for v in values):
            return None
        return self._make(values[0], values[1])
