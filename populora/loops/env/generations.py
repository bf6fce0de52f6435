"""The generation loops of :func:`~populora.evolve_with_env`: the genetic algorithm's and the ES's.

Each generation: training fitness of every individual, validation of the
top candidates (:mod:`populora.loops.env.champion`), one
:class:`~populora.stats.GenerationStats` (training ``best`` / ``mean`` /
``std``, the generation's ``validated`` score, the run's cumulative
``env_steps`` over all ranks), the ``callback``, the stopping rules, then
the evolution step and a checkpoint. The result is the champion (the best
validated individual of the run), or without validation the best
individual of the last generation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from populora.checkpoint import atomic_save
from populora.distributed import is_main_rank
from populora.envs.interactor import EnvInteractor
from populora.envs.normalize import sum_over_ranks
from populora.loops.base import callback_says_stop
from populora.loops.env.champion import Validator, fingerprint, top_candidates
from populora.loops.env.es_env import es_fitnesses
from populora.population.evolution import Evolution
from populora.population.population import Population
from populora.stats import BudgetProgress, GenerationStats

__all__ = ["GenerationInfo", "Run", "run_es", "run_ga"]


@dataclass(frozen=True)
class Run:
    """The checked options of one :func:`~populora.evolve_with_env` call."""

    num_generations: int
    target_fitness: float | None
    progress: bool
    episodes: dict[str, Any]  # action, horizon, num_episodes, to_range (+ fitness for the GA)
    episode_seeding: str
    evolve: Evolution  # every generation's Population.evolve_ options
    checkpoint: Path | None
    resume: bool
    seed: int
    validation_episodes: int
    validation_top: int
    callback: Callable[[GenerationInfo], Any] | None
    max_env_steps: int | None
    max_seconds: float | None = None
    started: float = field(default_factory=lambda: time.monotonic())  # Budget.max_seconds counts from the call
    config: Any = None  # the run's config (a Config), stored in its checkpoint and compared on resume


class GenerationInfo(NamedTuple):
    """What ``callback(info)`` of :func:`~populora.evolve_with_env` receives after each generation.

    Attributes:
        stats: this generation's :class:`~populora.stats.GenerationStats`.
        history: every generation's so far (``history[-1] is stats``).
        fitnesses: ``(P,)`` training fitnesses of this generation.
        champion_score: the best validated score of the run so far (``None`` before any).
        optimizer: the :class:`~populora.Population` or :class:`~populora.EggrollES` being evolved.
        interactor: the :class:`~populora.EnvInteractor` (``play`` for custom checks).
    """

    stats: GenerationStats
    history: list[GenerationStats]
    fitnesses: Tensor
    champion_score: float | None
    optimizer: Any
    interactor: EnvInteractor

    def as_dict(self) -> dict[str, float]:
        """The generation's numbers, ``{name: number}``: :attr:`stats` ``.as_dict()`` and ``champion_score``.

        Numbers only, so logging is one line in a callback, e.g. TensorBoard's
        ``writer.add_scalars("evolve", info.as_dict(), info.stats.generation)`` or ``wandb.log(info.as_dict())``.
        """
        out = self.stats.as_dict()
        if self.champion_score is not None:
            out["champion_score"] = float(self.champion_score)
        return out


def total_env_steps(interactor: EnvInteractor) -> int:
    """Env steps taken by the run so far, summed over ranks (every rank must call it)."""
    local = torch.tensor([float(interactor.counters["env_steps"])], dtype=torch.float64)
    return int(sum_over_ranks(local)[0])


class Loop:
    """Bookkeeping shared by both loops: history, progress bar, stopping rules."""

    def __init__(self, run: Run, interactor: EnvInteractor, history: list[GenerationStats], steps_before: int):
        self.run, self.interactor, self.history = run, interactor, history
        self.steps_before = steps_before  # env steps of the run before this process (a resumed run)
        self.budget = BudgetProgress(
            {"seconds": run.max_seconds, "env steps": run.max_env_steps, "generations": run.num_generations},
            {"generations": len(history), "env steps": steps_before},
            show=run.progress and is_main_rank(),
        )
        if self.history:
            self.budget.update({}, dict(best=f"{self.history[-1].best:.4g}", mean=f"{self.history[-1].mean:.4g}"))

    def totals(self) -> tuple[int, float]:
        """``(env steps of the run, seconds since the call)``: every rank's steps summed, rank 0's clock.

        One all-reduce (every rank must call it), so every rank judges the budgets on the same numbers.
        """
        elapsed = time.monotonic() - self.run.started
        local = torch.tensor(
            [float(self.interactor.counters["env_steps"]), elapsed if is_main_rank() else 0.0], dtype=torch.float64
        )
        summed = sum_over_ranks(local)
        return self.steps_before + int(summed[0]), float(summed[1])

    def record(
        self,
        generation: int,
        fitnesses: Tensor,
        validated: float | None,
        champion: float | None,
        optimizer: Any,
        lower: float | None = None,
    ) -> bool:
        """Append the generation's stats, report them; whether the run stops here.

        ``target_fitness`` judges ``lower``, the confirmed champion's score minus
        two standard errors (the training best without validation).
        """
        f = fitnesses.detach()  # float32, as Population.history's
        steps, elapsed = self.totals()
        stats = GenerationStats(
            generation, float(f.max()), float(f.mean()), float(f.std(correction=0)), validated, steps
        )
        self.history.append(stats)
        post = dict(best=f"{stats.best:.4g}", mean=f"{stats.mean:.4g}")
        if validated is not None:
            post["validated"] = f"{validated:.4g}"
        if len(self.budget.limits) > 1:  # the bar may count env steps or seconds: the generation in the postfix
            post["gen"] = str(len(self.history))
        self.budget.update({"generations": len(self.history), "env steps": steps, "seconds": elapsed}, post)
        run = self.run
        validating = run.validation_episodes > 0 and run.validation_top > 0
        score = lower if validating else stats.best  # without validation: the training best
        stop = run.target_fitness is not None and score is not None and score >= run.target_fitness
        stop = stop or (run.max_env_steps is not None and steps >= run.max_env_steps)
        stop = stop or (run.max_seconds is not None and elapsed >= run.max_seconds)
        if run.callback is not None:
            info = GenerationInfo(stats, self.history, fitnesses, champion, optimizer, self.interactor)
            stop = callback_says_stop(run.callback, run.callback(info)) or stop
        return stop or len(self.history) >= run.num_generations

    def close(self) -> None:
        self.budget.close()


# ---------------------------------------------------------------------- the genetic algorithm


def validate_ga(
    population: Population, interactor: EnvInteractor, run: Run, validator: Validator, fitnesses: Tensor
) -> float | None:
    """Validate this generation's top candidates; their best validated score (``None``: validation off)."""
    if not validator.enabled:
        return None
    ids = top_candidates(fitnesses, validator.top)
    if validator.champion is not None:  # one whose training fitness is below the champion's score is not replayed
        ids = [i for i in ids if float(fitnesses[i]) >= validator.champion.score]
    if not ids:
        return None
    fitness = run.episodes.get("fitness")
    if fitness is not None:  # a custom fitness, run by every rank with the validation eval seed
        saved = population.eval_seed
        population.eval_seed = validator.eval_seed
        try:
            values = population.validate_fitnesses(population.evaluate_distributed(fitness))
        finally:
            population.eval_seed = saved
        scores = [float(values[i]) for i in ids]
    else:
        state = population.state_dict(include_model=False)
        extra = interactor.state_dict()["obs_stats"]
        extra = None if extra is None else (extra["normalizer"]["count"].item(), extra["generation"])
        keys = [fingerprint(state, i, population.pop_size, extra) for i in ids]
        options = {k: v for k, v in run.episodes.items() if k not in ("fitness", "num_episodes")}

        def play(positions: list[int]) -> Tensor:
            chosen = [ids[j] for j in positions]
            returns = interactor.episode_returns(population, chosen, seeds=validator.seeds, **options)
            return returns.mean(dim=1)

        scores = validator.scores(keys, play)
    best = validator.offer(
        population.generation, ids, scores, lambda: (population.snapshot("cpu"), interactor.state_dict())
    )
    if fitness is None and validator.champion is not None:
        champion = validator.champion
        key = keys[ids.index(champion.index)] if champion.generation == population.generation else ""

        def confirm(seeds: list[int]) -> list[float]:
            return interactor.episode_returns(population, [champion.index], seeds=seeds, **options)[0].tolist()

        confirmed = validator.confirm(population.generation, run.target_fitness, key, confirm)
        if confirmed is not None:  # the generation's best is now judged on more episodes
            others = [sc for i, sc in zip(ids, scores) if i != champion.index]
            best = max([confirmed, *others])
            validator.reconsider(
                population.generation, ids, scores, lambda: (population.snapshot("cpu"), interactor.state_dict())
            )
    return best


