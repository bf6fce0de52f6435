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
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from torch import nn

from populora.checkpoint import load_checkpoint
from populora.envs.actions import ActionFn
from populora.errors import InvalidTypeError, InvalidValueError
from populora.loops.env.generations import GenerationInfo
from populora.loops.env.loop import EnvLoop
from populora.loops.env.options import ES, GA, Budget, Checkpointing, EnvOptions, Episodes, Validation
from populora.loops.env.setup import (
    ALGORITHMS,
    CHECKPOINT_NAME,
    DEFAULT_VALIDATION_EPISODES,
    DEFAULT_VALIDATION_TOP,
    check_stopping,
    option,
    validation_defaults,
)
from populora.loops.env.state import run_config
from populora.stats import GenerationStats
from populora.transaction import closing_on_failure

__all__ = [
    "validation_defaults",
    "ALGORITHMS",
    "CHECKPOINT_NAME",
    "DEFAULT_VALIDATION_EPISODES",
    "DEFAULT_VALIDATION_TOP",
    "ENV_EVOLVE_DEFAULTS",
    "EnvLoop",
    "EvolveResult",
    "GenerationInfo",
    "evolve_with_env",
    "run_config",
]

ENV_EVOLVE_DEFAULTS: dict[str, Any] = {"epsilon": 0.3}
"""0.5.0's form of :data:`~populora.loops.env.options.ENV_EVOLUTION` (``Population.evolve_`` options that
``evolve_with_env`` changes by default: mutation scale 0.3 instead of 0.1); kept for one release."""


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
    checkpointing = option("checkpointing", checkpointing, Checkpointing)
    budget = option("budget", budget, Budget)
    if budget.max_steps is not None:
        raise InvalidValueError(
            f"`Budget.max_steps` does not apply to evolve_with_env (got {budget.max_steps}): "
            "`num_generations` caps its generations"
        )
    stopping, resume = check_stopping(num_generations, target_fitness, budget, progress, callback, checkpointing)
    loop = EnvLoop(
        envs,
        model,
        pop_size,
        low_rank,
        algorithm=algorithm,
        episodes=episodes,
        validation=validation,
        env_options=env_options,
        lora_targets=lora_targets,
        action=action,
        horizon=horizon,
        seed=seed,
    )
    with closing_on_failure() as undo:
        undo.callback(loop.close)  # the user's model comes back unwrapped, its flags restored
        path = stopping.checkpoint
        if resume and path is not None and path.is_file():
            state = load_checkpoint(path, kind="evolve_with_env")  # CheckpointError: damaged, foreign kind
            loop.load_state_dict(state, where=f"checkpoint {str(path)!r}")
        loop.drive(stopping)
        policy = loop.finish()
    return EvolveResult(policy, loop.history) if return_history else policy
