"""The rows of a routed forward: nested tensor inputs, the batch size, expansion, and the plan grouping rows by id.

Helpers of :mod:`populora.routing` (the front end): which tensor inputs are
batch-first (:func:`batch_first`, the rule is in :mod:`populora.routing`'s
docstring, "Batch-first inputs"), when rows must keep their input order
(:func:`keeps_order`, "KV caches"), and the :class:`~populora.router.Route`
of rows owned by any ids (:func:`plan`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from populora.errors import InvalidIndexError, InvalidTypeError, InvalidValueError, RouteError
from populora.routing import router
from populora.routing.router import Route

__all__ = ["NOT_BATCH_FIRST", "map_tensors", "split_rows"]


def split_rows(obj: Any, m: int, what: str = "inputs") -> Any:
    """``(m, b, ...) -> (m*b, ...)`` for every tensor leaf of ``obj``; each must lead with ``m``.

    Raises:
        RouteError: a tensor leaf that is not ``(m, b, ...)`` (its shape named).
    """
    for t in _leaves(obj):
        if t.dim() < 2 or t.shape[0] != m:
            raise RouteError(
                f"with `per_individual=True` every tensor in `{what}` must have shape ({m}, b, ...) "
                f"(one block of rows per individual), got {tuple(t.shape)}"
            )
    return map_tensors(obj, lambda t: t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]))


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


NOT_BATCH_FIRST = frozenset({"cache_position"})
"""Keyword arguments never batch-first (Hugging Face's ``cache_position`` is ``(T,)``): passed unchanged."""

_CACHE_KWARGS = ("past_key_values", "cache")


def _batch_first(leaves: list[Tensor], kwargs: dict) -> tuple[int, Callable[[Tensor], bool]]:
    """The batch size ``n`` of a routed forward's inputs, and which tensor inputs are batch-first.

    The rule (module docstring, "Batch-first inputs"): keyword arguments named
    in :data:`NOT_BATCH_FIRST` and 0-d tensors are not batch-first; ``n`` is
    the largest leading dim of the other tensors; of those, a tensor leading
    with 1 while ``n > 1`` (e.g. ``position_ids (1, T)``) broadcasts over the
    batch and is not batch-first either; any other leading dim than ``n``
    raises. Only batch-first tensors are expanded or permuted.
    """
    skip = {
        id(kwargs[name]) for name in NOT_BATCH_FIRST if isinstance(kwargs.get(name), Tensor)
    }  # (no walrus: torch.compile)
    sizes = {t.shape[0] for t in leaves if t.dim() > 0 and id(t) not in skip}
    if not sizes:
        raise RouteError("a routed forward needs at least one tensor input with a leading batch dimension")
    n = max(sizes)
    if len(sizes - {1}) > 1:
        raise RouteError(
            f"tensor inputs disagree on the batch size (leading dims {sorted(sizes)}); "
            "every tensor input of a routed forward must have the batch first (or lead with 1 "
            f"to broadcast over it, or be one of the keywords {sorted(NOT_BATCH_FIRST)})"
        )
    if not skip and len(sizes) == 1:
        return n, lambda t: t.dim() > 0
    return n, lambda t: t.dim() > 0 and t.shape[0] == n and id(t) not in skip


def _keeps_order(model: nn.Module, kwargs: dict) -> bool:
    """Whether an ``individuals=`` forward keeps its rows in input order (a KV cache may be in play).

    True when a cache is passed (``past_key_values=`` / ``cache=``), or one
    is made (``use_cache=True``, or unset with ``model.config.use_cache``
    true: Hugging Face models). A cache is an object the routed forward
    cannot see into, so its rows must stay where the caller has them.
    """
    if any(kwargs.get(name) is not None for name in _CACHE_KWARGS):
        return True
    use = kwargs.get("use_cache")
    if use is None:
        use = getattr(getattr(model, "config", None), "use_cache", False)
    return bool(use is True)


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
        raise InvalidTypeError(
            f"`individuals` must be a 1-D list or integer tensor of ids, got {type(ids).__name__} {ids!r:.80}"
        ) from error
    if ids.dtype.kind not in "iu" and ids.size:  # (an empty list is float64 to NumPy)
        raise InvalidTypeError(f"`individuals` must hold integer ids, got dtype {ids.dtype} ({ids!r:.80})")
    if ids.ndim != 1:
        raise InvalidValueError(f"`individuals` must be a 1-D list or integer tensor of ids, got shape {ids.shape}")
    return ids


def _check_range(ids: np.ndarray, num: int) -> np.ndarray:
    """``ids`` as int64 if every id is in ``[0, num)``, else :class:`InvalidIndexError` naming the first bad one."""
    if isinstance(ids, Tensor):
        ids = ids.numpy()
    if ids.size:
        bad = np.flatnonzero((ids < 0) | (ids >= num))
        if bad.size:
            raise InvalidIndexError(
                f"`individuals` holds id {int(ids[bad[0]])}, out of range [0, {num}) (at position {int(bad[0])})"
            )
    return ids.astype(np.int64, copy=False)


PER_ROW = 4
"""On CPU, unequal groups averaging at most this many rows per id are routed one row per group (see
:func:`_plan`; accelerators keep the padded layout, or ``grouped_mm`` where it runs, see
:data:`populora.router.GROUPED_MM`)."""


def _plan(
    row_ids: np.ndarray,
    num: int,
    device: torch.device,
    keep_order: bool = False,
) -> tuple[Route, Tensor | None]:
    """Route for rows owned by ``row_ids`` (any order, each in ``[0, num)``) and the permutation that
    groups them by id (``None`` when sorted, or with ``keep_order``: the route then takes the rows in
    input order, each target packing them by id)."""
    n = row_ids.size
    if n == 0:
        return Route(n=0, groups=0, chunk=0), None
    per_id = np.bincount(row_ids)
    present = per_id[per_id > 0]  # rows of each id present
    if (
        present.min() != present.max()
        and n <= PER_ROW * present.size
        and device.type == "cpu"
        and router.GROUPED_MM is not True
    ):
        # a few rows per id, unequal: each row its own group, adapters gathered in input order (no
        # permutation, no packing: fewer kernels than the padded layout, for about as many gathered adapters)
        return Route(n=n, groups=n, chunk=1, index=torch.from_numpy(row_ids).to(device, non_blocking=True)), None
    perm = None
    if (row_ids[1:] < row_ids[:-1]).any():
        perm = np.argsort(row_ids, kind="stable")
        row_ids = row_ids[perm]
        if keep_order:
            route, _ = _plan(row_ids, num, device)
            dest = route.dest_host if route.dest is not None else np.arange(n)
            unsorted = np.empty_like(dest)
            unsorted[perm] = dest  # row perm[j] sits at position dest[j] of the sorted layout
            return route._replace(
                dest=torch.from_numpy(unsorted).to(device, non_blocking=True),
                dest_host=dest,
                order=torch.from_numpy(perm).to(device, non_blocking=True),
            ), None
    starts = np.flatnonzero(row_ids[1:] != row_ids[:-1]) + 1
    starts = np.concatenate(([0], starts))  # first row of each id's group
    counts = np.concatenate((starts[1:], [n])) - starts
    uniq, u = row_ids[starts], starts.size

    def to_device(a: np.ndarray) -> Tensor:
        return torch.from_numpy(a).to(device, non_blocking=True)

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
    return Route(
        n=n,
        groups=int(chunks.sum()),
        chunk=c,
        index=to_device(np.repeat(uniq, chunks)),
        dest=to_device(dest),
        dest_host=dest,
        ids=to_device(uniq),
        offs=to_device(np.cumsum(counts).astype(np.int32)),
    ), perm


def _expand(inputs: Any, times: int, on_batch: Callable[[Tensor], bool] = lambda t: t.dim() > 0) -> Any:
    """Repeat every batch-first tensor leaf ``times`` times along the batch: ``(b, ..) -> ((times b), ..)``."""
    return map_tensors(
        inputs,
        lambda t: (
            t.unsqueeze(0).expand(times, *t.shape).reshape(times * t.shape[0], *t.shape[1:]) if on_batch(t) else t
        ),
    )