def run_ga(
    population: Population,
    interactor: EnvInteractor,
    run: Run,
    history: list[GenerationStats],
    validator: Validator,
    steps_before: int,
    save: Callable[[], dict[str, Any]] | None,
) -> nn.Module:
    """The genetic algorithm's generations; the merged champion."""
    loop = Loop(run, interactor, history, steps_before)
    fitnesses = None
    episodes = dict(run.episodes)
    if episodes.get("fitness") is None:
        episodes["episode_seeding"] = run.episode_seeding
    try:
        while len(history) < run.num_generations:
            fitnesses = population.validate_fitnesses(interactor.evaluate(population, **episodes))
            validated = validate_ga(population, interactor, run, validator, fitnesses)
            champion_score = None if validator.champion is None else validator.champion.score
            lower = None if validator.champion is None else validator.champion.lower
            if loop.record(population.generation, fitnesses, validated, champion_score, population, lower):
                break
            population.evolve_(fitnesses, run.evolve)
            interactor.update_obs_stats(population)  # fold this generation's observations in (all ranks)
            if run.checkpoint is not None and save is not None and is_main_rank():
                atomic_save(save(), run.checkpoint, kind="evolve_with_env")
    finally:
        loop.close()
    if fitnesses is None:  # resumed a finished run: evaluate the last generation again
        fitnesses = population.validate_fitnesses(interactor.evaluate(population, **episodes))
        validate_ga(population, interactor, run, validator, fitnesses)
    champion = validator.champion
    if champion is None:
        return population.select_and_merge_best_(fitnesses)
    population.load_state_dict(champion.state)
    interactor.load_state_dict(champion.interactor)
    return population.merge_(champion.index)


