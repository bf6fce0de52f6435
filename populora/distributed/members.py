"""Members partitioned across ranks: who owns whom, token rows and verdicts exchanged as tensors, one failure
raised on every rank, and a count of the bytes each exchange puts on the wire.

A population of ``P`` members is cut into contiguous blocks, one per rank (:func:`member_block`, the
:func:`~populora.distributed.partition` rule: the first ``P % world`` ranks get one member more; a rank past
``P`` gets none and still takes part in every collective). A member's rows are generated, checked and trained
on its owner only; what every rank needs (reply token ids, verdicts) is exchanged as int64 tensors, never as
pickled objects.

Every helper is a no-op without a process group (or with one rank): the same code path runs locally.

:data:`traffic` counts, per kind of exchange, the payload bytes THIS rank puts into collectives (its own
contribution to an all-gather / all-reduce, what it broadcasts or sends), not the transport's overhead. Reset
it with :func:`reset_traffic`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from populora.distributed.process_group import comm_device, is_distributed, partition, process_rank, world_size

__all__ = [
    "RankFailure",
    "all_gather_rows",
    "all_reduce_sum_",
    "broadcast_rows_",
    "capture",
    "guarded",
    "member_block",
    "owner_of",
    "raise_if_any_failed",
    "reset_traffic",
    "send_rows",
    "traffic",
]

T = TypeVar("T")

traffic: Counter[str] = Counter()


def reset_traffic() -> None:
    """Set every count of :data:`traffic` back to 0."""
    traffic.clear()


def _count(what: str, *tensors: Tensor) -> None:
    traffic[what] += sum(t.numel() * t.element_size() for t in tensors)


def _active() -> bool:
    return is_distributed() and world_size() > 1


def member_block(num: int, rank: int | None = None, world: int | None = None) -> range:
    """The members ``rank`` owns: a contiguous block of ``[0, num)`` (empty when ``num < world`` leaves it none)."""
    if not _active() and world is None:
        return range(num)
    return partition(num, process_rank() if rank is None else rank, world_size() if world is None else world)


def owner_of(member: int, num: int, world: int | None = None) -> int:
    """The rank that owns ``member`` of a population of ``num`` (0 without a process group)."""
    world = (world_size() if _active() else 1) if world is None else world
    for rank in range(world):
        if member in partition(num, rank, world):
            return rank
    raise ValueError(f"member {member} is not in [0, {num})")


class RankFailure(RuntimeError):
    """Another rank failed in the same phase: raised on every rank but the failing one (which raises its own)."""


def raise_if_any_failed(error: BaseException | None, phase: str) -> None:
    """Every rank learns whether any rank failed in ``phase``; if one did, every rank raises (the failing rank its
    own exception, the others :class:`RankFailure` naming the rank and quoting its error). One all-reduce of
    one int when nobody failed; nobody waits for the collective timeout.

    The protocol: every exchange between ranks starts with this flag (:func:`all_gather_rows` and the loop's
    exchanges call it first), so a rank that failed anywhere meets the others at their next flag. A
    :class:`RankFailure` is a failure every rank already agreed on: it is raised again without a collective."""
    if isinstance(error, RankFailure) or not _active():
        if error is not None:
            raise error
        return
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int64, device=comm_device())
    _count("failure flags", flag)
    dist.all_reduce(flag)
    if int(flag) == 0:
        return
    messages: list[Any] = [None] * world_size()
    dist.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    rank = next(r for r, m in enumerate(messages) if m is not None)
    raise RankFailure(f"{phase} failed on rank {rank}: {messages[rank]}")


def capture(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """``(fn(), None)``, or ``(None, the exception)`` if it raised: the one place that holds an exception
    (a KeyboardInterrupt too) until the other ranks have been told; the caller re-raises it through
    :func:`raise_if_any_failed` (or :func:`all_gather_rows`)."""
    try:
        return fn(), None
    except BaseException as error:  # KeyboardInterrupt too: the others must not wait for this rank
        return None, error


def guarded(fn: Callable[[], T], phase: str) -> T | None:
    """``fn()`` on this rank, then :func:`raise_if_any_failed`: a failure on one rank raises on every rank."""
    out, error = capture(fn)
    raise_if_any_failed(error, phase)
    return out


def all_gather_rows(
    rows: Mapping[int, Sequence[int]], num: int, what: str, error: BaseException | None = None, phase: str = ""
) -> list[list[int]]:
    """Every rank's token rows ``{row index: ids}`` (disjoint across ranks, together ``[0, num)``) as one list in
    row order, on every rank. The payload is one int64 tensor per rank (``[row, length, ids..]`` per row),
    padded to the longest: two all-gathers (sizes, then rows), after the failure flag. ``error``: this rank
    failed before it had its rows; every rank then raises (:func:`raise_if_any_failed`) instead of exchanging."""
    raise_if_any_failed(error, phase or what)
    if not _active():
        return [list(rows[i]) for i in range(num)]
    flat: list[int] = []
    for i in sorted(rows):
        flat += [i, len(rows[i]), *[int(t) for t in rows[i]]]
    device = comm_device()  # NCCL takes CUDA tensors only
    mine = torch.tensor(flat, dtype=torch.int64, device=device)
    world = world_size()
    head = torch.tensor([mine.numel()], dtype=torch.int64, device=device)
    heads = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    _count(what, head)
    dist.all_gather(heads, head)
    width = max(int(h[0]) for h in heads)
    buf = torch.zeros(width, dtype=torch.int64, device=device)
    buf[: mine.numel()] = mine
    parts = [torch.zeros(width, dtype=torch.int64, device=device) for _ in range(world)]
    _count(what, buf)
    dist.all_gather(parts, buf)
    gathered: list[list[int] | None] = [None] * num
    for h, part in zip(heads, parts):
        values, pos = part[: int(h[0])].tolist(), 0
        while pos < len(values):
            i, n = values[pos], values[pos + 1]
            gathered[i] = values[pos + 2 : pos + 2 + n]
            pos += 2 + n
    missing = [i for i, r in enumerate(gathered) if r is None]
    if missing:
        raise RuntimeError(f"{what}: no rank sent rows {missing[:8]} (the ranks disagree on who owns them)")
    return [r for r in gathered if r is not None]


def all_reduce_sum_(tensor: Tensor, what: str) -> Tensor:
    """``tensor`` summed over the ranks, in place (itself without a process group)."""
    if _active():
        _count(what, tensor)
        buf = tensor.to(comm_device())
        dist.all_reduce(buf)
        tensor.copy_(buf)
    return tensor


def broadcast_rows_(tensors: Sequence[Tensor], rows: range, src: int, what: str) -> None:
    """Rows ``rows`` (first dimension) of every tensor, from rank ``src`` to every rank, in place."""
    if not _active() or not len(rows):
        return
    for t in tensors:
        buf = t[rows.start : rows.stop].detach().to(comm_device()).contiguous()
        if process_rank() == src:
            _count(what, buf)
        dist.broadcast(buf, src=src)
        with torch.no_grad():
            t[rows.start : rows.stop] = buf.to(t.device)


def send_rows(tensors: Sequence[Tensor], row: int, src: int, dst: int, what: str) -> None:
    """Row ``row`` of every tensor from rank ``src`` to rank ``dst``, point to point (other ranks do nothing):
    one message per dtype, the rows of every tensor of that dtype packed into one flat buffer."""
    if not _active() or src == dst:
        return
    me = process_rank()
    if me not in (src, dst):
        return
    groups: dict[torch.dtype, list[Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    for dtype, group in groups.items():
        sizes = [t[row].numel() for t in group]
        if me == src:
            buf = torch.cat([t[row].detach().reshape(-1).to(comm_device()) for t in group])
            _count(what, buf)
            dist.send(buf, dst=dst)
        else:
            buf = torch.empty(sum(sizes), dtype=dtype, device=comm_device())
            dist.recv(buf, src=src)
            with torch.no_grad():
                for t, part in zip(group, torch.split(buf, sizes)):
                    t[row] = part.view(t[row].shape).to(t.device)
