"""Ranks, id partitioning, the fitness exchange and weight sync over ``torch.distributed``.

Helpers any layer may call; every function works with and without an initialised process group (without
one, or with a world of one, the collectives are no-ops and the rank queries read torchrun's environment
variables ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, so :func:`is_main_rank` is right even before the group
exists). Evolution needs little communication: each rank evaluates its share of the individuals
(:func:`partition`), the fitnesses are exchanged (:func:`all_gather_values`) and every rank then evolves in
lockstep from the same seed; weights travel once, before the first evaluation (:func:`broadcast_tensors_`,
:func:`sync_if_different_`).

Modules: :mod:`~populora.distributed.process_group` (ranks, devices, launch, partitioning),
:mod:`~populora.distributed.broadcasts` (weights and objects from one rank),
:mod:`~populora.distributed.exchange` (the fitness exchange).
"""

from typing import Any

from populora.distributed import exchange as _exchange
from populora.distributed.broadcasts import (
    broadcast_object,
    broadcast_tensor_raw,
    broadcast_tensors_,
    checksum,
    sync_if_different_,
)
from populora.distributed.exchange import all_gather_values, gather_shares
from populora.distributed.process_group import (
    DEFAULT_TIMEOUT_S,
    comm_device,
    default_timeout,
    init_from_env,
    is_distributed,
    is_main_rank,
    local_device,
    local_rank,
    partition,
    process_rank,
    resolve_device,
    world_size,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "all_gather_values",
    "broadcast_object",
    "broadcast_tensor_raw",
    "broadcast_tensors_",
    "bytes_communicated",
    "checksum",
    "comm_device",
    "default_timeout",
    "gather_shares",
    "init_from_env",
    "is_distributed",
    "is_main_rank",
    "local_device",
    "local_rank",
    "partition",
    "process_rank",
    "resolve_device",
    "sync_if_different_",
    "world_size",
]


def __getattr__(name: str) -> Any:
    if name == "bytes_communicated":  # a counter the exchange module updates: read it there
        return _exchange.bytes_communicated
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
