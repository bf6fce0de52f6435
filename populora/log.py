"""Logging a loop's records: to a JSON-lines file, a CSV file, TensorBoard, or a table in a notebook.

Every loop hands each step's record to ``callback`` (``loop.run(budget, callback=)``,
``evolve_with_env(..., callback=)``), and every record has ``as_dict()``. The logs here are such callbacks:
each writes one row per record and returns ``None``, so the run goes on (a callback returning ``True`` stops
it). They are context managers too, closing their file or writer on the way out::

    with JSONLinesLog("runs/cartpole.jsonl") as log:
        evolve_with_env(..., callback=log)

- :class:`JSONLinesLog`: one JSON object per line (``json.loads`` per line, or ``pandas.read_json(lines=True)``);
- :class:`CSVLog`: one row per record; a key that appears later widens the header (the file is rewritten);
- :class:`TensorBoardLog`: one scalar per number, at the record's step (the ``log`` extra installs
  ``tensorboard``; ``tensorboard --logdir runs`` draws it);
- :class:`Logs`: several of them as one callback;
- :func:`records_table`: records as a table (HTML in a notebook, aligned text elsewhere).

A row is the record's ``as_dict()`` (a mapping is taken as it is): numbers, strings and ``None``; a tensor
of one element becomes its number, a list or tuple is written as JSON text in a CSV cell and skipped by
TensorBoard (which takes scalars only).
"""

from __future__ import annotations

import csv
import html
import json
import math
import numbers
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from populora.errors import InvalidTypeError

__all__ = ["CSVLog", "JSONLinesLog", "Logs", "RecordsTable", "TensorBoardLog", "record_row", "records_table"]

STEP_KEYS = ("step", "generation")  # the first a row has is its step (TensorBoard's x axis)


def record_row(record: Any) -> dict[str, Any]:
    """``record.as_dict()`` (or a mapping as it is) with one-element tensors and arrays turned into numbers.

    Raises:
        InvalidTypeError: ``record`` has no ``as_dict()`` and is not a mapping.

    Example:
        >>> from populora import GenerationStats
        >>> record_row(GenerationStats(3, best=2.0, mean=1.5))
        {'generation': 3, 'best': 2.0, 'mean': 1.5}
    """
    if hasattr(record, "as_dict"):
        row = record.as_dict()
    elif isinstance(record, Mapping):
        row = record
    else:
        raise InvalidTypeError(
            f"a record to log needs as_dict() (every loop's records have it) or must be a mapping, got "
            f"{type(record).__name__} {record!r:.80}"
        )
    return {str(k): _plain(v) for k, v in row.items()}


def _plain(value: Any) -> Any:
    if hasattr(value, "numel") and hasattr(value, "item") and value.numel() == 1:  # a torch tensor
        return value.item()
    if hasattr(value, "ndim") and hasattr(value, "item") and getattr(value, "size", 0) == 1:  # numpy
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    return value


def _step(row: Mapping[str, Any], count: int) -> int:
    for key in STEP_KEYS:
        if isinstance(row.get(key), numbers.Integral) and not isinstance(row.get(key), bool):
            return int(row[key])
    return count


