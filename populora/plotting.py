"""plot_history: one call to draw any populora history (matplotlib optional).

Every history in populora is a list of per-generation entries with
``generation``, ``best`` and ``mean`` (and, where recorded, ``std``):
``Population.history``, ``evolve_with_env``'s history, each list of
``Coevolve.history`` and the ES histories; ``SelfPlay.history`` holds one
record per step with the students' and the teachers' best and mean fitness.
:func:`plot_history` draws the best fitness as a line and the mean as a
dashed line, with a ``mean ± std`` band where ``std`` is known, per series
(a self-play history is two series, students and teachers, over steps).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from populora.errors import InvalidTypeError, InvalidValueError

__all__ = ["plot_history"]

_FIELDS = ("generation", "best", "mean", "std", "validated")
# SelfPlay's records (populora.loops.selfplay.scores.SelfPlayRecord): one step, both populations' fitness
_SELFPLAY = ("step", "student_best", "student_mean", "teacher_best", "teacher_mean")


def plot_history(
    history: Any,
    *,
    ax: Any = None,
    title: str | None = None,
    std: bool = True,
    path: str | Path | None = None,
) -> Any:
    """Plot best and mean fitness per generation (higher is better) in one call.

    Args:
        history: a list of entries (``GenerationStats``, or anything with
            ``generation``, ``best``, ``mean`` and optionally ``std``
            attributes or keys, or ``(generation, best, mean[, std])``
            tuples); a dict ``{name: list}`` (``Coevolve.history``), one
            series per name; a self-play history (``SelfPlay.history``, its
            records or their ``as_dict()``), a students' and a teachers'
            series over steps; or an object with a ``history`` attribute (a
            ``Population``, a ``Coevolve``, a ``SelfPlay``,
            ``evolve_with_env``'s ``EvolveResult``, an ES; a
            ``TorchEggrollES``'s ES).
        ax: a matplotlib ``Axes`` to draw on; by default a new figure's.
        title: the axes' title.
        std: shade ``mean ± std`` where the entries record ``std``; a
            ``validated`` score (``evolve_with_env``) is drawn dotted where recorded.
        path: also save the figure there (any format matplotlib writes, by suffix).

    Returns:
        The matplotlib ``Axes``.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``, or in a clone of the
            repository ``pip install -e ".[examples]"``).
        InvalidTypeError: an entry without ``generation`` / ``best`` / ``mean``.
        InvalidValueError: an empty history.

    Example:
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> from populora import GenerationStats, plot_history
        >>> ax = plot_history([GenerationStats(0, 1.0, 0.5, 0.2), GenerationStats(1, 2.0, 1.0, 0.3)])
        >>> [line.get_label() for line in ax.get_lines()]
        ['best', 'mean']
    """
    series, x_label = _series(history)
    try:
        import matplotlib.pyplot as plt  # optional dependency: imported only when a plot is asked for
    except ImportError as err:
        raise ImportError(
            "plot_history needs matplotlib, which populora does not require: install it with "
            '`pip install matplotlib` (or, in a clone of the populora repository, `pip install -e ".[examples]"`)'
        ) from err
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for name, rows in series.items():
        prefix = f"{name}: " if name else ""
        gens = [r[0] for r in rows]
        (line,) = ax.plot(gens, [r[1] for r in rows], label=f"{prefix}best")
        ax.plot(gens, [r[2] for r in rows], linestyle="--", color=line.get_color(), label=f"{prefix}mean")
        spread = [(g, m, s) for g, _, m, s, _ in rows if s is not None and math.isfinite(s)]
        checked = [(g, v) for g, _, _, _, v in rows if v is not None and math.isfinite(v)]
        if checked:  # evolve_with_env's validated scores
            ax.plot(
                [g for g, _ in checked],
                [v for _, v in checked],
                linestyle=":",
                marker=".",
                color=line.get_color(),
                label=f"{prefix}validated",
            )
        if std and spread:
            ax.fill_between(
                [g for g, _, _ in spread],
                [m - s for _, m, s in spread],
                [m + s for _, m, s in spread],
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
    ax.set_xlabel(x_label)
    ax.set_ylabel("fitness")
    if title is not None:
        ax.set_title(title)
    ax.legend()
    if path is not None:
        ax.figure.savefig(path)
    return ax


Rows = list[tuple[float, float, float, float | None, float | None]]


def _series(history: Any) -> tuple[dict[str, Rows], str]:
    """``({name: [(generation, best, mean, std or None, validated or None), ...]}, x label)``.

    ``''`` names a single series.
    """
    if not hasattr(history, "history") and hasattr(getattr(history, "es", None), "history"):
        history = history.es  # TorchEggrollES keeps its history on its EggrollES
    if hasattr(history, "history") and not isinstance(history, Mapping):
        history = history.history
    if callable(getattr(history, "by_population", None)):
        history = history.by_population()  # Coevolve's records, one series per population
    if isinstance(history, Mapping):
        out = {str(name): _rows(rows, f"history[{name!r}]") for name, rows in history.items()}
        if not out:
            raise InvalidValueError("the history is empty: nothing to plot")
        return out, "generation"
    if _is_selfplay(history):
        return _selfplay_rows(history), "self-play step"
    return {"": _rows(history, "history")}, "generation"


def _has(entry: Any, names: tuple[str, ...]) -> bool:
    if isinstance(entry, Mapping):
        return all(n in entry for n in names)
    return all(hasattr(entry, n) for n in names)


def _is_selfplay(entries: Any) -> bool:
    """A list whose first entry is a self-play record (or its ``as_dict()``)."""
    return (
        isinstance(entries, Sequence)
        and not isinstance(entries, (str, bytes))
        and len(entries) > 0
        and _has(entries[0], _SELFPLAY)
        and not _has(entries[0], _FIELDS[:3])
    )


def _selfplay_rows(entries: Sequence[Any]) -> dict[str, Rows]:
    """A self-play history as two series, ``students`` and ``teachers``: ``(step, best, mean)`` each."""
    out: dict[str, Rows] = {"students": [], "teachers": []}
    for i, entry in enumerate(entries):
        if not _has(entry, _SELFPLAY):
            raise InvalidTypeError(
                f"`history[{i}]` must be a self-play record like history[0] (with {', '.join(_SELFPLAY)}), got "
                f"{type(entry).__name__} {entry!r:.100}"
            )
        get = entry.get if isinstance(entry, Mapping) else lambda name, entry=entry: getattr(entry, name)
        for name, who in (("students", "student"), ("teachers", "teacher")):
            row = (get("step"), get(f"{who}_best"), get(f"{who}_mean"))
            out[name].append(_row(row, f"history[{i}] ({name})"))
    return out


def _rows(entries: Any, where: str) -> Rows:
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise InvalidTypeError(
            f"`{where}` must be a list of per-generation entries (generation, best, mean[, std]), "
            f"got {type(entries).__name__}"
        )
    if not entries:
        raise InvalidValueError(f"`{where}` is empty: nothing to plot")
    return [_row(entry, f"{where}[{i}]") for i, entry in enumerate(entries)]


def _row(entry: Any, where: str) -> tuple[float, float, float, float | None, float | None]:
    values: list[Any]  # the fields in _FIELDS order, checked below
    if all(hasattr(entry, f) for f in _FIELDS[:3]):
        values = [getattr(entry, f, None) for f in _FIELDS]
    elif isinstance(entry, Mapping) and all(f in entry for f in _FIELDS[:3]):
        values = [entry.get(f) for f in _FIELDS]
    elif isinstance(entry, Sequence) and not isinstance(entry, (str, bytes)) and 3 <= len(entry) <= 6:
        values = [*entry, None, None][:5]  # (generation, best, mean[, std[, validated[, env_steps]]])
    else:
        raise InvalidTypeError(
            f"`{where}` must have generation, best and mean (a GenerationStats, say), got "
            f"{type(entry).__name__} {entry!r}"
        )
    for field, value in zip(_FIELDS, values):
        if field in ("std", "validated") and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, *_scalar_types(value))):
            raise InvalidTypeError(f"`{where}.{field}` must be a number, got {type(value).__name__} {value!r}")
    g, best, mean, s, v = values
    return float(g), float(best), float(mean), None if s is None else float(s), None if v is None else float(v)


def _scalar_types(value: Any) -> tuple[type, ...]:
    """One-element tensors count as numbers (an ES history may hold them)."""
    numel = getattr(value, "numel", None)
    return (type(value),) if callable(numel) and numel() == 1 and hasattr(value, "__float__") else ()
