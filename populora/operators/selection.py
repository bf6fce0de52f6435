"""Survivor selection (spec/operators.md, "Survivor selection").

The population keeps its top-E elites itself and calls a selection on the
rest, once for all islands: ``fitnesses`` is ``(g, m)`` (``g`` groups of ``m``
candidates) and the result is ``(g, num)`` local indices into ``m``, distinct
within each row. Higher fitness is better.

Sampling without replacement uses the Gumbel-top-k trick: adding Gumbel noise
to the log-weights and keeping the ``num`` largest is exactly sequential
sampling without replacement proportional to the weights, in one vectorised
step, and it never fails on weights that underflow to 0.

:func:`group_sizes` and :func:`select_survivors` are the population-level
maths built on them: islands, elites and the map back to population ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from populora.checks import check_float, check_int
from populora.errors import InvalidValueError
from populora.operators.base import check_num_groups, check_number, register_selection, uniform
from populora.operators.shaping import check_real_tensor, fuss_weights, trusted_fitnesses, zscore


class SelectionResult(NamedTuple):
    """Result of :func:`select_survivors` and ``Population.select`` (all int64 population ids).

    Attributes:
        selected_in_indices: survivors ``(S*G,)``, elites first.
        selected_out_indices: culled ids ``(P - S*G,)``, ascending: the slots children replace.
        elite_indices: elites ``(E*G,)``, a subset of the survivors, never modified by ``evolve_``.
    """

    selected_in_indices: Tensor
    selected_out_indices: Tensor
    elite_indices: Tensor


def group_sizes(pop_size: int, survive_frac: Any, elite_frac: Any, num_groups: Any) -> tuple[int, int, int]:
    """Island size ``m = P / G``, survivors ``S`` and elites ``E`` per island.

    ``S = max(1, floor(m * survive_frac))`` and ``E = floor(m * elite_frac)``
    (at least 1 when ``elite_frac > 0``).

    Raises:
        InvalidValueError: ``num_groups`` does not divide ``pop_size``, a
            fraction outside its range, ``S == m`` (nothing replaced) or
            ``E > S`` (an elite that would not survive).

    Example:
        >>> group_sizes(16, 0.5, 0.1, 2)
        (8, 4, 1)
    """
    num_groups = check_num_groups(pop_size, num_groups)
    survive_frac = check_float("survive_frac", survive_frac, low=0, high=1, low_open=True, high_open=True)
    elite_frac = check_float("elite_frac", elite_frac, low=0, high=1, high_open=True)
    m = pop_size // num_groups
    survivors = max(1, math.floor(m * survive_frac))
    elites = math.floor(m * elite_frac)
    if elite_frac > 0:
        elites = max(1, elites)
    if survivors >= m:
        raise InvalidValueError(
            f"`survive_frac={survive_frac}` keeps all {m} individuals of each group; "
            "nothing would be replaced (lower it)"
        )
    if elites > survivors:
        raise InvalidValueError(
            f"`elite_frac={elite_frac}` gives {elites} elites per group but "
            f"`survive_frac={survive_frac}` keeps only {survivors} survivors; elites must survive"
        )
    return m, survivors, elites


def select_survivors(
    fitnesses: Tensor,
    selection: Callable[..., Tensor],
    survive_frac: Any,
    elite_frac: Any,
    num_groups: Any,
    *,
    generator: torch.Generator,
    **options: Any,
) -> SelectionResult:
    """Survivors, culled and elites of every island (higher fitness is better).

    Per island (``num_groups`` contiguous blocks of ``m``, see
    :func:`group_sizes`) the top ``E`` are elites (ties to the lower id); the
    other ``S - E`` survivors are chosen by ``selection`` (a registered
    survivor selection, called once for all islands on ``(g, m - E)``).

    Args:
        fitnesses: ``(P,)`` float fitnesses, validated by the caller
            (:func:`populora.fitness.validate_fitnesses`): they are trusted.
        selection: ``fn(fitnesses (g, n), num, *, generator, **options) -> (g, num)``.
        survive_frac, elite_frac, num_groups: as :func:`group_sizes`.
        generator: the source of randomness.
        options: the selection's options.

    Returns:
        :class:`SelectionResult` of population ids.

    Example:
        >>> res = select_survivors(torch.tensor([0.0, 3.0, 1.0, 2.0]), deterministic, 0.5, 0.25, 1,
        ...                        generator=torch.Generator())
        >>> res.selected_in_indices.tolist(), res.selected_out_indices.tolist(), res.elite_indices.tolist()
        ([1, 3], [0, 2], [1])
    """
    m, survivors, elites = group_sizes(fitnesses.shape[0], survive_frac, elite_frac, num_groups)
    g = fitnesses.shape[0] // m
    grouped = fitnesses.view(g, m)
    order = torch.argsort(grouped, dim=1, descending=True, stable=True)  # (g, m)
    elite_local, rest = order[:, :elites], order[:, elites:]
    if survivors > elites:
        with trusted_fitnesses():
            picked = selection(grouped.gather(1, rest), survivors - elites, generator=generator, **options)
        chosen = torch.cat([elite_local, rest.gather(1, picked.to(rest.device))], dim=1)
    else:
        chosen = elite_local
    base = (torch.arange(g, device=fitnesses.device) * m)[:, None]
    keep = torch.zeros(g, m, dtype=torch.bool, device=fitnesses.device).scatter_(1, chosen, True)
    culled = (~keep).flatten().nonzero().flatten()
    return SelectionResult((chosen + base).flatten(), culled, (elite_local + base).flatten())


def _check(fitnesses: Tensor, num: int) -> tuple[Tensor, int]:
    f = check_real_tensor(fitnesses)
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


def probabilistic(fitnesses: Tensor, num: int, *, generator: torch.Generator, temperature: float = 1.0) -> Tensor:
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
