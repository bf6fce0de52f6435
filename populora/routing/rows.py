"""The rows of a routed forward: nested tensor inputs, the batch size, expansion, and the ids of each row.

Helpers of the front end (:mod:`populora.routing.front`): which tensor inputs
are batch-first (:func:`batch_first`), when rows must keep their input order
(:func:`keeps_order`), and ids read from any integer container
(:func:`host_ids`, :func:`check_range`).

Batch-first inputs: keyword arguments named in :data:`NOT_BATCH_FIRST`
(``cache_position``, ``(T,)`` in Hugging Face models) and 0-d tensors are
never batch-first; the batch size ``n`` is the largest leading dim of the
other tensor inputs, and a tensor leading with 1 while ``n > 1`` (e.g.
``position_ids (1, T)``) broadcasts over the batch. Only batch-first tensors
are expanded or permuted; any other leading dim raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from populora.errors import InvalidIndexError, InvalidTypeError, InvalidValueError, RouteError

__all__ = [
    "BASE",
    "NOT_BATCH_FIRST",
    "batch_first",
    "check_range",
    "expand",
    "host_ids",
    "keeps_order",
    "leaves",
    "map_tensors",
    "split_rows",
]

BASE = -(2**62)
"""The id of the base model: a row routed to ``BASE`` (``individuals=[0, BASE, ...]``) runs through the frozen
base model alone, beside the individuals' rows of the same forward (reference log-probs, a KL term to the
base). An int, so it fits lists, NumPy arrays and tensors of ids; any other negative id stays an error."""

NOT_BATCH_FIRST = frozenset({"cache_position"})
"""Keyword arguments never batch-first (Hugging Face's ``cache_position`` is ``(T,)``): passed unchanged."""

_CACHE_KWARGS = ("past_key_values", "cache")


def map_tensors(obj: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """Apply ``fn`` to every tensor leaf of nested tuples / lists / dicts (named tuples and dict types kept)."""
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


def leaves(obj: Any) -> list[Tensor]:
    """Every tensor leaf of ``obj``, in order."""
    found: list[Tensor] = []

    def keep(t: Tensor) -> Tensor:
        found.append(t)
        return t

    map_tensors(obj, keep)
    return found


def split_rows(obj: Any, m: int, what: str = "inputs") -> Any:
    """``(m, b, ...) -> (m*b, ...)`` for every tensor leaf of ``obj``; each must lead with ``m``.

    Raises:
        RouteError: a tensor leaf that is not ``(m, b, ...)`` (its shape named).
    """
    for t in leaves(obj):
        if t.dim() < 2 or t.shape[0] != m:
            raise RouteError(
                f"with `per_individual=True` every tensor in `{what}` must have shape ({m}, b, ...) "
                f"(one block of rows per individual), got {tuple(t.shape)}"
            )
    return map_tensors(obj, lambda t: rearrange(t, "m b ... -> (m b) ..."))


def batch_first(tensors: list[Tensor], kwargs: dict) -> tuple[int, Callable[[Tensor], bool]]:
    """The batch size ``n`` of a routed forward's inputs, and which tensor inputs are batch-first.

    The rule is the module docstring's: any other leading dim than ``n`` (or 1) raises.

    Raises:
        RouteError: no tensor with a batch dimension, or tensors that disagree on it.
    """
    skip = {id(kwargs[name]) for name in NOT_BATCH_FIRST if isinstance(kwargs.get(name), Tensor)}
    sizes = {t.shape[0] for t in tensors if t.dim() > 0 and id(t) not in skip}
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


def keeps_order(model: nn.Module, kwargs: dict) -> bool:
    """Whether an ``individuals=`` forward keeps its rows in input order (a KV cache may be in play).

    True when a cache is passed (``past_key_values=`` / ``cache=``), or one is
    made (``use_cache=True``, or unset with ``model.config.use_cache`` true:
    Hugging Face models). A cache is an object the routed forward cannot see
    into, so its rows must stay where the caller has them.
    """
    if kwargs and any(kwargs.get(name) is not None for name in _CACHE_KWARGS):
        return True
    use = kwargs.get("use_cache")
    if use is None:
        # (a plain Module without `config` raises inside getattr, which costs microseconds on every forward
        # of a small policy: look in its instance dict; a class forwarding attributes (PEFT) is asked)
        config = vars(model).get("config")
        if config is None and (type(model).__getattr__ is not nn.Module.__getattr__ or hasattr(type(model), "config")):
            config = getattr(model, "config", None)
        use = getattr(config, "use_cache", False)
    return bool(use is True)


def expand(inputs: Any, times: int, on_batch: Callable[[Tensor], bool] = lambda t: t.dim() > 0) -> Any:
    """Repeat every batch-first tensor leaf ``times`` times along the batch: ``(b, ..) -> ((times b), ..)``."""
    return map_tensors(inputs, lambda t: repeat(t, "b ... -> (k b) ...", k=times) if on_batch(t) else t)


def host_ids(ids: Any) -> np.ndarray:
    """Ids as a ``(m,)`` integer NumPy array (a route's plan is made on the host).

    Lists / tuples of ints or NumPy integers, NumPy arrays and integer
    tensors pass; the range is checked by :func:`check_range` when the plan is made.

    Raises:
        InvalidTypeError: ids that are not integers, or not a list / array / tensor.
        InvalidValueError: ids that are not 1-D.
    """
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


def check_range(ids: np.ndarray | Tensor, num: int) -> np.ndarray:
    """``ids`` as int64 if every id is in ``[0, num)`` or :data:`BASE`, else :class:`InvalidIndexError` naming the
    first bad one."""
    if isinstance(ids, Tensor):
        ids = ids.numpy()
    if ids.size:
        bad = np.flatnonzero(((ids < 0) | (ids >= num)) & (ids != BASE))
        if bad.size:
            raise InvalidIndexError(
                f"`individuals` holds id {int(ids[bad[0]])}, out of range [0, {num}) (at position {int(bad[0])})"
            )
    return ids.astype(np.int64, copy=False)
