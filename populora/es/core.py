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

import math
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from populora import distributed as pd
from populora.adapters import Adapter
from populora.checks import check_float, check_int
from populora.errors import InvalidTypeError, InvalidValueError
from populora.es.config import EggrollConfig
from populora.es.factors import MemberFactors, compute_dtype
from populora.es.materialised import MaterialisedIndividuals
from populora.es.members import (
    ESRouter,
    Fallback,
    Individuals,
    individual_losses,
    leading_shapes,
    map_tensors,
)
from populora.es.noise import PairNoise
from populora.es.params import ESParam, make_optimizer, select_params
from populora.es.shaping import check_es_fitnesses, group_table, shape_fitness
from populora.es.state import ESState
from populora.fitness import evaluate as evaluate_fitness
from populora.population.evolution import resolve_config
from populora.routing.request import RoutingTarget
from populora.routing.rows import split_rows
from populora.stats import GenerationStats

__all__ = ["EggrollES"]


class EggrollES(MaterialisedIndividuals, ESState):
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
        config: an :class:`~populora.es.config.EggrollConfig`: the noise seed, antithetic pairs, fitness
            shaping, groups, noise reuse, which parameter kinds are perturbed (default ``EggrollConfig()``).
            Stored in :meth:`state_dict`; a state written with another config is refused, naming the field.
        seed: overrides ``config.seed`` (the noise seed: same seed, same noise, on every rank).
        antithetic: overrides ``config.antithetic`` (mirrored pairs: member ``i + N/2`` uses ``-E_i``).
        optimizer: a ``torch.optim.Optimizer`` over (at least) the selected
            parameters, or a function ``params -> Optimizer``; default ``SGD(params, lr)``.
            Any LR scheduler built on :attr:`optimizer` works.
        param_filter: which parameters to evolve, among those that require
            grad: ``fn(name, param) -> bool`` or ``fn(name) -> bool`` (told
            apart by the number of required positional parameters).
        device: where the model and noise live; default the model's device, or
            ``cuda:(local_rank % device_count)`` under torchrun.

    0.5.0's flat keywords ``fitness_shaping``, ``group_size``, ``noise_reuse``, ``perturb_vectors`` and
    ``perturb_unroutable`` still work, with a ``DeprecationWarning``: they are fields of ``config``.

    How :meth:`ask` evaluates the members: ``nn.Linear`` weights and biases
    and ``nn.Embedding`` weights are perturbed by the routed forward, ONE
    batched forward over every member's rows; with a shared batch the first
    target ``nn.Linear`` (whose input rows are then still copies of the
    batch, which is checked) computes its base product once over the ``b``
    rows and adds each member's delta to it (:mod:`populora.es.shared`;
    ``es.router.share_rows = False`` turns that off). With ``perturb_unroutable=True``
    (a field of the config) and a model that has unroutable parameters, the model is instead called
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

    def __init__(
        self,
        model: nn.Module,
        pop_size: int,
        sigma: float,
        lr: float | None,
        rank: int,
        config: EggrollConfig | None = None,
        *,
        seed: int | None = None,
        antithetic: bool | None = None,
        optimizer: torch.optim.Optimizer | Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
        param_filter: Callable[..., bool] | None = None,
        device: str | torch.device | None = None,
        **legacy: Any,
    ):
        c = resolve_config(
            EggrollConfig,
            config,
            legacy,
            dict(seed=seed, antithetic=antithetic),
            where="EggrollES",
            stacklevel=3,
        )
        if not isinstance(model, nn.Module):
            raise InvalidTypeError(f"`model` must be an nn.Module, got {type(model).__name__}")
        pop_size = check_int("pop_size", pop_size, low=2)
        if c.antithetic and pop_size % 2:
            raise InvalidValueError(f"pop_size must be even when using antithetic sampling, got pop_size={pop_size}")
        sigma = check_float("sigma", sigma, low=0.0, low_open=True)
        if lr is not None:
            lr = check_float("lr", lr, low=0.0)
        elif optimizer is None:
            raise InvalidValueError("`lr` must be a number when no `optimizer` is given, got None")
        rank = check_int("rank", rank, low=1)
        group_size = c.group_size
        if group_size is not None and (pop_size % group_size or (c.antithetic and group_size % 2)):
            raise InvalidValueError(
                f"`group_size` must divide pop_size={pop_size}"
                + (" and be even (a group holds whole antithetic pairs)" if c.antithetic else "")
                + f", got {group_size}"
            )
        seed, antithetic, fitness_shaping, noise_reuse = c.seed, c.antithetic, c.fitness_shaping, c.noise_reuse
        perturb_vectors, perturb_unroutable = c.perturb_vectors, c.perturb_unroutable
        self.config = c
        if optimizer is not None and not (isinstance(optimizer, torch.optim.Optimizer) or callable(optimizer)):
            raise InvalidTypeError(
                f"`optimizer` must be a torch.optim.Optimizer or a function params -> Optimizer, "
                f"got {type(optimizer).__name__}"
            )
        params = select_params(model, rank, param_filter, perturb_vectors)
        unroutable = [p for p in params if not p.routed]
        if unroutable and not perturb_unroutable:
            listed = ", ".join(f"{p.name!r} ({p.why})" for p in unroutable)
            params = [p for p in params if p.routed]
            if not params:
                raise InvalidValueError(
                    f"every selected parameter is one the routed ES forward cannot perturb: {listed}; pass "
                    "`perturb_unroutable=True` to perturb them through the functional_call fallback"
                )
            warnings.warn(
                f"EggrollES freezes {len(unroutable)} selected parameter(s) that the routed forward cannot perturb "
                f"(it reaches nn.Linear weights and biases and nn.Embedding weights): {listed}. Pass "
                "`perturb_unroutable=True` to evolve them too (each member's forward then runs through "
                "torch.func.functional_call), or leave them out with `param_filter` to silence this warning",
                UserWarning,
                stacklevel=2,
            )
        self._params: list[ESParam] = params
        self._fallback: list[ESParam] = [p for p in params if not p.routed]
        self._fallback_modes: dict[bool, str] = {}  # Fallback.modes: vmap or loop, kept across generations

        self.pop_size, self.sigma, self.rank, self.seed = pop_size, sigma, rank, seed
        self.antithetic, self.fitness_shaping, self.group_size = antithetic, fitness_shaping, group_size
        self.noise_reuse, self.perturb_vectors, self.perturb_unroutable = (
            noise_reuse,
            perturb_vectors,
            perturb_unroutable,
        )
        self.pairs = pop_size // 2 if antithetic else pop_size
        self.optimizer = make_optimizer(params, optimizer, lr)  # may raise: before the model moves
        self.device = pd.resolve_device(device, model)
        self.model = model.to(self.device)
        self.generation = 0
        self.best_fitness: float = -math.inf
        self.best_individual: tuple[int, int] | None = None
        self.history: list[GenerationStats] = []
        self.debug_sync = os.environ.get("POPULORA_ES_DEBUG_SYNC", "").strip().lower() in ("1", "true", "yes")
        self._synced = False
        self._loss_modes: dict = {}
        self._asked: tuple[int, float, list[Adapter]] | None = None

        targets: dict[str, nn.Module] = {}
        for p in self._params:
            for owner in p.owners:
                targets.setdefault(owner.path, owner.module)
        order = {path: i for i, (path, _) in enumerate(model.named_modules())}
        self._targets = dict(sorted(targets.items(), key=lambda kv: order[kv[0]]))
        self._factors = MemberFactors(self._params, self._targets, pop_size, antithetic, self.device)
        self._router = ESRouter(self._targets)

    # ------------------------------------------------------------------ public views

    @property
    def param_names(self) -> list[str]:
        """Names of the evolved parameters, in ``named_parameters()`` order."""
        return [p.name for p in self._params]

    @property
    def param_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the evolved parameters, in :attr:`param_names` order."""
        return [tuple(p.param.shape) for p in self._params]

    @property
    def lr(self) -> float:
        """Learning rate of the optimizer's first parameter group."""
        return self.optimizer.param_groups[0]["lr"]

    @property
    def noise_epoch(self) -> int:
        """Noise epoch of the current generation: ``generation // noise_reuse`` (the noise's seed index).

        ``epoch`` alone means the generation counter (steps taken), as
        :attr:`TorchEggrollES.epoch <populora.TorchEggrollES.epoch>` and
        torcheggroll's ``epoch`` say; here that is :attr:`generation`.
        """
        return self.generation // self.noise_reuse

    @property
    def router(self) -> ESRouter:
        """The routing layer on :attr:`model` (its target layers' forwards are wrapped until :meth:`close`)."""
        return self._router

    def groups(self) -> Tensor:
        """``(N/G, G)`` member ids of each fitness-shaping group (``(1, N)`` without ``group_size``).

        With antithetic sampling a group holds ``G/2`` whole pairs: group ``j``
        is members ``[j*G/2, (j+1)*G/2)`` and their mirrors ``+ N/2``.
        """
        return group_table(self.pop_size, self.group_size, self.antithetic)

    # ------------------------------------------------------------------ noise

    def _noises(self) -> dict[str, PairNoise]:
        return self._factors.noises(self.seed, self.noise_epoch)

    def _sigma_now(self) -> float:
        """The sigma the current generation's members were built with."""
        if self._asked is not None and self._asked[0] == self.generation:
            return self._asked[1]
        return self.sigma

    # ------------------------------------------------------------------ ask / evaluate / tell

    def ask(self) -> Individuals:
        """The individuals of the current generation: a routed model over them.

        See :class:`~populora.es.members.Individuals` (and the class docstring for
        how a model with unroutable parameters is evaluated). Under
        torch.distributed the first call checks the configuration across ranks
        (:class:`~populora.errors.ConfigMismatchError` on every rank, naming
        the fields, if it differs) and the model parameters by checksum (if
        they differ, rank 0's are broadcast with a warning).
        """
        self._sync_once()
        if self._asked is None or self._asked[0] != self.generation:
            sigma = self.sigma
            self._asked = (self.generation, sigma, self._factors.adapters(self._noises(), sigma))
        target = RoutingTarget(self.model, self._router, self._asked[2], self.pop_size, self.device)
        fallback = Fallback(self._fallback_values, self._fallback_modes) if self._fallback else None
        return Individuals(target, self.generation, lambda: self.generation, fallback)

    def losses(
        self,
        inputs: Any,
        loss_fn: Callable[[Any, Any], Any],
        targets: Any = None,
        *,
        per_individual: bool = False,
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
                ``(b, ...)`` shared by every member; with ``per_individual=True``
                ``(N, b, ...)``, block ``i`` for member ``i``.
            loss_fn: ``(outputs (b, ...), targets) -> scalar``.
            targets: passed to ``loss_fn``; with ``per_individual=True`` its
                tensors are ``(N, ...)`` and member ``i`` gets ``targets[i]``.
            per_individual: see ``inputs``.
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
        if per_individual:
            split_rows(inputs, n, "inputs")
            split_rows(targets, n, "targets")
        members = self.ask()
        spread = pd.is_distributed()
        ids = pd.partition(n) if spread else range(n)
        local, failure = torch.empty(0), None
        try:
            if len(ids):
                shapes = leading_shapes(inputs)
                b = (shapes[0][1] if per_individual else shapes[0][0]) if shapes and shapes[0] else 1
                chunk = len(ids) if max_rows is None else max(1, max_rows // max(b, 1))
                targets = map_tensors(targets, lambda v: v.to(self.device))
                parts = []
                for start in range(ids.start, ids.stop, chunk):
                    part = range(start, min(start + chunk, ids.stop))
                    x, t = inputs, targets
                    if per_individual and len(part) < n:
                        x, t = (map_tensors(v, lambda v: v[part.start : part.stop]) for v in (x, t))
                    out = members(x, individuals=None if len(part) == n else part, per_individual=per_individual)
                    parts.append(
                        individual_losses(
                            loss_fn, out, t, len(part), per_individual_targets=per_individual, cache=self._loss_modes
                        )
                    )
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

        ``fitness_fn`` receives the :class:`~populora.es.members.Individuals` handle in one of the
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
        per_individual: bool = False,
        max_rows: int | None = None,
    ) -> GenerationStats:
        """One generation: evaluate every member, then :meth:`tell`.

        Either ``inputs`` and ``loss_fn`` (fitness ``= -loss``; ``per_individual``
        and ``max_rows`` as in :meth:`losses`), or ``fitness=fn`` (see :meth:`evaluate`).
        """
        if (fitness is None) == (loss_fn is None):
            raise InvalidValueError(
                "pass either `inputs` and `loss_fn` (fitness = -loss) or `fitness=fn`, not both/neither"
            )
        if fitness is not None:
            return self.tell(self.evaluate(fitness))
        assert loss_fn is not None  # exactly one of the two, checked above
        return self.tell(-self.losses(inputs, loss_fn, targets, per_individual=per_individual, max_rows=max_rows))

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
            One gradient ``g`` per parameter name (``{name -> g}``), shaped (and typed) like its parameter,
            computed in float64 for a float64 parameter.
        """
        return self._gradient(self._check_fitnesses(fitnesses))

    def _gradient(self, f: Tensor) -> dict[str, Tensor]:
        """:meth:`estimate_gradient` of fitnesses already checked (``f`` from :meth:`_check_fitnesses`)."""
        z = shape_fitness(f, self.groups(), self.fitness_shaping)  # in the fitnesses' precision
        w = z[: self.pairs] - z[self.pairs :] if self.antithetic else z  # (pairs,)
        scale = self._sigma_now() / math.sqrt(self.pop_size)
        noises = self._noises()
        return {
            p.name: (scale * noises[p.name].dense(w, compute_dtype(p.param.dtype))).to(p.param.dtype)
            for p in self._params
        }

    def tell(self, fitnesses: Any) -> GenerationStats:
        """Update the parameters from the current generation's fitnesses (higher is better).

        Writes ``param.grad = -g`` (:meth:`estimate_gradient`) and steps the
        optimizer, then advances :attr:`generation`. Everything is checked
        before anything changes.

        Args:
            fitnesses: ``(N,)`` raw fitnesses (tensor, list or array) in member order.

        Returns:
            :class:`~populora.stats.GenerationStats` of the generation (with ``worst``, ``best_ever`` and
            ``grad_norm``); its best, mean and (population)
            standard deviation are also appended to :attr:`history` as a
            :class:`~populora.GenerationStats`.

        Raises:
            FitnessError: (a ``ValueError``) wrong length, NaN, non-numbers.
        """
        self._sync_once()  # first: every rank reaches this collective, whatever its fitnesses
        f = self._check_fitnesses(fitnesses)  # the one validation of this generation's fitnesses
        grads = self._gradient(f)
        with torch.no_grad():
            for p in self._params:
                p.param.grad = -grads[p.name]
        self.optimizer.step()
        best = int(torch.argmax(f))
        row = GenerationStats(self.generation, float(f[best]), float(f.mean()), float(f.std(correction=0)))
        self.history.append(row)
        stats = row._replace(
            worst=float(f.min()),
            best_ever=max(self.best_fitness, float(f[best])),
            grad_norm=math.sqrt(sum(float(g.float().square().sum()) for g in grads.values())),
        )
        if float(f[best]) > self.best_fitness:
            self.best_fitness, self.best_individual = float(f[best]), (self.generation, best)
        self.generation += 1
        self._asked = None
        if self.debug_sync:
            self.check_sync()
        return stats

    def close(self) -> None:
        """Give the target layers back their own forward (undo the router); the model keeps its trained weights."""
        self._router.remove()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(pop_size={self.pop_size}, sigma={self.sigma}, rank={self.rank}, "
            f"params={len(self._params)}, generation={self.generation})"
        )
