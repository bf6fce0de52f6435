"""The paper's ratings and replacement: TrueSkill-style Thurstone-Mosteller ratings with a draw margin, and
every ``k`` steps the bottom ``gamma`` of each role replaced by mutations and crossovers of its top.

:class:`PaperRatings` is :class:`~populora.loops.ratings.Ratings` on openskill's ``ThurstoneMostellerFull`` with
TrueSkill's defaults (mu 25, sigma 25/3, beta 25/6, tau 25/300) and TrueSkill's draw probability 0.1 mapped
onto openskill's draw margin ``epsilon`` (:func:`~populora.loops.selfplay.rewards.draw_margin`: 0.7405).

:func:`replace_` is one replacement of one population (the paper's rule):

1. rank by ``ratings.ordinal(name)`` = ``mu - 3 sigma`` (descending, ties to the lower id);
2. the bottom ``c = max(1, floor(gamma * P))`` slots are the children (ascending); the parents' pool is the
   top ``min(max(c, 2), P - c)``;
3. each child draws, from the POPULATION's generator, in child order: ``u ~ U(0, 1)``; a crossover when
   ``u < crossover_rate`` (and the pool holds two), else a mutation; the operator uniformly among the four
   of that kind (:data:`PAPER_CROSSOVERS` X1-X4, :data:`PAPER_MUTATIONS` M1-M4); the parents uniformly from
   the pool (a crossover: two distinct ones, in drawn order);
4. a mutated child is a copy of its parent (optimizer rows included), then mutated with ``epsilon``; a
   crossed child is the crossover of its parents (optimizer rows of the first); fitness-aware crossovers
   (``extrapolative``) read the ordinals as fitnesses;
5. the children restart at the prior rating (``Ratings.reset_``).

All or nothing: if anything raises, the population (adapters, generator), the optimizer's rows and the
ratings are as they were.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from populora.checks import check_float
from populora.errors import InvalidTypeError, InvalidValueError
from populora.loops.ratings import Ratings
from populora.loops.selfplay.rewards import draw_margin
from populora.population.population import Population
from populora.transaction import transaction

__all__ = ["PAPER_CROSSOVERS", "PAPER_MUTATIONS", "PaperRatings", "ReplacementRecord", "child_seed", "replace_"]

# the paper's four of each kind, in its order (X1-X4, M1-M4); neftune_style and xes are our extensions
PAPER_MUTATIONS = ("svd_structured", "layer_selective_gaussian", "component_masking", "full_gaussian")
PAPER_CROSSOVERS = ("dare", "layer_wise", "svd_subspace", "extrapolative")


class PaperRatings(Ratings):
    """:class:`~populora.loops.ratings.Ratings` on openskill's ``ThurstoneMostellerFull`` with a TrueSkill draw margin.

    Args:
        sizes: ``{name: P}``.
        draw_probability: TrueSkill's ``p_draw`` (default 0.1), mapped onto openskill's ``epsilon``
            (:func:`~populora.loops.selfplay.rewards.draw_margin` with ``beta``).
        inherit, prior_mu, prior_sigma, beta, tau: as :class:`~populora.loops.ratings.Ratings` (TrueSkill's defaults).

    Attributes:
        draw_margin: the ``epsilon`` openskill's model uses.
    """

    def __init__(
        self,
        sizes: Any,
        *,
        draw_probability: float = 0.1,
        inherit: str = "reset",
        prior_mu: float = 25.0,
        prior_sigma: float = 25.0 / 3.0,
        beta: float = 25.0 / 6.0,
        tau: float = 25.0 / 300.0,
    ) -> None:
        super().__init__(
            sizes,
            model="ThurstoneMostellerFull",
            inherit=inherit,
            prior_mu=prior_mu,
            prior_sigma=prior_sigma,
            beta=beta,
            tau=tau,
        )
        self.draw_probability = check_float("draw_probability", draw_probability, low=0.0, high=1.0, high_open=True)
        self.draw_margin = draw_margin(self.draw_probability, self.beta)
        from openskill.models import ThurstoneMostellerFull  # Ratings' constructor has checked it imports

        # the model Ratings rates with, rebuilt with the draw margin (every other parameter as Ratings set it)
        self._model = ThurstoneMostellerFull(
            mu=self.prior_mu, sigma=self.prior_sigma, beta=self.beta, tau=self.tau, epsilon=self.draw_margin
        )

    def _config(self) -> dict[str, Any]:
        return {**super()._config(), "draw_probability": self.draw_probability}


@dataclass(frozen=True)
class ReplacementRecord:
    """One :func:`replace_` of one population.

    Attributes:
        step: the loop's step count when it happened.
        name: the population's name in the ratings (``"teachers"`` / ``"students"``).
        children: slots replaced, ascending.
        parents: per child, ``(a, b)`` (a mutated child: ``(a, a)``).
        operators: per child, the operator's name.
        crossed: per child, whether it is a crossover.
        keys: the ordinals ``mu - 3 sigma`` it ranked by.
    """

    step: int
    name: str
    children: tuple[int, ...]
    parents: tuple[tuple[int, int], ...]
    operators: tuple[str, ...]
    crossed: tuple[bool, ...]
    keys: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "name": self.name,
            "children": list(self.children),
            "parents": [list(p) for p in self.parents],
            "operators": list(self.operators),
            "crossed": list(self.crossed),
            "keys": list(self.keys),
        }

    @classmethod
    def from_dict(cls, d: Any) -> ReplacementRecord:
        """The record of :meth:`as_dict` (checked: the keys and the per-child lengths)."""
        names = ("step", "name", "children", "parents", "operators", "crossed", "keys")
        if not isinstance(d, dict) or sorted(d) != sorted(names):
            raise InvalidValueError(f"a replacement record must be a dict with the keys {list(names)}, got {d!r}")
        c = len(d["children"])
        if not (len(d["parents"]) == len(d["operators"]) == len(d["crossed"]) == c):
            raise InvalidValueError(f"a replacement record must list parents, operators and crossed per child: {d!r}")
        return cls(
            int(d["step"]),
            str(d["name"]),
            tuple(int(x) for x in d["children"]),
            tuple((int(a), int(b)) for a, b in d["parents"]),
            tuple(str(o) for o in d["operators"]),
            tuple(bool(x) for x in d["crossed"]),
            tuple(float(x) for x in d["keys"]),
        )


def _names(name: str, values: Sequence[str]) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise InvalidTypeError(f"`{name}` must be a non-empty sequence of operator names, got {values!r}")
    return tuple(values)


def replace_(
    population: Population,
    ratings: Ratings,
    name: str,
    *,
    optimizer: Any = None,
    fraction: float = 0.25,
    crossover_rate: float = 0.5,
    mutations: Sequence[str] = PAPER_MUTATIONS,
    crossovers: Sequence[str] = PAPER_CROSSOVERS,
    epsilon: float = 0.1,
    step: int = 0,
    noise_seed: int | None = None,
    fetch: Callable[[list[tuple[int, tuple[int, int]]]], Collection[int]] | None = None,
) -> ReplacementRecord | None:
    """Replace the bottom ``fraction`` of ``population`` by children of its top (module docstring), in place.

    Args:
        population: ``P`` individuals; with ``P < 2`` nothing happens (``None`` is returned).
        ratings: rates ``name`` with ``P`` players.
        optimizer: optimizer(s) over ``population.adapter_parameters()`` whose rows the children inherit.
        fraction: ``gamma`` in ``(0, 0.5]``.
        crossover_rate: probability in ``[0, 1]`` that a child is a crossover.
        mutations, crossovers: the operators drawn from (uniformly).
        epsilon: the mutations' strength.
        step: recorded in the :class:`ReplacementRecord`.
        noise_seed: ``None``: the operators draw their noise from the population's generator too (0.5.0's
            rule). An int: the decisions (step 3) alone come from the population's generator, and each child's
            operator draws from a generator of its own seeded by ``(noise_seed, step, child)``
            (:func:`child_seed`): a child is the same whichever process writes it and whatever other children
            are written (the by-member distributed loop).
        fetch: called once with ``[(child, parents)]`` after the decisions, before any child is written; it
            brings the parents' rows to the processes that write the children (over ``torch.distributed``) and
            returns the children THIS process writes (the others are left as they are). ``None``: every child.

    Raises:
        InvalidValueError, InvalidTypeError: a bad option (before anything changes).
    """
    fraction = check_float("fraction", fraction, low=0.0, high=0.5, low_open=True)
    crossover_rate = check_float("crossover_rate", crossover_rate, low=0.0, high=1.0)
    epsilon = check_float("epsilon", epsilon, low=0.0)
    mutations, crossovers = _names("mutations", mutations), _names("crossovers", crossovers)
    size = population.pop_size
    if ratings.sizes.get(name) != size:
        raise InvalidValueError(f"`ratings` must rate {name!r} with {size} players, got {ratings.sizes.get(name)}")
    if size < 2:
        return None
    keys = ratings.ordinal(name).to(torch.float64)
    replaced = max(1, math.floor(fraction * size))
    order = torch.sort(keys, descending=True, stable=True).indices
    children = order[size - replaced :].sort().values
    pool = order[: min(max(replaced, 2), size - replaced)]
    generator = population.generator
    with transaction(population, *_optimizers(optimizer), ratings):
        plan = []
        for child in children.tolist():
            u = float(torch.rand((), generator=generator, device=generator.device))
            crossed = u < crossover_rate and pool.numel() >= 2
            ops = crossovers if crossed else mutations
            op = ops[int(torch.randint(len(ops), (), generator=generator, device=generator.device))]
            if crossed:
                pick = torch.randperm(pool.numel(), generator=generator, device=generator.device)[:2].cpu()
                parents = (int(pool[pick[0]]), int(pool[pick[1]]))
            else:
                a = int(pool[int(torch.randint(pool.numel(), (), generator=generator, device=generator.device))])
                parents = (a, a)
            plan.append((child, parents, op, crossed))
        mine = set(fetch([(c, p) for c, p, _, _ in plan])) if fetch is not None else None
        for child, parents, op, crossed in plan:
            if mine is not None and child not in mine:
                continue
            saved = population.generator
            if noise_seed is not None:
                population.generator = torch.Generator(device=saved.device).manual_seed(
                    child_seed(noise_seed, step, child)
                )
            try:
                if crossed:
                    population.crossover_(op, [list(parents)], [child], fitnesses=keys, optimizer=optimizer)
                else:  # a copy (the average of a parent with itself is the parent exactly), then mutated
                    population.crossover_("average", [list(parents)], [child], optimizer=optimizer)
                    population.mutate_(op, individuals=[child], epsilon=epsilon)
            finally:
                population.generator = saved
        ratings.reset_(name, children.tolist())
    return ReplacementRecord(
        step,
        name,
        tuple(children.tolist()),
        tuple(p for _, p, _, _ in plan),
        tuple(o for _, _, o, _ in plan),
        tuple(c for _, _, _, c in plan),
        tuple(keys.tolist()),
    )


def child_seed(noise_seed: int, step: int, child: int) -> int:
    """The seed of child ``child``'s operator noise at step ``step`` (a stable 63-bit hash of the three)."""
    import hashlib

    digest = hashlib.sha256(f"populora.child/{int(noise_seed)}/{int(step)}/{int(child)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    if optimizer is None:
        return []
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    return list(optimizer)


def children_of(keys: Tensor, fraction: float) -> Tensor:
    """The slots :func:`replace_` replaces for ranking keys ``keys (P,)``: the bottom ``max(1, floor(gamma P))``."""
    size = keys.numel()
    replaced = max(1, math.floor(fraction * size))
    order = torch.sort(keys.to(torch.float64), descending=True, stable=True).indices
    return order[size - replaced :].sort().values
