"""Mutation (spec/operators.md, "Mutation"). M1-M4 are the paper's four mutations (PopuLoRA, arXiv
2605.16727); ``neftune_style`` is our extension, not one of the paper's.

A mutation receives only the individuals to mutate and returns new factors of
identical shapes and dtypes (inputs are never modified):

- ``factors[t]``: ``Factors(down (m, d_t, r_t), up (m, e_t, r_t))``; the
  adapter adds ``dW = up @ down.T`` (``(e, d)``) to the weight ``W``.
- ``weight_scales[t]``: target ``t``'s reference weight RMS ``w_t``. The
  population passes ``w_t = max(rms(W_t), 1 / sqrt(d_t))``: the weight's
  own RMS, floored at the fan-in scale ``1/sqrt(d_t)`` (the bound of
  ``nn.Linear``'s default initialisation ``U(-1/sqrt(d), 1/sqrt(d))``), so a
  layer whose weight is zero (a zero-initialised policy head) still has a
  scale to evolve at.
- ``epsilon``: the strength, ``>= 0``.

**Additive mutations** (:func:`full_gaussian`, :func:`layer_selective_gaussian`,
:func:`neftune_style`): ``epsilon`` is the expected relative change of the
target layer's output per mutation. The noise is scaled per individual and
target so that ``E[rms(dW' - dW)] = epsilon * w_t`` (root of the expected
mean square over the ``e x d`` entries). For inputs ``x`` with unit-variance
isotropic entries, ``rms(W x) = rms(W) * sqrt(d)``, so the output moves by
``rms(dW' x - dW x) = epsilon * max(rms(W x), rms(x))`` in expectation
(``rms(x) = 1``): ``epsilon = 0.1`` moves each mutated layer's output by about
10% of its own size, or of its input's size for a layer smaller than its
input (a zero weight; also ``nn.Linear``'s default initialisation, whose
``rms(W x)`` is ``rms(x) / sqrt(3)``). For an ``nn.Embedding`` (one-hot
inputs) it is the change of a token's embedding relative to
``max(rms(W), 1/sqrt(V))``. This holds whatever the adapter's current size, zero
included (``init_scale=0``), and matches ``init_scale``, which is the same
relative output change at initialisation. It is exact in expectation: with
noise of RMS ``s`` on both factors, ``E[rms(dW' - dW)^2] = k (s^2 (a^2 + u^2)
+ s^4)`` (``k`` the effective rank, ``a^2`` and ``u^2`` the mean squares of
the individual's ``down`` and ``up``), solved for ``s``.

**SVD mutations** (:func:`svd_structured`, :func:`component_masking`) keep
their meaning: they re-weight, rotate or drop the adapter's own singular
components, so they cannot move a zero adapter (it stays zero) and do not use
``weight_scales``.

Targets may sit on different devices (a model spread by ``device_map``):
each target's noise is drawn on the generator's device and moved to that
target's device, and what the targets share (the choice of targets in
:func:`layer_selective_gaussian`) is computed on the first target's device
and read by each target on its own; the values do not depend on where the
targets are.

Fitness plays no part here (where it appears, higher is better). Factors
keep their surplus columns (beyond the effective rank ``min(r, d, e)``) at
zero: noise goes to the effective columns only, and RMS is measured on them.

Before populora 0.2 the keyword was ``floors`` (a per-target factor scale, and
``epsilon`` was relative to each factor's own RMS); a registered mutation
that takes ``floors`` instead of ``weight_scales`` is refused when registered
(:func:`~populora.operators.base.register_mutation`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from populora.errors import InvalidTypeError, InvalidValueError
from populora.operators.base import Factors, check_number, check_stacks, normal, register_mutation, uniform
from populora.operators.linalg import compute_dtype, effective_rank, rebuild_balanced, svd_compute


def check_epsilon(epsilon) -> float:
    """``epsilon`` as a float ``>= 0`` (NumPy scalars and 0-d tensors pass).

    Raises:
        InvalidTypeError: not a real number.
        InvalidValueError: negative or not finite.
    """
    return check_number("epsilon", epsilon, lambda v: v >= 0, ">= 0")


def _check(factors: Sequence[Factors], epsilon, weight_scales: Sequence[float], name: str) -> tuple[float, list[float]]:
    """Validate the common arguments; returns ``epsilon`` and ``weight_scales`` as floats."""
    if isinstance(factors, Factors) or not isinstance(factors, Sequence):
        raise InvalidTypeError(
            f"`factors` of {name} must be a list of Factors (one per target), got {type(factors).__name__}"
        )
    check_stacks(factors, name, "factors", "m")
    epsilon = check_epsilon(epsilon)
    try:
        scales = [float(w.item() if isinstance(w, Tensor) else w) for w in weight_scales]
    except (TypeError, ValueError, RuntimeError):
        raise InvalidTypeError(
            f"`weight_scales` must hold one real number per target ({len(factors)}), got {weight_scales!r:.200}"
        ) from None
    if len(scales) != len(factors) or not all(math.isfinite(w) and w >= 0 for w in scales):
        raise InvalidValueError(
            f"`weight_scales` must hold one finite value >= 0 per target ({len(factors)}), got {scales}"
        )
    return epsilon, scales


def _columns(x: Tensor, rank: int) -> Tensor:
    """``(r,)`` mask of the effective columns, broadcastable against ``(m, n, r)``."""
    return torch.arange(x.shape[-1], device=x.device) < rank


def _mean_square(x: Tensor, rank: int) -> Tensor:
    """``(m, 1, 1)`` mean square of each individual's effective columns of ``x (m, n, r)``."""
    return x[..., :rank].square().mean(dim=(-2, -1), keepdim=True)