# ---------------------------------------------------------------------- ES


def snapshot_model(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def validate_es(es: Any, interactor: EnvInteractor, run: Run, validator: Validator) -> float | None:
    """Validate the ES's centre (its unperturbed parameters): the score (``None``: validation off)."""
    if not validator.enabled:
        return None
    state = snapshot_model(es.model)
    extra = interactor.state_dict()["obs_stats"]
    extra = None if extra is None else (extra["normalizer"]["count"].item(), extra["generation"])
    key = fingerprint({k: v.unsqueeze(0) for k, v in state.items()}, 0, 1, extra)
    options = {k: v for k, v in run.episodes.items() if k in ("action", "horizon", "to_range")}

    def play(positions: list[int]) -> list[float]:
        returns = interactor.play_episodes(es.model, [0], validator.seeds, base_seed=run.seed, exact=True, **options)
        return [float(returns[0].mean())]

    scores = validator.scores([key], play)
    best = validator.offer(es.generation, [0], scores, lambda: (state, interactor.state_dict()))

    def confirm(seeds: list[int]) -> list[float]:
        return interactor.play_episodes(es.model, [0], seeds, base_seed=run.seed, exact=True, **options)[0].tolist()

    confirmed = validator.confirm(es.generation, run.target_fitness, key, confirm)
    if confirmed is None:
        return best
    validator.reconsider(es.generation, [], [], lambda: (state, interactor.state_dict()))
    return confirmed


def run_es(
    es: Any,
    interactor: EnvInteractor,
    run: Run,
    history: list[GenerationStats],
    validator: Validator,
    steps_before: int,
    save: Callable[[], dict[str, Any]] | None,
) -> nn.Module:
    """The ES's generations (validate the centre, play the individuals, tell); the champion's model."""
    loop = Loop(run, interactor, history, steps_before)
    episodes = {k: v for k, v in run.episodes.items() if k != "fitness"}
    try:
        while len(history) < run.num_generations:
            interactor.advance_obs_stats(es.generation)
            validated = validate_es(es, interactor, run, validator)
            fitnesses = es_fitnesses(interactor, es, seed=run.seed, episode_seeding=run.episode_seeding, **episodes)
            champion_score = None if validator.champion is None else validator.champion.score
            lower = None if validator.champion is None else validator.champion.lower
            stop = loop.record(es.generation, fitnesses, validated, champion_score, es, lower)
            es.tell(fitnesses)
            if run.checkpoint is not None and save is not None and is_main_rank():
                atomic_save(save(), run.checkpoint, kind="evolve_with_env")
            if stop:
                break
        if validator.enabled:  # the centre after the last update
            interactor.advance_obs_stats(es.generation)
            validate_es(es, interactor, run, validator)
    finally:
        loop.close()
    es.close()
    champion = validator.champion
    if champion is not None:
        es.model.load_state_dict(champion.state)
        interactor.load_state_dict(champion.interactor)
    return es.model
