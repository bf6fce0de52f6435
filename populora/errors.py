"""Every exception populora raises on bad input or a failed step.

Each subclasses both :class:`PopuloraError` and the builtin a caller would
expect (``ValueError``, ``TypeError``, ``IndexError``, ``RuntimeError``), so
``except PopuloraError`` and ``except ValueError`` both work.
:class:`~populora.interact.EnvStepError` (an environment raised) lives with
the environment code and follows the same rule.
"""


class PopuloraError(Exception):
    """Base class of every error raised by populora."""


class InvalidValueError(PopuloraError, ValueError):
    """An argument has the right type but a value outside what is accepted."""


class InvalidTypeError(PopuloraError, TypeError):
    """An argument has a type that is not accepted."""


class InvalidIndexError(PopuloraError, IndexError):
    """An individual id (or another index) is out of range."""


class TargetNotFoundError(PopuloraError, ValueError):
    """A ``lora_targets`` entry matches no module, or not a supported one."""


class RouteError(PopuloraError, ValueError):
    """A forward's routing arguments do not fit the batch or the population."""


class FitnessError(PopuloraError, ValueError):
    """A fitness is not a finite float tensor of the expected shape."""


class CheckpointError(PopuloraError, ValueError):
    """A checkpoint file or state is missing, damaged, or of another kind."""


class ConfigMismatchError(PopuloraError, RuntimeError):
    """Distributed ranks disagree on a configuration that must be identical."""


class ESStateError(PopuloraError, RuntimeError):
    """An ES object used out of order: a members handle of a generation already told, or the
    torcheggroll API's ``get_stacked_params`` / ``apply_fitness_scores`` before ``prepare_population``."""


class SpentPopulationError(PopuloraError, RuntimeError):
    """The population was merged into its model and can no longer be used."""
