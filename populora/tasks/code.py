"""Absolute Zero (AZR) code tasks over small deterministic Python functions, verified by the
:mod:`~populora.tasks.sandbox` executor.

=====================  ==========  ============================================================
task                   family      the solver is given / must give
=====================  ==========  ============================================================
:class:`CodeOutput`    ``code_o``  a program ``f`` and an input / the output ``f(input)``
:class:`CodeInput`     ``code_i``  a program ``f`` and an output / any input ``x`` with ``f(x)`` equal to it
:class:`CodeFunction`  ``code_f``  the first input/output pairs and a message / a program ``f``
                                   that gives every pair (the hidden ones too)
=====================  ==========  ============================================================

No program text is ever compiled, parsed or executed in this process: generated programs, teacher
proposals and solver replies all run in :class:`~populora.tasks.sandbox.Sandbox` children (which
read literals too: comparing a predicted output is a child's job). Parsing here is string slicing
and anchored regular expressions, linear in the text, and never raises on model text.

Generated problems (:meth:`CodeTask.sample`)
    A program is a chain of ``d`` steps (difficulty ``d`` = 1 .. 5) over one input kind, then a final
    step that returns: a list of ints ``xs`` (map, filter, sort, reverse, prefix sums, differences,
    deduplicate, weight, running max, stride, rotate; then return the list, its sum, length, max,
    min, sum of squares, count of evens, product mod 97, alternating sum or (min, max)), a
    lowercase string ``s`` (reverse, upper, Caesar shift, replace, stride, double, alternate case,
    rotate, sort, drop vowels; then return it, its length, vowel count, a count, a find, its
    run-length encoding, its letter counts or digit codes), an int ``n`` (affine map, floor
    division, mod, digit sum, digit reversal, bounded Collatz, distance, square mod, xor; then
    return it, its parity, its digits, its binary digits or a string), or a list with a second
    argument ``k`` used by some steps. Every step is total on its input kind, so every generated
    program runs; each step and return carries an English description, joined into the code_f
    message. Inputs grow with ``d`` (lists of ``2 .. 3 + d`` ints, strings of ``3 .. 3 + 2d``
    letters, ints below ``10**(d + 1)``). The outputs are computed in the sandbox (``run_many``,
    ``workers`` at a time); a run that fails is retried, never redrawn, so the same generator
    state gives the same problems. code_f draws ``CODE_F_INPUTS`` (6) distinct inputs and shows the
    first ``CODE_F_VISIBLE`` (3); of a proposal's ``n`` inputs it shows ``ceil(n / 2)``, at most 3.

Solver replies (:func:`answer_text`, :func:`reply_program`)
    code_o / code_i: within the text inside the last ``<answer>...</answer>`` if there is one, else within the whole
    reply: the text after the last ``Output:`` (code_o) / ``Input:`` (code_i) marker on its line (case-insensitive),
    else the last fenced code block, else all of the tag's text (with a tag) or the last non-empty line (without);
    backticks, ``**`` and one trailing full stop are stripped, and a code_i answer written as a call ``f(...)`` is
    unwrapped. A code_o answer is right when it is a literal equal to the output (same types all the way down: ``1`` is
    not ``True`` nor ``1.0``; ``[1,2]`` is ``[1, 2]``); a code_i answer when ``f`` run on it returns a value equal to
    the output. code_f: the last fenced block that holds ``def f``, else the text from the last line that starts with
    ``def f`` to the end; right when it returns the right value on every pair.

Teacher proposals (:meth:`CodeTask.parse_proposal`), the format::

    ```python
    def f(xs):
        return sorted(xs)[::-1]
    ```
    Input: [3, 1, 2]

    The program is the last fenced block holding ``def f`` (or, without fences, the lines from the
    first that starts with ``def``, ``import``, ``from`` or ``@`` up to the first marker line); an
    input is every line outside the fences that starts with ``Input:`` (``Input 2:``, bullets and
    bold allowed) and is an argument list (``[1, 2], 3`` calls ``f([1, 2], 3)``; a written
    ``f(...)`` is unwrapped). code_o and code_i use the last input; code_f every distinct input
    (``CODE_F_MIN_INPUTS`` .. ``CODE_F_MAX_INPUTS``, whose outputs must not all be equal) and an
    optional ``Message:`` line. A proposal is valid when the program has at most
    ``MAX_PROGRAM_CHARS`` characters, every input and output at most ``MAX_LITERAL_CHARS``, and
    :meth:`~populora.tasks.sandbox.Sandbox.validate` accepts it: it passes the allowlist, runs
    within the limits on every input and gives the same outputs with hash seeds 0 and 1.

Example:
    >>> import torch
    >>> task = CodeOutput(difficulty=1)
    >>> problem = task.sample(1, torch.Generator().manual_seed(0))[0]
    >>> problem.check(f"Output: {problem.answer}")
    True
    >>> proposal = "```python\\ndef f(xs):\\n    return sorted(xs)[::-1]\\n```\\nInput: [3, 1, 2]"
    >>> task.parse_proposal(proposal).answer
    '[3, 2, 1]'
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from populora.checks import check_int
from populora.errors import InvalidTypeError, InvalidValueError
from populora.tasks.base import Problem, Task, check_generator, randint
from populora.tasks.parsing import MAX_PROPOSAL_CHARS
from populora.tasks.sandbox import ALLOWED_MODULES, Job, Limits, RunResult, Sandbox

__all__ = [
    "CODE_F_INPUTS",
    "CodeFunction",
    "CodeInput",
    "CodeOutput",
    "CodeProposal",
    "CodeTask",
    "answer_text",
    "check_code_replies",
    "parse_code_proposal",
    "reply_program",
]

MAX_PROGRAM_CHARS = 2_000
MAX_LITERAL_CHARS = 500
MAX_REPLY_CHARS = 20_000
CODE_F_INPUTS = 6
CODE_F_VISIBLE = 3
CODE_F_MIN_INPUTS = 3
CODE_F_MAX_INPUTS = 10
_RETRIES = 3

# ---------------------------------------------------------------------------------------------
# Reply and proposal parsing: string slicing only (linear, never raises)
# ---------------------------------------------------------------------------------------------

_INPUT_LINE = re.compile(r"[ \t>*+#`-]*(?:[0-9]+[.)][ \t]*)?input[ \t]*[0-9]*[ \t]*:(.*)", re.IGNORECASE)
_MESSAGE_LINE = re.compile(r"[ \t>*+#`-]*message[ \t]*:(.*)", re.IGNORECASE)
_PROGRAM_START = ("def ", "import ", "from ", "@")
_USES_K = re.compile(r"\bk\b")


def _fences(lines: list[str]) -> tuple[list[list[str]], list[bool]]:
    """The fenced code blocks of ``lines`` (their inner lines) and, per line, whether it is inside
    a block or a fence line itself. An unclosed fence runs to the end."""
    blocks: list[list[str]] = []
    inside = [False] * len(lines)
    current: list[str] | None = None
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            inside[i] = True
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            inside[i] = True
            current.append(line)
    if current is not None:
        blocks.append(current)
    return blocks, inside


def _clean(text: str) -> str:
    """Drop bold marks, surrounding backticks and one full stop (in either order: ```42`.`` and ``42.``)."""
    text = text.replace("**", " ").strip().strip("`").strip()
    if text.endswith("."):
        text = text[:-1].strip().strip("`").strip()
    return text


def _unwrap_call(text: str, entry: str = "f") -> str:
    """``f(1, 2)`` -> ``1, 2``; anything else unchanged."""
    head = entry + "("
    if text.startswith(head) and text.endswith(")"):
        return text[len(head) : -1].strip()
    return text


def answer_text(reply: str, marker: str) -> str | None:
    """The answer part of a solver ``reply`` by the rules in the module docstring (``marker``:
    ``"output"`` or ``"input"``), or None (also for a non-str or a reply over ``MAX_REPLY_CHARS``)."""
    if not isinstance(reply, str) or len(reply) > MAX_REPLY_CHARS:
        return None
    low = reply.lower()
    start = low.rfind("<answer>")
    tagged = start >= 0
    if tagged:
        end = low.find("</answer>", start)
        reply = reply[start + len("<answer>") : end if end >= 0 else len(reply)]
        low = reply.lower()
    lines = reply.splitlines()
    lows = low.splitlines()
    key = marker.lower() + ":"
    if len(lows) == len(lines):  # they differ only for exotic case-changing characters
        for line, line_low in zip(reversed(lines), reversed(lows)):
            at = line_low.rfind(key)
            if at >= 0:
                text = _clean(line[at + len(key) :])
                if text:
                    return text
    blocks, _ = _fences(lines)
    for block in reversed(blocks):
        text = _clean("\n".join(block))
        if text:
            return text
    if tagged:
        return _clean(reply) or None
    for line in reversed(lines):
        text = _clean(line)
        if text:
            return text
    return None


def reply_program(reply: str) -> str | None:
    """The program in a solver's code_f ``reply`` (module docstring), or None."""
    if not isinstance(reply, str) or len(reply) > MAX_REPLY_CHARS:
        return None
    lines = reply.splitlines()
    blocks, _ = _fences(lines)
    for block in reversed(blocks):
        if any(line.startswith("def f") for line in block):
            return "\n".join(block).strip("\n")
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("def f"):
            return "\n".join(lines[i:]).strip("\n")
    return None