def _noise_rms(a2: Tensor, u2: Tensor, target2: float, rank: int) -> Tensor:
    """RMS ``s`` of noise on both factors with ``k (s^2 (a2 + u2) + s^4) = target2``, per individual.

    ``s^2 = 2c / (S + sqrt(S^2 + 4c))`` with ``c = target2 / k``, ``S = a2 + u2``
    (the stable root of the quadratic in ``s^2``); 0 when ``target2 = 0``.
    """
    c = target2 / rank
    total = a2 + u2
    s2 = 2 * c / (total + (total.square() + 4 * c).sqrt()).clamp_min(torch.finfo(total.dtype).tiny)
    return s2.sqrt()


def _gaussian(down: Tensor, up: Tensor, rank: int, epsilon: float, scale: float, generator) -> Factors:
    """Gaussian noise on both factors giving ``E[rms(dW' - dW)] = epsilon * scale``; compute dtype."""
    dtype = compute_dtype(down, up)
    df, uf = down.to(dtype), up.to(dtype)  # (m, d, r), (m, e, r)
    s = _noise_rms(_mean_square(df, rank), _mean_square(uf, rank), (epsilon * scale) ** 2, rank)  # (m, 1, 1)
    noise_down = normal(down.shape, generator=generator, device=down.device, dtype=dtype) * _columns(down, rank)
    noise_up = normal(up.shape, generator=generator, device=up.device, dtype=dtype) * _columns(up, rank)
    return Factors((df + s * noise_down).to(down.dtype), (uf + s * noise_up).to(up.dtype))


def _layer_selective_options(fraction: float = 1 / 3) -> float:
    return check_number("fraction", fraction, lambda v: 0 < v <= 1, "in (0, 1]")


def _masking_options(rho: float = 0.3) -> float:
    return check_number("rho", rho, lambda v: 0 <= v <= 1, "in [0, 1]")


def full_gaussian(
    factors: Sequence[Factors], *, epsilon: float, weight_scales: Sequence[float], generator: torch.Generator
) -> list[Factors]:
    """M4: Gaussian noise on ``down`` and ``up`` of every target; ``epsilon`` = relative output change.

    Per individual and target, ``down += s N``, ``up += s N`` with the one
    ``s`` for which ``E[rms(dW' - dW)] = epsilon * weight_scales[t]``: the
    target layer's output changes by ``epsilon`` relative to its reference
    size (see the module docstring), whether the adapter is zero, fresh or
    trained. Moves the adapter's subspace. Fitness plays no part (higher is
    better elsewhere).

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: expected relative change of each target layer's output, ``>= 0``.
        weight_scales: per target reference weight RMS ``w_t >= 0``.
        generator: the source of randomness.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.

    Example:
        >>> zero = Factors(torch.zeros(256, 100, 4), torch.zeros(256, 8, 4))
        >>> g = torch.Generator().manual_seed(0)
        >>> new = full_gaussian([zero], epsilon=0.5, weight_scales=[0.2], generator=g)[0]
        >>> dw = new.up @ new.down.mT  # a zero adapter moves: rms(dW) = 0.5 * 0.2
        >>> round(dw.square().mean().sqrt().item(), 2)
        0.1
    """
    epsilon, scales = _check(factors, epsilon, weight_scales, "full_gaussian")
    return [
        _gaussian(down, up, effective_rank(down, up), epsilon, w, generator) for (down, up), w in zip(factors, scales)
    ]


