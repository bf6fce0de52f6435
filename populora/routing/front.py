"""The routed-model front end: which individual each row goes to, and the layout of what comes back.

Every routed model in populora (a :class:`~populora.Population`, the
individuals an :class:`~populora.EggrollES` generation hands out) runs the
user's model ONCE per call, each row through its own individual's low-rank
delta (applied inside the target layers by :mod:`populora.router`). They
share this one front end (:class:`RoutedModel`): the same routing arguments,
checked by one function (:func:`parse_route`), the same layouts, run by one
function (:func:`run_route`); a later ``route()`` / ``generate()`` belongs
on :class:`RoutedModel` too.

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
defaults to ``split=False`` (the seed README's ``(P*b, ...)``); the ES
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
forward sees ``k`` times the routed rows, HF's ``(b k)`` expansion);
``generate`` runs one ``model.generate`` call in such a block.

Ids may be Python ints, NumPy integers or integer tensors (``individuals``
also a NumPy array). An empty batch routes in every layout and gives
``(0, ..)`` outputs, as the base model does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from populora.checks import check_bool, check_index
from populora.errors import RouteError
from populora.routing import router as router_module
from populora.routing.router import Adapter, Route, Router, _Origin, gather_budget
from populora.routing.rows import (
    NOT_BATCH_FIRST,
    _batch_first,
    _check_range,
    _expand,
    _host_ids,
    _keeps_order,
    _leaves,
    _plan,
    map_tensors,
    split_rows,
)

__all__ = [
    "NOT_BATCH_FIRST",
    "Adapter",
    "Route",
    "RouteRequest",
    "RoutedModel",
    "Router",
    "RoutingTarget",
    "gather_budget",
    "map_tensors",
    "parse_route",
    "routed_call",
    "run_route",
    "run_single",
]


class RoutingTarget(NamedTuple):
    """What a routed forward runs: the model, its router, the adapters and how many individuals they hold.

    Attributes:
        model: the user's model (its target layers wrapped by ``router``).
        router: the :class:`~populora.router.Router` on ``model``.
        adapters: one :class:`~populora.router.Adapter` per target, stacked over ``num`` individuals.
        num: ``P``, individuals in the stacks (ids are in ``[0, num)``).
        device: where inputs are moved (``None``: left where they are).
    """

    model: nn.Module
    router: Router
    adapters: Sequence[Adapter]
    num: int
    device: torch.device | None = None


class RouteRequest(NamedTuple):
    """The routing arguments of one call, checked (see the module docstring for their meaning).

    Attributes:
        individual: the one id (``individual=``), or ``None``.
        ids: ``(m,)`` integer ids of ``individuals=`` (range checked when the route is planned), or ``None``.
        all_individuals: route to every individual.
        broadcast: every routed individual sees the whole batch.
        split: tensor outputs come back ``(m, b, ...)`` instead of ``(m*b, ...)``.
        per_individual: inputs are ``(m, b, ...)``, one block per routed individual.
    """

    individual: int | None = None
    ids: np.ndarray | None = None
    all_individuals: bool = False
    broadcast: bool = False
    split: bool = False
    per_individual: bool = False

    @property
    def routed(self) -> bool:
        """Whether any routing argument was given (else: the plain base model)."""
        return self.individual is not None or self.ids is not None or self.all_individuals


def parse_route(
    num: int,
    *,
    individual: Any = None,
    individuals: Any = None,
    all_individuals: Any = False,
    broadcast: Any = False,
    split: Any = False,
    per_individual: Any = False,
) -> RouteRequest:
    """Check the routing arguments of a call to a routed model with ``num`` individuals; nothing runs.

    Raises:
        InvalidIndexError: ``individual`` out of ``[0, num)`` (no negative wrap-around).
        InvalidTypeError: an id that is not an integer (floats, bools, strings), ids that are
            not a list / array / tensor, or a flag that is not a bool.
        InvalidValueError: ``individuals`` that is not 1-D.
        RouteError: conflicting arguments (named).
    """
    if torch.compiler.is_compiling():  # host-side checks of Python / NumPy values: eagerly, outside the graph
        return _parse_route_eager(
            num,
            individual=individual,
            individuals=individuals,
            all_individuals=all_individuals,
            broadcast=broadcast,
            split=split,
            per_individual=per_individual,
        )
    all_individuals = check_bool("all_individuals", all_individuals)
    broadcast = check_bool("broadcast", broadcast)
    split = check_bool("split", split)
    per_individual = check_bool("per_individual", per_individual)
    given = [individual is not None, individuals is not None, all_individuals]
    if sum(given) > 1:
        raise RouteError(
            "pass at most one of `individual=`, `individuals=` and `all_individuals=True`, got "
            + ", ".join(name for name, g in zip(("individual", "individuals", "all_individuals"), given) if g)
        )
    if broadcast and not (all_individuals or individuals is not None):
        raise RouteError("`broadcast=True` needs `all_individuals=True` or `individuals=`")
    if per_individual and not (all_individuals or individuals is not None):
        raise RouteError(
            "`per_individual=True` needs `all_individuals=True` or `individuals=` (with "
            "`individual=` the inputs are that individual's own batch)"
        )
    if per_individual and broadcast:
        raise RouteError(
            "`per_individual=True` gives each individual its own rows: it cannot be combined with `broadcast=True`"
        )
    if individual is not None:
        if isinstance(individual, Tensor) and individual.dim() and individual.numel() == 1:
            individual = individual.reshape(())
        individual = check_index("individual", individual, num)
    ids = None if individuals is None else _host_ids(individuals)
    return RouteRequest(individual, ids, all_individuals, broadcast, split, per_individual)


@torch.compiler.disable
def _parse_route_eager(num: int, **routing: Any) -> RouteRequest:
    """:func:`parse_route`, run eagerly under torch.compile; the ids come back as a CPU int64 tensor (a graph
    input: new id values reuse the graph; a NumPy array would be traced, and under ``inference_mode`` its
    guards break)."""
    request = parse_route(num, **routing)
    if request.ids is None:
        return request
    return request._replace(ids=torch.from_numpy(np.ascontiguousarray(request.ids, dtype=np.int64)))


def run_route(target: RoutingTarget, request: RouteRequest, args: tuple, kwargs: dict) -> Any:
    """Run ``target.model(*args, **kwargs)`` once with every row routed as ``request`` says.

    Raises:
        InvalidIndexError: an id out of ``[0, num)``.
        RouteError: a batch size that does not fit the layout (both sizes are named), per-individual
            inputs that do not lead with ``m``, or inputs whose feature size does not fit a target
            Linear (the message counts the rows passed, not the rows a broadcast repeated them to).
            Any other error of the model in a broadcast forward gets a note naming the rows passed.
    """
    model, router, adapters, num, device = target
    individual, ids, all_individuals = request.individual, request.ids, request.all_individuals
    if request.per_individual:
        args, kwargs = split_rows((args, kwargs), num if all_individuals else len(ids))
    leaves = _leaves((args, kwargs))
    if device is not None and any(t.device != device for t in leaves):
        non_blocking = device.type == "cuda"  # host -> device only: a device -> host copy must be synchronous
        args, kwargs = map_tensors((args, kwargs), lambda t: t.to(device, non_blocking=non_blocking))
        leaves = _leaves((args, kwargs))
    if individual is None and ids is None and not all_individuals:
        return model(*args, **kwargs)

    n_in, on_batch = _batch_first(leaves, kwargs)
    dev = device if device is not None else leaves[0].device
    perm = None
    times, how = 1, ""  # the route's rows are `times` copies of the user's batch
    if individual is not None:
        route = (
            _one_route_eager(n_in, individual, dev)
            if torch.compiler.is_compiling()
            else Route(n=n_in, groups=1, chunk=n_in, index=slice(individual, individual + 1))
        )
    elif all_individuals:
        if (n_in == 1 and not request.per_individual) or request.broadcast:
            args, kwargs = _expand((args, kwargs), num, on_batch)
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
        m = len(ids)
        expand = (n_in == 1 and not request.per_individual) or request.broadcast  # each id sees the whole batch
        if expand:
            args, kwargs = _expand((args, kwargs), m, on_batch)
            times, how = m, f"the whole batch for each of {m} ids"
        elif n_in % m if m else n_in:  # one id per row, or rows divisible by the ids (0 ids fit 0 rows)
            raise RouteError(
                f"batch of {n_in} rows does not fit {m} individual ids: pass one id per row, a single "
                f"row, a batch divisible by {m} (split (p b)), or `broadcast=True`"
            )
        repeats = n_in if expand else n_in // m if m else 0
        route, perm = _ids_plan(router, ids, repeats, num, dev, _keeps_order(model, kwargs))
        if perm is not None:  # group rows by id once for the whole forward; unsorted once at the end
            args, kwargs = map_tensors((args, kwargs), lambda t: t.index_select(0, perm) if on_batch(t) else t)

    origin = _Origin(n_in, leaves, times, how)
    try:
        out = router.run(route, adapters, model, args, kwargs, origin)
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
        m = num if all_individuals else len(ids)
        b = n // m if m else (n_in if times > 1 else 0)
        out = map_tensors(out, lambda t: t.reshape(m, b, *t.shape[1:]) if t.dim() and t.shape[0] == n else t)
    return out


def run_single(target: RoutingTarget, x: Tensor, individual: Any, individuals: Any, all_individuals: Any) -> Any:
    """:func:`run_route` of the commonest calls, ``model(x)`` for ONE batch-first tensor routed to one
    ``individual=i`` (a Python int), ``(p b)`` with ``all_individuals=True`` or one id per row with
    ``individuals=`` (an env loop's per-step forward, the forward of a fitness function), with the general
    front end's per-call Python work cut: nothing else to parse, to look for or to move. Returns
    :data:`NotImplemented` when the call is not of that form (the caller then takes the general path,
    which gives the same result).
    """
    if type(x) is not Tensor or not x.dim() or torch.compiler.is_compiling():
        return NotImplemented
    model, router, adapters, num, device = target
    if device is not None and x.device != device:
        return NotImplemented
    n = x.shape[0]
    if individual is not None:
        if type(individual) is not int or individuals is not None or all_individuals is not False:
            return NotImplemented
        i = check_index("individual", individual, num)
        return router.run(
            Route(n=n, groups=1, chunk=n, index=slice(i, i + 1)), adapters, model, (x,), None, _Origin(n, [x], 1, "")
        )
    if individuals is None:
        if all_individuals is not True or n < 2 or n % num:
            return NotImplemented
        return router.run(Route(n=n, groups=num, chunk=n // num), adapters, model, (x,), None, _Origin(n, [x], 1, ""))
    if (
        all_individuals is not False
        or n < 2
        or not isinstance(individuals, (np.ndarray, Tensor))
        or individuals.ndim != 1
        or individuals.shape[0] != n
    ):
        return NotImplemented
    ids = _host_ids(individuals)
    route, perm = _ids_plan(router, ids, 1, num, x.device, _keeps_order(model, {}))
    if perm is not None:
        x = x.index_select(0, perm)
    out = router.run(route, adapters, model, (x,), None, _Origin(n, [x], 1, ""))
    return out if perm is None else _unpermute(out, perm, n)


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


@torch.compiler.disable
def _one_route_eager(n: int, individual: int, device: torch.device) -> Route:
    """Under torch.compile, the route of ``individual=i`` with ``i`` in a tensor (one graph for every ``i``)."""
    return Route(n=n, groups=1, chunk=n, index=torch.tensor([individual], device=device))


def _ids_plan(
    router: Router,
    ids: np.ndarray,
    repeats: int,
    num: int,
    device: torch.device,
    keep: bool,
) -> tuple[Route, Tensor | None]:
    """The route of ``individuals=ids`` (each repeated ``repeats`` times) and the row permutation, if any.

    The plan is data-dependent host work: it runs eagerly under
    ``torch.compile`` (the compiled graphs take the route's index tensors as
    inputs, so new id values of the same group sizes reuse them). The last
    plan is cached on the router: an env loop routing the same ids every
    timestep plans once.
    """
    if torch.compiler.is_compiling():
        return _ids_plan_eager(router, ids, repeats, num, device, keep)
    if isinstance(ids, Tensor):  # (under torch.compile the request holds the ids as a tensor)
        ids = ids.numpy()
    key = (ids.dtype, ids.tobytes(), repeats, num, device, keep, router_module.GROUPED_MM)  # (the layout depends on it)
    if router.last_plan is not None and router.last_plan[0] == key:  # same rows as last call (env loops)
        return router.last_plan[1]
    plan = _plan(np.repeat(_check_range(ids, num), repeats), num, device, keep_order=keep)
    router.last_plan = (key, plan)
    return plan


_ids_plan_eager = torch.compiler.disable(_ids_plan)


def routed_call(
    model: nn.Module,
    router: Router,
    adapters: Sequence[Adapter],
    num: int,
    args: tuple,
    kwargs: dict,
    *,
    individual: int | None = None,
    individuals: Sequence[int] | Tensor | None = None,
    all_individuals: bool = False,
    broadcast: bool = False,
    split: bool = False,
    per_individual: bool = False,
    device: torch.device | None = None,
) -> Any:
    """Run ``model(*args, **kwargs)`` once with every row routed to its individual.

    :func:`parse_route` then :func:`run_route`; the arguments and layouts are
    described in the module docstring. Nothing runs and nothing moves when an
    argument is bad.
    """
    request = parse_route(
        num,
        individual=individual,
        individuals=individuals,
        all_individuals=all_individuals,
        broadcast=broadcast,
        split=split,
        per_individual=per_individual,
    )
    return run_route(RoutingTarget(model, router, adapters, num, device), request, args, kwargs)


class RoutedModel:
    """The front end of a routed model, shared by :class:`~populora.Population` and the ES individuals.

    A subclass says what it routes through (:meth:`_routing_target`) and,
    when it evaluates some individuals another way, overrides
    :meth:`_run_route`; the routing arguments, their checks and the layouts
    (module docstring) are this class's, so every routed model takes the
    same arguments and returns the same layouts. The LLM front end is here
    too: :meth:`route` (a block routing every forward made inside it) and
    :meth:`generate` (one ``model.generate`` call for a population); their
    implementation is in :mod:`populora.llm` (imported on first use).
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
        """The target of a ``route()`` block / ``generate()``, after the object's own liveness check."""
        for check in ("_check_alive", "_check_current"):  # Population: not merged; ES individuals: not stale
            if callable(fn := getattr(self, check, None)):
                fn()
        if getattr(self, "_fallback", None) is not None:  # ES individuals with unroutable perturbed parameters
            raise RouteError(
                "route() / generate() need every evolved parameter routed (nn.Linear / nn.Embedding): "
                "this ES also perturbs parameters evaluated by the per-individual fallback; "
                "freeze them (e.g. norm weights) to generate"
            )
        return self._routing_target()

    def route(self, *, individual: Any = None, individuals: Any = None, all_individuals: bool = False) -> Any:
        """A block routing every forward of the model made inside it: ``with pop.route(individuals=ids) as route:``.

        Every forward reaching a target layer inside the block
        (``model.generate``, a decode loop, a value head) must see ``k`` times
        the routed rows (``k = 1``, or the ``(b k)`` expansion of
        ``num_return_sequences`` / beams): ``individuals=ids`` routes row ``j``
        to ``ids[j]``; ``all_individuals=True`` is ``individuals=range(P)``
        (a batch laid out ``(p b)`` is its ``b``-fold expansion);
        ``individual=i`` routes any number of rows to ``i``. Rows are never
        permuted, so a KV cache stays in the caller's order. A loop that drops
        or reorders rows calls ``route.select_(rows)`` and reorders its cache
        the same way (:mod:`populora.llm.route` has an example). The block undoes
        the routing on exit, even on error; blocks do not nest, and the
        routed model cannot be called inside one.

        Returns:
            a :class:`~populora.llm.route.RouteBlock` (a context manager).

        Raises:
            RouteError: no or conflicting routing arguments; on entry, another routed
                forward already running on the model; inside, a forward whose row
                count is not ``k`` times the routed rows (both named).
            InvalidIndexError: an id out of ``[0, P)``.
        """
        from populora.routing.block import RouteBlock

        target = self._block_target()
        request = parse_route(
            target.num, individual=individual, individuals=individuals, all_individuals=all_individuals
        )
        return RouteBlock(target, request)

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
            See :func:`populora.llm.generate.generate`.

        Raises:
            RouteError: no routing argument, or ``individuals=`` with other than one id per row.
        """
        from populora.routing.generate import generate

        target = self._block_target()
        request = parse_route(
            target.num, individual=individual, individuals=individuals, all_individuals=all_individuals
        )
        return generate(target, request, input_ids, attention_mask, generator=generator, split=split, **generate_kwargs)
