"""Evolution against environments: :func:`evolve_with_env`, its option objects, presets and generations.

Modules: ``options`` (the option objects of :func:`evolve_with_env`), ``setup`` (their checks), ``champion``
(validation episodes and the champion), ``es_env`` (EggrollES individuals playing episodes), ``generations``
(validation, records, stopping rules), ``state`` (the checkpoint), ``loop`` (:class:`EnvLoop`, one generation a
step), ``evolve`` (:func:`evolve_with_env`: an :class:`EnvLoop` run to its end), ``presets`` (measured settings
per task, and :class:`~populora.loops.env.presets.ConvPolicy` for image observations). Episodes are played by
:mod:`populora.envs`.
"""

from populora.loops.env.evolve import EvolveResult, evolve_with_env
from populora.loops.env.generations import GenerationInfo
from populora.loops.env.loop import EnvLoop
from populora.loops.env.options import ES, GA, Budget, Checkpointing, EnvOptions, Episodes, Validation

__all__ = [
    "ES",
    "GA",
    "Budget",
    "Checkpointing",
    "EnvLoop",
    "EnvOptions",
    "Episodes",
    "EvolveResult",
    "GenerationInfo",
    "Validation",
    "evolve_with_env",
]
