"""Running a test worker on real processes: gloo over a file:// store, finite timeouts.

A worker is a module-level ``fn(rank, world, store, out, *args)``; it calls
:func:`init_gloo` first and saves what it saw with :func:`save`; :func:`spawn`
starts ``world`` of them and returns their results, rank by rank.
"""

import datetime
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def init_gloo(rank: int, world: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )


def save(result: object, out: str, rank: int) -> None:
    torch.save(result, Path(out) / f"rank{rank}.pt")


def spawn(worker, tmp: Path, *args, world: int = WORLD) -> list:
    """Run ``worker(rank, world, store, out, *args)`` on ``world`` processes; their saved results."""
    mp.spawn(worker, args=(world, str(tmp / "store"), str(tmp), *args), nprocs=world, join=True)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]


def error_of(fn, *args, **kwargs) -> tuple[str, str] | None:
    """``(exception type, message)`` of ``fn(*args, **kwargs)``, or None if it did not raise (for workers to report)."""
    try:
        fn(*args, **kwargs)
    except Exception as error:
        return type(error).__name__, str(error)
    return None
