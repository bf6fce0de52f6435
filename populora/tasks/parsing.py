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
    - No number at all: None.

Lists (:func:`parse_int_list`)
    - A bracketed list ``[1, 2, 3]`` (items separated by commas and/or spaces, items are integers
      with an optional minus sign; ``[]`` is the empty list), or a bare comma list ``1, 2, 3`` (at least
      two items; ``"1, 2, and 3"`` too), whichever ENDS LAST in the reply. Commas in lists are
      separators, never thousands separators. A bracketed group holding anything else
      (``[a, b]``) is not a list.

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

from populora.errors import InvalidTypeError

__all__ = ["MAX_PROPOSAL_CHARS", "find_ints", "parse_int", "parse_int_list", "proposal_segments"]

MAX_PROPOSAL_CHARS = 20_000
_MINUS = "-\u2212"
_NUMBER = re.compile(r"[0-9]+(?:,[0-9]+)*(?:\.[0-9]+)?")
_GROUPED = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+")
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_ITEM = re.compile(r"[-\u2212]?[0-9]+")
_COMMA_LIST = re.compile(r"(?<![0-9])[-\u2212]?[0-9]+(?:[ \t]*,[ \t]*(?:and[ \t]+)?[-\u2212]?[0-9]+)+")
_BULLET = re.compile(r"^[ \t]*(?:[-*+][ \t]+|[0-9]+[.)][ \t]+|#+[ \t]*|>[ \t]*)")
_MARKER = re.compile(r"problem[ \t]*[0-9]*[ \t]*:", re.IGNORECASE)


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


def _numbers(text: str) -> list[int | None]:
    """Every number in ``text`` in order; None for one with a non-zero fractional part."""
    out: list[int | None] = []
    for match in _NUMBER.finditer(text):
        run = match.group()
        body, _, frac = run.partition(".")
        integral = not frac or set(frac) == {"0"}
        sign = -1 if _negative(text, match.start()) else 1
        if "," in body and not _GROUPED.fullmatch(body):
            pieces = body.split(",")
            # only the first piece can carry the sign; the rest are separate numbers
            out.append(sign * int(pieces[0]))
            out.extend(int(p) for p in pieces[1:-1])
            out.append(int(pieces[-1]) if integral else None)
        else:
            out.append(sign * int(body.replace(",", "")) if integral else None)
    return out


def find_ints(text: str) -> list[int]:
    """Every integer in ``text`` in reading order, by the rules of the module docstring
    (numbers with a non-zero fractional part are skipped)."""
    return [value for value in _numbers(_text("text", text)) if value is not None]


def parse_int(reply: str) -> int | None:
    """The LAST integer in ``reply`` (rules in the module docstring), or None."""
    numbers = _numbers(_text("reply", reply))
    return numbers[-1] if numbers else None


def _int(token: str) -> int:
    return -int(token[1:]) if token[0] in _MINUS else int(token)


def parse_int_list(reply: str) -> list[int] | None:
    """The LAST list of integers in ``reply``: ``[1, 2, 3]`` or ``1, 2, 3`` (rules in the module docstring)."""
    reply = _text("reply", reply)
    best: tuple[int, list[int]] | None = None
    blanked = list(reply)
    for match in _BRACKETS.finditer(reply):
        blanked[match.start() : match.end()] = " " * (match.end() - match.start())
        tokens = [t for t in re.split(r"[\s,]+", match.group(1)) if t]
        if all(_ITEM.fullmatch(t) for t in tokens):
            best = (match.end(), [_int(t) for t in tokens])
    outside = "".join(blanked)
    for match in _COMMA_LIST.finditer(outside):
        if best is None or match.end() > best[0]:
            best = (match.end(), [_int(t) for t in _ITEM.findall(match.group())])
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
    segments: list[str] = []
    for line in reversed(lines):
        for match in reversed(list(_MARKER.finditer(line))):
            segments.append(_clean(line[match.end() :]))
    for line in reversed(lines):
        segments.append(_clean(_BULLET.sub("", line, count=1)))
    seen: set[str] = set()
    unique = [s for s in segments if s and not (s in seen or seen.add(s))]
    return unique[:limit]
