"""Routing: who each row of a batch belongs to, and the batched low-rank delta of each individual.

Modules, each importing only those above it: ``route`` (:class:`Route`, where one forward's rows go),
``delta`` (the batched low-rank delta of each layout), ``router`` (:class:`Router`: wraps the target layers;
:meth:`Router.activate` is the one way to make a route active), ``rows`` (nested inputs, batch size, ids),
``plan`` (:class:`Planner`: routes of rows owned by any ids, the ``grouped_mm`` switch, the plan cache),
``request`` (:func:`parse_route`: the routing arguments checked), ``block`` (:class:`RouteBlock`: a
``with pop.route(...)`` block), ``generate`` (routed ``model.generate``), ``front`` (:func:`run_route` and
:class:`RoutedModel`, the front end every routed model shares), ``wrapping`` (who holds a model).
"""

from populora.routing.block import RouteBlock
from populora.routing.delta import gather_budget
from populora.routing.front import RoutedModel, run_route
from populora.routing.plan import PLANNER, Planner
from populora.routing.request import RouteRequest, RoutingTarget, parse_route
from populora.routing.route import Route
from populora.routing.router import Router
from populora.routing.rows import BASE, NOT_BATCH_FIRST, map_tensors

__all__ = [
    "BASE",
    "NOT_BATCH_FIRST",
    "PLANNER",
    "Planner",
    "Route",
    "RouteBlock",
    "RouteRequest",
    "RoutedModel",
    "Router",
    "RoutingTarget",
    "gather_budget",
    "map_tensors",
    "parse_route",
    "run_route",
]
