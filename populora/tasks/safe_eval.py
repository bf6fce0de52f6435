"""A safe evaluator for integer arithmetic written by a model: nothing is ever executed.

:func:`safe_eval` parses with ``ast.parse(mode="eval")`` and walks the tree itself, accepting only

- int constants written in plain decimal digits (``7``, ``120``; not ``True``, ``1.5``, ``1j``,
  ``"3"``, ``0x10`` or ``1_000``),
- the binary operators ``+ - * /`` (``/`` is exact: rational arithmetic with
  :class:`fractions.Fraction`; division by zero is refused),
- unary ``-`` and ``+``,
- parentheses (they leave no node in the tree).

Anything else (names, calls, attributes, ``**``, ``//``, ``%``, comparisons, subscripts, lambdas,
f-strings, ...) raises :class:`~populora.errors.InvalidValueError` naming the construct. Every
size is bounded, and checked in this order so that no bound can be dodged by another:

1. the length of the text (``max_length`` characters), before anything is parsed, so that
   ``"(" * 10**4`` or a megabyte of digits never reaches the parser;
2. the number of expression nodes (``max_nodes``: constants and operators) and the depth
   (``max_depth``: operators on the longest root-to-leaf path), checked by an iterative walk
   before any arithmetic;
3. the magnitude of every constant and of every intermediate result (numerator and denominator
   at most ``max_abs``), so ``9*9*9*...`` stops at the first product beyond the bound.

Python's own recursion and memory limits are never the guard: they raise our error first.

Example:
    >>> safe_eval("(7 - 2) * 3 + 8")
    Fraction(23, 1)
    >>> safe_eval("7 / 2")
    Fraction(7, 2)
    >>> safe_eval("2 ** 10")
    Traceback (most recent call last):
    ...
    populora.errors.InvalidValueError: `2 ** 10`: `**` (power) is not allowed; only int constants, + - * / ...
"""

from __future__ import annotations

import ast
import re
import warnings
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from populora.checks import check_int
from populora.errors import InvalidTypeError, InvalidValueError

__all__ = ["ParsedExpression", "parse_expression", "safe_eval"]

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_UNARY = {ast.USub: "-", ast.UAdd: "+"}
_FORBIDDEN_OPERATORS = {
    ast.Pow: "`**` (power)",
    ast.FloorDiv: "`//` (floor division)",
    ast.Mod: "`%` (modulo)",
    ast.MatMult: "`@` (matrix product)",
    ast.LShift: "`<<` (shift)",
    ast.RShift: "`>>` (shift)",
    ast.BitOr: "`|` (bitwise or)",
    ast.BitAnd: "`&` (bitwise and)",
    ast.BitXor: "`^` (bitwise xor)",
    ast.Invert: "`~` (bitwise not)",
    ast.Not: "`not`",
}
_CONSTRUCTS = {
    ast.Name: "a name",
    ast.Call: "a function call",
    ast.Attribute: "attribute access",
    ast.Subscript: "a subscript",
    ast.Compare: "a comparison",
    ast.BoolOp: "`and` / `or`",
    ast.Lambda: "a lambda",
    ast.JoinedStr: "an f-string",
    ast.FormattedValue: "an f-string",
    ast.IfExp: "a conditional expression",
    ast.NamedExpr: "an assignment expression (`:=`)",
    ast.Tuple: "a tuple",
    ast.List: "a list",
    ast.Set: "a set",
    ast.Dict: "a dict",
    ast.ListComp: "a comprehension",
    ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a generator expression",
    ast.Starred: "a starred expression",
    ast.Await: "`await`",
    ast.Yield: "`yield`",
    ast.YieldFrom: "`yield from`",
    ast.Slice: "a slice",
}
_ALLOWED = "only int constants, + - * / and unary - are"
_DEPTH_CAP = 100  # the largest max_depth accepted: the evaluator recurses once per level


@dataclass(frozen=True)
class ParsedExpression:
    """A validated expression: its exact ``value``, the int ``constants`` in reading order, the
    binary ``operators`` used (a subset of ``{"+", "-", "*", "/"}``), whether it has a unary
    operator (``unary``), and its ``depth`` (operators on the longest root-to-leaf path)."""

    text: str
    value: Fraction
    constants: tuple[int, ...]
    operators: frozenset[str]
    unary: bool
    depth: int

    def uses_within(self, numbers: tuple[int, ...] | list[int]) -> bool:
        """Whether every constant is one of ``numbers``, each used at most as often as it appears there."""
        return not Counter(self.constants) - Counter(numbers)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name `{node.id}`"
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or node.value is None or node.value is Ellipsis:
            return f"the constant `{node.value!r}`"
        return f"a {type(node.value).__name__} constant `{node.value!r}`"
    for kind, name in _CONSTRUCTS.items():
        if isinstance(node, kind):
            return name
    return f"`{type(node).__name__}`"


