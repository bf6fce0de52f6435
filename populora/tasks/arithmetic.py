"""Integer arithmetic (:class:`Arithmetic`) and ``a*x + b = c`` abduction (:class:`LinearEquation`).

Arithmetic difficulty (operands, digits per operand, operators, parentheses):

=====  ========  ======  =========  ===========
level  operands  digits  operators  parentheses
=====  ========  ======  =========  ===========
1      2         1       ``+``      no
2      2         2       ``+ -``    no
3      3         2       ``+ - *``  no
4      3         2       ``+ - *``  yes
5      4         2       ``+ - *``  yes
6      4         3       ``+ - *``  yes
7      5         3       ``+ - *``  yes
8      6         3       ``+ - *``  yes
=====  ========  ======  =========  ===========

Operands are drawn uniformly from ``0 .. 10**digits - 1``; at the levels with parentheses the
expression is a random binary tree, printed with only the parentheses it needs. Every value stays
within ``MAX_ABS`` (instances beyond it are redrawn). Teacher format: ``Problem: 3 + 4``; a proposal
must fit the level: 2 .. operands constants of at most that many digits, only its operators (no
unary minus, no ``/``), parentheses only where the level has them, an integer value.

LinearEquation difficulty is the coefficient size ``C`` = 9, 20, 50, 99, 999, 9999 at levels 1..6:
``a`` in ``2 .. C``; ``b`` and the solution ``x`` in ``0 .. C`` at level 1 and ``-C .. C`` above;
``c = a*x + b``. The question reads ``Solve for x: 3*x + 5 = 20.`` Teacher format:
``Problem: 2*x + 3 = 11`` (``2x`` without ``*`` too; ``b`` may be omitted or subtracted); it must have
``a``, ``b`` and the (integer) solution in the level's ranges.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch

from populora.errors import InvalidValueError
from populora.tasks.base import Problem, Task, randint
from populora.tasks.parsing import parse_int
from populora.tasks.safe_eval import parse_expression

__all__ = ["Arithmetic", "LinearEquation"]

MAX_ABS = 10**12
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
# level -> (operands, digits, operators, parentheses)
_LEVELS = {
    1: (2, 1, "+", False),
    2: (2, 2, "+-", False),
    3: (3, 2, "+-*", False),
    4: (3, 2, "+-*", True),
    5: (4, 2, "+-*", True),
    6: (4, 3, "+-*", True),
    7: (5, 3, "+-*", True),
    8: (6, 3, "+-*", True),
}
_QUESTION_PREFIX = re.compile(r"^(?:what\s+is|what's|compute|calculate|evaluate|find|solve)\s*:?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Node:
    """A binary expression tree over ints: a leaf when ``op`` is empty."""

    op: str = ""
    left: Node | None = None
    right: Node | None = None
    value: int = 0

    def render(self) -> str:
        """The expression with only the parentheses it needs, spaced like ``ast.unparse``."""
        if not self.op:
            return str(self.value)
        assert self.left is not None and self.right is not None
        left, right = self.left.render(), self.right.render()
        mine = _PRECEDENCE[self.op]
        if self.left.op and _PRECEDENCE[self.left.op] < mine:
            left = f"({left})"
        if self.right.op and (
            _PRECEDENCE[self.right.op] < mine or (_PRECEDENCE[self.right.op] == mine and self.op in "-/")
        ):
            right = f"({right})"
        return f"{left} {self.op} {right}"


def random_tree(values: list[int], ops: str, generator: torch.Generator) -> Node:
    """A uniformly split random binary tree over ``values`` (in order), operators drawn from ``ops``."""
    if len(values) == 1:
        return Node(value=values[0])
    split = randint(generator, 1, len(values) - 1)
    op = ops[randint(generator, 0, len(ops) - 1)]
    return Node(op, random_tree(values[:split], ops, generator), random_tree(values[split:], ops, generator))


def clean_expression(segment: str) -> str:
    """A proposal segment -> the bare expression: drops ``What is`` / ``Compute`` ..., a trailing
    ``?`` or ``.``, and everything from the first ``=`` (a teacher's own answer is ignored)."""
    segment = segment.split("=", 1)[0]
    segment = _QUESTION_PREFIX.sub("", segment.strip())
    segment = segment.replace("\u00d7", "*").replace("\u00f7", "/").replace("\u2212", "-")
    return segment.strip().rstrip("?.!:;").strip()


class Arithmetic(Task):
    """Integer arithmetic: ``What is 3 + 4?`` (difficulty table in the module docstring)."""

    name = "arithmetic"
    max_difficulty = 8
    instruction = "Give the final answer as a single integer."

    @property
    def operands(self) -> int:
        return _LEVELS[self.difficulty][0]

    @property
    def digits(self) -> int:
        return _LEVELS[self.difficulty][1]

    @property
    def operators(self) -> str:
        return _LEVELS[self.difficulty][2]

    @property
    def parentheses(self) -> bool:
        return _LEVELS[self.difficulty][3]

    def _make(self, expression: str, value: Fraction) -> Problem:
        return Problem(self.name, f"What is {expression}?", int(value), {"expression": expression})

    def _sample_one(self, generator: torch.Generator) -> Problem:
        high = 10**self.digits - 1
        while True:  # redraws are rare (a product beyond MAX_ABS) and consume the generator deterministically
            values = [randint(generator, 0, high) for _ in range(self.operands)]
            if self.parentheses:
                expression = random_tree(values, self.operators, generator).render()
            else:
                ops = [self.operators[randint(generator, 0, len(self.operators) - 1)] for _ in values[1:]]
                expression = " ".join([str(values[0])] + [f"{o} {v}" for o, v in zip(ops, values[1:])])
            try:
                value = parse_expression(expression, max_abs=MAX_ABS).value
            except InvalidValueError:
                continue
            return self._make(expression, value)

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        return parse_int(reply) is not None

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        return parse_int(reply) == problem.answer

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:
        ops = " ".join(self.operators)
        parens = " and parentheses" if self.parentheses else ""
        count = "2" if self.operands == 2 else f"2 to {self.operands}"
        return (
            f"Write one new arithmetic problem: an expression with {count} whole numbers of at most "
            f"{self.digits} digit{'s' if self.digits > 1 else ''} and the operators {ops}{parens}. "
        ) + self.format_line(examples, "3 + 4")

    def proposal_line(self, problem: Problem) -> str | None:
        return str(problem.data["expression"])

    def _proposal(self, segment: str) -> Problem | None:
        expression = clean_expression(segment)
        if "(" in expression and not self.parentheses:
            return None
        parsed = parse_expression(expression, max_abs=MAX_ABS)
        if (
            parsed.unary
            or not parsed.operators <= set(self.operators)
            or not 2 <= len(parsed.constants) <= self.operands
            or max(parsed.constants) >= 10**self.digits
            or parsed.value.denominator != 1
        ):
            return None
        return self._make(_canonical(parsed.text), parsed.value)


def _canonical(expression: str) -> str:
    """One spelling per expression tree: ``(3+4)*5`` -> ``(3 + 4) * 5``."""
    return ast.unparse(ast.parse(expression, mode="eval"))


_COEFFICIENT = (9, 20, 50, 99, 999, 9999)
_LINEAR = re.compile(r"^(?P<a>[0-9]+)?\s*\*?\s*x\s*(?:(?P<sign>[-+])\s*(?P<b>[0-9]+))?\s*=\s*(?P<c>-?[0-9]+)$")
_SOLVE_PREFIX = re.compile(r"^(?:solve(?:\s+for\s+x)?|find\s+x)\s*[:,]?\s*", re.IGNORECASE)


class LinearEquation(Task):
    """Abduction: find the integer ``x`` in ``a*x + b = c`` (difficulty table in the module docstring)."""

    name = "linear"
    max_difficulty = len(_COEFFICIENT)
    instruction = "Give the value of x as a single integer."

    @property
    def coefficient(self) -> int:
        """``C``: the largest coefficient (and solution magnitude) at this difficulty."""
        return _COEFFICIENT[self.difficulty - 1]

    @property
    def _low(self) -> int:
        return 0 if self.difficulty == 1 else -self.coefficient

    def _make(self, a: int, b: int, x: int) -> Problem:
        c = a * x + b
        left = f"{a}*x" if b == 0 else f"{a}*x {'+' if b > 0 else '-'} {abs(b)}"
        return Problem(self.name, f"Solve for x: {left} = {c}.", x, {"a": a, "b": b, "c": c})

    def _sample_one(self, generator: torch.Generator) -> Problem:
        a = randint(generator, 2, self.coefficient)
        b = randint(generator, self._low, self.coefficient)
        x = randint(generator, self._low, self.coefficient)
        return self._make(a, b, x)

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        return parse_int(reply) is not None

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        return parse_int(reply) == problem.answer

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:
        sign = "whole numbers" if self.difficulty == 1 else "integers"
        return (
            f"Write one new equation a*x + b = c whose solution x is a whole number, with a between 2 and "
            f"{self.coefficient} and b and x {sign} between {self._low} and {self.coefficient}. "
        ) + self.format_line(examples, "2*x + 3 = 11")

    def proposal_line(self, problem: Problem) -> str | None:
        return problem.question.removeprefix("Solve for x: ").rstrip(".")

    def _proposal(self, segment: str) -> Problem | None:
        text = _SOLVE_PREFIX.sub("", segment.strip().replace("\u2212", "-").replace("\u00d7", "*"))
        text = re.sub(r"\s+", " ", text.rstrip("?.!;").strip())
        match = None if len(text) > 60 else _LINEAR.match(text)  # the length first: no regex work on a long line
        if match is None:
            return None
        a = int(match["a"]) if match["a"] else 1
        b = (int(match["b"]) * (-1 if match["sign"] == "-" else 1)) if match["b"] else 0
        c = int(match["c"])
        if not (2 <= a <= self.coefficient and self._low <= b <= self.coefficient) or (c - b) % a:
            return None
        x = (c - b) // a
        if not self._low <= x <= self.coefficient:
            return None
        return self._make(a, b, x)
