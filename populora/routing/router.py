"""The layer router: wraps the target layers' forwards and applies the active route inside them.

A routed forward runs the user's model ONCE. While a route is active
(:meth:`Router.activate`, the only way to set one: a plain routed forward and
a ``route()`` block both go through it), each target layer's forward adds,
in place into its output, the low-rank delta of the individual owning each
row (:func:`~populora.routing.delta.add_delta`). Who each row belongs to is
decided by the front end (:mod:`populora.routing.front`) or a route block
(:mod:`populora.routing.block`); this module only applies what it is given.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from functools import partial
from types import MethodType
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from populora.adapters import Adapter
from populora.errors import RouteError, SpentPopulationError
from populora.routing.cost import MERGED_MAX_ELEMENTS
from populora.routing.delta import add_delta
from populora.routing.prepared import PreparedRoutes
from populora.routing.route import Origin, Route, route_on

__all__ = ["Activation", "Resolver", "Router"]


class Resolver(Protocol):
    """A route decided per forward (a route block's): the route for a forward of ``rows`` rows."""

    def resolve(self, rows: int, name: str) -> Route: ...


class Activation(NamedTuple):
    """What the target layers read while a route is active.

    Attributes:
        route: a :class:`~populora.routing.route.Route`, or a :class:`Resolver` planning one per forward.
        adapters: one :class:`~populora.adapters.Adapter` per target.
        called: indices of the targets that ran (filled in during the forward).
        origin: the batch as the user passed it (for error messages).
    """

    route: Route | Resolver
    adapters: Sequence[Adapter]
    called: set[int]
    origin: Origin


class Active:
    """The context manager :meth:`Router.activate` returns: the route is active inside its block, and only there."""

    __slots__ = ("activation", "router")

    def __init__(self, router: Router, activation: Activation):
        self.router, self.activation = router, activation

    def __enter__(self) -> Activation:
        router = self.router
        router.check_idle()
        router.active = self.activation
        return self.activation

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        router = self.router
        if router.active is self.activation:
            router.active = None
        called = self.activation.called
        # (a route block in which no forward ran at all has nothing to warn about)
        if kind is None and len(called) < len(router.names) and (called or self.activation.route.__class__ is Route):
            router.warn_skipped(called)


class Router:
    """Wraps the target modules' forward so that it applies the active route.

    Each target's instance-level ``forward`` becomes ``partial(router.layer_forward,
    i, inner, module)``, where ``inner`` is the forward it had (the class's, or
    another router's wrapper: several populations may share one base model).
    While a route is active it adds the delta in place; otherwise it costs one
    attribute check (a forward hook costs several times more per call, which
    shows on small batches). ``copy.deepcopy`` copies the router along with the
    modules, so a deep copy of a population routes on its own copy.

    Subclasses may override :meth:`layer_forward` and :meth:`add_delta` (the ES
    router does, for its shared-batch and one-member modes).

    Args:
        targets: ``{path: module}`` of ``nn.Linear`` / ``nn.Embedding`` layers.

    Attributes:
        names: the target paths, in order.
        active: the :class:`Activation` in force, or ``None``; set only by :meth:`activate`.
        removed: whether :meth:`remove` was called (the router never activates again).
        prepared: the :class:`~populora.routing.prepared.PreparedRoutes` of routed forwards without grad,
            used only inside its scopes (``None`` in a subclass that overrides :meth:`add_delta`: its deltas are
            its own).
    """

    def __init__(self, targets: dict[str, nn.Module]):
        self.names = list(targets)
        self.active: Activation | None = None
        self.removed = False
        self.prepared = PreparedRoutes() if type(self).add_delta is Router.add_delta else None
        # targets whose forward is nn.Linear's own (a merged weight may stand in for it), and the small
        # Linears (merged weights may be formed: see routing.cost); larger ones are prepared only for gathers
        self._plain = [type(m) is nn.Linear and "forward" not in vars(m) for m in targets.values()]
        self._small = [
            isinstance(m, nn.Linear) and m.in_features * m.out_features <= MERGED_MAX_ELEMENTS for m in targets.values()
        ]
        self._warned: set[str] = set()
        self._moved: dict[torch.device, tuple[Route, Route]] = {}  # device -> (route, its copy there)
        self._wrapped: list[tuple[nn.Module, partial, Callable | None]] = []  # (module, wrapper, previous)
        for i, module in enumerate(targets.values()):
            previous = vars(module).get("forward")
            inner = previous if previous is not None else MethodType(type(module).forward, module)
            wrapper = partial(self.layer_forward, i, inner, module)
            module.forward = wrapper
            self._wrapped.append((module, wrapper, previous))

    def activate(self, route: Route | Resolver, adapters: Sequence[Adapter], origin: Origin | None = None) -> Active:
        """A context manager in which ``route`` is active: ``with router.activate(route, adapters): model(x)``.

        ``origin`` describes the batch as the user passed it (for error
        messages; by default the route's own rows). On exit the route is
        inactive again, even if the block raised; a target that never ran
        gets one warning.

        Raises:
            RouteError: a route is already active on this router (re-entrant call).
            SpentPopulationError: the router was removed (its population merged or closed).
        """
        if origin is None:
            origin = Origin(route.n if isinstance(route, Route) else 0, [], 1, "")
        return Active(self, Activation(route, adapters, set(), origin))

    def check_idle(self) -> None:
        """Raise unless a route could be activated now.

        Raises:
            RouteError: a route is already active (a re-entrant call).
            SpentPopulationError: the router was removed.
        """
        if self.active is not None:
            raise RouteError(
                "a routed forward is already running on this model: routed forwards and route() blocks do not "
                "nest, and a population cannot be called inside one of its own route() blocks"
            )
        if self.removed:
            raise SpentPopulationError(
                "this router was removed from its model (the population was merged or closed) and cannot route"
            )

    def run(
        self,
        route: Route | Resolver,
        adapters: Sequence[Adapter],
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict | None = None,
        origin: Origin | None = None,
    ) -> Any:
        """``fn(*args, **kwargs)`` inside :meth:`activate`'s block."""
        with self.activate(route, adapters, origin):
            return fn(*args, **({} if kwargs is None else kwargs))

    def layer_forward(self, i: int, inner: Callable, module: nn.Module, input: Tensor) -> Tensor:
        """Target ``i``'s forward: ``inner(input)``, plus the delta of the active route if any."""
        activation = self.active
        if activation is None:
            return inner(input)
        prepared = self.prepared
        if (  # an env loop's or a decode loop's forward in a scope (a compiled graph keeps its own: never prepared)
            prepared is not None
            and prepared.depth
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
        ):
            found = activation.route
            resolved: Route | None
            if type(found) is Route:
                resolved = found
            else:
                try:
                    resolved = found.resolve(input.shape[0], self.names[i])  # type: ignore[union-attr]
                except RouteError:
                    resolved = None  # (raised again below, after the layer's own forward, as without preparation)
            if resolved is not None and (self._small[i] or resolved.index.__class__ is Tensor):
                out = prepared.forward(i, module, inner, input, resolved, activation.adapters[i], self._plain[i])
                if out is not None:
                    activation.called.add(i)
                    return out
        try:
            out = inner(input)
        except RuntimeError as error:
            self._explain(i, module, input, activation.origin, error)
            raise
        return self.add_delta(i, module, input, out, activation)

    def add_delta(self, i: int, module: nn.Module, x: Tensor, out: Tensor, activation: Activation) -> Tensor:
        """``out`` plus each row's delta under ``activation`` (in place when the layout allows).

        Raises:
            RouteError: ``x`` does not have the route's row count.
        """
        found = activation.route
        activation.called.add(i)
        # (a route block's Resolver plans the route for the row count of this forward)
        route = found if type(found) is Route else found.resolve(x.shape[0], self.names[i])  # type: ignore[union-attr]
        if x.shape[0] != route.n:
            raise RouteError(
                f"target {self.names[i]!r} received {x.shape[0]} rows but this routed forward has "
                f"{route.n}{activation.origin.routed()}; the batch must be the leading dimension of every "
                "target's input"
            )
        index = route.index
        moved = index if isinstance(index, Tensor) else route.dest if route.dest is not None else route.base_rows
        if moved is not None and moved.device != out.device:  # index tensors on this target's device
            route = self._local(route, out.device)
        return add_delta(module, x, out, route, activation.adapters[i])

    def _explain(self, i: int, module: nn.Module, x: Tensor, origin: Origin, error: RuntimeError) -> None:
        """Raise a :class:`RouteError` counting the user's rows if ``error`` is a Linear's feature mismatch."""
        if isinstance(module, nn.Linear) and x.dim() > 0 and x.shape[-1] != module.in_features:
            raise RouteError(
                f"target {self.names[i]!r} (Linear with in_features={module.in_features}) got inputs with "
                f"{x.shape[-1]} features: its input has shape {(origin.rows, *x.shape[1:])} for the "
                f"{origin.rows} row{'' if origin.rows == 1 else 's'} of the batch passed (first input of shape "
                f"{origin.shape()}){origin.routed()}"
            ) from error

    def warn_skipped(self, called: set[int]) -> None:
        """Warn once per target that did not run through its forward during a routed forward."""
        for i, name in enumerate(self.names):
            if i not in called and name not in self._warned:
                self._warned.add(name)
                warnings.warn(
                    f"target {name!r} was not called through its forward during a routed forward, "
                    "so its adapter had no effect (a fused fast path, e.g. nn.TransformerEncoderLayer "
                    "in eval mode, bypasses its Linear layers)",
                    stacklevel=4,
                )

    def remove(self) -> None:
        """Give every target back the forward it had before this router.

        A wrapper that another router has since wrapped again stays in its
        chain as a pass-through (this router never activates again).
        """
        self.removed = True
        if self.prepared is not None:
            self.prepared.clear()
        for module, wrapper, previous in self._wrapped:
            if vars(module).get("forward") is wrapper:
                if previous is None:
                    del module.forward
                else:
                    module.forward = previous
        self._wrapped = []

    def _local(self, route: Route, device: torch.device) -> Route:
        """``route`` with its index tensors on ``device``, moved once per route and device (:func:`route_on`)."""
        entry = self._moved.get(device)
        if entry is None or entry[0] is not route:
            entry = self._moved[device] = (route, route_on(route, device))
        return entry[1]
