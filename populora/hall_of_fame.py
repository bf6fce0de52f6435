"""HallOfFame: an archive of past champions, so a population can be scored against old opponents.

The usual remedy for cycling in coevolution: besides the current opponents, a
population meets archived champions of the others (or of itself). A champion
is a copy of the best individual's adapter factors, run through the
population's own model with :meth:`HallOfFame.run`. Higher fitness is better.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn  # noqa: F401 - nn is used by the doctests

from .checkpoint import atomic_save, load_checkpoint
from .operators import Factors
from .population import Population

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


class HallOfFame:
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

    def __init__(self, populations: Mapping[str, Population], capacity: int | None = None, *, seed: int = 0):
        if not isinstance(populations, Mapping) or not populations:
            raise TypeError(f"`populations` must be a non-empty dict {{name: Population}}, got {populations!r}")
        for name, pop in populations.items():
            if not isinstance(name, str):
                raise TypeError(f"population names must be strings, got {name!r}")
            if not isinstance(pop, Population):
                raise TypeError(f"`populations[{name!r}]` must be a Population, got {type(pop).__name__}")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"`capacity` must be an int >= 1 or None, got {capacity!r}")
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
            raise ValueError(f"this hall tracks {list(self.populations)}: pass `population`")
        if isinstance(population, Population):
            for name, pop in self.populations.items():
                if pop is population:
                    return name
            raise ValueError("this Population is not tracked by the hall of fame; tracked: "
                             f"{list(self.populations)}")
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
        champion = self._capture(name, self.populations[name].check_fitnesses(fitnesses), generation)
        self._append(champion)
        return champion

    def _capture(self, name: str, fitnesses: Tensor, generation: int) -> Champion:
        i = int(torch.argmax(fitnesses))
        factors = tuple(Factors(f.down[i].detach().clone(), f.up[i].detach().clone())
                        for f in self.populations[name].factors())
        return Champion(name, int(generation), i, float(fitnesses[i]), factors)

    def _capture_all(self, fitnesses: Mapping[str, Tensor]) -> list[Champion]:
        return [self._capture(n, fitnesses[n], self.populations[n].generation) for n in self.populations]

    def _append(self, champion: Champion) -> None:
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
            ValueError: ``k < 1``, an empty archive, or ``k`` larger than the
                archive without ``replace``.
        """
        name = self._name(population)
        archive = self._archive[name]
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"`k` must be an int >= 1, got {k!r}")
        if not archive:
            raise ValueError(f"the hall of fame has no champions of {name!r} yet")
        if not replace and k > len(archive):
            raise ValueError(f"cannot sample {k} distinct champions of {name!r}: the archive holds {len(archive)} "
                             "(pass replace=True or a smaller k)")
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
            ValueError: champions of different or untracked populations.
            RouteError: a batch that does not fit ``k``.
        """
        single = isinstance(champions, Champion)
        group = [champions] if single else list(champions)
        if not group or not all(isinstance(c, Champion) for c in group):
            raise TypeError("`champions` must be a Champion or a non-empty sequence of Champions")
        names = {c.population for c in group}
        if len(names) != 1:
            raise ValueError(f"`champions` must all come from one population, got {sorted(names)}")
        name = self._name(names.pop())
        pop = self.populations[name]
        stacks = [Factors(torch.stack([c.factors[t].down for c in group]), torch.stack([c.factors[t].up for c in group]))
                  for t in range(len(pop.target_names))]  # (k, d, r), (k, e, r) per target
        route = {"individual": 0} if single else {"all_individuals": True, "broadcast": broadcast}
        return pop.forward_factors(stacks, *args, **route, **kwargs)

    # ------------------------------------------------------------------ save / load

    def state(self) -> dict[str, Any]:
        """The archive and the generator (tensors and plain values)."""
        return {
            "format": _FORMAT,
            "capacity": self.capacity,
            "seed": self.seed,
            "generator": self.generator.get_state(),
            "champions": {
                name: [{"generation": c.generation, "individual": c.individual, "fitness": c.fitness,
                        "downs": [f.down.cpu() for f in c.factors], "ups": [f.up.cpu() for f in c.factors]}
                       for c in archive]
                for name, archive in self._archive.items()
            },
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` (checked against the tracked populations before anything changes)."""
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise ValueError(f"not a populora hall-of-fame checkpoint (missing format {_FORMAT!r})")
        if set(state["champions"]) != set(self.populations):
            raise ValueError(f"checkpoint archives {sorted(state['champions'])}, this hall tracks "
                             f"{sorted(self.populations)}")
        archive: dict[str, list[Champion]] = {}
        for name, entries in state["champions"].items():
            pop = self.populations[name]
            shapes = [(tuple(f.down.shape[1:]), tuple(f.up.shape[1:])) for f in pop.factors()]
            archive[name] = []
            for e in entries:
                got = [(tuple(d.shape), tuple(u.shape)) for d, u in zip(e["downs"], e["ups"])]
                if got != shapes:
                    raise ValueError(f"checkpoint champion of {name!r} has factor shapes {got}, the population "
                                     f"has {shapes}")
                factors = tuple(Factors(d.to(pop.device), u.to(pop.device)) for d, u in zip(e["downs"], e["ups"]))
                archive[name].append(Champion(name, int(e["generation"]), int(e["individual"]), float(e["fitness"]),
                                              factors))
        self.generator.set_state(state["generator"])
        self.capacity = state["capacity"]
        self.seed = state["seed"]
        self._archive = archive

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state` atomically (temp file + rename)."""
        return atomic_save(self.state(), path, kind="HallOfFame")

    def load(self, path: str | Path) -> None:
        """Restore a hall saved by :meth:`save`."""
        self.load_state(load_checkpoint(path, kind="HallOfFame"))
