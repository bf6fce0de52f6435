"""The loop behind :func:`~populora.evolve_with_env`, with every loop's surface (:class:`EnvLoop`).

One step is one generation. The genetic algorithm's: apply the last generation's pending ``evolve_``,
play every individual's training episodes, validate the top candidates, record. The ES's: validate the
centre, play the individuals, record, ``tell``. The GA's ``evolve_`` waits for the next step so that the
population a run ends on is the one its last fitnesses judged (the best of the last generation is merged
when validation is off), and a state saved after any generation resumes bit for bit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from populora.checkpoint import atomic_save
from populora.checks import check_float, check_int
from populora.distributed import checksum, is_main_rank, world_size
from populora.envs.actions import ActionFn
from populora.envs.interactor import EnvInteractor, interact_with_env
from populora.envs.normalize import sum_over_ranks
from populora.envs.slots import DEFAULT_NUM_ENVS, is_factory
from populora.errors import CheckpointError, InvalidValueError
from populora.loops.base import Budget, load_state, save_state
from populora.loops.env.champion import Validator
from populora.loops.env.es_env import es_fitnesses, make_es
from populora.loops.env.generations import Bookkeeping, GenerationInfo, validate_es, validate_ga
from populora.loops.env.options import ENV_EVOLUTION, ES, GA, Checkpointing, EnvOptions, Episodes, Validation
from populora.loops.env.setup import (
    Setup,
    Stopping,
    algorithm_of,
    check_env_options,
    check_setup,
    check_stopping,
    option,
)
from populora.loops.env.state import FORMAT, check_state, run_config
from populora.population.evolution import Evolution
from populora.population.population import Population
from populora.stats import GenerationStats
from populora.transaction import Attributes, closing_on_failure, transaction

__all__ = ["EnvLoop"]

_KIND = "evolve_with_env"  # the checkpoint kind: a file of either writes and reads the other's


class EnvLoop:
    """A population (GA) or an :class:`~populora.EggrollES` (ES) evolved against envs, one generation a step.

    :func:`~populora.evolve_with_env` is this loop run to its end; the loop is for what a call cannot do:
    step by hand, run in several pieces, inspect or save between them. It has every loop's surface
    (:class:`populora.loops.base.Loop`)::

        loop = EnvLoop(lambda: gym.make("CartPole-v1"), model, pop_size=64, low_rank=2, horizon=500)
        loop.run(Budget(max_steps=20), callback=lambda info: print(info.as_dict()))
        loop.save("run.pt")                       # resume later with EnvLoop(...same...).load("run.pt")
        policy = loop.finish()                    # the champion merged into the model; the loop is closed

    Args (as :func:`~populora.evolve_with_env`'s, which documents each): ``envs``, ``model`` (wrapped in
    place until :meth:`finish` or :meth:`close`), ``pop_size``, ``low_rank``, ``algorithm`` (``GA()`` /
    ``ES()`` or ``'ga'`` / ``'es'``), ``episodes``, ``validation``, ``env_options`` (option objects of
    :mod:`populora.loops.env.options`), ``lora_targets``, ``action``, ``horizon``, ``seed``.

    Attributes:
        history: one :class:`~populora.stats.GenerationStats` per generation played (``as_dict()``).
        interactor: the :class:`~populora.EnvInteractor` playing the episodes.
        optimizer: the :class:`~populora.Population` (GA) or :class:`~populora.EggrollES` (ES).
        config: what :meth:`state_dict` stores and a load must match (:func:`~populora.loops.env.state.run_config`).

    Raises:
        InvalidValueError / InvalidTypeError: a bad argument or option field (named), before any env is
            made or the model is wrapped.
    """

    def __init__(
        self,
        envs: Any,
        model: nn.Module,
        pop_size: int,
        low_rank: int,
        *,
        algorithm: GA | ES | str = "ga",
        episodes: Episodes | None = None,
        validation: Validation | None = None,
        env_options: EnvOptions | None = None,
        lora_targets: str | re.Pattern[str] | Sequence[str | re.Pattern[str]] | None = None,
        action: ActionFn | None = None,
        horizon: int | None = None,
        seed: int = 0,
    ) -> None:
        chosen = algorithm_of(algorithm)
        episodes = option("episodes", episodes, Episodes)
        validation = option("validation", validation, Validation)
        env_options = option("env_options", env_options, EnvOptions)
        check_env_options(env_options)
        pop_size = check_int("pop_size", pop_size, low=1)
        playing = dict(action=action, horizon=horizon, to_range=env_options.to_range)
        self.setup: Setup = check_setup(chosen, episodes, validation, seed, pop_size, playing)
        self.config = run_config(
            pop_size=pop_size,
            low_rank=low_rank,
            seed=seed,
            horizon=horizon,
            algorithm=chosen,
            episodes=episodes,
            validation=validation,
            env_options=env_options,
        )
        self.algorithm = "es" if isinstance(chosen, ES) else "ga"
        num_envs = env_options.num_envs
        if num_envs is None and is_factory(envs):
            num_envs = min(-(-pop_size // max(1, world_size())), DEFAULT_NUM_ENVS)
        self.interactor: EnvInteractor = interact_with_env(
            envs,
            env_options.device,
            num_envs=num_envs,
            flatten_obs=env_options.flatten_obs,
            normalize_obs=env_options.normalize_obs,
            obs_keys=env_options.obs_keys,
            drop_obs_keys=env_options.drop_obs_keys,
        )
        with closing_on_failure() as undo:
            undo.callback(self.interactor.close)
            setup = self.setup
            if setup.validation_episodes > 0 and episodes.fitness is None:
                self.interactor.seeded_slots("validation")  # plays its episodes by their seeds: checked first
            if isinstance(chosen, ES):
                self.base_checksum = checksum([*model.parameters(), *model.buffers()]).tolist()
                device = env_options.device or self.interactor.device
                es = make_es(model, pop_size, low_rank, setup.seed, lora_targets, device, chosen.es_kwargs())
                self.optimizer: Any = es
                undo.callback(self.optimizer.close)
            else:
                population = self.interactor.population(
                    model, pop_size, low_rank, lora_targets, seed=setup.seed, **dict(chosen.population_kwargs)
                )
                undo.callback(population.close)  # the user's model comes back unwrapped, its flags restored
                population.sync_from_main_rank_()  # every rank holds rank 0's base model before it is checksummed
                self.base_checksum = checksum([*population.model.parameters(), *population.model.buffers()]).tolist()
                _check_evolve_values(population, setup.evolve)
                self.optimizer = population
            self.validator = Validator(setup.seed, setup.validation_episodes, setup.validation_top)
        self.history: list[GenerationStats] = []
        self.pending: Tensor | None = None  # (P,) the GA's fitnesses its next step evolves with
        self.closed = False
        self._spent = False  # finish() merged (GA) or closed (ES) the optimizer
        self._steps_before = 0  # env steps of the run before this process (a loaded state's)
        self._counted = 0  # this process's env-step counter when the state was loaded

    # ------------------------------------------------------------------ the loop surface

    def step(self, target_fitness: float | None = None) -> GenerationInfo:
        """One generation, all or nothing (a step that raises changes nothing); its record.

        Args:
            target_fitness: the score at which a new champion is confirmed on more validation episodes
                (what ``run(target_fitness=)`` stops on; see :func:`~populora.evolve_with_env`).

        Returns:
            The generation's :class:`~populora.loops.env.generations.GenerationInfo` (``as_dict()``);
            ``history[-1]`` is its ``stats``.
        """
        self._check_open()
        target = None if target_fitness is None else check_float("target_fitness", target_fitness)
        parts = [
            self.optimizer,
            self.interactor,
            Attributes(self.interactor, "counters"),
            self.validator,
            Attributes(self, "history", "pending"),
        ]
        with transaction(*parts):
            if self.algorithm == "ga":
                fitnesses, validated = self._ga_generation(target)
            else:
                fitnesses, validated = self._es_generation(target)
            steps = self._env_steps()
            f = fitnesses.detach()  # float32, as Population.history's
            stats = GenerationStats(
                int(self.optimizer.generation),
                float(f.max()),
                float(f.mean()),
                float(f.std(correction=0)),
                validated,
                steps,
            )
            self.history.append(stats)
            if self.algorithm == "es":
                self.optimizer.tell(fitnesses)
        champion = self.validator.champion
        score = None if champion is None else champion.score
        return GenerationInfo(stats, self.history, fitnesses, score, self.optimizer, self.interactor)

    def run(
        self,
        budget: int | Budget | None = None,
        *,
        callback: Callable[[GenerationInfo], Any] | None = None,
        progress: bool = False,
        target_fitness: float | None = None,
    ) -> list[GenerationStats]:
        """Step until the :class:`~populora.loops.base.Budget` is spent, ``target_fitness`` is reached
        (judged on the confirmed champion, as :func:`~populora.evolve_with_env`) or ``callback(info)``
        returns ``True``; the records of this call.

        ``budget``: generations as an int, or a ``Budget`` of generations (``max_steps``), seconds and
        env steps. ``callback`` follows every loop's rule (:func:`~populora.loops.base.callback_says_stop`).
        ``progress``: a tqdm bar on the main rank.
        """
        budget = Budget.of(budget, where="EnvLoop.run")
        if budget.max_steps is None and budget.max_seconds is None and budget.max_env_steps is None:
            raise InvalidValueError("EnvLoop.run needs a budget that stops it, got Budget() (no limit)")
        limit = len(self.history) + budget.max_steps if budget.max_steps is not None else 2**62
        stopping, _ = check_stopping(limit, target_fitness, budget, progress, callback, Checkpointing())
        return self.drive(stopping)

    def drive(self, stopping: Stopping) -> list[GenerationStats]:
        """Step under ``stopping``'s rules (writing its checkpoint after every generation); this call's records.

        :meth:`run` and :func:`~populora.evolve_with_env` both come here; ``stopping.num_generations``
        counts the generations of the whole run (a loaded state's included).
        """
        self._check_open()
        first = len(self.history)
        book = Bookkeeping(stopping, self.history, self.setup.validating)
        try:
            while len(self.history) < stopping.num_generations:
                info = self.step(stopping.target_fitness)
                if stopping.checkpoint is not None and is_main_rank():
                    atomic_save(self.state_dict(), stopping.checkpoint, kind=_KIND)
                champion = self.validator.champion
                if book.stop_after(info, None if champion is None else champion.lower):
                    break
        finally:
            book.close()
        return self.history[first:]

    def finish(self) -> nn.Module:
        """The run's policy, and the loop closed: the champion (the best validated individual of the run,
        with its generation's observation normaliser) merged into the model, or without validation the best
        individual of the last generation; ``nn.Sequential(normaliser, model)`` with ``normalize_obs=True``.
        """
        self._check_open()
        try:
            merged = self._ga_result() if self.algorithm == "ga" else self._es_result()
            self._spent = True
            policy = self.interactor.wrap_policy(merged)
        finally:
            self.close()
        return policy

    def close(self) -> None:
        """Unwrap the model without merging (its forwards and flags come back) and close the envs.

        Idempotent; the loop cannot step afterwards."""
        if self.closed:
            return
        self.closed = True
        try:
            if not self._spent:
                self.optimizer.close()
        finally:
            self.interactor.close()

    def __enter__(self) -> EnvLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The loop's state (copies; a checkpoint of :func:`~populora.evolve_with_env`, format ``/3``)."""
        self._check_open()
        state = self.optimizer.snapshot("cpu") if self.algorithm == "ga" else self.optimizer.state_dict()
        return {
            "format": FORMAT,
            "algorithm": self.algorithm,
            "population": state,  # the population's snapshot, or the ES's state_dict
            "interactor": self.interactor.state_dict(),
            "history": [tuple(h)[:6] for h in self.history],  # the fields a run records (ES tell's extras are not)
            "pending": None if self.pending is None else self.pending.detach().to("cpu", copy=True),
            "base_checksum": self.base_checksum,
            "validator": self.validator.state_dict(),
            "config": self.config.to_dict(),  # what the run is; a load with another is refused, naming the field
        }

    def load_state_dict(self, state: Mapping[str, Any], *, where: str = "the state") -> None:
        """Restore :meth:`state_dict` (or a 0.1 to 0.5 checkpoint of ``evolve_with_env``), all or nothing.

        Raises:
            CheckpointError: a state of another kind, algorithm, base model, config (the first field that
                differs is named), observation normalisation, or that does not fit; nothing has changed.
        """
        self._check_open()
        state, history = check_state(
            state, where, self.config, self.base_checksum, self.algorithm, self.interactor.normalize_obs
        )
        pending = state.get("pending")
        parts = [self.optimizer, self.interactor, self.validator, Attributes(self, "history", "pending")]
        try:
            with transaction(*parts):
                self.interactor.load_state_dict(state["interactor"])
                self.optimizer.load_state_dict(state["population"])
                self.validator.load_state_dict(state.get("validator"))
        except CheckpointError:
            raise
        except (ValueError, TypeError, KeyError, IndexError) as error:
            raise CheckpointError(f"{where} does not fit this run: {type(error).__name__}: {error}") from error
        self.history = history
        device = self.interactor.device if self.algorithm == "es" else self.optimizer.device
        self.pending = None if pending is None else pending.to(device)
        self._steps_before = int(history[-1].env_steps or 0) if history else 0
        self._counted = int(self.interactor.counters["env_steps"])

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state_dict` to ``path`` atomically (rank 0 writes under torchrun); returns the ``Path``."""
        return save_state(self, path, _KIND) if is_main_rank() else Path(path)

    def load(self, path: str | Path) -> EnvLoop:
        """Resume from a file :meth:`save` (or ``evolve_with_env``'s checkpointing) wrote; returns ``self``."""
        load_state(self, path, _KIND)
        return self

    # ------------------------------------------------------------------ one generation

    def _env_steps(self) -> int:
        """The run's env steps so far: a loaded state's, plus every rank's since (one all-reduce)."""
        local = torch.tensor([float(self.interactor.counters["env_steps"] - self._counted)], dtype=torch.float64)
        return self._steps_before + int(sum_over_ranks(local)[0])

    def _ga_generation(self, target: float | None) -> tuple[Tensor, float | None]:
        population: Population = self.optimizer
        setup = self.setup
        if self.pending is not None:
            population.evolve_(self.pending, setup.evolve)
            self.interactor.update_obs_stats(population)  # fold this generation's observations in (all ranks)
            self.pending = None
        episodes = dict(setup.episodes)
        if episodes.get("fitness") is None:
            episodes["episode_seeding"] = setup.episode_seeding
        fitnesses = population.validate_fitnesses(self.interactor.evaluate(population, **episodes))
        validated = validate_ga(population, self.interactor, setup, target, self.validator, fitnesses)
        self.pending = fitnesses
        return fitnesses, validated

    def _es_generation(self, target: float | None) -> tuple[Tensor, float | None]:
        es, setup = self.optimizer, self.setup
        self.interactor.advance_obs_stats(es.generation)
        validated = validate_es(es, self.interactor, setup, target, self.validator)
        episodes = {k: v for k, v in setup.episodes.items() if k != "fitness"}
        fitnesses = es_fitnesses(
            self.interactor, es, seed=setup.seed, episode_seeding=setup.episode_seeding, **episodes
        )
        return fitnesses, validated

    def _ga_result(self) -> nn.Module:
        population: Population = self.optimizer
        fitnesses = self.pending
        if fitnesses is None:  # a state written before its generation was evolved (0.5.0): play it again
            fitnesses, _ = self._ga_generation(None)
        champion = self.validator.champion
        if champion is None:
            return population.select_and_merge_best_(fitnesses)
        population.load_state_dict(champion.state)
        self.interactor.load_state_dict(champion.interactor)
        return population.merge_(champion.index)

    def _es_result(self) -> nn.Module:
        es = self.optimizer
        if self.validator.enabled:  # the centre after the last update
            self.interactor.advance_obs_stats(es.generation)
            validate_es(es, self.interactor, self.setup, None, self.validator)
        es.close()
        champion = self.validator.champion
        if champion is not None:
            es.model.load_state_dict(champion.state)
            self.interactor.load_state_dict(champion.interactor)
        return es.model

    def _check_open(self) -> None:
        if self.closed:
            raise InvalidValueError("this EnvLoop is closed (finish() or close() was called): make a new one")


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
