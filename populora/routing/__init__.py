"""Routing: who each row of a batch belongs to, and the batched low-rank delta of each individual.

Modules, each importing only those above it: ``route`` (:class:`Route`, where one forward's rows go),
``delta`` (the batched low-rank delta of each layout), ``cost_constants`` and ``cost`` (the cost model: low-rank
products or per-individual merged weights, a pure function of shapes, dtype and device, from constants measured
by ``benchmarks/cost_model.py``), ``prepared`` (:class:`PreparedRoutes`: the per-target work that depends only
on who owns each row, kept across forwards without grad), ``router`` (:class:`Router`: wraps the target layers;
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
from populora.routing.prepared import PREPARED_BYTES, PreparedRoutes
from populora.routing.request import RouteRequest, RoutingTarget, parse_route
from populora.routing.route import Route
from populora.routing.router import Router
from populora.routing.rows import BASE, NOT_BATCH_FIRST, map_tensors

__all__ = [
    "BASE",
    "NOT_BATCH_FIRST",
    "PLANNER",
    "PREPARED_BYTES",
    "Planner",
    "PreparedRoutes",
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
