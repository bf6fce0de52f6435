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
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor, nn

from populora.adapters import Factors
from populora.operators.devices import PerDevice
from populora.stats import GenerationStats

__all__ = ["HostBase", "PopulationHost"]


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

    model: nn.Module
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
    _synced: bool

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

    def _undo_on_error(
        self, ids: Tensor, generator_state: Tensor | None = None, rows: Any = None
    ) -> AbstractContextManager[None]:
        """Put back rows ``ids``, the generator and the counters if the block raises."""
        ...

    def modules(self) -> Iterator[nn.Module]: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> Any: ...

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any: ...

    def validate_fitnesses(self, fitnesses: Any) -> Tensor: ...

    def _check_extra(self, extra: Any) -> dict[str, Any]: ...

    def _write_extra(self, extra: Any) -> None: ...

    def _select_parents(
        self, fn: Any, f: Tensor, num_children: Any, culled: Any, num_parents: Any, num_groups: Any, options: dict
    ) -> Tensor: ...

    def _crossover(
        self, fn: Any, parents: Tensor, children: Tensor, fitnesses: Tensor | None, num_groups: int, options: dict
    ) -> None: ...

    def _mutate(self, fn: Any, ids: Tensor, epsilon: float, options: dict) -> None: ...

    def sync_from_main_rank_(self, sync_base_model: bool = False, *, name: str | None = None) -> None: ...

    def set_factors_(
        self, individual: int, factors: Any, *, optimizer: Any = None, optimizer_state: str = "inherit"
    ) -> None: ...


if TYPE_CHECKING:  # the parts are typed against the protocol; at run time they are plain mixins
    HostBase = PopulationHost
else:
    HostBase = object
