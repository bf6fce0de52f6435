"""EggRoll evolution strategies on the routed low-rank path, and the torcheggroll 0.2.0 API.

- :class:`EggrollES`: ask / tell / step ES whose population runs in one routed forward;
  :meth:`EggrollES.ask` hands out the generation's :class:`Individuals`.
- :class:`TorchEggrollES`: the torcheggroll 0.2.0 class, same API.
- :func:`generate_lora_noise`, :func:`generate_standard_noise`,
  :func:`generate_noise_for_shapes`, :func:`compute_es_gradient`: its utilities.

Higher fitness is better everywhere. See ``spec/es.md`` for the semantics.
"""

from . import members as _members
from .compat import TorchEggrollES
from .core import EggrollES, ESStats
from .members import ESStateError, Individuals
from .shaping import FITNESS_SHAPINGS
from .noise import (
    compute_es_gradient,
    generate_lora_noise,
    generate_noise_for_shapes,
    generate_standard_noise,
    stable_seed,
)

__all__ = [
    "FITNESS_SHAPINGS",
    "ESStateError",
    "ESStats",
    "EggrollES",
    "Individuals",
    "TorchEggrollES",
    "compute_es_gradient",
    "generate_lora_noise",
    "generate_noise_for_shapes",
    "generate_standard_noise",
    "stable_seed",
]


def __getattr__(name: str) -> object:
    if name == "Members":  # deprecated alias (warns)
        return _members.Members
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
