"""What one generation of an :class:`~populora.loops.env.loop.EnvLoop` does besides playing and evolving:
validating the top candidates (:mod:`populora.loops.env.champion`), the record a callback receives
(:class:`GenerationInfo`), and one ``run``'s progress bar and stopping rules (:class:`Bookkeeping`)."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from populora.distributed import is_main_rank
from populora.envs.interactor import EnvInteractor
from populora.envs.normalize import sum_over_ranks
from populora.loops.base import callback_says_stop
from populora.loops.env.champion import Validator, fingerprint, top_candidates
from populora.loops.env.setup import Setup, Stopping
from populora.population.population import Population
from populora.stats import BudgetProgress, GenerationStats

__all__ = ["Bookkeeping", "GenerationInfo", "total_env_steps", "validate_es", "validate_ga"]


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


class Bookkeeping:
    """One ``run``'s progress bar and stopping rules, judged after every generation."""

    def __init__(self, stopping: Stopping, history: list[GenerationStats], validating: bool):
        self.stopping, self.history, self.validating = stopping, history, validating
        self.started = time.monotonic()  # max_seconds counts from the call
        steps = int(history[-1].env_steps or 0) if history else 0
        self.bar = BudgetProgress(
            {
                "seconds": stopping.max_seconds,
                "env steps": stopping.max_env_steps,
                "generations": stopping.num_generations,
            },
            {"generations": len(history), "env steps": steps},
            show=stopping.progress and is_main_rank(),
        )
        if history:
            self.bar.update({}, dict(best=f"{history[-1].best:.4g}", mean=f"{history[-1].mean:.4g}"))

    def elapsed(self) -> float:
        """Seconds since the call by rank 0's clock (one all-reduce, so every rank judges the same number)."""
        local = torch.tensor([time.monotonic() - self.started if is_main_rank() else 0.0], dtype=torch.float64)
        return float(sum_over_ranks(local)[0])

    def stop_after(self, info: GenerationInfo, lower: float | None) -> bool:
        """Report the generation; whether the run stops here (its callback is called first).

        ``target_fitness`` judges ``lower``, the confirmed champion's score minus
        two standard errors (the training best without validation).
        """
        rules, stats = self.stopping, info.stats
        steps = int(stats.env_steps or 0)
        elapsed = self.elapsed() if rules.max_seconds is not None else 0.0  # a collective only when it binds
        post = dict(best=f"{stats.best:.4g}", mean=f"{stats.mean:.4g}")
        if stats.validated is not None:
            post["validated"] = f"{stats.validated:.4g}"
        if len(self.bar.limits) > 1:  # the bar may count env steps or seconds: the generation in the postfix
            post["gen"] = str(len(self.history))
        self.bar.update({"generations": len(self.history), "env steps": steps, "seconds": elapsed}, post)
        score = lower if self.validating else stats.best  # without validation: the training best
        stop = rules.target_fitness is not None and score is not None and score >= rules.target_fitness
        stop = stop or (rules.max_env_steps is not None and steps >= rules.max_env_steps)
        stop = stop or (rules.max_seconds is not None and elapsed >= rules.max_seconds)
        if rules.callback is not None:
            stop = callback_says_stop(rules.callback, rules.callback(info)) or stop
        return stop or len(self.history) >= rules.num_generations

    def close(self) -> None:
        self.bar.close()


# ---------------------------------------------------------------------- the genetic algorithm


def validate_ga(
    population: Population,
    interactor: EnvInteractor,
    setup: Setup,
    target: float | None,
    validator: Validator,
    fitnesses: Tensor,
) -> float | None:
    """Validate this generation's top candidates; their best validated score (``None``: validation off)."""
    if not validator.enabled:
        return None
    ids = top_candidates(fitnesses, validator.top)
    if validator.champion is not None:  # one whose training fitness is below the champion's score is not replayed
        ids = [i for i in ids if float(fitnesses[i]) >= validator.champion.score]
    if not ids:
        return None
    fitness = setup.episodes.get("fitness")
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
        options = {k: v for k, v in setup.episodes.items() if k not in ("fitness", "num_episodes")}

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

        confirmed = validator.confirm(population.generation, target, key, confirm)
        if confirmed is not None:  # the generation's best is now judged on more episodes
            others = [sc for i, sc in zip(ids, scores) if i != champion.index]
            best = max([confirmed, *others])
            validator.reconsider(
                population.generation, ids, scores, lambda: (population.snapshot("cpu"), interactor.state_dict())
            )
    return best


# ---------------------------------------------------------------------- ES


def snapshot_model(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def validate_es(
    es: Any, interactor: EnvInteractor, setup: Setup, target: float | None, validator: Validator
) -> float | None:
    """Validate the ES's centre (its unperturbed parameters): the score (``None``: validation off)."""
    if not validator.enabled:
        return None
    state = snapshot_model(es.model)
    extra = interactor.state_dict()["obs_stats"]
    extra = None if extra is None else (extra["normalizer"]["count"].item(), extra["generation"])
    key = fingerprint({k: v.unsqueeze(0) for k, v in state.items()}, 0, 1, extra)
    options = {k: v for k, v in setup.episodes.items() if k in ("action", "horizon", "to_range")}

    def play(positions: list[int]) -> list[float]:
        returns = interactor.play_episodes(es.model, [0], validator.seeds, base_seed=setup.seed, exact=True, **options)
        return [float(returns[0].mean())]

    scores = validator.scores([key], play)
    best = validator.offer(es.generation, [0], scores, lambda: (state, interactor.state_dict()))

    def confirm(seeds: list[int]) -> list[float]:
        return interactor.play_episodes(es.model, [0], seeds, base_seed=setup.seed, exact=True, **options)[0].tolist()

    confirmed = validator.confirm(es.generation, target, key, confirm)
    if confirmed is None:
        return best
    validator.reconsider(es.generation, [], [], lambda: (state, interactor.state_dict()))
    return confirmed