def parse_expression(
    expr: str, *, max_length: int = 200, max_depth: int = 10, max_nodes: int = 100, max_abs: int = 10**12
) -> ParsedExpression:
    """Validate and evaluate ``expr`` (see the module docstring for what is accepted).

    Returns a :class:`ParsedExpression` (value and structure); raises
    :class:`~populora.errors.InvalidValueError` naming the first offending construct or bound.
    """
    if not isinstance(expr, str):
        raise InvalidTypeError(f"`expr` must be a str, got {type(expr).__name__}")
    max_length = check_int("max_length", max_length, low=1, high=100_000)
    max_depth = check_int("max_depth", max_depth, low=1, high=_DEPTH_CAP)
    max_nodes = check_int("max_nodes", max_nodes, low=1, high=100_000)
    max_abs = check_int("max_abs", max_abs, low=1)
    if len(expr) > max_length:
        raise InvalidValueError(
            f"expression `{_short(expr)}` has {len(expr)} characters, more than max_length={max_length}"
        )
    text = expr.strip()
    if not text:
        raise InvalidValueError("expression is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning "'int' object is not callable"
            tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        raise InvalidValueError(f"expression `{_short(text)}` is not valid syntax ({err.msg})") from None
    except (ValueError, RecursionError, MemoryError) as err:  # null bytes, huge literals, nesting
        raise InvalidValueError(f"expression `{_short(text)}` cannot be parsed ({type(err).__name__})") from None

    # 1. structure: an iterative walk (no recursion on untrusted depth), before any arithmetic
    lines = _source_lines(text)
    constants: list[int] = []
    operators: set[str] = set()
    unary = False
    depth = 0
    count = 0
    stack: list[tuple[ast.AST, int]] = [(tree.body, 0)]
    while stack:
        node, level = stack.pop()
        count += 1
        if count > max_nodes:
            raise InvalidValueError(f"expression `{_short(text)}` has more than max_nodes={max_nodes} nodes")
        if isinstance(node, ast.BinOp):
            op = _BINARY.get(type(node.op))
            if op is None:
                name = _FORBIDDEN_OPERATORS.get(type(node.op), f"`{type(node.op).__name__}`")
                raise InvalidValueError(f"`{_short(text)}`: {name} is not allowed; {_ALLOWED}")
            operators.add(op)
            level += 1
            stack.append((node.right, level))
            stack.append((node.left, level))
        elif isinstance(node, ast.UnaryOp):
            if type(node.op) not in _UNARY:
                name = _FORBIDDEN_OPERATORS.get(type(node.op), f"`{type(node.op).__name__}`")
                raise InvalidValueError(f"`{_short(text)}`: {name} is not allowed; {_ALLOWED}")
            unary = True
            level += 1
            stack.append((node.operand, level))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            spelled = _spelling(lines, node)
            if not (spelled.isascii() and spelled.isdigit()):
                raise InvalidValueError(
                    f"`{_short(text)}`: the int `{_short(spelled)}` must be written in plain decimal digits"
                )
            if node.value > max_abs:
                raise InvalidValueError(f"`{_short(text)}`: the constant {_short(spelled)} exceeds max_abs={max_abs}")
            constants.append(node.value)
        else:
            raise InvalidValueError(f"`{_short(text)}`: {_describe(node)} is not allowed; {_ALLOWED}")
        if level > max_depth:
            raise InvalidValueError(f"expression `{_short(text)}` is nested deeper than max_depth={max_depth}")
        depth = max(depth, level)

    # 2. arithmetic: recursion depth is now bounded by max_depth
    value = _evaluate(tree.body, text, max_abs)
    return ParsedExpression(
        text=text, value=value, constants=tuple(constants), operators=frozenset(operators), unary=unary, depth=depth
    )


def _source_lines(text: str) -> list[bytes]:
    """The UTF-8 bytes of each line of ``text``, split where the parser splits (``\\r\\n``, ``\\r``,
    ``\\n``; not form feeds). Computed once: ``ast.get_source_segment`` splits the whole text again
    (in Python, a character at a time) for every node, which is quadratic in the number of constants."""
    return [line.encode() for line in re.split(r"(?<=\n)|(?<=\r)(?!\n)", text)]


def _spelling(lines: list[bytes], node: ast.Constant) -> str:
    """How ``node`` (a constant, on one line) is written in the source (node offsets count UTF-8 bytes)."""
    lineno, end_lineno = node.lineno, node.end_lineno
    if end_lineno != lineno or node.end_col_offset is None:
        return ""
    return lines[lineno - 1][node.col_offset : node.end_col_offset].decode("utf-8", "replace")


def _bounded(value: Fraction, text: str, max_abs: int) -> Fraction:
    if abs(value.numerator) > max_abs or value.denominator > max_abs:
        raise InvalidValueError(f"`{_short(text)}`: an intermediate result exceeds max_abs={max_abs}")
    return value


def _evaluate(node: ast.AST, text: str, max_abs: int) -> Fraction:
    if isinstance(node, ast.Constant):
        assert isinstance(node.value, int)  # the walk above admitted int constants only
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, text, max_abs)
        return -operand if isinstance(node.op, ast.USub) else operand
    assert isinstance(node, ast.BinOp)  # the walk above admitted nothing else
    left = _evaluate(node.left, text, max_abs)
    right = _evaluate(node.right, text, max_abs)
    if isinstance(node.op, ast.Add):
        return _bounded(left + right, text, max_abs)
    if isinstance(node.op, ast.Sub):
        return _bounded(left - right, text, max_abs)
    if isinstance(node.op, ast.Mult):
        return _bounded(left * right, text, max_abs)
    if right == 0:
        raise InvalidValueError(f"`{_short(text)}`: division by zero")
    return _bounded(left / right, text, max_abs)


def safe_eval(
    expr: str, *, max_length: int = 200, max_depth: int = 10, max_nodes: int = 100, max_abs: int = 10**12
) -> Fraction:
    """The exact value of the integer expression ``expr`` (``+ - * /``, unary minus, parentheses).

    Never executes anything; raises :class:`~populora.errors.InvalidValueError` for anything else
    or beyond a bound (``max_length`` characters, ``max_depth`` nested operators, ``max_nodes``
    nodes, ``max_abs`` on every constant and intermediate result), and for division by zero.
    """
    return parse_expression(
        expr, max_length=max_length, max_depth=max_depth, max_nodes=max_nodes, max_abs=max_abs
    ).value