@dataclass(frozen=True)
class CodeProposal:
    """A teacher's text read by :func:`parse_code_proposal` (not yet run)."""

    program: str
    inputs: tuple[str, ...]
    message: str = ""


def parse_code_proposal(text: str) -> CodeProposal | None:
    """A teacher's ``text`` -> the program, the inputs (in order, duplicates removed) and the message,
    by the format in the module docstring; None when there is no program or no input. Runs nothing."""
    if not isinstance(text, str) or len(text) > MAX_PROPOSAL_CHARS:
        return None
    lines = text.splitlines()
    blocks, inside = _fences(lines)
    program = None
    for block in reversed(blocks):
        if any(line.lstrip().startswith("def f") for line in block):
            program = "\n".join(block).strip("\n")
            break
    inputs: list[str] = []
    message = ""
    first_marker = len(lines)
    for i, line in enumerate(lines):
        if inside[i]:
            continue
        match = _INPUT_LINE.match(line)
        if match:
            first_marker = min(first_marker, i)
            value = _unwrap_call(_clean(match.group(1)))
            if value and value not in inputs:
                inputs.append(value)
            continue
        match = _MESSAGE_LINE.match(line)
        if match:
            first_marker = min(first_marker, i)
            message = _clean(match.group(1))
    if program is None and not blocks:
        start = next((i for i in range(first_marker) if lines[i].startswith(_PROGRAM_START)), None)
        if start is not None:
            program = "\n".join(lines[start:first_marker]).strip("\n")
    if not program or "def f" not in program or not inputs:
        return None
    return CodeProposal(program, tuple(inputs), message)


