"""ClipUp: the optimiser of PGPE (Toklu et al. 2020, "ClipUp: a simple and powerful optimizer for
distribution-based policy evolution", arXiv 2008.02387), as a ``torch.optim.Optimizer``.

Per parameter group, with ``g`` the group's gradient (every parameter's
``.grad`` concatenated into one vector; ``torch.optim`` descends, so ES
writes ``grad = -(ascent direction)``):

    v <- momentum * v + lr * g / ||g||          (a normalised step of length lr)
    v <- v * min(1, max_speed / ||v||)          (speed clipped to max_speed)
    p <- p - v

The step length does not depend on the gradient's scale (nor on the fitness
shaping), only its direction does: ``lr`` is a distance in parameter space,
which is why ClipUp suits ES, whose gradient estimate is noisy in size.
The paper's advice: ``max_speed = 2 * lr`` (the default here),
``momentum = 0.9``, and ``lr`` about ``sigma`` / 2 or less for a noise scale
``sigma`` of the same order as the parameters' changes.

Populations trained by gradient: the default takes ONE norm and ONE speed over a whole group, so over
``Population.adapter_parameters()`` (stacked, first dimension the individual) it couples the individuals:
one individual's large gradient shrinks every other's step. ``per_individual=True`` computes the norm of
``g`` and the speed of ``v`` per row ``i`` of the first dimension (over every parameter of the group), so
each individual takes its own ClipUp step, exactly as ``P`` separate ClipUps would; its velocity rows follow
evolution like any element-wise optimizer's state (``evolve_(..., optimizer=opt)``).

With :class:`~populora.EggrollES` or ``evolve_with_env(..., algorithm='es')``::

    from populora.optim import ClipUp
    es = EggrollES(model, 64, 0.1, None, 4, optimizer=lambda ps: ClipUp(ps, lr=0.05))
    evolve_with_env(envs, model, 64, 4, algorithm=ES(optimizer="clipup", lr=0.05))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from populora.checks import check_bool, check_float
from populora.errors import InvalidValueError

__all__ = ["ClipUp"]

_OPTIONS = ("lr", "momentum", "max_speed", "eps")


def _check_group(group: Mapping[str, Any], index: int) -> None:
    """A parameter group's options in range, each named by its group (``param_groups[i]['eps']``)."""
    missing = [key for key in _OPTIONS if key not in group]
    if missing:
        raise InvalidValueError(f"ClipUp's parameter group {index} lacks the option(s) {missing}")

    def name(key: str) -> str:
        return f"param_groups[{index}]['{key}']"

    check_float(name("lr"), group["lr"], low=0.0, low_open=True)
    check_float(name("momentum"), group["momentum"], low=0.0, high=1.0, high_open=True)
    check_float(name("max_speed"), group["max_speed"], low=0.0, low_open=True)
    check_float(name("eps"), group["eps"], low=0.0)
    check_bool(name("per_individual"), group.get("per_individual", False))


