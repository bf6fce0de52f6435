"""The environment adapter: a routed model's individuals playing episodes of any environment.

Any environment env-ssl-wrapper adapts (gymnasium, dm_control, ...), given as one env, a list, a vector env
or a factory, becomes ``N`` slots; the population's individuals play their episodes in them with one routed
forward per timestep. Higher fitness is better. Nothing here knows a GA or an ES: the loops that evolve
against environments live in :mod:`populora.loops.env`.

Modules, each importing only those above it: ``actions`` (outputs to env actions), ``spaces`` (observation
and action spaces), ``normalize`` (observation statistics), ``schedule`` (work queue and episode seeds),
``sources`` / ``vector`` (the slot sources: single envs, sub-envs of a ``SyncVectorEnv``, vector envs),
``slots`` (:class:`EnvSlots` and :func:`build_slots`), ``rollout`` (the episode loop), ``interactor``
(:class:`EnvInteractor`, :func:`interact_with_env`).
"""

from populora.envs.actions import ActionFormat
from populora.envs.interactor import EnvInteractor, episode_seed, episode_seeds, interact_with_env
from populora.envs.normalize import ObsNormalizer
from populora.envs.slots import EnvStepError

__all__ = [
    "ActionFormat",
    "EnvInteractor",
    "EnvStepError",
    "ObsNormalizer",
    "episode_seed",
    "episode_seeds",
    "interact_with_env",
]
