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
    pbt = PBT(pop, opt, interval=10, fraction=0.25, lr_multipliers=LRMultipliers(8))
    for step in range(200):
        prompts, replies, ids, rewards = rollouts(pop)              # one routed pop.generate
        adv = advantages(rewards, groups=prompt_keys, method="reinforce++")
        policy_gradient_step_(pop, opt, prompts, replies, ids, adv, lr_multipliers=pbt.lr_multipliers)
        pbt.step(per_individual_mean(rewards, ids))                 # every 10 steps: exploit and explore

Under ``torch.distributed`` every rank holds the same PBT (same seed) and must pass the same fitnesses
(exchange them first, e.g. :func:`populora.distributed.all_gather_values`); the replacement then runs in
lockstep with no communication.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from populora import operators as ops
from populora.checks import check_bool, check_float, check_int, check_seed
from populora.errors import CheckpointError, FitnessError, InvalidTypeError, InvalidValueError
from populora.loops.ratings import Ratings
from populora.operators.selection import SelectionResult
from populora.population.optimizer_rows import OptimizerRows, check_optimizer_state
from populora.population.population import Population
from populora.snapshots import Snapshot
from populora.train.lr import LRMultipliers
from populora.transaction import Attributes, transaction

__all__ = ["PBT", "Replacement"]

_FORMAT = "populora.PBT/1"


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


def _as_list(value: Any, kind: type, name: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, kind):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and all(isinstance(v, kind) for v in value):
        return list(value)
    raise InvalidTypeError(f"`{name}` must be a {kind.__name__} or a sequence of them, got {type(value).__name__}")


