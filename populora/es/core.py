"""EggrollES: EggRoll evolution strategies on the routed low-rank path.

EGGROLL (arXiv 2511.16652, "Evolution Strategies at the Hyperscale") is
OpenAI-style ES whose perturbation of each weight matrix is low rank, so a
whole population runs in one batched forward at close to the cost of plain
inference. Higher fitness is better.

Each generation, member ``i`` (pair ``k``, sign ``s_i``) computes with
``W + sigma * s_i * A_k B_k^T / sqrt(r)`` on every selected matrix and
``b + sigma * s_i * eps_k`` on every selected bias. The factors are
regenerated from ``(seed, name, generation // noise_reuse)``
(:mod:`populora.es.noise`); inside the model they are adapters of the routing
layer (:mod:`populora.routing`), with ``sigma * s_i / sqrt(r)`` folded into
``down``. The update ``g = sqrt(N) * mean_i(z_i * sigma * E_i)`` is computed
from the factors with one matmul per matrix and written as
``param.grad = -g`` for a ``torch.optim`` optimizer (default
``SGD(lr)``: ``theta += lr * g``, torcheggroll's update).
"""

from __future__ import annotations

import copy
import math
import numbers
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .. import distributed as pd
from ..checkpoint import atomic_save, load_checkpoint
from ..checks import check_bool, check_float, check_index, check_int, check_seed
from ..errors import CheckpointError, ConfigMismatchError, InvalidTypeError, InvalidValueError, PopuloraError
from ..fitness import evaluate as evaluate_fitness
from ..routing import Adapter
from .factors import MemberFactors, compute_dtype
from .members import ESRouter, Members, _leading, map_tensors, member_losses, split_members
from .noise import PairNoise
from .params import ESParam, select_params
from .shaping import FITNESS_SHAPINGS, check_es_fitnesses, group_table, shape_fitness

__all__ = ["ESStats", "EggrollES"]

_FORMAT = "populora.es/1"


class ESStats(NamedTuple):
    """What :meth:`EggrollES.tell` reports (raw fitnesses; higher is better).

    Attributes:
        generation: the generation that was evaluated.
        best: its best fitness.  mean: its mean fitness.  worst: its worst fitness.
        best_ever: best fitness of any member so far.
        grad_norm: L2 norm of the ES gradient ``g`` over all selected parameters.
    """

    generation: int
    best: float
    mean: float
    worst: float
    best_ever: float
    grad_norm: float


