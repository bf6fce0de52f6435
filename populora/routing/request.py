"""The routing arguments of a call, checked: what a routed forward runs on and how its rows are routed.

:func:`parse_route` checks the arguments every routed model takes
(``individual=``, ``individuals=``, ``all_individuals=``, ``broadcast=``,
``split=``, ``per_individual=``; their meaning is in
:mod:`populora.routing.front`) into a :class:`RouteRequest`; nothing runs and
nothing moves when an argument is bad. :class:`RoutingTarget` is what a
routed forward runs on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from populora.adapters import Adapter
from populora.checks import check_bool, check_index, is_int
from populora.errors import RouteError
from populora.routing.eager import outside_graph
from populora.routing.router import Router
from populora.routing.rows import BASE, host_ids

__all__ = ["NOT_ROUTED", "RouteRequest", "RoutingTarget", "parse_route"]


class RoutingTarget(NamedTuple):
    """What a routed forward runs: the model, its router, the adapters and how many individuals they hold.

    Attributes:
        model: the user's model (its target layers wrapped by ``router``).
        router: the :class:`~populora.routing.router.Router` on ``model``.
        adapters: one :class:`~populora.adapters.Adapter` per target, stacked over ``num`` individuals.
        num: ``P``, individuals in the stacks (ids are in ``[0, num)``).
        device: where inputs are moved (``None``: left where they are).
    """

    model: nn.Module
    router: Router
    adapters: Sequence[Adapter]
    num: int
    device: torch.device | None = None


class RouteRequest(NamedTuple):
    """The routing arguments of one call, checked (see :mod:`populora.routing.front` for their meaning).

    Attributes:
        individual: the one id (``individual=``; :data:`~populora.routing.rows.BASE`: the base model), or ``None``.
        ids: ``(m,)`` integer ids of ``individuals=`` (range checked when the route is planned), or ``None``.
        all_individuals: route to every individual.
        broadcast: every routed individual sees the whole batch.
        split: tensor outputs come back ``(m, b, ...)`` instead of ``(m*b, ...)``.
        per_individual: inputs are ``(m, b, ...)``, one block per routed individual.
    """

    individual: int | None = None
    ids: np.ndarray | Tensor | None = None  # (a CPU int64 tensor under torch.compile: a graph input)
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
    if broadcast is False and split is False and per_individual is False and not torch.compiler.is_compiling():
        # the commonest calls (an env step, a fitness forward) with the fewest checks; the same results
        if individual is None and individuals is None and (all_individuals is True or all_individuals is False):
            return _ALL if all_individuals else _NONE
        if individuals is None and all_individuals is False and type(individual) is int:
            return RouteRequest(
                individual=individual if individual == BASE else check_index("individual", individual, num)
            )
        if individual is None and all_individuals is False and isinstance(individuals, (np.ndarray, Tensor)):
            return RouteRequest(ids=host_ids(individuals))
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
        if not (is_int(individual) and individual == BASE):
            individual = check_index("individual", individual, num)
    ids = None if individuals is None else host_ids(individuals)
    return RouteRequest(individual, ids, all_individuals, broadcast, split, per_individual)


@outside_graph
def _parse_route_eager(num: int, **routing: Any) -> RouteRequest:
    """:func:`parse_route`, run eagerly under torch.compile; the ids come back as a CPU int64 tensor (a graph
    input: new id values reuse the graph; a NumPy array would be traced, and under ``inference_mode`` its
    guards break)."""
    request = parse_route(num, **routing)
    if request.ids is None:
        return request
    return request._replace(ids=torch.from_numpy(np.ascontiguousarray(request.ids, dtype=np.int64)))


_ALL = RouteRequest(all_individuals=True)
_NONE = RouteRequest()
NOT_ROUTED = _NONE
"""The request of a call without routing arguments (what :func:`parse_route` returns for it: the plain model)."""
