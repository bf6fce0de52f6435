"""Parent selection (spec/operators.md, "Parent selection").

``fitnesses`` are the survivors' fitnesses per group, ``(g, s)``; the result is
``(g, num_children, num_parents)`` local indices into ``s``. Higher fitness is
better. The population maps local indices back to population ids.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_int
from ..errors import InvalidValueError
from .base import check_number, register_parent_selection, uniform
from .shaping import check_fitnesses, fuss_weights, zscore


def _check(fitnesses: Tensor, num_children: int, num_parents: int) -> tuple[Tensor, int, int]:
    f = check_fitnesses(fitnesses)
    if f.dim() != 2 or f.shape[1] < 1:
        raise InvalidValueError(f"`fitnesses` must be (groups, s) with s >= 1, got shape {tuple(f.shape)}")
    return f, check_int("num_children", num_children, low=0), check_int("num_parents", num_parents, low=1)


def _tournament_options(tournament_size: int = 3) -> None:
    check_number("tournament_size", tournament_size, lambda v: v >= 1, ">= 1", integer=True)


def _roulette_options(temperature: float = 1.0) -> None:
    check_number("temperature", temperature, lambda v: v > 0, "> 0")


def _tournament(f: Tensor, num_children: int, num_parents: int, size: int, generator) -> Tensor:
    """Tournament over all ``s`` columns of ``f (g, s)``; see :func:`tournament`."""
    g, s = f.shape
    t = min(size, s)
    keys = uniform((g, num_children, s), generator=generator, device=f.device)
    contenders = keys.topk(t, dim=-1).indices  # (g, c, t) distinct
    scores = f.unsqueeze(1).expand(g, num_children, s).gather(-1, contenders)
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    ranked = contenders.gather(-1, order)  # (g, c, t), fittest first
    if t >= num_parents:
        return ranked[..., :num_parents]
    winner = ranked[..., :1].expand(g, num_children, num_parents - t)
    return torch.cat([ranked, winner], dim=-1)


def tournament(
    fitnesses: Tensor,
    num_children: int,
    num_parents: int,
    *,
    generator: torch.Generator,
    tournament_size: int = 3,
) -> Tensor:
    """Per child, ``min(tournament_size, s)`` distinct contenders drawn uniformly; the fittest are the parents.

    Higher fitness is better. The ``num_parents`` fittest contenders are the
    parents, fittest first (so parent 0 is the better one, which
    ``extrapolative`` and ``svd_subspace`` rely on); with fewer contenders
    than parents the winner repeats. Ties go to the contender drawn first.

    Args:
        fitnesses: ``(g, s)`` survivors' fitnesses.
        num_children: children per group.
        num_parents: parents per child (``k``).
        generator: the source of randomness.
        tournament_size: contenders per child (capped at ``s``).

    Returns:
        ``(g, num_children, num_parents)`` int64 local indices into ``s``.
    """
    f, num_children, num_parents = _check(fitnesses, num_children, num_parents)
    tournament_size = check_number("tournament_size", tournament_size, lambda v: v >= 1, ">= 1", integer=True)
    return _tournament(f, num_children, num_parents, tournament_size, generator)


def _categorical(probs: Tensor, num: int, generator: torch.Generator) -> Tensor:
    """``num`` draws with replacement per row of ``probs (g, s)``, by inverse CDF."""
    cdf = probs.cumsum(-1)  # (g, s)
    u = uniform((probs.shape[0], num), generator=generator, device=probs.device, dtype=probs.dtype)
    idx = torch.searchsorted(cdf.contiguous(), (u * cdf[:, -1:]).contiguous(), right=True)
    return idx.clamp_max(probs.shape[1] - 1)


def roulette(
    fitnesses: Tensor,
    num_children: int,
    num_parents: int,
    *,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> Tensor:
    """Parents drawn with replacement, with probability ``softmax(zscore(f) / T)``.

    Higher fitness is better. A child may get the same parent twice.

    Args:
        fitnesses: ``(g, s)`` survivors' fitnesses.
        num_children: children per group.
        num_parents: parents per child (``k``).
        generator: the source of randomness.
        temperature: ``T > 0``.

    Returns:
        ``(g, num_children, num_parents)`` int64 local indices into ``s``.
    """
    f, num_children, num_parents = _check(fitnesses, num_children, num_parents)
    temperature = check_number("temperature", temperature, lambda v: v > 0, "> 0")
    probs = torch.softmax(zscore(f) / temperature, dim=-1)
    idx = _categorical(probs, num_children * num_parents, generator)
    return idx.view(f.shape[0], num_children, num_parents)


def fuss(fitnesses: Tensor, num_children: int, num_parents: int, *, generator: torch.Generator) -> Tensor:
    """Parents drawn with replacement, weighted by fitness-cell width (FUSS).

    Higher fitness is better, though FUSS favours rare fitness levels rather
    than high ones (see :func:`~populora.operators.shaping.fuss_weights`).

    Args:
        fitnesses: ``(g, s)`` survivors' fitnesses.
        num_children: children per group.
        num_parents: parents per child (``k``).
        generator: the source of randomness.

    Returns:
        ``(g, num_children, num_parents)`` int64 local indices into ``s``.
    """
    f, num_children, num_parents = _check(fitnesses, num_children, num_parents)
    idx = _categorical(fuss_weights(f), num_children * num_parents, generator)
    return idx.view(f.shape[0], num_children, num_parents)


def queen_bee(
    fitnesses: Tensor,
    num_children: int,
    num_parents: int,
    *,
    generator: torch.Generator,
    tournament_size: int = 3,
) -> Tensor:
    """Parent 0 is the group's best (the queen); the others come from a tournament among the rest.

    Higher fitness is better; ties for best go to the lower index. The queen
    is left out of the other parents' tournament (when ``s > 1``) so no
    child is the queen crossed with herself.

    Args:
        fitnesses: ``(g, s)`` survivors' fitnesses.
        num_children: children per group.
        num_parents: parents per child (``k``).
        generator: the source of randomness.
        tournament_size: contenders per tournament (capped at ``s - 1``).

    Returns:
        ``(g, num_children, num_parents)`` int64 local indices into ``s``.
    """
    f, num_children, num_parents = _check(fitnesses, num_children, num_parents)
    tournament_size = check_number("tournament_size", tournament_size, lambda v: v >= 1, ">= 1", integer=True)
    g, s = f.shape
    queen = torch.argsort(f, dim=-1, descending=True, stable=True)[:, :1]  # (g, 1)
    queens = queen.unsqueeze(1).expand(g, num_children, 1)
    if num_parents == 1:
        return queens.contiguous()
    if s == 1:
        return queens.expand(g, num_children, num_parents).contiguous()
    rest = torch.arange(s - 1, device=f.device).expand(g, s - 1)
    rest = rest + (rest >= queen).long()  # (g, s - 1): every index but the queen
    others = _tournament(f.gather(1, rest), num_children, num_parents - 1, tournament_size, generator)
    others = rest.unsqueeze(1).expand(g, num_children, s - 1).gather(-1, others)
    return torch.cat([queens, others], dim=-1)


register_parent_selection("tournament", tournament, validate=_tournament_options)
register_parent_selection("roulette", roulette, validate=_roulette_options)
register_parent_selection("fuss", fuss)
register_parent_selection("queen_bee", queen_bee, validate=_tournament_options)