class EggrollES:
    """Evolution strategies with low-rank (EggRoll) perturbations, evaluated in one routed forward.

    The model is trained in place. Higher fitness is better; a loss is
    negated by :meth:`step`. Usage::

        es = EggrollES(model, pop_size=256, sigma=0.05, lr=0.1, rank=4)
        for _ in range(100):
            stats = es.step(x, loss_fn, y)          # or: members = es.ask(); ...; es.tell(fitnesses)

    Args:
        model: the ``nn.Module`` to optimise (its selected parameters change in place).
        pop_size: ``N`` members per generation (even when ``antithetic``).
        sigma: noise scale: member ``i`` uses ``W + sigma * E_i``.
        lr: learning rate of the default optimizer ``SGD(lr)``; ignored when
            ``optimizer`` is given (pass ``None`` then).
        rank: rank ``r`` of each matrix perturbation (per matrix ``min(r, R, C)``).
        seed: the noise seed: same seed, same noise, on every rank.
        antithetic: mirrored pairs: member ``i + N/2`` uses ``-E_i``.
        fitness_shaping: ``'zscore'`` (``(f - mean) / (std + 1e-8)``),
            ``'centered_rank'``, ``'center'`` (``f - mean``), ``'raw'``, or a
            function mapping ``(groups, m)`` fitnesses to weights along the last dim.
        group_size: shape fitness within groups of ``G`` members (members that
            share a prompt); see :meth:`groups` for which members form a group.
        optimizer: a ``torch.optim.Optimizer`` over (at least) the selected
            parameters, or a function ``params -> Optimizer``; default ``SGD(params, lr)``.
            Any LR scheduler built on :attr:`optimizer` works.
        param_filter: which parameters to evolve, among those that require
            grad: ``fn(name, param) -> bool`` or ``fn(name) -> bool`` (told
            apart by the number of required positional parameters).
        noise_reuse: reuse each noise for this many generations (noise epoch
            ``generation // noise_reuse``); 1 gives fresh noise every generation.
        perturb_vectors: give biases full Gaussian noise; ``False`` freezes
            every 1-D parameter (biases, norm gains) instead.
        perturb_unroutable: also perturb the selected parameters the routed
            forward cannot reach (a bare ``nn.Parameter`` used in any
            expression, a norm gain, a convolution kernel, the projections of
            ``nn.MultiheadAttention``), through the ``functional_call``
            fallback (see below). Default ``False``: they are frozen, with one
            warning naming them.
        device: where the model and noise live; default the model's device, or
            ``cuda:(local_rank % device_count)`` under torchrun.

    How :meth:`ask` evaluates the members: ``nn.Linear`` weights and biases
    and ``nn.Embedding`` weights are perturbed by the routed forward, ONE
    batched forward over every member's rows. With ``perturb_unroutable=True``
    and a model that has unroutable parameters, the model is instead called
    once per member with ``torch.func.functional_call`` and that member's
    values of the unroutable parameters (materialised, ``(m, *shape)``; low
    rank noise for a 2-D parameter, full Gaussian otherwise), vectorised over
    the members with ``torch.func.vmap`` (a Python loop when the model is not
    vmap-safe); inside each call the Linear / Embedding perturbations stay low
    rank. Seeding, antithetic pairs, shaping, the update and checkpoints are
    the same for both kinds of parameter; a tied parameter is one parameter
    with one perturbation.

    Raises:
        InvalidValueError: (a ``ValueError``) a bad value (named), odd
            ``pop_size`` with ``antithetic``, or no parameter selected.
        InvalidTypeError: (a ``TypeError``) ``model`` is not an ``nn.Module``,
            an argument of the wrong type, ``optimizer`` of the wrong type.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> es = EggrollES(nn.Linear(3, 1), pop_size=8, sigma=0.1, lr=0.1, rank=1)
        >>> stats = es.step(torch.ones(4, 3), lambda out, y: (out - y).square().mean(), torch.zeros(4, 1))
        >>> stats.generation, es.generation, es.ask()(torch.ones(4, 3)).shape
        (0, 1, torch.Size([8, 4, 1]))
    """

    _KIND = "EggrollES"  # the checkpoint kind of save() / load()

    def __init__(
        self,
        model: nn.Module,
        pop_size: int,
        sigma: float,
        lr: float | None,
        rank: int,
        *,
        seed: int = 0,
        antithetic: bool = True,
        fitness_shaping: str | Callable[[Tensor], Tensor] = "zscore",
        group_size: int | None = None,
        optimizer: torch.optim.Optimizer | Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
        param_filter: Callable[..., bool] | None = None,
        noise_reuse: int = 1,
        perturb_vectors: bool = True,
        perturb_unroutable: bool = False,
        device: str | torch.device | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise InvalidTypeError(f"`model` must be an nn.Module, got {type(model).__name__}")
        pop_size = check_int("pop_size", pop_size, low=2)
        antithetic = check_bool("antithetic", antithetic)
        if antithetic and pop_size % 2:
            raise InvalidValueError(f"pop_size must be even when using antithetic sampling, got pop_size={pop_size}")
        sigma = check_float("sigma", sigma, low=0.0, low_open=True)
        if lr is not None:
            lr = check_float("lr", lr, low=0.0)
        elif optimizer is None:
            raise InvalidValueError("`lr` must be a number when no `optimizer` is given, got None")
        rank = check_int("rank", rank, low=1)
        seed = check_seed("seed", seed)
        if not (callable(fitness_shaping) or (isinstance(fitness_shaping, str) and fitness_shaping in FITNESS_SHAPINGS)):
            raise InvalidValueError(f"`fitness_shaping` must be one of {sorted(FITNESS_SHAPINGS)} or a function, "
                                    f"got {fitness_shaping!r}")
        if group_size is not None:
            group_size = check_int("group_size", group_size, low=2)
            if pop_size % group_size or (antithetic and group_size % 2):
                raise InvalidValueError(f"`group_size` must divide pop_size={pop_size}"
                                        + (" and be even (a group holds whole antithetic pairs)" if antithetic else "")
                                        + f", got {group_size}")
        noise_reuse = check_int("noise_reuse", noise_reuse, low=1)
        perturb_vectors = check_bool("perturb_vectors", perturb_vectors)
        perturb_unroutable = check_bool("perturb_unroutable", perturb_unroutable)
        if optimizer is not None and not (isinstance(optimizer, torch.optim.Optimizer) or callable(optimizer)):
            raise InvalidTypeError(f"`optimizer` must be a torch.optim.Optimizer or a function params -> Optimizer, "
                                   f"got {type(optimizer).__name__}")
        params = select_params(model, rank, param_filter, perturb_vectors)
        unroutable = [p for p in params if not p.routed]
        if unroutable and not perturb_unroutable:
            listed = ", ".join(f"{p.name!r} ({p.why})" for p in unroutable)
            params = [p for p in params if p.routed]
            if not params:
                raise InvalidValueError(
                    f"every selected parameter is one the routed ES forward cannot perturb: {listed}; pass "
                    "`perturb_unroutable=True` to perturb them through the functional_call fallback")
            warnings.warn(
                f"EggrollES freezes {len(unroutable)} selected parameter(s) that the routed forward cannot perturb "
                f"(it reaches nn.Linear weights and biases and nn.Embedding weights): {listed}. Pass "
                "`perturb_unroutable=True` to evolve them too (each member's forward then runs through "
                "torch.func.functional_call), or leave them out with `param_filter` to silence this warning",
                UserWarning, stacklevel=2)
        self._params: list[ESParam] = params
        self._fallback: list[ESParam] = [p for p in params if not p.routed]
        self._fallback_modes: dict[bool, str] = {}

        self.pop_size, self.sigma, self.rank, self.seed = pop_size, sigma, rank, seed
        self.antithetic, self.fitness_shaping, self.group_size = antithetic, fitness_shaping, group_size
        self.noise_reuse, self.perturb_vectors, self.perturb_unroutable = noise_reuse, perturb_vectors, perturb_unroutable
        self.pairs = pop_size // 2 if antithetic else pop_size
        self.optimizer = self._make_optimizer(optimizer, lr)  # may raise: before the model moves
        self.device = pd.resolve_device(device, model)
        self.model = model.to(self.device)
        self.generation = 0
        self.best_fitness: float = -math.inf
        self.best_member: tuple[int, int] | None = None
        self.debug_sync = os.environ.get("POPULORA_ES_DEBUG_SYNC", "").strip().lower() in ("1", "true", "yes")
        self._synced = False
        self._loss_modes: dict = {}
        self._members: tuple[int, float, list[Adapter]] | None = None

        targets: dict[str, nn.Module] = {}
        for p in self._params:
            for owner in p.owners:
                targets.setdefault(owner.path, owner.module)
        order = {path: i for i, (path, _) in enumerate(model.named_modules())}
        self._targets = dict(sorted(targets.items(), key=lambda kv: order[kv[0]]))
        self._factors = MemberFactors(self._params, self._targets, pop_size, antithetic, self.device)
        self._router = ESRouter(self._targets)

    # ------------------------------------------------------------------ construction helpers

    def _make_optimizer(self, optimizer: Any, lr: float | None) -> torch.optim.Optimizer:
        params = [p.param for p in self._params]
        if optimizer is None:
            return torch.optim.SGD(params, lr=lr)
        if lr is not None:
            warnings.warn(f"`lr={lr}` is ignored because `optimizer` was given; set the learning rate on the "
                          "optimizer (and pass lr=None)", UserWarning, stacklevel=3)
        if not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer(params)
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise InvalidTypeError(f"`optimizer` factory must return a torch.optim.Optimizer, got "
                                f"{type(optimizer).__name__}")
        held = {id(q) for group in optimizer.param_groups for q in group["params"]}
        missing = [p.name for p in self._params if id(p.param) not in held]
        if missing:
            raise InvalidValueError(f"`optimizer` does not hold the selected parameters {missing}; build it over "
                             "model.parameters() or pass a factory `lambda params: torch.optim.Adam(params, lr=...)`")
        return optimizer

    # ------------------------------------------------------------------ public views

    @property
    def param_names(self) -> list[str]:
        """Names of the evolved parameters, in ``named_parameters()`` order."""
        return [p.name for p in self._params]

    @property
    def lr(self) -> float:
        """Learning rate of the optimizer's first parameter group."""
        return self.optimizer.param_groups[0]["lr"]

    @property
    def epoch(self) -> int:
        """Noise epoch of the current generation: ``generation // noise_reuse``."""
        return self.generation // self.noise_reuse

    def groups(self) -> Tensor:
        """``(N/G, G)`` member ids of each fitness-shaping group (``(1, N)`` without ``group_size``).

        With antithetic sampling a group holds ``G/2`` whole pairs: group ``j``
        is members ``[j*G/2, (j+1)*G/2)`` and their mirrors ``+ N/2``.
        """
        return group_table(self.pop_size, self.group_size, self.antithetic)

    # ------------------------------------------------------------------ noise

    def _noises(self) -> dict[str, PairNoise]:
        return self._factors.noises(self.seed, self.epoch)

    def _sigma_now(self) -> float:
        """The sigma the current generation's members were built with."""
        if self._members is not None and self._members[0] == self.generation:
            return self._members[1]
        return self.sigma

    # ------------------------------------------------------------------ ask / evaluate / tell

    def ask(self) -> Members:
        """The members of the current generation: a callable that routes rows to them.

        See :class:`~populora.es.members.Members` (and the class docstring for
        how a model with unroutable parameters is evaluated). Under
        torch.distributed the first call checks the configuration across ranks
        (:class:`~populora.errors.ConfigMismatchError` on every rank, naming
        the fields, if it differs) and the model parameters by checksum (if
        they differ, rank 0's are broadcast with a warning).
        """
        self._sync_once()
        if self._members is None or self._members[0] != self.generation:
            sigma = self.sigma
            self._members = (self.generation, sigma, self._factors.adapters(self._noises(), sigma))
        return Members(self, self.generation, self._members[2])

    def losses(
        self,
        inputs: Any,
        loss_fn: Callable[[Any, Any], Any],
        targets: Any = None,
        *,
        per_member: bool = False,
        max_rows: int | None = None,
    ) -> Tensor:
        """``(N,)`` loss of every member (lower is better), the same on every rank.

        ``model(inputs)`` runs once over all members' rows (each rank: its
        slice of members), or in chunks of members when ``max_rows`` is set.
        ``loss_fn(outputs, targets)`` is called per member on that member's
        ``(b, ...)`` outputs (vmapped, or looped when not vmap-safe) and must
        return a scalar.

        Args:
            inputs: the model's single input (tensor or nest of tensors),
                ``(b, ...)`` shared by every member; with ``per_member=True``
                ``(N, b, ...)``, block ``i`` for member ``i``.
            loss_fn: ``(outputs (b, ...), targets) -> scalar``.
            targets: passed to ``loss_fn``; with ``per_member=True`` its
                tensors are ``(N, ...)`` and member ``i`` gets ``targets[i]``.
            per_member: see ``inputs``.
            max_rows: at most this many rows per routed forward (at least one
                member's ``b``): bounds activation memory whatever ``N``.

        Returns:
            ``(N,)`` losses, float64 when ``loss_fn`` returns float64 (or Python
            floats), else float32.

        Raises:
            RouteError: (a ``ValueError``) per-member tensors not ``(N, b, ...)``.
            InvalidValueError: ``max_rows < 1``.
            FitnessError: ``loss_fn`` not returning one number per member.
        """
        if not callable(loss_fn):
            raise InvalidTypeError(f"`loss_fn` must be callable, got {type(loss_fn).__name__}")
        if max_rows is not None:
            max_rows = check_int("max_rows", max_rows, low=1)
        n = self.pop_size
        if per_member:
            split_members(inputs, n, "inputs")
            split_members(targets, n, "targets")
        members = self.ask()
        spread = pd.is_distributed()
        ids = pd.partition(n) if spread else range(n)
        local, failure = torch.empty(0), None
        try:
            if len(ids):
                shapes = _leading(inputs)
                b = (shapes[0][1] if per_member else shapes[0][0]) if shapes and shapes[0] else 1
                chunk = len(ids) if max_rows is None else max(1, max_rows // max(b, 1))
                targets = map_tensors(targets, lambda v: v.to(self.device))
                parts = []
                for start in range(ids.start, ids.stop, chunk):
                    part = range(start, min(start + chunk, ids.stop))
                    x, t = inputs, targets
                    if per_member and len(part) < n:
                        x, t = (map_tensors(v, lambda v: v[part.start:part.stop]) for v in (x, t))
                    out = members(x, individuals=None if len(part) == n else part, per_member=per_member)
                    parts.append(member_losses(loss_fn, out, t, len(part), per_member_targets=per_member,
                                               cache=self._loss_modes))
                local = torch.cat(parts)
        except Exception as error:
            if not spread:
                raise
            failure = error
        if not spread:
            return local
        return pd.all_gather_values(ids, local, n, error=failure, exact_cover=True)

    def evaluate(self, fitness_fn: Callable[..., Any]) -> Tensor:
        """``(N,)`` fitness of every member (higher is better), the same on every rank.

        ``fitness_fn`` receives the :class:`Members` handle in one of the
        three forms of :mod:`populora.fitness`: ``fn(members, individuals=ids)``,
        ``fn(members, idx)`` or ``fn(members)``; under torch.distributed each
        rank evaluates its share of ids and only the fitnesses are exchanged.
        """
        members = self.ask()
        return evaluate_fitness(fitness_fn, members, self.pop_size)

    def step(
        self,
        inputs: Any = None,
        loss_fn: Callable[[Any, Any], Any] | None = None,
        targets: Any = None,
        *,
        fitness: Callable[..., Any] | None = None,
        per_member: bool = False,
        max_rows: int | None = None,
    ) -> ESStats:
        """One generation: evaluate every member, then :meth:`tell`.

        Either ``inputs`` and ``loss_fn`` (fitness ``= -loss``; ``per_member``
        and ``max_rows`` as in :meth:`losses`), or ``fitness=fn`` (see :meth:`evaluate`).
        """
        if (fitness is None) == (loss_fn is None):
            raise InvalidValueError("pass either `inputs` and `loss_fn` (fitness = -loss) or `fitness=fn`, "
                                    "not both/neither")
        if fitness is not None:
            return self.tell(self.evaluate(fitness))
        return self.tell(-self.losses(inputs, loss_fn, targets, per_member=per_member, max_rows=max_rows))

    def _check_fitnesses(self, fitnesses: Any) -> Tensor:
        return check_es_fitnesses(fitnesses, self.pop_size, self.fitness_shaping)

    def shape_fitness(self, fitnesses: Any) -> Tensor:
        """``(N,)`` shaped fitness ``z`` of raw fitnesses (within groups when ``group_size`` is set)."""
        return shape_fitness(self._check_fitnesses(fitnesses), self.groups(), self.fitness_shaping)

    def estimate_gradient(self, fitnesses: Any) -> dict[str, Tensor]:
        """The ES gradient ``g = sqrt(N) * mean_i(z_i * sigma * E_i)`` per parameter (ascent direction).

        Computed from the factors, one matmul of inner size ``pairs * r`` per
        matrix; ``E_i`` is never formed. Changes nothing.

        Args:
            fitnesses: ``(N,)`` raw fitnesses of the current generation, higher is better.

        Returns:
            ``{name: g}``, each ``g`` shaped (and typed) like its parameter,
            computed in float64 for a float64 parameter.
        """
        z = self.shape_fitness(fitnesses)  # in the fitnesses' precision
        w = z[: self.pairs] - z[self.pairs :] if self.antithetic else z  # (pairs,)
        scale = self._sigma_now() / math.sqrt(self.pop_size)
        noises = self._noises()
        return {p.name: (scale * noises[p.name].dense(w, compute_dtype(p.param.dtype))).to(p.param.dtype)
                for p in self._params}

    def tell(self, fitnesses: Any) -> ESStats:
        """Update the parameters from the current generation's fitnesses (higher is better).

        Writes ``param.grad = -g`` (:meth:`estimate_gradient`) and steps the
        optimizer, then advances :attr:`generation`. Everything is checked
        before anything changes.

        Args:
            fitnesses: ``(N,)`` raw fitnesses (tensor, list or array) in member order.

        Returns:
            :class:`ESStats` of the generation.

        Raises:
            FitnessError: (a ``ValueError``) wrong length, NaN, non-numbers.
        """
        self._sync_once()  # first: every rank reaches this collective, whatever its fitnesses
        f = self._check_fitnesses(fitnesses)
        grads = self.estimate_gradient(f)
        with torch.no_grad():
            for p in self._params:
                p.param.grad = -grads[p.name]
        self.optimizer.step()
        best = int(torch.argmax(f))
        stats = ESStats(self.generation, float(f[best]), float(f.mean()), float(f.min()),
                        max(self.best_fitness, float(f[best])),
                        math.sqrt(sum(float(g.float().square().sum()) for g in grads.values())))
        if float(f[best]) > self.best_fitness:
            self.best_fitness, self.best_member = float(f[best]), (self.generation, best)
        self.generation += 1
        self._members = None
        if self.debug_sync:
            self.check_sync()
        return stats

    # ------------------------------------------------------------------ materialised members (on request only)

    def member_params(self, member: int) -> dict[str, Tensor]:
        """``{name: W + sigma * E_member}`` of one member of the current generation (materialised).

        Raises:
            InvalidIndexError: (an ``IndexError``) ``member`` outside ``[0, pop_size)``.
        """
        member = check_index("member", member, self.pop_size)
        return {name: stack[0] for name, stack in self.population_params([member]).items()}

    @torch.no_grad()
    def perturbations(self, members: Sequence[int] | None = None) -> dict[str, Tensor]:
        """``{name: (m, *shape)}``: ``sigma * E_i`` of the given members (default all ``N``), materialised.

        For inspection and tests; the routed forward never forms these. Member
        ``i + N/2`` is exactly ``-1`` times member ``i`` when antithetic.
        """
        ids = self._ids(members)
        noises, sigma = self._noises(), self._sigma_now()
        return {p.name: self._factors.perturbation(p, noises[p.name], sigma, ids) for p in self._params}

    def _ids(self, members: Sequence[int] | None) -> Tensor:
        if members is None:
            return torch.arange(self.pop_size)
        if isinstance(members, Tensor):
            members = members.tolist()
        return torch.tensor([check_index("member", i, self.pop_size) for i in members], dtype=torch.long)

    @torch.no_grad()
    def _fallback_values(self, ids: Tensor) -> dict[str, Tensor]:
        """``{name: (m, *shape)}`` members' values of the unroutable parameters (the fallback forward's)."""
        noises, sigma = self._noises(), self._sigma_now()
        out = {}
        for p in self._fallback:
            delta = self._factors.perturbation(p, noises[p.name], sigma, ids)
            out[p.name] = (p.param.detach().to(delta.dtype) + delta).to(p.param.dtype)
        return out

    @torch.no_grad()
    def population_params(self, members: Sequence[int] | None = None) -> dict[str, Tensor]:
        """``{name: (m, *shape)}`` perturbed parameters ``W + sigma * E_i`` (default all ``N`` members).

        Materialises ``m`` copies of every evolved parameter: for inspection,
        tests and the torcheggroll API, never used by the routed forward.
        Computed in float64 for a float64 parameter (float32 otherwise), then
        cast to the parameter's dtype.
        """
        params = {p.name: p.param for p in self._params}
        return {name: (params[name].detach().to(delta.dtype) + delta).to(params[name].dtype)
                for name, delta in self.perturbations(members).items()}

    # ------------------------------------------------------------------ distributed

    def _fingerprint(self) -> dict[str, Any]:
        """What every rank must agree on: compared across ranks at the first step."""
        return {
            **self._config(),
            "sigma": self.sigma, "seed": self.seed, "generation": self.generation,
            "dtypes": [str(p.param.dtype) for p in self._params],
            "optimizer": type(self.optimizer).__name__,
            "lr": [group.get("lr") for group in self.optimizer.param_groups],
        }

    def _sync_once(self) -> None:
        """First step under torch.distributed: check the configuration, then repair differing weights.

        Every rank all-gathers a small fingerprint (:meth:`_fingerprint`); if
        any field differs, every rank raises :class:`ConfigMismatchError`
        naming the fields and each rank's value, before any other collective
        (so nothing hangs or diverges). The model's weights are then compared
        by checksum and rank 0's are broadcast, with a warning, where they differ.
        """
        if self._synced or not pd.is_distributed():
            return
        mine = self._fingerprint()
        table: list[Any] = [None] * pd.world_size()
        dist.all_gather_object(table, mine)
        differ = [key for key in mine if len({repr(row.get(key)) for row in table}) > 1]
        if differ:
            def show(value: Any) -> str:
                text = repr(value)
                return text if len(text) <= 120 else text[:117] + "..."

            details = "; ".join(f"{key}: " + ", ".join(f"rank {r}: {show(row.get(key))}" for r, row in enumerate(table))
                                for key in differ)
            raise ConfigMismatchError(
                f"{type(self).__name__} configuration differs across ranks in {differ} ({details}); build the ES "
                "with the same arguments (and model) on every rank")
        with torch.no_grad():
            pd.sync_if_different_([*self.model.parameters(), *self.model.buffers()], "ES model parameters")
        self._synced = True
        self._factors.clear()
        self._members = None

    def check_sync(self) -> bool:
        """Compare a checksum of the evolved parameters across ranks (a collective; debugging).

        Runs after every :meth:`tell` when :attr:`debug_sync` is set (or
        ``POPULORA_ES_DEBUG_SYNC=1``). Returns True without a process group.

        Raises:
            ConfigMismatchError: (a ``RuntimeError``) on every rank, if the ranks' parameters differ.
        """
        if not pd.is_distributed():
            return True
        mine = pd.checksum([p.param for p in self._params])
        if dist.get_backend() == "nccl":  # NCCL collectives take CUDA tensors only
            mine = mine.to(torch.device("cuda", torch.cuda.current_device()))
        table = [torch.empty_like(mine) for _ in range(pd.world_size())]
        dist.all_gather(table, mine)
        rows = [tuple(t.cpu().tolist()) for t in table]
        if len(set(rows)) > 1:
            raise ConfigMismatchError(f"ES parameters differ across ranks after generation {self.generation - 1}: "
                               f"checksums per rank {rows}")
        return True

    # ------------------------------------------------------------------ checkpoint

    def _config(self) -> dict[str, Any]:
        return {
            "pop_size": self.pop_size, "rank": self.rank, "antithetic": self.antithetic,
            "noise_reuse": self.noise_reuse, "group_size": self.group_size,
            "perturb_vectors": self.perturb_vectors, "perturb_unroutable": self.perturb_unroutable,
            "fitness_shaping": self.fitness_shaping if isinstance(self.fitness_shaping, str) else None,
            "params": self.param_names, "shapes": [list(p.param.shape) for p in self._params],
        }

    def state_dict(self) -> dict[str, Any]:
        """A snapshot for an exact resume: params, optimizer state, generation, seed, sigma, config.

        Every tensor is a copy (nothing shares storage with the live
        parameters or optimizer state), so stepping on afterwards does not
        change a saved state. Tensors and plain Python values only, so
        ``torch.load`` with its default ``weights_only=True`` reads it;
        callables (``param_filter``, a shaping function, an LR scheduler) are
        not stored. The noise is a pure function of ``(seed, name, epoch)``:
        no generator state is needed.
        """
        return {
            "format": _FORMAT,
            "config": self._config(),
            "seed": self.seed,
            "sigma": self.sigma,
            "generation": self.generation,
            "best_fitness": self.best_fitness,
            "best_member": None if self.best_member is None else list(self.best_member),
            "params": {p.name: p.param.detach().to("cpu", copy=True) for p in self._params},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
        }

    def _checked_state(self, state: Any) -> dict[str, Any]:
        """Every field of a :meth:`state_dict`, validated against this ES; nothing is written.

        Raises:
            CheckpointError: naming the first missing or bad key.
        """
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise CheckpointError(f"not an EggrollES state dict (expected format {_FORMAT!r}, got "
                                  f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r})")
        required = ("config", "seed", "sigma", "generation", "best_fitness", "best_member", "params", "optimizer")
        missing = [key for key in required if key not in state]
        if missing:
            raise CheckpointError(f"EggrollES state is missing {missing}; nothing was loaded")

        def field(key: str, check: Callable[[], Any]) -> Any:
            try:
                return check()
            except PopuloraError as error:
                raise CheckpointError(f"EggrollES state has a bad {key!r}: {error}") from None

        mine, theirs = self._config(), state["config"]
        if not isinstance(theirs, dict):
            raise CheckpointError(f"EggrollES state has a bad 'config': expected a dict, got {type(theirs).__name__}")
        theirs = {"perturb_unroutable": False, **theirs}  # states written before the fallback existed
        for key, value in mine.items():
            if key not in theirs:
                raise CheckpointError(f"EggrollES state config is missing {key!r}")
            if key == "fitness_shaping" and (value is None or theirs[key] is None):
                continue
            if theirs[key] != value:
                raise CheckpointError(f"checkpoint has {key}={theirs[key]!r}, this ES has {value!r}")
        checked = {
            "seed": field("seed", lambda: check_seed("seed", state["seed"])),
            "sigma": field("sigma", lambda: check_float("sigma", state["sigma"], low=0.0, low_open=True)),
            "generation": field("generation", lambda: check_int("generation", state["generation"], low=0)),
        }
        best = state["best_fitness"]
        if isinstance(best, bool) or not isinstance(best, numbers.Real) or math.isnan(best):
            raise CheckpointError(f"EggrollES state has a bad 'best_fitness': expected a number, got {best!r}")
        checked["best_fitness"] = float(best)
        member = state["best_member"]
        if member is not None:
            if not isinstance(member, (list, tuple)) or len(member) != 2:
                raise CheckpointError(f"EggrollES state has a bad 'best_member': expected None or "
                                      f"[generation, member], got {member!r}")
            member = (field("best_member", lambda: check_int("best_member[0]", member[0], low=0)),
                      field("best_member", lambda: check_index("best_member[1]", member[1], self.pop_size)))
        checked["best_member"] = member
        params = state["params"]
        if not isinstance(params, dict):
            raise CheckpointError(f"EggrollES state has a bad 'params': expected a dict, got {type(params).__name__}")
        for p in self._params:
            value = params.get(p.name)
            if not isinstance(value, Tensor):
                raise CheckpointError(f"EggrollES state 'params' is missing parameter {p.name!r}")
            if tuple(value.shape) != tuple(p.param.shape):
                raise CheckpointError(f"checkpoint parameter {p.name!r} has shape {tuple(value.shape)}, "
                                      f"expected {tuple(p.param.shape)}")
            if not (value.is_floating_point() or value.is_complex()) or not bool(torch.isfinite(value).all()):
                raise CheckpointError(f"checkpoint parameter {p.name!r} must hold finite floats, got dtype "
                                      f"{value.dtype} (with non-finite values: {not bool(torch.isfinite(value).all())})")
        extra = sorted(set(params) - set(self.param_names))
        if extra:
            raise CheckpointError(f"EggrollES state 'params' holds parameters this ES does not evolve: {extra}")
        checked["params"] = params
        opt = state["optimizer"]
        groups = opt.get("param_groups") if isinstance(opt, dict) else None
        if not isinstance(groups, list) or not isinstance(opt.get("state"), dict):
            raise CheckpointError("EggrollES state has a bad 'optimizer': expected a torch.optim state_dict "
                                  "(a dict with 'state' and 'param_groups')")
        ours = self.optimizer.param_groups
        if len(groups) != len(ours) or any(not isinstance(g, dict) or len(g.get("params", ())) != len(o["params"])
                                           for g, o in zip(groups, ours)):
            raise CheckpointError(f"EggrollES state 'optimizer' has parameter groups of sizes "
                                  f"{[len(g.get('params', ())) if isinstance(g, dict) else None for g in groups]}, "
                                  f"this ES's optimizer {[len(o['params']) for o in ours]}")
        checked["optimizer"] = opt
        return checked

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: all or nothing.

        The whole state is validated first (every key present and well
        formed, the configuration and parameter shapes equal to this ES's);
        only then is anything written. The state is copied in, so it stays
        usable (loading it twice restores the same point twice).

        Raises:
            CheckpointError: (a ``ValueError``) not an EggrollES state, a
                missing or bad key, or a configuration or parameter shape that
                differs from this ES's (the key is named). Nothing has changed.
        """
        checked = self._checked_state(state)
        before = copy.deepcopy(self.optimizer.state_dict())
        try:
            self.optimizer.load_state_dict(copy.deepcopy(checked["optimizer"]))
        except Exception as error:
            self.optimizer.load_state_dict(before)
            raise CheckpointError(f"EggrollES state has a bad 'optimizer': {type(error).__name__}: {error}") from None
        with torch.no_grad():
            for p in self._params:
                p.param.copy_(checked["params"][p.name])
        self.seed, self.sigma, self.generation = checked["seed"], checked["sigma"], checked["generation"]
        self.best_fitness, self.best_member = checked["best_fitness"], checked["best_member"]
        self._factors.clear()
        self._members = None

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state_dict` to ``path`` atomically (a verified checkpoint); returns the ``Path``.

        See :func:`populora.checkpoint.atomic_save`; :meth:`load` reads it back.
        """
        return atomic_save(self.state_dict(), path, kind=self._KIND)

    def load(self, path: str | Path) -> None:
        """Resume from a file written by :meth:`save` (all or nothing, as :meth:`load_state_dict`).

        Raises:
            FileNotFoundError: nothing at ``path``.
            CheckpointError: the file is empty, truncated, corrupted, of another
                kind, or holds a state that does not fit this ES (the file and
                the key are named). Nothing has changed.
        """
        state = load_checkpoint(path, kind=self._KIND)
        try:
            self.load_state_dict(state)
        except CheckpointError as error:
            raise CheckpointError(f"checkpoint {str(path)!r}: {error}") from None

    def close(self) -> None:
        """Remove the routing hooks from the model (it keeps its trained weights)."""
        self._router.remove()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(pop_size={self.pop_size}, sigma={self.sigma}, rank={self.rank}, "
                f"params={len(self._params)}, generation={self.generation})")