class ClipUp(torch.optim.Optimizer):
    """ClipUp (normalised gradient step, heavy-ball velocity, clipped speed); see the module docstring.

    Args:
        params: parameters or parameter groups (each group has its own
            ``lr``, ``momentum``, ``max_speed`` and its own gradient norm).
        lr: step size ``> 0``: the length of the normalised step added to the velocity.
        momentum: velocity decay in ``[0, 1)`` (paper: 0.9).
        max_speed: most length of the velocity ``> 0`` (default ``2 * lr``).
        eps: added to ``||g||``, ``>= 0`` (a zero gradient adds no step).
        per_individual: one norm and one speed per row of the first dimension (every parameter of the group
            stacked over the same ``P`` individuals), instead of one per group; see the module docstring.

    State per parameter: ``velocity`` (its share of ``v``, shape of the parameter).

    Every group's options are checked wherever they enter: here, in
    :meth:`add_param_group`, in :meth:`load_state_dict`, and at every
    :meth:`step` (groups may be edited, e.g. by an LR schedule). A step is all
    or nothing: every group's options and gradients are checked before any
    parameter moves.

    Raises:
        InvalidTypeError, InvalidValueError: an option of the wrong type or out
            of range, named with its group (``param_groups[1]['eps']``).

    Example:
        >>> p = torch.nn.Parameter(torch.zeros(2))
        >>> opt = ClipUp([p], lr=0.5, momentum=0.9)
        >>> p.grad = torch.tensor([3.0, 4.0]); _ = opt.step()
        >>> p.detach()  # v = 0.5 * (0.6, 0.8), within max_speed 1.0
        tensor([-0.3000, -0.4000])
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.9,
        max_speed: float | None = None,
        eps: float = 1e-12,
        per_individual: bool = False,
    ):
        lr = check_float("lr", lr, low=0.0, low_open=True)
        momentum = check_float("momentum", momentum, low=0.0, high=1.0, high_open=True)
        max_speed = 2.0 * lr if max_speed is None else check_float("max_speed", max_speed, low=0.0, low_open=True)
        eps = check_float("eps", eps, low=0.0)
        # torch's __init__ adds every group through add_param_group, which checks it
        per_individual = check_bool("per_individual", per_individual)
        super().__init__(
            params, dict(lr=lr, momentum=momentum, max_speed=max_speed, eps=eps, per_individual=per_individual)
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        """torch's ``__setstate__`` (``load_state_dict`` ends with it): groups saved before an option existed get
        its default, as torch's own optimizers do."""
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("per_individual", False)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, the group's options (its own, or the defaults) checked first.

        Raises:
            InvalidTypeError, InvalidValueError: an option of the wrong type or out of range (named); the
                group is not added.
        """
        if isinstance(param_group, Mapping):
            options = {key: value for key, value in param_group.items() if key != "params"}
            _check_group({**self.defaults, **options}, len(self.param_groups))
        super().add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``, every group's options and every velocity checked before anything is written.

        Raises:
            InvalidTypeError, InvalidValueError: an option of the wrong type or out of range, or a velocity that
                is not a finite tensor of its parameter's shape (named); nothing has changed.
        """
        groups = state_dict.get("param_groups") if isinstance(state_dict, Mapping) else None
        state = state_dict.get("state") if isinstance(state_dict, Mapping) else None
        if isinstance(groups, list) and isinstance(state, Mapping):
            for index, group in enumerate(groups):
                if not isinstance(group, Mapping):
                    continue  # torch names a malformed state itself
                _check_group(group, index)
                ours = self.param_groups[index]["params"] if index < len(self.param_groups) else []
                for key, param in zip(group.get("params", ()), ours):
                    velocity = state.get(key, {}).get("velocity") if isinstance(state.get(key), Mapping) else None
                    if velocity is None:
                        continue
                    if (
                        not isinstance(velocity, Tensor)
                        or tuple(velocity.shape) != tuple(param.shape)
                        or not bool(torch.isfinite(velocity).all())
                    ):
                        got = (
                            f"shape {tuple(velocity.shape)}, finite: {bool(torch.isfinite(velocity).all())}"
                            if isinstance(velocity, Tensor)
                            else type(velocity).__name__
                        )
                        raise InvalidValueError(
                            f"ClipUp state's velocity of parameter {key!r} (group {index}) must be a finite tensor "
                            f"of its parameter's shape {tuple(param.shape)}, got {got}"
                        )
        super().load_state_dict(state_dict)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One ClipUp update of every parameter that has a ``.grad``; returns ``closure()`` if given.

        All or nothing: every group's options and gradients are checked before any parameter moves.

        Raises:
            InvalidTypeError, InvalidValueError: a group option of the wrong type or out of range, a sparse
                gradient, or a gradient whose norm is not finite (the group named); nothing has moved.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # (group, params, grads, the group's gradient norm: a float, or (P,) per individual)
        work: list[tuple[dict[str, Any], list[Tensor], list[Tensor], float | Tensor]] = []
        for index, group in enumerate(self.param_groups):
            _check_group(group, index)
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise InvalidValueError(f"ClipUp does not take sparse gradients (parameter group {index})")
            grads = [p.grad for p in params]
            if group.get("per_individual", False):
                norms = _row_norms(grads, index)
                if not bool(torch.isfinite(norms).all()):
                    bad = (~torch.isfinite(norms)).nonzero().flatten().tolist()
                    raise InvalidValueError(
                        f"ClipUp got gradient norms {norms[bad].tolist()} of individuals {bad} in parameter group "
                        f"{index}: not finite"
                    )
                work.append((group, params, grads, norms))
                continue
            group_norm = float(torch.sqrt(sum(g.double().square().sum() for g in grads)))
            if not math.isfinite(group_norm):
                raise InvalidValueError(
                    f"ClipUp got a gradient of norm {group_norm} in parameter group {index}: not finite"
                )
            work.append((group, params, grads, group_norm))
        for group, params, grads, norm in work:
            if isinstance(norm, Tensor):
                self._step_per_individual(group, params, grads, norm)
                continue
            scale = group["lr"] / (norm + group["eps"]) if norm > 0 else 0.0
            velocities = []
            for p, g in zip(params, grads):
                state = self.state[p]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                v = state["velocity"]
                v.mul_(group["momentum"]).add_(g, alpha=scale)
                velocities.append(v)
            speed = float(torch.sqrt(sum(v.double().square().sum() for v in velocities)))
            if speed > group["max_speed"]:
                for v in velocities:
                    v.mul_(group["max_speed"] / speed)
            for p, v in zip(params, velocities):
                p.sub_(v)
        return loss

    def _step_per_individual(
        self, group: Mapping[str, Any], params: list[Tensor], grads: list[Tensor], norms: Tensor
    ) -> None:
        """The update of one ``per_individual`` group: row ``i`` of every parameter is individual ``i``'s, with
        its own gradient norm ``norms[i]`` and its own speed."""

        def rows(values: Tensor, t: Tensor) -> Tensor:  # (P,) float64 -> broadcastable over t's rows, t's dtype
            return values.to(t.device, t.dtype).view(-1, *[1] * (t.dim() - 1))

        scale = torch.where(norms > 0, group["lr"] / (norms + group["eps"]), torch.zeros_like(norms))
        velocities = []
        for p, g in zip(params, grads):
            state = self.state[p]
            if "velocity" not in state:
                state["velocity"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            v = state["velocity"]
            v.mul_(group["momentum"]).addcmul_(g, rows(scale, g))
            velocities.append(v)
        speed = _row_norms(velocities, 0)
        factor = torch.where(speed > group["max_speed"], group["max_speed"] / speed, torch.ones_like(speed))
        for p, v in zip(params, velocities):
            v.mul_(rows(factor, v))
            p.sub_(v)


def _row_norms(tensors: list[Tensor], index: int) -> Tensor:
    """``(P,)`` float64 L2 norms of row ``i`` of every tensor together (every tensor's first dimension is ``P``).

    Raises:
        InvalidValueError: tensors without a common first dimension (a ``per_individual`` group's parameters
            must all be stacked over the same individuals).
    """
    sizes = {t.shape[0] if t.dim() else None for t in tensors}
    if len(sizes) != 1 or None in sizes:
        raise InvalidValueError(
            f"ClipUp's per_individual parameter group {index} needs parameters stacked over the same individuals "
            f"(one first dimension P), got shapes {[tuple(t.shape) for t in tensors]}"
        )
    device = tensors[0].device
    squares = [t.detach().double().flatten(1).square().sum(1).to(device) for t in tensors]
    total = squares[0]
    for more in squares[1:]:
        total = total + more
    return torch.sqrt(total)
