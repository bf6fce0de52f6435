"""The individuals of one ES generation, run through the routed forward, and per-individual losses.

:class:`Individuals` is what :meth:`~populora.EggrollES.ask` returns: calling
it runs the model ONCE with every row routed to its individual's perturbation,
through the routed-model front end every routed model shares
(:mod:`populora.routing`). :func:`individual_losses` calls a user's
``loss_fn(outputs, targets)`` once per individual, vectorised with
``torch.func.vmap`` and falling back to a Python loop when the function is
not vmap-safe.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from populora.adapters import Adapter
from populora.errors import ESStateError, FitnessError, RouteError
from populora.es.fold import folded_apply
from populora.es.shared import shared_rows_linear
from populora.routing.front import RoutedModel, run_route
from populora.routing.request import RouteRequest, RoutingTarget
from populora.routing.route import Route
from populora.routing.router import Activation, Router
from populora.routing.rows import check_range, map_tensors, split_rows

__all__ = ["ESRouter", "ESStateError", "Fallback", "Individuals", "individual_losses", "map_tensors"]


MEMBER_ROUTE = Route(n=-1, groups=1, chunk=-1)
"""The route of the fallback forward: every row belongs to ONE member whose adapters are given unstacked."""


class ESRouter(Router):
    """The routing layer, plus the one-member mode the fallback forward uses (vmap-safe).

    Under :data:`MEMBER_ROUTE` the adapters are one member's: ``down (r, d)``
    (``(V, r)`` for an Embedding), ``up (r, e)``, ``bias (e,)``, possibly
    batched by ``torch.func.vmap`` over members; the delta is added out of place.
    Under an ordinary route, an ``nn.Linear`` whose ``up`` and bias noise are
    views of one folded stack reads it in place (:func:`~populora.es.fold.folded_apply`).
    """

    share_rows: bool = True
    """Compute the first target layer of a shared-batch forward once for all members (:mod:`populora.es.shared`)."""

    def layer_forward(self, i: int, inner: Callable, module: nn.Module, input: Tensor) -> Tensor:
        active = self.active
        if (
            active is not None
            and self.share_rows
            and not active.called
            and isinstance(active.route, Route)
            and active.origin.times > 1
        ):  # the forward's first target, rows repeated
            origin = active.origin
            out = shared_rows_linear(module, inner, input, active.route, active.adapters[i], origin.times, origin.rows)
            if out is not None:
                active.called.add(i)
                return out
        return super().layer_forward(i, inner, module, input)

    def add_delta(self, i: int, module: nn.Module, x: Tensor, out: Tensor, activation: Activation) -> Tensor:
        route, adapters, called = activation.route, activation.adapters, activation.called
        if route is not MEMBER_ROUTE:
            if isinstance(route, Route):  # an nn.Linear whose up and bias noise share one stack: read in place
                done = folded_apply(module, x, out, route, adapters[i])
                if done is not None:
                    called.add(i)
                    return done
            return super().add_delta(i, module, x, out, activation)
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


def leading_shapes(obj: Any) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []

    def record(t: Tensor) -> Tensor:
        shapes.append(tuple(t.shape))
        return t

    map_tensors(obj, record)
    return shapes


class Fallback(NamedTuple):
    """How the individuals' unroutable parameters are evaluated (see :class:`Individuals`).

    Attributes:
        values: ``ids (m,) -> {name: (m, *shape)}`` the individuals' values of the unroutable parameters.
        modes: ``{per_individual: "vmap" | "loop"}``, remembered across generations (one warning).
    """

    values: Callable[[Tensor], dict[str, Tensor]]
    modes: dict


class Individuals(RoutedModel):
    """The ``N`` perturbed individuals of one ES generation (higher fitness is better).

    Individual ``i`` computes with ``W + sigma * s_i * A_k B_k^T / sqrt(r)`` on
    every selected matrix (``k`` its pair, ``s_i = +1`` for the first half and
    ``-1`` for the second when antithetic) and ``b + sigma * s_i * eps_k`` on
    every selected bias, without any of it being materialised.

    Calling it is a routed forward: the routing arguments and layouts are
    those of every routed model (:mod:`populora.routing`), with the ES's
    defaults: no routing argument means every individual, each seeing the
    whole batch (``broadcast``: shape alone never decides), and outputs come
    back split, ``(m, b, ...)`` (``split=True``, torcheggroll's layout).

    Parameters the routed path cannot reach (a bare ``nn.Parameter`` used in
    any expression, a norm gain, a convolution kernel), when the ES perturbs
    them, are evaluated through the fallback: each individual's values are
    materialised (``(m, *shape)``, for those parameters only) and the model is
    called per individual with ``torch.func.functional_call``, vectorised over
    the individuals with ``torch.func.vmap`` (``randomness="different"``), or
    in a Python loop when the model is not vmap-safe (one warning). Inside each
    call the ``nn.Linear`` / ``nn.Embedding`` perturbations stay low rank. An
    individual's output is then whatever the model returns (``(m, ...)``
    stacked), not necessarily ``(m, b, ...)``.

    Valid until the generation is told (:meth:`~populora.EggrollES.tell`);
    calling a stale handle raises :class:`ESStateError`.

    Args:
        target: the ES's model, router and this generation's adapters (``num = N``).
        generation: the generation these individuals belong to.
        current: returns the ES's current generation (a stale handle refuses to run).
        fallback: how unroutable parameters are evaluated, or ``None`` when every
            evolved parameter is routed.

    Attributes:
        pop_size: ``N``.
        generation: the generation these individuals belong to.
    """

    def __init__(
        self, target: RoutingTarget, generation: int, current: Callable[[], int], fallback: Fallback | None = None
    ):
        self._target = target
        self.generation = generation
        self.pop_size = target.num
        self._current = current
        self._fallback = fallback

    def _routing_target(self) -> RoutingTarget:
        return self._target

    def _check_current(self) -> None:
        now = self._current()
        if now != self.generation:
            raise ESStateError(
                f"these individuals belong to generation {self.generation}, but the ES is at "
                f"generation {now}; call ask() again"
            )

    def __len__(self) -> int:
        return self.pop_size

    def __repr__(self) -> str:
        now = self._current()
        state = "current" if now == self.generation else f"stale: the ES is at generation {now}, call ask() again"
        fallback = ", unroutable parameters through the fallback" if self._fallback is not None else ""
        return (
            f"Individuals(generation={self.generation}, N={self.pop_size}, "
            f"{len(self._target.adapters)} routed layers{fallback}, {state})"
        )

    def __call__(
        self,
        *args: Any,
        individuals: Sequence[int] | Tensor | range | None = None,
        individual: int | None = None,
        per_individual: bool = False,
        split: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Run the model once over the individuals' rows.

        Inputs are tensors or nested tuples / lists / dicts of tensors, moved
        to the ES device.

        Args:
            *args, **kwargs: the model's inputs.
            individuals: the individuals to run (``m`` of them, any order); default all ``N``.
            individual: run a single individual instead: inputs and outputs keep
                their ``(b, ...)`` shape.
            per_individual: inputs are ``(m, b, ...)``, block ``j`` going to the
                ``j``-th individual; otherwise every individual sees the whole batch
                ``(b, ...)``, whatever its size.
            split: outputs ``(m, b, ...)`` (default); ``False`` gives ``(m*b, ...)``
                rows laid out ``(p b)``, as :class:`~populora.Population` returns them.

        Raises:
            ESStateError: (a ``RuntimeError``) if the generation has been told since :meth:`ask`.
            RouteError: (a ``ValueError``) per-individual inputs that do not lead with ``m``,
                conflicting arguments, or no ids.
            InvalidIndexError: (an ``IndexError``) an id outside ``[0, N)``.
        """
        self._check_current()
        if isinstance(individuals, range):
            individuals = list(individuals)
        if individuals is not None and len(individuals) == 0:
            raise RouteError("`individuals` is empty")
        one = individual is not None
        with torch.no_grad():
            return self._route(
                args,
                kwargs,
                individual=individual,
                individuals=individuals,
                all_individuals=not one and individuals is None,
                broadcast=not (one or per_individual),
                split=split,
                per_individual=per_individual,
            )

    def _run_route(self, target: RoutingTarget, request: RouteRequest, args: tuple, kwargs: dict) -> Any:
        if self._fallback is None:
            return run_route(target, request, args, kwargs)
        return _fallback_call(target, self._fallback, request, args, kwargs)


