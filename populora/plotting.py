"""plot_history: one call to draw any populora history (matplotlib optional).

Every history in populora is a list of per-generation entries with
``generation``, ``best`` and ``mean`` (and, where recorded, ``std``):
``Population.history``, ``evolve_with_env``'s history, each list of
``Coevolve.history`` and the ES histories. :func:`plot_history` draws the
best fitness as a line and the mean as a dashed line, with a ``mean ± std``
band where ``std`` is known, per series.
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
            series per name; or an object with a ``history`` attribute (a
            ``Population``, a ``Coevolve``, ``evolve_with_env``'s
            ``EvolveResult``, an ES).
        ax: a matplotlib ``Axes`` to draw on; by default a new figure's.
        title: the axes' title.
        std: shade ``mean ± std`` where the entries record ``std``; a
            ``validated`` score (``evolve_with_env``) is drawn dotted where recorded.
        path: also save the figure there (any format matplotlib writes, by suffix).

    Returns:
        The matplotlib ``Axes``.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'populora[examples]'``).
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
    series = _series(history)
    try:
        import matplotlib.pyplot as plt  # optional dependency: imported only when a plot is asked for
    except ImportError as err:
        raise ImportError(
            "plot_history needs matplotlib, which populora does not require: install it with "
            "`pip install matplotlib` or `pip install 'populora[examples]'`"
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
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness")
    if title is not None:
        ax.set_title(title)
    ax.legend()
    if path is not None:
        ax.figure.savefig(path)
    return ax


def _series(history: Any) -> dict[str, list[tuple[float, float, float, float | None, float | None]]]:
    """``{name: [(generation, best, mean, std or None, validated or None), ...]}``; ``''`` names a single series."""
    if hasattr(history, "history") and not isinstance(history, Mapping):
        history = history.history
    if isinstance(history, Mapping):
        out = {str(name): _rows(rows, f"history[{name!r}]") for name, rows in history.items()}
        if not out:
            raise InvalidValueError("the history is empty: nothing to plot")
        return out
    return {"": _rows(history, "history")}


def _rows(entries: Any, where: str) -> list[tuple[float, float, float, float | None, float | None]]:
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise InvalidTypeError(
            f"`{where}` must be a list of per-generation entries (generation, best, mean[, std]), "
            f"got {type(entries).__name__}"
        )
    if not entries:
        raise InvalidValueError(f"`{where}` is empty: nothing to plot")
    return [_row(entry, f"{where}[{i}]") for i, entry in enumerate(entries)]


def _row(entry: Any, where: str) -> tuple[float, float, float, float | None, float | None]:
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
