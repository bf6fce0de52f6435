"""Lenient answer parsing: what a small model's reply is taken to answer.

Small instruction models rarely answer with the bare number they were asked for ("The answer is 7.",
"3 + 4 = 7", "x = 5"), so a reply is read by these rules, the same for every task:

Integers (:func:`parse_int`, :func:`find_ints`)
    - A number is a run of ASCII digits ``0-9`` (other scripts' digits are not numbers).
    - The answer is the LAST number in the reply: ``"3 + 4 = 7"`` -> 7.
    - Minus: a ``-`` (or the Unicode minus ``−``) directly before the digits makes the number negative
      unless the character before the sign is a digit, a letter or a closing bracket, where it is a
      subtraction: ``"x = -3"`` -> -3, ``"(-3)"`` -> -3, ``"5-3"`` -> 3, ``"5 - 3"`` -> 3.
    - Thousands separators: ``"1,234"`` and ``"12,345,678"`` are one number (every group after the
      first has exactly three digits and the first at most three); any other comma run is a list of
      numbers, ``"1,2,3"`` -> 3, ``"12,34"`` -> 34.
    - Decimals: ``"3."`` (a full stop) is 3, ``"3.0"`` and ``"3.00"`` are 3; a last number with a
      non-zero fractional part (``"3.5"``) is not an integer and the reply answers nothing (None).
    - Length: a number with more than ``MAX_DIGITS`` digits (leading zeros not counted) is not read
      as an integer either: like ``"3.5"`` it answers nothing, :func:`find_ints` skips it and a list
      holding one is not a list. (No task's answer is that long, and reading it would cost time
      quadratic in its length; Python itself refuses ``int()`` beyond 4300 digits.)
    - No number at all: None.

Lists (:func:`parse_int_list`)
    - A bracketed list ``[1, 2, 3]`` (items separated by commas and/or spaces, items are integers
      with an optional minus sign; ``[]`` is the empty list), or a bare comma list ``1, 2, 3`` (at least
      two items; ``"1, 2, and 3"`` too), whichever ENDS LAST in the reply. Commas in lists are
      separators, never thousands separators. A bracketed group holding anything else
      (``[a, b]``, or an item longer than ``MAX_DIGITS`` digits) is not a list.

Every function here reads a reply of any length in time linear in it and never raises on its
content (NUL bytes, other scripts' digits, a megabyte of brackets): only a non-str is refused.

Teacher proposals (:func:`proposal_segments`)
    - Candidate one-line segments, most specific first: the text after each ``Problem:`` marker
      (case-insensitive, ``Problem 1:`` too), last marker first, then every non-empty line, last line
      first; markdown backticks, bold marks, ``$`` and surrounding quotes are stripped. A task's
      ``parse_proposal`` takes the first segment that is a valid instance. Texts longer than
      ``MAX_PROPOSAL_CHARS`` are rejected outright.

Example:
    >>> parse_int("So 3 + 4 = 7.")
    7
    >>> parse_int("x = -5"), parse_int("1,234 apples"), parse_int("about 3.5")
    (-5, 1234, None)
    >>> parse_int_list("Sorted: [1, 2, 3]"), parse_int_list("The answer is 1, 2, 3.")
    ([1, 2, 3], [1, 2, 3])
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from populora.errors import InvalidTypeError

__all__ = ["MAX_DIGITS", "MAX_PROPOSAL_CHARS", "find_ints", "parse_int", "parse_int_list", "proposal_segments"]

MAX_DIGITS = 1000
MAX_PROPOSAL_CHARS = 20_000
_MINUS = "-\u2212"
_NUMBER = re.compile(r"[0-9]+(?:,[0-9]+)*(?:\.[0-9]+)?")
_RUN = re.compile(r"[0-9,.]*")
_GROUPED = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+")
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_ITEM = re.compile(r"[-\u2212]?[0-9]+")
_COMMA_LIST = re.compile(r"(?<![0-9])[-\u2212]?[0-9]+(?:[ \t]*,[ \t]*(?:and[ \t]+)?[-\u2212]?[0-9]+)+")
_BULLET = re.compile(r"^[ \t]*(?:[-*+][ \t]+|[0-9]+[.)][ \t]+|#+[ \t]*|>[ \t]*)")
# one way to split "problem 1 :" (adjacent [ \t]* runs around an optional [0-9]* backtrack quadratically)
_MARKER = re.compile(r"problem[ \t]*(?:[0-9]+[ \t]*)?:", re.IGNORECASE)


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidTypeError(f"`{name}` must be a str, got {type(value).__name__}")
    return value


def _negative(text: str, start: int) -> bool:
    """Whether the digits starting at ``start`` carry a minus sign (see the module docstring)."""
    if start == 0 or text[start - 1] not in _MINUS:
        return False
    if start == 1:
        return True
    before = text[start - 2]
    return not (before.isalnum() or before in ")]")


def _digits(digits: str, sign: int = 1) -> int | None:
    """``sign * int(digits)`` for a run of ASCII digits, or None beyond ``MAX_DIGITS`` significant digits
    (``int()`` is quadratic in the length and refuses more than 4300 digits)."""
    if len(digits) > MAX_DIGITS:
        digits = digits.lstrip("0") or "0"  # int() counts leading zeros towards its limit too
        if len(digits) > MAX_DIGITS:
            return None
    return sign * int(digits)


def _numbers(text: str, start: int = 0) -> list[int | None]:
    """Every number in ``text[start:]`` in order; None for one with a non-zero fractional part or too many digits."""
    out: list[int | None] = []
    for match in _NUMBER.finditer(text, start):
        run = match.group()
        body, _, frac = run.partition(".")
        integral = not frac or frac.count("0") == len(frac)
        sign = -1 if _negative(text, match.start()) else 1
        if "," in body and not _GROUPED.fullmatch(body):
            pieces = body.split(",")
            # only the first piece can carry the sign; the rest are separate numbers
            out.append(_digits(pieces[0], sign))
            out.extend(_digits(p) for p in pieces[1:-1])
            out.append(_digits(pieces[-1]) if integral else None)
        else:
            out.append(_digits(body.replace(",", ""), sign) if integral else None)
    return out


def find_ints(text: str) -> list[int]:
    """Every integer in ``text`` in reading order, by the rules of the module docstring
    (numbers with a non-zero fractional part are skipped)."""
    return [value for value in _numbers(_text("text", text)) if value is not None]


def parse_int(reply: str) -> int | None:
    """The LAST integer in ``reply`` (rules in the module docstring), or None."""
    reply = _text("reply", reply)
    last = max(reply.rfind(d) for d in "0123456789")
    if last < 0:
        return None
    # a number is made of `0-9 , .` only, so the last one lies in the run of those characters around the last
    # digit, and reading starts there (not a Python step per number of a long reply)
    start = last + 1 - _RUN.match(reply[last::-1]).end()  # type: ignore[union-attr]
    numbers = _numbers(reply, start)
    return numbers[-1] if numbers else None


def _int(token: str) -> int | None:
    return _digits(token[1:], -1) if token[0] in _MINUS else _digits(token)


def _items(tokens: list[str]) -> list[int] | None:
    """The integers of a list's item tokens, or None if one has more than ``MAX_DIGITS`` digits."""
    values = [_int(t) for t in tokens]
    return None if None in values else values  # type: ignore[return-value]


