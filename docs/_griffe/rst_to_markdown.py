"""A Griffe extension for the API reference: the reST-flavoured parts of populora's docstrings as Markdown.

populora's docstrings are Google style with a few reStructuredText habits: Sphinx roles
(``:class:`~populora.Population```), ``::`` before a literal block, simple tables framed by ``=====`` lines and
``\\ `` escapes. mkdocstrings renders Markdown, so this extension rewrites each docstring once, when the package is
loaded, before it is parsed:

- a role becomes inline code of its target (``~`` keeps the last dotted part, ``Title <target>`` keeps the title),
  never a cross-reference, so an object the site does not document cannot make ``mkdocs build --strict`` fail;
- ``text::`` before an indented block becomes ``text:`` (the block stays an indented code block), and a lone
  ``::`` line is dropped;
- a simple table becomes a Markdown table;
- ``\\ `` (reST's "no space here") is removed;
- an ``Example:`` section is named ``Examples:``, the Google-style name Griffe reads as doctests.

Used from ``mkdocs.yml`` (``extensions: - docs/_griffe/rst_to_markdown.py:RstToMarkdown``); the docstrings in the
source stay as they are, so ``help()`` and doctests read them unchanged.

It also checks every docstring as the site parses it (Google style, one ``Returns`` entry: ``returns_multiple_items``
and ``returns_named_value`` off, as in ``mkdocs.yml``) and logs a warning, which fails ``mkdocs build --strict``, for
the forms that render badly (:func:`problems`): a ``Returns`` section that parses into more than one entry, and a
section text with an unclosed double-backtick code span (raw backticks on the page).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj|const|py:\w+):`([^`]+)`")
_TITLED = re.compile(r"^(.*?)\s*<([^<>]+)>$")
_BORDER = re.compile(r"^(\s*)(=+)( +=+)+\s*$")
_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)


def _role(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    titled = _TITLED.match(target)
    if titled:
        return f"`{titled.group(1)}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def _columns(border: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each ``=`` run of a table border (the last column runs to the end of the line)."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", border)]
    return [(start, spans[k + 1][0] if k + 1 < len(spans) else 10**6) for k, (start, _) in enumerate(spans)]


def _cell(text: str) -> str:
    return text.strip().replace("|", "\\|")


def _tables(lines: list[str]) -> list[str]:
    """Every reST simple table (``===  ===`` borders, a header row, a border, rows, a closing border) as Markdown.

    A row whose first cell is empty continues the row above (reST's continuation lines).
    """
    out: list[str] = []
    k = 0
    while k < len(lines):
        border = _BORDER.match(lines[k])
        if not border:
            out.append(lines[k])
            k += 1
            continue
        indent, spans = border.group(1), _columns(lines[k])
        borders = [j for j in range(k, len(lines)) if _BORDER.match(lines[j])]
        if len(borders) < 3:  # not a full table (header, border, body, border): leave it
            out.append(lines[k])
            k += 1
            continue
        top, middle, bottom = borders[0], borders[1], borders[2]
        rows: list[list[str]] = []
        for j, line in enumerate(lines[top + 1 : bottom], start=top + 1):
            if j == middle or not line.strip():
                continue
            cells = [line[a:b] if a < len(line) else "" for a, b in spans]
            if rows and not cells[0].strip() and j > middle:
                rows[-1] = [f"{old.strip()} {new.strip()}".strip() for old, new in zip(rows[-1], cells)]
            else:
                rows.append([c.strip() for c in cells])
        if not rows:
            out.append(lines[k])
            k += 1
            continue
        header, body = rows[0], rows[1:]
        out.append("")
        out.append(indent + "| " + " | ".join(_cell(c) for c in header) + " |")
        out.append(indent + "|" + "|".join(" --- " for _ in header) + "|")
        out.extend(indent + "| " + " | ".join(_cell(c) for c in row) + " |" for row in body)
        out.append("")
        k = bottom + 1
    return out


def _literal_blocks(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        stripped = line.rstrip()
        if stripped.strip() == "::":
            continue  # a lone "::": the paragraph above introduces the block already
        if stripped.endswith("::") and not stripped.endswith(":::"):
            line = stripped[:-1]  # "text::" -> "text:", the indented block below stays code
        out.append(line)
    return out


def to_markdown(text: str) -> str:
    """One docstring's reST habits as Markdown (see the module docstring).

    Example:
        >>> to_markdown("Wraps :class:`~populora.Population` (see :meth:`evolve_ <populora.Population.evolve_>`)::")
        'Wraps `Population` (see `evolve_`):'
    """
    text = "\n".join(_literal_blocks(_tables(text.split("\n"))))  # first: table columns are the source's
    text = _ROLE.sub(_role, text).replace("\\ ", "")
    return _EXAMPLE.sub(r"\1Examples:", text)  # Griffe's section name: its doctests become code blocks


PARSE_OPTIONS = dict(
    returns_multiple_items=False, returns_named_value=False, warn_unknown_params=False, warn_missing_types=False
)
"""How the site parses the docstrings (``mkdocs.yml``'s ``docstring_options``; tests/test_docs.py compares them)."""

_LOGGER = griffe.get_logger("populora.docstrings") if hasattr(griffe, "get_logger") else None


def _texts(section: Any) -> list[str]:
    """A section's texts: its items' descriptions, and annotations written in the docstring (a first line
    ``text: more`` is read as ``annotation: description``)."""
    value = section.value
    if isinstance(value, str):
        return [value]
    items = value if isinstance(value, list) else [value]
    texts = [getattr(item, "description", "") or "" for item in items]
    return texts + [a for item in items if isinstance(a := getattr(item, "annotation", None), str)]


def problems(docstring: griffe.Docstring) -> list[str]:
    """What renders badly in ``docstring`` as the site parses it (:data:`PARSE_OPTIONS`); ``[]`` when nothing.

    Example:
        >>> problems(griffe.Docstring("Do it.\\n\\nReturns:\\n    ``a`` and\\n    ``b``."))
        []
        >>> problems(griffe.Docstring("Do it.\\n\\nReturns:\\n    ``{name: shape}``"))  # read as "type: text"
        ['Returns: an unclosed ``code`` span (raw backticks on the page)']
    """
    found = []
    for section in docstring.parse("google", warnings=False, **PARSE_OPTIONS):  # griffe warns on the pages
        kind = section.kind.value
        name = "Returns" if kind == "returns" else kind.capitalize()
        if kind == "returns" and len(section.value) != 1:
            found.append(f"Returns: {len(section.value)} entries (one is expected)")
        for text in _texts(section):
            # a double-backtick span may wrap a line; unclosed, it shows its backticks (text without code spans)
            if text.count("``") % 2 or "``" in re.sub(r"``.+?``", "", text, flags=re.S):
                found.append(f"{name}: an unclosed ``code`` span (raw backticks on the page)")
                break
    return found


class RstToMarkdown(griffe.Extension):
    """Rewrite every docstring of a loaded package with :func:`to_markdown`, then check it (:func:`problems`)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[Any] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen or obj.is_alias:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = to_markdown(obj.docstring.value)
                for problem in problems(obj.docstring):
                    message = f"{obj.path}: {problem}"
                    if _LOGGER is not None:
                        _LOGGER.warning(message)  # mkdocs build --strict fails on it
                    else:
                        raise ValueError(message)
            stack.extend(obj.members.values())
