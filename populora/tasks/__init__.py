"""Verifiable tasks for self-play and ES on language models: generators with a difficulty knob,
exact checkers, lenient answer parsing and a parser for teacher-proposed problems.

Nothing here executes model output: expressions go through :func:`safe_eval` (an AST walk that
admits int constants, ``+ - * /``, unary minus and parentheses only, with bounded size). Answers are
read leniently (:mod:`populora.tasks.parsing`: the last integer, the last list).

=======================  ================  ==============================================
task                     family            difficulty knob
=======================  ================  ==============================================
:class:`Arithmetic`      ``arithmetic``    operands, digits, operators, parentheses (1..8)
:class:`LinearEquation`  ``linear``        coefficient size of ``a*x + b = c`` (1..6)
:class:`Sorting`         ``sorting``       list length ``3 + (d - 1)`` (1..8)
:class:`Successor`       ``successor``     digits of ``N`` (1..12)
:class:`Comparison`      ``comparison``    digits of both numbers (1..12)
:class:`Countdown`       ``countdown``     ``d + 1`` numbers in ``1 .. 9d`` (1..5)
:class:`CodeOutput`      ``code_o/i/f``    steps of ``f`` (1..5); also CodeInput, CodeFunction (run in a Sandbox)
:class:`Mixture`         the members'      a task drawn per problem by weight
=======================  ================  ==============================================

Example:
    >>> import torch
    >>> task = Arithmetic(difficulty=1)
    >>> problem = task.sample(1, torch.Generator().manual_seed(0))[0]
    >>> problem.check(f"The answer is {problem.answer}.")
    True
    >>> task.parse_proposal("Problem: 3 + 4").answer
    7
"""

from populora.tasks.arithmetic import Arithmetic, LinearEquation
from populora.tasks.base import Mixture, Problem, Task, check_replies
from populora.tasks.code import CodeFunction, CodeInput, CodeOutput, CodeTask, check_code_replies
from populora.tasks.countdown import Countdown, last_expression
from populora.tasks.parsing import find_ints, parse_int, parse_int_list, proposal_segments
from populora.tasks.reasoning_gym import ReasoningGymTask
from populora.tasks.safe_eval import ParsedExpression, parse_expression, safe_eval
from populora.tasks.sandbox import Job, Limits, RunResult, Sandbox
from populora.tasks.simple import Comparison, Sorting, Successor

__all__ = [
    "Arithmetic",
    "CodeFunction",
    "CodeInput",
    "CodeOutput",
    "CodeTask",
    "Comparison",
    "Countdown",
    "Job",
    "Limits",
    "LinearEquation",
    "Mixture",
    "ParsedExpression",
    "Problem",
    "ReasoningGymTask",
    "RunResult",
    "Sandbox",
    "Sorting",
    "Successor",
    "Task",
    "check_code_replies",
    "check_replies",
    "find_ints",
    "last_expression",
    "parse_expression",
    "parse_int",
    "parse_int_list",
    "proposal_segments",
    "safe_eval",
]
