"""Survivor selection (spec/operators.md, "Survivor selection").

The population keeps its top-E elites itself and calls a selection on the
rest, once for all islands: ``fitnesses`` is ``(g, m)`` (``g`` groups of ``m``
candidates) and the result is ``(g, num)`` local indices into ``m``, distinct
within each row. Higher fitness is better.

Sampling without replacement uses the Gumbel-top-k trick: adding Gumbel noise
to the log-weights and keeping the ``num`` largest is exactly sequential
sampling without replacement proportional to the weights, in one vectorised
step, and it never fails on weights that underflow to 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_int
from ..errors import InvalidValueError
from .base import check_number, register_selection, uniform
from .shaping import check_fitnesses, fuss_weights, zscore


def _check(fitnesses: Tensor, num: int) -> Tensor:
    f = check_fitnesses(fitnesses)
    if f.dim() != 2:
        raise InvalidValueError(f"`fitnesses` must be (groups, m), got shape {tuple(f.shape)}")
    return f, check_int("num", num, low=0, high=f.shape[1])


def gumbel_top_k(logits: Tensor, num: int, *, generator: torch.Generator) -> Tensor:
    """Sample ``num`` distinct indices per row with probability ``softmax(logits)``, without replacement.

    Args:
        logits: ``(g, m)`` log-weights (``-inf`` = never, unless needed to fill ``num``).
        num: how many per row, ``<= m``.

    Returns:
        ``(g, num)`` int64, in draw order.
    """
    u = uniform(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    tiny = torch.finfo(logits.dtype).tiny
    gumbel = -torch.log(-torch.log(u.clamp(tiny, 1.0 - torch.finfo(logits.dtype).eps)))
    return torch.topk(logits + gumbel, num, dim=-1).indices


def deterministic(fitnesses: Tensor, num: int, *, generator: torch.Generator) -> Tensor:
    """The ``num`` fittest of each group (higher fitness is better).

    Ties go to the lower index. ``generator`` is accepted for the common
    signature and not used.

    Args:
        fitnesses: ``(g, m)``.
        num: survivors per group, ``0 <= num <= m``.
        generator: unused.

    Returns:
        ``(g, num)`` int64 local indices, fittest first.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> deterministic(torch.tensor([[0.1, 0.9, 0.5]]), 2, generator=g)
        tensor([[1, 2]])
    """
    f, num = _check(fitnesses, num)
    order = torch.argsort(f, dim=-1, descending=True, stable=True)
    return order[:, :num]


def _probabilistic_options(temperature: float = 1.0) -> None:
    check_number("temperature", temperature, lambda v: v > 0, "> 0")


def probabilistic(
    fitnesses: Tensor, num: int, *, generator: torch.Generator, temperature: float = 1.0
) -> Tensor:
    """``num`` per group without replacement, with probability ``softmax(zscore(f) / T)``.

    Higher fitness is better. Z-scoring makes the fitness scale irrelevant;
    a low temperature approaches :func:`deterministic`, a high one uniform.

    Args:
        fitnesses: ``(g, m)``.
        num: survivors per group, ``0 <= num <= m``.
        generator: the source of randomness.
        temperature: ``T > 0``.

    Returns:
        ``(g, num)`` distinct int64 local indices.
    """
    f, num = _check(fitnesses, num)
    temperature = check_number("temperature", temperature, lambda v: v > 0, "> 0")
    return gumbel_top_k(zscore(f) / temperature, num, generator=generator)


def fuss(fitnesses: Tensor, num: int, *, generator: torch.Generator) -> Tensor:
    """Fitness-uniform selection: ``num`` per group without replacement, weighted by cell width.

    Each candidate's weight is the width of its fitness cell
    (:func:`~populora.operators.shaping.fuss_weights`), so rare fitness levels
    survive and crowded ones thin out. Higher fitness is better, though FUSS
    itself favours neither end.

    Args:
        fitnesses: ``(g, m)``.
        num: survivors per group, ``0 <= num <= m``.
        generator: the source of randomness.

    Returns:
        ``(g, num)`` distinct int64 local indices.
    """
    f, num = _check(fitnesses, num)
    return gumbel_top_k(fuss_weights(f).log(), num, generator=generator)


register_selection("deterministic", deterministic)
register_selection("probabilistic", probabilistic, validate=_probabilistic_options)
register_selection("fuss", fuss)