# ---------------------------------------------------------------------------------------------
# The program generator: chains of total steps with English descriptions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    lines: tuple[str, ...]
    text: str


def _pick(generator: torch.Generator, options: Sequence[Any]) -> Any:
    return options[randint(generator, 0, len(options) - 1)]


def _const(generator: torch.Generator, low: int, high: int, use_k: bool) -> tuple[str, str]:
    """A constant, or the argument ``k`` (half the time, when there is one): (code, words)."""
    if use_k and randint(generator, 0, 1):
        return "k", "k"
    value = randint(generator, low, high)
    return str(value), str(value)


def _list_step(g: torch.Generator, use_k: bool) -> _Step:
    kind = randint(g, 0, 14)
    if kind == 0:
        c, w = _const(g, 1, 9, use_k)
        return _Step((f"xs = [x + {c} for x in xs]",), f"add {w} to every number")
    if kind == 1:
        c, w = _const(g, 2, 5, use_k)
        return _Step((f"xs = [x * {c} for x in xs]",), f"multiply every number by {w}")
    if kind == 2:
        c, w = _const(g, 1, 9, use_k)
        return _Step((f"xs = [x - {c} for x in xs]",), f"subtract {w} from every number")
    if kind == 3:
        m = randint(g, 2, 9)
        return _Step((f"xs = [x % {m} for x in xs]",), f"replace every number by its remainder modulo {m}")
    if kind == 4:
        m = randint(g, 2, 4)
        r = randint(g, 0, m - 1)
        return _Step(
            (f"xs = [x for x in xs if x % {m} == {r}]",), f"keep the numbers whose remainder modulo {m} is {r}"
        )
    if kind == 5:
        c, w = _const(g, 0, 9, use_k)
        return _Step((f"xs = [x for x in xs if x > {c}]",), f"keep the numbers above {w}")
    if kind == 6:
        if randint(g, 0, 1):
            return _Step(("xs = sorted(xs, reverse=True)",), "sort in descending order")
        return _Step(("xs = sorted(xs)",), "sort in ascending order")
    if kind == 7:
        return _Step(("xs = xs[::-1]",), "reverse the list")
    if kind == 8:
        return _Step(
            ("total = 0", "sums = []", "for x in xs:", "    total += x", "    sums.append(total)", "xs = sums"),
            "replace the list by its running sums",
        )
    if kind == 9:
        return _Step(("xs = [b - a for a, b in zip(xs, xs[1:])]",), "take the differences of neighbours")
    if kind == 10:
        return _Step(
            ("seen = []", "for x in xs:", "    if x not in seen:", "        seen.append(x)", "xs = seen"),
            "drop repeated numbers, keeping the first of each",
        )
    if kind == 11:
        return _Step(("xs = [x * (i + 1) for i, x in enumerate(xs)]",), "multiply each number by its position (from 1)")
    if kind == 12:
        return _Step(
            ("best = []", "for x in xs:", "    best.append(max(best[-1], x) if best else x)", "xs = best"),
            "replace the list by its running maximum",
        )
    if kind == 13:
        return _Step(("xs = xs[::2]",), "keep every second number, starting with the first")
    c, w = _const(g, 1, 5, use_k)
    return _Step(("if xs:", f"    r = {c} % len(xs)", "    xs = xs[r:] + xs[:r]"), f"rotate the list left by {w}")


