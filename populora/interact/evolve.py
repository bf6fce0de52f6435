"""evolve_with_env: evolve a model against an environment in one call.

Each generation: evaluate every individual (:meth:`EnvInteractor.evaluate`),
record ``GenerationStats(generation, best, mean, std)``, stop if the best
reached ``target_fitness`` or this was the last generation, otherwise
``evolve_`` and write a checkpoint. The best individual of the last evaluated
generation is merged into the model and returned. Higher fitness is better.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..checkpoint import atomic_save, load_checkpoint
from ..checks import check_float, check_int
from ..distributed import checksum, is_main_rank, world_size
from ..errors import CheckpointError, InvalidTypeError, InvalidValueError
from ..population import Population
from ..stats import GenerationStats
from .actions import ActionFn
from .envs import DEFAULT_NUM_ENVS, is_factory
from .interactor import EnvInteractor, interact_with_env

__all__ = ["CHECKPOINT_NAME", "EvolveResult", "evolve_with_env"]

CHECKPOINT_NAME = "evolve_with_env.pt"
_FORMAT = "populora.evolve_with_env/2"
_FORMATS = ("populora.evolve_with_env/1", _FORMAT)  # /1: 0.1's population state() and normalizer_state()


class EvolveResult(NamedTuple):
    """What :func:`evolve_with_env` returns (``policy, history = evolve_with_env(...)``).

    Attributes:
        policy: the model with the best individual of the last generation
            merged in (``nn.Sequential(normaliser, model)`` with
            ``normalize_obs=True``, so it takes raw observations).
        history: one :class:`~populora.stats.GenerationStats` per evaluated generation.
    """

    policy: nn.Module
    history: list[GenerationStats]


@dataclass(frozen=True)
class _Run:
    """The checked options of one call, grouped as the docstring of :func:`evolve_with_env` groups them."""

    num_generations: int
    target_fitness: float | None
    progress: bool
    episodes: dict[str, Any]  # EnvInteractor.evaluate's: action, horizon, num_episodes, fitness, to_range
    evolve: dict[str, Any]  # Population.evolve_'s
    checkpoint: Path | None
    resume: bool


def evolve_with_env(
    envs: Any,
    model: nn.Module,
    pop_size: int,
    low_rank: int,
    action: ActionFn | None = None,
    num_generations: int = 100,
    horizon: int | None = None,
    seed: int = 0,
    progress: bool = False,
    target_fitness: float | None = None,
    return_history: bool = True,
    lora_targets: str | Sequence[str] | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    evolve_kwargs: dict[str, Any] | None = None,
    *,
    num_episodes: int = 1,
    fitness: Callable[..., Any] | None = None,
    to_range: tuple[Any, Any] | None = None,
    normalize_obs: bool = False,
    flatten_obs: bool = True,
    num_envs: int | None = None,
    device: str | torch.device | None = None,
    population_kwargs: dict[str, Any] | None = None,
) -> EvolveResult:
    """Evolve ``model`` against ``envs`` with a LoRA population and return the best policy.

    Higher fitness is better: by default the fitness of an individual is the
    mean return of its ``num_episodes`` episodes (common random numbers: all
    individuals of a generation meet the same episodes). Under torchrun each
    rank plays its share of individuals on its own envs; every rank evolves
    in lockstep and returns the same policy.

    The arguments, by group (the first twelve are the 0.1 signature, in order):

    * what to evolve: ``envs``, ``model``, ``pop_size``, ``low_rank``,
      ``lora_targets``, ``seed``, and ``population_kwargs`` for the rest of
      the Population's arguments;
    * how long: ``num_generations``, ``target_fitness``;
    * the episodes: ``action``, ``horizon``, ``num_episodes``, ``to_range``,
      or a custom ``fitness`` instead;
    * the environments: ``num_envs``, ``flatten_obs``, ``normalize_obs``, ``device``;
    * the evolution step: ``evolve_kwargs``;
    * checkpoints: ``checkpoint_dir``, ``resume``;
    * reporting: ``progress``, ``return_history``.

    Args:
        envs: one env, a list, a vector env, or a factory (see
            :func:`~populora.interact_with_env`).
        model: the base model, wrapped in place (its targets get adapters).
        pop_size: individuals ``P >= 2``.
        low_rank: adapter rank ``r >= 1``.
        action: ``action(outputs) -> actions`` for ``k`` slots; default
            ``argmax(-1)`` for a Discrete space, the outputs otherwise.
        num_generations: generations evaluated at most.
        horizon: maximum steps of one episode (``None``: until the env ends it).
        seed: seeds the population (adapters, operators, episode seeds).
        progress: tqdm bar over generations with best / mean fitness (main rank).
        target_fitness: stop after the first generation whose best fitness
            reaches it.
        return_history: ``True`` (the default): the result is
            ``EvolveResult(policy, history)``. Deprecated ``False`` returns the
            policy alone, with a ``DeprecationWarning``; from the next release
            the result is always an ``EvolveResult`` (take ``.policy``).
        lora_targets: target layers; ``None`` targets every ``nn.Linear``.
        checkpoint_dir: write ``evolve_with_env.pt`` there atomically after
            every generation (main rank only; on resume every rank reads it,
            so it must be visible to all of them).
        resume: continue from the checkpoint in ``checkpoint_dir`` if there is
            one: the run goes on exactly as if never stopped (same model
            needed: it is checked by checksum).
        evolve_kwargs: keyword arguments of ``Population.evolve_``
            (``survive_frac``, ``elite_frac``, ``mutation_type``, ``epsilon``, ...).
        num_episodes: episodes per individual and generation.
        fitness: custom fitness instead of the episode return, in any of the
            three signatures (``fn(population, individuals=...)``,
            ``fn(population, idx)``, ``fn(population)``).
        to_range: ``(lo, hi)``: rescale Box actions from ``(-1, 1)``.
        normalize_obs: running observation normalisation (frozen within a
            generation); the returned policy includes the normaliser.
        flatten_obs: flatten dict observations into one vector.
        num_envs: envs a factory makes; default one per individual this
            rank plays (``ceil(pop_size / world_size)``), at most
            :data:`~populora.interact.envs.DEFAULT_NUM_ENVS` (16).
        device: device of the population (default: the model's, or the local
            GPU under torchrun).
        population_kwargs: more Population arguments (``init_scale``,
            default 1.0 here so that individuals act differently from the
            start; ``nan_policy``; ``dtype``; ...).

    Returns:
        ``EvolveResult(policy, history)``: a named tuple, so
        ``policy, history = evolve_with_env(...)`` unpacks it; ``history``
        holds one ``GenerationStats(generation, best, mean, std)`` per
        evaluated generation (``std`` with ``correction=0``).

    Raises:
        InvalidValueError / InvalidTypeError: bad arguments, including
            ``evolve_kwargs`` (an unknown key, operator or value), before any
            episode runs.
        CheckpointError: ``resume=True`` on a damaged file, a file of another
            kind, or one written with another model (the file is named).

    On any error the model comes back unwrapped, its ``requires_grad`` flags
    restored.
    """
    if not return_history:
        warnings.warn("`evolve_with_env(return_history=False)` is deprecated: it returns the policy alone for now, "
                      "and from the next release the result is always EvolveResult(policy, history); use "
                      "`evolve_with_env(...).policy`", DeprecationWarning, stacklevel=2)
    run = _check_options(num_generations, target_fitness, progress, checkpoint_dir, resume, evolve_kwargs,
                         population_kwargs, dict(action=action, horizon=horizon, num_episodes=num_episodes,
                                                 fitness=fitness, to_range=to_range))
    if num_envs is None and is_factory(envs):
        share = -(-check_int("pop_size", pop_size, low=1) // max(1, world_size()))
        num_envs = min(share, DEFAULT_NUM_ENVS)

    interactor = interact_with_env(envs, device, num_envs=num_envs, flatten_obs=flatten_obs,
                                   normalize_obs=normalize_obs)
    try:
        population = interactor.population(model, pop_size, low_rank, lora_targets, seed=seed,
                                           **(population_kwargs or {}))
        try:
            merged, history = _evolve(population, interactor, run)
        except BaseException:
            population.close()  # the user's model comes back unwrapped, its requires_grad flags restored
            raise
        policy = interactor.wrap_policy(merged)
    finally:
        interactor.close()
    return EvolveResult(policy, history) if return_history else policy


def _check_options(num_generations: Any, target_fitness: Any, progress: Any, checkpoint_dir: Any, resume: Any,
                   evolve_kwargs: Any, population_kwargs: Any, episodes: dict[str, Any]) -> _Run:
    """The options that need no population checked (before any env is made), as a :class:`_Run`."""
    num_generations = check_int("num_generations", num_generations, low=1)
    if evolve_kwargs is not None and not isinstance(evolve_kwargs, dict):
        raise InvalidTypeError(f"`evolve_kwargs` must be a dict of Population.evolve_ arguments, got {evolve_kwargs!r}")
    if population_kwargs is not None and not isinstance(population_kwargs, dict):
        raise InvalidTypeError(f"`population_kwargs` must be a dict of Population arguments, got {population_kwargs!r}")
    if target_fitness is not None:
        target_fitness = check_float("target_fitness", target_fitness)
    if resume and checkpoint_dir is None:
        raise InvalidValueError("`resume=True` needs `checkpoint_dir`")
    evolve = dict(evolve_kwargs or {})
    _check_evolve_keys(evolve)
    path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
    return _Run(num_generations, target_fitness, bool(progress), episodes, evolve, path, bool(resume))


def _stats(generation: int, fitnesses: Tensor) -> GenerationStats:
    return GenerationStats(generation, float(fitnesses.max()), float(fitnesses.mean()),
                           float(fitnesses.std(correction=0)))


def _evolve(population: Population, interactor: EnvInteractor, run: _Run) -> tuple[nn.Module, list[GenerationStats]]:
    """The generations of :func:`evolve_with_env`: the merged best model and the history."""
    population.sync_from_main_rank_()  # every rank holds rank 0's base model before it is checksummed
    base_sum = checksum([*population.model.parameters(), *population.model.buffers()]).tolist()
    history: list[GenerationStats] = []
    if run.resume and run.checkpoint is not None and run.checkpoint.is_file():
        history = _resume(run.checkpoint, population, interactor, base_sum)
    _check_evolve_values(population, run.evolve)  # before the first episode
    bar = _progress_bar(run, history)
    fitnesses = None
    try:
        for gen in range(len(history), run.num_generations):
            fitnesses = population.validate_fitnesses(interactor.evaluate(population, **run.episodes))
            stats = _stats(population.generation, fitnesses)
            history.append(stats)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(best=f"{stats.best:.4g}", mean=f"{stats.mean:.4g}")
            reached = run.target_fitness is not None and stats.best >= run.target_fitness
            if reached or gen == run.num_generations - 1:
                break
            population.evolve_(fitnesses, **run.evolve)
            interactor.update_obs_stats(population)  # fold this generation's observations in (all ranks)
            if run.checkpoint is not None and is_main_rank():
                atomic_save(_checkpoint(population, interactor, history, base_sum), run.checkpoint,
                            kind="evolve_with_env")
    finally:
        if bar is not None:
            bar.close()
    if fitnesses is None:  # resumed a finished run: evaluate the last generation again
        fitnesses = population.validate_fitnesses(interactor.evaluate(population, **run.episodes))
    return population.select_and_merge_best_(fitnesses), history


def _progress_bar(run: _Run, history: list[GenerationStats]) -> Any:
    """A tqdm bar over the generations on the main rank (``None`` without ``progress``)."""
    if not run.progress or not is_main_rank():
        return None
    from tqdm.auto import tqdm  # imported when asked: tqdm.auto takes about 0.1 s to import

    bar = tqdm(total=run.num_generations, initial=len(history), desc="generations", unit="gen")
    if history:
        bar.set_postfix(best=f"{history[-1].best:.4g}", mean=f"{history[-1].mean:.4g}")
    return bar


def _snapshot(population: Population) -> dict[str, Any]:
    """The population's adapters and counters (no base model), as CPU copies."""
    return {k: v.detach().to("cpu", copy=True) if isinstance(v, Tensor) else copy.deepcopy(v)
            for k, v in population.state_dict(include_model=False).items()}