# ----------------------------------------------------------------------------- the fallback forward


def _select(adapters: Sequence[Adapter], ids: Tensor) -> list[Adapter]:
    return [_rows(a, ids) for a in adapters]


def _rows(a: Adapter, index: Tensor | int) -> Adapter:
    """The adapter's stacks indexed by ``index`` along the individual dim (a bias stays ``None``)."""

    def pick(t: Tensor) -> Tensor:
        return t[index.to(t.device) if isinstance(index, Tensor) else index]

    return Adapter(pick(a.down), pick(a.up), None if a.bias is None else pick(a.bias))


def _stack(outs: list[Any]) -> Any:
    """Stack per-individual outputs leaf by leaf: tensors along a new dim 0; other leaves as a list."""
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


def _fallback_call(target: RoutingTarget, fallback: Fallback, request: RouteRequest, args: tuple, kwargs: dict) -> Any:
    """Individuals' forwards with the unroutable parameters swapped in by ``functional_call``
    (see :class:`Individuals`); ``request`` is already checked."""
    model, router, adapters, num, device = target
    inputs = map_tensors((args, kwargs), lambda t: t.to(device))

    def forward(values: dict[str, Tensor], one_adapters: list[Adapter], inputs: tuple) -> Any:
        a, k = inputs
        return router.run(MEMBER_ROUTE, one_adapters, lambda: torch.func.functional_call(model, values, a, k))

    if request.individual is not None:
        ids = torch.tensor([request.individual])
        values = {name: v[0] for name, v in fallback.values(ids).items()}
        return forward(values, [_rows(a, 0) for a in _select(adapters, ids)], inputs)
    if request.all_individuals:
        ids = torch.arange(num)
    else:
        assert request.ids is not None, "a routed request without individual= or all individuals has ids"
        ids = torch.from_numpy(check_range(request.ids, num))
    m, per = ids.numel(), request.per_individual
    if per:
        split_rows(inputs, m, "inputs")  # checks that every tensor leads with m
    values, chosen = fallback.values(ids), _select(adapters, ids)
    out = None
    mode = fallback.modes.get(per)
    if mode != "loop":
        # vmap's in_dims mirror the arguments' structure: an Adapter of dims (ints), not of tensors
        adapter_dims = [Adapter(0, 0, None if a.bias is None else 0) for a in chosen]  # type: ignore[arg-type]
        dims = (0, adapter_dims, _dims_of(inputs) if per else None)
        try:
            out = torch.func.vmap(forward, in_dims=dims, randomness="different")(values, chosen, inputs)
            fallback.modes[per] = "vmap"
        except Exception as error:  # not vmap-safe: the loop below raises real errors itself
            vmap_error = error
    if out is None:
        outs = []
        for j in range(m):
            one_inputs = map_tensors(inputs, lambda t: t[j]) if per else inputs
            outs.append(
                forward(
                    {name: v[j] for name, v in values.items()},
                    [_rows(a, j) for a in chosen],
                    one_inputs,
                )
            )
        if mode != "loop":
            fallback.modes[per] = "loop"
            warnings.warn(
                f"the model could not be vectorised over members with torch.func.vmap "
                f"({type(vmap_error).__name__}: {str(vmap_error)[:200]}); its unroutable parameters are "
                "evaluated one member at a time",
                UserWarning,
                stacklevel=5,
            )
        out = _stack(outs)
    if request.split:
        return out
    return map_tensors(out, lambda t: t.reshape(m * t.shape[1], *t.shape[2:]) if t.dim() > 1 and t.shape[0] == m else t)


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
        raise FitnessError(
            f"`loss_fn` must return one number per member ({m} in all), got {what} of shape "
            f"{tuple(t.shape)}; reduce the loss to a scalar inside loss_fn"
        )
    if t.is_complex() or not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise FitnessError(f"`loss_fn` must return real numbers, got dtype {t.dtype}")
    return t.reshape(m).to(torch.float64 if t.dtype == torch.float64 else torch.float32)


