"""Countdown: reach a target from given numbers with ``+ - * /``.

Difficulty ``d`` (1 .. 5) gives ``d + 1`` numbers drawn uniformly from ``1 .. 9*d`` and a target in
``1 .. MAX_TARGET`` built from a random expression over ALL the numbers (a random binary tree, each
operator drawn from ``+ - * /``; a division that is not exact becomes another operator), so every
generated instance is solvable; ``data["expression"]`` holds that witness. After 100 draws without
a target in range the sum of the numbers is used (always in range).

A reply is right when its LAST expression-looking segment, evaluated exactly by
:func:`~populora.tasks.safe_eval.parse_expression`, equals the target and uses each given number at
most as often as it is given (a multiset; not every number must be used), with binary ``+ - * /``
only (no unary minus) and parentheses. The segment rule: the reply is cut at newlines, ``=`` and
every character that cannot be part of an expression (anything but digits, spaces, ``+ - * / ( )``;
``×``, ``÷`` and ``−`` are read as ``*``, ``/`` and ``-``); leading ``* / +`` and trailing operators
are trimmed (markdown bold); the last piece with at least one operator between two numbers is the
expression. So ``"(7 - 2) * 3 + 8 = 23"`` reads ``(7 - 2) * 3 + 8``, and a reply that ends with
``"so 23 - 8 = 15"`` reads ``23 - 8``.

Teacher format: ``Problem: 3 * 7 + 2``, the solution expression itself (2 .. ``d + 1`` numbers in
``1 .. 9*d``, binary ``+ - * /``, an integer value in ``1 .. MAX_TARGET``); the instance's numbers are
its constants in ascending order and its target the value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction

import torch

from populora.errors import InvalidValueError
from populora.tasks.arithmetic import Node, clean_expression
from populora.tasks.base import Problem, Task, randint
from populora.tasks.safe_eval import parse_expression

__all__ = ["Countdown", "last_expression"]

MAX_TARGET = 999
_PIECES = re.compile(r"[0-9 \t+\-*/()]+")
_BINARY = re.compile(r"[0-9)]\s*[-+*/]\s*[(0-9]")
_OPS = "+-*/"


def last_expression(reply: str) -> str | None:
    """The last expression-looking segment of ``reply`` (rule in the module docstring), or None."""
    text = reply.replace("\u00d7", "*").replace("\u00f7", "/").replace("\u2212", "-")
    for line in reversed(text.splitlines()):
        for part in reversed(line.split("=")):
            for piece in reversed(_PIECES.findall(part)):
                piece = _balanced(piece.strip().lstrip("*/+").rstrip("*/+-").strip())
                if _BINARY.search(piece):
                    return piece
    return None


def _balanced(piece: str) -> str:
    """``piece`` without the unmatched ``)`` at its end, then the unmatched ``(`` at its start (and the
    spaces between them), in one pass: counting and slicing once per bracket is quadratic in a run."""
    opens, closes = piece.count("("), piece.count(")")
    start, end = 0, len(piece)
    while end > start and piece[end - 1] == ")" and closes > opens:
        end -= 1
        closes -= 1
        while end > start and piece[end - 1] in " \t":
            end -= 1
    while start < end and piece[start] == "(" and opens > closes:
        start += 1
        opens -= 1
        while start < end and piece[start] in " \t":
            start += 1
    return piece[start:end]


def _value(node: Node) -> int:
    """The exact value of a tree whose divisions are exact (the generator makes them so)."""
    if not node.op:
        return node.value
    assert node.left is not None and node.right is not None
    return int(_apply(node.op, Fraction(_value(node.left)), Fraction(_value(node.right))))


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction:
    return a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b


class Countdown(Task):
    """Reach ``target`` from ``numbers`` with ``+ - * /`` (difficulty table in the module docstring)."""

    name = "countdown"
    max_difficulty = 5
    instruction = "Use each number at most once, only + - * / and parentheses. Write the expression on the last line."

    @property
    def count(self) -> int:
        """How many numbers are given."""
        return self.difficulty + 1

    @property
    def max_number(self) -> int:
        return 9 * self.difficulty

    def _make(self, numbers: list[int], target: int, expression: str) -> Problem:
        numbers = sorted(numbers)
        shown = ", ".join(map(str, numbers))
        question = f"Using the numbers [{shown}], make {target}."
        return Problem(
            self.name, question, target, {"numbers": tuple(numbers), "target": target, "expression": expression}
        )

    def _tree(self, values: list[int], generator: torch.Generator) -> Node:
        if len(values) == 1:
            return Node(value=values[0])
        split = randint(generator, 1, len(values) - 1)
        left, right = self._tree(values[:split], generator), self._tree(values[split:], generator)
        op = _OPS[randint(generator, 0, 3)]
        a, b = _value(left), _value(right)
        if op == "/" and (b == 0 or a % b):
            op = _OPS[randint(generator, 0, 2)]
        return Node(op, left, right)

    def _sample_one(self, generator: torch.Generator) -> Problem:
        values = [randint(generator, 1, self.max_number) for _ in range(self.count)]
        for _ in range(100):
            order = torch.randperm(len(values), generator=generator).tolist()
            tree = self._tree([values[i] for i in order], generator)
            target = _value(tree)
            if 1 <= target <= MAX_TARGET:
                expression = tree.render()
                break
        else:
            target, expression = sum(values), " + ".join(map(str, values))
        if parse_expression(expression).value != target:  # the witness and the checker agree, always
            raise AssertionError(f"countdown witness {expression!r} does not make {target}")
        return self._make(values, target, expression)

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        return last_expression(reply) is not None

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        expression = last_expression(reply)
        if expression is None:
            return False
        try:
            parsed = parse_expression(expression)
        except InvalidValueError:
            return False
        return (
            not parsed.unary and parsed.value == problem.data["target"] and parsed.uses_within(problem.data["numbers"])
        )

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:
        return (
            f"Write one new Countdown puzzle by writing its solution: an expression with 2 to {self.count} "
            f"whole numbers between 1 and {self.max_number} and the operators + - * / whose value is a whole "
            f"number between 1 and {MAX_TARGET}. "
        ) + self.format_line(examples, "3 * 7" if self.count == 2 else "3 * 7 + 2")

    def proposal_line(self, problem: Problem) -> str | None:
        return str(problem.data["expression"])

    def _proposal(self, segment: str) -> Problem | None:
        parsed = parse_expression(clean_expression(segment))
        if (
            parsed.unary
            or not 2 <= len(parsed.constants) <= self.count
            or not all(1 <= c <= self.max_number for c in parsed.constants)
            or parsed.value.denominator != 1
            or not 1 <= parsed.value <= MAX_TARGET
        ):
            return None
        return self._make(list(parsed.constants), int(parsed.value), parsed.text)
