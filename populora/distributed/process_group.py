"""The process group: ranks, devices, launch and the split of ids across ranks.

Every function works with and without an initialised process group: without
one (or with a world of one) the rank queries fall back to the environment
variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), so
:func:`is_main_rank` is right even before the group exists. Re-exported by
:mod:`populora.distributed`, the module to import.
"""

from __future__ import annotations

import atexit
import datetime
import os

import torch
import torch.distributed as dist

from populora.errors import InvalidValueError

DEFAULT_TIMEOUT_S = 600.0
"""Collective timeout in seconds when ``POPULORA_DIST_TIMEOUT`` is not set."""

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


def process_rank() -> int:
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
    return _env_int("LOCAL_RANK", process_rank())


def is_main_rank() -> bool:
    """Whether this process is rank 0 (the one that logs, saves and prints)."""
    return process_rank() == 0


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


def comm_device() -> torch.device:
    """Where collective buffers live: the current GPU for NCCL (which takes CUDA tensors only), else the CPU.

    The one place that knows NCCL's device rule: every collective populora
    runs (fitness exchange, broadcasts, ES and Coevolve syncs) puts its
    buffers here.
    """
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
