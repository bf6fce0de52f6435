"""Routes: where the rows of one routed forward go, and the batch as the user passed it.

A :class:`Route` is what the target layers read while a route is active
(:meth:`Router.activate <populora.routing.router.Router.activate>`); it is
made by the front end (one layout per routing argument) or by the
:class:`~populora.routing.plan.Planner` (rows owned by any ids).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["Index", "Origin", "Route", "route_on"]

Index = Tensor | slice | None


class Route(NamedTuple):
    """Where the rows of one forward go.

    Attributes:
        n: rows of the batch as every target layer sees it (leading dim).
        groups: ``k``, number of row groups.
        chunk: ``c``, rows per group (after padding).
        index: adapter id of each group: ``None`` (group ``g`` uses adapter
            ``g``), a ``slice`` or a ``(k,)`` int64 tensor.
        dest: ``(n,)`` position of each row in the padded ``(k c)`` layout,
            or ``None`` when the rows already are ``(k c)``. Increasing when
            the rows are sorted by group; in any order when ``order`` is set.
        dest_host: ``dest`` as a NumPy array, sorted (block bounds are found
            on the host, with no device sync).
        order: ``(n,)`` the rows sorted by group (``dest[order]`` increasing),
            when the rows stay in input order (a route that must not permute
            rows, e.g. with a KV cache in play), else ``None``.
        ids: ``(u,)`` int64, the distinct ids of unequal groups (``dest`` set), in sorted order, or ``None``.
        offs: ``(u,)`` int32, the end of each id's rows in the sorted rows (``grouped_mm``'s ``offs``), or
            ``None``.
        grouped: whether these unequal groups may use ``grouped_mm`` (the planner's switch, see
            :class:`~populora.routing.plan.Planner`).
        base_rows: ``(m,)`` int64, the rows (in the layers' row order) that run through the base model
            alone (ids :data:`~populora.routing.rows.BASE`): their delta is computed with their group's and
            their base output put back; ``None`` when there are none.
    """

    n: int
    groups: int
    chunk: int
    index: Index = None  # type: ignore[assignment]  # (a field named as tuple.index: read as route.index)
    dest: Tensor | None = None
    dest_host: np.ndarray | None = None
    order: Tensor | None = None
    ids: Tensor | None = None
    offs: Tensor | None = None
    grouped: bool | None = None
    base_rows: Tensor | None = None


_ROUTE_TENSORS = ("index", "dest", "order", "ids", "offs", "base_rows")


def route_on(route: Route, device: torch.device) -> Route:
    """``route`` with its index tensors on ``device`` (the same object when they already are there).

    A model spread over devices (``device_map="auto"``) has targets whose
    outputs live on different devices; each target reads the route's index
    tensors on its own output's device (:class:`Router` keeps one copy per
    device and forward).
    """
    moved: dict[str, Any] = {
        name: t.to(device, non_blocking=True)
        for name in _ROUTE_TENSORS
        if isinstance(t := getattr(route, name), Tensor) and t.device != device
    }
    return route._replace(**moved) if moved else route


class Origin(NamedTuple):
    """The batch as the user passed it, for error messages: ``rows`` routed as ``rows * times``."""

    rows: int
    leaves: list  # the tensor inputs as passed (their shapes are formatted only for an error)
    times: int
    how: str

    def shape(self) -> tuple:
        """Shape of the first tensor input with a batch dimension."""
        return next((tuple(t.shape) for t in self.leaves if t.dim() > 0), (self.rows,))

    def routed(self) -> str:
        """How the rows were routed, for an error message (empty when they were not repeated)."""
        if self.times == 1:
            return ""
        return f" (routed as {self.rows * self.times} rows: {self.how})"
