"""Parent selection (spec/operators.md, "Parent selection").

``fitnesses`` are the survivors' fitnesses per group, ``(g, s)``; the result is
``(g, num_children, num_parents)`` local indices into ``s``. Higher fitness is
better. :func:`parents_for_slots` maps local indices back to population ids,
island by island.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from populora.checks import check_int
from populora.errors import InvalidValueError
from populora.operators.base import check_num_groups, check_number, register_parent_selection, uniform
from populora.operators.shaping import check_real_tensor, fuss_weights, trusted_fitnesses, zscore


def parents_for_slots(
    fitnesses: Tensor,
    parent_selection: Callable[..., Tensor],
    culled: Tensor,
    num_children: Any,
    num_parents: Any,
    num_groups: Any = 1,
    *,
    generator: torch.Generator,
    **options: Any,
) -> Tensor:
    """Parents among the survivors (every id not in ``culled``), as population ids.

    With islands (``num_groups > 1``), child ``j`` replaces ``culled[j]`` and
    its parents come from that slot's island.

    Args:
        fitnesses: ``(P,)`` float fitnesses, validated by the caller
            (:func:`populora.fitness.validate_fitnesses`): they are trusted.
        parent_selection: ``fn(fitnesses (g, s), num_children, num_parents, *, generator, **options)``.
        culled: ``(n,)`` int64 ids in ``[0, P)``, on ``fitnesses``' device.
        num_children: children to breed (``== len(culled)`` with islands).
        num_parents: parents per child ``k >= 1``.
        num_groups: islands, contiguous equal blocks dividing ``P``.
        generator: the source of randomness.
        options: the parent selection's options.

    Returns:
        ``(num_children, num_parents)`` int64 population ids.

    Raises:
        InvalidValueError: ``culled`` leaves an island without survivors, the
            islands keep different numbers of survivors, or (with islands)
            ``num_children != len(culled)``.

    Example:
        >>> parents_for_slots(torch.tensor([0.0, 3.0, 1.0, 2.0]), tournament, torch.tensor([0, 2]), 2, 2,
        ...                   generator=torch.Generator().manual_seed(0), tournament_size=2).tolist()
        [[1, 3], [1, 3]]
    """
    pop = fitnesses.shape[0]
    num_parents = check_int("num_parents_per_child", num_parents, low=1)
    num_children = check_int("num_children", num_children, low=0)
    g = check_num_groups(pop, num_groups)
    m = pop // g
    device = fitnesses.device
    alive = torch.ones(pop, dtype=torch.bool, device=device)
    alive[culled] = False
    per_group = alive.view(g, m).sum(1)
    if int(per_group.min()) == 0:
        raise InvalidValueError(
            "no survivors left to be parents: `culled` covers a whole " + ("island" if g > 1 else "population")
        )
    if g > 1 and int(per_group.max()) != int(per_group.min()):
        raise InvalidValueError(
            f"with num_groups={g} every island needs the same number of survivors, got {per_group.tolist()}"
        )
    if g > 1 and num_children != culled.numel():
        raise InvalidValueError(
            f"with num_groups={g}, child j replaces culled[j]: `num_children` must equal "
            f"len(culled)={culled.numel()}, got {num_children}"
        )
    survivors = alive.view(g, m).nonzero()[:, 1].view(g, -1)  # (g, s) local ids
    base = (torch.arange(g, device=device) * m)[:, None]
    surv_fit = fitnesses.view(g, m).gather(1, survivors)
    if g == 1:
        with trusted_fitnesses():
            local = parent_selection(surv_fit, num_children, num_parents, generator=generator, **options)[0]
        return (survivors + base)[0][local]
    child_group = culled // m
    count = torch.bincount(child_group, minlength=g)
    with trusted_fitnesses():
        local = parent_selection(surv_fit, int(count.max()), num_parents, generator=generator, **options)
    rank_in_group = torch.zeros_like(child_group)
    for grp in range(g):  # islands are few; children of each island take its first rows
        mask = child_group == grp
        rank_in_group[mask] = torch.arange(int(mask.sum()), device=device)
    ids = (survivors + base).gather(1, local.flatten(1)).view_as(local)  # (g, c, k) population ids
    return ids[child_group, rank_in_group]


def _check(fitnesses: Tensor, num_children: int, num_parents: int) -> tuple[Tensor, int, int]:
    f = check_real_tensor(fitnesses)
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
