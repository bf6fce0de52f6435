"""Per-generation statistics shared by every history in populora."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["GenerationStats"]


class GenerationStats(NamedTuple):
    """Best and mean fitness of one generation (higher fitness is better).

    Attributes:
        generation: the generation whose individuals were evaluated.
        best: the highest fitness of that generation.
        mean: the mean fitness of that generation.
    """

    generation: int
    best: float
    mean: float
