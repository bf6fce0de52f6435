"""populora: a population of LoRA-adapted networks that costs about as much as one network.

The public surface is :data:`__all__`. Errors live in :mod:`populora.errors`, the torcheggroll noise
utilities in :mod:`populora.es`, the distributed helpers in :mod:`populora.distributed`; the names the seed
READMEs import from the top (``TorchEggrollES``, ``generate_lora_noise``, ``is_main_rank``, the error
classes, ...) stay importable from here too.
"""

from populora.distributed import is_distributed, is_main_rank, local_device, process_rank, world_size
from populora.envs import EnvInteractor, EnvStepError, interact_with_env
from populora.errors import (
    CheckpointError,
    ConfigMismatchError,
    ESStateError,
    FitnessError,
    InvalidIndexError,
    InvalidTypeError,
    InvalidValueError,
    PopuloraError,
    RouteError,
    SpentPopulationError,
    TargetNotFoundError,
)
from populora.es import (
    EggrollES,
    TorchEggrollES,
    compute_es_gradient,
    generate_lora_noise,
    generate_noise_for_shapes,
    generate_standard_noise,
)
from populora.loops.coevolve import Coevolve, HallOfFame
from populora.loops.env import EvolveResult, GenerationInfo, evolve_with_env
from populora.loops.ratings import Ratings
from populora.loops.selfplay import PopuLoRA, PopuLoRAConfig, SelfPlay
from populora.operators import (
    Factors,
    register_crossover,
    register_mutation,
    register_parent_selection,
    register_selection,
)
from populora.optim import ClipUp
from populora.plotting import plot_history
from populora.population import Evolution, Population, SelectionResult
from populora.routing import BASE
from populora.stats import GenerationStats

ESStats = GenerationStats  # 0.3's name of what EggrollES.tell returns (one record type for a generation)

__version__ = "0.6.0.dev0"

__all__ = [
    "BASE",
    "ClipUp",
    "Coevolve",
    "EggrollES",
    "EnvInteractor",
    "Evolution",
    "EvolveResult",
    "Factors",
    "GenerationInfo",
    "GenerationStats",
    "HallOfFame",
    "Population",
    "PopuloraError",
    "Ratings",
    "SelectionResult",
    "PopuLoRA",
    "PopuLoRAConfig",
    "SelfPlay",
    "TorchEggrollES",
    "evolve_with_env",
    "interact_with_env",
    "is_main_rank",
    "plot_history",
    "register_crossover",
    "register_mutation",
    "register_parent_selection",
    "register_selection",
]
