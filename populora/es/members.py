"""The members of one ES generation, run through the routed forward, and per-member losses.

:class:`Members` is what :meth:`~populora.EggrollES.ask` returns: calling it
runs the model ONCE with every row routed to its member's perturbation.
:func:`member_losses` calls a user's ``loss_fn(outputs, targets)`` once per
member, vectorised with ``torch.func.vmap`` and falling back to a Python loop
when the function is not vmap-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..routing import map_tensors, routed_call

if TYPE_CHECKING:
    from .core import EggrollES

__all__ = ["Members", "map_tensors", "member_losses"]


def _leading(obj: Any) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    map_tensors(obj, lambda t: shapes.append(tuple(t.shape)))
    return shapes


def split_members(obj: Any, num: int, what: str) -> Any:
    """``(m, b, ...) -> (m*b, ...)`` for every tensor leaf; each must lead with ``m``."""
    for shape in _leading(obj):
        if len(shape) < 2 or shape[0] != num:
            raise ValueError(f"with `per_member=True` every tensor in `{what}` must have shape ({num}, b, ...) "
                             f"(one block of rows per member), got {shape}")
    return map_tensors(obj, lambda t: t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]))


class Members:
    """The ``N`` perturbed members of one generation (higher fitness is better).

    Member ``i`` computes with ``W + sigma * s_i * A_k B_k^T / sqrt(r)`` on
    every selected matrix (``k`` its pair, ``s_i = +1`` for the first half and
    ``-1`` for the second when antithetic) and ``b + sigma * s_i * eps_k`` on
    every selected bias, without any of it being materialised.

    Valid until the generation is told (:meth:`~populora.EggrollES.tell`);
    calling a stale handle raises.

    Attributes:
        pop_size: ``N``.
        generation: the generation these members belong to.
    """

    def __init__(self, es: EggrollES, generation: int, adapters: list):
        self._es = es
        self.generation = generation
        self.pop_size = es.pop_size
        self._adapters = adapters

    def _check_current(self) -> None:
        if self._es.generation != self.generation:
            raise RuntimeError(f"these members belong to generation {self.generation}, but the ES is at "
                               f"generation {self._es.generation}; call ask() again")

    def __len__(self) -> int:
        return self.pop_size

    def __call__(
        self,
        *args: Any,
        individuals: Sequence[int] | Tensor | range | None = None,
        individual: int | None = None,
        per_member: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run the model once over the members' rows.

        Inputs are tensors or nested tuples / lists / dicts of tensors, moved
        to the ES device. Every tensor output whose leading dim is the routed
        row count comes back as ``(m, b, ...)``.

        Args:
            *args, **kwargs: the model's inputs.
            individuals: the members to run (``m`` of them, any order); default all ``N``.
            individual: run a single member instead: inputs and outputs keep
                their ``(b, ...)`` shape.
            per_member: inputs are ``(m, b, ...)``, block ``j`` going to the
                ``j``-th member; otherwise every member sees the whole batch
                ``(b, ...)``, whatever its size.

        Raises:
            RuntimeError: if the generation has been told since :meth:`ask`.
            ValueError: per-member inputs that do not lead with ``m``, or bad ids.
        """
        self._check_current()
        es = self._es
        if individual is not None:
            if individuals is not None or per_member:
                raise ValueError("`individual=` cannot be combined with `individuals=` or `per_member=True`")
            with torch.no_grad():
                return routed_call(es.model, es._router, self._adapters, self.pop_size, args, kwargs,
                                   individual=individual, device=es.device)
        if isinstance(individuals, range):
            individuals = list(individuals)
        m = self.pop_size if individuals is None else len(individuals)
        if m == 0:
            raise ValueError("`individuals` is empty")
        if per_member:
            args, kwargs = split_members((args, kwargs), m, "inputs")
        route = dict(all_individuals=True) if individuals is None else dict(individuals=individuals)
        with torch.no_grad():
            out = routed_call(es.model, es._router, self._adapters, self.pop_size, args, kwargs,
                              broadcast=not per_member, device=es.device, **route)
        rows = _leading(out)
        n = next((s[0] for s in rows if s), None)
        if n is None or n % m:
            return out
        return map_tensors(out, lambda t: t.reshape(m, n // m, *t.shape[1:]) if t.dim() and t.shape[0] == n else t)


def _as_losses(values: Any, m: int, what: str) -> Tensor:
    t = values if isinstance(values, Tensor) else torch.as_tensor(values)
    if t.numel() != m:
        raise ValueError(f"`loss_fn` must return one number per member ({m} in all), got {what} of shape "
                         f"{tuple(t.shape)}; reduce the loss to a scalar inside loss_fn")
    if t.is_complex() or not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"`loss_fn` must return real numbers, got dtype {t.dtype}")
    return t.reshape(m).float()


def member_losses(
    loss_fn: Callable[[Any, Any], Any],
    outputs: Any,
    targets: Any,
    m: int,
    *,
    per_member_targets: bool,
    cache: dict | None = None,
) -> Tensor:
    """``(m,)`` losses: ``loss_fn(outputs[i], targets)`` (or ``targets[i]``) for each member ``i``.

    Vectorised with ``torch.func.vmap``; when that fails (the function calls
    ``.item()``, branches on values, returns a Python float, ...) it runs a
    Python loop instead, and remembers the choice for this function in
    ``cache``. A function that is not vmap-safe therefore runs once under vmap
    (and fails) before its first loop.

    Args:
        loss_fn: ``(outputs (b, ...), targets) -> scalar``; lower is better.
        outputs: ``(m, b, ...)`` tensor or nest of them.
        targets: shared (any object) or, with ``per_member_targets``, ``(m, ...)`` tensors.
        m: number of members.
        per_member_targets: slice ``targets`` per member too.
        cache: ``{code of loss_fn: "vmap" | "loop"}``; keyed by the function's code, so a loss
            defined inside the training loop (a new closure each step) neither grows the cache nor
            is retried under vmap every step.
    """
    key = getattr(loss_fn, "__code__", loss_fn)
    if cache is not None and len(cache) > 256:  # callables without code: keep the cache bounded
        cache.clear()
    try:
        mode = cache.get(key) if cache is not None else None
    except TypeError:  # unhashable callable
        mode, cache = None, None
    if mode != "loop":
        try:
            t_dim = 0 if per_member_targets and targets is not None else None
            values = torch.func.vmap(loss_fn, in_dims=(0, t_dim))(outputs, targets)
            losses = _as_losses(values, m, "a vmapped result").cpu()
            if cache is not None:
                cache[key] = "vmap"
            return losses
        except Exception:  # noqa: BLE001 - not vmap-safe: the loop below raises real errors itself
            if mode == "vmap":
                raise
    if cache is not None:
        cache[key] = "loop"
    values = []
    for i in range(m):  # noqa: B007 - i is read by the lambdas
        out_i = map_tensors(outputs, lambda t: t[i])
        tgt_i = map_tensors(targets, lambda t: t[i]) if per_member_targets else targets
        value = loss_fn(out_i, tgt_i)
        values.append(_as_losses(value if isinstance(value, Tensor) else torch.tensor(float(value)), 1,
                                 f"member {i}'s loss").detach().cpu())
    return torch.cat(values)