def _list_return(g: torch.Generator) -> _Step:
    kind = randint(g, 0, 9)
    if kind == 0:
        return _Step(("return xs",), "return the list")
    if kind == 1:
        return _Step(("return sum(xs)",), "return the sum")
    if kind == 2:
        return _Step(("return len(xs)",), "return the length")
    if kind == 3:
        return _Step(("return max(xs, default=0)",), "return the largest number (0 for an empty list)")
    if kind == 4:
        return _Step(("return min(xs, default=0)",), "return the smallest number (0 for an empty list)")
    if kind == 5:
        return _Step(("return sum(x * x for x in xs)",), "return the sum of the squares")
    if kind == 6:
        return _Step(("return sum(1 for x in xs if x % 2 == 0)",), "return how many numbers are even")
    if kind == 7:
        return _Step(
            ("p = 1", "for x in xs:", "    p = p * x % 97", "return p"),
            "return the product modulo 97 (1 for an empty list)",
        )
    if kind == 8:
        return _Step(
            ("return sum(x if i % 2 == 0 else -x for i, x in enumerate(xs))",),
            "return the alternating sum (first minus second plus third ...)",
        )
    return _Step(
        ("return (min(xs, default=0), max(xs, default=0))",),
        "return the pair (smallest, largest), (0, 0) for an empty list",
    )


def _str_step(g: torch.Generator) -> _Step:
    kind = randint(g, 0, 9)
    if kind == 0:
        return _Step(("s = s[::-1]",), "reverse the string")
    if kind == 1:
        return _Step(("s = s.upper()",), "make it upper case")
    if kind == 2:
        c = randint(g, 1, 25)
        return _Step(
            (f's = "".join(chr((ord(ch) - 97 + {c}) % 26 + 97) if "a" <= ch <= "z" else ch for ch in s)',),
            f"shift every lower-case letter {c} places along the alphabet (wrapping around)",
        )
    if kind == 3:
        a, b = _pick(g, "abcdefghij"), _pick(g, "xyzuvw")
        return _Step((f's = s.replace("{a}", "{b}")',), f"replace every {a} by {b}")
    if kind == 4:
        return _Step(("s = s[::2]",), "keep every second character, starting with the first")
    if kind == 5:
        return _Step(('s = "".join(ch * 2 for ch in s)',), "double every character")
    if kind == 6:
        return _Step(
            ('s = "".join(ch.upper() if i % 2 == 0 else ch for i, ch in enumerate(s))',),
            "upper-case the characters at even positions (from 0)",
        )
    if kind == 7:
        c = randint(g, 1, 5)
        return _Step(("if s:", f"    r = {c} % len(s)", "    s = s[r:] + s[:r]"), f"rotate the string left by {c}")
    if kind == 8:
        return _Step(('s = "".join(sorted(s))',), "sort the characters")
    return _Step(('s = "".join(ch for ch in s if ch not in "aeiou")',), "remove the lower-case vowels")


def _str_return(g: torch.Generator) -> _Step:
    kind = randint(g, 0, 7)
    if kind == 0:
        return _Step(("return s",), "return the string")
    if kind == 1:
        return _Step(("return len(s)",), "return its length")
    if kind == 2:
        return _Step(('return sum(1 for ch in s if ch in "aeiouAEIOU")',), "return how many vowels it has")
    if kind == 3:
        c = _pick(g, "abcdefghij")
        return _Step((f'return s.count("{c}")',), f"return how many times {c} occurs")
    if kind == 4:
        c = _pick(g, "abcdefghij")
        return _Step((f'return s.find("{c}")',), f"return the first position of {c} (-1 when absent)")
    if kind == 5:
        return _Step(
            (
                "runs = []",
                "for ch in s:",
                "    if runs and runs[-1][0] == ch:",
                "        runs[-1][1] += 1",
                "    else:",
                "        runs.append([ch, 1])",
                "return [(ch, count) for ch, count in runs]",
            ),
            "return its run-length encoding as (character, count) pairs",
        )
    if kind == 6:
        return _Step(
            ("return {ch: s.count(ch) for ch in sorted(set(s))}",),
            "return a dict from each character (in sorted order) to its count",
        )
    return _Step(("return [ord(ch) % 10 for ch in s]",), "return the last digit of each character's code")


