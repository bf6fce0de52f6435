"""HallOfFame: an archive of past champions, so a population can be scored against old opponents.

The usual remedy for cycling in coevolution: besides the current opponents, a
population meets archived champions of the others (or of itself). A champion
is a copy of the best individual's adapter factors, run through the
population's own model with :meth:`HallOfFame.run`. Higher fitness is better.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from populora.checks import check_int, check_seed, is_int, is_real
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError
from populora.operators import Factors
from populora.population.population import Population
from populora.snapshots import Snapshot

__all__ = ["Champion", "HallOfFame"]

_FORMAT = "populora.hall_of_fame/1"


class Champion(NamedTuple):
    """One archived individual: the adapters it had when it was the best of its population.

    Attributes:
        population: the name it is archived under.
        generation: the population's generation whose fitnesses crowned it.
        individual: its id in the population then.
        fitness: its fitness then (higher is better).
        factors: per target, its adapter factors ``down (d, r_t)``, ``up (e, r_t)``
            (copies, not views of the population).
    """

    population: str
    generation: int
    individual: int
    fitness: float
    factors: tuple[Factors, ...]


class HallOfFame(Snapshot):
    """An archive of past champions per population, to score against past opponents.

    Coevolving populations can cycle (rock beats scissors beats paper ...);
    scoring each population against a sample of the other's past champions as
    well as its current individuals is the standard remedy (Rosin & Belew,
    1997). Champions are copies of the best individual's adapter factors, run
    on the population's shared base model with :meth:`run`.

    Args:
        populations: ``{name: Population}`` to archive; names match the
            Coevolve's when the hall is passed to one.
        capacity: champions kept per population (the oldest go first);
            ``None`` keeps all.
        seed: seeds the hall's own ``torch.Generator`` used by :meth:`sample`.

    Pass it to ``Coevolve(..., hall_of_fame=hall)`` to archive every tracked
    population's champion at each step (before it evolves), or call
    :meth:`add_champion` yourself. Sampling advances the hall's generator,
    which is saved with it; under ``step(distributed=True)`` sample outside
    the probes (every rank then draws the same), for example after each
    step, and let the probes read the sample through a closure.
    :meth:`state_dict` / :meth:`load_state_dict` and ``save(path)`` /
    ``load(path)`` keep the archive and the generator.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from populora import HallOfFame, Population
        >>> pop = Population(nn.Linear(2, 1), pop_size=4, low_rank=1)
        >>> hall = HallOfFame(dict(critic=pop), capacity=8, seed=0)
        >>> champion = hall.add_champion("critic", torch.tensor([0.1, 0.9, 0.3, 0.2]), generation=0)
        >>> champion.individual
        1
        >>> hall.run(hall.sample(1), torch.ones(3, 2)).shape
        torch.Size([3, 1])
    """

    _checkpoint_kind = "HallOfFame"

    def __init__(self, populations: Mapping[str, Population], capacity: int | None = None, *, seed: int = 0):
        if not isinstance(populations, Mapping):
            raise InvalidTypeError(
                f"`populations` must be a non-empty dict {{name: Population}}, got "
                f"{type(populations).__name__} {populations!r}"
            )
        if not populations:
            raise InvalidValueError("`populations` must be a non-empty dict {name: Population}, got {}")
        for name, pop in populations.items():
            if not isinstance(name, str):
                raise InvalidTypeError(f"population names must be strings, got {name!r}")
            if not isinstance(pop, Population):
                raise InvalidTypeError(f"`populations[{name!r}]` must be a Population, got {type(pop).__name__}")
        if capacity is not None:
            capacity = check_int("capacity", capacity, low=1)
        seed = check_seed("seed", seed)
        self.populations: dict[str, Population] = dict(populations)
        self.capacity = capacity
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self._archive: dict[str, list[Champion]] = {name: [] for name in self.populations}

    def __len__(self) -> int:
        return sum(len(a) for a in self._archive.values())

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}: {len(a)}" for n, a in self._archive.items())
        return f"HallOfFame({sizes}; capacity={self.capacity})"

    def _name(self, population: str | Population | None) -> str:
        if population is None:
            if len(self.populations) == 1:
                return next(iter(self.populations))
            raise InvalidValueError(f"this hall tracks {list(self.populations)}: pass `population`")
        if isinstance(population, Population):
            for name, pop in self.populations.items():
                if pop is population:
                    return name
            raise InvalidValueError(
                f"this Population is not tracked by the hall of fame; tracked: {list(self.populations)}"
            )
        if population not in self.populations:
            raise KeyError(f"no population named {population!r} in the hall of fame; tracked: {list(self.populations)}")
        return population

    def champions(self, population: str | Population | None = None) -> list[Champion]:
        """The archived champions of one population, oldest first (a copy of the list)."""
        return list(self._archive[self._name(population)])

    def add_champion(self, population: str | Population, fitnesses: Any, generation: int) -> Champion:
        """Archive the best individual (``argmax``; higher fitness is better) of ``population``.

        Call it with the fitnesses of the population's current individuals,
        before it evolves (``Coevolve`` does this when given the hall).

        Args:
            population: its name in the hall, or the Population itself.
            fitnesses: ``(P,)`` fitness of the current individuals.
            generation: the generation these fitnesses belong to (recorded).

        Returns:
            The new :class:`Champion`.

        Raises:
            FitnessError: ``fitnesses`` is not a valid ``(P,)`` fitness.
        """
        name = self._name(population)
        generation = check_int("generation", generation, low=0)
        champion = self._capture(name, self.populations[name].validate_fitnesses(fitnesses), generation)
        self.append(champion)
        return champion

    def _capture(self, name: str, fitnesses: Tensor, generation: int) -> Champion:
        i = int(torch.argmax(fitnesses))
        factors = tuple(
            Factors(f.down[i].detach().clone(), f.up[i].detach().clone()) for f in self.populations[name].factors()
        )
        return Champion(name, int(generation), i, float(fitnesses[i]), factors)

    def capture_all(self, fitnesses: Mapping[str, Tensor]) -> list[Champion]:
        return [self._capture(n, fitnesses[n], self.populations[n].generation) for n in self.populations]

    def append(self, champion: Champion) -> None:
        archive = self._archive[champion.population]
        archive.append(champion)
        if self.capacity is not None and len(archive) > self.capacity:
            del archive[0]

    def sample(self, k: int, population: str | Population | None = None, *, replace: bool = False) -> list[Champion]:
        """``k`` champions of one population, uniformly at random from the hall's generator.

        Args:
            k: how many.
            population: name or Population; may be omitted when the hall tracks one.
            replace: draw with replacement (then ``k`` may exceed the archive).

        Raises:
            InvalidTypeError: ``k`` is not an integer.
            InvalidValueError: ``k < 1``, an empty archive, or ``k`` larger
                than the archive without ``replace``.
            KeyError: a population name the hall does not track.
        """
        name = self._name(population)
        archive = self._archive[name]
        k = check_int("k", k, low=1)
        if not archive:
            raise InvalidValueError(f"the hall of fame has no champions of {name!r} yet")
        if not replace and k > len(archive):
            raise InvalidValueError(
                f"cannot sample {k} distinct champions of {name!r}: the archive holds "
                f"{len(archive)} (pass replace=True or a smaller k)"
            )
        if replace:
            ids = torch.randint(len(archive), (k,), generator=self.generator)
        else:
            ids = torch.randperm(len(archive), generator=self.generator)[:k]
        return [archive[i] for i in ids.tolist()]

    def run(self, champions: Champion | Sequence[Champion], *args: Any, broadcast: bool = False, **kwargs: Any) -> Any:
        """Run the population's model with archived champions' adapters routed, in one forward.

        Args:
            champions: one :class:`Champion` (every row goes through it), or
                ``k`` champions of the same population, routed like
                ``population(x, all_individuals=True)``: a 1-row batch (or
                ``broadcast=True``) is seen by every champion (``k*b`` rows
                out, layout ``(k b)``); otherwise the batch must be divisible
                by ``k`` and row block ``j`` goes to champion ``j``.
            *args, **kwargs: the model's inputs (batch first).

        Returns:
            The model's output. Runs with grad enabled unless the caller
            disables it, in the mode the user left the model in.

        Raises:
            InvalidTypeError: ``champions`` is not a Champion or a non-empty
                sequence of them.
            InvalidValueError: champions of different or untracked populations.
            RouteError: a batch that does not fit ``k``.
        """
        single = isinstance(champions, Champion)
        group = [champions] if isinstance(champions, Champion) else list(champions)
        if not group or not all(isinstance(c, Champion) for c in group):
            raise InvalidTypeError("`champions` must be a Champion or a non-empty sequence of Champions")
        names = {c.population for c in group}
        if len(names) != 1:
            raise InvalidValueError(f"`champions` must all come from one population, got {sorted(names)}")
        name = self._name(names.pop())
        pop = self.populations[name]
        stacks = [
            Factors(torch.stack([c.factors[t].down for c in group]), torch.stack([c.factors[t].up for c in group]))
            for t in range(len(pop.target_names))
        ]  # (k, d, r), (k, e, r) per target
        route = {"individual": 0} if single else {"all_individuals": True, "broadcast": broadcast}
        return pop.forward_factors(stacks, *args, **route, **kwargs)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The archive and the generator (tensors and plain values).

        A snapshot: every tensor is a CPU copy sharing no storage with the
        archived champions or the generator.
        """
        return {
            "format": _FORMAT,
            "capacity": self.capacity,
            "seed": self.seed,
            "generator": self.generator.get_state().clone(),
            "champions": {
                name: [
                    {
                        "generation": c.generation,
                        "individual": c.individual,
                        "fitness": c.fitness,
                        "downs": [f.down.detach().to("cpu", copy=True) for f in c.factors],
                        "ups": [f.up.detach().to("cpu", copy=True) for f in c.factors],
                    }
                    for c in archive
                ]
                for name, archive in self._archive.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: all or nothing.

        Everything is checked first (format, keys, the tracked populations,
        every champion's entries, factor shapes and dtypes, the generator
        state); only then is the hall changed.

        Raises:
            CheckpointError: naming the missing or wrong key; the hall is unchanged.
        """
        self.load_checked(self.check_state(state))

    def check_state(self, state: Any) -> tuple[torch.Generator, int | None, int, dict[str, list[Champion]]]:
        """``state`` checked and parsed into (generator, capacity, seed, archive); nothing written."""
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(f"not a populora hall-of-fame state: got {got!r}, expected format {_FORMAT!r}")
        missing = [key for key in ("capacity", "seed", "generator", "champions") if key not in state]
        if missing:
            raise CheckpointError(f"the hall-of-fame state lacks the key(s) {missing}")
        capacity, seed = state["capacity"], state["seed"]
        if capacity is not None and (not is_int(capacity) or capacity < 1):
            raise CheckpointError(f"the hall-of-fame state's 'capacity' must be None or an int >= 1, got {capacity!r}")
        if not is_int(seed):
            raise CheckpointError(f"the hall-of-fame state's 'seed' must be an int, got {seed!r}")
        champions = state["champions"]
        if not isinstance(champions, Mapping) or set(champions) != set(self.populations):
            got = sorted(champions) if isinstance(champions, Mapping) else type(champions).__name__
            raise CheckpointError(f"checkpoint archives {got}, this hall tracks {sorted(self.populations)}")
        archive = {
            name: [self._champion(name, j, e) for j, e in enumerate(_entries(name, entries))]
            for name, entries in champions.items()
        }
        generator = torch.Generator()
        saved = state["generator"]
        try:
            if not isinstance(saved, torch.Tensor) or saved.dtype != torch.uint8:
                raise TypeError(f"expected a uint8 tensor, got {type(saved).__name__}")
            generator.set_state(saved)
        except (RuntimeError, TypeError) as err:
            raise CheckpointError(f"the hall-of-fame state's 'generator' is not a CPU generator state: {err}") from None
        return generator, capacity, seed, archive

    def _champion(self, name: str, j: int, e: Any) -> Champion:
        """Entry ``j`` of ``name``'s archived champions, checked against the population's factor shapes."""
        pop = self.populations[name]
        shapes = [(tuple(f.down.shape[1:]), tuple(f.up.shape[1:])) for f in pop.factors()]  # (d, r_t), (e, r_t)
        where = f"champion {j} of {name!r}"
        keys = ("generation", "individual", "fitness", "downs", "ups")
        if not isinstance(e, Mapping) or any(key not in e for key in keys):
            have = sorted(e) if isinstance(e, Mapping) else type(e).__name__
            raise CheckpointError(f"the hall-of-fame state's {where} must hold {list(keys)}, got {have}")
        if not (is_int(e["generation"]) and is_int(e["individual"]) and is_real(e["fitness"])):
            raise CheckpointError(
                f"the hall-of-fame state's {where} has a non-numeric generation, individual or fitness"
            )
        lists = isinstance(e["downs"], (list, tuple)) and isinstance(e["ups"], (list, tuple))
        if not lists or not all(isinstance(t, Tensor) and t.is_floating_point() for t in [*e["downs"], *e["ups"]]):
            raise CheckpointError(
                f"the hall-of-fame state's {where} must hold lists of floating-point tensors under 'downs' and 'ups'"
            )
        got = [(tuple(d.shape), tuple(u.shape)) for d, u in zip(e["downs"], e["ups"])]
        if len(e["downs"]) != len(e["ups"]) or got != shapes:
            raise CheckpointError(
                f"checkpoint champion of {name!r} has factor shapes {got}, the population has {shapes}"
            )
        factors = tuple(
            Factors(d.to(pop.device, copy=True), u.to(pop.device, copy=True)) for d, u in zip(e["downs"], e["ups"])
        )
        return Champion(name, int(e["generation"]), int(e["individual"]), float(e["fitness"]), factors)

    def load_checked(self, checked: tuple[torch.Generator, int | None, int, dict[str, list[Champion]]]) -> None:
        self.generator, self.capacity, self.seed, self._archive = checked


def _entries(name: str, entries: Any) -> list[Any]:
    if not isinstance(entries, (list, tuple)):
        raise CheckpointError(
            f"the hall-of-fame state's champions of {name!r} must be a list, got {type(entries).__name__}"
        )
    return list(entries)
