"""The checked options of an :class:`~populora.loops.env.loop.EnvLoop` and of one ``run``: each option object
and value is checked here, before any env is made or any model wrapped."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from populora.checks import check_bool, check_float, check_int, check_one_of
from populora.envs.schedule import EPISODE_SEEDINGS
from populora.errors import InvalidTypeError, InvalidValueError
from populora.loops.env.options import ENV_EVOLUTION, ES, GA, Budget, Checkpointing, EnvOptions, Episodes, Validation
from populora.population.evolution import Evolution

__all__ = [
    "ALGORITHMS",
    "CHECKPOINT_NAME",
    "DEFAULT_VALIDATION_EPISODES",
    "DEFAULT_VALIDATION_TOP",
    "Setup",
    "Stopping",
    "validation_defaults",
]

ALGORITHMS = ("ga", "es")
"""``algorithm`` by name: ``GA()`` (the genetic algorithm over a LoRA population) or ``ES()`` (EggRoll ES)."""

DEFAULT_VALIDATION_EPISODES = 10
"""Most validation episodes per candidate by default (see :func:`validation_defaults`)."""

DEFAULT_VALIDATION_TOP = 2
"""Most candidates (highest training fitness) validated per generation by default."""

CHECKPOINT_NAME = "evolve_with_env.pt"
"""The file :func:`~populora.evolve_with_env` writes in ``Checkpointing(dir=)``."""


def validation_defaults(pop_size: int, num_episodes: int) -> tuple[int, int]:
    """``Validation(episodes, top)`` when left ``None``, sized by the training episodes ``P * E``.

    ``validation_episodes = min(10, max(3, P * E // 6))`` and ``validation_top
    = max(1, min(2, P * E // (3 * validation_episodes)))``: 10 episodes of the
    top 2 for CartPole's 64 individuals (a stop at ``target_fitness`` judged
    on 10 episodes, not 5: measured, 5 let a 462-on-fresh-episodes policy
    stop at 490 validated), 3 episodes of the top 1 for 16 individuals
    (whose 1000-step episodes make every validation episode cost).

    Example:
        >>> validation_defaults(64, 1), validation_defaults(16, 1), validation_defaults(32, 1)
        ((10, 2), (3, 1), (5, 2))
    """
    work = pop_size * num_episodes
    episodes = min(DEFAULT_VALIDATION_EPISODES, max(3, work // 6))
    return episodes, max(1, min(DEFAULT_VALIDATION_TOP, work // (3 * episodes)))


@dataclass(frozen=True)
class Setup:
    """What every generation of a loop plays and evolves with (checked by :func:`check_setup`)."""

    episodes: dict[str, Any]  # action, horizon, num_episodes, to_range, fitness (a custom fitness or None)
    episode_seeding: str
    evolve: Evolution  # every generation's Population.evolve_ options (the GA's)
    seed: int
    validation_episodes: int
    validation_top: int

    @property
    def validating(self) -> bool:
        return self.validation_episodes > 0 and self.validation_top > 0


@dataclass(frozen=True)
class Stopping:
    """When one ``run`` stops, what it reports and where it writes (checked by :func:`check_stopping`)."""

    num_generations: int  # the run's generations at most, those of a resumed file included
    target_fitness: float | None = None
    max_env_steps: int | None = None
    max_seconds: float | None = None
    progress: bool = False
    callback: Callable[[Any], Any] | None = None
    checkpoint: Path | None = None  # written after every generation (rank 0)
    started: float = field(default_factory=lambda: time.monotonic())  # max_seconds counts from the call


def option(name: str, value: Any, kind: type) -> Any:
    """``value`` (an option object of ``kind``), or ``kind()`` for ``None``."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise InvalidTypeError(
            f"`{name}` must be a populora.loops.env.{kind.__name__} (or None for its defaults), got "
            f"{type(value).__name__} {value!r:.80}"
        )
    return value


def check_env_options(options: EnvOptions) -> None:
    """The fields of ``EnvOptions`` checked before any env is made."""
    if options.num_envs is not None:
        check_int("EnvOptions.num_envs", options.num_envs, low=1)
    for name in ("flatten_obs", "normalize_obs"):
        check_bool(f"EnvOptions.{name}", getattr(options, name))
    if options.device is not None:
        try:
            torch.device(options.device)
        except (RuntimeError, TypeError, ValueError):
            raise InvalidValueError(
                f"`EnvOptions.device` must be None, a torch.device or a device string such as 'cpu' or 'cuda:0', "
                f"got {options.device!r:.80}"
            ) from None


def algorithm_of(value: Any) -> GA | ES:
    """``algorithm``: a GA / ES option object, or ``'ga'`` / ``'es'`` for their defaults."""
    if isinstance(value, (GA, ES)):
        return value
    if isinstance(value, str):
        name = check_one_of("algorithm", value, ALGORITHMS)
        return GA() if name == "ga" else ES()
    raise InvalidTypeError(
        f"`algorithm` must be populora.loops.env.GA(...) or ES(...) (or 'ga' / 'es'), got "
        f"{type(value).__name__} {value!r:.80}"
    )


def check_setup(
    algorithm: GA | ES, episodes: Episodes, validation: Validation, seed: Any, pop_size: int, playing: dict[str, Any]
) -> Setup:
    """The loop's options that need no population, as a :class:`Setup` (before any env is made)."""
    evolve = algorithm.evolution if isinstance(algorithm, GA) else ENV_EVOLUTION  # each checked when built
    num_episodes = check_int("Episodes.num_episodes", episodes.num_episodes, low=1)
    seeding = check_one_of("Episodes.seeding", episodes.seeding, EPISODE_SEEDINGS)
    if episodes.fitness is not None and not callable(episodes.fitness):
        raise InvalidTypeError(f"`Episodes.fitness` must be callable, got {episodes.fitness!r:.80}")
    if isinstance(algorithm, ES) and episodes.fitness is not None:
        raise InvalidValueError(
            "`algorithm=ES(...)` plays episodes with EggrollES and does not take `Episodes(fitness=...)` "
            "(a custom fitness goes to EggrollES.step(fitness=fn))"
        )
    auto_episodes, auto_top = validation_defaults(pop_size, num_episodes)
    v_episodes = (
        auto_episodes if validation.episodes is None else check_int("Validation.episodes", validation.episodes, low=0)
    )
    v_top = auto_top if validation.top is None else check_int("Validation.top", validation.top, low=1)
    if isinstance(algorithm, ES):
        v_top = 1  # the ES validates its centre
    episodes_ = {**playing, "num_episodes": num_episodes, "fitness": episodes.fitness}
    return Setup(episodes_, seeding, evolve, check_int("seed", seed), v_episodes, v_top)


def check_stopping(
    num_generations: Any,
    target_fitness: Any,
    budget: Budget,
    progress: Any,
    callback: Any,
    checkpointing: Checkpointing,
) -> tuple[Stopping, bool]:
    """One run's stopping rules, and whether it resumes from its checkpoint (before any env is made)."""
    num_generations = check_int("num_generations", num_generations, low=1)
    if target_fitness is not None:
        target_fitness = check_float("target_fitness", target_fitness)
    if checkpointing.dir is not None and not isinstance(checkpointing.dir, (str, os.PathLike)):
        raise InvalidTypeError(
            f"`Checkpointing.dir` must be a folder path (str or Path), got {checkpointing.dir!r:.80}"
        )
    if checkpointing.resume and checkpointing.dir is None:
        raise InvalidValueError("`Checkpointing(resume=True)` needs `dir`")
    if callback is not None and not callable(callback):
        raise InvalidTypeError(f"`callback` must be callable as callback(info), got {callback!r}")
    path = Path(checkpointing.dir) / CHECKPOINT_NAME if checkpointing.dir is not None else None
    stopping = Stopping(
        num_generations,
        target_fitness,
        budget.max_env_steps,  # each checked when the Budget was built
        budget.max_seconds,
        bool(progress),
        callback,
        path,
    )
    return stopping, bool(checkpointing.resume)
