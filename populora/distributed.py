"""Ranks, id partitioning, the fitness exchange and weight sync over ``torch.distributed``.

Helpers that any layer may call. Every function works with and without an
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

import atexit
import datetime
import hashlib
import os
import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .errors import InvalidTypeError, InvalidValueError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "all_gather_values",
    "broadcast_object",
    "broadcast_tensor_raw",
    "broadcast_tensors_",
    "bytes_communicated",
    "checksum",
    "default_timeout",
    "init_from_env",
    "is_distributed",
    "is_main_rank",
    "local_device",
    "local_rank",
    "partition",
    "rank",
    "sync_if_different_",
    "world_size",
]

DEFAULT_TIMEOUT_S = 600.0
"""Collective timeout in seconds when ``POPULORA_DIST_TIMEOUT`` is not set."""

bytes_communicated: int = 0
"""Bytes this rank has handed to the fitness exchange (:func:`all_gather_values`).

Counts the payload of the collective on this rank, not wire traffic; read it
as ``populora.distributed.bytes_communicated`` and set it to 0 to restart.
"""

# Broadcasts of many weights go out in buckets of at most this many bytes, so
# syncing a large model never needs a second copy of all of it at once.
_BUCKET_BYTES = 64 * 1024 * 1024
_ALIGN = 16  # bytes; the largest element size (complex128)

# Checksums convert the words of a tensor to int64 in chunks of this many words.
_CHECKSUM_CHUNK = 1 << 22

# dtype codes for broadcast_tensor_raw's header; append only (codes are positions).
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.bool, torch.complex64, torch.complex128,
)
_MAX_NDIM = 64
_NO_TENSOR = -1  # header code: src had no tensor to send

_created_group = False


# --------------------------------------------------------------------------- ranks


def _group_ready() -> bool:
    return dist.is_available() and dist.is_initialized()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidValueError(f"environment variable `{name}` must be an integer, got {value!r}") from None


def is_distributed() -> bool:
    """Whether a process group is initialised and has more than one rank."""
    return _group_ready() and dist.get_world_size() > 1


def rank() -> int:
    """This process's global rank: the group's, else ``$RANK``, else 0."""
    return _this_rank()


def _this_rank() -> int:
    if _group_ready():
        return dist.get_rank()
    return _env_int("RANK", 0)


def world_size() -> int:
    """Number of ranks: the group's, else ``$WORLD_SIZE``, else 1."""
    if _group_ready():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def local_rank() -> int:
    """This process's rank on its machine.

    ``$LOCAL_RANK`` (set by torchrun) when present; otherwise the global rank
    (right for single-machine launchers such as ``torch.multiprocessing.spawn``).
    """
    return _env_int("LOCAL_RANK", rank())


def is_main_rank() -> bool:
    """Whether this process is rank 0 (the one that logs, saves and prints)."""
    return rank() == 0


def local_device() -> torch.device:
    """The device this rank should compute on.

    ``cuda:(local_rank % device_count)`` when CUDA is available (several ranks
    may share one GPU), else the CPU.
    """
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def resolve_device(device: str | torch.device | None, model: torch.nn.Module | None = None) -> torch.device:
    """Where a population (or ES) lives; joins torchrun's process group first if there is one.

    ``None``: :func:`local_device` under torch.distributed, else the model's
    device (CPU for a model without tensors). An index-less ``'cuda'`` means
    this rank's GPU (``cuda:(local_rank % device_count)``) under
    torch.distributed and the current GPU otherwise, so that it compares
    equal to the devices tensors report.
    """
    distributed = init_from_env() or world_size() > 1
    if device is None:
        if distributed:
            return local_device()
        tensors = [] if model is None else [*model.parameters(), *model.buffers()]
        return tensors[0].device if tensors else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return local_device() if distributed else torch.device("cuda", torch.cuda.current_device())
    return device