def _int_step(g: torch.Generator) -> _Step:
    kind = randint(g, 0, 8)
    if kind == 0:
        a, b = randint(g, 2, 9), randint(g, 0, 9)
        return _Step((f"n = n * {a} + {b}",), f"multiply by {a} and add {b}")
    if kind == 1:
        c = randint(g, 2, 9)
        return _Step((f"n = n // {c}",), f"divide by {c}, rounding down")
    if kind == 2:
        m = randint(g, 7, 97)
        return _Step((f"n = n % {m}",), f"take the remainder modulo {m}")
    if kind == 3:
        return _Step(("n = sum(int(ch) for ch in str(abs(n)))",), "replace n by the sum of its digits")
    if kind == 4:
        return _Step(("n = int(str(abs(n))[::-1])",), "reverse the digits")
    if kind == 5:
        c = randint(g, 1, 6)
        return _Step(
            (f"for _ in range({c}):", "    n = n // 2 if n % 2 == 0 else 3 * n + 1"),
            f"apply {c} Collatz steps (halve an even number, else 3n + 1)",
        )
    if kind == 6:
        c = randint(g, 1, 50)
        return _Step((f"n = abs(n - {c})",), f"take the distance to {c}")
    if kind == 7:
        m = randint(g, 11, 101)
        return _Step((f"n = n * n % {m}",), f"square it modulo {m}")
    c = randint(g, 1, 31)
    return _Step((f"n = n ^ {c}",), f"xor it with {c}")


def _int_return(g: torch.Generator) -> _Step:
    kind = randint(g, 0, 4)
    if kind == 0:
        return _Step(("return n",), "return it")
    if kind == 1:
        return _Step(("return n % 2 == 0",), "return whether it is even")
    if kind == 2:
        return _Step(("return [int(ch) for ch in str(n)]",), "return its digits as a list")
    if kind == 3:
        return _Step(("return bin(n)[2:]",), "return its binary digits as a string")
    return _Step(("return str(n) + str(n % 10)",), "return it as a string followed by its last digit again")


@dataclass(frozen=True)
class _Program:
    source: str
    message: str
    draw_input: Callable[[torch.Generator], str]


def _list_input(g: torch.Generator, d: int) -> list[int]:
    low = -10 * (d - 2) if d >= 3 else 0
    return [randint(g, low, 10 * d) for _ in range(randint(g, 2, 3 + d))]


def _generate(g: torch.Generator, d: int) -> _Program:
    """One program of ``d`` steps (module docstring)."""
    kind = randint(g, 0, 3)
    if kind in (0, 1):
        use_k = kind == 1
        steps = [_list_step(g, use_k) for _ in range(d)] + [_list_return(g)]
        if use_k and not any(_USES_K.search(line) for step in steps for line in step.lines):
            steps[0] = _Step(("xs = [x + k for x in xs]",), "add k to every number")
        signature, subject = (
            ("xs, k", "a list of integers xs and an integer k") if use_k else ("xs", "a list of integers xs")
        )
        if use_k:

            def draw(gen: torch.Generator) -> str:
                return f"{_list_input(gen, d)!r}, {randint(gen, 1, 9)}"
        else:

            def draw(gen: torch.Generator) -> str:
                return repr(_list_input(gen, d))
    elif kind == 2:
        steps = [_str_step(g) for _ in range(d)] + [_str_return(g)]
        signature, subject = "s", "a lower-case string s"

        def draw(gen: torch.Generator) -> str:
            return repr("".join(chr(97 + randint(gen, 0, 25)) for _ in range(randint(gen, 3, 3 + 2 * d))))
    else:
        steps = [_int_step(g) for _ in range(d)] + [_int_return(g)]
        signature, subject = "n", "a non-negative integer n"

        def draw(gen: torch.Generator) -> str:
            return repr(randint(gen, 0, 10 ** (d + 1) - 1))

    body = "\n".join("    " + line for step in steps for line in step.lines)
    source = f"def f({signature}):\n{body}"
    message = f"takes {subject}: " + "; then ".join(step.text for step in steps)
    return _Program(source, message, draw)


