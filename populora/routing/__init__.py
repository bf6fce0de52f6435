"""Routing: who each row of a batch belongs to, and the batched low-rank delta of each individual."""

from populora.routing.front import RoutedModel, RouteRequest, RoutingTarget, parse_route, run_route
from populora.routing.router import Route, Router

__all__ = ["Route", "RouteRequest", "RoutedModel", "Router", "RoutingTarget", "parse_route", "run_route"]
