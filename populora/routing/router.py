"""The routing layer inside the target modules: routes, and the batched low-rank delta of each layout.

A routed forward runs the user's model ONCE. The target layers' forwards
(wrapped by a :class:`Router`) read the active :class:`Route` and add, in
place into the layer's output, the low-rank delta of the individual owning
each row:

    out[rows of i] += (x[rows of i] @ down[i]) @ up[i].T

Inside a layer the rows are laid out as ``(k c)``: ``k`` groups of ``c`` rows,
group ``g`` using adapter ``index[g]``, so the delta is two batched matmuls
over ``(k, c*..., d)`` with no gather of weights per row. Rows of unequal
groups (``individuals=`` routing) arrive sorted by id, packed into chunks of
equal size (padding at most one chunk per group; the plan is made by
:mod:`populora.routing`). When the groups are so small that gathering their
adapters would cost more memory than the activations (about one row per id,
as with ``P`` ids over ``P`` rows), the gathered groups are processed in
blocks of bounded size (see :func:`gather_budget`), so a routed forward never
holds a per-row copy of the weights.

Who each row belongs to (the routing arguments, their checks and layouts) is
decided by the front end, :mod:`populora.routing`; this module only applies a
:class:`Route` it is given.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from functools import partial
from types import MethodType
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from populora.adapters import Adapter
from populora.errors import RouteError

__all__ = ["GROUPED_MM", "Adapter", "Route", "Router", "gather_budget", "route_on"]


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
    """

    n: int
    groups: int
    chunk: int
    index: Index = None
    dest: Tensor | None = None
    dest_host: np.ndarray | None = None
    order: Tensor | None = None
    ids: Tensor | None = None
    offs: Tensor | None = None


_ROUTE_TENSORS = ("index", "dest", "order", "ids", "offs")


def route_on(route: Route, device: torch.device) -> Route:
    """``route`` with its index tensors on ``device`` (the same object when they already are there).

    A model spread over devices (``device_map="auto"``) has targets whose
    outputs live on different devices; each target reads the route's index
    tensors on its own output's device (:class:`Router` keeps one copy per
    device and forward).
    """
    moved = {
        name: t.to(device, non_blocking=True)
        for name in _ROUTE_TENSORS
        if isinstance(t := getattr(route, name), Tensor) and t.device != device
    }
    return route._replace(**moved) if moved else route


GROUPED_MM: bool | None = None
"""Whether unequal groups use ``torch.nn.functional.grouped_mm`` (one fused kernel per factor, no padding).

``None`` (default): where it has a fused kernel, CUDA devices of compute
capability 9.0 / 10.0 with bfloat16 adapters and activations; ``True``: on
every device (CPU included: tests use it to compare both paths); ``False``:
never. Either way only where its operands have 16-byte aligned strides
(``d``, ``e`` and ``r`` multiples of 8 in bfloat16, of 4 in float32), for
``nn.Linear`` targets without a bias perturbation, and when the adapters of
the ids present fit :func:`gather_budget`; the padded ``(k c)`` path
everywhere else.
"""

_FUSED_CAPABILITY: dict[torch.device, bool] = {}


def _grouped_ok(x: Tensor, out: Tensor, adapter: Adapter) -> bool:
    """Whether this target's delta runs on ``grouped_mm`` (see :data:`GROUPED_MM`)."""
    if GROUPED_MM is False or adapter.bias is not None or not hasattr(nn.functional, "grouped_mm"):
        return False
    down = adapter.down
    if not (down.dtype == x.dtype == out.dtype) or x.dim() < 2:
        return False
    size = x.element_size()
    if any((v * size) % 16 for v in (down.shape[1], down.shape[2], adapter.up.shape[2])):
        return False
    if GROUPED_MM:
        return True
    if x.device.type != "cuda" or x.dtype != torch.bfloat16:
        return False
    fused = _FUSED_CAPABILITY.get(x.device)
    if fused is None:
        fused = _FUSED_CAPABILITY[x.device] = torch.cuda.get_device_capability(x.device) in ((9, 0), (10, 0))
    return fused


def _take(stack: Tensor, index: Index) -> Tensor:
    if index is None:
        return stack
    return stack[index] if isinstance(index, slice) else stack.index_select(0, index)


