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
once at the end. When the groups are so small that gathering their adapters
would cost more memory than the activations (about one row per id, as with
``P`` ids over ``P`` rows), the gathered groups are processed in blocks of
bounded size (see :func:`gather_budget`), so a routed forward never holds a
per-row copy of the weights.
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

from .checks import check_bool, check_index
from .errors import InvalidIndexError, InvalidTypeError, InvalidValueError, RouteError

__all__ = ["Adapter", "Route", "Router", "gather_budget", "map_tensors", "routed_call"]


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
        dest: ``(n,)`` position of each row in the padded ``(k c)`` layout
            (increasing: rows are sorted by group), or ``None`` when the rows
            already are ``(k c)``.
        dest_host: ``dest`` as a NumPy array (block bounds are found on the
            host, with no device sync).
    """

    n: int
    groups: int
    chunk: int
    index: Index = None
    dest: Tensor | None = None
    dest_host: np.ndarray | None = None


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
    # (k, r, d) @ (k, d, c*..) -> (k, r, c*..): with r on the rows, BLAS runs these skinny products 2-5x
    # faster than (k, c*.., d) @ (k, d, r); the transposed view feeds baddbmm as is.
    return torch.bmm(down, x.reshape(k, -1, x.shape[-1]).transpose(1, 2)).transpose(1, 2)


def _factors(x: Tensor, module: nn.Module, adapter: Adapter, index: Index, k: int, dtype: torch.dtype,
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

    def run(self, route: Route, adapters: Sequence[Adapter], fn: Callable[..., Any], args: tuple = (),
            kwargs: dict | None = None, origin: _Origin | None = None) -> Any:
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

    def _apply(self, i: int, module: nn.Module, x: Tensor, out: Tensor, state: tuple) -> Tensor:
        """``out`` plus each row's delta (in place when the layout allows)."""
        route, adapters, called, origin = state
        called.add(i)
        if x.shape[0] != route.n:
            raise RouteError(
                f"target {self.names[i]!r} received {x.shape[0]} rows but this routed forward has "
                f"{route.n}{origin.routed()}; the batch must be the leading dimension of every target's input"
            )
        adapter = adapters[i]
        if route.n == 0:  # an empty batch: nothing to add (the base output is already (0, ..))
            if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in adapter):
                out = out + sum(t.sum() for t in adapter if t is not None) * 0  # still a function of the adapters
            return out
        k, c = route.groups, route.chunk
        down, up = adapter.down, adapter.up
        if (route.index is None and route.dest is None and adapter.bias is None and down.dtype == out.dtype
                and x.dtype == out.dtype and out.is_contiguous() and type(module) is not nn.Embedding):
            # the common case (whole population, equal groups, one dtype), with no indirection
            h = torch.bmm(down, x.reshape(k, -1, x.shape[-1]).transpose(1, 2)).transpose(1, 2)  # (k, c*.., r)
            out.view(k, -1, out.shape[-1]).baddbmm_(h, up)
            return out
        index, e = route.index, out.shape[-1]
        block = k  # groups per block
        if isinstance(index, Tensor):  # adapters are gathered per group: bound the copy (gather_budget)
            rank = up.shape[1]
            per_group = (rank * e + (0 if isinstance(module, nn.Embedding) else rank * down.shape[-1])
                         + (0 if adapter.bias is None else e)) * down.element_size()
            budget = gather_budget(out.device, (x.numel() + out.numel()) * out.element_size())
            block = max(1, min(k, budget // per_group))
        if not out.is_contiguous():
            out = out.contiguous()
        if route.dest is None:  # rows already (k c): add each block's delta in place
            view = out.view(k, -1, e)
            if block == k:
                h, up = _factors(x, module, adapter, index, k, out.dtype)
                view.baddbmm_(h, up)  # (k, c*.., e) += (k, c*.., r) @ (k, r, e)
                return out
            for g0 in range(0, k, block):
                g1 = min(k, g0 + block)
                h, up = _factors(x[g0 * c : g1 * c], module, adapter, index[g0:g1], g1 - g0, out.dtype)
                view[g0:g1].baddbmm_(h, up)
            return out
        # unequal groups: pack each block's rows into (k c), padded, and add its delta to those rows in place;
        # rows are sorted by group, so a block of groups owns a contiguous range of rows
        for g0 in range(0, k, block):
            g1 = min(k, g0 + block)
            if block == k:
                j0, j1, pos, part = 0, route.n, route.dest, index
            else:
                j0, j1 = (int(j) for j in np.searchsorted(route.dest_host, (g0 * c, g1 * c)))
                pos, part = route.dest[j0:j1] - g0 * c, index[g0:g1]
            packed = x.new_zeros(((g1 - g0) * c, *x.shape[1:])).index_copy_(0, pos, x[j0:j1])
            h, up = _factors(packed, module, adapter, part, g1 - g0, out.dtype)
            del packed
            delta = torch.bmm(h, up).reshape((g1 - g0) * c, *out.shape[1:]).index_select(0, pos)
            if block == k:
                out.add_(delta)
            else:
                out[j0:j1] += delta
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
    """Ids as a ``(m,)`` integer numpy array (the route plan is data-dependent: it is made on the host).
    Lists / tuples of ints or NumPy integers, NumPy arrays and integer tensors pass; the range is checked
    by :func:`_check_range` when the plan is made."""
    if isinstance(ids, Tensor):
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise InvalidTypeError(f"`individuals` must hold integer ids, got dtype {ids.dtype}")
        ids = ids.detach().cpu().numpy()
    try:
        ids = np.asarray(ids)
    except (ValueError, TypeError) as error:
        raise InvalidTypeError(f"`individuals` must be a 1-D list or integer tensor of ids, got "
                               f"{type(ids).__name__} {ids!r:.80}") from error
    if ids.dtype.kind not in "iu" and ids.size:  # (an empty list is float64 to NumPy)
        raise InvalidTypeError(f"`individuals` must hold integer ids, got dtype {ids.dtype} ({ids!r:.80})")
    if ids.ndim != 1:
        raise InvalidValueError(f"`individuals` must be a 1-D list or integer tensor of ids, got shape {ids.shape}")
    return ids


def _check_range(ids: np.ndarray, num: int) -> np.ndarray:
    """``ids`` as int64 if every id is in ``[0, num)``, else :class:`InvalidIndexError` naming the first bad one."""
    if ids.size:
        bad = np.flatnonzero((ids < 0) | (ids >= num))
        if bad.size:
            raise InvalidIndexError(f"`individuals` holds id {int(ids[bad[0]])}, out of range [0, {num}) (at "
                                    f"position {int(bad[0])})")
    return ids.astype(np.int64, copy=False)


def _plan(row_ids: np.ndarray, num: int, device: torch.device) -> tuple[Route, Tensor | None]:
    """Route for rows owned by ``row_ids`` (any order, each in ``[0, num)``) and the permutation that
    groups them by id."""
    n = row_ids.size
    if n == 0:
        return Route(n=0, groups=0, chunk=0), None
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
                 dest=to_device(dest), dest_host=dest), perm


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

    Ids may be Python ints, NumPy integers or integer tensors (``individuals``
    also a NumPy array). An empty batch routes in every layout and gives
    ``(0, ..)`` outputs, as the base model does: with ``individuals=ids`` 0
    rows split among any number of ids (``b = 0``), and ``individuals=[]``
    fits only 0 rows (or a broadcast batch, giving 0 rows).

    Raises:
        InvalidIndexError: an id out of ``[0, num)`` (no negative wrap-around).
        InvalidTypeError: an id that is not an integer (floats, bools, strings),
            ids that are not a list / array / tensor, or a non-bool
            ``all_individuals`` / ``broadcast``.
        InvalidValueError: ``individuals`` that is not 1-D.
        RouteError: conflicting arguments, a batch size that does not fit the
            layout (both sizes are named), or inputs whose feature size does
            not fit a target Linear (the message counts the rows passed, not
            the rows a broadcast repeated them to). Any other error of the
            model in a broadcast forward gets a note naming the rows passed.
    """
    all_individuals = check_bool("all_individuals", all_individuals)
    broadcast = check_bool("broadcast", broadcast)
    given = [individual is not None, individuals is not None, all_individuals]
    if sum(given) > 1:
        raise RouteError("pass at most one of `individual=`, `individuals=` and `all_individuals=True`, got "
                         + ", ".join(name for name, g in zip(("individual", "individuals", "all_individuals"), given) if g))
    if broadcast and not (all_individuals or individuals is not None):
        raise RouteError("`broadcast=True` needs `all_individuals=True` or `individuals=`")
    if individual is not None:  # checked before anything moves
        if isinstance(individual, Tensor) and individual.dim() and individual.numel() == 1:
            individual = individual.reshape(())
        individual = check_index("individual", individual, num)
    ids = None if individuals is None else _host_ids(individuals)
    leaves = _leaves((args, kwargs))
    if device is not None and any(t.device != device for t in leaves):
        non_blocking = device.type == "cuda"  # host -> device only: a device -> host copy must be synchronous
        args, kwargs = map_tensors((args, kwargs), lambda t: t.to(device, non_blocking=non_blocking))
    if not any(given):
        return model(*args, **kwargs)

    n_in = _batch_size(leaves)
    dev = device if device is not None else leaves[0].device
    perm = None
    times, how = 1, ""  # the route's rows are `times` copies of the user's batch
    if individual is not None:
        route = Route(n=n_in, groups=1, chunk=n_in, index=slice(individual, individual + 1))
    elif all_individuals:
        if n_in == 1 or broadcast:
            args, kwargs = _expand((args, kwargs), num)
            route = Route(n=num * n_in, groups=num, chunk=n_in)
            times, how = num, f"the whole batch for each of {num} individuals"
        elif n_in % num == 0:
            route = Route(n=n_in, groups=num, chunk=n_in // num)
        else:
            raise RouteError(
                f"batch of {n_in} rows cannot be split among pop_size={num} individuals; pass a batch "
                f"divisible by {num} (rows laid out (p b)), a single row, or `broadcast=True` to give "
                "every individual the whole batch"
            )
    else:
        m = ids.size
        expand = n_in == 1 or broadcast  # every id sees the whole batch, whatever its size
        if expand:
            args, kwargs = _expand((args, kwargs), m)
            times, how = m, f"the whole batch for each of {m} ids"
        elif n_in % m if m else n_in:  # one id per row, or rows divisible by the ids (0 ids fit 0 rows)
            raise RouteError(
                f"batch of {n_in} rows does not fit {m} individual ids: pass one id per row, a single "
                f"row, a batch divisible by {m} (split (p b)), or `broadcast=True`"
            )
        repeats = n_in if expand else n_in // m if m else 0
        key = (ids.dtype, ids.tobytes(), repeats, num, dev)
        if router.last_plan is not None and router.last_plan[0] == key:  # same rows as last call (env loops)
            route, perm = router.last_plan[1]
        else:
            route, perm = _plan(np.repeat(_check_range(ids, num), repeats), num, dev)
            router.last_plan = (key, (route, perm))
        if perm is not None:  # group rows by id once for the whole forward; unsorted once at the end
            args, kwargs = map_tensors((args, kwargs), lambda t: t.index_select(0, perm) if t.dim() else t)

    origin = _Origin(n_in, leaves, times, how)
    try:
        out = router.run(route, adapters, model, args, kwargs, origin)
    except Exception as error:
        if times > 1 and hasattr(error, "add_note") and not isinstance(error, RouteError):
            error.add_note(f"populora: this routed forward ran the model on {route.n} rows, {origin.how}: the "
                           f"batch passed has {n_in} rows (first input of shape {origin.shape()}), so row counts "
                           "above count the repeated rows")
        raise
    if perm is None:
        return out
    return map_tensors(out, lambda t: torch.empty_like(t).index_copy_(0, perm, t) if t.dim() and t.shape[0] == route.n else t)


def _expand(inputs: Any, times: int) -> Any:
    """Repeat every tensor leaf ``times`` times along the batch: ``(b, ..) -> ((times b), ..)``."""
    return map_tensors(inputs, lambda t: t.unsqueeze(0).expand(times, *t.shape).reshape(times * t.shape[0], *t.shape[1:])
                if t.dim() else t)
