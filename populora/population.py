"""Population: P individuals as per-individual LoRA adapters on one shared model.

``Population(model, pop_size=P, low_rank=r, lora_targets=[...])`` wraps the
user's model in place (no copy), freezes it, and gives individual ``i`` the
factors ``down[i] (d, r)`` and ``up[i] (e, r)`` on every target layer, so
that the layer computes ``x W^T + b + (x @ down[i]) @ up[i].T``. One forward
routes every row through its own individual (see :mod:`populora.routing`).
Higher fitness is better, everywhere.
"""

from __future__ import annotations

import hashlib
import math
import operator
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from . import operators as ops
from .checkpoint import atomic_save, load_checkpoint
from .distributed import resolve_device
from .errors import FitnessError, SpentPopulationError
from .operators import Factors
from .routing import Adapter, Router, routed_call
from .targets import find_targets, layer_dims

__all__ = ["Population", "SelectionResult"]

NAN_POLICIES = ("raise", "worst")


class SelectionResult(NamedTuple):
    """Result of :meth:`Population.select` (all int64 population ids).

    Attributes:
        selected_in_indices: survivors ``(S*G,)``, elites first.
        selected_out_indices: culled ids ``(P - S*G,)``, ascending: the slots children replace.
        elite_indices: elites ``(E*G,)``, a subset of the survivors, never modified by ``evolve_``.
    """

    selected_in_indices: Tensor
    selected_out_indices: Tensor
    elite_indices: Tensor


def _check_fraction(name: str, value: float, low: float, high: float, *, low_open: bool, high_open: bool) -> None:
    ok_low = value > low if low_open else value >= low
    ok_high = value < high if high_open else value <= high
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (ok_low and ok_high):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"`{name}` must be a number in {interval}, got {value!r}")