def default_timeout() -> datetime.timedelta:
    """Collective timeout: ``$POPULORA_DIST_TIMEOUT`` seconds, default 600.

    Raises:
        ValueError: if the variable is not a positive number.
    """
    value = os.environ.get("POPULORA_DIST_TIMEOUT")
    if value is None or value.strip() == "":
        return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidValueError(
            f"environment variable `POPULORA_DIST_TIMEOUT` must be a positive number of seconds, got {value!r}"
        )
    return datetime.timedelta(seconds=seconds)


def _launched_by_torchrun() -> bool:
    return _env_int("WORLD_SIZE", 1) > 1


def _default_backend() -> str:
    backend = os.environ.get("POPULORA_DIST_BACKEND", "").strip()
    if backend:
        return backend
    if torch.cuda.is_available():
        # NCCL refuses two ranks on one GPU; gloo copes (through the CPU).
        ranks_here = _env_int("LOCAL_WORLD_SIZE", 1)
        if ranks_here <= torch.cuda.device_count():
            return "nccl"
    return "gloo"


def _destroy_at_exit() -> None:
    if _created_group and _group_ready():
        try:
            dist.destroy_process_group()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass


def init_from_env(
    timeout: float | datetime.timedelta | None = None,
    backend: str | None = None,
) -> bool:
    """Initialise the process group when launched by torchrun; idempotent.

    Does nothing when a group already exists (whoever made it) or when
    ``$WORLD_SIZE`` is absent or 1. Otherwise initialises from the environment
    (``env://``) with NCCL when CUDA is available and every local rank has a
    GPU of its own, else gloo (``$POPULORA_DIST_BACKEND`` overrides), and
    destroys the group at interpreter exit.

    Args:
        timeout: collective timeout, seconds or a ``timedelta``; default
            :func:`default_timeout`. A rank stuck waiting for a dead peer
            raises after this long instead of hanging.
        backend: force a backend (``"gloo"``, ``"nccl"``, ...).

    Returns:
        Whether the run is distributed (:func:`is_distributed`).

    Raises:
        RuntimeError: if ``$WORLD_SIZE`` > 1 but ``MASTER_ADDR`` / ``MASTER_PORT``
            or ``RANK`` are missing (every rank would otherwise run alone).
    """
    global _created_group
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return is_distributed()
    if not _launched_by_torchrun():
        return False
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} asks for a distributed run, but the environment lacks "
            f"{', '.join(missing)}; launch with `torchrun --nproc-per-node=N script.py` or set them"
        )
    if timeout is None:
        timeout = default_timeout()
    elif not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    backend = backend or _default_backend()
    if backend == "nccl":
        torch.cuda.set_device(local_device())
    dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
    if not _created_group:
        atexit.register(_destroy_at_exit)
    _created_group = True
    return is_distributed()


def _comm_device() -> torch.device:
    """Where collective buffers live: the current GPU for NCCL, else the CPU."""
    if _group_ready() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --------------------------------------------------------------------- partitioning