def layer_selective_gaussian(
    factors: Sequence[Factors],
    *,
    epsilon: float,
    weight_scales: Sequence[float],
    generator: torch.Generator,
    fraction: float = 1 / 3,
) -> list[Factors]:
    """M2: per individual, :func:`full_gaussian` on ``max(1, round(fraction * T))`` of the ``T`` targets.

    The targets are chosen uniformly without replacement, independently per
    individual (halves round up); each chosen target's output changes by
    ``epsilon`` relative to its reference size, as in :func:`full_gaussian`.
    The others are returned unchanged. Fitness plays no part (higher is
    better elsewhere).

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: expected relative change of each chosen target layer's output, ``>= 0``.
        weight_scales: per target reference weight RMS ``w_t >= 0``.
        generator: the source of randomness.
        fraction: share of the targets to mutate, in ``(0, 1]``.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.
    """
    epsilon, scales = _check(factors, epsilon, weight_scales, "layer_selective_gaussian")
    fraction = check_number("fraction", fraction, lambda v: 0 < v <= 1, "in (0, 1]")
    m, num_targets = factors[0].down.shape[0], len(factors)
    count = max(1, math.floor(fraction * num_targets + 0.5))
    device = factors[0].down.device
    keys = uniform((m, num_targets), generator=generator, device=device)
    chosen = torch.zeros(m, num_targets, dtype=torch.bool, device=device)
    chosen.scatter_(1, keys.topk(count, dim=1).indices, True)  # (m, T)
    out = []
    for t, ((down, up), w) in enumerate(zip(factors, scales)):
        rank, hit = effective_rank(down, up), chosen[:, t, None, None].to(down.device)  # (m, 1, 1)
        new = _gaussian(down, up, rank, epsilon, w, generator)
        out.append(Factors(torch.where(hit, new.down, down), torch.where(hit, new.up, up)))
    return out


def _rotation(m: int, r: int, rank: int, epsilon: float, generator, device, dtype) -> Tensor:
    """``(m, r, r)`` exactly orthogonal ``matrix_exp(eps * skew(N))``, identity beyond ``rank``."""
    n = normal((m, r, r), generator=generator, device=device, dtype=dtype)
    keep = torch.arange(r, device=device) < rank
    n = n * (keep[:, None] & keep[None, :])
    skew = (n - n.mT) / math.sqrt(2.0)  # off-diagonal entries ~ N(0, 1)
    return torch.linalg.matrix_exp(epsilon * skew)


def svd_structured(
    factors: Sequence[Factors], *, epsilon: float, weight_scales: Sequence[float], generator: torch.Generator
) -> list[Factors]:
    """M1: re-weight and rotate the adapter within its own singular subspace.

    SVD (from the factors); ``s *= exp(epsilon * z)``, ``z ~ N(0, 1)``;
    ``U`` and ``V`` are rotated by independent ``r_eff x r_eff`` orthogonal
    matrices ``matrix_exp(epsilon * skew(N))`` (exactly orthogonal, near the
    identity for small epsilon, cost independent of ``d`` and ``e``); rebuilt
    balanced. The column and row spaces of ``dW`` do not change (the
    Gaussian mutations are the ones that move them). It cannot move a zero
    adapter: with ``init_scale=0`` (or after a reset) the adapter stays zero;
    use an additive mutation first. ``epsilon`` is the log-scale and
    rotation strength (not a relative output change), and ``weight_scales``
    is not used. Fitness plays no part.

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: strength of the re-weighting and rotation, ``>= 0``.
        weight_scales: per target reference weight RMS, ``>= 0``. Not used.
        generator: the source of randomness.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.
    """
    epsilon, _ = _check(factors, epsilon, weight_scales, "svd_structured")
    out = []
    for down, up in factors:
        m, r, rank = down.shape[0], down.shape[-1], effective_rank(down, up)
        u, s, v = svd_compute(down, up)  # (m, d, r), (m, r), (m, e, r)
        s = s * torch.exp(epsilon * normal(s.shape, generator=generator, device=s.device, dtype=s.dtype))
        u = u @ _rotation(m, r, rank, epsilon, generator, u.device, u.dtype)
        v = v @ _rotation(m, r, rank, epsilon, generator, v.device, v.dtype)
        out.append(rebuild_balanced(u, s, v, down.dtype))
    return out