def _checkpoint(population: Population, interactor: EnvInteractor, history: list[GenerationStats],
                base_sum: list[int]) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "population": _snapshot(population),
        "interactor": interactor.state_dict(),
        "history": [tuple(h) for h in history],
        "base_checksum": base_sum,
    }


def _evolve_parameters() -> list[str]:
    sig = inspect.signature(Population.evolve_)
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [name for name, p in sig.parameters.items() if name not in ("self", "fitnesses") and p.kind in kinds]


def _check_evolve_keys(options: dict[str, Any]) -> None:
    """Every key of ``evolve_kwargs`` is an argument of ``Population.evolve_`` (a misspelling is named)."""
    allowed = _evolve_parameters()
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidTypeError(f"`evolve_kwargs` has the key {key!r}{hint}, which Population.evolve_ does not "
                                   f"take; its arguments are {allowed}")


def _check_evolve_values(population: Population, options: dict[str, Any]) -> None:
    """Run one ``evolve_`` with ``options`` on the population, then restore it exactly.

    Whatever ``evolve_`` would refuse (an unknown operator, ``epsilon=-1``,
    options an operator does not take, fractions that leave no survivor)
    raises here, before the first episode; the adapters, generator and
    counters are restored from a copy afterwards, so the run is the same as
    without the check.
    """
    if not options:  # the defaults are valid by construction
        return
    saved = _snapshot(population)
    fitnesses = torch.arange(population.pop_size, dtype=torch.float32, device=population.device)
    try:
        population.evolve_(fitnesses, **options)
    finally:
        population.load_state_dict(saved)


