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

import difflib
import inspect
import keyword
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn  # noqa: F401 - nn is used by the doctests

from . import distributed as pd
from .checkpoint import atomic_save, load_checkpoint
from .errors import CheckpointError, FitnessError, InvalidTypeError, InvalidValueError
from .hall_of_fame import HallOfFame
from .population import Population
from .stats import GenerationStats

__all__ = ["Coevolve"]

_SUFFIX = "_outputs"
_SPEC_KEYS = ("population", "probe", "fitness")
_FORMAT = "populora.coevolve/1"

# what travels ahead of a probe output in a distributed step (one int64)
_KIND_TENSOR, _KIND_OBJECT, _KIND_FAILED = 0, 1, 2


def _fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _injected(fn: Any, role: str, owner: str, allowed: Sequence[str]) -> tuple[str, ...]:
    """The parameter names of ``fn``, each checked to be one Coevolve can inject.

    Raises:
        TypeError: ``fn`` is not callable, its signature cannot be read, or it
            takes ``*args`` / ``**kwargs`` / positional-only parameters.
        ValueError: a parameter name is not among ``allowed`` (named, with the
            allowed names and the closest one).
    """
    where = f"the {role} of population {owner!r}"
    if not callable(fn):
        raise InvalidTypeError(f"{where} must be callable, got {type(fn).__name__}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as error:
        raise InvalidTypeError(f"cannot read the signature of {where} ({_fn_name(fn)}): {error}") from None
    names = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            kind = {p.VAR_POSITIONAL: "*args", p.VAR_KEYWORD: "**kwargs"}.get(p.kind, "positional-only")
            raise InvalidTypeError(
                f"{where} ({_fn_name(fn)}) takes {kind} parameter `{p.name}`; Coevolve injects arguments by "
                f"name, so every parameter must be one of {_quoted(allowed)}"
            )
        if p.name not in allowed:
            close = difflib.get_close_matches(p.name, allowed, n=1)
            hint = f" Did you mean `{close[0]}`?" if close else ""
            raise InvalidValueError(
                f"{where} ({_fn_name(fn)}) has parameter `{p.name}`, which Coevolve cannot inject; "
                f"allowed parameter names: {_quoted(allowed)}.{hint}"
            )
        names.append(p.name)
    return tuple(names)


class _Member(NamedTuple):
    population: Population
    probe: Callable[..., Any]
    fitness: Callable[..., Any]
    probe_params: dict[str, str | None]  # parameter -> population whose outputs it receives (None: coevolve)
    fitness_params: dict[str, str]

    @property
    def probe_deps(self) -> tuple[str, ...]:
        return tuple(src for src in self.probe_params.values() if src is not None)


def _sources(params: Sequence[str], names: Sequence[str]) -> dict[str, str | None]:
    """``{parameter: population}``: ``<name>`` and ``<name>_outputs`` both receive ``name``'s outputs."""
    return {p: None if p == "coevolve" else p if p in names else p.removesuffix(_SUFFIX) for p in params}


def _find_cycle(names: Sequence[str], deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A dependency cycle as data flows (``a -> b``: b's probe takes ``a_outputs``), or None.

    The cycle starts and ends at its earliest-declared member.
    """
    state = dict.fromkeys(names, 0)  # 0 new, 1 on the stack, 2 done
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for dep in deps[name]:
            if state[dep] == 1:
                loop = stack[stack.index(dep):][::-1]  # dependency order reversed = data flow
                start = min(loop, key=names.index)
                i = loop.index(start)
                loop = loop[i:] + loop[:i]
                return [*loop, start]
            if state[dep] == 0 and (found := visit(dep)):
                return found
        stack.pop()
        state[name] = 2
        return None

    for name in names:
        if state[name] == 0 and (found := visit(name)):
            return found
    return None


class Coevolve:
    """Several populations, each scored from the others' outputs, evolved together.

    Args:
        populations: ``{name: dict(population=..., probe=..., fitness=...)}``.
            ``name`` must be an identifier that does not shadow a Coevolve
            attribute (``step``, ``history``, ...) and does not start with
            ``_``. ``probe`` takes any of ``coevolve`` and ``<name>`` /
            ``<name>_outputs`` (another population's probe output);
            ``fitness`` takes any of ``<name>`` / ``<name>_outputs`` and returns the
            population's ``(P,)`` fitness (higher is better).
        evolve_kwargs: ``{name: {option: value}}``, keyword arguments of that
            population's ``evolve_`` (e.g. ``dict(solver=dict(epsilon=0.05))``).
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
        history: ``{name: [GenerationStats(generation, best, mean), ...]}``,
            one entry per step; ``generation`` is the population's generation
            that was evaluated (before it evolved).
        generation: number of completed steps.
        order: population names in the order their probes run.

    Raises:
        TypeError: a spec is not a dict with exactly ``population``,
            ``probe`` and ``fitness``; a population is not a ``Population``;
            a probe or fitness is not callable or takes ``*args`` /
            ``**kwargs`` / positional-only parameters.
        ValueError: a bad name, a parameter that cannot be injected (named,
            with the allowed names), a cycle among probes (spelled out,
            ``proposer -> solver -> proposer``), a population used twice, or
            ``evolve_kwargs`` for an unknown population or option.

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
        >>> len(co.history['b'])
        1
    """

    def __init__(
        self,
        populations: Mapping[str, Mapping[str, Any]],
        evolve_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        hall_of_fame: HallOfFame | None = None,
    ):
        if not isinstance(populations, Mapping) or not populations:
            raise InvalidTypeError(
                "`populations` must be a non-empty dict {name: dict(population=..., probe=..., fitness=...)}, "
                f"got {populations!r}"
            )
        names = list(populations)
        for name in names:
            _check_name(name)
            if name.endswith(_SUFFIX) and name.removesuffix(_SUFFIX) in populations:
                raise InvalidValueError(
                    f"population names {name.removesuffix(_SUFFIX)!r} and {name!r} are ambiguous: a parameter "
                    f"`{name}` could mean either population's outputs; rename one"
                )
        allowed_fitness = [*names, *(f"{n}{_SUFFIX}" for n in names)]
        allowed_probe = ["coevolve", *allowed_fitness]
        members: dict[str, _Member] = {}
        seen: dict[int, str] = {}
        for name in names:
            spec = populations[name]
            if not isinstance(spec, Mapping) or set(spec) != set(_SPEC_KEYS):
                got = sorted(spec) if isinstance(spec, Mapping) else type(spec).__name__
                raise InvalidTypeError(
                    f"`populations[{name!r}]` must be a dict with exactly the keys "
                    f"{_quoted(_SPEC_KEYS)}, got {got}"
                )
            pop = spec["population"]
            if not isinstance(pop, Population):
                raise InvalidTypeError(f"`populations[{name!r}]['population']` must be a Population, got {type(pop).__name__}")
            if id(pop) in seen:
                raise InvalidValueError(f"populations {seen[id(pop)]!r} and {name!r} are the same Population object")
            seen[id(pop)] = name
            members[name] = _Member(
                pop, spec["probe"], spec["fitness"],
                _sources(_injected(spec["probe"], "probe", name, allowed_probe), names),
                _sources(_injected(spec["fitness"], "fitness", name, allowed_fitness), names),
            )
        deps = {name: m.probe_deps for name, m in members.items()}
        cycle = _find_cycle(names, deps)
        if cycle:
            raise InvalidValueError(
                f"probes form a cycle: {' -> '.join(cycle)} (`a -> b`: the probe of b takes `a_outputs`). "
                "Probes must form a chain; a fitness may close the circle instead, since every probe runs "
                "before any fitness"
            )
        kwargs = _check_evolve_kwargs(evolve_kwargs, members)
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
        self.order: list[str] = _topological(names, deps)
        self.evolve_kwargs: dict[str, dict[str, Any]] = kwargs
        self.hall_of_fame = hall_of_fame
        self.history: dict[str, list[GenerationStats]] = {name: [] for name in names}
        self.generation = 0
        self._evolve_checked = False  # evolve_kwargs accepted once: later steps need no rollback snapshot
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
        any population changes; if an option in ``evolve_kwargs`` turns out
        invalid at the first step, the populations already evolved are
        restored before the error propagates.

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
            ``{name: (P,) float32 fitness}`` as the populations evolved on it.

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
        with self._evaluating():
            outputs = self._probe_distributed() if use_dist else self._probe_local()
            fitnesses = {name: self._fitness(name, outputs) for name in self._members}
        champions = self.hall_of_fame._capture_all(fitnesses) if self.hall_of_fame is not None else []
        evaluated = {name: m.population.generation for name, m in self._members.items()}
        self._evolve_all(fitnesses)
        for champion in champions:
            self.hall_of_fame._append(champion)
        for name, f in fitnesses.items():
            self.history[name].append(GenerationStats(evaluated[name], float(f.max()), float(f.mean())))
        self.generation += 1
        return fitnesses

    @contextmanager
    def _evaluating(self) -> Iterator[None]:
        modules = [mod for m in self._members.values() for mod in m.population.modules()]
        flags = [mod.training for mod in modules]
        try:
            for m in self._members.values():
                m.population.eval()
            with torch.no_grad():
                yield
        finally:
            for mod, flag in zip(modules, flags):
                mod.training = flag

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
        """Each rank runs its probes as soon as their inputs are here; outputs go out in probe order.

        The collectives run in the same order on every rank. A failed probe is
        shared like an output, so every rank raises at the same point instead
        of waiting for a tensor that never comes.
        """
        world, me = pd.world_size(), pd.rank()
        owner = {name: i % world for i, name in enumerate(self.order)}
        outputs: dict[str, Any] = {}
        failed: dict[str, BaseException] = {}
        for name in self.order:
            for mine in self.order:  # probe order: a probe's inputs come before it
                if owner[mine] != me or mine in outputs or mine in failed:
                    continue
                deps = self._members[mine].probe_deps
                if not all(d in outputs or d in failed for d in deps):
                    continue
                bad = [d for d in deps if d in failed]
                if bad:
                    failed[mine] = RuntimeError(f"the probe of {mine!r} needs the outputs of {bad[0]!r}, which failed")
                    continue
                try:
                    outputs[mine] = self._run_probe(mine, outputs)
                except Exception as error:  # noqa: BLE001 - shared with the other ranks below
                    failed[mine] = error
            outputs[name] = self._share(name, owner[name], outputs.get(name), failed.get(name))
        return outputs

    def _share(self, name: str, src: int, value: Any, error: BaseException | None) -> Any:
        """Send ``src``'s probe output of ``name`` to every rank (tensor: raw broadcast)."""
        me_src = pd.rank() == src
        kind = torch.zeros(1, dtype=torch.int64)
        if me_src:
            kind[0] = _KIND_FAILED if error is not None else _KIND_TENSOR if isinstance(value, Tensor) else _KIND_OBJECT
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        kind = kind.to(device) if device is not None else kind
        dist.broadcast(kind, src=src)
        code = int(kind.item())
        if code == _KIND_FAILED:
            message = pd.broadcast_object(f"{type(error).__name__}: {error}" if me_src else None, src=src)
            if me_src:
                raise error
            raise RuntimeError(f"the probe of population {name!r} failed on rank {src}: {message}")
        if code == _KIND_OBJECT:
            return pd.broadcast_object(value, src=src)
        return pd.broadcast_tensor_raw(value if me_src else None, src=src,
                                       device=None if me_src else self[name].device)

    def _sync_from_rank0(self) -> None:
        """Make every rank start from rank 0's populations, counters and history."""
        for name, m in self._members.items():
            # adapters, generator, generation, eval seed and mutation floors; base model by checksum
            m.population.sync_from_main_rank_(name=name)
        small = pd.broadcast_object({
            "generation": self.generation,
            "history": {n: [tuple(s) for s in h] for n, h in self.history.items()},
        })
        self.generation = small["generation"]
        self.history = {n: [GenerationStats(*s) for s in h] for n, h in small["history"].items()}
        self._synced = True

    def _fitness(self, name: str, outputs: Mapping[str, Any]) -> Tensor:
        m = self._members[name]
        value = m.fitness(**{p: outputs[src] for p, src in m.fitness_params.items()})
        try:
            return m.population.check_fitnesses(value)
        except (FitnessError, TypeError, ValueError, RuntimeError) as error:
            raise FitnessError(f"fitness of population {name!r} ({_fn_name(m.fitness)}) is invalid: {error}") from error

    def _evolve_all(self, fitnesses: Mapping[str, Tensor]) -> None:
        snapshots = {} if self._evolve_checked else {n: _clone_state(m.population.state())
                                                     for n, m in self._members.items()}
        try:
            for name, m in self._members.items():
                m.population.evolve_(fitnesses[name], **self.evolve_kwargs.get(name, {}))
        except BaseException:
            for name, state in snapshots.items():
                self._members[name].population.load_state(state)
            raise
        self._evolve_checked = True

    # ------------------------------------------------------------------ save / load

    def state(self) -> dict[str, Any]:
        """Everything an exact resume needs, except the base models (tensors and plain values)."""
        return {
            "format": _FORMAT,
            "names": list(self._members),
            "generation": self.generation,
            "populations": {name: m.population.state() for name, m in self._members.items()},
            "history": {name: [list(s) for s in h] for name, h in self.history.items()},
            "hall_of_fame": None if self.hall_of_fame is None else self.hall_of_fame.state(),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`; all or nothing (on an error nothing has changed).

        Raises:
            ValueError: not a Coevolve checkpoint, other population names, a
                hall of fame present on one side only, or a population
                checkpoint that does not fit (see ``Population.load_state``).
        """
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise CheckpointError(f"not a populora coevolution checkpoint (missing format {_FORMAT!r})")
        if list(state["names"]) != list(self._members):
            raise CheckpointError(f"checkpoint has populations {list(state['names'])}, this Coevolve has "
                             f"{list(self._members)}")
        if (state["hall_of_fame"] is None) != (self.hall_of_fame is None):
            raise CheckpointError("the checkpoint and this Coevolve disagree on having a hall of fame "
                             f"(checkpoint: {state['hall_of_fame'] is not None}, "
                             f"here: {self.hall_of_fame is not None})")
        backup = self.state()
        backup = {**backup, "populations": {n: _clone_state(s) for n, s in backup["populations"].items()}}
        try:
            self._restore(state)
        except BaseException:
            self._restore(backup)
            raise

    def _restore(self, state: Mapping[str, Any]) -> None:
        for name, m in self._members.items():
            m.population.load_state(state["populations"][name])
        if self.hall_of_fame is not None:
            self.hall_of_fame.load_state(state["hall_of_fame"])
        self.history = {name: [GenerationStats(int(g), float(b), float(mu)) for g, b, mu in state["history"][name]]
                        for name in self._members}
        self.generation = int(state["generation"])
        self._evolve_checked = False

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state` atomically (temp file + rename); the base models are not saved.

        Under torchrun every rank holds the same state; call it on the main
        rank (``populora.distributed.is_main_rank()``) or give each rank its
        own path.
        """
        return atomic_save(self.state(), path, kind="Coevolve")

    def load(self, path: str | Path) -> None:
        """Resume from :meth:`save`'s checkpoint: the next step is the one that would have followed."""
        self.load_state(load_checkpoint(path, kind="Coevolve"))


# ---------------------------------------------------------------------------- helpers


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise InvalidValueError(f"population name {name!r} must be a Python identifier (it becomes `coevolve.<name>` "
                         f"and the parameters `<name>` / `<name>{_SUFFIX}`)")
    if name == "coevolve":
        raise InvalidValueError("population name 'coevolve' is reserved: probes take `coevolve` (the Coevolve "
                         "itself); rename the population")
    if name.startswith("_") or hasattr(Coevolve, name) or name in _INSTANCE_ATTRIBUTES:
        raise InvalidValueError(f"population name {name!r} would shadow the Coevolve attribute `{name}`; rename the "
                         "population (names may not start with `_` either)")


_INSTANCE_ATTRIBUTES = frozenset({"order", "evolve_kwargs", "hall_of_fame", "history", "generation"})


def _topological(names: Sequence[str], deps: Mapping[str, Sequence[str]]) -> list[str]:
    """Probe order: repeatedly the first-declared population whose inputs are ready (no cycles here)."""
    order: list[str] = []
    while len(order) < len(names):
        order.append(next(n for n in names if n not in order and all(d in order for d in deps[n])))
    return order


def _check_evolve_kwargs(
    evolve_kwargs: Mapping[str, Mapping[str, Any]] | None, members: Mapping[str, _Member]
) -> dict[str, dict[str, Any]]:
    if evolve_kwargs is None:
        return {}
    if not isinstance(evolve_kwargs, Mapping):
        raise InvalidTypeError(f"`evolve_kwargs` must be a dict keyed by population name, got {type(evolve_kwargs).__name__}")
    out = {}
    for name, options in evolve_kwargs.items():
        if name not in members:
            raise InvalidValueError(f"`evolve_kwargs` has options for {name!r}, which is not a population; "
                             f"populations: {list(members)}")
        if not isinstance(options, Mapping):
            raise InvalidTypeError(f"`evolve_kwargs[{name!r}]` must be a dict of evolve_ options, "
                            f"got {type(options).__name__}")
        params = inspect.signature(members[name].population.evolve_).parameters
        accepted = [p for p, v in params.items()
                    if p != "fitnesses" and v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD)]
        open_ended = any(v.kind is v.VAR_KEYWORD for v in params.values())
        for key in options:
            if key not in accepted and not open_ended:
                close = difflib.get_close_matches(str(key), accepted, n=1)
                hint = f" Did you mean `{close[0]}`?" if close else ""
                raise InvalidValueError(f"`evolve_kwargs[{name!r}]` has option `{key}`, which "
                                 f"{type(members[name].population).__name__}.evolve_ does not take; options: "
                                 f"{_quoted(accepted)}.{hint}")
        out[name] = dict(options)
    return out


def _clone_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a population state whose tensors do not alias the live adapters."""
    return {k: ([t.clone() for t in v] if k in ("downs", "ups") else v.clone() if isinstance(v, Tensor) else v)
            for k, v in state.items()}
