"""evolve_with_env: evolve a model against an environment in one call.

Each generation: evaluate every individual on training episodes, validate
the top candidates on the run's fixed validation episodes, record
``GenerationStats(generation, best, mean, std, validated, env_steps)``, call
the ``callback``, stop if the best validated score reached ``target_fitness``
(or the env-step budget is spent, or this was the last generation), otherwise
evolve and write a checkpoint. The champion (the best validated individual of
the run) is returned. The loops are in :mod:`populora.interact.generations`.
Higher fitness is better.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from populora.checkpoint import load_checkpoint
from populora.checks import check_float, check_int, check_one_of
from populora.distributed import checksum, world_size
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.interact.actions import ActionFn
from populora.interact.champion import Validator
from populora.interact.envs import DEFAULT_NUM_ENVS, is_factory
from populora.interact.es_env import make_es
from populora.interact.generations import GenerationInfo, Run, run_es, run_ga, snapshot_population
from populora.interact.interactor import EnvInteractor, interact_with_env
from populora.interact.schedule import EPISODE_SEEDINGS
from populora.population.population import Population
from populora.stats import GenerationStats

__all__ = [
    "validation_defaults",
    "ALGORITHMS",
    "CHECKPOINT_NAME",
    "DEFAULT_EPISODE_SEEDING",
    "DEFAULT_VALIDATION_EPISODES",
    "DEFAULT_VALIDATION_TOP",
    "ENV_EVOLVE_DEFAULTS",
    "EvolveResult",
    "GenerationInfo",
    "evolve_with_env",
]

ALGORITHMS = ("ga", "es")
"""``algorithm``: the genetic algorithm over a LoRA population, or EggRoll ES (:class:`~populora.EggrollES`)."""

DEFAULT_EPISODE_SEEDING = "independent"
"""Default ``episode_seeding`` (chosen by measurement, see the README's environment results)."""

DEFAULT_VALIDATION_EPISODES = 10
"""Most validation episodes per candidate by default (see :func:`validation_defaults`)."""

DEFAULT_VALIDATION_TOP = 2
"""Most candidates (highest training fitness) validated per generation by default."""


def validation_defaults(pop_size: int, num_episodes: int) -> tuple[int, int]:
    """``(validation_episodes, validation_top)`` when left ``None``, sized by the training episodes ``P * E``.

    ``validation_episodes = min(10, max(3, P * E // 6))`` and ``validation_top
    = max(1, min(2, P * E // (3 * validation_episodes)))``: 10 episodes of the
    top 2 for CartPole's 64 individuals (a stop at ``target_fitness`` judged
    on 10 episodes, not 5: measured, 5 let a 462-on-fresh-episodes policy
    stop at 490 validated), 3 episodes of the top 1 for the seed README's 16
    (whose 1000-step episodes make every validation episode cost).

    Example:
        >>> validation_defaults(64, 1), validation_defaults(16, 1), validation_defaults(32, 1)
        ((10, 2), (3, 1), (5, 2))
    """
    work = pop_size * num_episodes
    episodes = min(DEFAULT_VALIDATION_EPISODES, max(3, work // 6))
    return episodes, max(1, min(DEFAULT_VALIDATION_TOP, work // (3 * episodes)))


ENV_EVOLVE_DEFAULTS: dict[str, Any] = {"epsilon": 0.3}
"""``Population.evolve_`` options that ``evolve_with_env`` changes by default (``evolve_kwargs`` overrides them):
mutation scale 0.3 instead of 0.1 (CartPole-v1 with the issue-11 call: 5/5 seeds solved, 3/5 with 0.1)."""

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
    algorithm: str = "ga",
    es_kwargs: dict[str, Any] | None = None,
    episode_seeding: str = DEFAULT_EPISODE_SEEDING,
    validation_episodes: int | None = None,
    validation_top: int | None = None,
    callback: Callable[[GenerationInfo], Any] | None = None,
    max_env_steps: int | None = None,
) -> EvolveResult:
    """Evolve ``model`` against ``envs`` and return the best validated policy.

    Higher fitness is better: the training fitness of an individual is the
    mean return of its ``num_episodes`` episodes (``episode_seeding``
    decides whether individuals meet the same episodes). Under torchrun each
    rank plays its share of individuals on its own envs; every rank evolves
    in lockstep and returns the same policy.

    **Validated champions.** After each generation's training episodes the
    ``validation_top`` individuals with the highest training fitness replay
    ``validation_episodes`` validation episodes: a FIXED set of reset seeds
    drawn from the run's own stream (reproducible from ``seed``, apart from
    the training episodes and from the fresh episodes of
    :meth:`~populora.EnvInteractor.play`), the same every generation. The
    returned policy is the best validated individual of the whole run (with
    the observation normaliser of its own generation), and ``target_fitness``
    stops the run on a validated score, never on one lucky training episode:
    a new champion whose validated mean reaches the target replays the
    validation episodes and ``2 * validation_episodes`` more (fixed seeds of
    the same stream), and the run stops once the mean of those minus two
    standard errors still reaches it. Validation steps count in ``env_steps`` and
    ``max_env_steps``; an individual carried over unchanged is not replayed.
    With a custom ``fitness=fn`` the same rule applies to what ``fn`` returns
    with ``population.eval_seed`` set to the run's validation seed (fixed for
    the run; ``fn`` is then called on the whole population and the top
    candidates' values are their validated scores). ``validation_episodes=0``
    turns validation off (the 0.1 rule: the best of the last generation is
    returned, ``target_fitness`` judges the training best).

    ``algorithm='es'`` runs EggRoll ES (:class:`~populora.EggrollES`) instead
    of the genetic algorithm: ``pop_size`` individuals (even: antithetic
    pairs) perturb the whole model with rank-``low_rank`` noise and play as
    a population's individuals do; the update uses centred ranks and
    ``torch.optim.Adam`` (``es_kwargs``: ``sigma=0.3``, ``lr=0.05``,
    ``optimizer=`` (e.g. ``'clipup'``), any other EggrollES argument). The validated individual
    is the ES's centre (its unperturbed model), and the policy returned is
    the best validated centre.

    The arguments, by group (the first twelve are the 0.1 signature, in order):

    * what to evolve: ``envs``, ``model``, ``pop_size``, ``low_rank``,
      ``lora_targets``, ``seed``, and ``population_kwargs`` for the rest of
      the Population's arguments;
    * how long: ``num_generations``, ``target_fitness``;
    * which algorithm: ``algorithm`` (``'ga'``, ``'es'``), ``es_kwargs``;
    * how long: ``max_env_steps``, ``callback`` (custom stopping);
    * the episodes: ``action``, ``horizon``, ``num_episodes``,
      ``episode_seeding``, ``to_range``, or a custom ``fitness`` instead;
    * validation: ``validation_episodes``, ``validation_top``;
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
        target_fitness: stop after the first generation whose champion's
            confirmed score (mean minus two standard errors over ``3 *
            validation_episodes`` fixed episodes) reaches it; the training
            best with ``validation_episodes=0``.
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
            (``survive_frac``, ``elite_frac``, ``mutation_type``, ``epsilon``, ...);
            ``epsilon`` defaults to 0.3 here (:data:`ENV_EVOLVE_DEFAULTS`).
        num_episodes: training episodes per individual and generation.
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
        algorithm: ``'ga'`` (the default: the genetic algorithm over a LoRA
            population) or ``'es'`` (EggRoll ES, see above).
        es_kwargs: with ``algorithm='es'``: ``sigma`` (0.3), ``lr`` (0.05,
            the optimizer's), ``optimizer`` (``'adam'``, the default;
            ``'clipup'``: :class:`~populora.optim.ClipUp`, PGPE's optimiser,
            with ``max_speed`` (``2 * lr``) and ``momentum`` (0.9) also in
            ``es_kwargs``; ``'sgd'``; or a ``torch.optim`` optimizer or
            ``params -> Optimizer``), ``fitness_shaping``
            (``'centered_rank'``) and any other :class:`~populora.EggrollES`
            argument. LunarLanderContinuous-v3 is solved with a zero-started
            linear policy and ``es_kwargs=dict(sigma=0.1, optimizer='clipup',
            lr=0.03)``, 128 members (``examples/lunar_lander_continuous.py``).
        episode_seeding: ``'independent'`` (the default: every individual
            meets its own training episodes; with ES each antithetic pair its
            own) or ``'common'`` (common random numbers: all individuals of a
            generation meet the same ones). Chosen by measurement (README).
        validation_episodes: validation episodes per candidate (``0``: no
            validation); default from :func:`validation_defaults`: 10 for 64
            individuals, 3 for 16.
        validation_top: the most candidates validated per generation (the
            ES validates its centre); default from :func:`validation_defaults`:
            2 for 64 individuals, 1 for 16. A candidate is validated only while
            its training fitness is at least the champion's validated score
            (one below it is unlikely to beat it), and an unchanged one is not
            replayed.
        callback: ``callback(info)`` after every generation, ``info`` a
            :class:`~populora.interact.generations.GenerationInfo` (stats,
            history, fitnesses, champion score, the population or ES, the
            interactor): for logging, custom stopping (return ``True`` to
            stop) or periodic checkpoints. Called on every rank.
        max_env_steps: stop after the first generation at which the run has
            taken this many env steps (all ranks, validation included).

    Returns:
        ``EvolveResult(policy, history)``: a named tuple, so
        ``policy, history = evolve_with_env(...)`` unpacks it; ``history``
        holds one ``GenerationStats(generation, best, mean, std, validated,
        env_steps)`` per evaluated generation: training best / mean / std
        (``correction=0``), the generation's best validated score (``None``
        without validation) and the run's env steps so far (all ranks,
        validation included).

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
        warnings.warn(
            "`evolve_with_env(return_history=False)` is deprecated: it returns the policy alone for now, "
            "and from the next release the result is always EvolveResult(policy, history); use "
            "`evolve_with_env(...).policy`",
            DeprecationWarning,
            stacklevel=2,
        )
    algorithm = check_one_of("algorithm", algorithm, ALGORITHMS)
    run = _check_options(
        num_generations,
        target_fitness,
        progress,
        checkpoint_dir,
        resume,
        evolve_kwargs,
        population_kwargs,
        dict(action=action, horizon=horizon, num_episodes=num_episodes, fitness=fitness, to_range=to_range),
        dict(
            seed=seed,
            episode_seeding=episode_seeding,
            validation_episodes=validation_episodes,
            pop_size=check_int("pop_size", pop_size, low=1),
            num_episodes=num_episodes if isinstance(num_episodes, int) else 1,
            validation_top=validation_top,
            callback=callback,
            max_env_steps=max_env_steps,
        ),
    )
    if algorithm == "es":
        bad = [
            name
            for name, value in (
                ("fitness", fitness),
                ("evolve_kwargs", evolve_kwargs),
                ("population_kwargs", population_kwargs),
            )
            if value is not None
        ]
        if bad:
            raise InvalidValueError(
                f"`algorithm='es'` plays episodes with EggrollES and does not take `{bad[0]}` "
                "(ES options go in `es_kwargs`; a custom fitness goes to EggrollES.step(fitness=fn))"
            )
    elif es_kwargs is not None:
        raise InvalidValueError("`es_kwargs` needs `algorithm='es'`")
    if num_envs is None and is_factory(envs):
        share = -(-check_int("pop_size", pop_size, low=1) // max(1, world_size()))
        num_envs = min(share, DEFAULT_NUM_ENVS)

    interactor = interact_with_env(
        envs, device, num_envs=num_envs, flatten_obs=flatten_obs, normalize_obs=normalize_obs
    )
    try:
        if algorithm == "es":
            merged, history = _evolve_es(model, pop_size, low_rank, lora_targets, device, es_kwargs, interactor, run)
        else:
            population = interactor.population(
                model, pop_size, low_rank, lora_targets, seed=seed, **(population_kwargs or {})
            )
            try:
                merged, history = _evolve(population, interactor, run)
            except BaseException:
                population.close()  # the user's model comes back unwrapped, its requires_grad flags restored
                raise
        policy = interactor.wrap_policy(merged)
    finally:
        interactor.close()
    return EvolveResult(policy, history) if return_history else policy


def _check_options(
    num_generations: Any,
    target_fitness: Any,
    progress: Any,
    checkpoint_dir: Any,
    resume: Any,
    evolve_kwargs: Any,
    population_kwargs: Any,
    episodes: dict[str, Any],
    more: dict[str, Any],
) -> Run:
    """The options that need no population checked (before any env is made), as a :class:`Run`."""
    num_generations = check_int("num_generations", num_generations, low=1)
    if evolve_kwargs is not None and not isinstance(evolve_kwargs, dict):
        raise InvalidTypeError(f"`evolve_kwargs` must be a dict of Population.evolve_ arguments, got {evolve_kwargs!r}")
    if population_kwargs is not None and not isinstance(population_kwargs, dict):
        raise InvalidTypeError(f"`population_kwargs` must be a dict of Population arguments, got {population_kwargs!r}")
    if target_fitness is not None:
        target_fitness = check_float("target_fitness", target_fitness)
    if resume and checkpoint_dir is None:
        raise InvalidValueError("`resume=True` needs `checkpoint_dir`")
    evolve = {**ENV_EVOLVE_DEFAULTS, **(evolve_kwargs or {})}
    _check_evolve_keys(evolve)
    path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
    seeding = check_one_of("episode_seeding", more["episode_seeding"], EPISODE_SEEDINGS)
    auto_episodes, auto_top = validation_defaults(more["pop_size"], max(1, more["num_episodes"]))
    v_episodes, v_top = more["validation_episodes"], more["validation_top"]
    v_episodes = auto_episodes if v_episodes is None else check_int("validation_episodes", v_episodes, low=0)
    v_top = auto_top if v_top is None else check_int("validation_top", v_top, low=1)
    if more["callback"] is not None and not callable(more["callback"]):
        raise InvalidTypeError(f"`callback` must be callable as callback(info), got {more['callback']!r}")
    budget = more["max_env_steps"]
    budget = None if budget is None else check_int("max_env_steps", budget, low=1)
    seed = check_int("seed", more["seed"])
    return Run(
        num_generations,
        target_fitness,
        bool(progress),
        episodes,
        seeding,
        evolve,
        path,
        bool(resume),
        seed,
        v_episodes,
        v_top,
        more["callback"],
        budget,
    )


def _evolve(population: Population, interactor: EnvInteractor, run: Run) -> tuple[nn.Module, list[GenerationStats]]:
    """The genetic algorithm's run of :func:`evolve_with_env`: the merged champion and the history."""
    population.sync_from_main_rank_()  # every rank holds rank 0's base model before it is checksummed
    base_sum = checksum([*population.model.parameters(), *population.model.buffers()]).tolist()
    history: list[GenerationStats] = []
    validator = Validator(run.seed, run.validation_episodes, run.validation_top)
    if run.resume and run.checkpoint is not None and run.checkpoint.is_file():
        history, extra = _resume(
            run.checkpoint, population.load_state_dict, population.state_dict, interactor, base_sum, "ga"
        )
        validator.load_state_dict(extra.get("validator"))
    _check_evolve_values(population, run.evolve)  # before the first episode

    def save() -> dict[str, Any]:
        return _checkpoint("ga", snapshot_population(population), interactor, history, base_sum, validator)

    steps_before = _steps_of(history)
    return run_ga(population, interactor, run, history, validator, steps_before, save), history


def _evolve_es(
    model: nn.Module,
    pop_size: int,
    low_rank: int,
    lora_targets: Any,
    device: Any,
    es_kwargs: dict[str, Any] | None,
    interactor: EnvInteractor,
    run: Run,
) -> tuple[nn.Module, list[GenerationStats]]:
    """The ES run of :func:`evolve_with_env`: the champion centre and the history."""
    if es_kwargs is not None and not isinstance(es_kwargs, dict):
        raise InvalidTypeError(f"`es_kwargs` must be a dict of EggrollES arguments, got {es_kwargs!r}")
    base_sum = checksum([*model.parameters(), *model.buffers()]).tolist()
    es = make_es(model, pop_size, low_rank, run.seed, lora_targets, device or interactor.device, es_kwargs)
    try:
        history: list[GenerationStats] = []
        validator = Validator(run.seed, run.validation_episodes, 1)
        if run.resume and run.checkpoint is not None and run.checkpoint.is_file():
            history, extra = _resume(run.checkpoint, es.load_state_dict, es.state_dict, interactor, base_sum, "es")
            validator.load_state_dict(extra.get("validator"))

        def save() -> dict[str, Any]:
            return _checkpoint("es", es.state_dict(), interactor, history, base_sum, validator)

        return run_es(es, interactor, run, history, validator, _steps_of(history), save), history
    except BaseException:
        es.close()
        raise


def _steps_of(history: list[GenerationStats]) -> int:
    return int(history[-1].env_steps or 0) if history else 0


def _checkpoint(
    algorithm: str,
    state: dict[str, Any],
    interactor: EnvInteractor,
    history: list[GenerationStats],
    base_sum: list[int],
    validator: Validator,
) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "algorithm": algorithm,
        "population": state,  # the population's snapshot, or the ES's state_dict
        "interactor": interactor.state_dict(),
        "history": [tuple(h) for h in history],
        "base_checksum": base_sum,
        "validator": validator.state_dict(),
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
            raise InvalidTypeError(
                f"`evolve_kwargs` has the key {key!r}{hint}, which Population.evolve_ does not "
                f"take; its arguments are {allowed}"
            )


def _check_evolve_values(population: Population, options: dict[str, Any]) -> None:
    """Run one ``evolve_`` with ``options`` on the population, then restore it exactly.

    Whatever ``evolve_`` would refuse (an unknown operator, ``epsilon=-1``,
    options an operator does not take, fractions that leave no survivor)
    raises here, before the first episode; the adapters, generator and
    counters are restored from a copy afterwards, so the run is the same as
    without the check.
    """
    if options == ENV_EVOLVE_DEFAULTS:  # the defaults are valid by construction
        return
    saved = snapshot_population(population)
    fitnesses = torch.arange(population.pop_size, dtype=torch.float32, device=population.device)
    try:
        population.evolve_(fitnesses, **options)
    finally:
        population.load_state_dict(saved)


def _resume(
    path: Path,
    load: Callable[[dict[str, Any]], Any],
    current: Callable[[], Any],
    interactor: EnvInteractor,
    base_sum: list[int],
    algorithm: str,
) -> tuple[list[GenerationStats], dict[str, Any]]:
    """Restore a checkpoint: the history and the checkpoint's other entries (``validator``).

    ``load`` restores the population's (or ES's) state; ``current`` is unused
    but names what is restored in messages.
    """
    where = f"checkpoint {str(path)!r}"
    state = load_checkpoint(path, kind="evolve_with_env")  # CheckpointError: damaged, foreign kind
    if not isinstance(state, dict) or state.get("format") not in _FORMATS:
        raise CheckpointError(f"{where} is not an evolve_with_env checkpoint (format {_FORMAT!r})")
    if state["format"] == _FORMATS[0] and "normalizer" in state:  # 0.1: the interactor's state was its normaliser's
        state = {**state, "interactor": {"obs_stats": state["normalizer"]}}
    missing = [key for key in ("population", "interactor", "history", "base_checksum") if key not in state]
    if missing:
        raise CheckpointError(f"{where} lacks {missing}")
    if state.get("algorithm", "ga") != algorithm:
        raise CheckpointError(
            f"{where} was written by algorithm={state.get('algorithm', 'ga')!r}, this run uses algorithm={algorithm!r}"
        )
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
        load(state["population"])
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise CheckpointError(f"{where} does not fit this run: {type(error).__name__}: {error}") from error
    return history, state


def _history_entry(entry: Sequence[Any]) -> GenerationStats:
    """``(generation, best, mean)`` (0.1) up to ``(generation, best, mean, std, validated, env_steps)``.

    The optional entries may be ``None``.
    """
    if not 3 <= len(entry) <= 6:
        raise ValueError(f"an entry has {len(entry)} values, expected 3 to 6")
    more = [*entry[3:], None, None, None][:3]
    std, validated, steps = (None if v is None else float(v) for v in more)
    return GenerationStats(
        int(entry[0]), float(entry[1]), float(entry[2]), std, validated, None if steps is None else int(steps)
    )
