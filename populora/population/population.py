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
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from populora.adapters import Adapter, Factors, to_adapter, to_factors
from populora.checks import check_bool, check_float, check_index, check_int, check_one_of, check_seed
from populora.errors import InvalidIndexError, InvalidTypeError, InvalidValueError, SpentPopulationError
from populora.fitness import NAN_POLICIES
from populora.operators.devices import PerDevice
from populora.operators.selection import SelectionResult
from populora.population.adapter_io import AdapterIO
from populora.population.checkpointing import Checkpointing
from populora.population.genetic import Evolvable
from populora.population.optimizer_rows import OptimizerRows
from populora.population.placement import place
from populora.routing import wrapping
from populora.routing.front import RoutedModel
from populora.routing.request import RoutingTarget
from populora.routing.router import Router
from populora.stats import GenerationStats
from populora.targets import find_targets, layer_dims
from populora.transaction import transaction

__all__ = ["Population", "SelectionResult", "evaluating"]


class Population(Checkpointing, AdapterIO, nn.Module, RoutedModel, Evolvable):  # type: ignore[misc]  # state_dict adds include_model= to nn.Module's overloads
    """A population of ``pop_size`` individuals: rank-``low_rank`` adapters on shared layers.

    Args:
        model: the base model, wrapped in place and frozen while wrapped
            (its ``requires_grad`` flags come back on merge or close; with
            several populations on one model, when the last of them is
            merged or closed).
        pop_size: ``P >= 1`` individuals (``P = 1`` is a single LoRA: it routes, trains, saves and
            exports, while selection and crossover need two or more).
        low_rank: adapter rank ``r >= 1``; a layer's effective rank is
            ``min(r, d, e)`` (factors keep ``r`` columns, the surplus zero).
        lora_targets: which ``nn.Linear`` / ``nn.Embedding`` layers get adapters: ``None`` (every
            ``nn.Linear``), or an entry or a list of entries, each a full module path, a dot-free name
            matched as a path suffix as PEFT's ``target_modules`` (``"q_proj"``), an ``fnmatch`` glob,
            ``"all-linear"`` (every linear but the output layer), a compiled ``re.Pattern`` (fullmatch),
            or ``"!"`` + a path, name or glob to exclude (:data:`populora.targets.TARGET_FORMS`).
            A layer whose weight is tied to another module's (an LM head
            sharing the embedding table) is never a target: ``None`` and
            patterns skip it with a warning, an exact path raises
            (see :mod:`populora.targets`), so a merge always equals the
            routed individual.
        seed: seeds the population's own ``torch.Generator``: initial
            adapters and every operator draw. No global RNG is touched.
        device: where the model and adapters live; by default the model's
            device, or ``cuda:(local_rank % device_count)`` under torchrun.
            A model spread over several devices (``device_map="auto"``)
            stays where it is when ``device`` is None: each target's
            adapters go on its weight's device (see :mod:`populora.placement`).
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
        InvalidValueError: a value out of range (``pop_size=0``, an integer
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

    Attributes:
        generation: completed ``evolve_`` steps; ``eval_seed`` advances with it.
        history: one ``GenerationStats(generation, best, mean, std)`` per
            ``evolve_`` (of the fitnesses it was given); ``populora.plot_history(pop)``
            draws it.
        effective_ranks: ``min(low_rank, d, e)`` per target.
        weight_scales: the reference weight RMS ``w`` per target.

    Checkpoints: torch's ``state_dict()`` / ``load_state_dict()`` (base
    weights, adapters, and the generator, counters and history as extra
    state: loading another population's state dict resumes its run bit for
    bit; the load is all or nothing), ``save(path)`` / ``load(path)`` /
    :meth:`from_checkpoint` for files, which hold no base model.

    Adapters in and out (:class:`~populora.population_io.AdapterIO`):
    :meth:`set_factors_` overwrites one individual, :meth:`to_peft` /
    :meth:`load_peft_` write / read one individual as a PEFT LoRA adapter.
    """

    def __init__(
        self,
        model: nn.Module,
        pop_size: int,
        low_rank: int,
        lora_targets: str | re.Pattern[str] | Sequence[str | re.Pattern[str]] | None = None,
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
        pop_size = check_int("pop_size", pop_size, low=1)
        low_rank = check_int("low_rank", low_rank, low=1)
        seed = check_seed("seed", seed)
        init_scale = check_float("init_scale", init_scale, low=0.0)
        nan_policy = check_one_of("nan_policy", nan_policy, NAN_POLICIES)
        requires_grad = check_bool("requires_grad", requires_grad)
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise InvalidTypeError(
                f"`dtype` must be None or a torch.dtype (e.g. torch.float32), got {type(dtype).__name__} {dtype!r}"
            )
        if dtype is not None and not dtype.is_floating_point:
            raise InvalidValueError(f"`dtype` must be a floating-point dtype (adapters are real-valued), got {dtype}")
        if device is not None:
            try:
                torch.device(device)
            except (RuntimeError, TypeError, ValueError):
                raise InvalidValueError(
                    f"`device` must be None, a torch.device or a device string such as 'cpu' or "
                    f"'cuda:0', got {type(device).__name__} {device!r}"
                ) from None
        targets = find_targets(model, lora_targets)
        placement = place(model, targets, device)  # a model spread over devices stays where it is
        for name, module in targets.items():
            if dtype is None and not module.weight.dtype.is_floating_point:
                raise InvalidValueError(
                    f"target {name!r} has a {module.weight.dtype} weight; pass a floating-point "
                    "`dtype` for the adapters"
                )

        self.pop_size = pop_size
        self.low_rank = low_rank
        self.seed = seed
        self.init_scale = float(init_scale)
        self.nan_policy = nan_policy
        self.device = placement.device
        self.generation = 0
        self.eval_seed = seed
        self.history: list[GenerationStats] = []  # one entry per evolve_, see evolve_
        self.model = model if placement.spread else model.to(self.device)
        self.target_names = list(targets)
        self._targets = targets
        self._spent = False
        self._synced = False  # LoRA weights broadcast from rank 0 (evaluate_distributed)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

        # Stored transposed, in the layout the routed matmuls read fastest (see routing.Adapter):
        # Linear down (P, r, d), Embedding down (P, V, r), up (P, r, e). factors() gives (P, d, r) / (P, e, r) views.
        self._downs, self._ups = nn.ParameterList(), nn.ParameterList()
        self._embedding = [isinstance(m, nn.Embedding) for m in targets.values()]
        self.effective_ranks: list[int] = []  # min(low_rank, d, e) per target
        # reference weight RMS per target: rms(W), floored at the fan-in scale 1/sqrt(d) (rms(W x) >= rms(x))
        self.weight_scales: list[float] = []
        for (name, module), embedding in zip(targets.items(), self._embedding):
            d, e = layer_dims(module)
            rank = min(low_rank, d, e)
            weight: Tensor = module.weight.detach()  # type: ignore[operator]  # (a Linear's or an Embedding's)
            weight_scale = max(weight.double().square().mean().sqrt().item(), 1 / math.sqrt(d))
            like: dict[str, Any] = {"device": placement.targets[name], "dtype": dtype or weight.dtype}
            down = (
                torch.zeros(pop_size, d, low_rank, **like) if embedding else torch.zeros(pop_size, low_rank, d, **like)
            )
            up = torch.zeros(pop_size, low_rank, e, **like)
            self._downs.append(nn.Parameter(down, requires_grad=requires_grad))
            self._ups.append(nn.Parameter(up, requires_grad=requires_grad))
            self.effective_ranks.append(rank)
            self.weight_scales.append(weight_scale)
        self._down_list: list[nn.Parameter] = []  # plain lists, cheap per forward; checked by _stacks()
        self._up_list: list[nn.Parameter] = []
        self._full_rank_adapters: list[Adapter] | None = None
        self._sliced_adapters: tuple[list[int], list[Adapter]] | None = None
        with torch.no_grad():
            for (down, up), rank, weight_scale in zip(self._full_factors(), self.effective_ranks, self.weight_scales):
                noise = torch.randn(
                    pop_size, down.shape[1] + up.shape[1], rank, generator=self.generator, device=self.device
                )
                scale = math.sqrt(weight_scale / math.sqrt(rank))  # balanced: rms(up down^T) = init_scale * w
                down[..., :rank] = scale * noise[:, : down.shape[1]]
                up[..., :rank] = self.init_scale * scale * noise[:, down.shape[1] :]
        # the user's flags: recorded by the first live population on this model, restored by the last
        self._base_requires_grad = wrapping.hold(self, model)
        self._router = Router(targets)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A deep copy (or unpickled copy) of a live population is live on its own model."""
        super().__setstate__(state)
        model = self.__dict__.get("_modules", {}).get("model")
        if not self.__dict__.get("_spent", True) and isinstance(model, nn.Module):
            wrapping.register(self, model, self._base_requires_grad)

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
        return self._route(
            args,
            kwargs,
            individual=individual,
            individuals=individuals,
            all_individuals=all_individuals,
            broadcast=broadcast,
            split=split,
        )

    def loop_route(
        self, *, individual: Any = None, individuals: Any = None, all_individuals: bool = False
    ) -> Any | None:
        """A :meth:`route` block standing in for ``pop(x, **routing)`` in a loop that calls the population with the
        same routing many times (an environment loop between two ends of episodes, a decode loop).

        Freshness: weights written inside the block, between two of its forwards, are not seen until the block
        is re-entered; a write made before an entry is always seen (each entry is one scope of prepared work,
        :mod:`populora.routing.prepared`).

        ``with block: out = pop.model(x)`` gives what ``pop(x, **routing)`` gives (``x`` on the population's
        device, ``k`` times the routed rows as in :meth:`route`), without the per-call work of the routing
        front end; its routes are planned once and, without grad, prepared once per entry (per
        :meth:`prepared_scope <populora.routing.front.RoutedModel.prepared_scope>` when one is open around the
        loop, as the environment loop opens one per evaluation). The block routes only while it is entered:
        enter it around each forward.

        Returns:
            The block, or ``None`` when calling the population does more than its routed forward (a
            subclass's or an instance's ``forward``, forward hooks on the population): call it then.
        """
        if (
            type(self).forward is not Population.forward
            or "forward" in vars(self)
            or self._forward_hooks
            or self._forward_pre_hooks
        ):
            return None
        return self.route(individual=individual, individuals=individuals, all_individuals=all_individuals)

    def _routing_target(self) -> RoutingTarget:
        # (self._modules["model"]: Module.__getattr__ costs a microsecond, per forward of a small policy)
        model: nn.Module = self._modules["model"]  # type: ignore[assignment]  # (always set: the wrapped model)
        return RoutingTarget(model, self._router, self.adapters(), self.pop_size, self.device)

    def _block_target(self) -> RoutingTarget:
        self._check_alive()
        return self._routing_target()

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
            raise InvalidValueError(
                f"`factors` must hold one entry per target ({len(self.target_names)}), got {len(factors)}"
            )
        adapters = [to_adapter(f, emb) for f, emb in zip(factors, self._embedding)]
        target = RoutingTarget(self.model, self._router, adapters, factors[0].down.shape[0], self.device)
        return self._route(
            args,
            kwargs,
            target=target,
            individual=individual,
            individuals=individuals,
            all_individuals=all_individuals,
            broadcast=broadcast,
            split=split,
        )

    def _stacks(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """The adapter parameters, from lists rebuilt only when a parameter object was swapped
        (``.to()``, ``load_state_dict(assign=True)``, ``torch.func.functional_call``)."""
        modules: Any = self._modules  # (not self._downs: Module.__getattr__ costs a microsecond a name, per forward)
        downs, ups = modules["_downs"]._parameters.values(), modules["_ups"]._parameters.values()
        if (
            len(self._down_list) != len(downs)
            or not all(map(operator.is_, self._down_list, downs))
            or not all(map(operator.is_, self._up_list, ups))
        ):
            self._down_list, self._up_list = list(downs), list(ups)
            full = all(r == self.low_rank for r in self.effective_ranks)
            self._full_rank_adapters = [Adapter(d, u) for d, u in zip(self._down_list, self._up_list)] if full else None
        return self._down_list, self._up_list

    def adapter_parameters(self) -> list[nn.Parameter]:
        """The adapter parameters: per target ``down`` then, after all of them, per target ``up``.

        Each is stacked over the individuals (first dimension ``P``) in the
        stored layout (Linear ``down (P, r, d)``, Embedding ``down (P, V, r)``,
        ``up (P, r, e)``; :meth:`factors` gives the public views). With
        ``requires_grad=True`` a routed forward and one backward give each
        individual's rows the gradient of its own rows only, so any
        ``torch.optim`` optimizer over these trains every individual at once.
        """
        downs, ups = self._stacks()
        return [*downs, *ups]

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Clip each individual's gradient separately: ``torch.nn.utils.clip_grad_norm_`` per individual.

        Individual ``i``'s gradient is row ``i`` of every adapter parameter's ``.grad``; its norm is taken
        over all of them and, when above ``max_norm``, the rows are scaled by ``max_norm / (norm + 1e-6)``
        (``torch``'s rule). ``torch.nn.utils.clip_grad_norm_`` over :meth:`adapter_parameters` would take
        ONE norm over every individual and couple them.

        Returns:
            ``(P,)`` float32 norms before clipping (``0`` for an individual without gradient).

        Raises:
            InvalidValueError: ``max_norm`` not > 0, or ``norm_type`` not > 0.
        """
        max_norm = check_float("max_norm", max_norm, low=0.0, low_open=True)
        norm_type = (
            float(norm_type)
            if norm_type == float("inf")
            else check_float("norm_type", norm_type, low=0.0, low_open=True)
        )
        grads = [p.grad for p in self.adapter_parameters() if p.grad is not None]
        if not grads:
            return torch.zeros(self.pop_size, device=self.device)
        per = torch.stack([g.detach().flatten(1).float().norm(norm_type, dim=1).to(self.device) for g in grads])
        norms = per.amax(0) if norm_type == float("inf") else per.norm(norm_type, dim=0)  # (P,)
        scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        with torch.no_grad():
            for g in grads:
                g.mul_(scale.to(g.device, g.dtype).view(-1, *[1] * (g.dim() - 1)))
        return norms

    def adapters(self) -> list[Adapter]:
        """Every target's stacks in the routing layout, cut to the effective rank."""
        downs, ups = self._stacks()
        if self._full_rank_adapters is not None:
            return self._full_rank_adapters
        grad = torch.is_grad_enabled()
        key = [p.data_ptr() for p in downs] + [p.data_ptr() for p in ups] if not grad else None
        if key is not None and self._sliced_adapters is not None and self._sliced_adapters[0] == key:
            return self._sliced_adapters[1]  # an env loop's forward: views cut once, not per call
        sliced = [
            Adapter(down, up) if r == self.low_rank else Adapter(down[..., :r] if emb else down[:, :r], up[:, :r])
            for down, up, r, emb in zip(downs, ups, self.effective_ranks, self._embedding)
        ]
        # Only views cut without grad are kept: a view made with grad carries one graph's node, and the
        # storage pointers catch `.to()` / `param.data = ...`, which keep the Parameter but swap its data.
        self._sliced_adapters = (key, sliced) if key is not None else None
        return sliced

    def _full_factors(self) -> list[Factors]:
        return [to_factors(Adapter(down, up), emb) for down, up, emb in zip(*self._stacks(), self._embedding)]

    def factors(self) -> list[Factors]:
        """Per-target factors cut to the effective rank ``r_t``: views ``down (P, d, r_t)``, ``up (P, e, r_t)``.

        Writing into them writes the population's adapters.
        """
        return [Factors(d[..., :r], u[..., :r]) for (d, u), r in zip(self._full_factors(), self.effective_ranks)]

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
            dtype = _merge_dtype(up.dtype, module.weight.dtype)  # type: ignore[arg-type]
            dw = up[i].to(dtype) @ down[i].to(dtype).T  # (e, d)
            out[name] = dw.T if isinstance(module, nn.Embedding) else dw
        return out

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
            weight: Tensor = module.weight  # type: ignore[assignment]  # (a Linear's or an Embedding's)
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
            self._spent = True
            wrapping.release(self, self.model, self._targets.values())
        return self.model

    def select_and_merge_best_(self, fitnesses: Any) -> nn.Module:
        """Merge ``argmax(fitnesses)`` (higher is better) and return the plain model."""
        self._check_alive()
        f = self.validate_fitnesses(fitnesses)
        return self.merge_(int(torch.argmax(f)))

    # ------------------------------------------------------------------ helpers

    def _write(self, ids: Tensor | PerDevice, new: Sequence[Factors]) -> None:
        """Write ``new[t]`` (``down (n, d, r_t)``, ``up (n, e, r_t)``) into rows ``ids (n,)`` of each target.

        Each target is written on its own device: ``ids`` and the new factors
        are moved there (no copy when they are already there).
        """
        per = ids if isinstance(ids, PerDevice) else PerDevice(ids)
        if self._router.prepared is not None:  # (stale entries are never used; this frees their memory now)
            self._router.prepared.clear()
        for (down, up), (new_down, new_up) in zip(self.factors(), new):
            # in place (no .data): a graph built before sees the change
            down[per.on(down.device)] = new_down.to(down.device, down.dtype)
            up[per.on(up.device)] = new_up.to(up.device, up.dtype)

    @contextlib.contextmanager
    def _undo_on_error(
        self, ids: Tensor, generator_state: Tensor | None = None, rows: OptimizerRows | None = None
    ) -> Iterator[None]:
        """If the body raises, put back the adapters of ``ids``, the generator, the counters and (``rows``) the
        optimizer state rows of ``ids`` (one :func:`~populora.transaction.transaction`).

        ``generator_state``: the state to roll back to (default: the state on entry).
        """
        with transaction(_Rows(self, self._full_factors(), ids, generator_state, rows)):
            yield

    @property
    def spent(self) -> bool:
        """Whether the population was merged (:meth:`merge_`) or closed (:meth:`close`): it cannot be used any more."""
        return self._spent

    def _check_alive(self) -> None:
        if self._spent:
            raise SpentPopulationError(
                "this population was merged into its model (merge_ / "
                "select_and_merge_best_) and cannot be used any more"
            )

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
        devices = {down.device for down in self._stacks()[0]}
        device = devices.pop() if len(devices) == 1 else self.device  # (spread over devices: it stays)
        if device != self.device:
            seed = int(torch.randint(2**62, (1,), generator=self.generator, device=self.device))
            self.generator = torch.Generator(device=device).manual_seed(seed)
            self.device = device
        return self

    def __repr__(self) -> str:
        """The public layout: per target the :meth:`factors` shapes ``down (P, d, r_t)``, ``up (P, e, r_t)``.

        The base model is not printed (``pop.model`` is); a merged or closed
        population says so.
        """
        head = f"{type(self).__name__}(pop_size={self.pop_size}, low_rank={self.low_rank}, generation={self.generation}"
        if self._spent:
            return head + ", spent: merged or closed)"
        lines = [head + ", targets={"]
        for name, (down, up), module in zip(self.target_names, self.factors(), self._targets.values()):
            lines.append(
                f"  {name!r}: {type(module).__name__} down {tuple(down.shape)}, up {tuple(up.shape)}, {down.dtype},"
            )
        return "\n".join(lines) + "\n})"


def _merge_dtype(adapter: torch.dtype, weight: torch.dtype) -> torch.dtype:
    """The dtype a delta is computed in: the widest of the adapter's and the weight's, at least float32."""
    return torch.promote_types(torch.promote_types(adapter, weight), torch.float32)


@contextlib.contextmanager
def evaluating(populations: Iterable[Population]) -> Iterator[None]:
    """Every population's model in eval mode under ``torch.no_grad()``; each module's training flag restored."""
    populations = list(populations)
    modules = [mod for pop in populations for mod in pop.modules()]
    flags = [mod.training for mod in modules]
    try:
        for pop in populations:
            pop.eval()
        with torch.no_grad():
            yield
    finally:
        for mod, flag in zip(modules, flags):
            mod.training = flag


class _Rows:
    """Rows ``ids`` of a population's adapters, its generator and counters, and (``rows``) the optimizer state
    rows of ``ids``: one :func:`~populora.transaction.transaction` entry, cheaper than a whole snapshot."""

    def __init__(
        self,
        pop: Population,
        factors: list[Factors],
        ids: Tensor,
        generator_state: Tensor | None,
        rows: OptimizerRows | None,
    ) -> None:
        self.pop, self.factors, self.ids, self.rows = pop, factors, ids, rows
        self.generator_state = generator_state
        self.per = PerDevice(ids)  # each target's rows are saved and put back on that target's device

    def transaction_state(self) -> tuple[Any, ...]:
        per = self.per
        factors = [(d[per.on(d.device)].clone(), u[per.on(u.device)].clone()) for d, u in self.factors]
        generator = self.generator_state if self.generator_state is not None else self.pop.generator.get_state()
        saved_rows = self.rows.save(self.ids) if self.rows else None
        return factors, saved_rows, generator, (self.pop.generation, self.pop.eval_seed)

    def restore_transaction_state(self, state: tuple[Any, ...]) -> None:
        factors, saved_rows, generator, counters = state
        with torch.no_grad():
            for (down, up), (old_down, old_up) in zip(self.factors, factors):
                down[self.per.on(down.device)] = old_down
                up[self.per.on(up.device)] = old_up
        if self.rows and saved_rows is not None:
            self.rows.restore(self.ids, saved_rows)
        self.pop.generator.set_state(generator)
        self.pop.generation, self.pop.eval_seed = counters
