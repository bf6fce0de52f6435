"""Evolution against environments: EnvInteractor, interact_with_env, evolve_with_env.

Any environment env-ssl-wrapper adapts (gymnasium, dm_control, ...), given
as one env, a list, a vector env or a factory, becomes ``N`` slots; the
population's individuals play their episodes in them with one routed forward
per timestep (see :mod:`populora.interact.interactor`). Higher fitness is
better.
"""

from ..stats import GenerationStats
from .actions import ActionFormat
from .envs import EnvStepError
from .evolve import EvolveResult, evolve_with_env
from .interactor import EnvInteractor, episode_seed, episode_seeds, interact_with_env
from .normalize import ObsNormalizer

__all__ = [
    "ActionFormat",
    "EnvInteractor",
    "EnvStepError",
    "EvolveResult",
    "GenerationStats",
    "ObsNormalizer",
    "episode_seed",
    "episode_seeds",
    "evolve_with_env",
    "interact_with_env",
]