class Population(nn.Module):
    """A population of ``pop_size`` individuals: rank-``low_rank`` adapters on shared layers.

    Args:
        model: the base model, wrapped in place and frozen while wrapped
            (its ``requires_grad`` flags come back on merge).
        pop_size: ``P >= 2`` individuals.
        low_rank: adapter rank ``r >= 1``; a layer's effective rank is
            ``min(r, d, e)`` (factors keep ``r`` columns, the surplus zero).
        lora_targets: dotted module paths or glob patterns of ``nn.Linear`` /
            ``nn.Embedding`` layers; ``None`` targets every ``nn.Linear``.
        seed: seeds the population's own ``torch.Generator``: initial
            adapters and every operator draw. No global RNG is touched.
        device: where the model and adapters live; by default the model's
            device, or ``cuda:(local_rank % device_count)`` under torchrun.
        dtype: adapter dtype; defaults to each target weight's dtype.
        init_scale: expected relative change of each target layer's output
            at initialisation (default 0.1, so the individuals differ from
            generation 0); ``0`` starts every individual exactly at the base
            model (``up = 0``), as a pretrained LLM wants.
        nan_policy: ``'raise'`` (NaN fitness is an error) or ``'worst'`` (NaN
            becomes the lowest fitness, so it can never be an elite).
        requires_grad: make the adapters trainable by backprop.

    Initialisation: with ``w = rms(W)`` of the target weight and
    ``a = sqrt(w / sqrt(r))``, ``down ~ N(0, a^2)`` and
    ``up ~ N(0, (init_scale * a)^2)``, which changes the layer's output by
    ``init_scale`` relative RMS. ``a`` is also the layer's reference scale:
    the floor of RMS-relative mutations (see :mod:`populora.operators`).
    """

    def __init__(
        self,
        model: nn.Module,
        pop_size: int,
        low_rank: int,
        lora_targets: str | Sequence[str] | None = None,
        *,
        seed: int = 0,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        init_scale: float = 0.1,
        nan_policy: str = "raise",
        requires_grad: bool = False,
    ):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be an nn.Module, got {type(model).__name__}")
        if isinstance(pop_size, bool) or not isinstance(pop_size, int) or pop_size < 2:
            raise ValueError(f"`pop_size` must be an int >= 2, got {pop_size!r}")
        if isinstance(low_rank, bool) or not isinstance(low_rank, int) or low_rank < 1:
            raise ValueError(f"`low_rank` must be an int >= 1, got {low_rank!r}")
        if isinstance(init_scale, bool) or not isinstance(init_scale, (int, float)) or not (
            math.isfinite(init_scale) and init_scale >= 0
        ):
            raise ValueError(f"`init_scale` must be a finite number >= 0, got {init_scale!r}")
        if nan_policy not in NAN_POLICIES:
            raise ValueError(f"`nan_policy` must be one of {NAN_POLICIES}, got {nan_policy!r}")
        targets = find_targets(model, lora_targets)

        self.pop_size = pop_size
        self.low_rank = low_rank
        self.seed = seed
        self.init_scale = float(init_scale)
        self.nan_policy = nan_policy
        self.device = resolve_device(device, model)
        self.generation = 0
        self.eval_seed = seed
        self.model = model.to(self.device)
        self.target_names = list(targets)
        self._targets = targets
        self._base_requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
        model.requires_grad_(False)
        self._spent = False
        self._synced = False  # LoRA weights broadcast from rank 0 (evaluate_distributed)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

        # Stored transposed, in the layout the routed matmuls read fastest (see routing.Adapter):
        # Linear down (P, r, d), Embedding down (P, V, r), up (P, r, e). factors() gives (P, d, r) / (P, e, r) views.
        self._downs, self._ups = nn.ParameterList(), nn.ParameterList()
        self._embedding = [isinstance(m, nn.Embedding) for m in targets.values()]
        self.ranks: list[int] = []  # effective rank per target
        self.floors: list[float] = []  # reference factor scale per target
        for module, embedding in zip(targets.values(), self._embedding):
            d, e = layer_dims(module)
            rank = min(low_rank, d, e)
            weight = module.weight.detach()
            scale = math.sqrt(max(weight.float().pow(2).mean().sqrt().item(), 1e-12) / math.sqrt(rank))
            like = {"device": self.device, "dtype": dtype or weight.dtype}
            down = torch.zeros(pop_size, d, low_rank, **like) if embedding else torch.zeros(pop_size, low_rank, d, **like)
            up = torch.zeros(pop_size, low_rank, e, **like)
            self._downs.append(nn.Parameter(down, requires_grad=requires_grad))
            self._ups.append(nn.Parameter(up, requires_grad=requires_grad))
            self.ranks.append(rank)
            self.floors.append(scale)
        self._down_list: list[nn.Parameter] = []  # plain lists, cheap per forward; checked by _stacks()
        self._up_list: list[nn.Parameter] = []
        self._full_rank_adapters: list[Adapter] | None = None
        with torch.no_grad():
            for (down, up), rank, floor in zip(self._full_factors(), self.ranks, self.floors):
                noise = torch.randn(pop_size, down.shape[1] + up.shape[1], rank, generator=self.generator,
                                    device=self.device)
                down[..., :rank] = floor * noise[:, : down.shape[1]]
                up[..., :rank] = self.init_scale * floor * noise[:, down.shape[1] :]
        self._router = Router(targets)

    # ------------------------------------------------------------------ routing

    def forward(
        self,
        *args: Any,
        individual: int | None = None,
        individuals: Sequence[int] | Tensor | None = None,
        all_individuals: bool = False,
        broadcast: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run the model once, each row through its individual's adapters.

        Inputs are tensors or nested tuples / lists / dicts of tensors whose
        leading dim is the batch ``n``; they are moved to the population's
        device. Exactly one routing argument (none = the plain base model):

        - ``individual=i``: all ``n`` rows through individual ``i``.
        - ``all_individuals=True``: ``n == 1`` (or ``broadcast=True``): every
          individual sees the whole batch, output ``p*n`` rows laid out
          ``(p b)``; otherwise ``n`` must be divisible by ``P`` and row block
          ``i`` (``b = n / P`` rows) goes to individual ``i``.
        - ``individuals=ids``: one id per row (any order); a 1-row batch is
          broadcast to each id; ``n`` divisible by ``len(ids)`` is split
          ``(p b)``. Outputs come back in input order.

        Raises:
            RouteError: conflicting arguments, ids out of ``[0, P)``, or a
                batch size that does not fit (both sizes named).
        """
        self._check_alive()
        return routed_call(
            self.model, self._router, self.adapters(), self.pop_size, args, kwargs,
            individual=individual, individuals=individuals, all_individuals=all_individuals,
            broadcast=broadcast, device=self.device,
        )

    def forward_factors(
        self,
        factors: Sequence[Factors],
        *args: Any,
        individual: int | None = None,
        individuals: Sequence[int] | Tensor | None = None,
        all_individuals: bool = False,
        broadcast: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Like :meth:`forward`, but routed through the given stacks instead of the population's.

        Args:
            factors: one ``Factors(down (k, d, r_t), up (k, e, r_t))`` per
                target (as :meth:`factors` returns them, e.g. archived
                champions); ids in the routing arguments index ``k``.
        """
        self._check_alive()
        if len(factors) != len(self.target_names):
            raise ValueError(f"`factors` must hold one entry per target ({len(self.target_names)}), got {len(factors)}")
        adapters = [Adapter(down if emb else down.transpose(1, 2), up.transpose(1, 2))
                    for (down, up), emb in zip(factors, self._embedding)]
        return routed_call(
            self.model, self._router, adapters, factors[0].down.shape[0], args, kwargs,
            individual=individual, individuals=individuals, all_individuals=all_individuals,
            broadcast=broadcast, device=self.device,
        )

    def _stacks(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """The adapter parameters, from lists rebuilt only when a parameter object was swapped
        (``.to()``, ``load_state_dict(assign=True)``, ``torch.func.functional_call``)."""
        downs, ups = self._downs._parameters.values(), self._ups._parameters.values()
        if len(self._down_list) != len(downs) or any(a is not b for a, b in zip(self._down_list, downs)) or any(
            a is not b for a, b in zip(self._up_list, ups)
        ):
            self._down_list, self._up_list = list(downs), list(ups)
            full = all(r == self.low_rank for r in self.ranks)
            self._full_rank_adapters = [Adapter(d, u) for d, u in zip(self._down_list, self._up_list)] if full else None
        return self._down_list, self._up_list

    def adapters(self) -> list[Adapter]:
        """Every target's stacks in the routing layout, cut to the effective rank."""
        downs, ups = self._stacks()
        if self._full_rank_adapters is not None:
            return self._full_rank_adapters
        return [
            Adapter(down, up) if r == self.low_rank else Adapter(down[..., :r] if emb else down[:, :r], up[:, :r])
            for down, up, r, emb in zip(downs, ups, self.ranks, self._embedding)
        ]

    def _full_factors(self) -> list[Factors]:
        return [
            Factors(down if emb else down.transpose(1, 2), up.transpose(1, 2))
            for down, up, emb in zip(*self._stacks(), self._embedding)
        ]

    def factors(self) -> list[Factors]:
        """Per-target factors cut to the effective rank ``r_t``: views ``down (P, d, r_t)``, ``up (P, e, r_t)``.

        Writing into them writes the population's adapters.
        """
        return [Factors(d[..., :r], u[..., :r]) for (d, u), r in zip(self._full_factors(), self.ranks)]

    def delta_weight(self, individual: int) -> dict[str, Tensor]:
        """``{target: dW}`` of one individual, each ``(e, d)`` for Linear, ``(V, e)`` for Embedding."""
        self._check_alive()
        i = self._check_id(individual)
        out = {}
        for name, module, (down, up) in zip(self.target_names, self._targets.values(), self.factors()):
            dw = up[i].float() @ down[i].float().T  # (e, d)
            out[name] = dw.T if isinstance(module, nn.Embedding) else dw
        return out

    # ------------------------------------------------------------------ fitness

    def check_fitnesses(self, fitnesses: Any) -> Tensor:
        """Validate and return fitnesses as a ``(P,)`` float32 tensor (higher is better).

        A list or numpy array is converted. NaN (and -inf) raise unless
        ``nan_policy='worst'``, which maps them below the lowest finite
        fitness; +inf always raises.

        Raises:
            FitnessError: wrong shape (both shapes named), non-finite values.
        """
        if fitnesses is None:
            raise FitnessError(f"fitnesses are required: a ({self.pop_size},) tensor, higher is better")
        f = torch.as_tensor(fitnesses).detach()
        if f.dtype == torch.bool or not (f.is_floating_point() or f.dtype in (torch.int32, torch.int64, torch.int16)):
            raise FitnessError(f"fitnesses must be a float tensor, got dtype {f.dtype}")
        f = f.to(device=self.device, dtype=torch.float32)
        if f.shape != (self.pop_size,):
            raise FitnessError(f"fitnesses must have shape ({self.pop_size},), got {tuple(f.shape)}")
        bad = ~torch.isfinite(f)
        if bad.any():
            ids = bad.nonzero().flatten().tolist()
            if self.nan_policy == "raise" or bool((f == math.inf).any()) or bool(bad.all()):
                raise FitnessError(
                    f"fitnesses must be finite, got {f[bad].tolist()} at ids {ids}"
                    + ("; pass nan_policy='worst' to treat NaN as the lowest fitness" if self.nan_policy == "raise" else "")
                )
            good = f[~bad]
            worst = good.min() - torch.clamp(good.max() - good.min(), min=1.0)
            f = torch.where(bad, worst, f)
        return f

    # ------------------------------------------------------------------ evaluation

    def sync_from_main_rank_(self, sync_base_model: bool = False, *, name: str | None = None) -> None:
        """Make every rank hold rank 0's population (once; a no-op without torch.distributed).

        Broadcasts the adapters, generator state, generation, eval seed and
        mutation floors from rank 0; the base model is compared by checksum
        and, where ranks differ (e.g. each process seeded differently), rank
        0's weights are broadcast with a warning. ``sync_base_model=True``
        broadcasts the base model without checking; ``name`` labels the
        population in warnings and errors. Called by
        :meth:`evaluate_distributed` and by the layers built on it.
        """
        from .distributed import broadcast_object, broadcast_tensors_, is_distributed, sync_if_different_

        self._check_alive()
        if self._synced or not is_distributed():
            return
        of = f" of population {name!r}" if name else ""
        with torch.no_grad():
            broadcast_tensors_([p for stack in self._stacks() for p in stack], what=f"adapters{of} (pop_size, low_rank and "
                               "lora_targets must match on every rank)")
            base = [*self.model.parameters(), *self.model.buffers()]
            if sync_base_model:
                broadcast_tensors_(base, what=f"base model parameters{of}")
            else:
                sync_if_different_(base, f"base model parameters{of}")
        # floors come from the base weights at construction: rank 0's, like the weights
        state = broadcast_object((self.generation, self.eval_seed, self.generator.get_state(), self.floors))
        self.generation, self.eval_seed = state[0], state[1]
        self.generator.set_state(state[2])
        self.floors = list(state[3])
        self._synced = True

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
        from .fitness import evaluate

        self.sync_from_main_rank_(sync_base_model)
        return evaluate(fn, self, self.pop_size).to(self.device)

    # ------------------------------------------------------------------ selection

    def _group_sizes(self, survive_frac: float, elite_frac: float, num_groups: int) -> tuple[int, int, int]:
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1 or self.pop_size % num_groups:
            raise ValueError(f"`num_groups` must be an int >= 1 dividing pop_size={self.pop_size}, got {num_groups!r}")
        _check_fraction("survive_frac", survive_frac, 0, 1, low_open=True, high_open=True)
        _check_fraction("elite_frac", elite_frac, 0, 1, low_open=False, high_open=True)
        m = self.pop_size // num_groups
        survivors = max(1, math.floor(m * survive_frac))
        elites = math.floor(m * elite_frac)
        if elite_frac > 0:
            elites = max(1, elites)
        if survivors >= m:
            raise ValueError(f"`survive_frac={survive_frac}` keeps all {m} individuals of each group; nothing "
                             "would be replaced (lower it)")
        if elites > survivors:
            raise ValueError(f"`elite_frac={elite_frac}` gives {elites} elites per group but "
                             f"`survive_frac={survive_frac}` keeps only {survivors} survivors; elites must survive")
        return m, survivors, elites

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
        rest. Options of the selection type go in ``type_kwargs``.
        """
        self._check_alive()
        fn = ops.get_operator("selection", selection_type)
        ops.check_options("selection", selection_type, type_kwargs)
        f = self.check_fitnesses(fitnesses)
        m, survivors, elites = self._group_sizes(survive_frac, elite_frac, num_groups)
        g = num_groups
        grouped = f.view(g, m)
        order = torch.argsort(grouped, dim=1, descending=True, stable=True)  # (g, m)
        elite_local, rest = order[:, :elites], order[:, elites:]
        if survivors > elites:
            picked = fn(grouped.gather(1, rest), survivors - elites, generator=self.generator, **type_kwargs)
            chosen = torch.cat([elite_local, rest.gather(1, picked.to(rest.device))], dim=1)
        else:
            chosen = elite_local
        base = (torch.arange(g, device=f.device) * m)[:, None]
        keep = torch.zeros(g, m, dtype=torch.bool, device=f.device).scatter_(1, chosen, True)
        culled = (~keep).flatten().nonzero().flatten()
        return SelectionResult((chosen + base).flatten(), culled, (elite_local + base).flatten())

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
        parents come from that slot's island.
        """
        self._check_alive()
        fn = ops.get_operator("parent_selection", selection_type)
        ops.check_options("parent_selection", selection_type, type_kwargs)
        f = self.check_fitnesses(fitnesses)
        if isinstance(num_parents_per_child, bool) or not isinstance(num_parents_per_child, int) or num_parents_per_child < 1:
            raise ValueError(f"`num_parents_per_child` must be an int >= 1, got {num_parents_per_child!r}")
        culled_ids = self._ids(culled if culled is not None else [], "culled", allow_empty=True)
        if num_children is None:
            num_children = culled_ids.numel()
        if isinstance(num_children, bool) or not isinstance(num_children, int) or num_children < 0:
            raise ValueError(f"`num_children` must be an int >= 0, got {num_children!r}")
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1 or self.pop_size % num_groups:
            raise ValueError(f"`num_groups` must be an int >= 1 dividing pop_size={self.pop_size}, got {num_groups!r}")
        g, m = num_groups, self.pop_size // num_groups
        alive = torch.ones(self.pop_size, dtype=torch.bool, device=self.device)
        alive[culled_ids] = False
        per_group = alive.view(g, m).sum(1)
        if int(per_group.min()) == 0:
            raise ValueError("no survivors left to be parents: `culled` covers a whole "
                             + ("island" if g > 1 else "population"))
        if g > 1 and int(per_group.max()) != int(per_group.min()):
            raise ValueError(f"with num_groups={g} every island needs the same number of survivors, got "
                             f"{per_group.tolist()}")
        if g > 1 and num_children != culled_ids.numel():
            raise ValueError(f"with num_groups={g}, child j replaces culled[j]: `num_children` must equal "
                             f"len(culled)={culled_ids.numel()}, got {num_children}")
        survivors = alive.view(g, m).nonzero()[:, 1].view(g, -1)  # (g, s) local ids
        base = (torch.arange(g, device=self.device) * m)[:, None]
        surv_fit = f.view(g, m).gather(1, survivors)
        if g == 1:
            local = fn(surv_fit, num_children, num_parents_per_child, generator=self.generator, **type_kwargs)[0]
            return (survivors + base)[0][local]
        child_group = culled_ids // m
        count = torch.bincount(child_group, minlength=g)
        local = fn(surv_fit, int(count.max()), num_parents_per_child, generator=self.generator, **type_kwargs)
        rank_in_group = torch.zeros_like(child_group)
        for grp in range(g):  # islands are few; children of each island take its first rows
            mask = child_group == grp
            rank_in_group[mask] = torch.arange(int(mask.sum()), device=self.device)
        ids = (survivors + base).gather(1, local.flatten(1)).view_as(local)  # (g, c, k) population ids
        return ids[child_group, rank_in_group]

    # ------------------------------------------------------------------ variation

    @torch.no_grad()
    def crossover_(
        self,
        crossover_type: str,
        parents: Sequence[Sequence[int]] | Tensor,
        children: Sequence[int] | Tensor,
        fitnesses: Any = None,
        num_groups: int = 1,
        **type_kwargs: Any,
    ) -> None:
        """Write child ``j`` into slot ``children[j]``, bred from ``parents[j]`` (in place).

        Args:
            parents: ``(c, k)`` population ids.
            children: ``(c,)`` slots to overwrite (distinct).
            fitnesses: ``(P,)``, needed by fitness-aware types (``xes``,
                ``extrapolative``); higher is better.
        """
        self._check_alive()
        fn = ops.get_operator("crossover", crossover_type)
        ops.check_options("crossover", crossover_type, type_kwargs)
        parents_t = torch.as_tensor(parents, device=self.device)
        if parents_t.dim() != 2 or parents_t.is_floating_point():
            raise ValueError(f"`parents` must be an integer (num_children, k) table of ids, got shape "
                             f"{tuple(parents_t.shape)}")
        self._ids(parents_t.flatten(), "parents", allow_empty=True)
        child_ids = self._ids(children, "children", allow_empty=True)
        if child_ids.numel() != parents_t.shape[0]:
            raise ValueError(f"`children` has {child_ids.numel()} slots but `parents` has {parents_t.shape[0]} rows")
        if torch.unique(child_ids).numel() != child_ids.numel():
            raise ValueError(f"`children` must be distinct slots, got {child_ids.tolist()}")
        f = None if fitnesses is None else self.check_fitnesses(fitnesses)
        if child_ids.numel() == 0:
            return
        new = fn(self.factors(), parents_t.long(), fitnesses=f, generator=self.generator, num_groups=num_groups,
                 **type_kwargs)
        self._write(child_ids, new)

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

        ``epsilon`` is relative: noise scales with the RMS of each
        individual's factor (see :mod:`populora.operators.mutation`).
        """
        self._check_alive()
        fn = ops.get_operator("mutation", mutation_type)
        ops.check_options("mutation", mutation_type, type_kwargs)
        _check_epsilon(epsilon)
        given = (individual is not None) + (individuals is not None) + bool(all_individuals)
        if given != 1:
            raise ValueError("pass exactly one of `individual=`, `individuals=` and `all_individuals=True`")
        if all_individuals:
            ids = torch.arange(self.pop_size, device=self.device)
        elif individual is not None:
            ids = self._ids([self._check_id(individual)], "individual")
        else:
            ids = self._ids(individuals, "individuals", allow_empty=True)
        self._mutate(fn, ids, epsilon, type_kwargs)

    def _mutate(self, fn: Callable, ids: Tensor, epsilon: float, options: dict) -> None:
        ids = torch.unique(ids)
        if ids.numel() == 0:
            return
        chosen = [Factors(d[ids], u[ids]) for d, u in self.factors()]
        self._write(ids, fn(chosen, epsilon=epsilon, floors=self.floors, generator=self.generator, **options))

    def _write(self, ids: Tensor, new: Sequence[Factors]) -> None:
        for (down, up), (new_down, new_up) in zip(self.factors(), new):
            down[ids] = new_down.to(down.dtype)  # in place (no .data): a graph built before sees the change
            up[ids] = new_up.to(up.dtype)

    @torch.no_grad()
    def evolve_(
        self,
        fitnesses: Any,
        *,
        survive_frac: float = 0.5,
        elite_frac: float = 0.1,
        selection_type: str = "deterministic",
        parent_selection_type: str = "tournament",
        crossover_type: str = "average",
        mutation_type: str = "full_gaussian",
        epsilon: float = 0.1,
        num_groups: int = 1,
        num_parents_per_child: int = 2,
        selection_kwargs: dict | None = None,
        parent_kwargs: dict | None = None,
        crossover_kwargs: dict | None = None,
        mutation_kwargs: dict | None = None,
    ) -> SelectionResult:
        """One generation: select -> parents -> crossover into the culled -> mutate children.

        Higher fitness is better. Elites are never modified; survivors keep
        their ids (ids are slots). Every option is validated before anything
        changes. Advances ``generation`` and ``eval_seed`` by one.
        """
        self._check_alive()
        kinds = (("selection", selection_type, selection_kwargs), ("parent_selection", parent_selection_type, parent_kwargs),
                 ("crossover", crossover_type, crossover_kwargs), ("mutation", mutation_type, mutation_kwargs))
        for kind, name, options in kinds:
            ops.get_operator(kind, name)
            ops.check_options(kind, name, options or {})
        _check_epsilon(epsilon)
        _check_int("num_parents_per_child", num_parents_per_child, 1)
        f = self.check_fitnesses(fitnesses)
        self._group_sizes(survive_frac, elite_frac, num_groups)

        generator_state = self.generator.get_state()
        try:
            result = self.select(selection_type, f, survive_frac, elite_frac, num_groups, **(selection_kwargs or {}))
            culled = result.selected_out_indices
            parents = self.select_parents(parent_selection_type, f, culled.numel(), culled, num_parents_per_child,
                                          num_groups, **(parent_kwargs or {}))
            self.crossover_(crossover_type, parents, culled, f, num_groups, **(crossover_kwargs or {}))
        except BaseException:  # e.g. a crossover that needs another parent count: the run stays reproducible
            self.generator.set_state(generator_state)
            raise
        self._mutate(ops.get_operator("mutation", mutation_type), culled, epsilon, mutation_kwargs or {})
        self.generation += 1
        self.eval_seed += 1
        return result

    # ------------------------------------------------------------------ merge

    @torch.no_grad()
    def merge_(self, individual: int) -> nn.Module:
        """Write individual ``i``'s adapters into the model's weights and hand the model back.

        ``W += up_i down_i^T`` in place; the wrapped forwards are removed and the model's
        ``requires_grad`` flags restored. The population is spent afterwards.
        """
        self._check_alive()
        i = self._check_id(individual)
        for module, dw in zip(self._targets.values(), self.delta_weight(i).values()):
            module.weight.add_(dw.to(module.weight.dtype))
        self.close()
        return self.model

    def close(self) -> nn.Module:
        """Unwrap the model without merging: its own forwards and ``requires_grad`` flags come back.

        The population is spent afterwards (as after :meth:`merge_`). Returns the model.
        """
        if not self._spent:
            self._router.remove()
            for name, param in self.model.named_parameters():
                param.requires_grad_(self._base_requires_grad.get(name, True))
            self._spent = True
        return self.model

    def select_and_merge_best_(self, fitnesses: Any) -> nn.Module:
        """Merge ``argmax(fitnesses)`` (higher is better) and return the plain model."""
        self._check_alive()
        f = self.check_fitnesses(fitnesses)
        return self.merge_(int(torch.argmax(f)))

    # ------------------------------------------------------------------ save / load

    def state(self) -> dict[str, Any]:
        """Everything an exact resume needs, except the base model (tensors and plain values)."""
        self._check_alive()
        return {
            "format": "populora.population/1",
            "config": {"pop_size": self.pop_size, "low_rank": self.low_rank, "seed": self.seed,
                       "init_scale": self.init_scale, "nan_policy": self.nan_policy,
                       "lora_targets": list(self.target_names)},
            "downs": [d.detach().cpu() for d in self._downs],
            "ups": [u.detach().cpu() for u in self._ups],
            "generator": self.generator.get_state(),
            "generation": self.generation,
            "eval_seed": self.eval_seed,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` (checked against this population before anything changes)."""
        self._check_alive()
        config = state.get("config", {}) if isinstance(state, dict) else {}
        if not isinstance(state, dict) or state.get("format") != "populora.population/1":
            raise ValueError("not a populora population checkpoint (missing format 'populora.population/1')")
        mine = {"pop_size": self.pop_size, "low_rank": self.low_rank, "lora_targets": list(self.target_names)}
        for key, value in mine.items():
            if config.get(key) != value:
                raise ValueError(f"checkpoint has {key}={config.get(key)!r}, this population has {value!r}")
        for kind, params, saved_list in (("down", self._downs, state["downs"]), ("up", self._ups, state["ups"])):
            for name, param, saved in zip(self.target_names, params, saved_list):
                if saved.shape != param.shape:
                    raise ValueError(f"checkpoint {kind} adapter of {name!r} has shape {tuple(saved.shape)}, "
                                     f"expected {tuple(param.shape)}")
        generator = torch.Generator(device=self.device)
        try:
            generator.set_state(state["generator"])
        except RuntimeError:  # saved on another device type: states do not transfer; reseed from it
            seed = int.from_bytes(hashlib.sha256(state["generator"].numpy().tobytes()).digest()[:8], "little")
            generator.manual_seed(seed)
            warnings.warn(f"the checkpoint's generator state is for another device type than {self.device}; "
                          "reseeded from it, so the run continues deterministically but not bit-identically",
                          stacklevel=2)
        with torch.no_grad():
            for param, saved in zip([*self._downs, *self._ups], [*state["downs"], *state["ups"]]):
                param.copy_(saved)
        self.generator = generator
        self.generation = int(state["generation"])
        self.eval_seed = int(state["eval_seed"])
        self.nan_policy = config.get("nan_policy", self.nan_policy)

    def save(self, path: str | Path) -> None:
        """Write a checkpoint atomically (temp file + rename); the base model is not saved."""
        atomic_save(self.state(), path, kind="Population")

    def load(self, path: str | Path) -> None:
        """Resume from :meth:`save`'s checkpoint: adapters, generator, generation, eval seed."""
        self.load_state(load_checkpoint(path, kind="Population"))

    @classmethod
    def from_checkpoint(cls, path: str | Path, model: nn.Module, **kwargs: Any) -> Population:
        """Build a population around ``model`` from a checkpoint (``kwargs`` as the constructor's)."""
        state = load_checkpoint(path, kind="Population")
        config = dict(state["config"])
        config.update(kwargs)
        pop = cls(model, config.pop("pop_size"), config.pop("low_rank"), config.pop("lora_targets"), **config)
        pop.load_state(state)
        return pop

    # ------------------------------------------------------------------ helpers

    def _check_alive(self) -> None:
        if self._spent:
            raise SpentPopulationError("this population was merged into its model (merge_ / "
                                       "select_and_merge_best_) and cannot be used any more")

    def _check_id(self, individual: Any) -> int:
        if isinstance(individual, Tensor) and individual.numel() == 1 and not individual.is_floating_point():
            individual = int(individual)
        if isinstance(individual, bool) or not hasattr(type(individual), "__index__"):  # int, numpy integer
            raise ValueError(f"individual id must be an int, got {individual!r}")
        individual = operator.index(individual)
        if not 0 <= individual < self.pop_size:
            raise ValueError(f"individual id {individual} is out of range [0, {self.pop_size})")
        return individual

    def _ids(self, ids: Any, name: str, *, allow_empty: bool = False) -> Tensor:
        t = torch.as_tensor(ids, device=self.device)
        if t.dim() != 1 or t.is_floating_point() or t.dtype == torch.bool or (t.numel() == 0 and not allow_empty):
            raise ValueError(f"`{name}` must be a 1-D list or integer tensor of ids, got {ids!r}")
        t = t.long()
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.pop_size):
            bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
            raise ValueError(f"`{name}` holds id {bad}, out of range [0, {self.pop_size})")
        return t

    def _apply(self, fn: Callable, recurse: bool = True) -> Population:
        """``pop.to(device)`` / ``.double()`` move the model and adapters; the generator follows.

        A generator's state cannot cross device types, so on a device change
        the new generator is seeded from a draw of the old one: the run stays
        a deterministic function of the seed and the calls made.
        """
        super()._apply(fn, recurse)
        device = self._stacks()[0][0].device
        if device != self.device:
            seed = int(torch.randint(2**62, (1,), generator=self.generator, device=self.device))
            self.generator = torch.Generator(device=device).manual_seed(seed)
            self.device = device
        return self

    def extra_repr(self) -> str:
        return (f"pop_size={self.pop_size}, low_rank={self.low_rank}, targets={self.target_names}, "
                f"generation={self.generation}")


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"`{name}` must be an int >= {low}, got {value!r}")


def _check_epsilon(epsilon: Any) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"`epsilon` must be a finite number >= 0, got {epsilon!r}")