def _resume(path: Path, population: Population, interactor: EnvInteractor,
            base_sum: list[int]) -> list[GenerationStats]:
    where = f"checkpoint {str(path)!r}"
    state = load_checkpoint(path, kind="evolve_with_env")  # CheckpointError: damaged, foreign kind
    if not isinstance(state, dict) or state.get("format") not in _FORMATS:
        raise CheckpointError(f"{where} is not an evolve_with_env checkpoint (format {_FORMAT!r})")
    if state["format"] == _FORMATS[0] and "normalizer" in state:  # 0.1: the interactor's state was its normaliser's
        state = {**state, "interactor": {"obs_stats": state["normalizer"]}}
    missing = [key for key in ("population", "interactor", "history", "base_checksum") if key not in state]
    if missing:
        raise CheckpointError(f"{where} lacks {missing}")
    if state["base_checksum"] != base_sum:
        raise CheckpointError(
            f"the model passed differs from the one {where} was written with (checksum of its parameters); "
            "resuming needs the same base model (seed its construction)"
        )
    saved = state["interactor"]
    normalized = isinstance(saved, dict) and saved.get("obs_stats") is not None
    if normalized != interactor.normalize_obs:
        raise CheckpointError(f"{where} was written with normalize_obs={normalized}")
    try:
        history = [_history_entry(entry) for entry in state["history"]]
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{where} has a damaged history: {error}") from None
    try:  # both check everything before they write
        interactor.load_state_dict(saved)
        population.load_state_dict(state["population"])
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise CheckpointError(f"{where} does not fit this run: {type(error).__name__}: {error}") from error
    return history


def _history_entry(entry: Sequence[Any]) -> GenerationStats:
    """``(generation, best, mean)`` (0.1) or ``(generation, best, mean, std)``; ``std`` may be ``None``."""
    if len(entry) not in (3, 4):
        raise ValueError(f"an entry has {len(entry)} values, expected 3 or 4")
    std = entry[3] if len(entry) == 4 else None
    return GenerationStats(int(entry[0]), float(entry[1]), float(entry[2]), None if std is None else float(std))