class PBT(Snapshot):
    """Exploit and explore every ``interval`` steps (see the module docstring).

    Args:
        population: a :class:`~populora.Population` of ``P >= 2``.
        optimizer: the optimizer(s) over ``population.adapter_parameters()`` whose rows follow the children
            (``None``: none).
        interval: ``k >= 1`` steps between replacements.
        fraction: ``gamma`` in ``(0, 0.5]``: ``max(1, floor(gamma * P))`` bottom individuals are replaced; the
            parents are drawn from the top ``max(that, 2)`` (at most ``P - replaced``).
        ratings: rank by ``ratings.ordinal(name)`` (``mu - 3 sigma``) instead of a fitness moving average;
            children's ratings restart (``Ratings.follow_``: the prior, or per its ``inherit``).
        name: the population's name in ``ratings``.
        decay: the fitness moving average's ``beta`` in ``[0, 1)``: ``avg <- beta * avg + (1 - beta) * f``
            (the first fitness after a birth sets it; ``0``: the last fitness).
        crossover_rate: probability in ``[0, 1]`` that a child is a crossover (needs two top parents).
        crossover, crossover_kwargs: the crossover operator (``Population.crossover_``); fitness-aware types
            get the ranking keys as fitnesses.
        mutation, epsilon, mutation_kwargs: the mutation of a mutated child (``Population.mutate_``).
        optimizer_state: ``"inherit"`` or ``"reset"`` (children's optimizer rows).
        lr_multipliers: per-individual learning-rate multipliers: children inherit their first parent's, then
            :meth:`LRMultipliers.perturb_`.
        perturb_lr: perturb the children's multipliers (PBT's explore); ``False`` only inherits them.
        schedulers: learning-rate scheduler(s) stepped by the caller, held here for checkpoints.
        seed: seeds PBT's own generator (children's kind and parents).

    Attributes:
        steps: completed :meth:`step` calls.
        fitness: ``(P,)`` float64 moving averages (NaN before an individual's first fitness).
        generator: PBT's ``torch.Generator``.

    Checkpoints: :meth:`state_dict` (population without its base model, optimizers, schedulers, multipliers,
    ratings, counters, moving averages, generator) / :meth:`load_state_dict`, ``save`` / ``load``: a loaded
    PBT continues bit for bit.
    """

    _checkpoint_kind = "PBT"

    def __init__(
        self,
        population: Population,
        optimizer: Any = None,
        *,
        interval: int = 10,
        fraction: float = 0.25,
        ratings: Ratings | None = None,
        name: str | None = None,
        decay: float = 0.9,
        crossover_rate: float = 0.5,
        crossover: str = "layer_wise",
        crossover_kwargs: Mapping[str, Any] | None = None,
        mutation: str = "full_gaussian",
        epsilon: float = 0.1,
        mutation_kwargs: Mapping[str, Any] | None = None,
        optimizer_state: str = "inherit",
        lr_multipliers: LRMultipliers | None = None,
        perturb_lr: bool = True,
        schedulers: Any = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(population, Population):
            raise InvalidTypeError(f"`population` must be a populora Population, got {type(population).__name__}")
        if population.pop_size < 2:
            raise InvalidValueError(
                f"PBT needs a population of 2 or more individuals, got pop_size={population.pop_size}"
            )
        self.optimizers = _as_list(optimizer, torch.optim.Optimizer, "optimizer")
        OptimizerRows(self.optimizers, population.adapter_parameters())  # every state can be split by individual
        self.schedulers = _as_list(schedulers, torch.optim.lr_scheduler.LRScheduler, "schedulers")
        self.interval = check_int("interval", interval, low=1)
        self.fraction = check_float("fraction", fraction, low=0.0, high=0.5, low_open=True)
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
        self.decay = check_float("decay", decay, low=0.0, high=1.0, high_open=True)
        self.crossover_rate = check_float("crossover_rate", crossover_rate, low=0.0, high=1.0)
        self.crossover, self.mutation = crossover, mutation
        self.crossover_kwargs, self.mutation_kwargs = dict(crossover_kwargs or {}), dict(mutation_kwargs or {})
        for kind, op, options in (
            ("crossover", crossover, self.crossover_kwargs),
            ("mutation", mutation, self.mutation_kwargs),
        ):
            ops.get_operator(kind, op)
            ops.check_options(kind, op, options)
        self.epsilon = check_float("epsilon", epsilon, low=0.0)
        self.optimizer_state = check_optimizer_state(optimizer_state)
        if lr_multipliers is not None and (
            not isinstance(lr_multipliers, LRMultipliers) or lr_multipliers.pop_size != population.pop_size
        ):
            raise InvalidValueError(f"`lr_multipliers` must be LRMultipliers of pop_size {population.pop_size}")
        self.perturb_lr = check_bool("perturb_lr", perturb_lr)
        self.population, self.ratings, self.name, self.lr_multipliers = population, ratings, name, lr_multipliers
        size = population.pop_size
        self.replaced = max(1, math.floor(self.fraction * size))
        self.seed = check_seed("seed", seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.steps = 0
        self.fitness = torch.full((size,), math.nan, dtype=torch.float64)
        self.counts = torch.zeros(size, dtype=torch.int64)  # fitnesses seen since birth

    # ------------------------------------------------------------------ the loop

    def ready(self) -> bool:
        """Whether the next :meth:`step` replaces (its step count will be a multiple of ``interval``)."""
        return (self.steps + 1) % self.interval == 0

    def step(self, fitnesses: Any = None) -> Replacement | None:
        """Count a training step: fold ``fitnesses`` ``(P,)`` (higher is better) into the moving averages, and
        every ``interval`` steps run :meth:`exploit_and_explore`.

        Returns:
            The :class:`Replacement`, or ``None`` on a step without one.

        Raises:
            FitnessError: bad fitnesses (nothing changed); no fitness yet when ranking by fitness.
            InvalidValueError: fitnesses given while ranking by ``ratings``.
        """
        with transaction(Attributes(self, "fitness", "counts", "steps")):  # a retry is this step again
            if fitnesses is not None:
                if self.ratings is not None:
                    raise InvalidValueError("this PBT ranks by `ratings`: step() takes no fitnesses")
                f = self.population.validate_fitnesses(fitnesses).to("cpu", torch.float64)
                self.fitness = torch.where(self.counts == 0, f, self.decay * self.fitness + (1.0 - self.decay) * f)
                self.counts = self.counts + 1
            self.steps += 1
            if self.steps % self.interval:
                return None
            return self.exploit_and_explore()

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

        ``{'format', 'steps', 'seed', 'generator', 'fitness', 'counts', 'population' (a snapshot),
        'optimizers', 'schedulers', 'lr_multipliers', 'ratings'}``.
        """
        return {
            "format": _FORMAT,
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
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into this PBT (built over a twin population, optimizers and schedulers).

        The population, counters, moving averages, generator, the numbers of optimizers and schedulers and their
        parameter groups are checked before anything is written; what only loading can check (the multipliers'
        values, the ratings' tables, an optimizer's state) is loaded in one transaction: a state that fails
        anywhere changes nothing.

        Raises:
            CheckpointError: another kind of state, a missing or malformed entry, a population that does not
                fit, other numbers of optimizers / schedulers, multipliers or ratings present in one and not
                the other.
        """
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise CheckpointError(f"not a PBT state (expected format {_FORMAT!r})")
        keys = ("steps", "generator", "fitness", "counts", "population", "optimizers", "schedulers")
        missing = [k for k in (*keys, "lr_multipliers", "ratings") if k not in state]
        if missing:
            raise CheckpointError(f"the PBT state lacks {missing}")
        steps = state["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise CheckpointError(f"the PBT state's 'steps' must be an int >= 0, got {steps!r}")
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
            Attributes(self, "fitness", "counts", "steps"),
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
            self.steps = steps

    def __repr__(self) -> str:
        by = f"ratings[{self.name!r}]" if self.ratings is not None else f"fitness (decay {self.decay})"
        return (
            f"PBT(pop_size={self.population.pop_size}, interval={self.interval}, replaced={self.replaced}, "
            f"by={by}, crossover_rate={self.crossover_rate}, steps={self.steps})"
        )