# ---------------------------------------------------------------------------------------------
# The tasks
# ---------------------------------------------------------------------------------------------

_ALLOWED = ", ".join(sorted(ALLOWED_MODULES))


def _fence(source: str) -> str:
    return f"```python\n{source}\n```"


def _sandbox_for(problem: Problem, workers: int = 1) -> Sandbox:
    limits = problem.data.get("limits")
    require = problem.data.get("require")
    return Sandbox(
        Limits(**limits) if isinstance(limits, Mapping) else Limits(),
        workers=workers,
        require=tuple(require) if isinstance(require, (list, tuple)) else (),
    )


def _reply_job(problem: Problem, reply: str) -> Job | None:
    """The sandbox job that checks ``reply`` against ``problem``; None when the reply has no answer."""
    data = problem.data
    if problem.task == CodeInput.name:
        text = answer_text(reply, "input")
        if text is None:
            return None
        text = _unwrap_call(text)
        if len(text) > MAX_LITERAL_CHARS:
            return None
        return Job(data["program"], (text,), expect=(data["output"],))
    if problem.task == CodeFunction.name:
        program = reply_program(reply)
        if program is None or len(program) > MAX_PROGRAM_CHARS:
            return None
        return Job(program, tuple(data["inputs"]), expect=tuple(data["outputs"]))
    raise InvalidValueError(f"no reply job for the task family {problem.task!r}")


class CodeTask(Task):
    """The shared part of the three code tasks (module docstring): generation, proposals, limits.

    Args:
        difficulty: steps per generated program (1 .. 5).
        limits: the sandbox :class:`~populora.tasks.sandbox.Limits` of every run (default
            ``Limits()``); stored in each problem's ``data["limits"]``, so that
            :meth:`~populora.tasks.base.Problem.check` uses them after a checkpoint.
        workers: sandbox children at a time in :meth:`sample` and :meth:`parse_proposal`.
        require: sandbox guards (:data:`~populora.tasks.sandbox.GUARDS`) without which no program may
            run: where the machine refuses one, every run raises
            :class:`~populora.tasks.sandbox.SandboxGuardError` instead of checking with fewer guards;
            stored in each problem's ``data["require"]`` like the limits.
    """

    max_difficulty = 5
    marker: ClassVar[str] = ""

    def __init__(
        self, difficulty: int = 1, *, limits: Limits | None = None, workers: int = 2, require: Sequence[str] = ()
    ) -> None:
        super().__init__(difficulty)
        if limits is not None and not isinstance(limits, Limits):
            raise InvalidTypeError(f"`limits` must be a Limits or None, got {type(limits).__name__}")
        self.limits = limits if limits is not None else Limits()
        workers = check_int("workers", workers, low=1, high=64)
        self.sandbox = Sandbox(self.limits, workers=workers, require=require)  # checks `require`
        self.require = tuple(require)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(difficulty={self.difficulty})"

    def prompt(self, problem: Problem) -> str:
        """The solver's user message: the question, then on a new line how to give the answer."""
        if not isinstance(problem, Problem):
            raise InvalidTypeError(f"`problem` must be a Problem, got {type(problem).__name__}")
        return f"{problem.question}\n{self.instruction}"

    # generated problems -----------------------------------------------------------------------

    def _inputs(self, program: _Program, generator: torch.Generator) -> tuple[str, ...]:
        return (program.draw_input(generator),)

    def sample(self, n: int, generator: torch.Generator) -> list[Problem]:
        n = check_int("n", n, low=0)
        generator = check_generator(generator)
        programs = [_generate(generator, self.difficulty) for _ in range(n)]
        inputs = [self._inputs(program, generator) for program in programs]
        jobs = [Job(program.source, ins) for program, ins in zip(programs, inputs)]
        results: list[RunResult | None] = [None] * n
        for _ in range(_RETRIES):  # a failure is the machine's (every generated program is total)
            todo = [i for i, r in enumerate(results) if r is None or not r.ok]
            if not todo:
                break
            for i, result in zip(todo, self.sandbox.run_many([jobs[i] for i in todo])):
                results[i] = result
        bad = [
            (i, "not run", "") if r is None else (i, r.status, r.message)
            for i, r in enumerate(results)
            if r is None or not r.ok
        ]
        if bad:
            raise RuntimeError(f"the sandbox failed on {len(bad)} generated programs, e.g. {bad[0]}: {jobs[bad[0][0]]}")
        done = [r for r in results if r is not None]  # all of them, all ok (checked above)
        return [self._make(p.source, ins, r.outputs, p.message) for p, ins, r in zip(programs, inputs, done)]

    # proposals --------------------------------------------------------------------------------

    def _proposal_inputs(self, proposal: CodeProposal) -> tuple[str, ...] | None:
        return proposal.inputs[-1:]

    def parse_proposal(self, text: str) -> Problem | None:
        """A teacher's ``text`` (format in the module docstring) -> a validated Problem with the
        output computed by the sandbox (two runs, hash seeds 0 and 1), or None."""
        if not isinstance(text, str):
            raise InvalidTypeError(f"`text` must be a str, got {type(text).__name__}")
        proposal = parse_code_proposal(text)
        if proposal is None or len(proposal.program) > MAX_PROGRAM_CHARS:
            return None
        inputs = self._proposal_inputs(proposal)
        if not inputs or any(len(x) > MAX_LITERAL_CHARS for x in inputs):
            return None
        result = self.sandbox.validate(Job(proposal.program, inputs))
        if not result.ok or any(len(o) > MAX_LITERAL_CHARS for o in result.outputs):
            return None
        if not self._outputs_ok(result.outputs):
            return None
        return self._make(proposal.program, inputs, result.outputs, proposal.message)

    def _outputs_ok(self, outputs: tuple[str, ...]) -> bool:
        return True

    def _proposal(self, segment: str) -> Problem | None:  # parse_proposal reads the whole text instead
        return None

    def _make(self, program: str, inputs: tuple[str, ...], outputs: tuple[str, ...], message: str) -> Problem:
        raise NotImplementedError

    def _format_rules(self) -> str:
        return (
            f"Use plain Python: only the modules {_ALLOWED}; no classes, printing, files, randomness or "
            "names starting with an underscore; it must return a plain value (numbers, strings, lists, "
            "tuples, dicts, sets) quickly and the same value every time."
        )

    def _limits_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"limits": dataclasses.asdict(self.limits)}
        if self.require:
            data["require"] = list(self.require)
        return data


