"""Fitness shaping shared by the genetic algorithm and evolution strategies.

Higher fitness is better. Every function works along ``dim`` and returns
float32 (float64 for float64 input), in the input's order. ``+inf`` and
``-inf`` count as the best and worst finite value of their slice; NaN raises.

The operators check a fitness tensor (:func:`check_real_tensor`) only when
they are called directly: a caller that validated the vector once
(:func:`populora.fitness.validate_fitnesses`, as the population does) runs
them inside :func:`trusted_fitnesses`, where that check only casts.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor

from populora.errors import FitnessError

__all__ = ["centered_rank", "check_real_tensor", "clamp_infinities", "fuss_weights", "trusted_fitnesses", "zscore"]

_TRUSTED: contextvars.ContextVar[bool] = contextvars.ContextVar("populora_trusted_fitnesses", default=False)


@contextlib.contextmanager
def trusted_fitnesses() -> Iterator[None]:
    """Inside this block the operators trust their fitnesses: :func:`check_real_tensor` only casts.

    For callers that validated the vector once with
    :func:`populora.fitness.validate_fitnesses` (the population's ``evolve_``,
    ``select``, ``select_parents`` and ``crossover_`` do): the same values are
    then not scanned again by every operator and shaping they pass through.
    """
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def check_real_tensor(fitnesses: Tensor, name: str = "fitnesses") -> Tensor:
    """An operator's fitness tensor as float32 (float64 if it was float64), checked unless trusted.

    Any shape. Outside :func:`trusted_fitnesses` it must be a real tensor
    free of NaN; inside, a float32 / float64 tensor is returned as it is.

    Raises:
        FitnessError: (a ``ValueError``) not a tensor (its type is named),
            not real-valued, or it contains NaN.
    """
    if _TRUSTED.get() and isinstance(fitnesses, Tensor) and fitnesses.dtype in (torch.float32, torch.float64):
        return fitnesses
    return _validate_tensor(fitnesses, name)


def _validate_tensor(fitnesses: Tensor, name: str) -> Tensor:
    """Scan ``fitnesses``: a real tensor without NaN, cast to float32 / float64."""
    if not isinstance(fitnesses, Tensor):
        raise FitnessError(
            f"`{name}` must be a torch.Tensor of real numbers, got {type(fitnesses).__name__}: {fitnesses!r:.80}"
        )
    if fitnesses.is_complex() or fitnesses.dtype == torch.bool:
        raise FitnessError(f"`{name}` must be a real tensor, got dtype {fitnesses.dtype}")
    dtype = torch.float64 if fitnesses.dtype == torch.float64 else torch.float32
    f = fitnesses.to(dtype)
    if bool(torch.isnan(f).any()):
        raise FitnessError(f"`{name}` contains NaN; higher is better, so give a finite value")
    return f


def clamp_infinities(f: Tensor, dim: int) -> Tensor:
    """Replace -inf/+inf by the smallest/largest finite value along ``dim`` (0 if there is none).

    So a NaN mapped to -inf upstream (``nan_policy="worst"``) ties with the worst.
    """
    finite = torch.isfinite(f)
    lo = torch.where(finite, f, torch.inf).amin(dim, keepdim=True)
    hi = torch.where(finite, f, -torch.inf).amax(dim, keepdim=True)
    lo = torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo))
    hi = torch.where(torch.isfinite(hi), hi, torch.zeros_like(hi))
    return torch.where(f == -torch.inf, lo, torch.where(f == torch.inf, hi, f))


def zscore(f: Tensor, dim: int = -1, *, mask: Tensor | None = None) -> Tensor:
    """``(f - mean) / (std + 1e-8)`` along ``dim``; only centred when ``std`` is ~0.

    ``std`` is the population standard deviation. It counts as ~0 when it is
    below 8 float eps relative to ``max |f|`` (equal fitnesses up to rounding),
    where dividing would only amplify rounding noise.

    Args:
        f: fitnesses, any shape (e.g. ``(g, m)``); higher is better.
        dim: the dimension to standardise along.
        mask: optional boolean tensor of ``f``'s shape: only the ``True``
            entries count (mean, std, ``max |f|``); the others get 0. Every
            slice along ``dim`` needs at least one ``True``.

    Example:
        >>> zscore(torch.tensor([1.0, 2.0, 3.0]))
        tensor([-1.2247,  0.0000,  1.2247])
        >>> zscore(torch.tensor([1.0, 2.0, 3.0, 9.0]), mask=torch.tensor([True, True, True, False]))
        tensor([-1.2247,  0.0000,  1.2247,  0.0000])
    """
    x = clamp_infinities(check_real_tensor(f, "f"), dim)
    if mask is not None:
        weight = mask.to(x.dtype)
        n = weight.sum(dim, keepdim=True)
        centred = (x - (x * weight).sum(dim, keepdim=True) / n) * weight
        std = (centred.square().sum(dim, keepdim=True) / n).sqrt()
        flat = std <= 8 * torch.finfo(x.dtype).eps * (x.abs() * weight).amax(dim, keepdim=True)
        return torch.where(flat, centred, centred / (std + 1e-8))
    centred = x - x.mean(dim, keepdim=True)
    std = centred.square().mean(dim, keepdim=True).sqrt()
    flat = std <= 8 * torch.finfo(x.dtype).eps * x.abs().amax(dim, keepdim=True)
    return torch.where(flat, centred, centred / (std + 1e-8))


def _ranks(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Sorted values and, per element (input order), the first/one-past-last index of its tie group."""
    values = x.sort(dim=-1).values.contiguous()
    lo = torch.searchsorted(values, x.contiguous(), right=False)
    hi = torch.searchsorted(values, x.contiguous(), right=True)
    return values, lo, hi