def component_masking(
    factors: Sequence[Factors],
    *,
    epsilon: float,
    weight_scales: Sequence[float],
    generator: torch.Generator,
    rho: float = 0.3,
) -> list[Factors]:
    """M3: zero ``ceil(rho * r_eff)`` randomly chosen singular values, rebuild balanced.

    ``r_eff = min(r, d, e)``; the components are chosen uniformly without
    replacement per individual and target. With ``r_eff == 1`` (and
    ``rho > 0``) the adapter is reset to zero. The rebuilt factors are the
    balanced form of the masked ``dW``. Takes its strength from ``rho`` and
    ignores ``epsilon`` and ``weight_scales``. It cannot move a zero adapter
    (there is nothing to mask). Fitness plays no part.

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: strength, ``>= 0``. Ignored.
        weight_scales: per target reference weight RMS, ``>= 0``. Ignored.
        generator: the source of randomness.
        rho: share of the components to zero, in ``[0, 1]``.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.
    """
    _check(factors, epsilon, weight_scales, "component_masking")
    rho = check_number("rho", rho, lambda v: 0 <= v <= 1, "in [0, 1]")
    out = []
    for down, up in factors:
        rank = effective_rank(down, up)
        count = math.ceil(round(rho * rank, 9))  # round: 0.3 * 10 is 3.0000000000000004
        u, s, v = svd_compute(down, up)  # (m, d, r), (m, r), (m, e, r)
        keys = uniform(s.shape, generator=generator, device=s.device)
        keys = torch.where(_columns(s, rank), keys, -1.0)  # surplus components are never picked
        drop = torch.zeros_like(s, dtype=torch.bool).scatter_(1, keys.topk(count, dim=1).indices, True)
        out.append(rebuild_balanced(u, torch.where(drop, 0.0, s), v, down.dtype))
    return out


def neftune_style(
    factors: Sequence[Factors],
    *,
    epsilon: float,
    weight_scales: Sequence[float],
    generator: torch.Generator,
) -> list[Factors]:
    """NEFTune-style uniform noise on the input-side factor ``down``; ``epsilon`` = relative output change.

    Per individual and target, ``down += U(-b, b)`` with the bound ``b`` for
    which ``E[rms(dW' - dW)] = epsilon * weight_scales[t]`` (the target
    layer's output changes by ``epsilon`` relative to its reference size, see
    the module docstring); ``up`` is unchanged. Noise on ``down`` alone
    cannot move an adapter whose ``up`` is zero (``init_scale=0``), so such an
    individual gets the noise on ``up`` instead (bound from ``down``'s RMS),
    and one whose factors are both zero gets it on both. A factor counts as
    zero when its RMS is below 1% of the balanced reference factor scale
    ``sqrt(w_t / sqrt(k))``. Fitness plays no part.

    Args:
        factors: per target ``Factors(down (m, d, r), up (m, e, r))`` of the individuals to mutate.
        epsilon: expected relative change of each target layer's output, ``>= 0``.
        weight_scales: per target reference weight RMS ``w_t >= 0``.
        generator: the source of randomness.

    Returns:
        Per target new ``Factors`` of the same shapes, dtype and device.
    """
    epsilon, scales = _check(factors, epsilon, weight_scales, "neftune_style")
    out = []
    for (down, up), w in zip(factors, scales):
        rank = effective_rank(down, up)
        dtype = compute_dtype(down, up)
        df, uf = down.to(dtype), up.to(dtype)
        a2, u2 = _mean_square(df, rank), _mean_square(uf, rank)  # (m, 1, 1)
        c = (epsilon * w) ** 2 / rank  # wanted E[rms(dW' - dW)^2] / k
        zero = 1e-4 * w / math.sqrt(rank)  # (1% of the balanced factor scale)^2
        tiny = torch.finfo(dtype).tiny
        down_only, up_only = u2 > zero, (u2 <= zero) & (a2 > zero)
        both = _noise_rms(a2, u2, (epsilon * w) ** 2, rank)
        sd = torch.where(down_only, (c / u2.clamp_min(tiny)).sqrt(), torch.where(up_only, 0.0, both))
        su = torch.where(up_only, (c / a2.clamp_min(tiny)).sqrt(), torch.where(down_only, 0.0, both))
        bound_down, bound_up = math.sqrt(3) * sd, math.sqrt(3) * su  # U(-b, b) has RMS b / sqrt(3)
        noise = uniform(down.shape, generator=generator, device=down.device, dtype=dtype)
        new_down = df + (2 * noise - 1) * bound_down * _columns(down, rank)
        noise = uniform(up.shape, generator=generator, device=up.device, dtype=dtype)
        new_up = uf + (2 * noise - 1) * bound_up * _columns(up, rank)
        out.append(Factors(new_down.to(down.dtype), new_up.to(up.dtype)))
    return out


register_mutation("svd_structured", svd_structured)
register_mutation("layer_selective_gaussian", layer_selective_gaussian, validate=_layer_selective_options)
register_mutation("component_masking", component_masking, validate=_masking_options)
register_mutation("full_gaussian", full_gaussian)
register_mutation("neftune_style", neftune_style)
