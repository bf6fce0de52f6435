"""What the parts of :class:`~populora.Population` read from each other: one declared interface.

``Population`` is assembled from the class in :mod:`~populora.population.population` (the stacks, the
forward, merging) and three parts, each in its own module: checkpointing
(:mod:`~populora.population.checkpointing`), adapter I/O (:mod:`~populora.population.adapter_io`) and the
genetic algorithm (:mod:`~populora.population.genetic`). A part uses nothing of the population but what
:class:`PopulationHost` lists; its methods annotate ``self`` with it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from populora.adapters import Factors
from populora.operators.devices import PerDevice
from populora.stats import GenerationStats

__all__ = ["PopulationHost"]


class PopulationHost(Protocol):
    """The population as its parts see it.

    Attributes:
        pop_size: ``P``.  low_rank: ``r``.  seed, init_scale, nan_policy: the constructor's.
        device: where ids, fitnesses and the generator live.
        generator: the population's own ``torch.Generator`` (every operator draw).
        generation, eval_seed: counters advanced by ``evolve_``.
        history: one :class:`~populora.stats.GenerationStats` per ``evolve_``.
        target_names: the target paths.  effective_ranks, weight_scales: per target.
        _embedding: per target, whether it is an ``nn.Embedding``.

    The underscored members are the package's own: users see ``factors()``, the counters and the methods
    built on them.
    """

    pop_size: int
    low_rank: int
    seed: int
    init_scale: float
    nan_policy: str
    device: torch.device
    generator: torch.Generator
    generation: int
    eval_seed: int
    history: list[GenerationStats]
    target_names: list[str]
    effective_ranks: list[int]
    weight_scales: list[float]
    _embedding: list[bool]

    def factors(self) -> list[Factors]:
        """Per-target views ``down (P, d, r_t)``, ``up (P, e, r_t)``."""
        ...

    def _full_factors(self) -> list[Factors]:
        """Per-target views ``down (P, d, r)``, ``up (P, e, r)`` (the whole stacks)."""
        ...

    def adapter_parameters(self) -> list[nn.Parameter]:
        """The stacked adapter parameters."""
        ...

    def _check_alive(self) -> None:
        """Raise if the population was merged or closed."""
        ...

    def _check_id(self, individual: Any, name: str = "individual") -> int:
        """An id in ``[0, P)``."""
        ...

    def _ids(self, ids: Any, name: str, *, allow_empty: bool = False, dim: int = 1) -> Tensor:
        """Ids as an int64 tensor on the population's device, each in ``[0, P)``."""
        ...

    def _write(self, ids: Tensor | PerDevice, new: Sequence[Factors]) -> None:
        """Write ``new[t]`` into rows ``ids`` of each target."""
        ...

    def _undo_on_error(self, ids: Tensor, generator_state: Tensor | None = None) -> AbstractContextManager[None]:
        """Put back rows ``ids``, the generator and the counters if the block raises."""
        ...

    def modules(self) -> Iterator[nn.Module]: ...
