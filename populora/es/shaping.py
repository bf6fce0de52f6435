"""ES fitness checks and shaping (higher fitness is better).

The shapings are the shared ones of :mod:`populora.operators.shaping`
(z-score, centred ranks) plus mean-centring (torcheggroll's
``normalize_fitness=False``) and raw values, applied within groups of
members that share a prompt.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from populora.errors import FitnessError
from populora.fitness import validate_fitnesses
from populora.operators.shaping import centered_rank, zscore

__all__ = ["FITNESS_SHAPINGS", "check_es_fitnesses", "group_table", "shape_fitness"]

FITNESS_SHAPINGS: dict[str, Callable[[Tensor], Tensor]] = {
    "zscore": lambda f: zscore(f, dim=-1),
    "centered_rank": lambda f: centered_rank(f, dim=-1),
    "center": lambda f: f - f.mean(-1, keepdim=True),
    "raw": lambda f: f,
}
"""Fitness shapings by name; each maps ``(groups, m)`` fitnesses to weights along the last dim."""


def group_table(pop_size: int, group_size: int | None, antithetic: bool) -> Tensor:
    """``(N/G, G)`` member ids of each shaping group (``(1, N)`` without groups).

    With antithetic sampling a group holds ``G/2`` whole pairs: group ``j`` is
    members ``[j*G/2, (j+1)*G/2)`` and their mirrors ``+ N/2``.
    """
    n, g = pop_size, group_size or pop_size
    if not antithetic:
        return torch.arange(n).view(n // g, g)
    plus = torch.arange(n // 2).view(n // g, g // 2)
    return torch.cat([plus, plus + n // 2], dim=1)


def check_es_fitnesses(fitnesses: Any, pop_size: int, shaping: str | Callable) -> Tensor:
    """Raw fitnesses through :func:`populora.fitness.validate_fitnesses`: ``(N,)`` real numbers, no NaN; on the CPU.

    The result is float64 for float64 tensors and for Python / NumPy sequences
    (Python floats are doubles), float32 for other tensors: shaping then runs
    in that precision, so fitnesses such as ``1e8 + i`` keep their order.
    ``inf`` passes only with the rank-based and z-score shapings.

    Raises:
        FitnessError: (a ``ValueError``) not numbers, wrong length (torcheggroll's
            "Expected N fitness scores, got M"), NaN, or inf with the ``'raw'`` /
            ``'center'`` shapings.
    """
    shape = _shape_of(fitnesses)
    if shape is not None and shape != (pop_size,):
        count = math.prod(shape)
        raise FitnessError(
            f"Expected {pop_size} fitness scores, got {count} (shape {shape}); "
            f"pass one fitness per member, shape ({pop_size},)"
        )
    f = validate_fitnesses(fitnesses, pop_size, allow_inf=True, device="cpu")
    bad = ~torch.isfinite(f)
    if shaping in ("raw", "center") and bool(bad.any()):
        raise FitnessError(
            f"fitnesses must be finite with fitness_shaping={shaping!r}, got "
            f"{f[bad].tolist()} at ids {bad.nonzero().flatten().tolist()}"
        )
    return f


def _shape_of(values: Any) -> tuple[int, ...] | None:
    """The shape of a tensor, array or (nested) sequence, or ``None`` when it has none (left to the validation)."""
    if isinstance(values, Tensor):
        return tuple(values.shape)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a ragged sequence: NumPy's warning
            return tuple(np.shape(values))
    except (TypeError, ValueError, RuntimeError):
        return None


def shape_fitness(f: Tensor, table: Tensor, shaping: str | Callable[[Tensor], Tensor]) -> Tensor:
    """``(N,)`` shaped fitness ``z``: ``shaping`` applied to ``f[table]`` along its last dim, scattered back."""
    shaper = FITNESS_SHAPINGS[shaping] if isinstance(shaping, str) else shaping
    z = torch.as_tensor(shaper(f[table]), dtype=f.dtype)
    if z.shape != table.shape:
        raise FitnessError(f"`fitness_shaping` must keep the shape {tuple(table.shape)}, got {tuple(z.shape)}")
    out = torch.empty_like(f)
    out[table] = z
    return out
