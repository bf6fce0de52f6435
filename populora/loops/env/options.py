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

Each checks its fields when built (``EnvOptions(num_envs='x')`` raises there, naming the field, the value and
what was expected); what needs the environment or the model (``to_range`` against the action space, the values
``evolve_kwargs`` give an operator) is checked again where it is used, before any episode runs.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from populora.checks import check_bool, check_float, check_int, check_one_of
from populora.errors import InvalidTypeError, InvalidValueError
from populora.population.population import Population

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

    def __post_init__(self) -> None:
        from populora.envs.schedule import EPISODE_SEEDINGS

        check_int("Episodes.num_episodes", self.num_episodes, low=1)
        check_one_of("Episodes.seeding", self.seeding, EPISODE_SEEDINGS)
        if self.fitness is not None and not callable(self.fitness):
            raise InvalidTypeError(f"`Episodes.fitness` must be callable, got {self.fitness!r:.80}")


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

    def __post_init__(self) -> None:
        if self.episodes is not None:
            check_int("Validation.episodes", self.episodes, low=0)
        if self.top is not None:
            check_int("Validation.top", self.top, low=1)


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

    def __post_init__(self) -> None:
        if self.dir is not None and not isinstance(self.dir, (str, os.PathLike)):
            raise InvalidTypeError(f"`Checkpointing.dir` must be a folder path (str or Path), got {self.dir!r:.80}")
        if check_bool("Checkpointing.resume", self.resume) and self.dir is None:
            raise InvalidValueError("`Checkpointing(resume=True)` needs `dir`")


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

    def __post_init__(self) -> None:
        from populora.envs.spaces import check_obs_keys

        if self.num_envs is not None:
            check_int("EnvOptions.num_envs", self.num_envs, low=1)
        if self.device is not None:
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError, ValueError):
                raise InvalidValueError(
                    "`EnvOptions.device` must be None, a torch.device or a device string such as 'cpu' or 'cuda:0', "
                    f"got {self.device!r:.80}"
                ) from None
        for name in ("flatten_obs", "normalize_obs"):
            check_bool(f"EnvOptions.{name}", getattr(self, name))
        if self.to_range is not None:
            _check_range(self.to_range)
        for name in ("obs_keys", "drop_obs_keys"):
            if isinstance(getattr(self, name), Iterator):  # read once: kept as a tuple
                object.__setattr__(self, name, tuple(getattr(self, name)))
        try:
            check_obs_keys(self.obs_keys, self.drop_obs_keys)
        except (InvalidTypeError, InvalidValueError) as err:
            raise type(err)(
                str(err)
                .replace("`obs_keys`", "`EnvOptions.obs_keys`")
                .replace("`drop_obs_keys`", "`EnvOptions.drop_obs_keys`")
            ) from None


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

    def __post_init__(self) -> None:
        if self.max_env_steps is not None:
            check_int("Budget.max_env_steps", self.max_env_steps, low=1)
        if self.max_seconds is not None:
            check_float("Budget.max_seconds", self.max_seconds, low=0.0, low_open=True)


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

    def __post_init__(self) -> None:
        for name in ("evolve_kwargs", "population_kwargs"):
            if not isinstance(getattr(self, name), Mapping):
                raise InvalidTypeError(f"`GA.{name}` must be a dict, got {getattr(self, name)!r:.80}")
        check_evolve_keys(dict(self.evolve_kwargs))  # a misspelt key is named here; its values at the run


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

    def __post_init__(self) -> None:
        from populora.es.shaping import FITNESS_SHAPINGS
        from populora.loops.env.es_env import ES_OPTIMIZERS

        check_float("ES.sigma", self.sigma, low=0.0, low_open=True)
        check_float("ES.lr", self.lr, low=0.0, low_open=True)
        if self.optimizer is None or isinstance(self.optimizer, str):
            check_one_of("ES.optimizer", "adam" if self.optimizer is None else self.optimizer, ES_OPTIMIZERS)
        if self.max_speed is not None:
            check_float("ES.max_speed", self.max_speed, low=0.0, low_open=True)
        if self.momentum is not None:
            check_float("ES.momentum", self.momentum, low=0.0, high=1.0, high_open=True)
        if not (callable(self.fitness_shaping) or self.fitness_shaping in FITNESS_SHAPINGS):
            raise InvalidValueError(
                f"`ES.fitness_shaping` must be one of {sorted(FITNESS_SHAPINGS)} or a function, "
                f"got {self.fitness_shaping!r:.80}"
            )
        if not isinstance(self.extra, Mapping):
            raise InvalidTypeError(f"`ES.extra` must be a dict of EggrollES arguments, got {self.extra!r:.80}")
        own = sorted(set(self.extra) & {f.name for f in fields(ES)})
        if own:
            raise InvalidValueError(f"`ES.extra` names {own}, which are ES's own fields: pass ES({own[0]}=...) instead")

    def es_kwargs(self) -> dict[str, Any]:
        """The options as EggrollES keyword arguments (``sigma``, ``lr`` and ClipUp's options included)."""
        out: dict[str, Any] = {"sigma": self.sigma, "lr": self.lr, "fitness_shaping": self.fitness_shaping}
        out["optimizer"] = self.optimizer
        for name in ("max_speed", "momentum"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return {**out, **dict(self.extra)}


def _check_range(to_range: Any) -> None:
    """``EnvOptions.to_range``: a pair ``(lo, hi)`` of numbers or arrays (checked against the Box later)."""
    if not isinstance(to_range, (tuple, list)) or len(to_range) != 2:
        raise InvalidValueError(f"`EnvOptions.to_range` must be a pair (lo, hi), got {to_range!r:.80}")
    try:
        for bound in to_range:
            np.asarray(bound, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidTypeError(
            f"`EnvOptions.to_range` must be a pair of numbers or arrays (lo, hi), got {to_range!r:.80}"
        ) from None


def _evolve_parameters() -> list[str]:
    sig = inspect.signature(Population.evolve_)
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [name for name, p in sig.parameters.items() if name not in ("self", "fitnesses") and p.kind in kinds]


def check_evolve_keys(options: dict[str, Any]) -> None:
    """Every key of ``evolve_kwargs`` is an argument of ``Population.evolve_`` (a misspelling is named)."""
    allowed = _evolve_parameters()
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidTypeError(
                f"`evolve_kwargs` has the key {key!r}{hint}, which Population.evolve_ does not "
                f"take; its arguments are {allowed}"
            )
