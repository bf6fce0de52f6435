"""evolve_with_env: evolve a model against an environment in one call.

Each generation: evaluate every individual (:meth:`EnvInteractor.evaluate`),
record ``GenerationStats(generation, best, mean)``, stop if the best reached
``target_fitness`` or this was the last generation, otherwise ``evolve_``
and write a checkpoint. The best individual of the last evaluated generation
is merged into the model and returned. Higher fitness is better.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_map

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
_FORMAT = "populora.evolve_with_env/1"


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
) -> EvolveResult | nn.Module:
    """Evolve ``model`` against ``envs`` with a LoRA population and return the best policy.

    Higher fitness is better: by default the fitness of an individual is the
    mean return of its ``num_episodes`` episodes (common random numbers: all
    individuals of a generation meet the same episodes). Under torchrun each
    rank plays its share of individuals on its own envs; every rank evolves
    in lockstep and returns the same policy.

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
        return_history: return ``EvolveResult(policy, history)``; ``False``
            returns the policy alone.
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
        ``EvolveResult(policy, history)``, or the policy if ``return_history=False``.

    Raises:
        InvalidValueError / InvalidTypeError: bad arguments, including
            ``evolve_kwargs`` (an unknown key, operator or value), before any
            episode runs.
        CheckpointError: ``resume=True`` on a damaged file, a file of another
            kind, or one written with another model (the file is named).

    On any error the model comes back unwrapped, its ``requires_grad`` flags
    restored.
    """
    num_generations = check_int("num_generations", num_generations, low=1)
    if evolve_kwargs is not None and not isinstance(evolve_kwargs, dict):
        raise InvalidTypeError(f"`evolve_kwargs` must be a dict of Population.evolve_ arguments, got {evolve_kwargs!r}")
    if population_kwargs is not None and not isinstance(population_kwargs, dict):
        raise InvalidTypeError(f"`population_kwargs` must be a dict of Population arguments, got {population_kwargs!r}")
    if target_fitness is not None:
        target_fitness = check_float("target_fitness", target_fitness)
    if resume and checkpoint_dir is None:
        raise InvalidValueError("`resume=True` needs `checkpoint_dir`")
    evolve_options = dict(evolve_kwargs or {})
    _check_evolve_keys(evolve_options)
    path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
    if num_envs is None and is_factory(envs):
        share = -(-check_int("pop_size", pop_size, low=1) // max(1, world_size()))
        num_envs = min(share, DEFAULT_NUM_ENVS)

    interactor = interact_with_env(envs, device, num_envs=num_envs, flatten_obs=flatten_obs,
                                   normalize_obs=normalize_obs)
    try:
        population = interactor.population(model, pop_size, low_rank, lora_targets, seed=seed,
                                           **(population_kwargs or {}))
        run = dict(action=action, horizon=horizon, num_episodes=num_episodes, fitness=fitness, to_range=to_range)
        bar = None
        fitnesses = None
        try:
            population.sync_from_main_rank_()  # every rank holds rank 0's base model before it is checksummed
            base_sum = checksum([*population.model.parameters(), *population.model.buffers()]).tolist()
            history: list[GenerationStats] = []
            if resume and path is not None and path.is_file():
                history = _resume(path, population, interactor, base_sum)
            _check_evolve_values(population, evolve_options)  # before the first episode
            if progress and is_main_rank():
                from tqdm.auto import tqdm

                bar = tqdm(total=num_generations, initial=len(history), desc="generations", unit="gen")
                if history:
                    bar.set_postfix(best=f"{history[-1].best:.4g}", mean=f"{history[-1].mean:.4g}")
            for gen in range(len(history), num_generations):
                fitnesses = population.validate_fitnesses(interactor.evaluate(population, **run))
                stats = GenerationStats(population.generation, float(fitnesses.max()), float(fitnesses.mean()))
                history.append(stats)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(best=f"{stats.best:.4g}", mean=f"{stats.mean:.4g}")
                reached = target_fitness is not None and stats.best >= target_fitness
                if reached or gen == num_generations - 1:
                    break
                population.evolve_(fitnesses, **evolve_options)
                interactor.update_obs_stats(population)  # fold this generation's observations in (all ranks)
                if path is not None and is_main_rank():
                    atomic_save(_checkpoint(population, interactor, history, base_sum), path, kind="evolve_with_env")
            if fitnesses is None:  # resumed a finished run: evaluate the last generation again
                fitnesses = population.validate_fitnesses(interactor.evaluate(population, **run))
            merged = population.select_and_merge_best_(fitnesses)
        except BaseException:
            population.close()  # the user's model comes back unwrapped, its requires_grad flags restored
            raise
        finally:
            if bar is not None:
                bar.close()
        policy = interactor.wrap_policy(merged)
    finally:
        interactor.close()
    return EvolveResult(policy, history) if return_history else policy


def _checkpoint(population: Any, interactor: EnvInteractor, history: list[GenerationStats],
                base_sum: list[int]) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "population": population.state_dict(include_model=False),
        "normalizer": interactor.normalizer_state(),
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
    saved = tree_map(lambda v: v.clone() if isinstance(v, Tensor) else copy.deepcopy(v),
                     population.state_dict(include_model=False))
    fitnesses = torch.arange(population.pop_size, dtype=torch.float32, device=population.device)
    try:
        population.evolve_(fitnesses, **options)
    finally:
        population.load_state_dict(saved)


def _resume(path: Path, population: Any, interactor: EnvInteractor, base_sum: list[int]) -> list[GenerationStats]:
    where = f"checkpoint {str(path)!r}"
    state = load_checkpoint(path, kind="evolve_with_env")  # CheckpointError: damaged, foreign kind
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise CheckpointError(f"{where} is not an evolve_with_env checkpoint (format {_FORMAT!r})")
    missing = [key for key in ("population", "normalizer", "history", "base_checksum") if key not in state]
    if missing:
        raise CheckpointError(f"{where} lacks {missing}")
    if state["base_checksum"] != base_sum:
        raise CheckpointError(
            f"the model passed differs from the one {where} was written with (checksum of its parameters); "
            "resuming needs the same base model (seed its construction)"
        )
    if (state["normalizer"] is None) != (interactor.normalizer_state() is None):
        raise CheckpointError(f"{where} was written with normalize_obs={state['normalizer'] is not None}")
    try:
        history = [GenerationStats(int(h[0]), float(h[1]), float(h[2]),
                                   None if len(h) < 4 or h[3] is None else float(h[3]))
                   for h in state["history"]]
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{where} has a damaged history: {error}") from None
    try:
        population.load_state_dict(state["population"])
        interactor.load_normalizer_state(state["normalizer"])
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise CheckpointError(f"{where} does not fit this run: {type(error).__name__}: {error}") from error
    return history
