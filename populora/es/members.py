"""The members of one ES generation, run through the routed forward, and per-member losses.

:class:`Members` is what :meth:`~populora.EggrollES.ask` returns: calling it
runs the model ONCE with every row routed to its member's perturbation.
:func:`member_losses` calls a user's ``loss_fn(outputs, targets)`` once per
member, vectorised with ``torch.func.vmap`` and falling back to a Python loop
when the function is not vmap-safe.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..errors import ESStateError, FitnessError, InvalidTypeError, RouteError
from ..routing import Adapter, Route, Router, map_tensors, routed_call

if TYPE_CHECKING:
    from .core import EggrollES

__all__ = ["ESRouter", "ESStateError", "Members", "map_tensors", "member_losses"]


MEMBER_ROUTE = Route(n=-1, groups=1, chunk=-1)
"""The route of the fallback forward: every row belongs to ONE member whose adapters are given unstacked."""


class ESRouter(Router):
    """The routing layer, plus the one-member mode the fallback forward uses (vmap-safe).

    Under :data:`MEMBER_ROUTE` the adapters are one member's: ``down (r, d)``
    (``(V, r)`` for an Embedding), ``up (r, e)``, ``bias (e,)``, possibly
    batched by ``torch.func.vmap`` over members; the delta is added out of place.
    """

    def _apply(self, i: int, module: nn.Module, x: Tensor, out: Tensor, state: tuple) -> Tensor:
        route, adapters, called = state[0], state[1], state[2]
        if route is not MEMBER_ROUTE:
            return super()._apply(i, module, x, out, state)
        called.add(i)
        down, up, bias = adapters[i]
        if isinstance(module, nn.Embedding):
            h = nn.functional.embedding(x, down)  # (..., r)
        else:
            h = torch.matmul(x.to(down.dtype), down.transpose(-1, -2))  # (..., d) @ (d, r)
        delta = torch.matmul(h, up).to(out.dtype)  # (..., e)
        if bias is not None:
            delta = delta + bias.to(out.dtype)
        return out + delta


def _leading(obj: Any) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    map_tensors(obj, lambda t: shapes.append(tuple(t.shape)))
    return shapes


def split_members(obj: Any, num: int, what: str) -> Any:
    """``(m, b, ...) -> (m*b, ...)`` for every tensor leaf; each must lead with ``m``."""
    for shape in _leading(obj):
        if len(shape) < 2 or shape[0] != num:
            raise RouteError(f"with `per_member=True` every tensor in `{what}` must have shape ({num}, b, ...) "
                             f"(one block of rows per member), got {shape}")
    return map_tensors(obj, lambda t: t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]))


class Members:
    """The ``N`` perturbed members of one generation (higher fitness is better).

    Member ``i`` computes with ``W + sigma * s_i * A_k B_k^T / sqrt(r)`` on
    every selected matrix (``k`` its pair, ``s_i = +1`` for the first half and
    ``-1`` for the second when antithetic) and ``b + sigma * s_i * eps_k`` on
    every selected bias, without any of it being materialised.

    Parameters the routed path cannot reach (a bare ``nn.Parameter`` used in
    any expression, a norm gain, a convolution kernel), when the ES perturbs
    them, are evaluated through the fallback: each member's values are
    materialised (``(m, *shape)``, for those parameters only) and the model is
    called per member with ``torch.func.functional_call``, vectorised over the
    members with ``torch.func.vmap`` (``randomness="different"``), or in a
    Python loop when the model is not vmap-safe (one warning). Inside each
    member's call the ``nn.Linear`` / ``nn.Embedding`` perturbations stay low
    rank. A member's output is then whatever the model returns (``(m, ...)``
    stacked), not necessarily ``(m, b, ...)``.

    Valid until the generation is told (:meth:`~populora.EggrollES.tell`);
    calling a stale handle raises :class:`ESStateError`.

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
            raise ESStateError(f"these members belong to generation {self.generation}, but the ES is at "
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
            ESStateError: (a ``RuntimeError``) if the generation has been told since :meth:`ask`.
            RouteError: (a ``ValueError``) per-member inputs that do not lead with ``m``, or bad ids.
        """
        self._check_current()
        es = self._es
        if individual is not None and (individuals is not None or per_member):
            raise RouteError("`individual=` cannot be combined with `individuals=` or `per_member=True`")
        if es._fallback:
            return _fallback_call(es, self._adapters, args, kwargs, individual, individuals, per_member)
        if individual is not None:
            with torch.no_grad():
                return routed_call(es.model, es._router, self._adapters, self.pop_size, args, kwargs,
                                   individual=individual, device=es.device)
        if isinstance(individuals, range):
            individuals = list(individuals)
        m = self.pop_size if individuals is None else len(individuals)
        if m == 0:
            raise RouteError("`individuals` is empty")
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


# ----------------------------------------------------------------------------- the fallback forward


def _member_ids(individuals: Any, n: int) -> Tensor:
    """``(m,)`` int64 member ids (all ``n`` for ``None``), checked."""
    if individuals is None:
        return torch.arange(n)
    if isinstance(individuals, range):
        individuals = list(individuals)
    try:
        ids = torch.as_tensor(individuals)
    except (TypeError, ValueError, RuntimeError):
        raise RouteError(f"`individuals` must be a list or tensor of int ids, got {individuals!r}") from None
    if ids.dim() != 1 or ids.numel() == 0 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise RouteError(f"`individuals` must be a non-empty 1-D list or integer tensor of ids, got shape "
                         f"{tuple(ids.shape)} and dtype {ids.dtype}")
    ids = ids.to("cpu", torch.int64)
    bad = (ids < 0) | (ids >= n)
    if bool(bad.any()):
        raise RouteError(f"individual id {int(ids[bad][0])} is out of range [0, {n})")
    return ids


def _select(adapters: list[Adapter], ids: Tensor) -> list[Adapter]:
    return [Adapter(*(None if t is None else t[ids.to(t.device)] for t in a)) for a in adapters]


def _stack(outs: list[Any]) -> Any:
    """Stack per-member outputs leaf by leaf: tensors along a new dim 0; other leaves as a list."""
    first = outs[0]
    if isinstance(first, Tensor):
        return torch.stack(outs)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_stack(list(v)) for v in zip(*outs)))
    if isinstance(first, (tuple, list)):
        return type(first)(_stack(list(v)) for v in zip(*outs))
    if isinstance(first, dict):
        return {key: _stack([o[key] for o in outs]) for key in first}
    return outs


def _fallback_call(
    es: EggrollES,
    adapters: list[Adapter],
    args: tuple,
    kwargs: dict,
    individual: Any,
    individuals: Any,
    per_member: bool,
) -> Any:
    """Members' forwards with the unroutable parameters swapped in by ``functional_call`` (see :class:`Members`)."""
    inputs = map_tensors((args, kwargs), lambda t: t.to(es.device))

    def forward(values: dict[str, Tensor], member_adapters: list[Adapter], inputs: tuple) -> Any:
        a, k = inputs
        return es._router.run(MEMBER_ROUTE, member_adapters, lambda: torch.func.functional_call(es.model, values, a, k))

    with torch.no_grad():
        if individual is not None:
            i = individual
            if isinstance(i, Tensor) and i.numel() == 1 and not (i.is_floating_point() or i.dtype == torch.bool):
                i = int(i)
            if isinstance(i, bool) or type(i).__name__ == "bool_" or not isinstance(i, numbers.Integral):
                raise RouteError(f"`individual` must be an int id, got {individual!r}")
            ids = _member_ids([int(i)], es.pop_size)
            values = {name: v[0] for name, v in es._fallback_values(ids).items()}
            return forward(values, [Adapter(*(None if t is None else t[0] for t in a)) for a in _select(adapters, ids)],
                           inputs)
        ids = _member_ids(individuals, es.pop_size)
        m = ids.numel()
        if per_member:
            split_members(inputs, m, "inputs")  # checks that every tensor leads with m
        values, member_adapters = es._fallback_values(ids), _select(adapters, ids)
        mode = es._fallback_modes.get(per_member)
        if mode != "loop":
            dims = (0, [Adapter(0, 0, None if a.bias is None else 0) for a in member_adapters],
                    _dims_of(inputs) if per_member else None)
            try:
                out = torch.func.vmap(forward, in_dims=dims, randomness="different")(values, member_adapters, inputs)
                es._fallback_modes[per_member] = "vmap"
                return out
            except Exception as error:  # noqa: BLE001 - not vmap-safe: the loop below raises real errors itself
                vmap_error = error
        outs = []
        for j in range(m):
            member_inputs = map_tensors(inputs, lambda t: t[j]) if per_member else inputs  # noqa: B023
            outs.append(forward({name: v[j] for name, v in values.items()},
                                [Adapter(*(None if t is None else t[j] for t in a)) for a in member_adapters],
                                member_inputs))
        if mode != "loop":
            es._fallback_modes[per_member] = "loop"
            warnings.warn(f"the model could not be vectorised over members with torch.func.vmap "
                          f"({type(vmap_error).__name__}: {str(vmap_error)[:200]}); its unroutable parameters are "
                          "evaluated one member at a time", UserWarning, stacklevel=4)
        return _stack(outs)


def _dims_of(obj: Any) -> Any:
    """vmap ``in_dims`` for a nest: 0 for every tensor leaf, None for everything else."""
    if isinstance(obj, Tensor):
        return 0
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_dims_of(v) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_dims_of(v) for v in obj)
    if isinstance(obj, dict):
        return {key: _dims_of(v) for key, v in obj.items()}
    return None


# ----------------------------------------------------------------------------- losses


def _as_losses(values: Any, m: int, what: str) -> Tensor:
    """``(m,)`` losses in their own precision: float64 stays float64, anything else becomes float32."""
    t = values if isinstance(values, Tensor) else torch.as_tensor(values)
    if t.numel() != m:
        raise FitnessError(f"`loss_fn` must return one number per member ({m} in all), got {what} of shape "
                           f"{tuple(t.shape)}; reduce the loss to a scalar inside loss_fn")
    if t.is_complex() or not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise FitnessError(f"`loss_fn` must return real numbers, got dtype {t.dtype}")
    return t.reshape(m).to(torch.float64 if t.dtype == torch.float64 else torch.float32)


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
        if not isinstance(value, Tensor):
            try:
                value = torch.tensor(float(value), dtype=torch.float64)
            except (TypeError, ValueError):
                raise FitnessError(f"`loss_fn` must return a number, got {type(value).__name__} for member {i}") from None
        values.append(_as_losses(value, 1, f"member {i}'s loss").detach().cpu())
    dtype = torch.float64 if any(v.dtype == torch.float64 for v in values) else torch.float32
    return torch.cat([v.to(dtype) for v in values])
