"""Mutation (spec/operators.md, "Mutation"; M1-M5 are PopuLoRA's labels, arXiv 2605.16727).

A mutation receives only the individuals to mutate and returns new factors of
identical shapes and dtypes (inputs are never modified):

- ``factors[t]``: ``Factors(down (m, d_t, r_t), up (m, e_t, r_t))``.
- ``epsilon``: relative strength; noise is scaled by the RMS of each
  individual's own factor, so one epsilon fits every layer size.
- ``floors[t]``: target ``t``'s reference RMS (e.g. its init scale). A factor
  whose RMS is below 10% of its reference is perturbed as if it had 10% of
  it: ``scale = epsilon * max(rms_i, 0.1 * floors[t])``, so zero factors
  can move.

Fitness plays no part here (where it appears, higher is better). Factors
keep their surplus columns (beyond the effective rank ``min(r, d, e)``) at
zero: noise goes to the effective columns only, and RMS is measured on them.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from .base import Factors, check_number, normal, register_mutation, uniform
from .linalg import _svd_compute, compute_dtype, effective_rank, rebuild_balanced


def _check(factors: Sequence[Factors], epsilon: float, floors: Sequence[float], name: str) -> list[float]:
    if len(factors) == 0:
        raise ValueError(f"`factors` of {name} must hold at least one target, got none")
    m = factors[0].down.shape[0]
    for t, (down, up) in enumerate(factors):
        if down.dim() != 3 or up.dim() != 3 or down.shape[0] != m or up.shape[0] != m \
                or down.shape[2] != up.shape[2]:
            raise ValueError(
                f"factors[{t}] must be down (m, d, r) and up (m, e, r) with m={m}, "
                f"got {tuple(down.shape)} and {tuple(up.shape)}"
            )
    check_number("epsilon", epsilon, lambda v: v >= 0, ">= 0")
    floors = [float(f) for f in floors]
    if len(floors) != len(factors) or not all(math.isfinite(f) and f >= 0 for f in floors):
        raise ValueError(
            f"`floors` must hold one finite value >= 0 per target ({len(factors)}), got {floors}"
        )
    return floors


def _columns(x: Tensor, rank: int) -> Tensor:
    """``(r,)`` mask of the effective columns, broadcastable against ``(m, n, r)``."""
    return torch.arange(x.shape[-1], device=x.device) < rank


def _gaussian(x: Tensor, rank: int, epsilon: float, floor: float, generator) -> Tensor:
    """``x + epsilon * max(rms_i, 0.1 floor) * N`` on the effective columns, in the compute dtype."""
    dtype = compute_dtype(x)
    xf = x.to(dtype)  # (m, n, r)
    scale = xf[..., :rank].square().mean(dim=(-2, -1), keepdim=True).sqrt()  # (m, 1, 1)
    scale = epsilon * scale.clamp_min(0.1 * floor)
    noise = normal(x.shape, generator=generator, device=x.device, dtype=dtype) * _columns(x, rank)
    return xf + scale * noise


def _layer_selective_options(fraction: float = 1 / 3) -> None:
    check_number("fraction", fraction, lambda v: 0 < v <= 1, "in (0, 1]")


def _masking_options(rho: float = 0.3) -> None:
    check_number("rho", rho, lambda v: 0 <= v <= 1, "in [0, 1]")


def _neftune_options(alpha: float = 10.0) -> None:
    check_number("alpha", alpha, lambda v: v >= 0, ">= 0")


def full_gaussian(
    factors: Sequence[Factors], *, epsilon: float, floors: Sequence[float], generator: torch.Generator
) -> list[Factors]:
    """M4: ``down += eps * s_down * N``, ``up += eps * s_up * N`` for every target.

    ``s = max(rms_i, 0.1 * floors[t])`` per individual and factor (see the
    module docstring). Moves the adapter's subspace. Fitness plays no part
    (higher is better elsewhere).

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: relative strength, ``>= 0``.
        floors: per target reference RMS, ``>= 0``.
        generator: the source of randomness.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.

    Example:
        >>> zero = Factors(torch.zeros(1, 100, 4), torch.zeros(1, 8, 4))
        >>> g = torch.Generator().manual_seed(0)
        >>> new = full_gaussian([zero], epsilon=0.5, floors=[1.0], generator=g)[0]
        >>> round(new.down.std().item(), 2)  # a zero factor moves: 0.5 * 0.1 * 1.0
        0.05
    """
    floors = _check(factors, epsilon, floors, "full_gaussian")
    out = []
    for (down, up), floor in zip(factors, floors):
        rank = effective_rank(down, up)
        out.append(Factors(
            _gaussian(down, rank, epsilon, floor, generator).to(down.dtype),
            _gaussian(up, rank, epsilon, floor, generator).to(up.dtype),
        ))
    return out


def layer_selective_gaussian(
    factors: Sequence[Factors], *, epsilon: float, floors: Sequence[float], generator: torch.Generator,
    fraction: float = 1 / 3,
) -> list[Factors]:
    """M2: per individual, :func:`full_gaussian` on ``max(1, round(fraction * T))`` of the ``T`` targets.

    The targets are chosen uniformly without replacement, independently per
    individual (halves round up). The others are returned unchanged. Fitness
    plays no part (higher is better elsewhere).

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: relative strength, ``>= 0``.
        floors: per target reference RMS, ``>= 0``.
        generator: the source of randomness.
        fraction: share of the targets to mutate, in ``(0, 1]``.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.
    """
    floors = _check(factors, epsilon, floors, "layer_selective_gaussian")
    _layer_selective_options(fraction)
    m, num_targets = factors[0].down.shape[0], len(factors)
    count = max(1, math.floor(fraction * num_targets + 0.5))
    device = factors[0].down.device
    keys = uniform((m, num_targets), generator=generator, device=device)
    chosen = torch.zeros(m, num_targets, dtype=torch.bool, device=device)
    chosen.scatter_(1, keys.topk(count, dim=1).indices, True)  # (m, T)
    out = []
    for t, ((down, up), floor) in enumerate(zip(factors, floors)):
        rank, hit = effective_rank(down, up), chosen[:, t, None, None]  # (m, 1, 1)
        out.append(Factors(
            torch.where(hit, _gaussian(down, rank, epsilon, floor, generator).to(down.dtype), down),
            torch.where(hit, _gaussian(up, rank, epsilon, floor, generator).to(up.dtype), up),
        ))
    return out


def _rotation(m: int, r: int, rank: int, epsilon: float, generator, device, dtype) -> Tensor:
    """``(m, r, r)`` exactly orthogonal ``matrix_exp(eps * skew(N))``, identity beyond ``rank``."""
    n = normal((m, r, r), generator=generator, device=device, dtype=dtype)
    keep = torch.arange(r, device=device) < rank
    n = n * (keep[:, None] & keep[None, :])
    skew = (n - n.mT) / math.sqrt(2.0)  # off-diagonal entries ~ N(0, 1)
    return torch.linalg.matrix_exp(epsilon * skew)


def svd_structured(
    factors: Sequence[Factors], *, epsilon: float, floors: Sequence[float], generator: torch.Generator
) -> list[Factors]:
    """M1: re-weight and rotate the adapter within its own singular subspace.

    SVD (from the factors); ``s *= exp(epsilon * z)``, ``z ~ N(0, 1)``;
    ``U`` and ``V`` are rotated by independent ``r_eff x r_eff`` orthogonal
    matrices ``matrix_exp(epsilon * skew(N))`` (exactly orthogonal, near the
    identity for small epsilon, cost independent of ``d`` and ``e``); rebuilt
    balanced. The column and row spaces of ``dW`` do not change (the
    Gaussian mutations are the ones that move them), so a zero adapter stays
    zero and ``floors`` is not used. Fitness plays no part.

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: relative strength, ``>= 0``.
        floors: per target reference RMS, ``>= 0``. Not used.
        generator: the source of randomness.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.
    """
    _check(factors, epsilon, floors, "svd_structured")
    out = []
    for down, up in factors:
        m, r, rank = down.shape[0], down.shape[-1], effective_rank(down, up)
        u, s, v = _svd_compute(down, up)  # (m, d, r), (m, r), (m, e, r)
        s = s * torch.exp(epsilon * normal(s.shape, generator=generator, device=s.device, dtype=s.dtype))
        u = u @ _rotation(m, r, rank, epsilon, generator, u.device, u.dtype)
        v = v @ _rotation(m, r, rank, epsilon, generator, v.device, v.dtype)
        out.append(rebuild_balanced(u, s, v, down.dtype))
    return out


def component_masking(
    factors: Sequence[Factors], *, epsilon: float, floors: Sequence[float], generator: torch.Generator,
    rho: float = 0.3,
) -> list[Factors]:
    """M3: zero ``ceil(rho * r_eff)`` randomly chosen singular values, rebuild balanced.

    ``r_eff = min(r, d, e)``; the components are chosen uniformly without
    replacement per individual and target. With ``r_eff == 1`` (and
    ``rho > 0``) the adapter is reset to zero. The rebuilt factors are the
    balanced form of the masked ``dW``. Takes its strength from ``rho`` and
    ignores ``epsilon`` and ``floors``. Fitness plays no part.

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: relative strength, ``>= 0``. Ignored.
        floors: per target reference RMS, ``>= 0``. Ignored.
        generator: the source of randomness.
        rho: share of the components to zero, in ``[0, 1]``.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.
    """
    _check(factors, epsilon, floors, "component_masking")
    _masking_options(rho)
    out = []
    for down, up in factors:
        rank = effective_rank(down, up)
        count = math.ceil(round(rho * rank, 9))  # round: 0.3 * 10 is 3.0000000000000004
        u, s, v = _svd_compute(down, up)  # (m, d, r), (m, r), (m, e, r)
        keys = uniform(s.shape, generator=generator, device=s.device)
        keys = torch.where(_columns(s, rank), keys, -1.0)  # surplus components are never picked
        drop = torch.zeros_like(s, dtype=torch.bool).scatter_(1, keys.topk(count, dim=1).indices, True)
        out.append(rebuild_balanced(u, torch.where(drop, 0.0, s), v, down.dtype))
    return out


def neftune_style(
    factors: Sequence[Factors], *, epsilon: float, floors: Sequence[float], generator: torch.Generator,
    alpha: float = 10.0,
) -> list[Factors]:
    """M5: uniform noise in ``[-b, b]`` on ``down`` only, ``b = alpha / sqrt(d * r_eff)``.

    As NEFTune scales embedding noise. ``up`` is returned unchanged (a copy).
    Takes its strength from ``alpha`` and ignores ``epsilon`` and ``floors``.
    Fitness plays no part.

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: relative strength, ``>= 0``. Ignored.
        floors: per target reference RMS, ``>= 0``. Ignored.
        generator: the source of randomness.
        alpha: noise strength, ``>= 0``.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.
    """
    _check(factors, epsilon, floors, "neftune_style")
    _neftune_options(alpha)
    out = []
    for down, up in factors:
        rank = effective_rank(down, up)
        bound = alpha / math.sqrt(down.shape[1] * rank)
        dtype = compute_dtype(down)
        noise = uniform(down.shape, generator=generator, device=down.device, dtype=dtype)
        noise = (2 * noise - 1) * bound * _columns(down, rank)
        out.append(Factors((down.to(dtype) + noise).to(down.dtype), up.clone()))
    return out


register_mutation("svd_structured", svd_structured)
register_mutation("layer_selective_gaussian", layer_selective_gaussian, validate=_layer_selective_options)
register_mutation("component_masking", component_masking, validate=_masking_options)
register_mutation("full_gaussian", full_gaussian)
register_mutation("neftune_style", neftune_style, validate=_neftune_options)
