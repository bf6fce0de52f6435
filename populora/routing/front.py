"""The routed-model front end: which individual each row goes to, and the layout of what comes back.

Every routed model in populora (a :class:`~populora.Population`, the
individuals an :class:`~populora.EggrollES` generation hands out) runs the
user's model ONCE per call, each row through its own individual's low-rank
delta (applied inside the target layers by :mod:`populora.routing.router`).
They share this one front end (:class:`RoutedModel`): the same routing
arguments, checked by one function
(:func:`~populora.routing.request.parse_route`), the same layouts, run by one
function (:func:`run_route`), whose first branch is the commonest call (one
batch-first tensor); ``route()`` and ``generate()`` are on
:class:`RoutedModel` too.

Routing arguments (at most one of the first three; none = the plain base model):

- ``individual=i``: every row through individual ``i``; inputs and outputs
  keep their ``(b, ...)`` shape (``split`` does not apply).
- ``all_individuals=True``: a 1-row batch (or any batch with
  ``broadcast=True``) is seen by each of the ``P`` individuals; otherwise
  ``n`` must be divisible by ``P`` and row block ``i`` (``b = n / P`` rows,
  layout ``(p b)``) goes to individual ``i``.
- ``individuals=ids`` (``m`` ids, any order, repeats allowed): ``len(ids)``
  rows give one id per row; a 1-row batch (or ``broadcast=True``) is seen by
  each id; ``n`` divisible by ``m`` is split ``(p b)``. Outputs come back in
  input order.
- ``broadcast=True``: every individual routed sees the whole batch, whatever
  its size (shape alone never decides).
- ``per_individual=True``: inputs are ``(m, b, ...)``, block ``j`` for the
  ``j``-th individual routed (``P`` with ``all_individuals``); they are
  routed as ``(m b)`` rows (no broadcast).

Output layout: the model's outputs are ``(m*b, ...)`` rows laid out ``(p b)``
(a routed model is a drop-in for the model: its outputs keep the batch as
their leading dim), ``m`` the individuals routed. With ``split=True`` every
tensor output whose leading dim is that row count comes back as
``(m, b, ...)``, block ``j`` the ``j``-th individual's. ``Population``
defaults to ``split=False`` (``(P*b, ...)`` rows, a drop-in for the model); the ES
individuals default to ``split=True`` (torcheggroll's ``(N, b, ...)``): the
same implementation, a different default.

Batch-first inputs: keyword arguments named in :data:`NOT_BATCH_FIRST`
(``cache_position``, ``(T,)`` in Hugging Face models) and 0-d tensors are
never batch-first; the batch size ``n`` is the largest leading dim of the
other tensor inputs, and a tensor leading with 1 while ``n > 1`` (e.g.
``position_ids (1, T)``) broadcasts over the batch. Only batch-first tensors
are expanded or permuted; the others are passed unchanged; any other leading
dim raises ("tensor inputs disagree on the batch size").

KV caches: ``individuals=`` in any order is normally run with the rows
grouped by id (one permutation of the inputs, undone on the tensor outputs).
A cache object (``past_key_values=``) is opaque to that permutation, so when
a cache is passed or made (``past_key_values`` / ``cache`` given,
``use_cache=True``, or ``model.config.use_cache`` true: Hugging Face
models) the rows stay in input order and each target packs its rows by id
instead: the returned cache is in input order, and a decode loop keeps ids
and cache together by reordering both the same way (``ids[keep]`` and
``cache.batch_select_indices(keep)``).

``route()`` / ``generate()`` (:class:`RoutedModel`): a ``with pop.route(...)``
block routes every forward of the model made inside it (no broadcast: each
forward sees ``k`` times the routed rows, HF's ``(b k)`` expansion;
:mod:`populora.routing.block`); ``generate`` runs one ``model.generate`` call
in such a block (:mod:`populora.routing.generate`).

Ids may be Python ints, NumPy integers or integer tensors (``individuals``
also a NumPy array). An empty batch routes in every layout and gives
``(0, ..)`` outputs, as the base model does.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
from torch import Tensor

from populora.errors import RouteError
from populora.routing.block import RouteBlock
from populora.routing.eager import outside_graph
from populora.routing.generate import generate
from populora.routing.plan import PLANNER
from populora.routing.recompute import follow_checkpointing
from populora.routing.request import NOT_ROUTED, RouteRequest, RoutingTarget, parse_route
from populora.routing.route import Origin, Route
from populora.routing.rows import BASE, batch_first, expand, keeps_order, leaves, map_tensors, split_rows

__all__ = ["RoutedModel", "run_route"]


def run_route(target: RoutingTarget, request: RouteRequest, args: tuple, kwargs: dict) -> Any:
    """Run ``target.model(*args, **kwargs)`` once with every row routed as ``request`` says.

    Raises:
        InvalidIndexError: an id out of ``[0, num)``.
        RouteError: a batch size that does not fit the layout (both sizes are named), per-individual
            inputs that do not lead with ``m``, or inputs whose feature size does not fit a target
            Linear (the message counts the rows passed, not the rows a broadcast repeated them to).
            Any other error of the model in a broadcast forward gets a note naming the rows passed.
    """
    if len(args) == 1 and not kwargs and not (request.broadcast or request.per_individual or request.split):
        out = _run_one_tensor(target, request, args[0])  # the commonest call: model(x), one routing argument
        if out is not NotImplemented:
            return out
    return _run_general(target, request, args, kwargs)


def _run_general(target: RoutingTarget, request: RouteRequest, args: tuple, kwargs: dict) -> Any:
    """:func:`run_route` for any inputs: nested tensors, broadcast, per-individual blocks, split outputs."""
    model, router, adapters, num, device = target
    individual, ids, all_individuals = request.individual, request.ids, request.all_individuals
    m = num if all_individuals else 0 if ids is None else len(ids)  # the individuals routed (with ids or all)
    if request.per_individual:
        args, kwargs = split_rows((args, kwargs), m)
    tensors = leaves((args, kwargs))
    if device is not None and any(t.device != device for t in tensors):
        non_blocking = device.type == "cuda"  # host -> device only: a device -> host copy must be synchronous
        args, kwargs = map_tensors((args, kwargs), lambda t: t.to(device, non_blocking=non_blocking))
        tensors = leaves((args, kwargs))
    if (individual is None or individual == BASE) and ids is None and not all_individuals:
        return model(*args, **kwargs)

    n_in, on_batch = batch_first(tensors, kwargs)
    dev = device if device is not None else tensors[0].device
    perm = None
    times, how = 1, ""  # the route's rows are `times` copies of the user's batch
    if individual is not None:
        route = _one_route(n_in, individual, dev)
    elif all_individuals:
        if (n_in == 1 and not request.per_individual) or request.broadcast:
            args, kwargs = expand((args, kwargs), num, on_batch)
            route = Route(n=num * n_in, groups=num, chunk=n_in)
            times, how = num, f"the whole batch for each of {num} individuals"
        elif n_in % num == 0:
            route = Route(n=n_in, groups=num, chunk=n_in // num)
        else:
            raise RouteError(
                f"batch of {n_in} rows cannot be split among pop_size={num} individuals; pass a batch "
                f"divisible by {num} (rows laid out (p b)), a single row, or `broadcast=True` to give "
                "every individual the whole batch"
            )
    else:
        assert ids is not None  # (parse_route: exactly one of individual, ids, all_individuals is set)
        whole = (n_in == 1 and not request.per_individual) or request.broadcast  # each id sees the whole batch
        if whole:
            args, kwargs = expand((args, kwargs), m, on_batch)
            times, how = m, f"the whole batch for each of {m} ids"
        elif not m and n_in:
            raise RouteError(
                f"`individuals=` is empty (0 ids), but the batch has {n_in} rows: empty ids route only an "
                "empty batch (a single row, or `broadcast=True`, gives 0 rows); pass one id per row"
            )
        elif m and n_in % m:  # one id per row, or rows divisible by the ids
            raise RouteError(
                f"batch of {n_in} rows does not fit {m} individual ids of `individuals=`: pass one id per row, "
                f"a single row, a batch divisible by {m} (split (p b)), or `broadcast=True`"
            )
        repeats = n_in if whole else n_in // m if m else 0
        route, perm = _plan_ids(ids, repeats, num, dev, keeps_order(model, kwargs))
        if perm is not None:  # group rows by id once for the whole forward; unsorted once at the end
            args, kwargs = map_tensors((args, kwargs), lambda t: t.index_select(0, perm) if on_batch(t) else t)

    origin = Origin(n_in, tensors, times, how)
    if model.training and torch.is_grad_enabled():
        follow_checkpointing(model, router)
    try:
        out = model(*args, **kwargs) if _all_base(route) else router.run(route, adapters, model, args, kwargs, origin)
    except Exception as error:
        if times > 1 and hasattr(error, "add_note") and not isinstance(error, RouteError):
            error.add_note(
                f"populora: this routed forward ran the model on {route.n} rows, {origin.how}: the "
                f"batch passed has {n_in} rows (first input of shape {origin.shape()}), so row counts "
                "above count the repeated rows"
            )
        raise
    n = route.n
    if perm is not None:
        out = _unpermute(out, perm, n)
    if request.split and individual is None:
        b = n // m if m else (n_in if times > 1 else 0)
        out = map_tensors(out, lambda t: t.reshape(m, b, *t.shape[1:]) if t.dim() and t.shape[0] == n else t)
    return out


def _run_one_tensor(target: RoutingTarget, request: RouteRequest, x: Any) -> Any:
    """:func:`run_route`'s first branch: ``model(x)`` for ONE batch-first tensor on the target's device, routed
    to ``individual=i``, ``(p b)`` with ``all_individuals`` or one id per row with ``individuals=`` (an env
    loop's step, a fitness function's forward), with nothing else to look for or move. Returns
    :data:`NotImplemented` for any other call (the general path then gives the same result)."""
    if type(x) is not Tensor or not x.dim() or torch.compiler.is_compiling():
        return NotImplemented
    model, router, adapters, num, device = target
    if device is not None and x.device != device:
        return NotImplemented
    n = x.shape[0]
    if request is NOT_ROUTED:  # routing off: the model itself
        return model(x)
    if request.individual is not None:
        if request.individual == BASE:
            return model(x)
        route = _one_route(n, request.individual, x.device)
    elif request.all_individuals:
        if n < 2 or n % num:  # (a single row is every individual's: the general path broadcasts it)
            return NotImplemented
        route = Route(n=n, groups=num, chunk=n // num)
    elif request.ids is not None and n >= 2 and request.ids.shape[0] == n:
        route, perm = _plan_ids(request.ids, 1, num, x.device, keeps_order(model, {}))
        if _all_base(route):
            return model(x)
        if perm is not None:
            if model.training and torch.is_grad_enabled():
                follow_checkpointing(model, router)
            out = router.run(route, adapters, model, (x.index_select(0, perm),), None, Origin(n, [x], 1, ""))
            return _unpermute(out, perm, n)
    else:
        return NotImplemented
    if model.training and torch.is_grad_enabled():
        follow_checkpointing(model, router)
    return router.run(route, adapters, model, (x,), None, Origin(n, [x], 1, ""))


def _all_base(route: Route) -> bool:
    """Whether every row of ``route`` is :data:`~populora.routing.rows.BASE`'s and no graph is recorded: the
    plain model's forward is then the routed one, bitwise (with grad, the routed forward runs, so that the
    adapters get their zero gradients)."""
    base = route.base_rows
    return base is not None and base.shape[0] == route.n and not torch.is_grad_enabled()


def _one_route(n: int, individual: int, device: torch.device) -> Route:
    """The route of ``individual=i``: one group of every row."""
    if torch.compiler.is_compiling():
        return _one_route_eager(n, individual, device)
    return Route(n=n, groups=1, chunk=n, index=slice(individual, individual + 1))


@outside_graph
def _one_route_eager(n: int, individual: int, device: torch.device) -> Route:
    """Under torch.compile, the route of ``individual=i`` with ``i`` in a tensor (one graph for every ``i``)."""
    return Route(n=n, groups=1, chunk=n, index=torch.tensor([individual], device=device))


def _plan_ids(
    ids: np.ndarray | Tensor, repeats: int, num: int, device: torch.device, keep: bool
) -> tuple[Route, Tensor | None]:
    """:meth:`Planner.plan_ids <populora.routing.plan.Planner.plan_ids>` of :data:`~populora.routing.plan.PLANNER`;
    data-dependent host work, run eagerly under ``torch.compile`` (the compiled graphs take the route's index
    tensors as inputs, so new id values of the same group sizes reuse them)."""
    if torch.compiler.is_compiling():
        return _plan_ids_eager(ids, repeats, num, device, keep)
    return PLANNER.plan_ids(ids, repeats, num, device, keep)


@outside_graph
def _plan_ids_eager(
    ids: np.ndarray | Tensor, repeats: int, num: int, device: torch.device, keep: bool
) -> tuple[Route, Tensor | None]:
    return PLANNER.plan_ids(ids, repeats, num, device, keep)


def _unpermute(out: Any, perm: Tensor, n: int) -> Any:
    """Every tensor output of ``n`` rows back in input order: row ``perm[j]`` gets the ``j``-th row."""
    # (an output may sit on another device than the inputs: a model spread by device_map)
    return map_tensors(
        out,
        lambda t: (
            torch.empty_like(t).index_copy_(0, perm if perm.device == t.device else perm.to(t.device), t)
            if t.dim() and t.shape[0] == n
            else t
        ),
    )


class RoutedModel:
    """The front end of a routed model, shared by :class:`~populora.Population` and the ES individuals.

    A subclass says what it routes through (:meth:`_routing_target`) and,
    when it evaluates some individuals another way, overrides
    :meth:`_run_route`; the routing arguments, their checks and the layouts
    (module docstring) are this class's, so every routed model takes the
    same arguments and returns the same layouts. The LLM front end is here
    too: :meth:`route` (a block routing every forward made inside it) and
    :meth:`generate` (one ``model.generate`` call for a population); their
    implementation is in :mod:`populora.routing.block` and :mod:`populora.routing.generate`.
    """

    def _routing_target(self) -> RoutingTarget:
        """The model, router and adapters a call routes through."""
        raise NotImplementedError

    def _route(self, args: tuple, kwargs: dict, *, target: RoutingTarget | None = None, **routing: Any) -> Any:
        """Check the routing arguments (``individual``, ``individuals``, ``all_individuals``, ``broadcast``,
        ``split``, ``per_individual``), then run one routed forward over ``target`` (default
        :meth:`_routing_target`)."""
        target = self._routing_target() if target is None else target
        return self._run_route(target, parse_route(target.num, **routing), args, kwargs)

    def _run_route(self, target: RoutingTarget, request: RouteRequest, args: tuple, kwargs: dict) -> Any:
        return run_route(target, request, args, kwargs)

    def _block_target(self) -> RoutingTarget:
        """The target of a ``route()`` block / ``generate()``; a subclass raises here when it cannot route
        every forward (merged, stale, or evaluated another way)."""
        return self._routing_target()

    def route(self, *, individual: Any = None, individuals: Any = None, all_individuals: bool = False) -> Any:
        """A block routing every forward of the model made inside it: ``with pop.route(individuals=ids) as route:``.

        Freshness: weights written inside the block, between two of its forwards, are not seen until the block
        is re-entered (without grad, merged weights and gathered adapters are made at the entry's first
        forward and dropped at its exit: :mod:`populora.routing.prepared`); any write before an entry is seen.

        Every forward reaching a target layer inside the block
        (``model.generate``, a decode loop, a value head) must see ``k`` times
        the routed rows (``k = 1``, or the ``(b k)`` expansion of
        ``num_return_sequences`` / beams): ``individuals=ids`` routes row ``j``
        to ``ids[j]``; ``all_individuals=True`` is ``individuals=range(P)``
        (a batch laid out ``(p b)`` is its ``b``-fold expansion);
        ``individual=i`` routes any number of rows to ``i``. Rows are never
        permuted, so a KV cache stays in the caller's order. A loop that drops
        or reorders rows calls ``route.select_(rows)`` and reorders its cache
        the same way (:mod:`populora.routing.block` has an example). The block undoes
        the routing on exit, even on error; blocks do not nest, and the
        routed model cannot be called inside one.

        Returns:
            a :class:`~populora.routing.block.RouteBlock` (a context manager).

        Raises:
            RouteError: no or conflicting routing arguments; on entry, another routed
                forward already running on the model; inside, a forward whose row
                count is not ``k`` times the routed rows (both named).
            InvalidIndexError: an id out of ``[0, P)``.
        """
        target = self._block_target()
        request = parse_route(
            target.num, individual=individual, individuals=individuals, all_individuals=all_individuals
        )
        return RouteBlock(target, request)

    def prepared_scope(self) -> contextlib.AbstractContextManager:
        """A scope in which routed forwards without grad keep prepared work (merged weights, gathered adapters)
        across calls: ``with pop.prepared_scope(): ...``.

        Weights written inside the scope, between two of its forwards, are not seen until it is left (the
        forwards may use what an earlier one prepared); everything prepared is dropped on exit, even on error.
        Open it only around work that writes no weight: the library opens one around each environment
        evaluation. Outside any scope (and any route block), a routed call reads the weights as they are.
        Scopes nest. For a routed model without prepared work, a scope that does nothing.
        """
        prepared = self._routing_target().router.prepared
        return contextlib.nullcontext() if prepared is None else prepared.scope()

    def generate(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        individual: Any = None,
        individuals: Any = None,
        all_individuals: bool = False,
        generator: torch.Generator | None = None,
        split: bool = False,
        **generate_kwargs: Any,
    ) -> Any:
        """ONE ``model.generate`` call for the whole population, every prompt row routed to its individual.

        Args:
            input_ids: ``(b, T)`` prompts (left padded, with ``attention_mask``).
            attention_mask: ``(b, T)`` or ``None``.
            individual: every prompt through individual ``i``.
            individuals: ``(b,)`` one id per prompt row (any order, repeats allowed).
            all_individuals: every individual gets every prompt: rows ``(p b)``.
            generator: makes sampling reproducible from its seed (the global RNG is forked, not advanced).
            split: with ``all_individuals``, outputs ``(p, b*k, ...)`` instead of ``(p b k, ...)``.
            **generate_kwargs: for ``model.generate`` (``max_new_tokens``, ``do_sample``,
                ``num_beams``, ``num_return_sequences``, ``return_dict_in_generate``, ...).

        Returns:
            What ``model.generate`` returns, rows ``(b k)`` in prompt order
            (``k = num_return_sequences``), or ``(p b k)`` with ``all_individuals``.
            See :func:`populora.routing.generate.generate`.

        Raises:
            RouteError: no routing argument, or ``individuals=`` with other than one id per row.
        """
        target = self._block_target()
        request = parse_route(
            target.num, individual=individual, individuals=individuals, all_individuals=all_individuals
        )
        return generate(target, request, input_ids, attention_mask, generator=generator, split=split, **generate_kwargs)
