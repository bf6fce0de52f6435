"""Who each row belongs to, and the batched low-rank delta for each layout.

A routed forward runs the user's model ONCE. The target layers' forwards
(wrapped by a :class:`Router`) read the active :class:`Route` and add, in
place into the layer's output, the low-rank delta of the individual owning
each row:

    out[rows of i] += (x[rows of i] @ down[i]) @ up[i].T

Inside a layer the rows are laid out as ``(k c)``: ``k`` groups of ``c`` rows,
group ``g`` using adapter ``index[g]``, so the delta is two batched matmuls
over ``(k, c*..., d)`` with no gather of weights per row. Rows of unequal
groups (``individuals=`` routing) are sorted by id once per forward, packed
into chunks of equal size (padding at most one chunk per group) and unsorted
once at the end.
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

from .errors import RouteError

__all__ = ["Adapter", "Route", "Router", "map_tensors", "routed_call"]


class Adapter(NamedTuple):
    """Stacked low-rank factors of one target layer, in the layout the hot path reads.

    Attributes:
        down: ``(p, r, d)`` for ``nn.Linear`` (``down`` transposed, so each
            individual's rows are contiguous for the batched matmul);
            ``(p, V, r)`` for ``nn.Embedding`` (a table gathered by token).
        up: ``(p, r, e)`` (``up`` transposed).
        bias: optional ``(p, e)``, added to every row of its individual (ES
            perturbs biases this way).
    """

    down: Tensor
    up: Tensor
    bias: Tensor | None = None


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
            or ``None`` when the rows already are ``(k c)``.
    """

    n: int
    groups: int
    chunk: int
    index: Index = None
    dest: Tensor | None = None


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


def _rows_down(x: Tensor, module: nn.Module, adapter: Adapter, route: Route) -> Tensor:
    """``(k, c*.., r)``: the rows projected by each group's ``down``; ``x`` is ``(k*c, ..)``."""
    k = route.groups
    if isinstance(module, nn.Embedding):  # row `token` of each group's table, no copy of tables
        p, vocab, r = adapter.down.shape
        flat = x.reshape(k, -1) + _offsets(route.index, k, x.device)[:, None] * vocab
        return adapter.down.reshape(p * vocab, r)[flat]
    down = _take(adapter.down, route.index)  # (k, r, d)
    if down.dtype != x.dtype:
        down = down.to(x.dtype)
    # (k, r, d) @ (k, d, c*..) -> (k, r, c*..): with r on the rows, BLAS runs these skinny products 2-5x
    # faster than (k, c*.., d) @ (k, d, r); the transposed view feeds baddbmm as is.
    return torch.bmm(down, x.reshape(k, -1, x.shape[-1]).transpose(1, 2)).transpose(1, 2)


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
        self._state: tuple[Route, Sequence[Adapter], set[int]] | None = None
        self.last_plan: tuple[tuple, tuple[Route, Tensor | None]] | None = None  # routed_call's one-entry cache
        self._removed = False
        self._warned: set[str] = set()
        self._wrapped: list[tuple[nn.Module, partial, Callable | None]] = []  # (module, wrapper, previous)
        for i, module in enumerate(targets.values()):
            previous = vars(module).get("forward")
            inner = previous if previous is not None else MethodType(type(module).forward, module)
            wrapper = partial(self._forward, i, inner, module)
            module.forward = wrapper
            self._wrapped.append((module, wrapper, previous))

    def _forward(self, i: int, inner: Callable, module: nn.Module, input: Tensor) -> Tensor:
        out = inner(input)
        state = self._state
        return out if state is None else self._apply(i, module, input, out, state)

    def run(self, route: Route, adapters: Sequence[Adapter], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with the route active; undone even if it raises."""
        if self._state is not None:
            raise RuntimeError("a routed forward is already running on this model (re-entrant call)")
        if self._removed:
            raise RuntimeError("this router was removed from its model (the population was merged or closed)")
        called: set[int] = set()
        self._state = (route, adapters, called)
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

    def _apply(self, i: int, module: nn.Module, x: Tensor, out: Tensor, state: tuple) -> Tensor:
        """``out`` plus each row's delta (in place when the layout allows)."""
        route, adapters, called = state
        called.add(i)
        if x.shape[0] != route.n:
            raise RouteError(
                f"target {self.names[i]!r} received {x.shape[0]} rows but this routed forward has "
                f"{route.n}; the batch must be the leading dimension of every target's input"
            )
        adapter = adapters[i]
        k, c = route.groups, route.chunk
        down, up = adapter.down, adapter.up
        if (route.index is None and route.dest is None and adapter.bias is None and down.dtype == out.dtype
                and x.dtype == out.dtype and out.is_contiguous() and type(module) is not nn.Embedding):
            # the common case (whole population, equal groups, one dtype), with no indirection
            h = torch.bmm(down, x.reshape(k, -1, x.shape[-1]).transpose(1, 2)).transpose(1, 2)  # (k, c*.., r)
            out.view(k, -1, out.shape[-1]).baddbmm_(h, up)
            return out
        if route.dest is not None:  # unequal groups: pack rows into (k c), padded
            x = x.new_zeros((k * c, *x.shape[1:])).index_copy_(0, route.dest, x)
        h = _rows_down(x, module, adapter, route)  # (k, c*.., r)
        up = _take(adapter.up, route.index)  # (k, r, e)
        if up.dtype != out.dtype:
            h, up = h.to(out.dtype), up.to(out.dtype)
        if adapter.bias is not None:  # fold the bias into the same matmul: [h, 1] @ [up; bias]
            bias = _take(adapter.bias, route.index).to(out.dtype)
            h = torch.cat((h, h.new_ones(*h.shape[:-1], 1)), dim=-1)  # (k, c*.., r+1)
            up = torch.cat((up, bias[:, None, :]), dim=1)  # (k, r+1, e)
        if route.dest is None and out.is_contiguous():
            out.view(k, -1, out.shape[-1]).baddbmm_(h, up)  # (k, c*.., e) += (k, c*.., r) @ (k, r, e)
            return out
        delta = torch.bmm(h, up).reshape(k * c, *out.shape[1:])
        if route.dest is not None:
            delta = delta.index_select(0, route.dest)
        return out + delta


# ----------------------------------------------------------------------------
# inputs: nested tensors, batch size, expansion, permutation


def map_tensors(obj: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """Apply ``fn`` to every tensor leaf of nested tuples / lists / dicts."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if isinstance(obj, dict):
        mapped = {key: map_tensors(v, fn) for key, v in obj.items()}
        try:
            return type(obj)(mapped)
        except TypeError:
            return mapped
    return obj


def _leaves(obj: Any) -> list[Tensor]:
    if isinstance(obj, tuple) and len(obj) == 2 and not obj[1] and len(obj[0]) == 1 and isinstance(obj[0][0], Tensor):
        return [obj[0][0]]  # fast path: (args, kwargs) == ((x,), {})
    found: list[Tensor] = []
    map_tensors(obj, lambda t: found.append(t) or t)
    return found


def _batch_size(leaves: list[Tensor]) -> int:
    sizes = {t.shape[0] for t in leaves if t.dim() > 0}
    if not sizes:
        raise RouteError("a routed forward needs at least one tensor input with a leading batch dimension")
    if len(sizes) > 1:
        raise RouteError(f"tensor inputs disagree on the batch size (leading dims {sorted(sizes)}); "
                         "every tensor input of a routed forward must have the batch first")
    return sizes.pop()


def _host_ids(ids: Any) -> np.ndarray:
    """Ids as an int64 numpy array (the route plan is data-dependent: it is made on the host)."""
    if isinstance(ids, Tensor):
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise RouteError(f"`individuals` must hold integer ids, got dtype {ids.dtype}")
        ids = ids.detach().cpu().numpy()
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise RouteError(f"`individuals` must be a non-empty 1-D list or integer tensor of ids, "
                         f"got shape {ids.shape} and dtype {ids.dtype}")
    return ids.astype(np.int64, copy=False)


def _plan(row_ids: np.ndarray, num: int, device: torch.device) -> tuple[Route, Tensor | None]:
    """Route for rows owned by ``row_ids`` (any order) and the permutation that groups them by id."""
    bad = (row_ids < 0) | (row_ids >= num)
    if bad.any():
        raise RouteError(f"individual id {int(row_ids[bad][0])} is out of range [0, {num})")
    n = row_ids.size
    perm = None
    if (row_ids[1:] < row_ids[:-1]).any():
        perm = np.argsort(row_ids, kind="stable")
        row_ids = row_ids[perm]
    starts = np.flatnonzero(row_ids[1:] != row_ids[:-1]) + 1
    starts = np.concatenate(([0], starts))  # first row of each id's group
    counts = np.concatenate((starts[1:], [n])) - starts
    uniq, u = row_ids[starts], starts.size
    to_device = lambda a: torch.from_numpy(a).to(device, non_blocking=True)  # noqa: E731
    perm = None if perm is None else to_device(perm)
    if counts.min() == counts.max():
        index = None if u == num else to_device(uniq)
        return Route(n=n, groups=u, chunk=n // u, index=index), perm
    # unequal groups: chunks of c = ceil(n / u) rows; at most one padded chunk per group, k <= 2u
    c = -(-n // u)
    chunks = -(-counts // c)  # (u,) chunks per group
    first_chunk = np.cumsum(chunks) - chunks
    group = np.repeat(np.arange(u), counts)  # (n,)
    offset = np.arange(n) - starts[group]
    dest = (first_chunk[group] + offset // c) * c + offset % c
    return Route(n=n, groups=int(chunks.sum()), chunk=c, index=to_device(np.repeat(uniq, chunks)),
                 dest=to_device(dest)), perm


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
    device: torch.device | None = None,
) -> Any:
    """Run ``model(*args, **kwargs)`` once with every row routed to its individual.

    Layouts (exactly one, or none for the plain base model):
        ``individual=i``: every row through individual ``i``; ``n`` rows out.
        ``all_individuals=True``: a 1-row batch (or ``broadcast=True``) is
            seen by every individual (``p*b`` rows out, layout ``(p b)``);
            otherwise ``n`` must be divisible by ``num`` and is split ``(p b)``.
        ``individuals=ids``: ``len(ids) == n`` gives one id per row in any
            order; a 1-row batch is broadcast to each id; ``n`` divisible by
            ``len(ids)`` is split ``(p b)``.

    Raises:
        RouteError: conflicting arguments, ids out of ``[0, num)``, or a batch
            size that does not fit the layout (both sizes are named).
    """
    given = [individual is not None, individuals is not None, bool(all_individuals)]
    if sum(given) > 1:
        raise RouteError("pass at most one of `individual=`, `individuals=` and `all_individuals=True`, got "
                         + ", ".join(name for name, g in zip(("individual", "individuals", "all_individuals"), given) if g))
    if broadcast and not (all_individuals or individuals is not None):
        raise RouteError("`broadcast=True` needs `all_individuals=True` or `individuals=`")
    leaves = _leaves((args, kwargs))
    if device is not None and any(t.device != device for t in leaves):
        non_blocking = device.type == "cuda"  # host -> device only: a device -> host copy must be synchronous
        args, kwargs = map_tensors((args, kwargs), lambda t: t.to(device, non_blocking=non_blocking))
    if not any(given):
        return model(*args, **kwargs)

    n_in = _batch_size(leaves)
    dev = device if device is not None else leaves[0].device
    perm = None
    if individual is not None:
        if isinstance(individual, bool) or not isinstance(individual, int) and not (
            isinstance(individual, Tensor) and individual.numel() == 1 and not individual.is_floating_point()
        ):
            raise RouteError(f"`individual` must be an int id, got {individual!r}")
        i = int(individual)
        if not 0 <= i < num:
            raise RouteError(f"individual id {i} is out of range [0, {num})")
        route = Route(n=n_in, groups=1, chunk=n_in, index=slice(i, i + 1))
    elif all_individuals:
        if n_in == 1 or broadcast:
            args, kwargs = _expand((args, kwargs), num)
            route = Route(n=num * n_in, groups=num, chunk=n_in)
        elif n_in % num == 0:
            route = Route(n=n_in, groups=num, chunk=n_in // num)
        else:
            raise RouteError(
                f"batch of {n_in} rows cannot be split among pop_size={num} individuals; pass a batch "
                f"divisible by {num} (rows laid out (p b)), a single row, or `broadcast=True` to give "
                "every individual the whole batch"
            )
    else:
        ids = _host_ids(individuals)
        m = ids.size
        expand = n_in == 1 or broadcast  # every id sees the whole batch, whatever its size
        if expand:
            args, kwargs = _expand((args, kwargs), m)
        elif n_in % m:
            raise RouteError(
                f"batch of {n_in} rows does not fit {m} individual ids: pass one id per row, a single "
                f"row, a batch divisible by {m} (split (p b)), or `broadcast=True`"
            )
        row_ids = np.repeat(ids, n_in if expand else n_in // m)
        key = (row_ids.tobytes(), num, dev)
        if router.last_plan is not None and router.last_plan[0] == key:  # same rows as last call (env loops)
            route, perm = router.last_plan[1]
        else:
            route, perm = _plan(row_ids, num, dev)
            router.last_plan = (key, (route, perm))
        if perm is not None:  # group rows by id once for the whole forward; unsorted once at the end
            args, kwargs = map_tensors((args, kwargs), lambda t: t.index_select(0, perm) if t.dim() else t)

    out = router.run(route, adapters, model, *args, **kwargs)
    if perm is None:
        return out
    return map_tensors(out, lambda t: torch.empty_like(t).index_copy_(0, perm, t) if t.dim() and t.shape[0] == route.n else t)


def _expand(inputs: Any, times: int) -> Any:
    """Repeat every tensor leaf ``times`` times along the batch: ``(b, ..) -> ((times b), ..)``."""
    return map_tensors(inputs, lambda t: t.unsqueeze(0).expand(times, *t.shape).reshape(times * t.shape[0], *t.shape[1:])
                if t.dim() else t)