def individual_losses(
    loss_fn: Callable[[Any, Any], Any],
    outputs: Any,
    targets: Any,
    m: int,
    *,
    per_individual_targets: bool,
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
        targets: shared (any object) or, with ``per_individual_targets``, ``(m, ...)`` tensors.
        m: number of members.
        per_individual_targets: slice ``targets`` per member too.
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
            t_dim = 0 if per_individual_targets and targets is not None else None
            values = torch.func.vmap(loss_fn, in_dims=(0, t_dim))(outputs, targets)
            losses = _as_losses(values, m, "a vmapped result").cpu()
            if cache is not None:
                cache[key] = "vmap"
            return losses
        except Exception:  # not vmap-safe: the loop below raises real errors itself
            if mode == "vmap":
                raise
    if cache is not None:
        cache[key] = "loop"
    values = []
    for i in range(m):
        out_i = map_tensors(outputs, lambda t: t[i])
        tgt_i = map_tensors(targets, lambda t: t[i]) if per_individual_targets else targets
        value = loss_fn(out_i, tgt_i)
        if not isinstance(value, Tensor):
            try:
                value = torch.tensor(float(value), dtype=torch.float64)
            except (TypeError, ValueError):
                raise FitnessError(
                    f"`loss_fn` must return a number, got {type(value).__name__} for member {i}"
                ) from None
        values.append(_as_losses(value, 1, f"member {i}'s loss").detach().cpu())
    dtype = torch.float64 if any(v.dtype == torch.float64 for v in values) else torch.float32
    return torch.cat([v.to(dtype) for v in values])
