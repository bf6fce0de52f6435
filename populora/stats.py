"""GenerationStats: one generation's numbers, the entry type of every history and what ES ``tell`` returns.

``Population.history``, ``evolve_with_env``'s history, ``Coevolve.history``
and the ES histories hold these, and :meth:`EggrollES.tell <populora.EggrollES.tell>`
returns one; :func:`populora.plot_history` draws them.
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
