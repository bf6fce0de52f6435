"""Population: P individuals as per-individual LoRA adapters on one shared model.

``Population(model, pop_size=P, low_rank=r, lora_targets=[...])`` wraps the
user's model in place (no copy), freezes it, and gives individual ``i`` the
factors ``down[i] (d, r)`` and ``up[i] (e, r)`` on every target layer, so
that the layer computes ``x W^T + b + (x @ down[i]) @ up[i].T``. One forward
routes every row through its own individual (see :mod:`populora.routing`).
Higher fitness is better, everywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import numbers
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import MethodType
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from . import operators as ops
from .checkpoint import atomic_save, load_checkpoint
from .checks import check_bool, check_float, check_index, check_int, check_one_of, check_seed
from .distributed import resolve_device
from .errors import (
    CheckpointError,
    FitnessError,
    InvalidIndexError,
    InvalidTypeError,
    InvalidValueError,
    PopuloraError,
    SpentPopulationError,
)
from .operators import Factors
from .routing import Adapter, RoutedModel, Router, RoutingTarget
from .targets import find_targets, layer_dims

__all__ = ["Population", "SelectionResult"]

NAN_POLICIES = ("raise", "worst")
_FORMAT = "populora.population/1"
_STATE_KEYS = ("config", "downs", "ups", "generator", "generation", "eval_seed")
_CONFIG_KEYS = ("pop_size", "low_rank", "lora_targets")

# The live (not merged, not closed) populations on each base model: the first records the user's
# requires_grad flags, the last one to close gives them back (see Population.close).
_LIVE: weakref.WeakKeyDictionary[nn.Module, weakref.WeakSet] = weakref.WeakKeyDictionary()


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


class Population(nn.Module, RoutedModel):
    """A population of ``pop_size`` individuals: rank-``low_rank`` adapters on shared layers.

    Args:
        model: the base model, wrapped in place and frozen while wrapped
            (its ``requires_grad`` flags come back on merge or close; with
            several populations on one model, when the last of them is
            merged or closed).
        pop_size: ``P >= 2`` individuals.
        low_rank: adapter rank ``r >= 1``; a layer's effective rank is
            ``min(r, d, e)`` (factors keep ``r`` columns, the surplus zero).
        lora_targets: dotted module paths or glob patterns of ``nn.Linear`` /
            ``nn.Embedding`` layers; ``None`` targets every ``nn.Linear``.
            A layer whose weight is tied to another module's (an LM head
            sharing the embedding table) is never a target: ``None`` and
            patterns skip it with a warning, an exact path raises
            (see :mod:`populora.targets`), so a merge always equals the
            routed individual.
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

    Every argument is checked before the model is touched: a constructor
    that raises leaves the model's flags and forwards as they were.
    Python and NumPy numbers (and 0-d tensors) are accepted alike.

    Raises:
        InvalidTypeError: an argument of the wrong type (``seed='abc'``,
            ``dtype='float32'``, ``pop_size=4.0``).
        InvalidValueError: a value out of range (``pop_size=1``, an integer
            ``dtype``).
        TargetNotFoundError: see :func:`populora.targets.find_targets`.

    Initialisation: each target gets a reference weight RMS
    ``w = max(rms(W), 1 / sqrt(d))`` (``d`` its fan-in; the floor is the scale
    ``1/sqrt(d)`` of ``nn.Linear``'s default initialisation bound, so a layer
    whose weight is zero, like a zero-initialised policy head, still gets
    distinct individuals); :attr:`weight_scales` holds them. With
    ``a = sqrt(w / sqrt(r))``, ``down ~ N(0, a^2)`` and
    ``up ~ N(0, (init_scale * a)^2)``, so ``rms(dW) = init_scale * w``: for
    inputs ``x`` with unit-variance isotropic entries the layer's output
    changes by ``init_scale`` relative to ``max(rms(W x), rms(x))``
    (``rms(W x) = rms(W) sqrt(d)``, ``rms(x) = 1``: a layer counts as at
    least as large as its input); for an ``nn.Embedding``, a token's
    embedding changes by ``init_scale`` relative to ``max(rms(W), 1/sqrt(V))``.
    The additive mutations use the same
    reference, so ``epsilon`` is the expected relative change of each
    mutated layer's output per mutation, from a zero adapter as from a
    trained one (see :mod:`populora.operators.mutation`).
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
        # everything is checked before the model is touched (moved, frozen or wrapped)
        if not isinstance(model, nn.Module):
            raise InvalidTypeError(f"`model` must be an nn.Module, got {type(model).__name__}")
        pop_size = check_int("pop_size", pop_size, low=2)
        low_rank = check_int("low_rank", low_rank, low=1)
        seed = check_seed("seed", seed)
        init_scale = check_float("init_scale", init_scale, low=0.0)
        nan_policy = check_one_of("nan_policy", nan_policy, NAN_POLICIES)
        requires_grad = check_bool("requires_grad", requires_grad)
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise InvalidTypeError(f"`dtype` must be None or a torch.dtype (e.g. torch.float32), got "
                                   f"{type(dtype).__name__} {dtype!r}")
        if dtype is not None and not dtype.is_floating_point:
            raise InvalidValueError(f"`dtype` must be a floating-point dtype (adapters are real-valued), got {dtype}")
        if device is not None:
            try:
                torch.device(device)
            except (RuntimeError, TypeError, ValueError):
                raise InvalidValueError(f"`device` must be None, a torch.device or a device string such as 'cpu' or "
                                        f"'cuda:0', got {type(device).__name__} {device!r}") from None
        targets = find_targets(model, lora_targets)
        for name, module in targets.items():
            if dtype is None and not module.weight.dtype.is_floating_point:
                raise InvalidValueError(f"target {name!r} has a {module.weight.dtype} weight; pass a floating-point "
                                        "`dtype` for the adapters")

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
        self._spent = False
        self._synced = False  # LoRA weights broadcast from rank 0 (evaluate_distributed)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

        # Stored transposed, in the layout the routed matmuls read fastest (see routing.Adapter):
        # Linear down (P, r, d), Embedding down (P, V, r), up (P, r, e). factors() gives (P, d, r) / (P, e, r) views.
        self._downs, self._ups = nn.ParameterList(), nn.ParameterList()
        self._embedding = [isinstance(m, nn.Embedding) for m in targets.values()]
        self.ranks: list[int] = []  # effective rank per target
        # reference weight RMS per target: rms(W), floored at the fan-in scale 1/sqrt(d) (rms(W x) >= rms(x))
        self.weight_scales: list[float] = []
        for module, embedding in zip(targets.values(), self._embedding):
            d, e = layer_dims(module)
            rank = min(low_rank, d, e)
            weight = module.weight.detach()
            weight_scale = max(weight.double().square().mean().sqrt().item(), 1 / math.sqrt(d))
            like = {"device": self.device, "dtype": dtype or weight.dtype}
            down = torch.zeros(pop_size, d, low_rank, **like) if embedding else torch.zeros(pop_size, low_rank, d, **like)
            up = torch.zeros(pop_size, low_rank, e, **like)
            self._downs.append(nn.Parameter(down, requires_grad=requires_grad))
            self._ups.append(nn.Parameter(up, requires_grad=requires_grad))
            self.ranks.append(rank)
            self.weight_scales.append(weight_scale)
        self._down_list: list[nn.Parameter] = []  # plain lists, cheap per forward; checked by _stacks()
        self._up_list: list[nn.Parameter] = []
        self._full_rank_adapters: list[Adapter] | None = None
        with torch.no_grad():
            for (down, up), rank, weight_scale in zip(self._full_factors(), self.ranks, self.weight_scales):
                noise = torch.randn(pop_size, down.shape[1] + up.shape[1], rank, generator=self.generator,
                                    device=self.device)
                scale = math.sqrt(weight_scale / math.sqrt(rank))  # balanced: rms(up down^T) = init_scale * w
                down[..., :rank] = scale * noise[:, : down.shape[1]]
                up[..., :rank] = self.init_scale * scale * noise[:, down.shape[1] :]
        # the user's flags: recorded by the first live population on this model, restored by the last
        others = _live_on(model)
        self._base_requires_grad = (dict(others[0]._base_requires_grad) if others else
                                    {name: p.requires_grad for name, p in model.named_parameters()})
        model.requires_grad_(False)
        _LIVE.setdefault(model, weakref.WeakSet()).add(self)
        self._router = Router(targets)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A deep copy (or unpickled copy) of a live population is live on its own model."""
        super().__setstate__(state)
        model = self.__dict__.get("_modules", {}).get("model")
        if not self.__dict__.get("_spent", True) and isinstance(model, nn.Module):
            _LIVE.setdefault(model, weakref.WeakSet()).add(self)

    # ------------------------------------------------------------------ routing

    def forward(
        self,
        *args: Any,
        individual: int | None = None,
        individuals: Sequence[int] | Tensor | None = None,
        all_individuals: bool = False,
        broadcast: bool = False,
        split: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run the model once, each row through its individual's adapters.

        Inputs are tensors or nested tuples / lists / dicts of tensors whose
        leading dim is the batch ``n``; they are moved to the population's
        device. The routing arguments and layouts are those of every routed
        model in populora, described once in :mod:`populora.routing`: at most
        one of ``individual=i``, ``individuals=ids``, ``all_individuals=True``
        (none = the plain base model), ``broadcast=True`` to give every
        routed individual the whole batch. Outputs are ``(m*b, ...)`` rows
        laid out ``(p b)`` (``p*n`` rows for a broadcast batch), in input
        order; ``split=True`` returns ``(m, b, ...)`` instead, the layout of
        :meth:`EggrollES.ask() <populora.EggrollES.ask>`'s individuals.

        Raises:
            RouteError: conflicting arguments, or a batch size that does not
                fit (both sizes named).
            InvalidIndexError: an id out of ``[0, P)``.
        """
        self._check_alive()
        return self._route(args, kwargs, individual=individual, individuals=individuals,
                           all_individuals=all_individuals, broadcast=broadcast, split=split)

    def _routing_target(self) -> RoutingTarget:
        return RoutingTarget(self.model, self._router, self.adapters(), self.pop_size, self.device)

    def forward_factors(
        self,
        factors: Sequence[Factors],
        *args: Any,
        individual: int | None = None,
        individuals: Sequence[int] | Tensor | None = None,
        all_individuals: bool = False,
        broadcast: bool = False,
        split: bool = False,
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
            raise InvalidValueError(f"`factors` must hold one entry per target ({len(self.target_names)}), "
                                    f"got {len(factors)}")
        adapters = [Adapter(down if emb else down.transpose(1, 2), up.transpose(1, 2))
                    for (down, up), emb in zip(factors, self._embedding)]
        target = RoutingTarget(self.model, self._router, adapters, factors[0].down.shape[0], self.device)
        return self._route(args, kwargs, target=target, individual=individual, individuals=individuals,
                           all_individuals=all_individuals, broadcast=broadcast, split=split)

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
        """``{target: dW}`` of one individual, each ``(e, d)`` for Linear, ``(V, e)`` for Embedding.

        Computed in the widest of the adapter's and the weight's dtype, at
        least float32 (a float64 model gets a float64 delta), as
        :meth:`merge_` adds it.

        Raises:
            InvalidIndexError: ``individual`` outside ``[0, P)``.
            InvalidTypeError: ``individual`` is not an integer (Python,
                NumPy or a one-element integer tensor).
        """
        self._check_alive()
        i = self._check_id(individual)
        out = {}
        for name, module, (down, up) in zip(self.target_names, self._targets.values(), self.factors()):
            dtype = _merge_dtype(up.dtype, module.weight.dtype)
            dw = up[i].to(dtype) @ down[i].to(dtype).T  # (e, d)
            out[name] = dw.T if isinstance(module, nn.Embedding) else dw
        return out

    # ------------------------------------------------------------------ fitness

    def check_fitnesses(self, fitnesses: Any) -> Tensor:
        """Validate and return fitnesses as a ``(P,)`` float tensor (higher is better), in their precision.

        A list, tuple or numpy array is converted. The precision is kept:
        float64 input (and Python floats, integers) gives float64, float32
        gives float32, float16 / bfloat16 give float32, booleans are refused
        (float32 throughout on MPS, which has no float64); selection, parent
        selection and the merge's argmax all run in it. NaN (and -inf) raise unless
        ``nan_policy='worst'``, which maps them below the lowest finite
        fitness; +inf always raises.

        Raises:
            FitnessError: not numbers (the type is named), wrong shape (both
                shapes named), non-finite values.
        """
        from .fitness import as_fitnesses

        if fitnesses is None:
            raise FitnessError(f"fitnesses are required: a ({self.pop_size},) tensor, higher is better")
        f = as_fitnesses(fitnesses, "fitnesses")
        if f.dtype == torch.bool:
            raise FitnessError(f"fitnesses must be real numbers, got dtype {f.dtype}")
        wide = f.dtype == torch.float64 or not f.is_floating_point()  # integers: float64 holds them exactly
        dtype = torch.float64 if wide and self.device.type != "mps" else torch.float32
        f = f.to(device=self.device, dtype=dtype)
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
        weight scales from rank 0; the base model is compared by checksum
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
        # weight scales come from the base weights at construction: rank 0's, like the weights
        state = broadcast_object((self.generation, self.eval_seed, self.generator.get_state(), self.weight_scales))
        self.generation, self.eval_seed = state[0], state[1]
        self.generator.set_state(state[2])
        self.weight_scales = list(state[3])
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

    def _num_groups(self, num_groups: Any) -> int:
        num_groups = check_int("num_groups", num_groups, low=1)
        if self.pop_size % num_groups:
            raise InvalidValueError(f"`num_groups` must be an int >= 1 dividing pop_size={self.pop_size}, "
                                    f"got {num_groups!r}")
        return num_groups

    def _group_sizes(self, survive_frac: float, elite_frac: float, num_groups: int) -> tuple[int, int, int]:
        num_groups = self._num_groups(num_groups)
        survive_frac = check_float("survive_frac", survive_frac, low=0, high=1, low_open=True, high_open=True)
        elite_frac = check_float("elite_frac", elite_frac, low=0, high=1, high_open=True)
        m = self.pop_size // num_groups
        survivors = max(1, math.floor(m * survive_frac))
        elites = math.floor(m * elite_frac)
        if elite_frac > 0:
            elites = max(1, elites)
        if survivors >= m:
            raise InvalidValueError(f"`survive_frac={survive_frac}` keeps all {m} individuals of each group; "
                                    "nothing would be replaced (lower it)")
        if elites > survivors:
            raise InvalidValueError(f"`elite_frac={elite_frac}` gives {elites} elites per group but "
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
        g = self.pop_size // m
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
        num_parents_per_child = check_int("num_parents_per_child", num_parents_per_child, low=1)
        culled_ids = self._ids(culled if culled is not None else [], "culled", allow_empty=True)
        if num_children is None:
            num_children = culled_ids.numel()
        num_children = check_int("num_children", num_children, low=0)
        num_groups = self._num_groups(num_groups)
        g, m = num_groups, self.pop_size // num_groups
        alive = torch.ones(self.pop_size, dtype=torch.bool, device=self.device)
        alive[culled_ids] = False
        per_group = alive.view(g, m).sum(1)
        if int(per_group.min()) == 0:
            raise InvalidValueError("no survivors left to be parents: `culled` covers a whole "
                                    + ("island" if g > 1 else "population"))
        if g > 1 and int(per_group.max()) != int(per_group.min()):
            raise InvalidValueError(f"with num_groups={g} every island needs the same number of survivors, got "
                                    f"{per_group.tolist()}")
        if g > 1 and num_children != culled_ids.numel():
            raise InvalidValueError(f"with num_groups={g}, child j replaces culled[j]: `num_children` must equal "
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

        All or nothing: if the operator raises, the children's slots and the
        generator are as they were.
        """
        self._check_alive()
        fn = ops.get_operator("crossover", crossover_type)
        ops.check_options("crossover", crossover_type, type_kwargs)
        parents_t = self._ids(parents, "parents", allow_empty=True, dim=2)
        child_ids = self._ids(children, "children", allow_empty=True)
        if child_ids.numel() != parents_t.shape[0]:
            raise InvalidValueError(f"`children` has {child_ids.numel()} slots but `parents` has "
                                    f"{parents_t.shape[0]} rows")
        if torch.unique(child_ids).numel() != child_ids.numel():
            raise InvalidValueError(f"`children` must be distinct slots, got {child_ids.tolist()}")
        num_groups = self._num_groups(num_groups)
        f = None if fitnesses is None else self.check_fitnesses(fitnesses)
        if child_ids.numel() == 0:
            return
        with self._undo_on_error(child_ids):
            self._crossover(fn, parents_t, child_ids, f, num_groups, type_kwargs)

    def _crossover(self, fn: Callable, parents: Tensor, children: Tensor, fitnesses: Tensor | None, num_groups: int,
                   options: dict) -> None:
        new = fn(self.factors(), parents, fitnesses=fitnesses, generator=self.generator, num_groups=num_groups,
                 **options)
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
        chosen = [Factors(d[ids], u[ids]) for d, u in self.factors()]
        self._write(ids, ops.call_mutation(fn, chosen, epsilon=epsilon, weight_scales=self.weight_scales,
                                           generator=self.generator, **options))

    def _write(self, ids: Tensor, new: Sequence[Factors]) -> None:
        for (down, up), (new_down, new_up) in zip(self.factors(), new):
            down[ids] = new_down.to(down.dtype)  # in place (no .data): a graph built before sees the change
            up[ids] = new_up.to(up.dtype)

    @contextlib.contextmanager
    def _undo_on_error(self, ids: Tensor, generator_state: Tensor | None = None) -> Iterator[None]:
        """If the body raises, put back the adapters of ``ids``, the generator and the counters.

        ``generator_state``: the state to roll back to (default: the state on entry).
        """
        if generator_state is None:
            generator_state = self.generator.get_state()
        counters = (self.generation, self.eval_seed)
        saved = [(down[ids].clone(), up[ids].clone()) for down, up in self._full_factors()]
        try:
            yield
        except BaseException:
            with torch.no_grad():
                for (down, up), (old_down, old_up) in zip(self._full_factors(), saved):
                    down[ids] = old_down
                    up[ids] = old_up
            self.generator.set_state(generator_state)
            self.generation, self.eval_seed = counters
            raise

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

        All or nothing: if any step raises (a user-registered operator, say),
        the adapters, the generator, ``generation`` and ``eval_seed`` are
        exactly as before the call, so a retry (or an untouched twin) gives
        the same generation bit for bit.
        """
        self._check_alive()
        kinds = (("selection", selection_type, selection_kwargs), ("parent_selection", parent_selection_type, parent_kwargs),
                 ("crossover", crossover_type, crossover_kwargs), ("mutation", mutation_type, mutation_kwargs))
        for kind, name, options in kinds:
            ops.get_operator(kind, name)
            ops.check_options(kind, name, options or {})
        epsilon = _check_epsilon(epsilon)
        num_parents_per_child = check_int("num_parents_per_child", num_parents_per_child, low=1)
        f = self.check_fitnesses(fitnesses)
        self._group_sizes(survive_frac, elite_frac, num_groups)
        num_groups = self._num_groups(num_groups)

        generator_state = self.generator.get_state()
        try:  # selection writes no adapter, only draws
            result = self.select(selection_type, f, survive_frac, elite_frac, num_groups, **(selection_kwargs or {}))
        except BaseException:
            self.generator.set_state(generator_state)
            raise
        culled = result.selected_out_indices
        with self._undo_on_error(culled, generator_state):  # e.g. a crossover needing another parent count
            parents = self.select_parents(parent_selection_type, f, culled.numel(), culled, num_parents_per_child,
                                          num_groups, **(parent_kwargs or {}))
            if culled.numel():
                self._crossover(ops.get_operator("crossover", crossover_type), parents, culled, f, num_groups,
                                crossover_kwargs or {})
            self._mutate(ops.get_operator("mutation", mutation_type), culled, epsilon, mutation_kwargs or {})
        self.generation += 1
        self.eval_seed += 1
        return result

    # ------------------------------------------------------------------ merge

    @torch.no_grad()
    def merge_(self, individual: int) -> nn.Module:
        """Write individual ``i``'s adapters into the model's weights and hand the model back.

        ``W += up_i down_i^T`` in place, computed in the widest of the adapter's and the
        weight's dtype (at least float32) and rounded once into the weight's dtype, so the
        merged model computes what the routed individual did (to that dtype's rounding).
        Then as :meth:`close`: the wrapped forwards are removed and the model's
        ``requires_grad`` flags restored (by the last live population on the model). The
        population is spent afterwards.

        Raises:
            InvalidIndexError: ``individual`` outside ``[0, P)`` (nothing changes).
        """
        self._check_alive()
        i = self._check_id(individual)
        for module, dw in zip(self._targets.values(), self.delta_weight(i).values()):
            weight = module.weight
            weight.copy_(weight.to(dw.dtype) + dw)
        self.close()
        return self.model

    def close(self) -> nn.Module:
        """Unwrap the model without merging: its own forwards and ``requires_grad`` flags come back.

        The population is spent afterwards (as after :meth:`merge_`). Returns the model.

        Several populations on one model: each restores its own wrappers (a
        wrapper another population wrapped again stays a pass-through until
        that one closes too); the model stays frozen while any of them is
        live, and the last to close (or merge) gives back the flags the
        model had before the first one, whatever the order.
        """
        if not self._spent:
            self._router.remove()
            _unwind(self._targets.values())
            self._spent = True
            live = _LIVE.get(self.model)
            if live is not None:
                live.discard(self)
            if not _live_on(self.model):
                for name, param in self.model.named_parameters():
                    param.requires_grad_(self._base_requires_grad.get(name, True))
        return self.model

    def select_and_merge_best_(self, fitnesses: Any) -> nn.Module:
        """Merge ``argmax(fitnesses)`` (higher is better) and return the plain model."""
        self._check_alive()
        f = self.check_fitnesses(fitnesses)
        return self.merge_(int(torch.argmax(f)))

    # ------------------------------------------------------------------ save / load

    def state(self) -> dict[str, Any]:
        """Everything an exact resume needs, except the base model (tensors and plain values).

        A snapshot: every tensor is a CPU copy that shares no storage with the
        live adapters, so ``saved = pop.state(); pop.mutate_(...);
        pop.load_state(saved)`` restores the population exactly.
        Stacks are in the stored layout: ``downs[t]`` ``(P, r, d)`` for
        Linear, ``(P, V, r)`` for Embedding; ``ups[t]`` ``(P, r, e)``.
        """
        self._check_alive()
        return {
            "format": _FORMAT,
            "config": {"pop_size": self.pop_size, "low_rank": self.low_rank, "seed": self.seed,
                       "init_scale": self.init_scale, "nan_policy": self.nan_policy,
                       "lora_targets": list(self.target_names)},
            "downs": [d.detach().to("cpu", copy=True) for d in self._downs],
            "ups": [u.detach().to("cpu", copy=True) for u in self._ups],
            "generator": self.generator.get_state().clone(),
            "generation": self.generation,
            "eval_seed": self.eval_seed,
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`: all or nothing.

        The whole state is checked first (format, every key, the config
        against this population, every stack's shape and dtype, the counters
        and the generator state); only then is anything written.

        Raises:
            CheckpointError: naming the missing or wrong key and what was
                expected; the population is unchanged.
        """
        self._check_alive()
        _check_state(state)
        config = state["config"]
        mine = {"pop_size": self.pop_size, "low_rank": self.low_rank, "lora_targets": list(self.target_names)}
        for key, value in mine.items():
            if config[key] != value:
                raise CheckpointError(f"checkpoint has {key}={config[key]!r}, this population has {value!r}")
        for kind, params in (("downs", self._downs), ("ups", self._ups)):
            saved_list = state[kind]
            if len(saved_list) != len(params):
                raise CheckpointError(f"checkpoint `{kind}` holds {len(saved_list)} stacks, this population has "
                                      f"{len(params)} targets")
            for name, param, saved in zip(self.target_names, params, saved_list):
                if saved.shape != param.shape:
                    raise CheckpointError(f"checkpoint {kind[:-1]} adapter of {name!r} has shape "
                                          f"{tuple(saved.shape)}, expected {tuple(param.shape)}")
        generator = _restore_generator(state["generator"], self.device)
        with torch.no_grad():
            for param, saved in zip([*self._downs, *self._ups], [*state["downs"], *state["ups"]]):
                param.copy_(saved)
        self.generator = generator
        self.generation = int(state["generation"])
        self.eval_seed = int(state["eval_seed"])
        self.nan_policy = config.get("nan_policy", self.nan_policy)

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint atomically (temp file + rename); the base model is not saved.

        Returns:
            The ``Path`` written.
        """
        return atomic_save(self.state(), path, kind="Population")

    def load(self, path: str | Path) -> None:
        """Resume from :meth:`save`'s checkpoint: adapters, generator, generation, eval seed.

        Raises:
            FileNotFoundError: nothing at ``path``.
            CheckpointError: the file is empty, truncated, corrupted, of
                another kind, or does not fit this population (the file is
                named); the population is unchanged.
        """
        state = load_checkpoint(path, kind="Population")
        with _naming(path):
            self.load_state(state)

    @classmethod
    def from_checkpoint(cls, path: str | Path, model: nn.Module, **kwargs: Any) -> Population:
        """Build a population around ``model`` from a checkpoint (``kwargs`` as the constructor's).

        The file and its state are checked before ``model`` is touched; if the
        state then does not fit the model, the population is closed again (the
        model's forwards and flags come back) before the error is raised.

        Raises:
            FileNotFoundError: nothing at ``path``.
            CheckpointError: the file is damaged, of another kind, or does not
                fit ``model`` (the file is named).
        """
        state = load_checkpoint(path, kind="Population")
        with _naming(path):
            _check_state(state)
        config = dict(state["config"])
        config.update(kwargs)
        pop = cls(model, config.pop("pop_size"), config.pop("low_rank"), config.pop("lora_targets"), **config)
        try:
            with _naming(path):
                pop.load_state(state)
        except BaseException:
            pop.close()
            raise
        return pop

    # ------------------------------------------------------------------ helpers

    def _check_alive(self) -> None:
        if self._spent:
            raise SpentPopulationError("this population was merged into its model (merge_ / "
                                       "select_and_merge_best_) and cannot be used any more")

    def _check_id(self, individual: Any, name: str = "individual") -> int:
        """An id in ``[0, P)``: Python or NumPy integer, or a one-element integer tensor."""
        if isinstance(individual, Tensor) and individual.numel() == 1:
            individual = individual.reshape(())
        return check_index(name, individual, self.pop_size)

    def _ids(self, ids: Any, name: str, *, allow_empty: bool = False, dim: int = 1) -> Tensor:
        """``ids`` as an int64 tensor of ``dim`` dims on the population's device, every id in ``[0, P)``."""
        shape = "1-D list or integer tensor of ids" if dim == 1 else "(num_children, k) integer table of ids"
        try:
            t = torch.as_tensor(ids, device=self.device)
        except (TypeError, ValueError, RuntimeError):
            raise InvalidTypeError(f"`{name}` must be a {shape}, got {type(ids).__name__} {ids!r}") from None
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise InvalidTypeError(f"`{name}` must hold integer ids, got dtype {t.dtype}")
        if t.dim() != dim or (t.numel() == 0 and not allow_empty):
            raise InvalidValueError(f"`{name}` must be a {shape}, got shape {tuple(t.shape)}")
        t = t.long()
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.pop_size):
            bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
            raise InvalidIndexError(f"`{name}` holds id {bad}, out of range [0, {self.pop_size})")
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

    @property
    def floors(self) -> list[float]:
        """Deprecated: the per-target factor scale ``sqrt(w / sqrt(r))`` of :attr:`weight_scales`."""
        warnings.warn("`Population.floors` is deprecated; use `weight_scales` (the reference weight RMS per "
                      "target; the old floor is sqrt(weight_scale / sqrt(rank)))", DeprecationWarning, stacklevel=2)
        return [math.sqrt(w / math.sqrt(r)) for w, r in zip(self.weight_scales, self.ranks)]

    def extra_repr(self) -> str:
        return (f"pop_size={self.pop_size}, low_rank={self.low_rank}, targets={self.target_names}, "
                f"generation={self.generation}")


def _merge_dtype(adapter: torch.dtype, weight: torch.dtype) -> torch.dtype:
    """The dtype a delta is computed in: the widest of the adapter's and the weight's, at least float32."""
    return torch.promote_types(torch.promote_types(adapter, weight), torch.float32)


def _live_on(model: nn.Module) -> list[Population]:
    """The populations wrapping ``model`` that are neither merged nor closed."""
    return [pop for pop in _LIVE.get(model, ()) if not pop._spent]


def _unwind(modules: Any) -> None:
    """Drop the wrappers of removed routers left on top of each module's forward chain.

    A router that is removed while another one wraps its wrapper leaves it in
    the chain as a pass-through; once the outer wrapper is removed too, the
    pass-through is the module's forward. Peel such wrappers until a live one
    (or the class's forward) is on top.
    """
    for module in modules:
        while True:
            forward = vars(module).get("forward")
            owner = getattr(getattr(forward, "func", None), "__self__", None)
            if not (isinstance(forward, partial) and isinstance(owner, Router) and owner._removed
                    and len(forward.args) >= 2):
                break
            inner = forward.args[1]  # Router wraps as partial(router._forward, i, inner, module)
            if isinstance(inner, MethodType) and inner.__self__ is module and inner.__func__ is type(module).forward:
                del module.forward
            else:
                module.forward = inner


@contextlib.contextmanager
def _naming(path: str | Path) -> Iterator[None]:
    """Re-raise a CheckpointError about a loaded state with the file it came from."""
    try:
        yield
    except CheckpointError as err:
        raise CheckpointError(f"checkpoint {str(path)!r}: {err}") from err


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_state(state: Any) -> None:
    """Everything in a :meth:`Population.state` dict that can be checked without a population.

    Raises:
        CheckpointError: naming the missing or wrong key.
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(f"a population state must be a dict (from Population.state()), got "
                              f"{type(state).__name__}")
    if state.get("format") != _FORMAT:
        raise CheckpointError(f"not a populora population state: 'format' is {state.get('format')!r}, "
                              f"expected {_FORMAT!r}")
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"the population state lacks the key(s) {missing} (a complete state has "
                              f"{list(_STATE_KEYS)})")
    config = state["config"]
    if not isinstance(config, Mapping):
        raise CheckpointError(f"the state's 'config' must be a dict, got {type(config).__name__}")
    missing = [key for key in _CONFIG_KEYS if key not in config]
    if missing:
        raise CheckpointError(f"the state's 'config' lacks the key(s) {missing}")
    for key, low in (("pop_size", 2), ("low_rank", 1)):
        if not _is_int(config[key]) or config[key] < low:
            raise CheckpointError(f"the state's config {key!r} must be an int >= {low}, got {config[key]!r}")
    targets = config["lora_targets"]
    if not isinstance(targets, (list, tuple)) or not targets or not all(isinstance(t, str) for t in targets):
        raise CheckpointError(f"the state's config 'lora_targets' must be a non-empty list of str, got {targets!r}")
    try:
        if "seed" in config:
            check_seed("seed", config["seed"])
        if "init_scale" in config:
            check_float("init_scale", config["init_scale"], low=0.0)
        if "nan_policy" in config:
            check_one_of("nan_policy", config["nan_policy"], NAN_POLICIES)
    except PopuloraError as err:
        raise CheckpointError(f"the state's config: {err}") from None
    for kind in ("downs", "ups"):
        stacks = state[kind]
        if not isinstance(stacks, (list, tuple)) or len(stacks) != len(targets):
            raise CheckpointError(f"the state's {kind!r} must be a list of one tensor per target "
                                  f"({len(targets)}), got {type(stacks).__name__}"
                                  + (f" of {len(stacks)}" if isinstance(stacks, (list, tuple)) else ""))
        for name, t in zip(targets, stacks):
            if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() != 3:
                got = f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
                raise CheckpointError(f"the state's {kind!r} entry of {name!r} must be a 3-D floating-point "
                                      f"tensor, got {got}")
            if t.shape[0] != config["pop_size"]:
                raise CheckpointError(f"the state's {kind!r} entry of {name!r} holds {t.shape[0]} individuals, "
                                      f"its config says pop_size={config['pop_size']}")
    for key in ("generation", "eval_seed"):
        if not _is_int(state[key]) or (key == "generation" and state[key] < 0):
            raise CheckpointError(f"the state's {key!r} must be an int" + (" >= 0" if key == "generation" else "")
                                  + f", got {state[key]!r}")
    generator = state["generator"]
    if not isinstance(generator, Tensor) or generator.dtype != torch.uint8 or generator.dim() != 1:
        got = f"{generator.dtype} tensor of shape {tuple(generator.shape)}" if isinstance(generator, Tensor) else (
            type(generator).__name__)
        raise CheckpointError(f"the state's 'generator' must be a 1-D uint8 tensor (torch.Generator.get_state()), "
                              f"got {got}")


_CUDA_GENERATOR_STATE_BYTES = 16  # Philox: seed (8 bytes) and offset (8 bytes)


def _restore_generator(saved: Tensor, device: torch.device) -> torch.Generator:
    """A generator on ``device`` in the saved state; the state is checked, never trusted.

    A state saved on another device type cannot be set; the generator is then
    seeded from a hash of it (deterministic, with a warning). A state of no
    known size (truncated or damaged) raises.
    """
    generator = torch.Generator(device=device)
    own = generator.get_state().numel()
    if saved.numel() == own:
        try:
            generator.set_state(saved.cpu())
        except (RuntimeError, TypeError) as err:
            raise CheckpointError(f"the state's 'generator' is not a valid {device.type} generator state: "
                                  f"{err}") from None
        return generator
    other = {torch.Generator().get_state().numel(), _CUDA_GENERATOR_STATE_BYTES} - {own}
    if saved.numel() not in other:
        raise CheckpointError(f"the state's 'generator' holds {saved.numel()} bytes, which is no generator state "
                              f"(a {device.type} generator's has {own}): it is truncated or damaged")
    seed = int.from_bytes(hashlib.sha256(saved.cpu().numpy().tobytes()).digest()[:8], "little")
    generator.manual_seed(seed)
    warnings.warn(f"the checkpoint's generator state ({saved.numel()} bytes) is for another device type than "
                  f"{device}; reseeded from it, so the run continues deterministically but not bit-identically",
                  stacklevel=3)
    return generator


def _check_epsilon(epsilon: Any) -> float:
    """``epsilon`` as a float >= 0: the same check (and error class) as the mutation operators'."""
    return ops.mutation.check_epsilon(epsilon)
