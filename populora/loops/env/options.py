"""The option objects of :func:`~populora.evolve_with_env`: small, frozen, one per concern.

``evolve_with_env`` takes the run's essentials as parameters (``envs, model, pop_size, low_rank, action,
num_generations, horizon, seed, progress, target_fitness, return_history, lora_targets``); everything else
comes in one of these, each with the defaults the flat keywords of 0.3 had::

    evolve_with_env(
        "CartPole-v1", model, 64, 4,
        episodes=Episodes(num_episodes=2, seeding="common"),
        validation=Validation(episodes=10, top=2),
        algorithm=ES(sigma=0.1, lr=0.03, optimizer="clipup"),
        checkpointing=Checkpointing("runs/cartpole", resume=True),
        env_options=EnvOptions(normalize_obs=True),
        budget=Budget(max_env_steps=2_000_000, max_seconds=3600),
    )

They are checked where they are used (before any episode runs), so a bad value raises naming the option.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["ES", "GA", "Budget", "Checkpointing", "EnvOptions", "Episodes", "Validation"]


@dataclass(frozen=True)
class Episodes:
    """How a generation's training fitness is measured (higher is better).

    Attributes:
        num_episodes: training episodes per individual and generation; its fitness is their mean return.
        seeding: ``'independent'`` (every individual meets its own episodes; with ES each antithetic pair
            its own) or ``'common'`` (common random numbers: all individuals of a generation meet the
            same ones).
        fitness: a custom fitness instead of the episode return (GA only), in any of the three signatures
            ``fn(population, individuals=...)``, ``fn(population, idx)``, ``fn(population)``.
    """

    num_episodes: int = 1
    seeding: str = "independent"
    fitness: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Validation:
    """How the champion is judged: fixed validation episodes, never one lucky training episode.

    Attributes:
        episodes: validation episodes per candidate (``0``: no validation, the best of the last generation
            is returned); ``None``: sized by the run (10 for 64 individuals, 3 for 16).
        top: the most candidates validated per generation; ``None``: sized by the run (2 for 64, 1 for 16).
    """

    episodes: int | None = None
    top: int | None = None


@dataclass(frozen=True)
class Checkpointing:
    """Where the run is checkpointed after every generation, and whether it resumes from there.

    Attributes:
        dir: the folder of ``evolve_with_env.pt`` (written atomically by the main rank; every rank reads it
            on resume, so it must be visible to all of them); ``None``: no checkpoints.
        resume: continue from the checkpoint in ``dir`` if there is one, exactly as if never stopped.
    """

    dir: str | Path | None = None
    resume: bool = False


@dataclass(frozen=True)
class EnvOptions:
    """How the environments are made and read.

    Attributes:
        num_envs: envs a factory makes (default: one per individual this rank plays, at most 16).
        device: device of the population (default: the model's, or the local GPU under torchrun).
        flatten_obs: observations as ``gymnasium.spaces.flatten`` gives them, one float32 vector per slot.
        obs_keys: the Dict observation keys to keep (in the space's order); ``None``: all.
        drop_obs_keys: the Dict observation keys to drop (e.g. MiniGrid's ``("mission",)``); ``None``: none.
        normalize_obs: running observation normalisation (frozen within a generation); the returned
            policy includes the normaliser.
        to_range: ``(lo, hi)``: rescale Box actions from ``(-1, 1)`` to it.
    """

    num_envs: int | None = None
    device: str | torch.device | None = None
    flatten_obs: bool = True
    normalize_obs: bool = False
    to_range: tuple[Any, Any] | None = None
    obs_keys: tuple[str, ...] | None = None
    drop_obs_keys: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Budget:
    """When the run stops besides ``num_generations`` and ``target_fitness``.

    Every budget is checked at the end of a generation (a generation is never cut short), and with
    ``progress=True`` the bar counts in the unit of the budget closest to running out (generations, env
    steps or seconds), so its total and time left follow the budget that will stop the run.

    Attributes:
        max_env_steps: stop after the first generation at which the run has taken this many env steps (all
            ranks, validation included).
        max_seconds: stop after the first generation that ends this many wall-clock seconds or more after
            ``evolve_with_env`` was called (rank 0's clock under torchrun, so every rank stops together). A
            resumed run counts from its own call: the budget is this call's, not the run's.
    """

    max_env_steps: int | None = None
    max_seconds: float | None = None


@dataclass(frozen=True)
class GA:
    """The genetic algorithm over a LoRA population (the default algorithm).

    Attributes:
        evolve_kwargs: keyword arguments of :meth:`Population.evolve_ <populora.Population.evolve_>`
            (``survive_frac``, ``elite_frac``, ``mutation_type``, ``epsilon``, ...); ``epsilon`` defaults to
            0.3 here.
        population_kwargs: more :class:`~populora.Population` arguments (``init_scale``, default 1.0 here so
            that individuals act differently from the start; ``nan_policy``; ``dtype``; ...).
    """

    evolve_kwargs: Mapping[str, Any] = field(default_factory=dict)
    population_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ES:
    """EggRoll evolution strategies (:class:`~populora.EggrollES`) on the whole model.

    ``pop_size`` members (even: antithetic pairs) perturb every evolved weight with rank-``low_rank`` noise
    and play as a population's individuals do; the validated individual is the ES's centre.

    Attributes:
        sigma: noise scale.
        lr: the optimizer's learning rate.
        optimizer: ``'adam'``, ``'clipup'`` (:class:`~populora.ClipUp`, PGPE's optimiser: ``lr`` is its step
            size), ``'sgd'``, a ``torch.optim`` optimizer or ``params -> Optimizer``.
        max_speed: ClipUp's speed limit (default ``2 * lr``).
        momentum: ClipUp's momentum (default 0.9).
        fitness_shaping: how fitnesses are shaped before the update (``'centered_rank'``).
        extra: any other :class:`~populora.EggrollES` argument (``antithetic``, ``noise_reuse``, ...).
    """

    sigma: float = 0.3
    lr: float = 0.05
    optimizer: Any = "adam"
    max_speed: float | None = None
    momentum: float | None = None
    fitness_shaping: str = "centered_rank"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def es_kwargs(self) -> dict[str, Any]:
        """The options as EggrollES keyword arguments (``sigma``, ``lr`` and ClipUp's options included)."""
        out: dict[str, Any] = {"sigma": self.sigma, "lr": self.lr, "fitness_shaping": self.fitness_shaping}
        out["optimizer"] = self.optimizer
        for name in ("max_speed", "momentum"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return {**out, **dict(self.extra)}