def _offsets(index: Index, groups: int, device: torch.device) -> Tensor:
    """``(k,)`` adapter id of each group, as a tensor."""
    if index is None:
        return torch.arange(groups, device=device)
    if isinstance(index, slice):
        return torch.arange(index.start, index.stop, device=device)
    return index


def _rows_down(x: Tensor, module: nn.Module, adapter: Adapter, index: Index, k: int) -> Tensor:
    """``(k, c*.., r)``: the rows projected by each group's ``down``; ``x`` is ``(k*c, ..)``."""
    if isinstance(module, nn.Embedding):  # row `token` of each group's table, no copy of tables
        p, vocab, r = adapter.down.shape
        flat = x.reshape(k, -1) + _offsets(index, k, x.device)[:, None] * vocab
        return adapter.down.reshape(p * vocab, r)[flat]
    down = _take(adapter.down, index)  # (k, r, d)
    if down.dtype != x.dtype:
        down = down.to(x.dtype)
    return _down(down, x, k)


_UNBLOCKED = 400
"""ATen's CPU ``bmm`` runs a product of fewer than this many multiply-adds per batch entry (``m * n * k``) in
a plain scalar loop: about 1 ns per multiply-add for ``down`` (``x @ down.T``) and 5 ns for ``up`` here,
against a broadcast multiply's fixed 3-15 us. Such products are written as broadcast multiplies when
they hold at least :data:`_BROADCAST` multiply-adds in all (measured: 327 us -> 9.5 us at 256 groups of
one row, rank 1, e = 256), and left to ``bmm`` below (a one-row env policy: 3 us against 11 us)."""

_BROADCAST = (16384, 8192)
"""Multiply-adds, over every group, above which a product below :data:`_UNBLOCKED` per group is a broadcast
multiply: ``(down, up)``."""

_FEW_ROWS = 4
"""Groups of at most this many rows (tokens) project as ``x @ down.T``, larger ones as ``down @ x.T`` (see
:func:`_down`)."""


def _down(down: Tensor, x: Tensor, k: int) -> Tensor:
    """``(k, c*.., r)``: ``x (k*c.., d)`` projected by ``down (k, r, d)``.

    Three forms of the same product, by the size of each group's part:

    - a product ATen would loop over unblocked, large in all: a broadcast multiply and sum (:data:`_UNBLOCKED`);
    - at most :data:`_FEW_ROWS` rows (tokens) per group (one decode step, an env step): ``x @ down.T``;
    - more rows: ``(k, r, d) @ (k, d, c*..)`` with ``r`` on the rows, 2-5x faster for these skinny
      products (a prefill, a batch per individual); the transposed view feeds ``baddbmm`` as is.
    """
    xs = x.reshape(k, -1, x.shape[-1])  # (k, t, d)
    t, r = xs.shape[1], down.shape[1]
    macs = t * r * xs.shape[2]
    if macs < _UNBLOCKED and k * macs >= _BROADCAST[0] and xs.device.type == "cpu":
        return (xs.unsqueeze(2) * down.unsqueeze(1)).sum(-1)  # (k, t, 1, d) * (k, 1, r, d) -> (k, t, r)
    if t <= _FEW_ROWS:
        return torch.bmm(xs, down.transpose(1, 2))
    return torch.bmm(down, xs.transpose(1, 2)).transpose(1, 2)


def _broadcast_up(h: Tensor, up: Tensor) -> bool:
    """Whether ``h (k, t, r) @ up (k, r, e)`` is a broadcast multiply (see :data:`_UNBLOCKED`)."""
    macs = h.shape[1] * h.shape[2] * up.shape[2]
    return macs < _UNBLOCKED and h.device.type == "cpu" and (h.shape[2] == 1 or h.shape[0] * macs >= _BROADCAST[1])


def _add_product(out: Tensor, h: Tensor, up: Tensor) -> Tensor:
    """``out (k, t, e) += h (k, t, r) @ up (k, r, e)`` in place; returns ``out``."""
    if _broadcast_up(h, up):
        if h.shape[2] == 1:
            return out.addcmul_(h, up)  # (k, t, 1) * (k, 1, e)
        return out.add_((h.unsqueeze(-1) * up.unsqueeze(1)).sum(2))  # (k, t, r, 1) * (k, 1, r, e)
    return out.baddbmm_(h, up)