def centered_rank(f: Tensor, dim: int = -1) -> Tensor:
    """Ranks mapped linearly to ``[-0.5, 0.5]`` (the worst -0.5, the best 0.5).

    Tied fitnesses share the mean of their ranks, so equal fitness always gets
    equal weight. A single element gets 0.

    Args:
        f: fitnesses, any shape; higher is better.
        dim: the dimension to rank along.

    Example:
        >>> centered_rank(torch.tensor([3.0, -1.0, 3.0, 0.0]))
        tensor([ 0.3333, -0.5000,  0.3333, -0.1667])
    """
    x = clamp_infinities(check_real_tensor(f, "f"), dim).movedim(dim, -1)
    m = x.shape[-1]
    if m <= 1:
        return torch.zeros_like(x).movedim(-1, dim)
    _, lo, hi = _ranks(x)
    rank = (lo + hi - 1).to(x.dtype) / 2  # mean rank of the tie group, 0 .. m-1
    return (rank / (m - 1) - 0.5).movedim(-1, dim)


def fuss_weights(f: Tensor, dim: int = -1) -> Tensor:
    """Fitness-uniform (FUSS) weights: the width of each individual's fitness cell.

    Sort; an individual's cell is ``(f_next - f_prev) / 2``, where the ends
    repeat themselves (the best's ``f_next`` is its own fitness). Tied
    individuals share their level's cell equally. A floor of 1% of the mean
    gap (``0.01 * (max - min) / (m - 1)``) keeps every probability above 0;
    when all fitnesses are equal the weights are uniform. Rare fitness levels
    get large weights, crowded ones small: this keeps diversity alive.

    Args:
        f: fitnesses, any shape; higher is better (the sign does not matter here).
        dim: the dimension along which individuals compete.

    Returns:
        Probabilities (summing to 1 along ``dim``) in the original order.

    Example:
        >>> fuss_weights(torch.tensor([10.0, 0.0, 1.0, 3.0]))
        tensor([0.3487, 0.0526, 0.1513, 0.4474])
    """
    x = clamp_infinities(check_real_tensor(f, "f"), dim).movedim(dim, -1)
    m = x.shape[-1]
    values, lo, hi = _ranks(x)
    prev = values.gather(-1, (lo - 1).clamp_min(0))
    prev = torch.where(lo > 0, prev, x)
    nxt = values.gather(-1, hi.clamp_max(m - 1))
    nxt = torch.where(hi < m, nxt, x)
    width = (nxt - prev) / 2 / (hi - lo).to(x.dtype)
    span = (values[..., -1:] - values[..., :1]) if m > 0 else values
    floor = torch.where(span > 0, 0.01 * span / max(m - 1, 1), torch.ones_like(span))
    w = width + floor
    return (w / w.sum(-1, keepdim=True)).movedim(-1, dim)
