"""Population-based training (Jaderberg et al. 2017) on a population's adapters, the paper's replacement rule.

Every individual trains at every step (the caller's gradient step); every ``interval`` steps
:meth:`PBT.step` ranks the individuals by a key (a moving average of the fitnesses it was given, or with
``ratings=`` the conservative rating ``mu - 3 sigma``) and replaces the bottom ``fraction`` by children of
the top: each child is, with probability ``crossover_rate``, a crossover of two distinct top-ranked parents,
else a mutation of one top-ranked parent (PopuLoRA: gamma = 0.25, k = 10, rate 0.5). Children take their
first parent's optimizer rows (``optimizer_state="inherit"``) or zeros (``"reset"``), their first parent's
learning-rate multiplier perturbed (``lr_multipliers=``, PBT's explore), and restart their rating (and
moving average). Survivors are untouched.

The loop, in ten lines::

    pop = Population(model, 8, 16, lora_targets, init_scale=0, requires_grad=True)
    opt = torch.optim.Adam(pop.adapter_parameters(), lr=1e-4)
    pbt = PBT(pop, opt, PBTConfig(interval=10, fraction=0.25), lr_multipliers=LRMultipliers(8))
    for step in range(200):
        prompts, replies, ids, rewards = rollouts(pop)              # one routed pop.generate
        adv = advantages(rewards, groups=prompt_keys, method="reinforce++")
        policy_gradient_step_(pop, opt, prompts, replies, ids, adv, lr_multipliers=pbt.lr_multipliers)
        pbt.step(per_individual_mean(rewards, ids))                 # every 10 steps: exploit and explore

or, with the training step as ``train=`` (``train(pbt)`` trains every individual once and returns the
``(P,)`` fitnesses), the loop surface every loop has: ``pbt.run(200, callback=log)``, ``pbt.history`` (one
:class:`PBTRecord` per step), ``pbt.save(path)`` / ``pbt.load(path)``.

Under ``torch.distributed`` every rank holds the same PBT (same seed) and must pass the same fitnesses
(exchange them first, e.g. :func:`populora.distributed.all_gather_values`); the replacement then runs in
lockstep with no communication.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from populora import distributed as pd
from populora import operators as ops
from populora.checks import check_bool, check_float, check_int, check_one_of, check_seed, is_real
from populora.config import Config, config_from_legacy
from populora.errors import CheckpointError, FitnessError, InvalidTypeError, InvalidValueError
from populora.loops.base import Budget, load_state, run_steps, save_state
from populora.loops.ratings import Ratings
from populora.operators.selection import SelectionResult
from populora.population.optimizer_rows import OPTIMIZER_STATES, OptimizerRows
from populora.population.population import Population
from populora.snapshots import Snapshot
from populora.train.lr import LRMultipliers
from populora.transaction import Attributes, transaction

__all__ = ["PBT", "PBTConfig", "PBTRecord", "Replacement"]

_FORMAT = "populora.PBT/2"
_FORMAT_050 = "populora.PBT/1"  # 0.5.0's files: no config, no history


@dataclass(frozen=True)
class PBTConfig(Config):
    """The hyperparameters of :class:`PBT`, checked when built (a bad field is named), stored in its checkpoints.

    Attributes:
        interval: ``k >= 1`` steps between replacements.
        fraction: ``gamma`` in ``(0, 0.5]``: ``max(1, floor(gamma * P))`` bottom individuals are replaced; the
            parents are drawn from the top ``max(that, 2)`` (at most ``P - replaced``).
        decay: the fitness moving average's ``beta`` in ``[0, 1)``: ``avg <- beta * avg + (1 - beta) * f``
            (the first fitness after a birth sets it; ``0``: the last fitness).
        crossover_rate: probability in ``[0, 1]`` that a child is a crossover (needs two top parents).
        crossover, crossover_kwargs: the crossover operator (``Population.crossover_``) and its own options
            (checked key by key against the registered operator); fitness-aware types get the ranking keys
            as fitnesses.
        mutation, epsilon, mutation_kwargs: the mutation of a mutated child (``Population.mutate_``).
        optimizer_state: ``"inherit"`` or ``"reset"`` (children's optimizer rows).
        perturb_lr: perturb the children's learning-rate multipliers (PBT's explore); ``False`` only
            inherits them.
        seed: seeds PBT's own generator (children's kind and parents). A checkpoint restores the generator
            itself, so a resume may be built with another seed.

    Example:
        >>> PBTConfig(interval=5).fraction
        0.25
        >>> PBTConfig(fraction=0.75)
        Traceback (most recent call last):
        ...
        populora.errors.InvalidValueError: `PBTConfig.fraction` must be a finite number in (0.0, 0.5], got 0.75
    """

    interval: int = 10
    fraction: float = 0.25
    decay: float = 0.9
    crossover_rate: float = 0.5
    crossover: str = "layer_wise"
    crossover_kwargs: Mapping[str, Any] = field(default_factory=dict)
    mutation: str = "full_gaussian"
    epsilon: float = 0.1
    mutation_kwargs: Mapping[str, Any] = field(default_factory=dict)
    optimizer_state: str = "inherit"
    perturb_lr: bool = True
    seed: int = 0

    def __post_init__(self) -> None:  # each field stored as checked: JSON-safe, one type per field
        checked: dict[str, Any] = {
            "interval": check_int("PBTConfig.interval", self.interval, low=1),
            "fraction": check_float("PBTConfig.fraction", self.fraction, low=0.0, high=0.5, low_open=True),
            "decay": check_float("PBTConfig.decay", self.decay, low=0.0, high=1.0, high_open=True),
            "crossover_rate": check_float("PBTConfig.crossover_rate", self.crossover_rate, low=0.0, high=1.0),
            "epsilon": check_float("PBTConfig.epsilon", self.epsilon, low=0.0),
            "optimizer_state": check_one_of("PBTConfig.optimizer_state", self.optimizer_state, OPTIMIZER_STATES),
            "perturb_lr": check_bool("PBTConfig.perturb_lr", self.perturb_lr),
            "seed": check_seed("PBTConfig.seed", self.seed),
        }
        for kind in ("crossover", "mutation"):
            op, options = getattr(self, kind), getattr(self, f"{kind}_kwargs")
            if options is None:  # (0.5.0's default)
                options = {}
            if not isinstance(options, Mapping):
                raise InvalidTypeError(
                    f"`PBTConfig.{kind}_kwargs` must be a dict of the {kind}'s options, got {type(options).__name__}"
                )
            if not isinstance(op, str):
                raise InvalidTypeError(f"`PBTConfig.{kind}` must be a registered {kind}'s name, got {op!r:.60}")
            field_name = kind
            try:  # the registered name, then the operator's own options, key by key
                ops.get_operator(kind, op)
                field_name = f"{kind}_kwargs"
                ops.check_options(kind, op, options)
            except (InvalidTypeError, InvalidValueError) as error:
                raise type(error)(f"`PBTConfig.{field_name}`: {error}") from None
            checked[f"{kind}_kwargs"] = dict(options)
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        self.to_dict()  # an option without a JSON form is refused here, not when the first checkpoint is written


@dataclass(frozen=True)
class PBTRecord:
    """One :meth:`PBT.step` (an entry of ``PBT.history``).

    Attributes:
        step: the step count after it (``1`` for the first step: the count :class:`Replacement` has).
        replaced: children written this step (0 on a step without a replacement).
        crossovers: how many of them are crossovers.
        key_best / key_mean / key_worst: the ranking keys after the step (the fitness moving averages, or the
            ratings' ``mu - 3 sigma``); ``None`` while an individual has no fitness yet.
    """

    step: int
    replaced: int
    crossovers: int
    key_best: float | None
    key_mean: float | None
    key_worst: float | None

    def as_dict(self) -> dict[str, Any]:
        """``{field: number}`` (a key statistic may be ``None``): one line of logging."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: Any) -> PBTRecord:
        """A record from :meth:`as_dict` (every field checked; a checkpoint's history is read with it)."""
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(d, Mapping) or sorted(d) != sorted(names):
            raise InvalidValueError(f"a PBT history entry must be a dict with the keys {names}, got {d!r:.120}")
        counts = [check_int(n, d[n], low=0) for n in ("step", "replaced", "crossovers")]
        keys: list[float | None] = []
        for n in ("key_best", "key_mean", "key_worst"):
            if d[n] is not None and not is_real(d[n]):
                raise InvalidValueError(f"a PBT history entry's {n!r} must be a number or None, got {d[n]!r:.60}")
            keys.append(None if d[n] is None else float(d[n]))
        return cls(*counts, *keys)


class Replacement(NamedTuple):
    """One exploit-and-explore of :class:`PBT`.

    Attributes:
        step: the step count at which it happened.
        children: ``(c,)`` int64 slots replaced (the bottom of the ranking), ascending.
        parents: ``(c, 2)`` int64: a crossover child's two parents, a mutated child's parent twice.
        crossed: ``(c,)`` bool, which children are crossovers.
        keys: ``(P,)`` float64, the ranking keys used.
    """

    step: int
    children: Tensor
    parents: Tensor
    crossed: Tensor
    keys: Tensor

    def as_dict(self) -> dict[str, float]:
        """The replacement's numbers, ``{name: number}``: ``step``, ``replaced`` (children), ``crossovers``, and
        ``key_best`` / ``key_mean`` / ``key_worst`` of the ranking keys.

        Numbers only, so logging is one line: ``writer.add_scalars("pbt", replacement.as_dict(), step)``.
        """
        keys = self.keys.double()
        return {
            "step": int(self.step),
            "replaced": int(self.children.numel()),
            "crossovers": int(self.crossed.sum()),
            "key_best": float(keys.max()),
            "key_mean": float(keys.mean()),
            "key_worst": float(keys.min()),
        }


def _checked_history(rows: Any, steps: int) -> list[PBTRecord]:
    """A state's ``history`` as records: consecutive step counts ending at ``steps`` (a run resumed from a
    0.5.0 file has none before it)."""
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)):
        raise CheckpointError(f"the PBT state's 'history' must be a list of PBTRecord dicts, got {type(rows).__name__}")
    try:
        history = [PBTRecord.from_dict(r) for r in rows]
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"the PBT state's 'history' is malformed: {error}") from None
    if [r.step for r in history] != list(range(steps - len(history) + 1, steps + 1)):
        raise CheckpointError(
            f"the PBT state's 'history' must hold the step counts up to its 'steps' ({steps}), one per step, "
            f"got {[r.step for r in history][:8]}"
        )
    return history