class CodeOutput(CodeTask):
    """``code_o``: predict ``f(input)`` (deduction)."""

    name = "code_o"
    instruction = "Give the return value as a Python literal on the last line, like: Output: [1, 2]"

    def _make(self, program: str, inputs: tuple[str, ...], outputs: tuple[str, ...], message: str) -> Problem:
        question = f"Here is a Python function:\n{_fence(program)}\nWhat does f({inputs[0]}) return?"
        return Problem(
            self.name,
            question,
            outputs[0],
            {"program": program, "input": inputs[0], "output": outputs[0], **self._limits_data()},
        )

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        return answer_text(reply, "output") is not None

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        text = answer_text(reply, "output")
        if text is None or len(text) > MAX_LITERAL_CHARS:
            return False
        gold = problem.data["output"]
        if text == gold:
            return True
        return _sandbox_for(problem).same_value(text, gold)

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:  # no proposal_line: examples unused
        return (
            "Write one new short Python function f and one input for it; someone will be asked to predict "
            f"what f returns. {self._format_rules()} Reply in exactly this format:\n"
            f"{_fence(_EXAMPLE)}\nInput: [3, 1, 2]"
        )


class CodeInput(CodeTask):
    """``code_i``: find an input for which ``f`` returns the given output (abduction)."""

    name = "code_i"
    instruction = "Give the arguments of the call on the last line, like: Input: [1, 2], 3"

    def _make(self, program: str, inputs: tuple[str, ...], outputs: tuple[str, ...], message: str) -> Problem:
        question = (
            f"Here is a Python function:\n{_fence(program)}\nFind an input such that f(...) returns {outputs[0]}."
        )
        return Problem(
            self.name,
            question,
            inputs[0],
            {"program": program, "input": inputs[0], "output": outputs[0], **self._limits_data()},
        )

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        return answer_text(reply, "input") is not None

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        job = _reply_job(problem, reply)
        if job is None:
            return False
        result = _sandbox_for(problem).run(job)
        return result.ok and result.matches == (True,)

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:  # no proposal_line: examples unused
        return (
            "Write one new short Python function f and one input for it; someone will be shown f and its "
            f"output and asked for an input that gives it. {self._format_rules()} Reply in exactly this format:\n"
            f"{_fence(_EXAMPLE)}\nInput: [3, 1, 2]"
        )


