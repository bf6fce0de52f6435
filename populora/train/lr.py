"""Per-individual learning rates: a ``(P,)`` multiplier of each individual's update (PBT's "explore").

One optimizer over :meth:`Population.adapter_parameters <populora.Population.adapter_parameters>` has one
learning rate for everyone. :class:`LRMultipliers` gives individual ``i`` its own, ``lr * m[i]``, by scaling
what the optimizer did to row ``i`` of every stacked parameter: ``p[i] <- old[i] + m[i] * (p[i] - old[i])``.
It scales the UPDATE, not the gradient (Adam's update does not change when its gradient is scaled). For SGD
(with or without momentum), Adam, AdamW (its decoupled weight decay included), RMSprop and Adagrad the update
is proportional to the learning rate, so this is exactly a per-individual learning rate (to rounding). A row
whose multiplier is 1 keeps the optimizer's value bit for bit.

Evolution: :meth:`LRMultipliers.inherit_` gives children their parents' multipliers, :meth:`perturb_`
multiplies some by a factor drawn from ``factors`` (PBT's ``0.8`` or ``1.2``), clamped to ``bounds``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from populora.checks import check_float, check_index, check_int, check_seed
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.snapshots import Snapshot

__all__ = ["LRMultipliers"]

_FORMAT = "populora.LRMultipliers/1"


def _ids(name: str, ids: Any, size: int) -> Tensor:
    if isinstance(ids, Tensor):
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool or ids.dim() != 1:
            raise InvalidTypeError(f"`{name}` must be a 1-D integer tensor, got {ids.dtype} {tuple(ids.shape)}")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InvalidTypeError(f"`{name}` must be a sequence or 1-D tensor of ids, got {type(ids).__name__}")
    return torch.tensor([check_index(f"{name}[{k}]", v, size) for k, v in enumerate(ids)], dtype=torch.int64)


class LRMultipliers(Snapshot):
    """``(P,)`` multipliers of each individual's optimizer update.

    Args:
        pop_size: ``P``.
        values: the initial multipliers (``(P,)`` or a number for all; default 1).
        factors: what :meth:`perturb_` multiplies by, one drawn uniformly per individual (default ``(0.8, 1.2)``).
        bounds: ``(low, high)`` the multipliers are clamped to after a perturbation.
        seed: seeds the object's own generator (the draws of :meth:`perturb_`).

    Attributes:
        values: ``(P,)`` float64 (CPU).

    Example:
        >>> p = torch.nn.Parameter(torch.zeros(2, 1))
        >>> opt = torch.optim.SGD([p], lr=1.0)
        >>> lr = LRMultipliers(2, values=[1.0, 0.5])
        >>> p.grad = torch.ones(2, 1)
        >>> _ = lr.step(opt, [p])
        >>> p.detach().flatten().tolist()
        [-1.0, -0.5]
    """

    _checkpoint_kind = "LRMultipliers"

    def __init__(
        self,
        pop_size: int,
        *,
        values: Any = 1.0,
        factors: Sequence[float] = (0.8, 1.2),
        bounds: tuple[float, float] = (1e-3, 1e3),
        seed: int = 0,
    ) -> None:
        self.pop_size = check_int("pop_size", pop_size, low=1)
        if isinstance(factors, (str, bytes)) or not isinstance(factors, Sequence) or not factors:
            raise InvalidTypeError(f"`factors` must be a non-empty sequence of numbers > 0, got {factors!r}")
        self.factors = tuple(check_float(f"factors[{k}]", f, low=0.0, low_open=True) for k, f in enumerate(factors))
        if not isinstance(bounds, Sequence) or len(bounds) != 2:
            raise InvalidTypeError(f"`bounds` must be a (low, high) pair, got {bounds!r}")
        low = check_float("bounds[0]", bounds[0], low=0.0, low_open=True)
        high = check_float("bounds[1]", bounds[1], low=low)
        self.bounds = (low, high)
        self.values = self._checked_values(values)
        self.seed = check_seed("seed", seed)
        self.generator = torch.Generator().manual_seed(self.seed)

    def _checked_values(self, values: Any) -> Tensor:
        try:
            v = torch.as_tensor(values, dtype=torch.float64).clone()
        except (TypeError, ValueError, RuntimeError):
            raise InvalidTypeError(f"`values` must be a number or ({self.pop_size},) numbers, got {values!r}") from None
        if v.dim() == 0:
            v = v.expand(self.pop_size).clone()
        if v.shape != (self.pop_size,):
            raise InvalidValueError(f"`values` must have shape ({self.pop_size},), got {tuple(v.shape)}")
        if not bool(torch.isfinite(v).all()) or bool((v <= 0).any()):
            raise InvalidValueError(f"`values` must be finite and > 0, got {v.tolist()}")
        return v

    def step(self, optimizer: Any, params: Sequence[Tensor]) -> Any:
        """``optimizer.step()`` (or each of several optimizers'), then row ``i`` of every parameter in
        ``params`` (first dimension ``P``) moved by ``values[i]`` times the optimizer's update.

        Returns:
            what the (last) optimizer's ``step()`` returned.

        Raises:
            InvalidValueError: a parameter whose first dimension is not ``P`` (nothing stepped).
        """
        optimizers = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else list(optimizer)
        if not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
            raise InvalidTypeError("`optimizer` must be a torch.optim.Optimizer or a sequence of them")
        params = list(params)
        for k, p in enumerate(params):
            if p.dim() == 0 or p.shape[0] != self.pop_size:
                raise InvalidValueError(
                    f"`params[{k}]` has shape {tuple(p.shape)}: its first dimension must be the {self.pop_size} "
                    "individuals"
                )
        before = [p.detach().clone() for p in params]
        result = None
        for opt in optimizers:
            result = opt.step()
        with torch.no_grad():
            for p, old in zip(params, before):
                m = self.values.to(p.device).view(-1, *[1] * (p.dim() - 1))
                scaled = (old.double() + m * (p.double() - old.double())).to(p.dtype)
                p.copy_(torch.where(m == 1, p, scaled))  # a multiplier of 1 keeps the optimizer's bits
        return result

    def inherit_(self, children: Any, parents: Any) -> None:
        """``values[children[j]] = values[parents[j]]`` (a child takes its parent's learning rate)."""
        c, p = _ids("children", children, self.pop_size), _ids("parents", parents, self.pop_size)
        if c.numel() != p.numel():
            raise InvalidValueError(f"`children` has {c.numel()} ids but `parents` has {p.numel()}")
        self.values[c] = self.values[p].clone()

    def perturb_(self, ids: Any) -> Tensor:
        """Multiply ``values[ids]`` each by a factor drawn from ``factors`` (own generator), clamped to ``bounds``.

        Returns:
            ``(len(ids),)`` the factors drawn.
        """
        i = _ids("ids", ids, self.pop_size)
        choice = torch.randint(len(self.factors), (i.numel(),), generator=self.generator)
        drawn = torch.tensor(self.factors, dtype=torch.float64)[choice]
        self.values[i] = (self.values[i] * drawn).clamp(*self.bounds)
        return drawn

    def state_dict(self) -> dict[str, Any]:
        """``{'format', 'config', 'values', 'generator'}``: copies."""
        return {
            "format": _FORMAT,
            "config": {"pop_size": self.pop_size, "factors": list(self.factors), "bounds": list(self.bounds)},
            "values": self.values.clone(),
            "generator": self.generator.get_state().clone(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: everything checked before anything is written.

        Raises:
            CheckpointError: another kind of state, another ``pop_size``, bad values or generator state.
        """
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise CheckpointError(f"not an LRMultipliers state (expected format {_FORMAT!r})")
        config = state.get("config")
        if not isinstance(config, Mapping) or config.get("pop_size") != self.pop_size:
            got = config.get("pop_size") if isinstance(config, Mapping) else config
            raise CheckpointError(f"LRMultipliers state is for pop_size {got!r}, these have {self.pop_size}")
        try:
            values = self._checked_values(state.get("values"))
            probe = torch.Generator()
            probe.set_state(state["generator"])
        except (InvalidTypeError, InvalidValueError, KeyError, TypeError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"LRMultipliers state has bad values or generator: {err}") from None
        self.values = values
        self.generator.set_state(probe.get_state())

    def __repr__(self) -> str:
        return f"LRMultipliers(pop_size={self.pop_size}, values={[round(v, 4) for v in self.values.tolist()]})"
