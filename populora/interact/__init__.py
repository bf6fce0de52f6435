"""Evolution against environments: EnvInteractor, interact_with_env, evolve_with_env.

Any environment env-ssl-wrapper adapts (gymnasium, dm_control, ...), given
as one env, a list, a vector env or a factory, becomes ``N`` slots; the
population's individuals play their episodes in them with one routed forward
per timestep (see :mod:`populora.envs.interactor`). Higher fitness is
better.

Modules, each importing only those above it: ``actions`` (outputs to env
actions), ``normalize`` (observation statistics), ``schedule`` (work queue
and episode seeds), ``sources`` / ``vector`` (the slot sources: single envs,
sub-envs of a ``SyncVectorEnv``, vector envs), ``envs`` (:class:`EnvSlots`
and :func:`build_slots`), ``rollout`` (the episode loop), ``interactor``
(:class:`EnvInteractor`), ``champion`` (validation episodes and the
champion), ``es_env`` (EggrollES individuals playing episodes),
``loop`` (:class:`EnvLoop`, the GA and ES loops), ``options`` (the option objects of
:func:`evolve_with_env`), ``evolve`` (:func:`evolve_with_env`), ``presets``
(measured settings per task, and :class:`~populora.loops.env.presets.ConvPolicy`
for image observations).
"""

from populora.envs.actions import ActionFormat
from populora.envs.interactor import EnvInteractor, episode_seed, episode_seeds, interact_with_env
from populora.envs.normalize import ObsNormalizer
from populora.envs.slots import EnvStepError
from populora.loops.env.evolve import EvolveResult, evolve_with_env
from populora.loops.env.generations import GenerationInfo
from populora.loops.env.loop import EnvLoop
from populora.loops.env.options import ES, GA, Budget, Checkpointing, EnvOptions, Episodes, Validation
from populora.stats import GenerationStats

__all__ = [
    "ES",
    "GA",
    "Budget",
    "Checkpointing",
    "EnvOptions",
    "Episodes",
    "Validation",
    "ActionFormat",
    "EnvInteractor",
    "EnvLoop",
    "EnvStepError",
    "EvolveResult",
    "GenerationInfo",
    "GenerationStats",
    "ObsNormalizer",
    "episode_seed",
    "episode_seeds",
    "evolve_with_env",
    "interact_with_env",
]
