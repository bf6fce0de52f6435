"""Evolution against environments: :func:`evolve_with_env`, its option objects, presets and generations.

Modules: ``options`` (the option objects of :func:`evolve_with_env`), ``champion`` (validation episodes and
the champion), ``es_env`` (EggrollES individuals playing episodes), ``generations`` (the GA and ES loops),
``evolve`` (:func:`evolve_with_env`), ``presets`` (measured settings per task, and
:class:`~populora.loops.env.presets.ConvPolicy` for image observations). Episodes are played by
:mod:`populora.envs`.
"""

from populora.loops.env.evolve import EvolveResult, evolve_with_env
from populora.loops.env.generations import GenerationInfo
from populora.loops.env.options import ES, GA, Budget, Checkpointing, EnvOptions, Episodes, Validation

__all__ = [
    "ES",
    "GA",
    "Budget",
    "Checkpointing",
    "EnvOptions",
    "Episodes",
    "EvolveResult",
    "GenerationInfo",
    "Validation",
    "evolve_with_env",
]
