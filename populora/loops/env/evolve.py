"""evolve_with_env: evolve a model against an environment in one call.

Each generation: evaluate every individual on training episodes, validate
the top candidates on the run's fixed validation episodes, record
``GenerationStats(generation, best, mean, std, validated, env_steps)``, call
the ``callback``, stop if the best validated score reached ``target_fitness``
(or the env-step budget is spent, or this was the last generation), otherwise
evolve and write a checkpoint. The champion (the best validated individual of
the run) is returned. The loops are in :mod:`populora.loops.env.generations`.
Higher fitness is better.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from populora.checkpoint import load_checkpoint
from populora.checks import check_bool, check_float, check_int, check_one_of
from populora.config import Config
from populora.distributed import checksum, world_size
from populora.envs.actions import ActionFn
from populora.envs.interactor import EnvInteractor, interact_with_env
from populora.envs.schedule import EPISODE_SEEDINGS
from populora.envs.slots import DEFAULT_NUM_ENVS, is_factory
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.loops.env.champion import Validator
from populora.loops.env.es_env import make_es
from populora.loops.env.generations import GenerationInfo, Run, run_es, run_ga
from populora.loops.env.options import (
    ENV_EVOLUTION,
    ES,
    GA,
    Budget,
    Checkpointing,
    EnvOptions,
    Episodes,
    Validation,
)
from populora.population.evolution import Evolution
from populora.population.population import Population
from populora.stats import GenerationStats
from populora.transaction import closing_on_failure

__all__ = [
    "validation_defaults",
    "ALGORITHMS",
    "CHECKPOINT_NAME",
    "DEFAULT_VALIDATION_EPISODES",
    "DEFAULT_VALIDATION_TOP",
    "ENV_EVOLVE_DEFAULTS",
    "EvolveResult",
    "GenerationInfo",
    "evolve_with_env",
]

ALGORITHMS = ("ga", "es")
"""``algorithm`` by name: ``GA()`` (the genetic algorithm over a LoRA population) or ``ES()`` (EggRoll ES)."""


DEFAULT_VALIDATION_EPISODES = 10
"""Most validation episodes per candidate by default (see :func:`validation_defaults`)."""

DEFAULT_VALIDATION_TOP = 2
"""Most candidates (highest training fitness) validated per generation by default."""


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


ENV_EVOLVE_DEFAULTS: dict[str, Any] = {"epsilon": 0.3}
"""0.5.0's form of :data:`~populora.loops.env.options.ENV_EVOLUTION` (``Population.evolve_`` options that
``evolve_with_env`` changes by default: mutation scale 0.3 instead of 0.1); kept for one release."""

CHECKPOINT_NAME = "evolve_with_env.pt"
_FORMAT = "populora.evolve_with_env/2"
_FORMATS = ("populora.evolve_with_env/1", _FORMAT)  # /1: 0.1's population state() and normalizer_state()


class EvolveResult(NamedTuple):
    """What :func:`evolve_with_env` returns (``policy, history = evolve_with_env(...)``).

    Attributes:
        policy: the model with the best validated individual of the run merged in (judged on fresh
            validation episodes, never on one training episode; without validation, the best of the last
            generation), as ``nn.Sequential(normaliser, model)`` with ``normalize_obs=True``, so it takes
            raw observations.
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
    lora_targets: str | re.Pattern[str] | Sequence[str | re.Pattern[str]] | None = None,
    *,
    algorithm: GA | ES | str = "ga",
    episodes: Episodes | None = None,
    validation: Validation | None = None,
    env_options: EnvOptions | None = None,
    checkpointing: Checkpointing | None = None,
    budget: Budget | None = None,
    callback: Callable[[GenerationInfo], Any] | None = None,
    fitness: Callable[..., Any] | None = None,
) -> EvolveResult | nn.Module:
    """Evolve ``model`` against ``envs`` and return the best validated policy.

    ``fitness=``: the seed release's custom fitness (GA only) instead of the episode return, in any of its
    three signatures ``fn(population, individuals=...)``, ``fn(population, idx)``, ``fn(population)``;
    ``episodes=Episodes(fitness=...)`` is the same option (an equal alternative; passing both is an error).

    Higher fitness is better: the training fitness of an individual is the
    mean return of its episodes (:class:`~populora.loops.env.options.Episodes`).
    Under torchrun each rank plays its share of individuals on its own envs;
    every rank evolves in lockstep and returns the same policy.

    **Validated champions.** After each generation's training episodes the
    top candidates (highest training fitness) replay the run's validation
    episodes (:class:`~populora.loops.env.options.Validation`): a FIXED set of
    reset seeds drawn from the run's own stream (reproducible from ``seed``,
    apart from the training episodes and from the fresh episodes of
    :meth:`~populora.EnvInteractor.play`), the same every generation. The
    returned policy is the best validated individual of the whole run (with
    the observation normaliser of its own generation), and ``target_fitness``
    stops the run on a validated score, never on one lucky training episode:
    a new champion whose validated mean reaches the target replays the
    validation episodes and twice as many more (fixed seeds of the same
    stream), and the run stops once the mean of those minus two standard
    errors still reaches it. Validation steps count in ``env_steps`` and in
    the env-step budget; an individual carried over unchanged is not
    replayed. With a custom fitness the same rule applies to what it returns
    with ``population.eval_seed`` set to the run's validation seed.
    ``Validation(episodes=0)`` turns validation off (the best of the last
    generation is returned, ``target_fitness`` judges the training best).
    The validation episodes are played by their seeds on every env form: on
    a vector env that resets only as a whole (gymnasium's native
    ``make_vec`` envs) they run on single envs made from its spec
    (:meth:`~populora.EnvInteractor.seeded_slots`), and one that cannot be
    remade so is refused before any episode, naming the fix.

    **Reproducibility.** The same arguments with the same number of env slots
    and ranks give the same run, bitwise. Another number of slots can move
    the returns by rounding: the actions come from one batched forward over
    the slots playing at each step, and a batch of another size may round an
    output's last bit differently (about ``1e-7``; a plain torch loop over
    rows does the same), which a chaotic simulator amplifies over an episode
    (HalfCheetah-v5's generation-0 returns moved by up to 67 between one env
    and a list of 4). An env that does not replay an episode from its reset
    seed is named in a warning before the first episode.

    The first twelve parameters take values as in the examples (the seed release's); the rest are keyword
    option objects (:mod:`populora.loops.env.options`, each a frozen :class:`~populora.config.Config` checked
    when built), each defaulting to what ``None`` gives, and the ``callback``.

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
        progress: tqdm bar with best / mean fitness (main rank), over generations, or over the env steps or
            seconds of a ``Budget`` when that budget is the closest to running out.
        target_fitness: stop after the first generation whose champion's
            confirmed score reaches it (see above).
        return_history: ``True`` (the default): ``EvolveResult(policy,
            history)``; ``False``: the policy alone.
        lora_targets: target layers; ``None`` targets every ``nn.Linear``.
        algorithm: :class:`~populora.loops.env.options.GA` (the default, also
            ``'ga'``) or :class:`~populora.loops.env.options.ES` (also ``'es'``,
            with its defaults).
        episodes: :class:`~populora.loops.env.options.Episodes`: episodes per
            individual, seeding, or a custom fitness.
        validation: :class:`~populora.loops.env.options.Validation`: validation
            episodes and candidates.
        env_options: :class:`~populora.loops.env.options.EnvOptions`: envs made
            by a factory, device, observation flattening and normalisation,
            action range.
        checkpointing: :class:`~populora.loops.env.options.Checkpointing`:
            checkpoint folder and resume.
        budget: :class:`~populora.loops.base.Budget` (every loop's): env-step and wall-clock budgets (its
            ``max_steps`` is refused: ``num_generations`` caps the generations).
        callback: ``callback(info)`` after every generation, ``info`` a
            :class:`~populora.loops.env.generations.GenerationInfo` (stats,
            history, fitnesses, champion score, the population or ES, the
            interactor): for logging (``info.as_dict()`` is the generation's
            numbers: ``writer.add_scalars("evolve", info.as_dict(),
            info.stats.generation)`` with TensorBoard), custom stopping or periodic checkpoints. Called on every rank.
            It returns ``None`` or ``False`` to go on and ``True`` to stop;
            any other value (a list, ``1``) raises ``InvalidTypeError``
            (:func:`populora.loops.base.callback_says_stop`).

    Returns:
        ``EvolveResult(policy, history)``: a named tuple, so
        ``policy, history = evolve_with_env(...)`` unpacks it; ``history``
        holds one ``GenerationStats(generation, best, mean, std, validated,
        env_steps)`` per evaluated generation: training best / mean / std
        (``correction=0``), the generation's best validated score (``None``
        without validation) and the run's env steps so far (all ranks,
        validation included). The policy alone with ``return_history=False``.

    Raises:
        InvalidValueError / InvalidTypeError: bad arguments, including an
            option object of the wrong type or with a bad value (named), before
            any episode runs.
        CheckpointError: resuming from a damaged file, a file of another kind,
            one written with another model, or one written with other options (the file and the first
            option that differs are named, ``evolve_with_env.algorithm.evolution.epsilon=0.3; this run has
            ...``; see :func:`run_config` for what is compared).

    On any error the model comes back unwrapped, its ``requires_grad`` flags
    restored.
    """
    if fitness is not None:
        if not callable(fitness):
            raise InvalidTypeError(f"`fitness` must be callable, got {fitness!r:.80}")
        if episodes is not None and not isinstance(episodes, Episodes):
            raise InvalidTypeError(f"`episodes` must be a populora.loops.env.Episodes, got {type(episodes).__name__}")
        if episodes is not None and episodes.fitness is not None:
            raise InvalidValueError("a custom fitness given twice: pass `fitness=` or `Episodes(fitness=)`, not both")
        episodes = dataclasses.replace(episodes or Episodes(), fitness=fitness)
    algorithm = _algorithm(algorithm)
    episodes = _option("episodes", episodes, Episodes)
    validation = _option("validation", validation, Validation)
    env_options = _option("env_options", env_options, EnvOptions)
    checkpointing = _option("checkpointing", checkpointing, Checkpointing)
    budget = _option("budget", budget, Budget)
    _check_env_options(env_options)
    pop_size = check_int("pop_size", pop_size, low=1)
    run = _check_options(
        num_generations, target_fitness, progress, algorithm, episodes, validation, checkpointing, budget, callback,
        seed, pop_size, dict(action=action, horizon=horizon, to_range=env_options.to_range),
    )  # fmt: skip
    if isinstance(algorithm, ES) and episodes.fitness is not None:
        raise InvalidValueError(
            "`algorithm=ES(...)` plays episodes with EggrollES and does not take `Episodes(fitness=...)` "
            "(a custom fitness goes to EggrollES.step(fitness=fn))"
        )
    num_envs = env_options.num_envs
    if num_envs is None and is_factory(envs):
        num_envs = min(-(-pop_size // max(1, world_size())), DEFAULT_NUM_ENVS)

    run = dataclasses.replace(
        run,
        config=run_config(
            pop_size=pop_size,
            low_rank=low_rank,
            seed=seed,
            horizon=horizon,
            algorithm=algorithm,
            episodes=episodes,
            validation=validation,
            env_options=env_options,
        ),
    )
    interactor = interact_with_env(
        envs,
        env_options.device,
        num_envs=num_envs,
        flatten_obs=env_options.flatten_obs,
        normalize_obs=env_options.normalize_obs,
        obs_keys=env_options.obs_keys,
        drop_obs_keys=env_options.drop_obs_keys,
    )
    try:
        if (
            run.validation_episodes > 0
            and (run.validation_top > 0 or isinstance(algorithm, ES))
            and episodes.fitness is None
        ):
            interactor.seeded_slots("validation")  # plays its episodes by their seeds: checked before any episode
        if isinstance(algorithm, ES):
            merged, history = _evolve_es(
                model, pop_size, low_rank, lora_targets, env_options.device, algorithm, interactor, run
            )
        else:
            population = interactor.population(
                model, pop_size, low_rank, lora_targets, seed=seed, **dict(algorithm.population_kwargs)
            )
            with closing_on_failure() as undo:
                undo.callback(population.close)  # the user's model comes back unwrapped, its flags restored
                merged, history = _evolve(population, interactor, run)
        policy = interactor.wrap_policy(merged)
    finally:
        interactor.close()
    return EvolveResult(policy, history) if return_history else policy


def _option(name: str, value: Any, kind: type) -> Any:
    """``value`` (an option object of ``kind``), or ``kind()`` for ``None``."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise InvalidTypeError(
            f"`{name}` must be a populora.loops.env.{kind.__name__} (or None for its defaults), got "
            f"{type(value).__name__} {value!r:.80}"
        )
    return value


def _check_env_options(options: EnvOptions) -> None:
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


def _algorithm(value: Any) -> GA | ES:
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


def _check_options(
    num_generations: Any,
    target_fitness: Any,
    progress: Any,
    algorithm: GA | ES,
    episodes: Episodes,
    validation: Validation,
    checkpointing: Checkpointing,
    budget: Budget,
    callback: Any,
    seed: Any,
    pop_size: int,
    playing: dict[str, Any],
) -> Run:
    """The options that need no population checked (before any env is made), as a :class:`Run`."""
    num_generations = check_int("num_generations", num_generations, low=1)
    if target_fitness is not None:
        target_fitness = check_float("target_fitness", target_fitness)
    evolve = algorithm.evolution if isinstance(algorithm, GA) else ENV_EVOLUTION  # each checked when built
    if budget.max_steps is not None:
        raise InvalidValueError(
            f"`Budget.max_steps` does not apply to evolve_with_env (got {budget.max_steps}): "
            "`num_generations` caps its generations"
        )
    num_episodes = check_int("Episodes.num_episodes", episodes.num_episodes, low=1)
    seeding = check_one_of("Episodes.seeding", episodes.seeding, EPISODE_SEEDINGS)
    if episodes.fitness is not None and not callable(episodes.fitness):
        raise InvalidTypeError(f"`Episodes.fitness` must be callable, got {episodes.fitness!r:.80}")
    if checkpointing.dir is not None and not isinstance(checkpointing.dir, (str, os.PathLike)):
        raise InvalidTypeError(
            f"`Checkpointing.dir` must be a folder path (str or Path), got {checkpointing.dir!r:.80}"
        )
    if checkpointing.resume and checkpointing.dir is None:
        raise InvalidValueError("`Checkpointing(resume=True)` needs `dir`")
    path = Path(checkpointing.dir) / CHECKPOINT_NAME if checkpointing.dir is not None else None
    auto_episodes, auto_top = validation_defaults(pop_size, num_episodes)
    v_episodes = (
        auto_episodes if validation.episodes is None else check_int("Validation.episodes", validation.episodes, low=0)
    )
    v_top = auto_top if validation.top is None else check_int("Validation.top", validation.top, low=1)
    if callback is not None and not callable(callback):
        raise InvalidTypeError(f"`callback` must be callable as callback(info), got {callback!r}")
    max_steps = budget.max_env_steps
    max_steps = None if max_steps is None else check_int("Budget.max_env_steps", max_steps, low=1)
    max_seconds = budget.max_seconds
    max_seconds = (
        None if max_seconds is None else check_float("Budget.max_seconds", max_seconds, low=0.0, low_open=True)
    )
    return Run(
        num_generations,
        target_fitness,
        bool(progress),
        {**playing, "num_episodes": num_episodes, "fitness": episodes.fitness},
        seeding,
        evolve,
        path,
        bool(checkpointing.resume),
        check_int("seed", seed),
        v_episodes,
        v_top,
        callback,
        max_steps,
        max_seconds,
    )


def _evolve(population: Population, interactor: EnvInteractor, run: Run) -> tuple[nn.Module, list[GenerationStats]]:
    """The genetic algorithm's run of :func:`evolve_with_env`: the merged champion and the history."""
    population.sync_from_main_rank_()  # every rank holds rank 0's base model before it is checksummed
    base_sum = checksum([*population.model.parameters(), *population.model.buffers()]).tolist()
    history: list[GenerationStats] = []
    validator = Validator(run.seed, run.validation_episodes, run.validation_top)
    if run.resume and run.checkpoint is not None and run.checkpoint.is_file():
        history, extra = _resume(run.checkpoint, population.load_state_dict, run.config, interactor, base_sum, "ga")
        validator.load_state_dict(extra.get("validator"))
    _check_evolve_values(population, run.evolve)  # before the first episode

    def save() -> dict[str, Any]:
        return _checkpoint("ga", population.snapshot("cpu"), interactor, history, base_sum, validator, run.config)

    steps_before = _steps_of(history)
    return run_ga(population, interactor, run, history, validator, steps_before, save), history


def _evolve_es(
    model: nn.Module,
    pop_size: int,
    low_rank: int,
    lora_targets: Any,
    device: Any,
    options: ES,
    interactor: EnvInteractor,
    run: Run,
) -> tuple[nn.Module, list[GenerationStats]]:
    """The ES run of :func:`evolve_with_env`: the champion centre and the history."""
    base_sum = checksum([*model.parameters(), *model.buffers()]).tolist()
    es = make_es(model, pop_size, low_rank, run.seed, lora_targets, device or interactor.device, options.es_kwargs())
    with closing_on_failure() as undo:
        undo.callback(es.close)
        history: list[GenerationStats] = []
        validator = Validator(run.seed, run.validation_episodes, 1)
        if run.resume and run.checkpoint is not None and run.checkpoint.is_file():
            history, extra = _resume(run.checkpoint, es.load_state_dict, run.config, interactor, base_sum, "es")
            validator.load_state_dict(extra.get("validator"))

        def save() -> dict[str, Any]:
            return _checkpoint("es", es.state_dict(), interactor, history, base_sum, validator, run.config)

        return run_es(es, interactor, run, history, validator, _steps_of(history), save), history


def run_config(**options: Any) -> Config:
    """What a checkpoint of :func:`evolve_with_env` stores of the run and a resume must match: ``pop_size``,
    ``low_rank``, ``seed``, ``horizon`` and the option objects that shape its generations (``algorithm``,
    ``episodes``, ``validation``, ``env_options`` less its ``device``: a run may resume on another machine),
    JSON-safe. Not stored: ``num_generations``, ``target_fitness``, ``budget`` (a resumed run may go on
    longer), ``checkpointing``, ``progress``, ``callback``."""
    values = {k: _json_safe(v) for k, v in options.items()}
    if isinstance(values.get("env_options"), dict):
        values["env_options"] = {k: v for k, v in values["env_options"].items() if k != "device"}
    if isinstance(values.get("algorithm"), dict):
        values["algorithm"] = {"kind": type(options["algorithm"]).__name__, **values["algorithm"]}
    return _RunConfig(values)


@dataclasses.dataclass(frozen=True)
class _RunConfig(Config):
    """The stored run (see :func:`run_config`): one field per option, compared field by field."""

    run: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.run)

    def check_matches(self, stored: Any, what: str, *, ignore: Collection[str] = ()) -> None:
        if not isinstance(stored, Mapping):
            raise CheckpointError(f"{what} holds no evolve_with_env config (got {type(stored).__name__})")
        for key in [k for k in list(self.run) + [k for k in stored if k not in self.run] if k not in ignore]:
            diff = _first_difference(
                f"evolve_with_env.{key}", stored.get(key, "<absent>"), self.run.get(key, "<absent>")
            )
            if diff is not None:
                path, old, new = diff
                raise CheckpointError(
                    f"{what} was written with {path}={old!r}; this run has {path}={new!r} "
                    "(resume with the same options, or start a new run)"
                )


def _first_difference(path: str, stored: Any, current: Any) -> tuple[str, Any, Any] | None:
    if isinstance(stored, Mapping) and isinstance(current, Mapping):
        for key in list(current) + [k for k in stored if k not in current]:
            found = _first_difference(f"{path}.{key}", stored.get(key, "<absent>"), current.get(key, "<absent>"))
            if found is not None:
                return found
        return None
    if isinstance(stored, (list, tuple)) and isinstance(current, (list, tuple)):
        stored, current = list(stored), list(current)
    return None if stored == current else (path, stored, current)


def _json_safe(value: Any) -> Any:
    """``value`` as plain Python values (a config by its ``to_dict``; an object with no JSON form by its
    class, a ``torch.dtype`` by its name)."""
    if isinstance(value, Config):
        try:
            return value.to_dict()
        except InvalidTypeError:  # a field with no JSON form (an optimizer object, a dtype)
            return {f.name: _json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value)
    if callable(value) and not isinstance(value, torch.optim.Optimizer):
        return {"callable": f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}"}
    return {"object": f"{type(value).__module__}.{type(value).__qualname__}"}


def _steps_of(history: list[GenerationStats]) -> int:
    return int(history[-1].env_steps or 0) if history else 0


def _checkpoint(
    algorithm: str,
    state: dict[str, Any],
    interactor: EnvInteractor,
    history: list[GenerationStats],
    base_sum: list[int],
    validator: Validator,
    config: Config,
) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "algorithm": algorithm,
        "population": state,  # the population's snapshot, or the ES's state_dict
        "interactor": interactor.state_dict(),
        "history": [tuple(h)[:6] for h in history],  # the fields a run records (ES tell's extras are not kept)
        "base_checksum": base_sum,
        "validator": validator.state_dict(),
        "config": config.to_dict(),  # what the run is; a resume with another is refused, naming the field
    }


