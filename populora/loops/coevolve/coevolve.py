"""Coevolution: several populations whose fitnesses derive from one another's outputs.

``Coevolve(populations={name: dict(population=, probe=, fitness=)})`` runs one
generation of every population per :meth:`Coevolve.step`:

1. every *probe* runs once, in dependency order, and produces that
   population's outputs for this step;
2. every *fitness* turns the outputs into a ``(P,)`` tensor for its
   population (higher is better);
3. every population evolves one generation (``population.evolve_``).

Arguments are injected by parameter name. A probe may take ``coevolve`` (the
:class:`Coevolve` itself, so ``coevolve.solver(x, all_individuals=True)``
works) and ``<name>`` or ``<name>_outputs`` (both: another population's probe
output, which makes that probe run first). A fitness may take ``<name>`` /
``<name>_outputs`` of any population, its own included. Probes must form a chain (a cycle raises at
construction, spelled out); fitnesses may close circles, since every probe
runs before any fitness.

:class:`HallOfFame` archives past champions, so a population can be scored
against past opponents as well as current ones (the usual remedy for
cycling in coevolution). Probes and fitnesses reach it through closures or
through ``coevolve.hall_of_fame``.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from populora import distributed as pd
from populora.checks import is_int, is_real
from populora.errors import CheckpointError, FitnessError, InvalidTypeError, InvalidValueError
from populora.loops.base import Budget, load_state, run_steps, save_state
from populora.loops.coevolve.distributed import probe_distributed, sync_from_main_rank
from populora.loops.coevolve.hall_of_fame import HallOfFame
from populora.loops.coevolve.history import CoevolveHistory, CoevolveRecord
from populora.loops.coevolve.specs import (
    SPEC_KEYS,
    SUFFIX,
    Member,
    check_evolution,
    find_cycle,
    fn_name,
    injected,
    quoted,
    sources,
    topological,
)
from populora.population.evolution import Evolution
from populora.population.population import Population, evaluating
from populora.snapshots import Snapshot
from populora.stats import GenerationStats
from populora.transaction import Attributes, transaction

__all__ = ["Coevolve"]

_FORMAT = "populora.coevolve/1"


class Coevolve(Snapshot):
    """Several populations, each scored from the others' outputs, evolved together.

    Args:
        populations: ``{name: dict(population=..., probe=..., fitness=...)}``.
            ``name`` must be an identifier that does not shadow a Coevolve
            attribute (``step``, ``history``, ...) and does not start with
            ``_``. ``probe`` takes any of ``coevolve`` and ``<name>`` /
            ``<name>_outputs`` (another population's probe output);
            ``fitness`` takes any of ``<name>`` / ``<name>_outputs`` and returns the
            population's ``(P,)`` fitness (higher is better).
        evolution: ``{name: Evolution}``, that population's ``evolve_`` options
            (e.g. ``dict(solver=Evolution(epsilon=0.05))``; a population left out uses ``Evolution()``).
            0.5.0's ``{name: {option: value}}`` (here or as ``evolve_kwargs=``) still works, deprecated.
        hall_of_fame: a :class:`HallOfFame` over (some of) these populations;
            each step archives the champion of every population it tracks,
            before the population evolves. Reachable as
            ``coevolve.hall_of_fame``.

    Probes and fitnesses run under ``torch.no_grad()`` with every
    population's model in eval mode (dropout off, so a probe is a pure
    function of its inputs and the adapters); each module's training flag is
    restored afterwards. ``torch.inference_mode()`` is not used, so outputs
    stay ordinary tensors that fitnesses may modify in place.

    Attributes:
        history: a :class:`~populora.loops.coevolve.history.CoevolveHistory`, one
            :class:`~populora.loops.coevolve.history.CoevolveRecord` per step
            (``record['solver']``: ``GenerationStats(generation, best, mean,
            std)``, ``generation`` the population's, evaluated before it
            evolved); ``history.of('solver')`` is one population's list
            (0.5.0's ``history['solver']``, deprecated).
        generation: number of completed steps.
        order: population names in the order their probes run.

    The loop surface every loop has: :meth:`step`, :meth:`run` (a budget of
    steps or seconds, a callback), ``history``, and checkpoints:
    :meth:`state_dict` / :meth:`load_state_dict` (a snapshot of
    everything but the base models) and ``save(path)`` / ``load(path)``, so
    the next step after a load is the one that would have followed. Under
    torchrun every rank holds the same state: save on the main rank
    (``populora.is_main_rank()``) or give each rank its own path.

    Raises:
        TypeError: a spec is not a dict with exactly ``population``,
            ``probe`` and ``fitness``; a population is not a ``Population``;
            a probe or fitness is not callable or takes ``*args`` /
            ``**kwargs`` / positional-only parameters.
        ValueError: a bad name, a parameter that cannot be injected (named,
            with the allowed names), a cycle among probes (spelled out,
            ``proposer -> solver -> proposer``), a population used twice, or
            ``evolution`` for an unknown population (or option, in the deprecated dict form).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from populora import Coevolve, Population
        >>> a = Population(nn.Linear(1, 1), pop_size=4, low_rank=1)
        >>> b = Population(nn.Linear(1, 1), pop_size=4, low_rank=1)
        >>> co = Coevolve(populations=dict(
        ...     a=dict(population=a, probe=lambda coevolve: coevolve.a(torch.ones(1, 1), all_individuals=True),
        ...            fitness=lambda a_outputs, b_outputs: -(a_outputs - b_outputs.mean()).abs().flatten()),
        ...     b=dict(population=b, probe=lambda coevolve, a_outputs: coevolve.b(a_outputs, all_individuals=True),
        ...            fitness=lambda b_outputs: b_outputs.flatten()),
        ... ))
        >>> co.order
        ['a', 'b']
        >>> sorted(co.step())
        ['a', 'b']
        >>> len(co.history), co.history.of('b')[0].generation
        (1, 0)
    """

    _checkpoint_kind = "Coevolve"

    def __init__(
        self,
        populations: Mapping[str, Mapping[str, Any]],
        evolution: Mapping[str, Evolution] | None = None,
        *,
        hall_of_fame: HallOfFame | None = None,
        evolve_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        if not isinstance(populations, Mapping) or not populations:
            raise InvalidTypeError(
                "`populations` must be a non-empty dict {name: dict(population=..., probe=..., fitness=...)}, "
                f"got {populations!r}"
            )
        names = list(populations)
        for name in names:
            _check_name(name)
            if name.endswith(SUFFIX) and name.removesuffix(SUFFIX) in populations:
                raise InvalidValueError(
                    f"population names {name.removesuffix(SUFFIX)!r} and {name!r} are ambiguous: a parameter "
                    f"`{name}` could mean either population's outputs; rename one"
                )
        allowed_fitness = [*names, *(f"{n}{SUFFIX}" for n in names)]
        allowed_probe = ["coevolve", *allowed_fitness]
        members: dict[str, Member] = {}
        seen: dict[int, str] = {}
        for name in names:
            spec = populations[name]
            if not isinstance(spec, Mapping) or set(spec) != set(SPEC_KEYS):
                got = sorted(spec) if isinstance(spec, Mapping) else type(spec).__name__
                raise InvalidTypeError(
                    f"`populations[{name!r}]` must be a dict with exactly the keys {quoted(SPEC_KEYS)}, got {got}"
                )
            pop = spec["population"]
            if not isinstance(pop, Population):
                raise InvalidTypeError(
                    f"`populations[{name!r}]['population']` must be a Population, got {type(pop).__name__}"
                )
            if id(pop) in seen:
                raise InvalidValueError(f"populations {seen[id(pop)]!r} and {name!r} are the same Population object")
            seen[id(pop)] = name
            fitness_sources = sources(injected(spec["fitness"], "fitness", name, allowed_fitness), names)
            members[name] = Member(
                pop,
                spec["probe"],
                spec["fitness"],
                sources(injected(spec["probe"], "probe", name, allowed_probe), names),
                {p: src for p, src in fitness_sources.items() if src is not None},  # (a fitness takes no coevolve)
            )
        deps = {name: m.probe_deps for name, m in members.items()}
        cycle = find_cycle(names, deps)
        if cycle:
            raise InvalidValueError(
                f"probes form a cycle: {' -> '.join(cycle)} (`a -> b`: the probe of b takes `a_outputs`). "
                "Probes must form a chain; a fitness may close the circle instead, since every probe runs "
                "before any fitness"
            )
        options = check_evolution(evolution, evolve_kwargs, {n: m.population for n, m in members.items()})
        if hall_of_fame is not None:
            if not isinstance(hall_of_fame, HallOfFame):
                raise InvalidTypeError(f"`hall_of_fame` must be a HallOfFame, got {type(hall_of_fame).__name__}")
            for name, pop in hall_of_fame.populations.items():
                if name not in members or members[name].population is not pop:
                    raise InvalidValueError(
                        f"the hall of fame tracks population {name!r}, which is not this Coevolve's "
                        f"population of that name (names: {names})"
                    )

        self._members = members
        self.order: list[str] = topological(names, deps)
        self.evolution: dict[str, Evolution | dict[str, Any]] = options  # a dict: 0.5.0's form
        self.hall_of_fame = hall_of_fame
        self.history = CoevolveHistory(names)
        self.generation = 0
        self._synced = False  # distributed: rank 0's populations broadcast once

    # ------------------------------------------------------------------ access

    def __getattr__(self, name: str) -> Population:
        members = self.__dict__.get("_members")
        if members is not None and name in members:
            return members[name].population
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getitem__(self, name: str) -> Population:
        if name not in self._members:
            raise KeyError(f"no population named {name!r}; populations: {list(self._members)}")
        return self._members[name].population

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    @property
    def populations(self) -> dict[str, Population]:
        """``{name: Population}`` in declaration order."""
        return {name: m.population for name, m in self._members.items()}

    def __repr__(self) -> str:
        pops = ", ".join(f"{n}(P={m.population.pop_size})" for n, m in self._members.items())
        return f"Coevolve({pops}; probe order {' -> '.join(self.order)}; generation={self.generation})"

    # ------------------------------------------------------------------ one generation

    def step(self, distributed: bool = False) -> dict[str, Tensor]:
        """Probe every population, derive every fitness, evolve each one generation.

        Higher fitness is better. Every fitness is checked (a finite ``(P,)``
        tensor for its population, or NaN under ``nan_policy='worst'``) before
        any population changes. All or nothing: if anything raises (a probe, a
        fitness, an ``evolution`` option found invalid, the hall of
        fame), every population, the hall of fame, the history and the
        counter are as before. Appends the step's
        :class:`~populora.loops.coevolve.history.CoevolveRecord` to
        :attr:`history`.

        Args:
            distributed: under ``torch.distributed``, share the probes out
                among the ranks (round-robin over the probe order) and send
                each output to every rank (a tensor as one raw broadcast after a
                small header; other objects pickled), in dependency order.
                Every rank then derives the same fitnesses and evolves in
                lockstep. At the first distributed step, rank 0's adapters,
                generators and counters are broadcast and the base models
                compared by checksum (repaired with a warning if they differ).
                Without a process group (or with one rank) the step runs
                locally. Probes must be pure: only their return value is
                shared, so side effects (counters, logging, drawing from a
                global RNG) happen on the owning rank alone. Draw randomness
                from a generator seeded by ``coevolve.generation`` to keep runs
                reproducible and resumable.

        Returns:
            Each population's ``(P,)`` float32 fitnesses (``{name -> fitness}``), as it evolved on them.

        Raises:
            FitnessError: a fitness is not a finite ``(P,)`` tensor (the error
                names the population and both shapes).
            RuntimeError: (distributed) on the other ranks when a probe fails
                on its owner, which re-raises the probe's own exception; no
                rank is left waiting.
        """
        use_dist = bool(distributed) and pd.is_distributed()
        if use_dist and not self._synced:
            self._sync_from_rank0()
        held = [self.hall_of_fame] if self.hall_of_fame is not None else []
        with transaction(
            *(m.population for m in self._members.values()), *held, Attributes(self, "history", "generation")
        ):
            return self._step(use_dist)

    def _step(self, use_dist: bool) -> dict[str, Tensor]:
        with self._evaluating():
            outputs = self._probe_distributed() if use_dist else self._probe_local()
            fitnesses = {name: self._fitness(name, outputs) for name in self._members}
        champions = self.hall_of_fame.capture_all(fitnesses) if self.hall_of_fame is not None else []
        evaluated = {name: m.population.generation for name, m in self._members.items()}
        self._evolve_all(fitnesses)
        if self.hall_of_fame is not None:  # (else no champions)
            for champion in champions:
                self.hall_of_fame.append(champion)
        stats = {
            name: GenerationStats(evaluated[name], float(f.max()), float(f.mean()), float(f.std(correction=0)))
            for name, f in fitnesses.items()
        }
        self.history.append(CoevolveRecord(self.generation, stats))
        self.generation += 1
        return fitnesses

    def run(
        self,
        budget: int | Budget | None = None,
        *,
        callback: Callable[[CoevolveRecord], Any] | None = None,
        progress: bool = False,
        distributed: bool = False,
    ) -> list[CoevolveRecord]:
        """:meth:`step` until ``budget`` is spent (an int: steps; a :class:`~populora.loops.base.Budget`: steps
        and / or seconds, whichever comes first; at least one step runs) or ``callback`` says stop.

        Args:
            budget: steps (int) or a ``Budget(max_steps=, max_seconds=)``.
            callback: ``callback(record)`` after every step; ``None`` / ``False`` continue, ``True`` stops,
                anything else raises ``InvalidTypeError`` naming the callback and the value.
            progress: a tqdm bar (main rank) over the budget closest to running out.
            distributed: passed to :meth:`step` (``max_seconds`` then judged by rank 0's clock).

        Returns:
            The records of this call's steps (also appended to :attr:`history`).
        """
        use_dist = bool(distributed) and pd.is_distributed()
        first = next(iter(self._members))
        return run_steps(
            lambda: self.step(distributed=distributed),
            lambda: self.history,
            budget,
            callback,
            progress,
            where="Coevolve.run",
            desc="coevolve",
            postfix=lambda r: {f"{first} best": f"{r[first].best:.3g}"},
            main_rank=pd.is_main_rank(),
            sync_seconds=(lambda s: float(pd.broadcast_object(s))) if use_dist else None,
        )

    def _evaluating(self) -> Any:
        return evaluating(m.population for m in self._members.values())

    def _run_probe(self, name: str, outputs: Mapping[str, Any]) -> Any:
        m = self._members[name]
        args = {p: (self if src is None else outputs[src]) for p, src in m.probe_params.items()}
        return m.probe(**args)

    def _probe_local(self) -> dict[str, Any]:
        outputs: dict[str, Any] = {}
        for name in self.order:
            outputs[name] = self._run_probe(name, outputs)
        return outputs

    def _probe_distributed(self) -> dict[str, Any]:
        """Every rank runs its share of the probes; every output reaches every rank (see
        :mod:`populora.coevolve_distributed`)."""
        return probe_distributed(
            self.order,
            {n: m.probe_deps for n, m in self._members.items()},
            self._run_probe,
            {n: m.population.device for n, m in self._members.items()},
        )

    def _sync_from_rank0(self) -> None:
        """Make every rank start from rank 0's populations, counters and history."""
        self.generation, history = sync_from_main_rank(self.populations, self.generation, self.history.by_population())
        self.history = _records(history, list(self._members), self.generation)
        self._synced = True

    def _fitness(self, name: str, outputs: Mapping[str, Any]) -> Tensor:
        m = self._members[name]
        value = m.fitness(**{p: outputs[src] for p, src in m.fitness_params.items()})
        try:
            return m.population.validate_fitnesses(value)
        except (FitnessError, TypeError, ValueError, RuntimeError) as error:
            raise FitnessError(f"fitness of population {name!r} ({fn_name(m.fitness)}) is invalid: {error}") from error

    def _evolve_all(self, fitnesses: Mapping[str, Tensor]) -> None:
        """Evolve every population, all or nothing: if one raises (at any step), every one is as before."""
        with transaction(*(m.population for m in self._members.values())):
            for name, m in self._members.items():
                options = self.evolution.get(name)
                if isinstance(options, Mapping):  # 0.5.0's keywords (deprecated)
                    m.population.evolve_(fitnesses[name], **options)
                else:
                    m.population.evolve_(fitnesses[name], options)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """A snapshot of everything an exact resume needs, except the base models.

        ``{'format', 'names', 'generation', 'populations': {name: adapters and
        counters (Population.state_dict(include_model=False), CPU copies)},
        'history', 'hall_of_fame'}``; no tensor shares storage with the live
        populations.
        """
        return {
            "format": _FORMAT,
            "names": list(self._members),
            "generation": self.generation,
            "populations": {name: m.population.snapshot("cpu") for name, m in self._members.items()},
            "history": {name: [list(s)[:4] for s in h] for name, h in self.history.by_population().items()},
            "hall_of_fame": None if self.hall_of_fame is None else self.hall_of_fame.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: all or nothing (on an error nothing has changed).

        Every part is checked first (format, names, generation, history, the
        hall of fame, each population's state against its population); only
        then is anything written.

        Raises:
            CheckpointError: not a Coevolve state, other population names, a
                hall of fame present on one side only, a malformed history, or
                a population state that does not fit (see
                ``Population.load_state_dict``).
        """
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise CheckpointError(f"not a populora coevolution checkpoint (missing format {_FORMAT!r})")
        missing = [k for k in ("names", "generation", "populations", "history", "hall_of_fame") if k not in state]
        if missing:
            raise CheckpointError(f"the coevolution state lacks the key(s) {missing}")
        if list(state["names"]) != list(self._members):
            raise CheckpointError(
                f"checkpoint has populations {list(state['names'])}, this Coevolve has {list(self._members)}"
            )
        if (state["hall_of_fame"] is None) != (self.hall_of_fame is None):
            raise CheckpointError(
                "the checkpoint and this Coevolve disagree on having a hall of fame "
                f"(checkpoint: {state['hall_of_fame'] is not None}, "
                f"here: {self.hall_of_fame is not None})"
            )
        if not is_int(state["generation"]) or state["generation"] < 0:
            raise CheckpointError(
                f"the coevolution state's 'generation' must be an int >= 0, got {state['generation']!r}"
            )
        history = _records(
            _check_history(state["history"], list(self._members)), list(self._members), int(state["generation"])
        )
        hall = None if self.hall_of_fame is None else self.hall_of_fame.check_state(state["hall_of_fame"])
        populations = state["populations"]
        if not isinstance(populations, Mapping) or list(populations) != list(self._members):
            got = list(populations) if isinstance(populations, Mapping) else type(populations).__name__
            raise CheckpointError(
                f"the coevolution state's 'populations' must be keyed by {list(self._members)}, got {got}"
            )
        checked = {name: m.population.check_state_dict(populations[name]) for name, m in self._members.items()}
        held = [self.hall_of_fame] if self.hall_of_fame is not None else []
        with transaction(*(m.population for m in self._members.values()), *held):  # a write failing half-way
            for name, m in self._members.items():
                m.population.load_checked_state_dict(checked[name])
            if hall is not None and self.hall_of_fame is not None:  # (a hall state only with a hall of fame)
                self.hall_of_fame.load_checked(hall)
        self.history = history
        self.generation = int(state["generation"])

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state_dict` atomically (temp file + rename); returns the ``Path`` written."""
        return save_state(self, path, self._checkpoint_kind)

    def load(self, path: str | Path) -> None:
        """Restore what :meth:`save` wrote (0.5.0's files too): all or nothing (the file is named in an error)."""
        load_state(self, path, self._checkpoint_kind)


# ---------------------------------------------------------------------------- helpers


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise InvalidValueError(
            f"population name {name!r} must be a Python identifier (it becomes `coevolve.<name>` "
            f"and the parameters `<name>` / `<name>{SUFFIX}`)"
        )
    if name == "coevolve":
        raise InvalidValueError(
            "population name 'coevolve' is reserved: probes take `coevolve` (the Coevolve "
            "itself); rename the population"
        )
    if name.startswith("_") or hasattr(Coevolve, name) or name in _INSTANCE_ATTRIBUTES:
        raise InvalidValueError(
            f"population name {name!r} would shadow the Coevolve attribute `{name}`; rename the "
            "population (names may not start with `_` either)"
        )


_INSTANCE_ATTRIBUTES = frozenset({"order", "evolution", "evolve_kwargs", "hall_of_fame", "history", "generation"})


def _records(history: Mapping[str, list[GenerationStats]], names: list[str], generation: int) -> CoevolveHistory:
    """``{name: [GenerationStats, ...]}`` (a state's form) as one record per step (every list one per step)."""
    lengths = {len(history[n]) for n in names}
    if len(lengths) > 1:
        raise CheckpointError(
            f"the coevolution state's history must hold one entry per step for every population, got lengths "
            f"{ {n: len(history[n]) for n in names} }"
        )
    steps = lengths.pop() if lengths else 0
    first = max(0, generation - steps)
    return CoevolveHistory(names, (CoevolveRecord(first + i, {n: history[n][i] for n in names}) for i in range(steps)))


def _check_history(history: Any, names: list[str]) -> dict[str, list[GenerationStats]]:
    """The state's ``{name: [[generation, best, mean(, std)], ...]}`` as GenerationStats, checked."""
    if not isinstance(history, Mapping) or list(history) != names:
        got = list(history) if isinstance(history, Mapping) else type(history).__name__
        raise CheckpointError(f"the coevolution state's 'history' must be a dict keyed by {names}, got {got}")
    out = {}
    for name, entries in history.items():
        ok = isinstance(entries, (list, tuple)) and all(
            isinstance(s, (list, tuple))
            and len(s) in (3, 4)
            and is_int(s[0])
            and all(is_real(v) for v in s[1:3])
            and all(v is None or is_real(v) for v in s[3:])
            for s in entries
        )
        if not ok:
            raise CheckpointError(
                f"the coevolution state's history of {name!r} must be a list of [generation, best, mean, std] entries"
            )
        out[name] = [
            GenerationStats(int(s[0]), float(s[1]), float(s[2]), None if len(s) < 4 or s[3] is None else float(s[3]))
            for s in entries
        ]
    return out
