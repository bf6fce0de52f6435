"""GenerationStats: one generation's fitness summary, the entry type of populora's histories.

``Population.history``, ``evolve_with_env``'s history, ``Coevolve.history``
and the ES histories hold these; :func:`populora.plot_history` draws them.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["GenerationStats"]


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
    """

    generation: int
    best: float
    mean: float
    std: float | None = None
    validated: float | None = None
    env_steps: int | None = None
