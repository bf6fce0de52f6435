"""Coevolve's distributed step: probes shared out among the ranks, outputs sent to every rank.

``Coevolve.step(distributed=True)`` runs its probes here. Each rank runs the
probes it owns (round-robin over the probe order) as soon as their inputs have
arrived, and each output goes to every rank in probe order: a tensor as one
raw broadcast after a one-int64 header, any other object pickled. A failed
probe travels like an output, so every rank raises at the same point instead
of waiting for a tensor that never comes. The collectives run in the same
order on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from populora import distributed as pd
from populora.population.population import Population
from populora.stats import GenerationStats

__all__: list[str] = []

# the header ahead of a probe output (one int64)
_KIND_TENSOR, _KIND_OBJECT, _KIND_FAILED = 0, 1, 2


def probe_distributed(
    order: Sequence[str],
    deps: Mapping[str, Sequence[str]],
    run_probe: Callable[[str, Mapping[str, Any]], Any],
    devices: Mapping[str, torch.device],
) -> dict[str, Any]:
    """Every probe's output on every rank, each probe run on its owning rank only.

    Args:
        order: population names in probe order (a probe's inputs come before it).
        deps: per name, the populations whose outputs its probe takes.
        run_probe: ``run_probe(name, outputs)`` runs ``name``'s probe.
        devices: per name, where a received tensor output goes.
    """
    world, me = pd.world_size(), pd.process_rank()
    owner = {name: i % world for i, name in enumerate(order)}
    outputs: dict[str, Any] = {}
    failed: dict[str, BaseException] = {}
    for name in order:
        for mine in order:
            if owner[mine] != me or mine in outputs or mine in failed:
                continue
            if not all(d in outputs or d in failed for d in deps[mine]):
                continue
            bad = [d for d in deps[mine] if d in failed]
            if bad:
                failed[mine] = RuntimeError(f"the probe of {mine!r} needs the outputs of {bad[0]!r}, which failed")
                continue
            try:
                outputs[mine] = run_probe(mine, outputs)
            except Exception as error:
                failed[mine] = error
        outputs[name] = _share(name, owner[name], outputs.get(name), failed.get(name), devices[name])
    return outputs


def _share(name: str, src: int, value: Any, error: BaseException | None, device: torch.device) -> Any:
    """Send ``src``'s probe output of ``name`` to every rank (a tensor: raw broadcast to ``device``)."""
    me_src = pd.process_rank() == src
    kind = torch.zeros(1, dtype=torch.int64)
    if me_src:
        kind[0] = _KIND_FAILED if error is not None else _KIND_TENSOR if isinstance(value, Tensor) else _KIND_OBJECT
    kind = kind.to(pd.comm_device())
    dist.broadcast(kind, src=src)
    code = int(kind.item())
    if code == _KIND_FAILED:
        message = pd.broadcast_object(f"{type(error).__name__}: {error}" if me_src else None, src=src)
        if me_src:
            assert error is not None  # what made the kind _KIND_FAILED
            raise error
        raise RuntimeError(f"the probe of population {name!r} failed on rank {src}: {message}")
    if code == _KIND_OBJECT:
        return pd.broadcast_object(value, src=src)
    return pd.broadcast_tensor_raw(value if me_src else None, src=src, device=None if me_src else device)


def sync_from_main_rank(
    populations: Mapping[str, Population], generation: int, history: Mapping[str, Sequence[GenerationStats]]
) -> tuple[int, dict[str, list]]:
    """Make every rank hold rank 0's populations; returns rank 0's ``(generation, history)``.

    Each population broadcasts its adapters, generator, counters and weight
    scales and checks its base model by checksum
    (:meth:`Population.sync_from_main_rank_`).
    """
    for name, pop in populations.items():
        pop.sync_from_main_rank_(name=name)
    small: dict[str, Any] = pd.broadcast_object(
        {"generation": generation, "history": {n: [tuple(s) for s in h] for n, h in history.items()}}
    )
    return small["generation"], {n: [GenerationStats(*s) for s in h] for n, h in small["history"].items()}
