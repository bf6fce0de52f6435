"""The genetic algorithm on a population's stacks: fitness check, selection, variation, ``evolve_``.

:class:`Evolvable` holds the methods :class:`~populora.Population` inherits
for it (``validate_fitnesses``, ``select``, ``select_parents``,
``crossover_``, ``mutate_``, ``evolve_``, ``evaluate_distributed``,
``sync_from_main_rank_``). The maths is in :mod:`populora.operators`
(:func:`~populora.operators.selection.select_survivors`,
:func:`~populora.operators.parents.parents_for_slots`, the registries); here
are the checks at the boundary (the fitness vector is validated once, by
:func:`populora.fitness.validate_fitnesses`, and the operators trust it), the
writes into the stacks and the all-or-nothing rollback. Higher fitness is
better, everywhere.

A model spread over devices (``device_map="auto"``) keeps each target's
stacks on that target's device; ids, fitnesses and the generator stay on the
population's device, and every read or write of a target's rows takes the
ids on that target's device (:class:`~populora.operators.devices.PerDevice`,
one copy per device and call; none on a single device, where results are
bit for bit as before).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from populora import fitness as _fitness
from populora import operators as ops
from populora.adapters import Factors
from populora.checks import check_int
from populora.distributed import broadcast_object, broadcast_tensors_, is_distributed, sync_if_different_
from populora.errors import InvalidValueError
from populora.operators.devices import PerDevice
from populora.operators.selection import SelectionResult
from populora.population.evolution import Evolution, resolve_config
from populora.population.host import HostBase
from populora.population.optimizer_rows import OptimizerRows, check_optimizer_state
from populora.stats import GenerationStats
from populora.transaction import transaction

__all__ = ["Evolvable"]


class Evolvable(HostBase):
    """The genetic-algorithm methods of :class:`~populora.Population` (a mixin, not used alone).

    The host provides ``pop_size``, ``nan_policy``, ``device``, ``generator``,
    ``generation``, ``eval_seed``, ``history``, ``weight_scales``,
    ``factors()`` / ``_full_factors()`` (views of its stacks), ``_ids()``,
    ``_check_id()`` and ``_check_alive()``.
    """

    # ------------------------------------------------------------------ fitness

    def validate_fitnesses(self, fitnesses: Any) -> Tensor:
        """Fitnesses as a ``(P,)`` float tensor on the population's device (higher is better), in their precision.

        The one check of a fitness vector (:func:`populora.fitness.validate_fitnesses`
        with this population's size, ``nan_policy`` and device): ``evolve_``,
        ``select``, ``select_parents``, ``crossover_`` and
        ``select_and_merge_best_`` call it once and the operators trust the
        result. A list, tuple or NumPy array is converted; float64 input (and
        Python floats, integers) stays float64, float32 / float16 / bfloat16
        give float32, booleans are refused. NaN (and -inf) raise unless
        ``nan_policy='worst'``, which maps them below the lowest finite
        fitness; +inf always raises.

        Raises:
            FitnessError: not numbers (the type is named), wrong shape (both
                shapes named), non-finite values.
        """
        return _fitness.validate_fitnesses(fitnesses, self.pop_size, nan_policy=self.nan_policy, device=self.device)

    # ------------------------------------------------------------------ evaluation

    def sync_from_main_rank_(self, sync_base_model: bool = False, *, name: str | None = None) -> None:
        """Make every rank hold rank 0's population (once; a no-op without torch.distributed).

        The adapters, generator state, generation, eval seed, weight scales and
        history come from rank 0; the base model is compared by checksum and,
        where ranks differ (e.g. each process seeded differently), rank 0's
        weights are broadcast with a warning (``sync_base_model=True``
        broadcasts it unchecked); ``name`` labels the population in warnings
        and errors. ``evaluate_distributed`` calls it, and the layers built on it.
        """
        self._check_alive()
        if self._synced or not is_distributed():
            return
        of = f" of population {name!r}" if name else ""
        with torch.no_grad():
            broadcast_tensors_(
                self.adapter_parameters(),
                what=f"adapters{of} (pop_size, low_rank and lora_targets must match on every rank)",
            )
            base = [*self.model.parameters(), *self.model.buffers()]
            if sync_base_model:
                broadcast_tensors_(base, what=f"base model parameters{of}")
            else:
                sync_if_different_(base, f"base model parameters{of}")
        # weight scales come from the base weights at construction: rank 0's, like the weights
        history: list[tuple[Any, ...]] = [tuple(h) for h in self.history]  # GenerationStats' fields
        state = broadcast_object(
            (self.generation, self.eval_seed, self.generator.get_state(), self.weight_scales, history)
        )
        # annotated: mypy reads an assignment in a subclass of the PopulationHost protocol as a new
        # definition, whose type the reads above would otherwise wait for (a "Cannot determine type" cycle)
        self.generation: int = state[0]
        self.eval_seed: int = state[1]
        self.generator.set_state(state[2])
        self.weight_scales: list[float] = list(state[3])
        self.history: list[GenerationStats] = [GenerationStats(*t) for t in state[4]]
        self._synced: bool = True

    def evaluate_distributed(self, fn: Callable[..., Any], sync_base_model: bool = False) -> Tensor:
        """Evaluate every individual, each rank its share of ids; ``(P,)`` fitness on every rank.

        ``fn`` has one of three signatures (see :mod:`populora.fitness`):
        ``fn(population, individuals=ids)``, ``fn(population, idx)`` or
        ``fn(population)`` (run on the main rank, result broadcast). Higher is
        better; NaNs are returned as they are (``evolve_`` applies the NaN
        policy). Works unchanged without torchrun (one rank does everything).
        Before the first evaluation, :meth:`sync_from_main_rank_` makes every
        rank hold rank 0's population (and repairs a differing base model).
        """
        self.sync_from_main_rank_(sync_base_model)
        return _fitness.evaluate(fn, self, self.pop_size).to(self.device)

    # ------------------------------------------------------------------ selection

    def select(
        self,
        selection_type: str = "deterministic",
        fitnesses: Any = None,
        survive_frac: float = 0.5,
        elite_frac: float = 0.1,
        num_groups: int = 1,
        **type_kwargs: Any,
    ) -> SelectionResult:
        """Choose survivors, culled and elites (higher fitness is better).

        Per group (``num_groups`` contiguous equal islands of ``m = P/G``):
        ``S = max(1, floor(m * survive_frac))`` survivors, of which the top
        ``E = floor(m * elite_frac)`` (at least 1 when ``elite_frac > 0``) are
        elites; the other ``S - E`` are chosen by ``selection_type`` among the
        rest (:func:`populora.operators.selection.select_survivors`). Options
        of the selection type go in ``type_kwargs``.
        """
        self._check_alive()
        _need_two(self, "select")
        fn = ops.get_operator("selection", selection_type)
        ops.check_options("selection", selection_type, type_kwargs)
        f = self.validate_fitnesses(fitnesses)
        return ops.selection.select_survivors(
            f, fn, survive_frac, elite_frac, num_groups, generator=self.generator, **type_kwargs
        )

    def select_parents(
        self,
        selection_type: str = "tournament",
        fitnesses: Any = None,
        num_children: int | None = None,
        culled: Sequence[int] | Tensor | None = None,
        num_parents_per_child: int = 2,
        num_groups: int = 1,
        **type_kwargs: Any,
    ) -> Tensor:
        """Draw parents among the survivors (everyone not in ``culled``).

        Returns ``(num_children, num_parents_per_child)`` int64 population
        ids, fittest parent first for tournament-style types. With islands
        (``num_groups > 1``), child ``j`` replaces ``culled[j]`` and its
        parents come from that slot's island
        (:func:`populora.operators.parents.parents_for_slots`).
        """
        self._check_alive()
        _need_two(self, "select_parents")
        fn = ops.get_operator("parent_selection", selection_type)
        ops.check_options("parent_selection", selection_type, type_kwargs)
        f = self.validate_fitnesses(fitnesses)
        check_int("num_parents_per_child", num_parents_per_child, low=1)
        return self._select_parents(fn, f, num_children, culled, num_parents_per_child, num_groups, type_kwargs)

    def _select_parents(
        self, fn: Callable, f: Tensor, num_children: Any, culled: Any, num_parents: Any, num_groups: Any, options: dict
    ) -> Tensor:
        culled_ids = self._ids(culled if culled is not None else [], "culled", allow_empty=True)
        if num_children is None:
            num_children = culled_ids.numel()
        return ops.parents.parents_for_slots(
            f, fn, culled_ids, num_children, num_parents, num_groups, generator=self.generator, **options
        )

    # ------------------------------------------------------------------ variation

    @torch.no_grad()
    def crossover_(
        self,
        crossover_type: str,
        parents: Sequence[Sequence[int]] | Tensor,
        children: Sequence[int] | Tensor,
        fitnesses: Any = None,
        num_groups: int = 1,
        *,
        optimizer: Any = None,
        optimizer_state: str = "inherit",
        **type_kwargs: Any,
    ) -> None:
        """Write child ``j`` into slot ``children[j]``, bred from ``parents[j]`` (in place).

        Args:
            parents: ``(c, k)`` population ids.
            children: ``(c,)`` slots to overwrite (distinct).
            fitnesses: ``(P,)``, needed by fitness-aware types (``xes``,
                ``extrapolative``); higher is better.
            optimizer: an optimizer (or several) over :meth:`adapter_parameters`
                whose per-individual state rows follow the children
                (:mod:`populora.population.optimizer_rows`).
            optimizer_state: ``"inherit"`` (child ``j`` gets ``parents[j, 0]``'s
                rows) or ``"reset"`` (zeros).

        All or nothing: if the operator raises, the children's slots, their
        optimizer rows and the generator are as they were.
        """
        self._check_alive()
        _need_two(self, "crossover_")
        fn = ops.get_operator("crossover", crossover_type)
        ops.check_options("crossover", crossover_type, type_kwargs)
        parents_t = self._ids(parents, "parents", allow_empty=True, dim=2)
        child_ids = self._ids(children, "children", allow_empty=True)
        if child_ids.numel() != parents_t.shape[0]:
            raise InvalidValueError(
                f"`children` has {child_ids.numel()} slots but `parents` has {parents_t.shape[0]} rows"
            )
        if torch.unique(child_ids).numel() != child_ids.numel():
            raise InvalidValueError(f"`children` must be distinct slots, got {child_ids.tolist()}")
        num_groups = ops.check_num_groups(self.pop_size, num_groups)
        f = None if fitnesses is None else self.validate_fitnesses(fitnesses)
        optimizer_state = check_optimizer_state(optimizer_state)
        rows = OptimizerRows(optimizer, self.adapter_parameters())
        if child_ids.numel() == 0:
            return
        with self._undo_on_error(child_ids, rows=rows):
            self._crossover(fn, parents_t, child_ids, f, num_groups, type_kwargs)
            rows.replace(child_ids, parents_t[:, 0] if optimizer_state == "inherit" else None)

    def _crossover(
        self, fn: Callable, parents: Tensor, children: Tensor, fitnesses: Tensor | None, num_groups: int, options: dict
    ) -> None:
        with ops.trusted_fitnesses():  # validated once, by the caller
            new = fn(
                self.factors(), parents, fitnesses=fitnesses, generator=self.generator, num_groups=num_groups, **options
            )
        self._write(children, new)

    @torch.no_grad()
    def mutate_(
        self,
        mutation_type: str = "full_gaussian",
        *,
        individual: int | None = None,
        individuals: Sequence[int] | Tensor | None = None,
        all_individuals: bool = False,
        epsilon: float = 0.1,
        **type_kwargs: Any,
    ) -> None:
        """Mutate the given individuals in place (exactly one of the three selectors).

        For the additive types (``full_gaussian``, ``layer_selective_gaussian``,
        ``neftune_style``) ``epsilon`` is the expected relative change of each
        mutated layer's output (relative to ``max(rms(W x), rms(x))`` for
        unit-variance inputs ``x``), whatever the adapter's size; the SVD types
        cannot move a zero adapter (see :mod:`populora.operators.mutation`).
        NumPy scalars are accepted.

        Raises:
            InvalidTypeError: ``epsilon`` (or an option) of the wrong type.
            InvalidValueError: ``epsilon < 0``, an unknown type, or a bad option value.
        All or nothing: if the operator raises, the adapters and the
        generator are as they were.
        """
        self._check_alive()
        fn = ops.get_operator("mutation", mutation_type)
        ops.check_options("mutation", mutation_type, type_kwargs)
        epsilon = _check_epsilon(epsilon)
        given = (individual is not None) + (individuals is not None) + bool(all_individuals)
        if given != 1:
            raise InvalidValueError("pass exactly one of `individual=`, `individuals=` and `all_individuals=True`")
        if all_individuals:
            ids = torch.arange(self.pop_size, device=self.device)
        elif individual is not None:
            ids = torch.tensor([self._check_id(individual)], device=self.device)
        else:
            ids = self._ids(individuals, "individuals", allow_empty=True)
        with self._undo_on_error(torch.unique(ids)):
            self._mutate(fn, ids, epsilon, type_kwargs)

    def _mutate(self, fn: Callable, ids: Tensor, epsilon: float, options: dict) -> None:
        ids = torch.unique(ids)
        if ids.numel() == 0:
            return
        per = PerDevice(ids)  # each target reads the ids on its own stacks' device (a spread model)
        chosen = [Factors(d[per.on(d.device)], u[per.on(u.device)]) for d, u in self.factors()]
        self._write(
            per,
            ops.call_mutation(
                fn, chosen, epsilon=epsilon, weight_scales=self.weight_scales, generator=self.generator, **options
            ),
        )

    @torch.no_grad()
    def evolve_(
        self,
        fitnesses: Any,
        config: Evolution | None = None,
        *,
        survive_frac: float | None = None,
        elite_frac: float | None = None,
        selection_type: str | None = None,
        parent_selection_type: str | None = None,
        crossover_type: str | None = None,
        mutation_type: str | None = None,
        epsilon: float | None = None,
        num_groups: int | None = None,
        optimizer: Any = None,
        **legacy: Any,
    ) -> SelectionResult:
        """One generation: select -> parents -> crossover into the culled -> mutate children.

        ``config`` (an :class:`~populora.population.evolution.Evolution`, default ``Evolution()``) holds
        every option; the keywords given here override its fields (``evolve_(f, survive_frac=0.3)`` is
        ``evolve_(f, Evolution(survive_frac=0.3))``). 0.5.0's other flat keywords
        (``num_parents_per_child``, ``selection_kwargs``, ``parent_kwargs``, ``crossover_kwargs``,
        ``mutation_kwargs``, ``optimizer_state``) still work, with a ``DeprecationWarning``: they are
        fields of the config.

        With ``optimizer=`` (one or several optimizers over :meth:`adapter_parameters`), the optimizer's
        per-individual state follows: survivors keep their rows, a child gets its first parent's
        (``Evolution.optimizer_state="inherit"``) or zeros (``"reset"``); see
        :mod:`populora.population.optimizer_rows`.

        Higher fitness is better. Elites are never modified; survivors keep
        their ids (ids are slots). Every option is validated before anything
        changes. Advances ``generation`` and ``eval_seed`` by one and appends
        ``GenerationStats(generation, best, mean, std)`` of ``fitnesses`` (after
        the NaN policy; ``std`` with ``correction=0``) to :attr:`history`.

        All or nothing: if any step raises (a user-registered operator, say),
        the adapters, the optimizer rows, the generator, ``generation`` and
        ``eval_seed`` are exactly as before the call, so a retry (or an
        untouched twin) gives the same generation bit for bit.
        """
        self._check_alive()
        _need_two(self, "evolve_")
        # deprecated flat keywords first (a typo is named), then the explicit ones, checked under their names
        explicit = dict(
            survive_frac=survive_frac,
            elite_frac=elite_frac,
            selection_type=selection_type,
            parent_selection_type=parent_selection_type,
            crossover_type=crossover_type,
            mutation_type=mutation_type,
            epsilon=epsilon,
            num_groups=num_groups,
        )
        c = resolve_config(Evolution, config, legacy, explicit, where="Population.evolve_", stacklevel=4)
        rows = OptimizerRows(optimizer, self.adapter_parameters())
        epsilon_ = _check_epsilon(c.epsilon)
        f = self.validate_fitnesses(fitnesses)  # the one validation of this generation's fitnesses
        ops.selection.group_sizes(self.pop_size, c.survive_frac, c.elite_frac, c.num_groups)
        groups = ops.check_num_groups(self.pop_size, c.num_groups)

        generator_state = self.generator.get_state()
        with transaction(self.generator):  # selection writes no adapter, only draws
            result = ops.selection.select_survivors(
                f,
                ops.get_operator("selection", c.selection_type),
                c.survive_frac,
                c.elite_frac,
                groups,
                generator=self.generator,
                **c.selection_kwargs,
            )
        culled = result.selected_out_indices
        with self._undo_on_error(culled, generator_state, rows):  # e.g. a crossover needing another parent count
            parents = self._select_parents(
                ops.get_operator("parent_selection", c.parent_selection_type),
                f,
                culled.numel(),
                culled,
                c.num_parents_per_child,
                groups,
                dict(c.parent_kwargs),
            )
            if culled.numel():
                self._crossover(
                    ops.get_operator("crossover", c.crossover_type),
                    parents,
                    culled,
                    f,
                    groups,
                    dict(c.crossover_kwargs),
                )
            self._mutate(ops.get_operator("mutation", c.mutation_type), culled, epsilon_, dict(c.mutation_kwargs))
            if culled.numel():
                rows.replace(culled, parents[:, 0] if c.optimizer_state == "inherit" else None)
        self.history.append(
            GenerationStats(self.generation, float(f.max()), float(f.mean()), float(f.std(correction=0)))
        )
        self.generation += 1
        self.eval_seed += 1
        return result


def _check_epsilon(epsilon: Any) -> float:
    """``epsilon`` as a float >= 0: the same check (and error class) as the mutation operators'."""
    return ops.mutation.check_epsilon(epsilon)


def _need_two(population: Any, what: str) -> None:
    """Selection and crossover need two individuals or more (``pop_size=1`` is a single LoRA)."""
    if population.pop_size < 2:
        raise InvalidValueError(
            f"`{what}` needs a population of 2 or more individuals, this one has pop_size={population.pop_size} "
            "(a single LoRA: train it, mutate it, merge it; build the population with pop_size >= 2 to evolve it)"
        )