def _check_evolve_values(population: Population, options: Evolution) -> None:
    """Run one ``evolve_`` with ``options`` on the population, then restore it exactly.

    Whatever ``evolve_`` would refuse (an unknown operator, ``epsilon=-1``,
    options an operator does not take, fractions that leave no survivor)
    raises here, before the first episode; the adapters, generator and
    counters are restored from a copy afterwards, so the run is the same as
    without the check.
    """
    if options == ENV_EVOLUTION:  # the defaults are valid by construction
        return
    saved = population.snapshot()
    fitnesses = torch.arange(population.pop_size, dtype=torch.float32, device=population.device)
    try:
        population.evolve_(fitnesses, options)
    finally:
        population.load_state_dict(saved)


def _resume(
    path: Path,
    load: Callable[[dict[str, Any]], Any],
    config: Config,
    interactor: EnvInteractor,
    base_sum: list[int],
    algorithm: str,
) -> tuple[list[GenerationStats], dict[str, Any]]:
    """Restore a checkpoint: the history and the checkpoint's other entries (``validator``).

    ``load`` restores the population's (or ES's) state; ``config`` is this run's (a checkpoint that stores
    one, written since 0.6.0, must hold the same: the first field that differs is named).
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
    if "config" in state:  # written since 0.6.0 (earlier files hold none and resume as before)
        config.check_matches(state["config"], where)
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
    """``(generation, best, mean)`` up to ``(generation, best, mean, std, validated, env_steps)``.

    The optional entries may be ``None``.
    """
    if not 3 <= len(entry) <= 6:
        raise ValueError(f"an entry has {len(entry)} values, expected 3 to 6")
    more = [*entry[3:], None, None, None][:3]
    std, validated, steps = (None if v is None else float(v) for v in more)
    return GenerationStats(
        int(entry[0]), float(entry[1]), float(entry[2]), std, validated, None if steps is None else int(steps)
    )
