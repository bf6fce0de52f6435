"""The fitness exchange over ``torch.distributed``: one collective of ``(p,)`` values per generation.

Built on :mod:`~populora.distributed.process_group` (ranks, devices,
launch, :func:`~populora.distributed.process_group.partition`) and :mod:`~populora.distributed.broadcasts`
(weights and objects from one rank). Every function works with and without an
initialised process group: without one (or with a world of one) the
collectives are no-ops and the rank queries fall back to the environment
variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), so
:func:`is_main_rank` is right even before the group exists.

Evolution needs little communication: each rank evaluates its share of the
individuals (:func:`partition`), the fitnesses are exchanged
(:func:`all_gather_values`, one collective of ``(p,)`` values) and every rank
then evolves in lockstep from the same seed. Weights only travel once, before
the first evaluation (:func:`broadcast_tensors_`, :func:`sync_if_different_`).

Failures never hang a run:

* Errors raised inside :func:`all_gather_values` (and the fitness evaluation
  built on it) are exchanged with the values, so every rank raises together.
* A rank that dies elsewhere is detected by the launcher (torchrun and
  ``torch.multiprocessing.spawn`` terminate the remaining workers) or, failing
  that, by the collective timeout that :func:`init_from_env` sets
  (``POPULORA_DIST_TIMEOUT`` seconds, default 600): a peer blocked in a
  collective then raises instead of waiting forever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from populora.checks import check_int
from populora.distributed.broadcasts import broadcast_object
from populora.distributed.process_group import comm_device, is_distributed, process_rank, world_size
from populora.errors import InvalidTypeError, InvalidValueError

__all__ = ["all_gather_values", "bytes_communicated", "gather_shares"]

bytes_communicated: int = 0
"""Bytes this rank has handed to the fitness exchange (:func:`all_gather_values`).