def _product(h: Tensor, up: Tensor) -> Tensor:
    """``h (k, t, r) @ up (k, r, e)`` as a new tensor (the same forms as :func:`_add_product`)."""
    if _broadcast_up(h, up):
        return h * up if h.shape[2] == 1 else (h.unsqueeze(-1) * up.unsqueeze(1)).sum(2)
    return torch.bmm(h, up)


def _factors(
    x: Tensor,
    module: nn.Module,
    adapter: Adapter,
    index: Index,
    k: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """``h (k, c*.., r)`` and ``up (k, r, e)`` of ``k`` groups, so that their delta is ``h @ up``.

    A bias is folded into the same matmul: ``[h, 1] @ [up; bias]`` (``r + 1`` columns).
    """
    h = _rows_down(x, module, adapter, index, k)
    up = _take(adapter.up, index)
    if up.dtype != dtype:
        h, up = h.to(dtype), up.to(dtype)
    if adapter.bias is not None:
        bias = _take(adapter.bias, index).to(dtype)
        h = torch.cat((h, h.new_ones(*h.shape[:-1], 1)), dim=-1)  # (k, c*.., r+1)
        up = torch.cat((up, bias[:, None, :]), dim=1)  # (k, r+1, e)
    return h, up


def gather_budget(device: torch.device, activation_bytes: int) -> int:
    """Most bytes of gathered adapters a target layer holds at once in an ``individuals=`` forward.

    Gathering the adapters of ``k`` groups copies ``k * r * (d + e)`` values;
    with about one row per group that is ``r`` times the activations.
    Groups are therefore processed in blocks whose gathered adapters fit
    ``max(floor, activation_bytes)``, ``activation_bytes`` being the bytes of
    the layer's input and output (so the extra memory stays of the order of
    the activations whatever ``r``); the floor (1 MiB on CPU, 32 MiB on
    accelerators, where each block costs kernel launches) keeps small
    forwards in one block.

    Example:
        >>> gather_budget(torch.device("cpu"), 4096)
        1048576
    """
    return max(1 << 20 if device.type == "cpu" else 32 << 20, activation_bytes)


class Router:
    """Wraps the target modules' forward so that it applies the active route.

    Each target's instance-level ``forward`` becomes ``partial(router._forward,
    i, inner, module)``, where ``inner`` is the forward it had (the class's, or
    another router's wrapper: several populations may share one base model).
    While this router's route is active it adds the delta in place; outside
    :meth:`run` it costs one attribute check (a forward hook costs several
    times more per call, which shows on small batches). ``copy.deepcopy``
    copies the router along with the modules, so a deep copy of a population
    routes on its own copy, and a deep copy of the bare model is a plain model.

    Args:
        targets: ``{path: module}`` of ``nn.Linear`` / ``nn.Embedding`` layers.
    """

    def __init__(self, targets: dict[str, nn.Module]):
        self.names = list(targets)
        self._state: tuple[Route, Sequence[Adapter], set[int], _Origin] | None = None
        self.last_plan: tuple[tuple, tuple[Route, Tensor | None]] | None = None  # routed_call's one-entry cache
        self._removed = False
        self._warned: set[str] = set()
        self._moved: dict[torch.device, tuple[Route, Route]] = {}  # device -> (route, its copy there), see route_on
        self._wrapped: list[tuple[nn.Module, partial, Callable | None]] = []  # (module, wrapper, previous)
        for i, module in enumerate(targets.values()):
            previous = vars(module).get("forward")
            inner = previous if previous is not None else MethodType(type(module).forward, module)
            wrapper = partial(self._forward, i, inner, module)
            module.forward = wrapper
            self._wrapped.append((module, wrapper, previous))

    def _forward(self, i: int, inner: Callable, module: nn.Module, input: Tensor) -> Tensor:
        state = self._state
        if state is None:
            return inner(input)
        try:
            out = inner(input)
        except RuntimeError as error:
            self._explain(i, module, input, state[3], error)
            raise
        return self._apply(i, module, input, out, state)

    def _explain(self, i: int, module: nn.Module, x: Tensor, origin: _Origin, error: RuntimeError) -> None:
        """Raise a :class:`RouteError` counting the user's rows if ``error`` is a Linear's feature mismatch."""
        if isinstance(module, nn.Linear) and x.dim() > 0 and x.shape[-1] != module.in_features:
            raise RouteError(
                f"target {self.names[i]!r} (Linear with in_features={module.in_features}) got inputs with "
                f"{x.shape[-1]} features: its input has shape {(origin.rows, *x.shape[1:])} for the "
                f"{origin.rows} row{'' if origin.rows == 1 else 's'} of the batch passed (first input of shape "
                f"{origin.shape()}){origin.routed()}"
            ) from error

    def run(
        self,
        route: Route,
        adapters: Sequence[Adapter],
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict | None = None,
        origin: _Origin | None = None,
    ) -> Any:
        """``fn(*args, **kwargs)`` with the route active; undone even if it raises.

        ``origin`` describes the batch as the user passed it (for error
        messages; by default the route's own rows).
        """
        kwargs = {} if kwargs is None else kwargs
        if self._state is not None:
            raise RuntimeError("a routed forward is already running on this model (re-entrant call)")
        if self._removed:
            raise RuntimeError("this router was removed from its model (the population was merged or closed)")
        called: set[int] = set()
        if origin is None:
            origin = _Origin(route.n, [], 1, "")
        self._state = (route, adapters, called, origin)
        try:
            out = fn(*args, **kwargs)
        finally:
            self._state = None
        if len(called) < len(self.names):
            self._warn_skipped(called)
        return out

    def _warn_skipped(self, called: set[int]) -> None:
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
        self._removed = True
        for module, wrapper, previous in self._wrapped:
            if vars(module).get("forward") is wrapper:
                if previous is None:
                    del module.forward
                else:
                    module.forward = previous
        self._wrapped = []

    def _local(self, route: Route, device: torch.device) -> Route:
        """``route`` with its index tensors on ``device``, moved once per route and device (:func:`route_on`)."""
        moved = self.__dict__.setdefault("_moved", {})  # (a router pickled before this cache existed)
        entry = moved.get(device)
        if entry is None or entry[0] is not route:
            entry = moved[device] = (route, route_on(route, device))
        return entry[1]

    def _apply(self, i: int, module: nn.Module, x: Tensor, out: Tensor, state: tuple) -> Tensor:
        """``out`` plus each row's delta (in place when the layout allows)."""
        route, adapters, called, origin = state
        called.add(i)
        if route.__class__ is not Route:  # a route block's route: planned for the row count of this forward
            route = route.resolve(x.shape[0], self.names[i])
        index = route.index
        if (index is None or index.__class__ is slice) and route.dest is None and x.shape[0] == route.n:
            adapter = adapters[i]  # the commonest cases first, with the fewest checks: every individual or
            down = adapter.down  # one, equal groups, one dtype (an env loop pays this per target and timestep)
            if (
                route.n
                and adapter.bias is None
                and down.dtype == out.dtype == x.dtype
                and out.is_contiguous()
                and type(module) is not nn.Embedding
            ):
                k, up = route.groups, adapter.up
                if index is not None:
                    down, up = down[index], up[index]
                _add_product(out.view(k, -1, out.shape[-1]), _down(down, x, k), up)  # += (k, c*.., r) @ (k, r, e)
                return out
        if x.shape[0] != route.n:
            raise RouteError(
                f"target {self.names[i]!r} received {x.shape[0]} rows but this routed forward has "
                f"{route.n}{origin.routed()}; the batch must be the leading dimension of every target's input"
            )
        adapter = adapters[i]
        if route.dest is not None or isinstance(route.index, Tensor):  # index tensors on this target's device
            if (route.index if isinstance(route.index, Tensor) else route.dest).device != out.device:
                route = self._local(route, out.device)
        if route.n == 0:  # an empty batch: nothing to add (the base output is already (0, ..))
            if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in adapter):
                out = out + sum(t.sum() for t in adapter if t is not None) * 0  # still a function of the adapters
            return out
        k, c = route.groups, route.chunk
        down, up = adapter.down, adapter.up
        index, e = route.index, out.shape[-1]
        block = k  # groups per block
        if isinstance(index, Tensor):  # adapters are gathered per group: bound the copy (gather_budget)
            rank = up.shape[1]
            per_group = (
                rank * e
                + (0 if isinstance(module, nn.Embedding) else rank * down.shape[-1])
                + (0 if adapter.bias is None else e)
            ) * down.element_size()
            budget = gather_budget(out.device, (x.numel() + out.numel()) * out.element_size())
            block = max(1, min(k, budget // per_group))
        if not out.is_contiguous():
            out = out.contiguous()
        if route.dest is None:  # rows already (k c): add each block's delta in place
            view = out.view(k, -1, e)
            if block == k:
                h, up = _factors(x, module, adapter, index, k, out.dtype)
                _add_product(view, h, up)  # (k, c*.., e) += (k, c*.., r) @ (k, r, e)
                return out
            for g0 in range(0, k, block):
                g1 = min(k, g0 + block)
                h, up = _factors(x[g0 * c : g1 * c], module, adapter, index[g0:g1], g1 - g0, out.dtype)
                _add_product(view[g0:g1], h, up)
            return out
        if block == k and route.offs is not None and type(module) is not nn.Embedding and _grouped_ok(x, out, adapter):
            return _grouped_delta(x, out, adapter, route)
        # unequal groups: pack each block's rows into (k c), padded, and add its delta to those rows in place;
        # rows are sorted by group, so a block of groups owns a contiguous range of rows
        # (rows in input order, `route.order` set: the same, each block's rows gathered through `order`)
        for g0 in range(0, k, block):
            g1 = min(k, g0 + block)
            rows = None
            if block == k:
                j0, j1, pos, part = 0, route.n, route.dest, index
                xs = x
            else:
                j0, j1 = (int(j) for j in np.searchsorted(route.dest_host, (g0 * c, g1 * c)))
                part = index[g0:g1]
                if route.order is None:
                    pos, xs = route.dest[j0:j1] - g0 * c, x[j0:j1]
                else:
                    rows = route.order[j0:j1]
                    pos, xs = route.dest.index_select(0, rows) - g0 * c, x.index_select(0, rows)
            packed = x.new_zeros(((g1 - g0) * c, *x.shape[1:])).index_copy_(0, pos, xs)
            h, up = _factors(packed, module, adapter, part, g1 - g0, out.dtype)
            del packed, xs
            delta = _product(h, up).reshape((g1 - g0) * c, *out.shape[1:]).index_select(0, pos)
            if block == k:
                out.add_(delta)
            elif rows is None:
                out[j0:j1] += delta
            else:
                out.index_add_(0, rows, delta)
        return out


def _grouped_delta(x: Tensor, out: Tensor, adapter: Adapter, route: Route) -> Tensor:
    """``out`` plus the delta of unequal groups in two ``grouped_mm`` calls (rows sorted by id, no padding).

    ``x`` is ``(n, .., d)``, ``out`` ``(n, .., e)`` (contiguous); the rows of
    id ``route.ids[j]`` are the sorted rows ``offs[j-1] .. offs[j]`` (through
    ``route.order`` when the rows stay in input order).
    """
    d, e = x.shape[-1], out.shape[-1]
    rows = x if route.order is None else x.index_select(0, route.order)
    per_row = rows.numel() // (route.n * d)  # tokens of each row
    offs = route.offs if per_row == 1 else route.offs * per_row
    ids, down, up = route.ids, adapter.down, adapter.up
    if ids.shape[0] != down.shape[0]:  # (sorted distinct ids: all P of them are arange(P))
        down, up = down.index_select(0, ids), up.index_select(0, ids)
    h = nn.functional.grouped_mm(rows.reshape(-1, d), down.transpose(1, 2), offs=offs)  # (n.., r)
    delta = nn.functional.grouped_mm(h, up, offs=offs)  # (n.., e)
    if route.order is None:
        out.view(-1, e).add_(delta)
    else:
        out.index_add_(0, route.order, delta.view(route.n, *out.shape[1:]))
    return out


class _Origin(NamedTuple):
    """The batch as the user passed it, for error messages: ``rows`` routed as ``rows * times``."""

    rows: int
    leaves: list  # the tensor inputs as passed (their shapes are formatted only for an error)
    times: int
    how: str

    def shape(self) -> tuple:
        """Shape of the first tensor input with a batch dimension."""
        return next((tuple(t.shape) for t in self.leaves if t.dim() > 0), (self.rows,))

    def routed(self) -> str:
        if self.times == 1:
            return ""
        return f" (routed as {self.rows * self.times} rows: {self.how})"
