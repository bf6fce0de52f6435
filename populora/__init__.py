"""populora: a population of LoRA-adapted networks that costs about as much as one network."""

from populora.coevolve.coevolve import Coevolve
from populora.coevolve.hall_of_fame import HallOfFame
from populora.distributed import is_distributed, is_main_rank, local_device, process_rank, rank, world_size
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
    ESStats,
    TorchEggrollES,
    compute_es_gradient,
    generate_lora_noise,
    generate_noise_for_shapes,
    generate_standard_noise,
)
from populora.interact import (
    EnvInteractor,
    EnvStepError,
    EvolveResult,
    GenerationInfo,
    evolve_with_env,
    interact_with_env,
)
from populora.operators import (
    Factors,
    register_crossover,
    register_mutation,
    register_parent_selection,
    register_selection,
)
from populora.optim import ClipUp
from populora.plotting import plot_history
from populora.population.population import Population, SelectionResult
from populora.ratings import Ratings
from populora.selfplay.selfplay import SelfPlay
from populora.stats import GenerationStats

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
