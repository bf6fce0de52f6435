"""Plans: the :class:`~populora.routing.router.Route` of rows owned by any ids, and the one object deciding them.

:data:`PLANNER` is a :class:`Planner`: it holds the ``grouped_mm`` switch
(read by nothing else: a route carries the decision to the target layers in
:attr:`Route.grouped <populora.routing.router.Route.grouped>`) and a small
cache of recent plans, so an environment loop routing the same ids every
timestep plans once.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from torch import Tensor

from populora.routing.router import Route
from populora.routing.rows import BASE, check_range

__all__ = ["PLANNER", "Planner"]


class Planner:
    """Makes the routes of ``individuals=`` forwards, with the ``grouped_mm`` switch and a bounded plan cache.

    Attributes:
        grouped_mm: whether unequal groups use ``torch.nn.functional.grouped_mm``
            (one fused kernel per factor, no padding). ``None`` (default): where
            it has a fused kernel, CUDA devices of compute capability 9.0 / 10.0
            with bfloat16 adapters and activations; ``True``: on every device (CPU
            included: tests use it to compare both paths); ``False``: never.
            Either way only where its operands have 16-byte aligned strides, for
            ``nn.Linear`` targets without a bias perturbation, and when the
            adapters of the ids present fit the gather budget; the padded
            ``(k c)`` path everywhere else.
        per_row: on CPU, unequal groups averaging at most this many rows per id are routed one row per
            group (see :meth:`plan`; accelerators keep the padded layout, or ``grouped_mm`` where it runs).
        cache_size: plans kept (least recently used dropped first).
    """

    def __init__(self, grouped_mm: bool | None = None, per_row: int = 4, cache_size: int = 8):
        self.grouped_mm = grouped_mm
        self.per_row = per_row
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, tuple[Route, Tensor | None]] = OrderedDict()

    def plan_ids(
        self, ids: np.ndarray | Tensor, repeats: int, num: int, device: torch.device, keep_order: bool
    ) -> tuple[Route, Tensor | None]:
        """The route of ``individuals=ids`` (each id repeated ``repeats`` times in place) and its permutation.

        Cached by the ids' bytes and everything else the plan depends on (the
        planner's switches included, and whether inference mode is on: a plan made
        under ``torch.inference_mode`` holds inference tensors, which a forward
        with grad cannot save for backward).

        Raises:
            InvalidIndexError: an id outside ``[0, num)``.
        """
        if isinstance(ids, Tensor):  # (under torch.compile the request holds the ids as a tensor)
            ids = ids.numpy()
        key = (
            ids.dtype,
            ids.tobytes(),
            repeats,
            num,
            device,
            keep_order,
            self.grouped_mm,
            self.per_row,
            torch.is_inference_mode_enabled(),
        )
        cache = self._cache
        plan = cache.get(key)
        if plan is not None:
            cache.move_to_end(key)
            return plan
        plan = self.plan(np.repeat(check_range(ids, num), repeats), num, device, keep_order=keep_order)
        cache[key] = plan
        if len(cache) > self.cache_size:
            cache.popitem(last=False)
        return plan

    def plan(
        self, row_ids: np.ndarray, num: int, device: torch.device, keep_order: bool = False
    ) -> tuple[Route, Tensor | None]:
        """Route for rows owned by ``row_ids`` (any order, each in ``[0, num)``) and the permutation grouping them.

        The permutation is ``None`` when the rows are sorted, or with
        ``keep_order``: the route then takes the rows in input order, each
        target packing them by id. Layouts, by the rows per id:

        - equal groups: ``(k c)``, no padding;
        - on CPU, a few rows per id (at most :attr:`per_row` on average), unequal: one row per
          group, adapters gathered in input order (no permutation, no packing);
        - otherwise unequal groups in chunks of ``c = ceil(n / u)`` rows (``u`` ids present),
          at most one padded chunk per id, ``k <= 2u`` chunks.

        Rows of :data:`~populora.routing.rows.BASE` join the group of id 0 and are listed in
        ``route.base_rows`` (the target layers put their base output back).
        """
        base = row_ids == BASE
        if base.any():
            route, grouping = self.plan(np.where(base, 0, row_ids), num, device, keep_order)
            rows = np.flatnonzero(base)
            if grouping is not None:  # the layers see the rows sorted: where each base row went
                where = np.empty(row_ids.size, dtype=np.int64)
                where[grouping.cpu().numpy()] = np.arange(row_ids.size)
                rows = where[rows]
            return route._replace(base_rows=torch.from_numpy(rows).to(device, non_blocking=True)), grouping
        n = row_ids.size
        if n == 0:
            return Route(n=0, groups=0, chunk=0), None
        per_id = np.bincount(row_ids)
        present = per_id[per_id > 0]  # rows of each id present
        if (
            present.min() != present.max()
            and n <= self.per_row * present.size
            and device.type == "cpu"
            and self.grouped_mm is not True
        ):
            return Route(n=n, groups=n, chunk=1, index=torch.from_numpy(row_ids).to(device, non_blocking=True)), None
        perm = None
        if (row_ids[1:] < row_ids[:-1]).any():
            perm = np.argsort(row_ids, kind="stable")
            row_ids = row_ids[perm]
            if keep_order:
                route, _ = self.plan(row_ids, num, device)
                dest = route.dest_host if route.dest is not None else np.arange(n)
                unsorted = np.empty_like(dest)
                unsorted[perm] = dest  # row perm[j] sits at position dest[j] of the sorted layout
                return route._replace(
                    dest=torch.from_numpy(unsorted).to(device, non_blocking=True),
                    dest_host=dest,
                    order=torch.from_numpy(perm).to(device, non_blocking=True),
                ), None
        starts = np.concatenate(([0], np.flatnonzero(row_ids[1:] != row_ids[:-1]) + 1))  # first row of each id
        counts = np.concatenate((starts[1:], [n])) - starts
        uniq, u = row_ids[starts], starts.size

        def to_device(a: np.ndarray) -> Tensor:
            return torch.from_numpy(a).to(device, non_blocking=True)

        perm_t = None if perm is None else to_device(perm)
        if counts.min() == counts.max():
            index = None if u == num else to_device(uniq)
            return Route(n=n, groups=u, chunk=n // u, index=index), perm_t
        c = -(-n // u)
        chunks = -(-counts // c)  # (u,) chunks per group
        first_chunk = np.cumsum(chunks) - chunks
        group = np.repeat(np.arange(u), counts)  # (n,)
        offset = np.arange(n) - starts[group]
        dest = (first_chunk[group] + offset // c) * c + offset % c
        route = Route(
            n=n,
            groups=int(chunks.sum()),
            chunk=c,
            index=to_device(np.repeat(uniq, chunks)),
            dest=to_device(dest),
            dest_host=dest,
            ids=to_device(uniq),
            offs=to_device(np.cumsum(counts).astype(np.int32)),
            grouped=self.grouped_mm,
        )
        return route, perm_t


PLANNER = Planner()
"""The planner every routed forward and route block uses (set ``PLANNER.grouped_mm`` to force or disable
``grouped_mm``)."""
