"""Ranks, id partitioning, the fitness exchange and weight sync over ``torch.distributed``.

Helpers any layer may call; every function works with and without an initialised process group (without
one, or with a world of one, the collectives are no-ops and the rank queries read torchrun's environment
variables). :mod:`~populora.distributed.process_group` holds ranks, devices, launch and :func:`partition`;
:mod:`~populora.distributed.broadcasts` weights and objects from one rank;
:mod:`~populora.distributed.exchange` the fitness exchange.
"""

from typing import Any

from populora.distributed import exchange as _exchange_module
from populora.distributed.exchange import *  # noqa: F403
from populora.distributed.exchange import __all__

del bytes_communicated  # noqa: F821  (a counter the exchange module updates: read through __getattr__)


def __getattr__(name: str) -> Any:
    if name == "bytes_communicated":
        return _exchange_module.bytes_communicated
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
