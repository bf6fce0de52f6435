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
what was expected); what needs the environment or the model (``to_range`` against the action space, the
fractions of ``GA.evolution`` against the population's size) is checked again where it is used, before any
episode runs. Each is a :class:`~populora.config.Config` (``to_dict`` / ``from_dict``, ``dataclasses.replace``);
``Budget`` is every loop's, :class:`populora.loops.base.Budget`.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from populora.checks import check_bool, check_float, check_int, check_one_of
from populora.config import Config
from populora.errors import InvalidTypeError, InvalidValueError
from populora.loops.base import Budget
from populora.population.evolution import Evolution

__all__ = ["ES", "GA", "Budget", "Checkpointing", "EnvOptions", "Episodes", "Validation"]

# ``Budget`` is :class:`populora.loops.base.Budget`, every loop's (its ``max_steps`` does not apply to
# evolve_with_env, whose ``num_generations`` caps the generations: it is refused there)


@dataclass(frozen=True)
class Episodes(Config):
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
class Validation(Config):
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
class Checkpointing(Config):
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
class EnvOptions(Config):
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


ENV_EVOLUTION = Evolution(epsilon=0.3)
"""What ``GA()`` evolves with: ``Population.evolve_``'s defaults with mutation scale 0.3 instead of 0.1
(CartPole-v1 with 64 individuals: 5/5 seeds solved, 3/5 with 0.1)."""


@dataclass(frozen=True)
class GA(Config):
    """The genetic algorithm over a LoRA population (the default algorithm).

    Attributes:
        evolution: the options of every generation's :meth:`Population.evolve_ <populora.Population.evolve_>`,
            a :class:`~populora.population.evolution.Evolution` passed whole (default :data:`ENV_EVOLUTION`,
            ``epsilon=0.3``: start from it, ``dataclasses.replace(ENV_EVOLUTION, survive_frac=0.3)``).
        population_kwargs: more :class:`~populora.Population` arguments (``init_scale``, default 1.0 here so
            that individuals act differently from the start; ``nan_policy``; ``dtype``; ``requires_grad``),
            checked key by key when built.
        evolve_kwargs: deprecated since 0.6.0 (goes in 0.7.0): 0.5.0's dict of ``evolve_`` keywords, applied
            over :data:`ENV_EVOLUTION` into ``evolution`` (a ``DeprecationWarning``).
    """

    evolution: Evolution = ENV_EVOLUTION
    population_kwargs: Mapping[str, Any] = field(default_factory=dict)
    evolve_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("evolve_kwargs", "population_kwargs"):
            if not isinstance(getattr(self, name), Mapping):
                raise InvalidTypeError(f"`GA.{name}` must be a dict, got {getattr(self, name)!r:.80}")
        if not isinstance(self.evolution, Evolution):
            raise InvalidTypeError(
                f"`GA.evolution` must be a populora.population.evolution.Evolution, got {self.evolution!r:.80}"
            )
        _check_population_keys(self.population_kwargs)
        dtype = self.population_kwargs.get("dtype")
        if isinstance(dtype, str):  # the name to_dict writes (``'float64'``)
            kind = getattr(torch, dtype.removeprefix("torch."), None)
            if not isinstance(kind, torch.dtype):
                raise InvalidValueError(f"`GA.population_kwargs['dtype']` must be a torch dtype, got {dtype!r:.80}")
            object.__setattr__(self, "population_kwargs", {**self.population_kwargs, "dtype": kind})
        if self.evolve_kwargs:
            check_evolve_keys(dict(self.evolve_kwargs))  # a misspelt key is named
            if self.evolution != ENV_EVOLUTION:
                raise InvalidValueError("pass `GA(evolution=...)` or the deprecated `GA(evolve_kwargs=...)`, not both")
            warnings.warn(
                "GA(evolve_kwargs=) is deprecated since 0.6.0 and goes in 0.7.0: pass "
                "GA(evolution=dataclasses.replace(ENV_EVOLUTION, ...)) (populora.loops.env.options.ENV_EVOLUTION)",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "evolution", ENV_EVOLUTION.with_overrides(**self.evolve_kwargs))
            object.__setattr__(self, "evolve_kwargs", {})

    def to_dict(self) -> dict[str, Any]:
        """As :meth:`Config.to_dict`, with a ``dtype`` of ``population_kwargs`` by its name (``'float64'``)."""
        dtype = self.population_kwargs.get("dtype")
        if not isinstance(dtype, torch.dtype):
            return super().to_dict()
        named = dict(self.population_kwargs, dtype=str(dtype).removeprefix("torch."))
        return {**super(GA, replace(self, population_kwargs={})).to_dict(), "population_kwargs": named}


@dataclass(frozen=True)
class ES(Config):
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
        antithetic, group_size, noise_reuse, perturb_vectors, perturb_unroutable: the fields of
            :class:`~populora.es.config.EggrollConfig` of the same names (with its defaults).
        extra: deprecated since 0.6.0 (goes in 0.7.0): 0.5.0's dict of other :class:`~populora.EggrollES`
            arguments. The keys that are fields here move into them (a ``DeprecationWarning``); ``seed``,
            ``param_filter`` and ``device`` still go to EggrollES; any other key is refused when built.
    """

    sigma: float = 0.3
    lr: float = 0.05
    optimizer: Any = "adam"
    max_speed: float | None = None
    momentum: float | None = None
    fitness_shaping: str = "centered_rank"
    antithetic: bool = True
    group_size: int | None = None
    noise_reuse: int = 1
    perturb_vectors: bool = True
    perturb_unroutable: bool = False
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
        own = sorted(set(self.extra) & set(_ES_OWN))
        if own:
            raise InvalidValueError(f"`ES.extra` names {own}, which are ES's own fields: pass ES({own[0]}=...) instead")
        from populora.es.config import check_fields

        check_fields({k: getattr(self, k) for k in _ES_CONFIG}, "ES.")
        if self.extra:
            _check_es_extra(self.extra)
            warnings.warn(
                f"ES(extra=) is deprecated since 0.6.0 and goes in 0.7.0: pass "
                f"ES({', '.join(f'{k}=...' for k in self.extra if k in _ES_CONFIG) or '...'}) (the fields of "
                "EggrollConfig are ES's own fields now)",
                DeprecationWarning,
                stacklevel=3,
            )
            for key in [k for k in self.extra if k in _ES_CONFIG]:
                object.__setattr__(self, key, self.extra[key])
            object.__setattr__(self, "extra", {k: v for k, v in self.extra.items() if k not in _ES_CONFIG})
            check_fields({k: getattr(self, k) for k in _ES_CONFIG}, "ES.")

    def es_kwargs(self) -> dict[str, Any]:
        """The options as EggrollES keyword arguments (``sigma``, ``lr`` and ClipUp's options included)."""
        out: dict[str, Any] = {"sigma": self.sigma, "lr": self.lr, "fitness_shaping": self.fitness_shaping}
        out["optimizer"] = self.optimizer
        for name in ("max_speed", "momentum"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for name in _ES_CONFIG:  # EggrollConfig's fields, where they differ from its defaults
            if getattr(self, name) != getattr(ES, name):
                out[name] = getattr(self, name)
        return {**out, **dict(self.extra)}


_ES_OWN = ("sigma", "lr", "optimizer", "max_speed", "momentum", "fitness_shaping")
_ES_CONFIG = ("antithetic", "group_size", "noise_reuse", "perturb_vectors", "perturb_unroutable")
_ES_PASSED = ("seed", "param_filter", "device")  # 0.5.0's ES(extra=) keys that still go to EggrollES


def _check_es_extra(extra: Mapping[str, Any]) -> None:
    allowed = (*_ES_CONFIG, *_ES_PASSED)
    for key in extra:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidTypeError(
                f"`ES.extra`: EggrollES got an unexpected keyword argument {key!r}{hint}; `ES.extra` takes "
                f"{list(allowed)}"
            )


def _check_population_keys(options: Mapping[str, Any]) -> None:
    """Every key of ``GA.population_kwargs`` is a keyword of :class:`~populora.Population` set per run."""
    allowed = ("init_scale", "nan_policy", "dtype", "requires_grad")
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidTypeError(
                f"`GA.population_kwargs` has the key {key!r}{hint}, which a run's Population does not take "
                f"(`seed` and the device are evolve_with_env's); it takes {list(allowed)}"
            )


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


def check_evolve_keys(options: dict[str, Any]) -> None:
    """Every key of ``evolve_kwargs`` is a field of :class:`~populora.population.evolution.Evolution` (a
    misspelling is named)."""
    allowed = [f.name for f in fields(Evolution)]
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidTypeError(
                f"`evolve_kwargs` has the key {key!r}{hint}, which Population.evolve_ does not "
                f"take; its arguments are {allowed}"
            )