def partition(num: int, rank: int | None = None, world: int | None = None) -> range:
    """The contiguous block of ids ``[0, num)`` that one rank evaluates.

    Blocks are as equal as possible and in rank order; when ``num`` does not
    divide evenly the first ``num % world`` ranks get one id more. A rank may
    get an empty range when ``num < world``. The blocks of all ranks cover
    every id exactly once.

    Args:
        num: number of ids (individuals).
        rank: the rank; default this process's :func:`rank`.
        world: number of ranks; default :func:`world_size`.

    Returns:
        ``range(start, stop)``, e.g. ``partition(10, 1, 4) == range(3, 6)``.

    Raises:
        ValueError: if ``num < 0``, ``world < 1`` or ``rank`` is outside ``[0, world)``.

    Example:
        >>> [list(partition(5, r, 2)) for r in range(2)]
        [[0, 1, 2], [3, 4]]
    """
    world = world_size() if world is None else world
    rank = _this_rank() if rank is None else rank
    if num < 0:
        raise InvalidValueError(f"`num` must be >= 0, got {num}")
    if world < 1:
        raise InvalidValueError(f"`world` must be >= 1, got {world}")
    if not 0 <= rank < world:
        raise InvalidValueError(f"`rank` must be in [0, {world}), got {rank}")
    base, extra = divmod(num, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


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
    me = rank() if distributed else 0
    if failure is not None and not distributed:
        raise failure
    comm_dtype = torch.float64 if out_dtype == torch.float64 else torch.float32
    device = _comm_device() if distributed else torch.device("cpu")

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
        message = broadcast_object(
            None if failure is None else f"{type(failure).__name__}: {failure}", src=first
        )
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
        raise InvalidValueError(f"`local_ids` must lie in [0, {num}), got ids from {int(ids.min())} to {int(ids.max())}")
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
        ValueError: if the ids are out of range, their count differs from the
            values', or the ranks together miss or repeat an id.
        RuntimeError: on the other ranks, when one rank's call failed.
        Exception: ``error``, re-raised on the rank that passed it.
    """
    if not isinstance(num, int) or isinstance(num, bool) or num < 0:
        raise InvalidValueError(f"`num` must be a non-negative int, got {num!r}")
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
                    f"`local_values` must have shape ({ids.numel()},) to match `local_ids`, "
                    f"got {tuple(values.shape)}"
                )
        except Exception as invalid:  # shared with the other ranks before raising
            failure = invalid
    return _exchange(ids, values, num, failure, out_dtype, not exact_cover).to(device)


# ---------------------------------------------------------------------- weight sync


def _byte_view(t: Tensor) -> Tensor:
    """``t``'s bytes as a flat uint8 tensor (a copy only if ``t`` is not contiguous)."""
    t = t.detach()
    if t.dim() == 0:
        t = t.reshape(1)
    return t.contiguous().view(-1).view(torch.uint8)


def broadcast_tensors_(tensors: Sequence[Tensor], src: int = 0, what: str = "tensors") -> None:
    """Overwrite ``tensors`` in place with rank ``src``'s, on every rank.

    The tensors are packed as raw bytes into few flat buffers (any mix of
    dtypes and devices; buckets of at most 64 MiB, a larger tensor goes
    alone), so a whole model goes in a handful of collectives. Every rank must
    pass tensors of the same shapes and dtypes in the same order; one small
    all-gather of a layout hash checks that first. No-op without a
    distributed group.

    Args:
        tensors: tensors or parameters to overwrite (``requires_grad`` is fine).
        src: the rank whose values everyone receives.
        what: plural noun phrase for the error, e.g. ``"population adapters"``.

    Raises:
        TypeError: if an entry is not a tensor (before any communication).
        ValueError: (on every rank) if the shapes or dtypes differ between ranks.
    """
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise InvalidTypeError(f"`tensors` must hold tensors, got {type(t).__name__}")
    if not is_distributed():
        return
    _check_layout(_all_gather_rows(torch.tensor([_layout_hash(tensors)]))[:, 0], what, src)
    _broadcast(tensors, src)


def _check_layout(hashes: Tensor, what: str, src: int) -> None:
    if bool((hashes != hashes[src]).any()):
        raise InvalidValueError(
            f"{what} have different shapes or dtypes across ranks (layout hashes per rank "
            f"{[f'{v & 0xFFFFFFFF:08x}' for v in hashes.tolist()]}); cannot copy rank {src}'s"
        )


def _broadcast(tensors: list[Tensor], src: int) -> None:
    device = _comm_device()
    bucket: list[Tensor] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > _BUCKET_BYTES:
            _broadcast_bucket(bucket, src, device)
            bucket, size = [], 0
        bucket.append(t)
        size += nbytes
    if bucket:
        _broadcast_bucket(bucket, src, device)


def _broadcast_bucket(bucket: list[Tensor], src: int, device: torch.device) -> None:
    # Each tensor starts at a multiple of 16 bytes, so every slice can be viewed
    # back as its dtype (views need offsets divisible by the element size).
    sizes = [t.numel() * t.element_size() for t in bucket]
    starts = [0]
    for nbytes in sizes:
        starts.append(starts[-1] + -(-nbytes // _ALIGN) * _ALIGN)
    flat = torch.empty(starts[-1], dtype=torch.uint8, device=device)
    if rank() == src:
        for t, start, nbytes in zip(bucket, starts, sizes):
            flat[start : start + nbytes] = _byte_view(t)
    dist.broadcast(flat, src=src)
    if rank() == src:
        return
    with torch.no_grad():
        for t, start, nbytes in zip(bucket, starts, sizes):
            t.copy_(flat[start : start + nbytes].view(t.dtype).view(t.shape))


def _words(t: Tensor) -> Tensor:
    """``t``'s bytes as the widest integer words that tile them."""
    raw = _byte_view(t)
    n = raw.numel()
    if n % 4 == 0:
        return raw.view(torch.int32)
    if n % 2 == 0:
        return raw.view(torch.int16)
    return raw


def checksum(tensors: Sequence[Tensor]) -> Tensor:
    """Deterministic fingerprint of a list of tensors, exact to the bit.

    Integer sums (wrapping in int64) of the tensors' raw bytes, plain and
    weighted by position, plus a hash of the shapes and dtypes. Integer
    addition does not depend on reduction order, so equal tensors give equal
    checksums on any device and thread count; any changed element changes the
    plain sum, swapped elements change the weighted one.

    Args:
        tensors: dense tensors on any devices.

    Returns:
        ``(3,)`` int64 CPU tensor: ``[structure hash, byte sum, weighted byte sum]``.
    """
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise InvalidTypeError(f"`tensors` must hold tensors, got {type(t).__name__}")
    structure = _layout_hash(tensors)
    sums = []
    for k, t in enumerate(tensors):
        words = _words(t)
        plain = torch.zeros((), dtype=torch.int64, device=words.device)
        weighted = torch.zeros((), dtype=torch.int64, device=words.device)
        for start in range(0, words.numel(), _CHECKSUM_CHUNK):
            w = words[start : start + _CHECKSUM_CHUNK].to(torch.int64)
            position = torch.arange(start + 1, start + 1 + w.numel(), dtype=torch.int64, device=w.device)
            plain += w.sum()
            weighted += (w * position).sum()
        sums.append(torch.stack([plain, weighted]).cpu() * (2 * k + 1))
    total = torch.stack(sums).sum(0) if sums else torch.zeros(2, dtype=torch.int64)
    return torch.cat([torch.tensor([structure], dtype=torch.int64), total])


def _layout_hash(tensors: list[Tensor]) -> int:
    layout = repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode()
    return int.from_bytes(hashlib.blake2b(layout, digest_size=8).digest(), "little", signed=True)


def _all_gather_rows(row: Tensor) -> Tensor:
    device = _comm_device()
    row = row.to(device)
    rows = [torch.empty_like(row) for _ in range(world_size())]
    dist.all_gather(rows, row)
    return torch.stack(rows).cpu()


def sync_if_different_(tensors: Sequence[Tensor], what: str, src: int = 0) -> bool:
    """Make ``tensors`` equal across ranks, warning once if they were not.

    All-gathers a :func:`checksum` (three integers per rank). If any rank's
    differs from rank ``src``'s, broadcasts ``src``'s tensors into everyone's
    and emits one ``UserWarning`` on every rank naming ``what`` and the ranks
    that differed. Does nothing without a distributed group.

    Args:
        tensors: the same list of tensors on every rank (e.g. a model's parameters).
        what: plural noun phrase for the warning, e.g. ``"base model parameters"``.
        src: the rank whose tensors win.

    Returns:
        Whether tensors were repaired.

    Raises:
        ValueError: (on every rank) if the shapes or dtypes differ between
            ranks, so that no broadcast can repair them.
    """
    tensors = list(tensors)
    if not is_distributed():
        return False
    table = _all_gather_rows(checksum(tensors))  # (world, 3)
    if bool((table == table[src]).all()):
        return False
    _check_layout(table[:, 0], what, src)
    _broadcast(tensors, src)
    differing = [r for r in range(table.shape[0]) if bool((table[r] != table[src]).any())]
    digests = [f"{(a ^ b) & 0xFFFFFFFF:08x}" for a, b in table[:, 1:].tolist()]
    warnings.warn(
        f"{what} differ across ranks (rank(s) {differing} differ from rank {src}; checksums per rank "
        f"{digests}); broadcasting rank {src}'s. Seed their construction (torch.manual_seed) "
        f"identically on every rank to avoid this.",
        UserWarning,
        stacklevel=2,
    )
    return True


# ------------------------------------------------------------------ object transfer


def broadcast_object(obj: object, src: int = 0) -> object:
    """Send a small picklable object from rank ``src`` to every rank.

    Args:
        obj: the object on ``src``; ignored on the other ranks.
        src: the sending rank.

    Returns:
        ``src``'s object (``obj`` itself without a distributed group).
    """
    if not is_distributed():
        return obj
    box = [obj if rank() == src else None]
    dist.broadcast_object_list(box, src=src, device=_comm_device())
    return box[0]


def broadcast_tensor_raw(
    tensor: Tensor | None, src: int = 0, device: torch.device | str | None = None
) -> Tensor:
    """Send a tensor of any shape and dtype from rank ``src``, without pickling.

    A fixed-size int64 header (dtype code, ndim, shape) goes first, then the
    tensor's bytes in one broadcast. The receivers need not know the shape or
    dtype in advance.

    Args:
        tensor: the tensor on ``src``; ignored (may be ``None``) elsewhere.
        src: the sending rank.
        device: where to put the result; default the tensor's own device on
            ``src`` and the communication device (CPU for gloo, the current GPU
            for NCCL) on the others.

    Returns:
        ``src``'s tensor on every rank (on ``src``, the argument itself when
        no ``device`` is given).

    Raises:
        TypeError: on every rank, if ``src`` passed something that is not a
            tensor of a supported dtype.
        ValueError: on every rank, if ``src``'s tensor has more than 64 dims.
    """
    me_is_src = rank() == src
    if not is_distributed():
        if not isinstance(tensor, Tensor):
            raise InvalidTypeError(f"`tensor` must be a tensor, got {type(tensor).__name__}")
        return tensor if device is None else tensor.to(device)
    comm = _comm_device()
    header = torch.zeros(2 + _MAX_NDIM, dtype=torch.int64)
    problem = ""
    if me_is_src:
        if not isinstance(tensor, Tensor):
            problem = f"`tensor` must be a tensor on rank {src}, got {type(tensor).__name__}"
        elif tensor.dtype not in _DTYPES:
            problem = f"`tensor` has unsupported dtype {tensor.dtype}; supported: {[str(d) for d in _DTYPES]}"
        elif tensor.dim() > _MAX_NDIM:
            problem = f"`tensor` may have at most {_MAX_NDIM} dims, got {tensor.dim()}"
        if problem:
            header[0] = _NO_TENSOR
        else:
            header[0] = _DTYPES.index(tensor.dtype)
            header[1] = tensor.dim()
            header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    header = header.to(comm)
    dist.broadcast(header, src=src)
    header = header.cpu().tolist()
    if header[0] == _NO_TENSOR:
        raise InvalidTypeError(problem or f"rank {src} had no valid tensor to send in broadcast_tensor_raw")
    dtype = _DTYPES[header[0]]
    shape = tuple(header[2 : 2 + header[1]])
    if me_is_src:
        payload = _byte_view(tensor).to(comm)
    else:
        payload = torch.empty(
            torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size(), dtype=torch.uint8, device=comm
        )
    if payload.numel():
        dist.broadcast(payload, src=src)
    if me_is_src:
        return tensor if device is None else tensor.to(device)
    out = payload.view(dtype).view(shape)
    return out if device is None else out.to(device)

