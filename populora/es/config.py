"""The typed options of an :class:`~populora.EggrollES`: :class:`EggrollConfig`.

``EggrollES(model, pop_size, sigma, lr, rank, config)`` keeps torcheggroll's five leading parameters; the
rest of what defines the run is one frozen config, stored in the ES's checkpoint (a resume with another is
refused, naming the field). The objects that are not configuration (an ``optimizer`` bound to the model's
parameters, a ``param_filter`` function, the ``device``) stay keywords of the constructor, as in
torcheggroll's signature::

    >>> from populora.es.config import EggrollConfig
    >>> config = EggrollConfig(seed=3, fitness_shaping="centered_rank", noise_reuse=2)
    >>> EggrollConfig.from_dict(config.to_dict()) == config
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from populora.checks import check_bool, check_int, check_seed
from populora.config import Config
from populora.errors import InvalidValueError
from populora.es.shaping import FITNESS_SHAPINGS

__all__ = ["EggrollConfig"]


@dataclass(frozen=True)
class EggrollConfig(Config):
    """Everything an :class:`~populora.EggrollES` run is, besides ``pop_size, sigma, lr, rank``.

    Attributes:
        seed: the noise seed: same seed, same noise, on every rank.
        antithetic: mirrored pairs: member ``i + N/2`` uses ``-E_i`` (``pop_size`` must then be even).
        fitness_shaping: ``'zscore'`` (``(f - mean) / (std + 1e-8)``), ``'centered_rank'``, ``'center'``
            (``f - mean``), ``'raw'``, or a function mapping ``(groups, m)`` fitnesses to weights along the
            last dim (stored by its import path).
        group_size: shape fitness within groups of ``G >= 2`` members (members that share a prompt).
        noise_reuse: reuse each noise for this many generations (noise epoch ``generation // noise_reuse``).
        perturb_vectors: give biases full Gaussian noise; ``False`` freezes every 1-D parameter.
        perturb_unroutable: also perturb the selected parameters the routed forward cannot reach, through the
            ``functional_call`` fallback (see :class:`~populora.EggrollES`).
    """

    seed: int = 0
    antithetic: bool = True
    fitness_shaping: str | Callable[[Tensor], Tensor] = "zscore"
    group_size: int | None = None
    noise_reuse: int = 1
    perturb_vectors: bool = True
    perturb_unroutable: bool = False

    def __post_init__(self) -> None:
        check_fields({f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "EggrollConfig.")

    def with_overrides(self, **overrides: Any) -> EggrollConfig:
        """This config with the fields given (those that are not ``None``) replaced, checked under their own
        names first (``EggrollES(..., seed='x')`` says "`seed` must be an int", as in 0.5.0)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if not given:
            return self
        check_fields(given, "")
        return dataclasses.replace(self, **given)


def check_fields(values: Mapping[str, Any], prefix: str) -> None:
    """Check the :class:`EggrollConfig` fields in ``values``, naming each ``prefix + field``."""
    if "seed" in values:
        check_seed(f"{prefix}seed", values["seed"])
    for name in ("antithetic", "perturb_vectors", "perturb_unroutable"):
        if name in values:
            check_bool(f"{prefix}{name}", values[name])
    if "fitness_shaping" in values:
        shaping = values["fitness_shaping"]
        if not (callable(shaping) or (isinstance(shaping, str) and shaping in FITNESS_SHAPINGS)):
            raise InvalidValueError(
                f"`{prefix}fitness_shaping` must be one of {sorted(FITNESS_SHAPINGS)} or a function, got {shaping!r}"
            )
    if values.get("group_size") is not None:
        check_int(f"{prefix}group_size", values["group_size"], low=2)
    if "noise_reuse" in values:
        check_int(f"{prefix}noise_reuse", values["noise_reuse"], low=1)
