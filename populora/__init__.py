"""populora: a population of LoRA-adapted networks that costs about as much as one network."""

from .distributed import is_distributed, is_main_rank, local_device, process_rank, rank, world_size
from .es import (
    EggrollES,
    ESStats,
    TorchEggrollES,
    compute_es_gradient,
    generate_lora_noise,
    generate_noise_for_shapes,
    generate_standard_noise,
)
from .errors import (
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
from .operators import (
    Factors,
    register_crossover,
    register_mutation,
    register_parent_selection,
    register_selection,
)
from .population import Population, SelectionResult
from .stats import GenerationStats
from .interact import EnvInteractor, EnvStepError, EvolveResult, GenerationInfo, evolve_with_env, interact_with_env
from .coevolve import Coevolve
from .hall_of_fame import HallOfFame
from .plotting import plot_history
from .matchmaking import Ratings
from .optim import ClipUp
from .selfplay import SelfPlay

__version__ = "0.3.1"

__all__ = [
    "CheckpointError",
    "ClipUp",
    "Coevolve",
    "ConfigMismatchError",
    "ESStateError",
    "ESStats",
    "EggrollES",
    "EnvInteractor",
    "EnvStepError",
    "EvolveResult",
    "Factors",
    "FitnessError",
    "GenerationInfo",
    "GenerationStats",
    "HallOfFame",
    "InvalidIndexError",
    "InvalidTypeError",
    "InvalidValueError",
    "Population",
    "PopuloraError",
    "Ratings",
    "RouteError",
    "SelectionResult",
    "SelfPlay",
    "SpentPopulationError",
    "TargetNotFoundError",
    "TorchEggrollES",
    "compute_es_gradient",
    "evolve_with_env",
    "generate_lora_noise",
    "generate_noise_for_shapes",
    "generate_standard_noise",
    "interact_with_env",
    "is_distributed",
    "is_main_rank",
    "local_device",
    "plot_history",
    "process_rank",
    "rank",
    "register_crossover",
    "register_mutation",
    "register_parent_selection",
    "register_selection",
    "world_size",
]
