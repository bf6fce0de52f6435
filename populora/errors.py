"""The exceptions populora raises.

Each subclasses both :class:`PopuloraError` and the builtin a caller would
expect, so ``except ValueError`` keeps working.
"""


class PopuloraError(Exception):
    """Base class of every error raised by populora."""


class TargetNotFoundError(PopuloraError, ValueError):
    """A ``lora_targets`` entry matches no module, or not a supported one."""


class RouteError(PopuloraError, ValueError):
    """A forward's routing arguments do not fit the batch or the population."""


class FitnessError(PopuloraError, ValueError):
    """A fitness is not a finite float tensor of the expected shape."""


class SpentPopulationError(PopuloraError, RuntimeError):
    """The population was merged into its model and can no longer be used."""