def parse_int_list(reply: str) -> list[int] | None:
    """The LAST list of integers in ``reply``: ``[1, 2, 3]`` or ``1, 2, 3`` (rules in the module docstring)."""
    reply = _text("reply", reply)
    best: tuple[int, list[int]] | None = None
    blanked = list(reply)
    for match in _BRACKETS.finditer(reply):
        blanked[match.start() : match.end()] = " " * (match.end() - match.start())
        tokens = [t for t in re.split(r"[\s,]+", match.group(1)) if t]
        values = _items(tokens) if all(_ITEM.fullmatch(t) for t in tokens) else None
        if values is not None:
            best = (match.end(), values)
    outside = "".join(blanked)
    for match in _COMMA_LIST.finditer(outside):
        if best is None or match.end() > best[0]:
            values = _items(_ITEM.findall(match.group()))
            if values is not None:
                best = (match.end(), values)
    return None if best is None else best[1]


def _clean(segment: str) -> str:
    segment = segment.replace("`", " ").replace("$", " ").replace("**", " ").strip()
    return segment.strip("\"'\u201c\u201d ").strip()


def proposal_segments(text: str, *, limit: int = 64) -> list[str]:
    """Candidate one-line problem statements in a teacher's ``text``, most specific first
    (module docstring); ``[]`` for a text longer than ``MAX_PROPOSAL_CHARS``."""
    text = _text("text", text)
    if len(text) > MAX_PROPOSAL_CHARS:
        return []
    lines = text.splitlines()

    def candidates() -> Iterator[str]:
        for line in reversed(lines):
            for match in reversed(list(_MARKER.finditer(line))):
                yield _clean(line[match.end() :])
        for line in reversed(lines):
            yield _clean(_BULLET.sub("", line, count=1))

    # stop at `limit`: a line of thousands of markers would otherwise copy its tail once per marker
    unique: list[str] = []
    seen: set[str] = set()
    for segment in candidates():
        if len(unique) >= limit:
            break
        if segment and segment not in seen:
            seen.add(segment)
            unique.append(segment)
    return unique