Counts the payload of the collective on this rank, not wire traffic; read it
as ``populora.distributed.bytes_communicated`` and set it to 0 to restart.
"""


# ------------------------------------------------------------------ fitness exchange


def _float_dtype(values: Tensor) -> torch.dtype:
    return values.dtype if values.is_floating_point() else torch.float32


def _exchange(
    ids: Tensor, values: Tensor, num: int, failure: BaseException | None, out_dtype: torch.dtype, count: bool
) -> Tensor:
    """One all-reduce of ``[values (num), counts (num, if count), failed (world)]``.

    Each rank writes its values at its ids into zeros, so the sum is exact and
    the same on every rank (adding zeros keeps NaN and inf). Counts catch ids
    that no rank (or two ranks) supplied; the failure flags let every rank
    raise together when one of them failed.
    """
    global bytes_communicated
    distributed = is_distributed()
    world = world_size() if distributed else 1
    me = process_rank() if distributed else 0
    if failure is not None and not distributed:
        raise failure
    comm_dtype = torch.float64 if out_dtype == torch.float64 else torch.float32
    device = comm_device() if distributed else torch.device("cpu")

    flags = 2 * num if count else num  # where the failure flags start
    buf = torch.zeros(flags + world, dtype=comm_dtype, device=device)
    if failure is None:
        ids = ids.to(device)
        buf[:num].index_add_(0, ids, values.to(device=device, dtype=comm_dtype))
        if count:
            buf[num:flags].index_add_(0, ids, torch.ones(ids.numel(), dtype=comm_dtype, device=device))
    else:
        buf[flags + me] = 1
    if distributed:
        bytes_communicated += buf.numel() * buf.element_size()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)

    failed = buf[flags:].nonzero().flatten().tolist()
    if failed:
        first = failed[0]
        message = broadcast_object(None if failure is None else f"{type(failure).__name__}: {failure}", src=first)
        if failure is not None:
            raise failure
        raise RuntimeError(f"rank(s) {failed} failed while evaluating (rank {first}: {message})")

    counts = buf[num:flags]
    if count and not bool((counts == 1).all()):
        missing = (counts == 0).nonzero().flatten().tolist()
        repeated = (counts > 1).nonzero().flatten().tolist()
        raise InvalidValueError(
            f"every id in [0, {num}) must get exactly one value across all ranks; "
            f"missing ids {missing[:10]}{'...' if len(missing) > 10 else ''}, "
            f"ids given more than once {repeated[:10]}{'...' if len(repeated) > 10 else ''}"
        )
    return buf[:num].to(out_dtype)


def _as_ids(local_ids: Sequence[int] | Tensor, num: int) -> Tensor:
    if isinstance(local_ids, range):
        ids = torch.arange(local_ids.start, local_ids.stop, local_ids.step, dtype=torch.int64)
    else:
        ids = torch.as_tensor(local_ids)
        if ids.numel() == 0:
            ids = ids.to(torch.int64)
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise InvalidTypeError(f"`local_ids` must be integers, got dtype {ids.dtype}")
        ids = ids.to(device="cpu", dtype=torch.int64)
    if ids.dim() != 1:
        raise InvalidValueError(f"`local_ids` must be one-dimensional, got shape {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num):
        raise InvalidValueError(
            f"`local_ids` must lie in [0, {num}), got ids from {int(ids.min())} to {int(ids.max())}"
        )
    return ids


def all_gather_values(
    local_ids: Sequence[int] | Tensor,
    local_values: Sequence[float] | Tensor,
    num: int,
    *,
    error: Exception | None = None,
    exact_cover: bool = False,
) -> Tensor:
    """Assemble per-rank values into the full ``(num,)`` vector on every rank.

    Each rank passes the ids it evaluated and their values; together the ranks
    must supply every id in ``[0, num)`` exactly once (as :func:`partition`
    does). The result is in id order and bit-identical on every rank. NaN and
    inf pass through untouched. Without a process group (or with one rank) the
    local values must cover every id and are merely put in order.

    Every rank must call this with the same ``num``. If one rank failed
    (it passes ``error``, or its arguments are invalid), every rank raises:
    that rank its own error, the others a ``RuntimeError`` quoting it, so no
    rank is left waiting in a collective.

    Args:
        local_ids: ``(k,)`` ids in ``[0, num)`` this rank evaluated (list,
            range or integer tensor; may be empty).
        local_values: ``(k,)`` their values (tensor on any device, or numbers).
        num: total number of ids ``p``.
        error: this rank failed to compute its values; it is raised here
            after telling the other ranks (the ids and values are ignored).
        exact_cover: the caller guarantees that the ranks' ids cover every
            id exactly once (e.g. each passes its :func:`partition`). The
            per-id counts that check it are then not sent: the collective
            carries ``4 * (num + world)`` bytes instead of ``4 * (2 * num + world)``.

    Returns:
        ``(num,)`` values in the input's floating dtype (float32 for
        non-float input), on ``local_values``' device (CPU for non-tensors).

    Raises:
        TypeError: if ``num`` is not an integer (Python, NumPy or 0-d tensor).
        ValueError: if ``num < 0``, the ids are out of range, their count differs from the
            values', or the ranks together miss or repeat an id.
        RuntimeError: on the other ranks, when one rank's call failed.
        Exception: ``error``, re-raised on the rank that passed it.
    """
    num = check_int("num", num, low=0)
    device = local_values.device if isinstance(local_values, Tensor) else torch.device("cpu")
    out_dtype = torch.float32
    ids = values = torch.empty(0)
    failure: BaseException | None = error
    if failure is None:
        try:
            values = local_values.detach() if isinstance(local_values, Tensor) else torch.as_tensor(local_values)
            out_dtype = _float_dtype(values)
            ids = _as_ids(local_ids, num)
            if values.dim() != 1 or values.numel() != ids.numel():
                raise InvalidValueError(
                    f"`local_values` must have shape ({ids.numel()},) to match `local_ids`, got {tuple(values.shape)}"
                )
        except Exception as invalid:  # shared with the other ranks before raising
            failure = invalid
    return _exchange(ids, values, num, failure, out_dtype, not exact_cover).to(device)


def gather_shares(
    compute: Callable[[], tuple[Sequence[int] | Tensor, Tensor]], num: int, *, spread: bool = True
) -> Tensor:
    """Each rank's share from ``compute() -> (ids, values)``, assembled into the ``(num,)`` vector on every rank.

    The ranks' ids must cover ``[0, num)`` exactly once (each its
    :func:`partition`, or all of them on one rank): the exchange is
    :func:`all_gather_values` with ``exact_cover=True``. If ``compute`` raises
    on one rank, every rank raises (that rank its own error, the others a
    ``RuntimeError`` quoting it), so none is left waiting. Without ``spread``
    or a distributed group, ``compute`` runs here and its values are
    returned as they are.

    Example:
        >>> gather_shares(lambda: ([0, 1, 2], torch.tensor([0.5, 1.5, 2.5])), 3)
        tensor([0.5000, 1.5000, 2.5000])
    """
    if not (spread and is_distributed()):
        return compute()[1]
    ids: Sequence[int] | Tensor = []
    values: Tensor = torch.empty(0)
    failure: Exception | None = None
    try:
        ids, values = compute()
    except Exception as error:  # shared with the other ranks, then raised on every rank
        failure = error
    return all_gather_values(ids, values, num, error=failure, exact_cover=True)


# ------------------------------------------------------------------ population sync
