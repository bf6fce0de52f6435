"""ES against environments: the individuals of an :class:`~populora.EggrollES` generation play episodes.

They play as a Population's individuals do (see
:mod:`populora.envs.interactor`): the same slot scheduler, one routed
forward per timestep over every playing slot (``es.ask()(obs,
individuals=ids, per_individual=True)``, one row per slot), the same seeding
and observation normalisation. :func:`es_fitnesses` is one generation's
``(N,)`` fitness, for ``es.tell``; :func:`make_es` builds the ES of
``evolve_with_env(..., algorithm='es')``.

Seeding: the generation's eval seed is ``seed + es.generation``. With
``'common'`` every individual meets the same episodes; with
``'independent'`` each antithetic PAIR (individuals ``i`` and ``i + N/2``)
meets its own episodes, the two mirrored individuals the same ones (so
their difference, which is what the gradient estimate uses, is not noise of
the start states).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from populora.checks import check_float, check_one_of
from populora.envs.interactor import EnvInteractor
from populora.envs.schedule import training_seeds
from populora.errors import InvalidTypeError, InvalidValueError
from populora.es import EggrollES
from populora.es.config import EggrollConfig
from populora.targets import select_modules

__all__ = ["ES_DEFAULTS", "ES_OPTIMIZERS", "es_fitnesses", "make_es"]

ES_DEFAULTS: dict[str, Any] = {"sigma": 0.3, "lr": 0.05, "fitness_shaping": "centered_rank"}
"""Defaults of ``evolve_with_env(..., algorithm='es')``: noise scale, Adam learning rate, centred ranks."""

ES_OPTIMIZERS = ("adam", "clipup", "sgd")
"""Optimizers ``es_kwargs['optimizer']`` may name (``lr`` is theirs; ``max_speed`` / ``momentum`` for ClipUp)."""


def _named_optimizer(name: str, lr: float, options: dict[str, Any]) -> Any:
    """``params -> Optimizer`` for ``es_kwargs['optimizer']`` given by name; pops ClipUp's options."""
    from populora.optim import ClipUp

    extra = {key: options.pop(key) for key in ("max_speed", "momentum") if key in options}
    if extra and name != "clipup":
        raise InvalidValueError(f"ES options {sorted(extra)} are ClipUp's, but `ES.optimizer` is {name!r}")
    if name == "clipup":
        return lambda params: ClipUp(params, lr=lr, **extra)
    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr)
    return lambda params: torch.optim.Adam(params, lr=lr)


def make_es(
    model: nn.Module,
    pop_size: int,
    low_rank: int,
    seed: int,
    lora_targets: str | re.Pattern[str] | Sequence[str | re.Pattern[str]] | None,
    device: Any,
    es_kwargs: dict[str, Any] | None,
) -> EggrollES:
    """The ES of ``evolve_with_env(..., algorithm='es')``.

    ``es_kwargs`` go to :class:`~populora.EggrollES`; defaults here
    (:data:`ES_DEFAULTS`): ``sigma=0.3``, ``torch.optim.Adam(lr=0.05)``,
    ``fitness_shaping='centered_rank'``. ``optimizer=`` replaces Adam: a name
    of :data:`ES_OPTIMIZERS` (``'clipup'``: :class:`~populora.optim.ClipUp`,
    PGPE's optimiser, with ``lr`` its step size and optional
    ``max_speed`` (default ``2 * lr``) and ``momentum`` (0.9) in
    ``es_kwargs``; ``'adam'``; ``'sgd'``), a ``torch.optim`` optimizer, or
    ``params -> Optimizer``. ``lora_targets`` select the evolved parameters
    (those of the selected modules) in a Population's target forms
    (:func:`populora.targets.select_modules`: any module kind); ``None``
    evolves every parameter of every ``nn.Linear`` / ``nn.Embedding``.
    """
    options = {**ES_DEFAULTS, **(es_kwargs or {})}
    lr = check_float("ES.lr", options.pop("lr"), low=0.0, low_open=True)
    chosen = options.get("optimizer")
    if chosen is None or isinstance(chosen, str):
        name = check_one_of("ES.optimizer", "adam" if chosen is None else chosen, ES_OPTIMIZERS)
        options["optimizer"] = _named_optimizer(name, lr, options)
    elif "max_speed" in options or "momentum" in options:
        raise InvalidValueError(
            "`ES.max_speed` / `ES.momentum` go with optimizer='clipup'; set them on the optimizer you pass instead"
        )
    if lora_targets is not None:
        if "param_filter" in options:
            raise InvalidValueError("give `lora_targets` or es_kwargs['param_filter'], not both")
        names = select_modules(model, lora_targets)  # a Population's target forms, any module kind
        options["param_filter"] = lambda name: any(name.startswith(t + ".") for t in names)
    options.setdefault("seed", seed)
    if device is not None:
        options.setdefault("device", device)
    config_fields = {f.name for f in dataclasses.fields(EggrollConfig)}
    config = EggrollConfig(**{k: options.pop(k) for k in list(options) if k in config_fields})
    try:
        return EggrollES(model, pop_size, options.pop("sigma"), None, low_rank, config, **options)
    except TypeError as error:
        raise InvalidTypeError(f"`es_kwargs` does not fit EggrollES: {error}") from error


def es_fitnesses(
    interactor: EnvInteractor,
    es: EggrollES,
    *,
    seed: int,
    action: Any = None,
    horizon: int | None = None,
    num_episodes: int = 1,
    to_range: Any = None,
    episode_seeding: str = "independent",
) -> Tensor:
    """``(N,)`` fitness of the ES's current generation: each individual's mean return (higher is better).

    Under torch.distributed each rank plays its share of the individuals
    (``es.evaluate``) and the fitnesses are all-gathered. The observation
    normaliser folds in the previous generations' observations first (every
    rank, at the same point).

    Args:
        interactor: the env slots.
        es: the ES (its generation is the one played).
        seed: the run's seed; the generation's eval seed is ``seed + es.generation``.
        action, horizon, num_episodes, to_range: as in :meth:`EnvInteractor.evaluate`.
        episode_seeding: ``'independent'`` (per antithetic pair) or ``'common'``.
    """
    if num_episodes < 1:
        raise InvalidValueError(f"`num_episodes` must be >= 1, got {num_episodes}")
    interactor.advance_obs_stats(es.generation)
    eval_seed = int(seed) + es.generation
    pairs = es.pop_size // 2 if es.antithetic else es.pop_size

    def rollouts(members: Any, individuals: list[int]) -> Tensor:
        ids = list(individuals)
        seeds = training_seeds(eval_seed, [i % pairs for i in ids], num_episodes, episode_seeding)
        returns = interactor.play_episodes(
            members, ids, seeds, action=action, horizon=horizon, to_range=to_range, base_seed=eval_seed, module=es.model
        )
        return returns.mean(dim=1)

    return es.evaluate(rollouts).to(torch.float32)
