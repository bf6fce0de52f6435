"""GenerationStats: one generation's numbers, the entry type of every history and what ES ``tell`` returns.

``Population.history``, ``evolve_with_env``'s history, ``Coevolve.history``
and the ES histories hold these, and :meth:`EggrollES.tell <populora.EggrollES.tell>`
returns one; :func:`populora.plot_history` draws them.

:class:`BudgetProgress` is where a long loop stands against its budgets
(generations or steps, env steps, seconds), with the optional tqdm bar that
follows whichever budget is closest to running out (``evolve_with_env``,
``SelfPlay.run``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["BudgetProgress", "GenerationStats", "bars_shown"]

UNITS = {"generations": "gen", "steps": "step", "env steps": "step", "seconds": "s"}
PREFERRED = {"generations": 0, "steps": 0, "env steps": 1, "seconds": 2}  # the bar's budget while none is used


class GenerationStats(NamedTuple):
    """Best, mean and spread of one generation's fitness (higher fitness is better).

    Attributes:
        generation: the generation whose individuals were evaluated.
        best: the highest fitness of that generation.
        mean: the mean fitness of that generation.
        std: the standard deviation of its fitnesses (``correction=0``), or
            ``None`` where the history does not record it. Defaulted, so
            ``GenerationStats(g, best, mean)`` and unpacking the first three
            fields keep working.
        validated: the generation's best score on the run's validation
            episodes (``evolve_with_env``), or ``None`` where not validated.
        env_steps: env steps the run had taken by the end of this
            generation (all ranks, validation included), or ``None`` where
            not counted.
        worst: the lowest fitness of that generation (ES ``tell``), or ``None``.
        best_ever: the best fitness of any individual so far (ES ``tell``), or ``None``.
        grad_norm: L2 norm of the ES gradient over every evolved parameter (ES ``tell``), or ``None``.
    """

    generation: int
    best: float
    mean: float
    std: float | None = None
    validated: float | None = None
    env_steps: int | None = None
    worst: float | None = None
    best_ever: float | None = None
    grad_norm: float | None = None

    def as_dict(self) -> dict[str, float]:
        """The fields that hold a number, as ``{name: number}`` (for TensorBoard, W&B, CSV)."""
        return {name: value for name, value in zip(self._fields, self) if value is not None}


def bars_shown() -> bool:
    """Whether a progress bar would be seen: stderr is a terminal, or this runs in a Jupyter kernel.

    A bar written to a log file or a pipe is a run of carriage returns (each redraw, and tqdm's final redraw on
    close, lands on a line of its own there), so loops draw none there even with ``progress=True``.
    """
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # a replaced or closed stream
        pass
    ipython = sys.modules.get("IPython")  # imported by every Jupyter kernel; never imported here
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class BudgetProgress:
    """A loop's use of its budgets, and a tqdm bar over the binding one (the closest to running out).

    Args:
        limits: ``{name: limit}`` of the budgets in force (``None`` values are dropped): ``"seconds"``,
            ``"env steps"``, ``"generations"`` or ``"steps"`` (any name works; these get their units). While
            none is used, or on a tie, the bar counts generations or steps, then env steps, then seconds (a
            count moves at every step; a clock bar would sit at ``0/600 s`` until the first step ends).
        used: what the loop had used when it started (a resumed run's generations and env steps).
        show: draw a tqdm bar (``tqdm.auto``: on stderr in a terminal, a widget in a notebook) where one would be
            seen (:func:`bars_shown`); otherwise only the bookkeeping.
        desc: a prefix of the bar's description.

    Attributes:
        used: ``{name: amount}`` at the last :meth:`update`.
        binding: the name whose ``used / limit`` is largest (the first on ties): the bar's total is its limit.

    Example:
        >>> p = BudgetProgress({"seconds": 60.0, "generations": 100}, {"generations": 0})
        >>> p.update({"seconds": 6.0, "generations": 20}).binding  # 20 % of the generations, 10 % of the time
        'generations'
        >>> p.update({"seconds": 45.0, "generations": 40}).binding, p.spent()
        ('seconds', [])
        >>> p.update({"seconds": 61.0, "generations": 50}).spent()
        ['seconds']
    """

    def __init__(
        self,
        limits: Mapping[str, float | None],
        used: Mapping[str, float] | None = None,
        *,
        show: bool = False,
        desc: str = "",
    ):
        self.limits = {k: float(v) for k, v in limits.items() if v is not None}
        self.used = {k: float((used or {}).get(k, 0.0)) for k in self.limits}
        self.desc = desc
        self.binding = self._binding()
        self.bar = None
        if show and self.limits and bars_shown():
            from tqdm.auto import tqdm  # imported when asked: tqdm.auto takes about 0.1 s to import

            limit = self.limits[self.binding]
            self.bar = tqdm(
                total=_shown(limit), initial=_shown(self.used[self.binding]), desc=self._desc(), unit=self._unit()
            )

    def _binding(self) -> str:
        if not self.limits:
            return ""
        order = sorted(self.limits, key=lambda k: PREFERRED.get(k, len(PREFERRED)))  # stable: the rest in order
        return max(order, key=lambda k: self.used[k] / self.limits[k] if self.limits[k] > 0 else 1.0)

    def _unit(self) -> str:
        return UNITS.get(self.binding, "it")

    def _desc(self) -> str:
        return f"{self.desc} {self.binding}".strip()

    def fraction(self) -> float:
        """The largest ``used / limit`` over the budgets (``0.0`` without any)."""
        if not self.limits:
            return 0.0
        limit = self.limits[self.binding]
        return self.used[self.binding] / limit if limit > 0 else 1.0

    def spent(self) -> list[str]:
        """The budgets used up (``used >= limit``), in the order of ``limits``."""
        return [k for k, limit in self.limits.items() if self.used[k] >= limit]

    def update(self, used: Mapping[str, float], postfix: Mapping[str, Any] | None = None) -> BudgetProgress:
        """Record what is used now (names not given keep their amount) and redraw the bar; returns ``self``."""
        for k, v in used.items():
            if k in self.used:
                self.used[k] = float(v)
        before, self.binding = self.binding, self._binding()
        if self.bar is not None:
            if self.binding != before:  # another budget binds now: the bar counts in its unit
                started = self.bar.start_t
                self.bar.reset(total=_shown(self.limits[self.binding]))  # reset: a notebook widget's scale too
                self.bar.start_t = started  # the elapsed time shown stays the run's
                self.bar.set_description(self._desc(), refresh=False)
                self.bar.unit = self._unit()
            # capped: past its total tqdm drops the total and the percentage (a spent budget reads 100 %)
            self.bar.n = _shown(min(self.used[self.binding], self.limits[self.binding]))
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.refresh()
        return self

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _shown(value: float) -> float | int:
    """Whole amounts as ints (``12/100 gen``), seconds to a tenth (``45.3/300 s``)."""
    return int(value) if float(value).is_integer() else round(value, 1)