class _Log:
    """One row per record; ``None`` back (the run goes on); a context manager that closes."""

    rows_written: int

    def __call__(self, record: Any) -> None:
        self.write(record_row(record))
        return None

    def write(self, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and close (idempotent)."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _json_safe(value: Any) -> Any:
    """NaN and infinities as ``None`` (JSON has no such numbers), anything else JSON cannot hold as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return str(value)


class JSONLinesLog(_Log):
    """Each record as one line of JSON in ``path`` (its folder is made; an existing file is appended to).

    Args:
        path: the file, e.g. ``"runs/cartpole.jsonl"``.
        mode: ``"a"`` appends (a resumed run goes on in the same file), ``"w"`` starts the file afresh.

    Example:
        >>> import json, tempfile, pathlib
        >>> from populora import GenerationStats
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.jsonl"
        >>> with JSONLinesLog(path, mode="w") as log:
        ...     log(GenerationStats(0, best=1.0, mean=0.5)), log(GenerationStats(1, best=2.0, mean=1.0))
        (None, None)
        >>> [json.loads(line)["best"] for line in path.read_text().splitlines()]
        [1.0, 2.0]
    """

    def __init__(self, path: str | Path, *, mode: str = "a"):
        if mode not in ("a", "w"):
            raise InvalidTypeError(f"`mode` must be 'a' (append) or 'w' (start afresh), got {mode!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: Any = self.path.open(mode, encoding="utf-8")
        self.rows_written = 0

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(json.dumps(_json_safe(row), allow_nan=False) + "\n")
        self._file.flush()  # a crashed or interrupted run keeps every line written so far
        self.rows_written += 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class CSVLog(_Log):
    """Each record as one row of ``path`` (a header row first; its folder is made; the file is started afresh).

    The header is the keys in the order first seen. Records may differ in their keys (a generation without
    validation has no ``validated``): a missing value is an empty cell, and a key first seen later widens the
    header (the file is rewritten from the rows kept in memory: one per step).

    Example:
        >>> import tempfile, pathlib
        >>> from populora import GenerationStats
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.csv"
        >>> with CSVLog(path) as log:
        ...     _ = log(GenerationStats(0, best=1.0, mean=0.5)), log(GenerationStats(1, 2.0, 1.0, validated=1.5))
        >>> print(path.read_text().strip())
        generation,best,mean,validated
        0,1.0,0.5,
        1,2.0,1.0,1.5
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self.rows_written = 0
        self.path.write_text("", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        cells = {k: json.dumps(_json_safe(v)) if isinstance(v, (list, Mapping)) else v for k, v in row.items()}
        new = [k for k in cells if k not in self.columns]
        self.rows.append(cells)
        if new or not self.rows_written:
            self.columns.extend(new)
            with self.path.open("w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=self.columns, restval="")
                writer.writeheader()
                writer.writerows(self.rows)
        else:
            with self.path.open("a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, fieldnames=self.columns, restval="").writerow(cells)
        self.rows_written += 1


class TensorBoardLog(_Log):
    """Each number of a record as a TensorBoard scalar ``<prefix>/<key>`` at the record's step.

    The step is the record's ``step`` or ``generation`` (the count of records so far where it has neither);
    strings, lists and ``None`` are skipped (TensorBoard takes scalars). Needs ``tensorboard`` (the ``log``
    extra: ``pip install -e ".[log]"``); ``tensorboard --logdir runs`` draws the curves.

    Args:
        logdir: the run's folder, e.g. ``"runs/cartpole"``.
        prefix: the tag's group (``"train"``: tags ``train/best``, ``train/mean``, ...); ``""`` for none.
    """

    def __init__(self, logdir: str | Path, *, prefix: str = ""):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:  # torch's module imports tensorboard
            raise ImportError(
                'TensorBoardLog needs tensorboard: pip install tensorboard (or populora\'s extra: -e ".[log]")'
            ) from error
        self.logdir = Path(logdir)
        self.prefix = prefix
        self.writer = SummaryWriter(str(self.logdir))
        self.rows_written = 0

    def write(self, row: dict[str, Any]) -> None:
        step = _step(row, self.rows_written)
        for key, value in row.items():
            if isinstance(value, numbers.Real) and key not in STEP_KEYS:
                self.writer.add_scalar(f"{self.prefix}/{key}" if self.prefix else key, float(value), step)
        self.rows_written += 1

    def close(self) -> None:
        self.writer.close()


class Logs(_Log):
    """Several logs as one callback: each record goes to every one; closing closes them all.

    Example:
        >>> import tempfile, pathlib
        >>> from populora import GenerationStats
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> with Logs(CSVLog(folder / "run.csv"), JSONLinesLog(folder / "run.jsonl")) as log:
        ...     log(GenerationStats(0, best=1.0, mean=0.5))
        >>> sorted(p.name for p in folder.iterdir())
        ['run.csv', 'run.jsonl']
    """

    def __init__(self, *logs: Any):
        for log in logs:
            if not callable(log):
                raise InvalidTypeError(f"every log must be callable as log(record), got {log!r:.80}")
        self.logs = logs
        self.rows_written = 0

    def __call__(self, record: Any) -> None:
        for log in self.logs:
            log(record)
        self.rows_written += 1
        return None

    def close(self) -> None:
        for log in self.logs:
            if hasattr(log, "close"):
                log.close()


class RecordsTable:
    """Records as a table: HTML in a notebook (``_repr_html_``), aligned text in ``print`` / ``repr``.

    Attributes:
        columns: every key of the rows, in the order first seen.
        rows: one ``dict`` per record (:func:`record_row`).
    """

    def __init__(self, records: Iterable[Any], *, digits: int = 4, max_rows: int = 20):
        self.rows = [record_row(r) for r in records]
        self.columns: list[str] = []
        for row in self.rows:
            self.columns.extend(k for k in row if k not in self.columns)
        self.digits, self.max_rows = digits, max_rows

    def column(self, name: str) -> list[Any]:
        """One column's values (``None`` where a row lacks it)."""
        return [row.get(name) for row in self.rows]

    def _cell(self, value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.{self.digits}g}"
        return str(value)

    def _shown(self) -> list[dict[str, Any] | None]:
        """The rows shown: all of them, or the first and last ``max_rows / 2`` with ``None`` for the gap."""
        if len(self.rows) <= self.max_rows:
            return list(self.rows)
        half = self.max_rows // 2
        return [*self.rows[:half], None, *self.rows[-half:]]

    def __repr__(self) -> str:
        grid = [self.columns] + [
            [self._cell(row.get(c)) for c in self.columns] if row is not None else ["..."] * len(self.columns)
            for row in self._shown()
        ]
        widths = [max(len(line[j]) for line in grid) for j in range(len(self.columns))]
        return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)).rstrip() for line in grid)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = []
        for row in self._shown():
            if row is None:
                body.append(f'<tr><td colspan="{len(self.columns)}">...</td></tr>')
            else:
                cells = "".join(f"<td>{html.escape(self._cell(row.get(c)))}</td>" for c in self.columns)
                body.append(f"<tr>{cells}</tr>")
        return (
            f'<table class="populora-records"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
            f"<p>{len(self.rows)} records</p>"
        )


def records_table(records: Iterable[Any], *, digits: int = 4, max_rows: int = 20) -> RecordsTable:
    """Records (any loop's ``history``) as a table: the last expression of a notebook cell shows it as HTML.

    Args:
        records: records with ``as_dict()``, or mappings.
        digits: significant digits of a float.
        max_rows: more rows than this show their first and last halves.

    Example:
        >>> from populora import GenerationStats
        >>> print(records_table([GenerationStats(0, 1.0, 0.5), GenerationStats(1, 2.0, 1.25, validated=1.5)]))
        generation  best  mean  validated
                 0     1   0.5
                 1     2  1.25        1.5
    """
    return RecordsTable(records, digits=digits, max_rows=max_rows)