def _as_list(value: Any, kind: type, name: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, kind):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and all(isinstance(v, kind) for v in value):
        return list(value)
    raise InvalidTypeError(f"`{name}` must be a {kind.__name__} or a sequence of them, got {type(value).__name__}")


class PBT(Snapshot):
    """Exploit and explore every ``config.interval`` steps (see the module docstring).

    Args:
        population: a :class:`~populora.Population` of ``P >= 2``.
        optimizer: the optimizer(s) over ``population.adapter_parameters()`` whose rows follow the children
            (``None``: none).
        config: the hyperparameters, a :class:`PBTConfig` (``None``: its defaults).
        ratings: rank by ``ratings.ordinal(name)`` (``mu - 3 sigma``) instead of a fitness moving average;
            children's ratings restart (``Ratings.follow_``: the prior, or per its ``inherit``).
        name: the population's name in ``ratings``.
        lr_multipliers: per-individual learning-rate multipliers: children inherit their first parent's, then
            :meth:`LRMultipliers.perturb_` (``config.perturb_lr``).
        schedulers: learning-rate scheduler(s) stepped by the caller (or by ``train``), held here for
            checkpoints.
        train: the training step, ``train(pbt)``: trains every individual one step and returns the ``(P,)``
            fitnesses (``None`` when ranking by ``ratings``, which it updated). With it, :meth:`step` takes no
            fitnesses and :meth:`run` runs the loop; without it, the caller trains and passes
            ``step(fitnesses)``.
        legacy: 0.5.0's flat keywords (``interval=10, fraction=0.25, ...``): deprecated, applied over
            ``config`` with a ``DeprecationWarning``; they go in 0.7.0.

    Attributes:
        config: the :class:`PBTConfig` (its fields are also read-only attributes: ``pbt.interval``, ...).
        steps: completed :meth:`step` calls.
        history: one :class:`PBTRecord` per step.
        fitness: ``(P,)`` float64 moving averages (NaN before an individual's first fitness).
        generator: PBT's ``torch.Generator``.

    Checkpoints: :meth:`state_dict` (the config, population without its base model, optimizers, schedulers,
    multipliers, ratings, counters, moving averages, generator, history) / :meth:`load_state_dict`, ``save``
    / ``load``: a loaded PBT continues bit for bit; a state written with another config is refused, naming
    the field (the seed aside: the generator itself is restored). 0.5.0's files load too.
    """

    _checkpoint_kind = "PBT"

    def __init__(
        self,
        population: Population,
        optimizer: Any = None,
        config: PBTConfig | None = None,
        *,
        ratings: Ratings | None = None,
        name: str | None = None,
        lr_multipliers: LRMultipliers | None = None,
        schedulers: Any = None,
        train: Callable[[PBT], Any] | None = None,
        **legacy: Any,
    ) -> None:
        self.config = config_from_legacy(PBTConfig, config, legacy, where="PBT")
        if not isinstance(population, Population):
            raise InvalidTypeError(f"`population` must be a populora Population, got {type(population).__name__}")
        if population.pop_size < 2:
            raise InvalidValueError(
                f"PBT needs a population of 2 or more individuals, got pop_size={population.pop_size}"
            )
        if isinstance(optimizer, PBTConfig):
            raise InvalidTypeError(
                "`optimizer` is a PBTConfig: pass it as `config=` (PBT(population, optimizer, config))"
            )
        self.optimizers = _as_list(optimizer, torch.optim.Optimizer, "optimizer")
        OptimizerRows(self.optimizers, population.adapter_parameters())  # every state can be split by individual
        self.schedulers = _as_list(schedulers, torch.optim.lr_scheduler.LRScheduler, "schedulers")
        if ratings is not None:
            if not isinstance(ratings, Ratings):
                raise InvalidTypeError(f"`ratings` must be a populora Ratings, got {type(ratings).__name__}")
            if not isinstance(name, str) or name not in ratings.sizes:
                raise InvalidValueError(
                    f"`name` must be one of the rated populations {list(ratings.sizes)}, got {name!r}"
                )
            if ratings.sizes[name] != population.pop_size:
                raise InvalidValueError(
                    f"`ratings` rates {ratings.sizes[name]} players of {name!r}, the population has "
                    f"{population.pop_size}"
                )
        elif name is not None:
            raise InvalidValueError("`name` names the population in `ratings`: pass `ratings=` too")
        if lr_multipliers is not None and (
            not isinstance(lr_multipliers, LRMultipliers) or lr_multipliers.pop_size != population.pop_size
        ):
            raise InvalidValueError(f"`lr_multipliers` must be LRMultipliers of pop_size {population.pop_size}")
        if train is not None and not callable(train):
            raise InvalidTypeError(f"`train` must be callable as train(pbt) -> fitnesses, got {train!r:.80}")
        self.population, self.ratings, self.name, self.lr_multipliers = population, ratings, name, lr_multipliers
        self.train = train
        size = population.pop_size
        self.replaced = max(1, math.floor(self.config.fraction * size))
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.steps = 0
        self.history: list[PBTRecord] = []
        self.fitness = torch.full((size,), math.nan, dtype=torch.float64)
        self.counts = torch.zeros(size, dtype=torch.int64)  # fitnesses seen since birth

    # the config's fields, read-only (0.5.0's attributes)
    interval = property(lambda self: self.config.interval)
    fraction = property(lambda self: self.config.fraction)
    decay = property(lambda self: self.config.decay)
    crossover_rate = property(lambda self: self.config.crossover_rate)
    crossover = property(lambda self: self.config.crossover)
    crossover_kwargs = property(lambda self: self.config.crossover_kwargs)
    mutation = property(lambda self: self.config.mutation)
    epsilon = property(lambda self: self.config.epsilon)
    mutation_kwargs = property(lambda self: self.config.mutation_kwargs)
    optimizer_state = property(lambda self: self.config.optimizer_state)
    perturb_lr = property(lambda self: self.config.perturb_lr)
    seed = property(lambda self: self.config.seed)

    # ------------------------------------------------------------------ the loop

    def ready(self) -> bool:
        """Whether the next :meth:`step` replaces (its step count will be a multiple of ``interval``)."""
        return (self.steps + 1) % self.interval == 0

    def step(self, fitnesses: Any = None) -> Replacement | None:
        """One step, all or nothing: with ``train=``, ``train(self)`` (one training step of every individual,
        giving the fitnesses); fold the fitnesses ``(P,)`` (higher is better) into the moving averages; every
        ``interval`` steps run :meth:`exploit_and_explore`; append the step's :class:`PBTRecord` to
        :attr:`history`.

        If anything raises (``train`` included), the PBT and everything it holds (population, optimizers,
        schedulers, multipliers, ratings, generator, counters, history) are as before: a retry is this step
        again. (Without ``train=`` the caller's training step is the caller's to undo.)

        Returns:
            The :class:`Replacement`, or ``None`` on a step without one.

        Raises:
            FitnessError: bad fitnesses (nothing changed); no fitness yet when ranking by fitness.
            InvalidValueError: fitnesses given while ranking by ``ratings``, or given to a PBT that trains
                through ``train=``.
        """
        counters = Attributes(self, "fitness", "counts", "steps", "history")
        if self.train is None:
            with transaction(counters):  # exploit_and_explore is a transaction of its own
                return self._step(fitnesses)
        if fitnesses is not None:
            raise InvalidValueError("this PBT trains through `train=`: step() takes no fitnesses (train returns them)")
        held = [o for o in (self.lr_multipliers, self.ratings) if o is not None]
        with transaction(self.population, *self.optimizers, *self.schedulers, *held, self.generator, counters):
            return self._step(self.train(self))

    def _step(self, fitnesses: Any) -> Replacement | None:
        if fitnesses is not None:
            if self.ratings is not None:
                raise InvalidValueError("this PBT ranks by `ratings`: step() takes no fitnesses")
            f = self.population.validate_fitnesses(fitnesses).to("cpu", torch.float64)
            self.fitness = torch.where(self.counts == 0, f, self.decay * self.fitness + (1.0 - self.decay) * f)
            self.counts = self.counts + 1
        self.steps += 1
        result = None if self.steps % self.interval else self.exploit_and_explore()
        self.history.append(self._record(result))
        return result

    def _record(self, result: Replacement | None) -> PBTRecord:
        keys = result.keys if result is not None else self._keys_if_known()
        stats: list[float | None] = [None, None, None]
        if keys is not None:
            keys = keys.double()
            stats = [float(keys.max()), float(keys.mean()), float(keys.min())]
        replaced = 0 if result is None else int(result.children.numel())
        crossovers = 0 if result is None else int(result.crossed.sum())
        return PBTRecord(self.steps, replaced, crossovers, *stats)

    def _keys_if_known(self) -> Tensor | None:
        if self.ratings is None and bool(torch.isnan(self.fitness).any()):
            return None
        return self.keys()

    def run(
        self,
        budget: int | Budget | None = None,
        *,
        callback: Callable[[PBTRecord], Any] | None = None,
        progress: bool = False,
    ) -> list[PBTRecord]:
        """:meth:`step` until ``budget`` is spent (an int: steps; a :class:`~populora.loops.base.Budget`: steps
        and / or seconds, whichever comes first; at least one step runs) or ``callback`` says stop.

        Args:
            budget: steps (int) or a ``Budget(max_steps=, max_seconds=)``.
            callback: ``callback(record)`` after every step; ``None`` / ``False`` continue, ``True`` stops,
                anything else raises ``InvalidTypeError`` naming the callback and the value.
            progress: a tqdm bar (main rank) over the budget closest to running out.

        Returns:
            The records of this call's steps (also appended to :attr:`history`).

        Raises:
            InvalidValueError: no ``train=`` was given (the loop cannot get fitnesses itself: call
                ``step(fitnesses)`` after your own training step), or no budget.
        """
        if self.train is None:
            raise InvalidValueError(
                "PBT.run needs the training step: build the PBT with train=fn (fn(pbt) trains every individual "
                "one step and returns the (P,) fitnesses), or call pbt.step(fitnesses) after your own training step"
            )
        distributed = pd.is_distributed()
        return run_steps(
            self.step,
            lambda: self.history,
            budget,
            callback,
            progress,
            where="PBT.run",
            desc="PBT",
            postfix=lambda r: {} if r.key_best is None else {"best": f"{r.key_best:.3g}", "mean": f"{r.key_mean:.3g}"},
            main_rank=pd.is_main_rank(),
            sync_seconds=(lambda s: float(pd.broadcast_object(s))) if distributed else None,
        )

    def keys(self) -> Tensor:
        """``(P,)`` float64 ranking keys: the ratings' ``mu - 3 sigma``, or the fitness moving averages."""
        if self.ratings is not None:
            assert self.name is not None  # given with the ratings
            return self.ratings.ordinal(self.name).to(torch.float64)
        if bool(torch.isnan(self.fitness).any()):
            missing = torch.isnan(self.fitness).nonzero().flatten().tolist()
            raise FitnessError(f"PBT ranks by the fitness moving average: individuals {missing} have no fitness yet")
        return self.fitness.clone()

    def exploit_and_explore(self) -> Replacement:
        """Replace the bottom of the ranking by children of the top, now (all or nothing).

        Ranking: keys descending, ties to the lower id. Child ``j`` (bottom slots, ascending) draws from PBT's
        generator whether it is a crossover (probability ``crossover_rate``, two distinct parents of the top
        pool) or a mutated copy (one parent). If anything raises, the population, optimizer rows, ratings,
        multipliers, moving averages and generator are as before.
        """
        size = self.population.pop_size
        keys = self.keys()
        order = torch.sort(keys, descending=True, stable=True).indices
        children = order[size - self.replaced :].sort().values
        pool = order[: min(max(self.replaced, 2), size - self.replaced)]
        with transaction(self.generator):  # a failed replacement draws the same children again
            draws = torch.rand(children.numel(), generator=self.generator, dtype=torch.float64)
            crossed = (draws < self.crossover_rate) & (pool.numel() >= 2)
            parents = torch.empty(children.numel(), 2, dtype=torch.int64)
            for j in range(children.numel()):
                if crossed[j]:
                    parents[j] = pool[torch.randperm(pool.numel(), generator=self.generator)[:2]]
                else:
                    parents[j] = pool[torch.randint(pool.numel(), (1,), generator=self.generator)].repeat(2)
            rows = OptimizerRows(self.optimizers, self.population.adapter_parameters()).at(children)
            held = [o for o in (self.ratings, self.lr_multipliers) if o is not None]
            with transaction(self.population, rows, *held, Attributes(self, "fitness", "counts")):
                self._replace(children, parents, crossed, keys)
        return Replacement(self.steps, children, parents, crossed, keys)

    def _replace(self, children: Tensor, parents: Tensor, crossed: Tensor, keys: Tensor) -> None:
        pop, opts = self.population, self.optimizers or None
        copies = children[~crossed]
        if copies.numel():  # a copy (the average of a parent with itself is the parent, exactly), then mutated
            pop.crossover_("average", parents[~crossed], copies, optimizer=opts, optimizer_state=self.optimizer_state)
            pop.mutate_(self.mutation, individuals=copies, epsilon=self.epsilon, **self.mutation_kwargs)
        if bool(crossed.any()):
            pop.crossover_(
                self.crossover,
                parents[crossed],
                children[crossed],
                fitnesses=keys,
                optimizer=opts,
                optimizer_state=self.optimizer_state,
                **self.crossover_kwargs,
            )
        if self.lr_multipliers is not None:
            self.lr_multipliers.inherit_(children, parents[:, 0])
            if self.perturb_lr:
                self.lr_multipliers.perturb_(children)
        if self.ratings is not None:
            survivors = torch.tensor(sorted(set(range(pop.pop_size)) - set(children.tolist())), dtype=torch.int64)
            assert self.name is not None  # given with the ratings
            self.ratings.follow_(self.name, SelectionResult(survivors, children, torch.zeros(0, dtype=torch.int64)))
        self.fitness[children] = self.fitness[parents[:, 0]]  # ranked like the parent until its own fitness
        self.counts[children] = 0

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs but the base model (copies, CPU tensors for the population).

        ``{'format', 'config', 'steps', 'seed', 'generator', 'fitness', 'counts', 'population' (a snapshot),
        'optimizers', 'schedulers', 'lr_multipliers', 'ratings', 'history'}``.
        """
        return {
            "format": _FORMAT,
            "config": self.config.to_dict(),
            "steps": self.steps,
            "seed": self.seed,
            "generator": self.generator.get_state().clone(),
            "fitness": self.fitness.clone(),
            "counts": self.counts.clone(),
            "population": self.population.snapshot("cpu"),
            "optimizers": [copy.deepcopy(o.state_dict()) for o in self.optimizers],
            "schedulers": [copy.deepcopy(s.state_dict()) for s in self.schedulers],
            "lr_multipliers": self.lr_multipliers.state_dict() if self.lr_multipliers is not None else None,
            "ratings": self.ratings.state_dict() if self.ratings is not None else None,
            "history": [r.as_dict() for r in self.history],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into this PBT (built over a twin population, optimizers and schedulers, with
        the same config), or a state of 0.5.0's PBT (no config, no history: the history starts empty).

        The config (field by field, the seed aside), the history, the population, counters, moving averages,
        generator, the numbers of optimizers and schedulers and their parameter groups are checked before anything
        is written; what only loading can check (the multipliers' values, the ratings' tables, an optimizer's
        state) is loaded in one transaction: a state that fails anywhere changes nothing.

        Raises:
            CheckpointError: another kind of state, a state written with another config (the field is named),
                a missing or malformed entry, a population that does not fit, other numbers of optimizers /
                schedulers, multipliers or ratings present in one and not the other.
        """
        fmt = state.get("format") if isinstance(state, Mapping) else None
        if fmt not in (_FORMAT, _FORMAT_050):
            raise CheckpointError(f"not a PBT state (expected format {_FORMAT!r}, or 0.5.0's {_FORMAT_050!r})")
        keys = ("steps", "generator", "fitness", "counts", "population", "optimizers", "schedulers")
        new = ("config", "history") if fmt == _FORMAT else ()
        missing = [k for k in (*keys, "lr_multipliers", "ratings", *new) if k not in state]
        if missing:
            raise CheckpointError(f"the PBT state lacks {missing}")
        if fmt == _FORMAT:  # (the seed only seeded the generator the state restores)
            self.config.check_matches(state["config"], "the PBT state", ignore=("seed",))
        steps = state["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise CheckpointError(f"the PBT state's 'steps' must be an int >= 0, got {steps!r}")
        history = _checked_history(state.get("history", []), steps)
        size = self.population.pop_size
        fitness, counts = state["fitness"], state["counts"]
        if not (isinstance(fitness, Tensor) and fitness.dtype == torch.float64 and fitness.shape == (size,)):
            raise CheckpointError(f"the PBT state's 'fitness' must be a ({size},) float64 tensor")
        if not (isinstance(counts, Tensor) and counts.dtype == torch.int64 and counts.shape == (size,)):
            raise CheckpointError(f"the PBT state's 'counts' must be a ({size},) int64 tensor")
        probe = torch.Generator()
        try:
            probe.set_state(state["generator"])
        except (TypeError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"the PBT state's 'generator' is not a generator state: {err}") from None
        for key, mine in (("optimizers", self.optimizers), ("schedulers", self.schedulers)):
            if not isinstance(state[key], Sequence) or len(state[key]) != len(mine):
                got = len(state[key]) if isinstance(state[key], Sequence) else type(state[key]).__name__
                raise CheckpointError(f"the PBT state holds {got} {key}, this PBT has {len(mine)}")
        for key, have in (("lr_multipliers", self.lr_multipliers), ("ratings", self.ratings)):
            if (state[key] is None) != (have is None):
                raise CheckpointError(
                    f"the PBT state {'lacks' if state[key] is None else 'has'} {key!r}, this PBT "
                    f"{'has' if have is not None else 'has none'}"
                )
        for i, (opt, opt_state) in enumerate(zip(self.optimizers, state["optimizers"])):
            groups = opt_state.get("param_groups") if isinstance(opt_state, Mapping) else None
            mine = [len(g["params"]) for g in opt.param_groups]
            theirs = [len(g.get("params", ())) for g in groups] if isinstance(groups, Sequence) else None
            if theirs != mine:
                raise CheckpointError(
                    f"the PBT state's optimizer {i} has parameter groups of sizes {theirs}, this PBT's {mine}"
                )
            # torch loads per-parameter state of any shape (and fails only at the next step): check it here
            per_param = opt_state.get("state", {})
            ids = [j for g in groups or () for j in g["params"]]
            params = [q for g in opt.param_groups for q in g["params"]]
            for j, param in zip(ids, params):
                for name, value in (per_param.get(j) or {}).items():
                    if isinstance(value, Tensor) and value.dim() > 0 and value.shape != param.shape:
                        raise CheckpointError(
                            f"the PBT state's optimizer {i} holds {name!r} of shape {tuple(value.shape)} for a "
                            f"parameter of shape {tuple(param.shape)}"
                        )
        checked = self.population.check_state_dict(state["population"])
        held = [o for o in (self.lr_multipliers, self.ratings) if o is not None]
        # what only torch or the parts themselves can check (an optimizer's per-parameter state, the
        # multipliers' values, the ratings' tables) is checked by loading: all or nothing, by the transaction
        with transaction(
            *self.optimizers,
            *self.schedulers,
            *held,
            self.population,
            self.generator,
            Attributes(self, "fitness", "counts", "steps", "history"),
        ):
            try:
                for opt, opt_state in zip(self.optimizers, state["optimizers"]):
                    opt.load_state_dict(copy.deepcopy(opt_state))
                for sched, sched_state in zip(self.schedulers, state["schedulers"]):
                    sched.load_state_dict(copy.deepcopy(sched_state))
            except (KeyError, TypeError, ValueError, RuntimeError) as err:
                raise CheckpointError(f"the PBT state's optimizers or schedulers do not fit this PBT's: {err}") from err
            if self.lr_multipliers is not None:
                self.lr_multipliers.load_state_dict(state["lr_multipliers"])
            if self.ratings is not None:
                self.ratings.load_state_dict(state["ratings"])
            self.population.load_checked_state_dict(checked)
            self.generator.set_state(probe.get_state())
            self.fitness, self.counts = fitness.clone(), counts.clone()
            self.steps, self.history = steps, history

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state_dict` atomically (temp file + rename); returns the ``Path`` written."""
        return save_state(self, path, self._checkpoint_kind)

    def load(self, path: str | Path) -> None:
        """Restore what :meth:`save` wrote (or 0.5.0's PBT file): all or nothing (the file is named in an error)."""
        load_state(self, path, self._checkpoint_kind)

    def __repr__(self) -> str:
        by = f"ratings[{self.name!r}]" if self.ratings is not None else f"fitness (decay {self.decay})"
        return (
            f"PBT(pop_size={self.population.pop_size}, interval={self.interval}, replaced={self.replaced}, "
            f"by={by}, crossover_rate={self.crossover_rate}, steps={self.steps})"
        )
