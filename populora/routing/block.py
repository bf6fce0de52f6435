"""Route every forward made inside a block: ``with pop.route(...) as route:``.

Freshness: weights written inside the block, between two of its forwards, are not seen until the block is
re-entered. Without grad, each entry of the block (``__enter__`` to ``__exit__``) is one scope of
:mod:`populora.routing.prepared`: merged weights and gathered adapters are made from the weights as they are
at its first forward and dropped at its exit, so the next entry (and any call outside the block) reads the
weights as they are then, whatever wrote them (a fused optimizer, ``param.data``, a load).

See :meth:`~populora.routing.front.RoutedModel.route`.

A :class:`RouteBlock` keeps its model's router active from ``__enter__`` to
``__exit__``: every forward that reaches a target layer inside the block
(``model.generate``, a hand-written decode loop, a value head on the same
backbone) adds each row's individual's delta. Rows cannot be added inside
someone else's forward, so there is no broadcast: a forward must see ``k``
times the routed rows (``k = 1``, or the ``(b k)`` expansion of
``num_return_sequences`` / beams, each routed row repeated ``k`` times in
place, ``repeat_interleave``); any other row count raises
:class:`~populora.errors.RouteError` naming both sizes. Rows are never
permuted (each target packs its rows by id), so a KV cache made inside the
block stays in the caller's row order.

A decode loop that drops or reorders rows says so with
:meth:`RouteBlock.select_` and reorders its cache the same way::

    with pop.route(individuals=ids) as route:         # ids: one per prompt row
        out = model(input_ids, attention_mask=mask, use_cache=True)
        cache = out.past_key_values
        for _ in range(steps):
            ...                                       # next tokens
            keep = unfinished.nonzero().squeeze(1)    # rows of the last forward to keep
            route.select_(keep)                       # the route's rows follow them
            cache.batch_select_indices(keep)          # and so does the cache (HF DynamicCache)
            out = model(next_tokens[keep], attention_mask=mask[keep], past_key_values=cache)

Generic: any model whose target layers see the batch first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from populora.errors import InvalidIndexError, InvalidTypeError, InvalidValueError, RouteError
from populora.routing.plan import PLANNER
from populora.routing.prepared import PreparedRoutes
from populora.routing.recompute import follow_checkpointing
from populora.routing.request import RouteRequest, RoutingTarget
from populora.routing.route import Origin, Route
from populora.routing.router import Active
from populora.routing.rows import BASE, check_range

__all__ = ["RouteBlock"]


class RouteBlock:
    """The route of a ``with pop.route(...)`` block (returned by ``__enter__``).

    Weights written inside the block, between two of its forwards, are not seen until the block is re-entered
    (each entry is one scope of prepared work: the module docstring).

    Args:
        target: the model, router and adapters the block routes through.
        request: the checked routing arguments (``individual=`` / ``individuals=`` /
            ``all_individuals=True``; ``all_individuals`` is ``individuals=range(P)``,
            so a batch laid out ``(p b)`` is its ``b``-fold expansion).

    Attributes:
        ids: ``(n,)`` int64 NumPy array, the individual of each routed row (``None``
            with ``individual=``: every row, whatever their number, goes to it).
        last_rows: rows of the last forward seen in the block (``None`` before any).
    """

    def __init__(self, target: RoutingTarget, request: RouteRequest):
        if not request.routed:
            raise RouteError("route() needs one of `individual=`, `individuals=` or `all_individuals=True`")
        if request.broadcast or request.per_individual or request.split:
            raise RouteError(
                "route() takes no `broadcast=`, `per_individual=` or `split=`: rows cannot be "
                "added or reshaped inside the model's own forwards"
            )
        self._target = target
        self.individual = request.individual
        self.ids: np.ndarray | None
        if request.individual is not None:
            self.ids = None
        elif request.all_individuals or request.ids is None:  # (routed: all_individuals when no ids)
            self.ids = np.arange(target.num, dtype=np.int64)
        else:
            self.ids = check_range(request.ids, target.num)
        self.last_rows: int | None = None
        self._plans: dict[int, Route] = {}
        self._active: Active | None = None
        self._scope: PreparedRoutes | None = None  # the prepared work whose scope this entry opened

    # -- the router calls this for each target forward inside the block
    def resolve(self, rows: int, name: str) -> Route:
        """The :class:`~populora.router.Route` for a forward of ``rows`` rows (``name``: the target, for errors).

        Raises:
            RouteError: ``rows`` is not ``k`` times the routed rows (``k >= 1``; both sizes named).
        """
        plan = self._plans.get(rows)
        if plan is not None:
            self.last_rows = rows
            return plan
        device = self._device()
        if self.ids is None:
            i = self.individual
            assert i is not None  # (no ids: `individual=` routes every row)
            plan = Route(n=rows, groups=1, chunk=rows, index=slice(i, i + 1))
        else:
            n = self.ids.size
            if rows == 0 and n == 0:
                plan = Route(n=0, groups=0, chunk=0)
            elif n == 0:
                raise RouteError(
                    f"target {name!r} received {rows} rows, but this route has no routed rows (`individuals=` "
                    "was empty, or `route.select_()` kept none): only empty forwards can run inside it"
                )
            elif rows % n or rows == 0:
                raise RouteError(
                    f"target {name!r} received {rows} rows, but this route has {n} routed rows: every forward "
                    f"inside `route(...)` must see k * {n} rows (k = 1, or num_return_sequences / num_beams, "
                    "each row repeated k times in place); a loop that drops or reorders rows calls "
                    "`route.select_(rows)` first"
                )
            else:
                plan, _ = PLANNER.plan(np.repeat(self.ids, rows // n), self._target.num, device, keep_order=True)
        self._plans[rows] = plan
        self.last_rows = rows
        return plan

    def _device(self) -> torch.device:
        if self._target.device is not None:
            return self._target.device
        adapters = self._target.adapters
        return adapters[0].down.device if len(adapters) else torch.device("cpu")

    def select_(self, rows: Any) -> RouteBlock:
        """Keep (and reorder) rows: the next forwards see the rows ``rows`` of the last forward, in that order.

        ``rows`` indexes the rows of the last forward made in the block (its
        ``k * n`` rows; before any forward, the ``n`` routed rows): a 1-D
        integer list / array / tensor (repeats allowed) or a boolean mask of
        that length. The routed rows become those rows (``k`` starts again at
        1). Reorder the KV cache with the same indices (HF:
        ``cache.batch_select_indices(rows)`` or ``cache.reorder_cache(rows)``).
        With ``individual=`` every row goes to the same individual: nothing to do.

        Raises:
            InvalidTypeError: non-integer indices.
            InvalidIndexError: an index outside the rows of the last forward.
        """
        if self.ids is None:
            return self
        current = (
            self.ids
            if self.last_rows is None or self.ids.size == 0
            else np.repeat(self.ids, self.last_rows // self.ids.size)
        )
        if isinstance(rows, Tensor):
            rows = rows.detach().cpu().numpy()
        rows = np.asarray(rows)
        if rows.dtype == np.bool_:
            if rows.shape != current.shape:
                raise InvalidValueError(
                    f"a boolean `rows` mask must have shape {current.shape} (the rows of the "
                    f"last forward), got {rows.shape}"
                )
            rows = np.flatnonzero(rows)
        if rows.size and rows.dtype.kind not in "iu":
            raise InvalidTypeError(f"`rows` must hold integer indices (or be a boolean mask), got dtype {rows.dtype}")
        if rows.ndim != 1:
            raise InvalidValueError(f"`rows` must be 1-D, got shape {rows.shape}")
        bad = np.flatnonzero((rows < 0) | (rows >= current.size))
        if bad.size:
            raise InvalidIndexError(
                f"`rows` holds {int(rows[bad[0]])}, out of range [0, {current.size}) (the rows of the last forward)"
            )
        self.ids = current[rows.astype(np.int64)]
        self.last_rows = None
        self._plans = {}
        return self

    # -- the block
    def __enter__(self) -> RouteBlock:
        router = self._target.router
        self._active = router.activate(self, self._target.adapters, Origin(0, [], 1, ""))
        if self.individual == BASE:  # every row through the base model: checked, then nothing to add
            router.check_idle()
            self._active = None
            return self
        if torch.is_grad_enabled() and self._target.model.training:
            follow_checkpointing(self._target.model, router)
        self._active.__enter__()
        prepared = router.prepared
        if prepared is not None:
            prepared.enter()
            self._scope = prepared
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        active, self._active = self._active, None
        scope, self._scope = self._scope, None
        try:
            if active is not None:
                active.__exit__(kind, error, trace)
        finally:
            if scope is not None:
                scope.exit()
