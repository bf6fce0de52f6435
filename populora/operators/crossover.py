"""Crossover (spec/operators.md, "Crossover"). X1-X4 are the paper's four crossovers (PopuLoRA, arXiv
2605.16727); ``xes``, ``average`` and ``clone`` are our extensions, not the paper's.

A crossover reads the whole population's stacks (never writes them) and the
parents of each child, and returns the children, one ``Factors`` per target:

- ``stacks[t]``: ``Factors(down (P, d_t, r_t), up (P, e_t, r_t))``.
- ``parents``: ``(c, k)`` population ids; parent 0 is the fittest when the
  parents came from a tournament.
- ``fitnesses``: ``(P,)`` or ``None``; higher is better.
- ``num_groups``: islands, contiguous equal blocks of the population (only
  ``xes`` looks at it).
- returns ``[Factors(down (c, d_t, r_t), up (c, e_t, r_t))]``, same dtype and device.

Arithmetic runs in float32 (float64 for float64 stacks) and is cast back once.

Targets may sit on different devices (a model spread by ``device_map``):
the parents, fitnesses and per-child draws that every target shares live on
the first target's device, and each target reads them on its own
(:class:`~populora.operators.devices.PerDevice`), so its child stays on its
device (a target's ``down`` and ``up`` share one). Random draws are made on
the generator's device as always, in the same order, so the values do not
depend on where the targets are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from populora.errors import FitnessError, InvalidTypeError, InvalidValueError
from populora.operators.base import (
    Factors,
    check_num_groups,
    check_number,
    check_stacks,
    randint,
    register_crossover,
    uniform,
)
from populora.operators.devices import PerDevice
from populora.operators.linalg import compute_dtype, effective_rank, rebuild_balanced, svd_compute
from populora.operators.shaping import check_real_tensor, clamp_infinities, zscore


def _check(
    stacks: Sequence[Factors], parents: Tensor, fitnesses: Tensor | None, name: str, k: int | None = None
) -> tuple[int, Tensor, Tensor | None]:
    """Validate the common arguments.

    Returns:
        ``P``; ``parents`` as int64 on the first target's device (each target
        reads them on its own through :class:`PerDevice`); ``fitnesses`` as a
        float ``(P,)`` tensor on that device with infinities clamped to the
        finite extremes (or None).
    """
    pop = check_stacks(stacks, name)
    if not isinstance(parents, Tensor) or parents.dim() != 2 or parents.dtype.is_floating_point or parents.shape[1] < 1:
        shape = tuple(parents.shape) if isinstance(parents, Tensor) else type(parents).__name__
        raise (InvalidValueError if isinstance(parents, Tensor) else InvalidTypeError)(
            f"`parents` must be an integer tensor (c, k) with k >= 1, got {shape}"
        )
    if k is not None and parents.shape[1] != k:
        raise InvalidValueError(
            f"{name} needs exactly {k} parents per child, got parents of shape {tuple(parents.shape)}"
        )
    if parents.numel() and (int(parents.min()) < 0 or int(parents.max()) >= pop):
        raise InvalidValueError(
            f"`parents` must be population ids in [0, {pop}), got values in "
            f"[{int(parents.min())}, {int(parents.max())}]"
        )
    device = stacks[0].down.device
    if fitnesses is not None:
        fitnesses = check_real_tensor(fitnesses)
        if tuple(fitnesses.shape) != (pop,):
            raise FitnessError(f"`fitnesses` must have shape ({pop},), got {tuple(fitnesses.shape)}")
        fitnesses = clamp_infinities(fitnesses, 0).to(device)
    return pop, parents.to(device, torch.long), fitnesses


def _gather(stack: Factors, ids: PerDevice) -> tuple[Tensor, Tensor]:
    """Parents' factors in the compute dtype: ``ids (c, ...)`` -> ``(c, ..., d, r)``, ``(c, ..., e, r)``.

    ``ids`` are read on the stack's device; the result stays there.
    """
    dtype = compute_dtype(stack.down)
    return stack.down[ids.on(stack.down.device)].to(dtype), stack.up[ids.on(stack.up.device)].to(dtype)


def _dare_options(drop_rate: float = 0.7) -> float:
    return check_number("drop_rate", drop_rate, lambda v: 0 <= v < 1, "in [0, 1)")


def _extrapolative_options(eta_min: float = 1.0, eta_max: float = 1.5) -> tuple[float, float]:
    eta_min = check_number("eta_min", eta_min, lambda v: True, "(finite)")
    return eta_min, check_number("eta_max", eta_max, lambda v: v >= eta_min, f">= `eta_min` ({eta_min})")


def _xes_options(eta: float = 1.0, tournament_size: int = 3) -> tuple[float, int]:
    eta = check_number("eta", eta, lambda v: True, "(finite)")
    return eta, check_number("tournament_size", tournament_size, lambda v: v >= 1, ">= 1", integer=True)


def average(
    stacks: Sequence[Factors],
    parents: Tensor,
    *,
    fitnesses: Tensor | None,
    generator: torch.Generator,
    num_groups: int = 1,
) -> list[Factors]:
    """The mean of the parents' ``down`` and the mean of their ``up``.

    Deterministic. Note ``mean(up) mean(down)^T`` is not the mean ``dW``:
    see :func:`average_delta` for that.

    Args:
        stacks, parents: as every crossover (see the module docstring), ``parents`` ``(c, k)``;
            returns the children, per target ``Factors(down (c, d, r), up (c, e, r))``.
        fitnesses, generator, num_groups: not used.

    Example:
        >>> stack = Factors(torch.arange(3.0).view(3, 1, 1), torch.ones(3, 1, 1))
        >>> average([stack], torch.tensor([[0, 2]]), fitnesses=None, generator=torch.Generator()).pop().down
        tensor([[[1.]]])
    """
    _, parents, _ = _check(stacks, parents, fitnesses, "average")
    per = PerDevice(parents)
    out = []
    for stack in stacks:
        down, up = _gather(stack, per)  # (c, k, d, r), (c, k, e, r)
        out.append(Factors(down.mean(1).to(stack.down.dtype), up.mean(1).to(stack.up.dtype)))
    return out


def average_delta(
    stacks: Sequence[Factors],
    parents: Tensor,
    *,
    fitnesses: Tensor | None,
    generator: torch.Generator,
    num_groups: int = 1,
) -> list[Factors]:
    """The best rank-``r`` approximation of the parents' mean ``dW``, rebuilt balanced.

    ``mean_j B_j A_j^T = [B_1 .. B_k] [A_1 .. A_k]^T / k`` has rank ``<= k r``;
    its thin SVD comes from QR of the concatenated ``(d, k r)`` and
    ``(e, k r)`` factors and the SVD of the small core, never forming ``dW``.
    Truncating to the top ``r`` components is optimal (Eckart-Young).
    Deterministic.

    Args:
        stacks, parents: as every crossover (see the module docstring), ``parents`` ``(c, k)``;
            returns the children, per target ``Factors(down (c, d, r), up (c, e, r))``.
        fitnesses, generator, num_groups: not used.
    """
    _, parents, _ = _check(stacks, parents, fitnesses, "average_delta")
    c, k = parents.shape
    per = PerDevice(parents)
    out = []
    for stack in stacks:
        down, up = _gather(stack, per)  # (c, k, d, r), (c, k, e, r)
        d, r, e = down.shape[2], down.shape[3], up.shape[2]
        down_cat = down.permute(0, 2, 1, 3).reshape(c, d, k * r)  # (c, d, k r)
        up_cat = up.permute(0, 2, 1, 3).reshape(c, e, k * r) / k  # (c, e, k r)
        u, s, v = svd_compute(down_cat, up_cat)
        out.append(rebuild_balanced(u[..., :r], s[..., :r], v[..., :r], stack.down.dtype))
    return out


def dare(
    stacks: Sequence[Factors],
    parents: Tensor,
    *,
    fitnesses: Tensor | None,
    generator: torch.Generator,
    num_groups: int = 1,
    drop_rate: float = 0.7,
) -> list[Factors]:
    """X1: drop-and-rescale each parent's factors elementwise, then average.

    Every entry of every parent's ``down`` and ``up`` is kept with probability
    ``1 - drop_rate`` and rescaled by ``1 / (1 - drop_rate)``, so the child's
    expected factors equal :func:`average`'s.

    Args:
        stacks, parents: as every crossover (see the module docstring), ``parents`` ``(c, k)``;
            returns the children, per target ``Factors(down (c, d, r), up (c, e, r))``.
        generator: the source of randomness.
        fitnesses, num_groups: not used.
        drop_rate: probability of dropping an entry, in ``[0, 1)``.
    """
    _, parents, _ = _check(stacks, parents, fitnesses, "dare")
    drop_rate = _dare_options(drop_rate)
    keep = 1.0 - drop_rate
    per = PerDevice(parents)
    out = []
    for stack in stacks:
        child = []
        for factor in _gather(stack, per):  # (c, k, n, r)
            mask = uniform(factor.shape, generator=generator, device=factor.device, dtype=factor.dtype)
            child.append(torch.where(mask < keep, factor / keep, 0.0).mean(1).to(stack.down.dtype))
        out.append(Factors(*child))
    return out


def layer_wise(
    stacks: Sequence[Factors],
    parents: Tensor,
    *,
    fitnesses: Tensor | None,
    generator: torch.Generator,
    num_groups: int = 1,
) -> list[Factors]:
    """X2: per target and per child, copy ``(down, up)`` of one parent chosen uniformly.

    Args:
        stacks, parents: as every crossover (see the module docstring), ``parents`` ``(c, k)``;
            returns the children, per target ``Factors(down (c, d, r), up (c, e, r))``.
        generator: the source of randomness.
        fitnesses, num_groups: not used.
    """
    _, parents, _ = _check(stacks, parents, fitnesses, "layer_wise")
    c, k = parents.shape
    per = PerDevice(parents)
    out = []
    for stack in stacks:
        device = stack.down.device
        pick = randint(0, k, (c, 1), generator=generator, device=device)
        chosen = per.on(device).gather(1, pick).squeeze(1)  # (c,)
        out.append(Factors(stack.down[chosen], stack.up[chosen]))
    return out


def svd_subspace(
    stacks: Sequence[Factors],
    parents: Tensor,
    *,
    fitnesses: Tensor | None,
    generator: torch.Generator,
    num_groups: int = 1,
) -> list[Factors]:
    """X3: leading singular components from parent 0, trailing ones from parent 1.

    Per target, both parents' adapters are SVD'd (from the factors); a split
    ``m ~ U{1 .. r_eff - 1}`` is drawn per child, where
    ``r_eff = min(r, d, e)`` is the effective rank; components ``< m`` come
    from ``parents[:, 0]`` (the fitter, after a tournament), ``>= m`` from
    ``parents[:, 1]``; the child is rebuilt balanced. With ``r_eff == 1``
    the child is an exact copy of parent 0.

    Args:
        stacks, parents: as every crossover (see the module docstring), ``parents`` ``(c, 2)``;
            returns the children, per target ``Factors(down (c, d, r), up (c, e, r))``.
        generator: the source of randomness.
        fitnesses, num_groups: not used.

    Raises:
        InvalidValueError: ``parents`` is not ``(c, 2)``.
    """
    _, parents, _ = _check(stacks, parents, fitnesses, "svd_subspace", k=2)
    c = parents.shape[0]
    first_parent, second_parent = PerDevice(parents[:, 0]), PerDevice(parents[:, 1])
    out = []
    for stack in stacks:
        rank = effective_rank(stack.down, stack.up)
        if rank == 1:
            out.append(
                Factors(stack.down[first_parent.on(stack.down.device)], stack.up[first_parent.on(stack.up.device)])
            )
            continue
        u1, s1, v1 = svd_compute(*_gather(stack, first_parent))  # (c, d, r), (c, r), (c, e, r)
        u2, s2, v2 = svd_compute(*_gather(stack, second_parent))
        split = randint(1, rank, (c, 1), generator=generator, device=s1.device)
        first = torch.arange(s1.shape[-1], device=s1.device) < split  # (c, r)
        u = torch.where(first.unsqueeze(1), u1, u2)
        v = torch.where(first.unsqueeze(1), v1, v2)
        s = torch.where(first, s1, s2)
        out.append(rebuild_balanced(u, s, v, stack.down.dtype))
    return out


def extrapolative(
    stacks: Sequence[Factors],
    parents: Tensor,
    *,
    fitnesses: Tensor | None,
    generator: torch.Generator,
    num_groups: int = 1,
    eta_min: float = 1.0,
    eta_max: float = 1.5,
) -> list[Factors]:
    """X4: ``child = worse + eta * (better - worse)``, ``eta ~ U(eta_min, eta_max)`` per child.

    Two parents, ordered by fitness (higher is better; a tie keeps parent 0
    as the better). With ``fitnesses=None`` parent 0 is taken as the better
    one (tournaments put the fittest first). ``eta`` is one draw per child,
    shared by every target's ``down`` and ``up``; ``eta > 1`` steps past the
    better parent.

    Args:
        stacks: per target ``Factors(down (P, d, r), up (P, e, r))``, read only.
        parents: ``(c, 2)`` population ids.
        fitnesses: ``(P,)`` or None; higher is better. None: parent 0 is the better.
        generator: the source of randomness.
        num_groups: islands (contiguous equal blocks). Not used.
        eta_min: lower end of ``eta``'s range.
        eta_max: upper end of ``eta``'s range.

    Returns:
        Per target ``Factors(down (c, d, r), up (c, e, r))``, the input dtype and device.

    Raises:
        InvalidValueError: ``parents`` is not ``(c, 2)``, or ``eta_min > eta_max``.
    """
    _, parents, fitnesses = _check(stacks, parents, fitnesses, "extrapolative", k=2)
    eta_min, eta_max = _extrapolative_options(eta_min, eta_max)
    better, worse = parents[:, 0], parents[:, 1]
    if fitnesses is not None:
        swap = fitnesses[worse] > fitnesses[better]
        better, worse = torch.where(swap, worse, better), torch.where(swap, better, worse)
    dtype = compute_dtype(stacks[0].down)
    eta = uniform((parents.shape[0], 1, 1), generator=generator, device=parents.device, dtype=dtype)
    etas = PerDevice(eta_min + (eta_max - eta_min) * eta)  # (c, 1, 1), shared by every target
    betters, worses = PerDevice(better), PerDevice(worse)
    out = []
    for stack in stacks:
        child = []
        for factor in (stack.down, stack.up):
            step = etas.on(factor.device)
            lo, hi = factor[worses.on(factor.device)].to(step.dtype), factor[betters.on(factor.device)].to(step.dtype)
            child.append((lo + step * (hi - lo)).to(factor.dtype))
        out.append(Factors(*child))
    return out


def xes(
    stacks: Sequence[Factors],
    parents: Tensor,
    *,
    fitnesses: Tensor | None,
    generator: torch.Generator,
    num_groups: int = 1,
    eta: float = 1.0,
    tournament_size: int = 3,
) -> list[Factors]:
    """Our extension (not one of the paper's): a step from the mean of good and bad individuals toward the good ones.

    ``theta`` is an individual's full set of factors (every target's ``down``
    and ``up``). The ``k`` parents (the good ones) are paired with ``k`` bad
    ones from a reverse tournament among the others of the child's island
    (the island of ``parents[:, 0]``; "others" = not among its parents):
    ``min(tournament_size, #others)`` distinct contenders drawn uniformly,
    the ``k`` least fit are the bad ones, the worst repeating if there are
    fewer than ``k``. Over these ``n = 2k`` members, with z-scored fitness
    weights ``w`` (higher fitness is better),
    ``child = mean(theta) + eta * sum_j w_j theta_j / n``. An island with no
    others gives ``n = k`` (good parents only).

    Args:
        stacks: per target ``Factors(down (P, d, r), up (P, e, r))``, read only.
        parents: ``(c, k)`` population ids.
        fitnesses: ``(P,)``, required; higher is better.
        generator: the source of randomness.
        num_groups: islands (contiguous equal blocks). ``P`` must be divisible by it.
        eta: step size.
        tournament_size: contenders in the reverse tournament.

    Returns:
        Per target ``Factors(down (c, d, r), up (c, e, r))``, the input dtype and device.

    Raises:
        FitnessError: ``fitnesses`` is None (a ``ValueError``).
        InvalidValueError: ``P`` is not divisible by ``num_groups``.
    """
    if fitnesses is None:
        raise FitnessError("crossover `xes` needs `fitnesses` ((P,), higher is better), got None")
    pop, parents, fitnesses = _check(stacks, parents, fitnesses, "xes")
    assert fitnesses is not None  # checked above
    num_groups = check_num_groups(pop, num_groups, "P")
    eta, tournament_size = _xes_options(eta, tournament_size)
    c, k = parents.shape
    dev = parents.device
    fit = fitnesses
    size = pop // num_groups
    members = (parents[:, :1] // size) * size + torch.arange(size, device=dev)  # (c, size)
    is_parent = (members.unsqueeze(-1) == parents.unsqueeze(1)).any(-1)  # (c, size)
    keys = uniform((c, size), generator=generator, device=dev)
    keys = torch.where(is_parent, -1.0, keys)  # parents are never contenders
    t = min(tournament_size, size)
    ckeys, pos = keys.topk(t, dim=-1)  # (c, t)
    contenders = members.gather(1, pos)
    valid = ckeys >= 0
    scores = torch.where(valid, fit[contenders], torch.inf)
    ranked = contenders.gather(1, torch.argsort(scores, dim=-1, stable=True))  # worst first
    n_valid = valid.sum(1, keepdim=True)  # (c, 1)
    slot = torch.arange(k, device=dev).expand(c, k)
    slot = torch.where(slot < n_valid, slot, 0).clamp_max(t - 1)
    bad = ranked.gather(1, slot)  # (c, k)
    group = torch.cat([parents, bad], dim=1)  # (c, 2k)
    counted = torch.cat([torch.ones_like(bad, dtype=torch.bool), (n_valid > 0).expand(c, k)], 1)
    weight = counted.to(fit.dtype)
    n = weight.sum(1, keepdim=True)  # (c, 1)
    z = zscore(fit[group], 1, mask=counted)  # the uncounted repeat a parent: max |f| is the same
    coef = (weight + eta * z * weight) / n  # (c, 2k): mean plus step
    groups = PerDevice(group)
    out = []
    for stack in stacks:
        down, up = _gather(stack, groups)  # (c, 2k, d, r), (c, 2k, e, r)
        w = coef.to(down.dtype).to(down.device)  # cast where it was computed, then moved (exact)
        out.append(
            Factors(
                torch.einsum("cj,cjdr->cdr", w, down).to(stack.down.dtype),
                torch.einsum("cj,cjer->cer", w, up).to(stack.up.dtype),
            )
        )
    return out


register_crossover("average", average)
register_crossover("average_delta", average_delta)
register_crossover("dare", dare, validate=_dare_options)
register_crossover("layer_wise", layer_wise)
register_crossover("svd_subspace", svd_subspace)
register_crossover("extrapolative", extrapolative, validate=_extrapolative_options)
register_crossover("xes", xes, validate=_xes_options)