class CodeFunction(CodeTask):
    """``code_f``: write ``f`` from some of its input/output pairs and a message (induction)."""

    name = "code_f"
    instruction = "Give the whole function f in a ```python code block."

    def _inputs(self, program: _Program, generator: torch.Generator) -> tuple[str, ...]:
        inputs: list[str] = []
        for _ in range(10 * CODE_F_INPUTS):  # a tiny input space may have fewer distinct inputs
            value = program.draw_input(generator)
            if value not in inputs:
                inputs.append(value)
                if len(inputs) == CODE_F_INPUTS:
                    break
        return tuple(inputs)

    def _proposal_inputs(self, proposal: CodeProposal) -> tuple[str, ...] | None:
        inputs = proposal.inputs
        return inputs if CODE_F_MIN_INPUTS <= len(inputs) <= CODE_F_MAX_INPUTS else None

    def _outputs_ok(self, outputs: tuple[str, ...]) -> bool:
        return len(set(outputs)) > 1

    def _make(self, program: str, inputs: tuple[str, ...], outputs: tuple[str, ...], message: str) -> Problem:
        visible = min(CODE_F_VISIBLE, math.ceil(len(inputs) / 2))
        shown = "\n".join(f"f({i}) == {o}" for i, o in zip(inputs[:visible], outputs[:visible]))
        hint = f"The function {message}.\n" if message else ""
        question = f"Write a Python function f.\n{hint}Examples:\n{shown}"
        return Problem(
            self.name,
            question,
            program,
            {
                "program": program,
                "inputs": tuple(inputs),
                "outputs": tuple(outputs),
                "visible": visible,
                "message": message,
                **self._limits_data(),
            },
        )

    @staticmethod
    def well_formed_reply(problem: Problem, reply: str) -> bool:
        return reply_program(reply) is not None

    @staticmethod
    def check_reply(problem: Problem, reply: str) -> bool:
        job = _reply_job(problem, reply)
        if job is None:
            return False
        result = _sandbox_for(problem).run(job)
        return result.ok and len(result.matches) == len(job.inputs) and all(result.matches)

    def proposal_prompt(self, examples: Sequence[Problem] = ()) -> str:  # no proposal_line: examples unused
        return (
            f"Write one new short Python function f and {CODE_F_MIN_INPUTS} to {CODE_F_MAX_INPUTS} different "
            "inputs for it (one Input line each) and a one-line message describing it; someone will see some "
            f"inputs with their outputs and the message and must write f. {self._format_rules()} "
            f"Reply in exactly this format:\n{_fence(_EXAMPLE)}\nInput: [3, 1, 2]\nInput: [5, 4]\nInput: [7]\n"
            "Message: sorts the list in descending order"
        )


_EXAMPLE = "def f(xs):\n    return sorted(xs)[::-1]"


def check_code_replies(problems: Sequence[Problem], replies: Sequence[str], *, workers: int = 2) -> torch.Tensor:
    """``(n,)`` bool: whether ``replies[i]`` answers ``problems[i]``, like
    :func:`~populora.tasks.base.check_replies`, with the sandbox runs of code problems ``workers`` at a
    time (problems of other families are checked one by one by their own checkers)."""
    if len(problems) != len(replies):
        raise InvalidValueError(f"got {len(problems)} problems but {len(replies)} replies")
    workers = check_int("workers", workers, low=1, high=64)
    out = [False] * len(problems)
    batches: dict[tuple, list[tuple[int, Job]]] = {}
    for i, (problem, reply) in enumerate(zip(problems, replies)):
        if not isinstance(problem, Problem):
            raise InvalidTypeError(f"`problems[{i}]` must be a Problem, got {type(problem).__name__}")
        if not isinstance(reply, str):
            raise InvalidTypeError(f"`replies[{i}]` must be a str, got {type(reply).__name__}")
        if problem.task in (CodeInput.name, CodeFunction.name):
            job = _reply_job(problem, reply)
            if job is not None:
                key = (
                    tuple(sorted(dict(problem.data.get("limits") or {}).items())),
                    tuple(problem.data.get("require") or ()),
                )
                batches.setdefault(key, []).append((i, job))
        else:
            out[i] = problem.check(reply)
    for items in batches.values():
        sandbox = _sandbox_for(problems[items[0][0]], workers)
        for (i, job), result in zip(items, sandbox.run_many([job for _, job in items])):
            out[i] = result.ok and len(result.matches) == len(job.inputs) and all(result.matches)
    return torch.tensor(out, dtype=torch.bool)
