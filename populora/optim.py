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

With :class:`~populora.EggrollES` or ``evolve_with_env(..., algorithm='es')``::

    from populora.optim import ClipUp
    es = EggrollES(model, 64, 0.1, None, 4, optimizer=lambda ps: ClipUp(ps, lr=0.05))
    evolve_with_env(envs, model, 64, 4, algorithm="es", es_kwargs=dict(optimizer="clipup", lr=0.05))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from populora.checks import check_float
from populora.errors import InvalidValueError

__all__ = ["ClipUp"]


class ClipUp(torch.optim.Optimizer):
    """ClipUp (normalised gradient step, heavy-ball velocity, clipped speed); see the module docstring.

    Args:
        params: parameters or parameter groups (each group has its own
            ``lr``, ``momentum``, ``max_speed`` and its own gradient norm).
        lr: step size ``> 0``: the length of the normalised step added to the velocity.
        momentum: velocity decay in ``[0, 1)`` (paper: 0.9).
        max_speed: most length of the velocity ``> 0`` (default ``2 * lr``).
        eps: added to ``||g||`` (a zero gradient adds no step).

    State per parameter: ``velocity`` (its share of ``v``, shape of the parameter).

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
    ):
        lr = check_float("lr", lr, low=0.0, low_open=True)
        momentum = check_float("momentum", momentum, low=0.0, high=1.0, high_open=True)
        max_speed = 2.0 * lr if max_speed is None else check_float("max_speed", max_speed, low=0.0, low_open=True)
        eps = check_float("eps", eps, low=0.0)
        super().__init__(params, dict(lr=lr, momentum=momentum, max_speed=max_speed, eps=eps))
        for group in self.param_groups:  # groups given with their own values are checked too
            check_float("lr", group["lr"], low=0.0, low_open=True)
            check_float("momentum", group["momentum"], low=0.0, high=1.0, high_open=True)
            check_float("max_speed", group["max_speed"], low=0.0, low_open=True)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One ClipUp update of every parameter that has a ``.grad``; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise InvalidValueError("ClipUp does not take sparse gradients")
            grads = [p.grad for p in params]
            norm = torch.sqrt(sum(g.double().square().sum() for g in grads))
            if not bool(torch.isfinite(norm)):
                raise InvalidValueError(f"ClipUp got a gradient of norm {float(norm)}: not finite")
            scale = group["lr"] / (float(norm) + group["eps"]) if float(norm) > 0 else 0.0
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
