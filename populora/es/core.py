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
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .. import distributed as pd
from ..fitness import evaluate as evaluate_fitness
from ..routing import Adapter, Router
from .factors import MemberFactors
from .members import Members, _leading, map_tensors, member_losses, split_members
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


def _positive_int(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"`{name}` must be an int >= {low}, got {value!r}")
    return value


def _number(name: str, value: Any, *, positive: bool) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise ValueError(f"`{name}` must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


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
        device: where the model and noise live; default the model's device, or
            ``cuda:(local_rank % device_count)`` under torchrun.

    Raises:
        ValueError: a bad value (named), odd ``pop_size`` with ``antithetic``,
            no parameter selected, or a selected parameter the routed forward
            cannot perturb (named, with how to leave it out).
        TypeError: ``model`` is not an ``nn.Module``, ``optimizer`` of the wrong type.

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
        *,
        seed: int = 0,
        antithetic: bool = True,
        fitness_shaping: str | Callable[[Tensor], Tensor] = "zscore",
        group_size: int | None = None,
        optimizer: torch.optim.Optimizer | Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
        param_filter: Callable[..., bool] | None = None,
        noise_reuse: int = 1,
        perturb_vectors: bool = True,
        device: str | torch.device | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be an nn.Module, got {type(model).__name__}")
        pop_size = _positive_int("pop_size", pop_size, 2)
        if antithetic and pop_size % 2:
            raise ValueError(f"pop_size must be even when using antithetic sampling, got pop_size={pop_size}")
        sigma = _number("sigma", sigma, positive=True)
        if lr is not None:
            lr = _number("lr", lr, positive=False)
        elif optimizer is None:
            raise ValueError("`lr` must be a number when no `optimizer` is given, got None")
        rank = _positive_int("rank", rank)
        if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
            raise ValueError(f"`seed` must be an int (64-bit), got {seed!r}")
        if not (callable(fitness_shaping) or fitness_shaping in FITNESS_SHAPINGS):
            raise ValueError(f"`fitness_shaping` must be one of {sorted(FITNESS_SHAPINGS)} or a function, "
                             f"got {fitness_shaping!r}")
        if group_size is not None:
            _positive_int("group_size", group_size, 2)
            if pop_size % group_size or (antithetic and group_size % 2):
                raise ValueError(f"`group_size` must divide pop_size={pop_size}"
                                 + (" and be even (a group holds whole antithetic pairs)" if antithetic else "")
                                 + f", got {group_size}")
        noise_reuse = _positive_int("noise_reuse", noise_reuse)
        if optimizer is not None and not (isinstance(optimizer, torch.optim.Optimizer) or callable(optimizer)):
            raise TypeError(f"`optimizer` must be a torch.optim.Optimizer or a function params -> Optimizer, "
                            f"got {type(optimizer).__name__}")
        self._params: list[ESParam] = select_params(model, rank, param_filter, perturb_vectors)

        self.pop_size, self.sigma, self.rank, self.seed = pop_size, sigma, rank, seed
        self.antithetic, self.fitness_shaping, self.group_size = antithetic, fitness_shaping, group_size
        self.noise_reuse, self.perturb_vectors = noise_reuse, perturb_vectors
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
        self._router = Router(self._targets)

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
                raise TypeError(f"`optimizer` factory must return a torch.optim.Optimizer, got "
                                f"{type(optimizer).__name__}")
        held = {id(q) for group in optimizer.param_groups for q in group["params"]}
        missing = [p.name for p in self._params if id(p.param) not in held]
        if missing:
            raise ValueError(f"`optimizer` does not hold the selected parameters {missing}; build it over "
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

        See :class:`~populora.es.members.Members`. Under torch.distributed the
        first call checks the model parameters (and seed) across ranks by
        checksum and, if they differ, broadcasts rank 0's with a warning.
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

        Raises:
            ValueError: per-member tensors not ``(N, b, ...)``, ``max_rows < 1``,
                or ``loss_fn`` not returning one number per member.
        """
        if not callable(loss_fn):
            raise TypeError(f"`loss_fn` must be callable, got {type(loss_fn).__name__}")
        if max_rows is not None:
            _positive_int("max_rows", max_rows)
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
            raise ValueError("pass either `inputs` and `loss_fn` (fitness = -loss) or `fitness=fn`, not both/neither")
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
            ``{name: g}``, each ``g`` shaped (and typed) like its parameter.
        """
        z = self.shape_fitness(fitnesses)
        w = z[: self.pairs] - z[self.pairs :] if self.antithetic else z  # (pairs,)
        scale = self._sigma_now() / math.sqrt(self.pop_size)
        noises = self._noises()
        return {p.name: (scale * noises[p.name].dense(w)).to(p.param.dtype) for p in self._params}

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
        f = self._check_fitnesses(fitnesses)
        self._sync_once()
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
        """``{name: W + sigma * E_member}`` of one member of the current generation (materialised)."""
        if isinstance(member, bool) or not isinstance(member, int) or not 0 <= member < self.pop_size:
            raise ValueError(f"`member` must be an int in [0, {self.pop_size}), got {member!r}")
        return {name: stack[0] for name, stack in self.population_params([member]).items()}

    @torch.no_grad()
    def perturbations(self, members: Sequence[int] | None = None) -> dict[str, Tensor]:
        """``{name: (m, *shape)}``: ``sigma * E_i`` of the given members (default all ``N``), materialised.

        For inspection and tests; the routed forward never forms these. Member
        ``i + N/2`` is exactly ``-1`` times member ``i`` when antithetic.
        """
        noises, sigma = self._noises(), self._sigma_now()
        ids = torch.arange(self.pop_size) if members is None else torch.as_tensor(list(members), dtype=torch.long)
        return {p.name: self._factors.perturbation(p, noises[p.name], sigma)[ids.to(self.device)] for p in self._params}

    @torch.no_grad()
    def population_params(self, members: Sequence[int] | None = None) -> dict[str, Tensor]:
        """``{name: (m, *shape)}`` perturbed parameters ``W + sigma * E_i`` (default all ``N`` members).

        Materialises ``m`` copies of every evolved parameter: for inspection,
        tests and the torcheggroll API, never used by the routed forward.
        """
        params = {p.name: p.param for p in self._params}
        return {name: (params[name].detach().float() + delta).to(params[name].dtype)
                for name, delta in self.perturbations(members).items()}

    # ------------------------------------------------------------------ distributed

    def _sync_once(self) -> None:
        if self._synced or not pd.is_distributed():
            return
        with torch.no_grad():
            pd.sync_if_different_([*self.model.parameters(), *self.model.buffers()], "ES model parameters")
            state = torch.tensor([self.seed, self.generation], dtype=torch.int64)
            pd.sync_if_different_([state], "ES seeds / generations")
        self.seed, self.generation = (int(v) for v in state.tolist())
        self._synced = True
        self._factors.clear()
        self._members = None

    def check_sync(self) -> bool:
        """Compare a checksum of the evolved parameters across ranks (a collective; debugging).

        Runs after every :meth:`tell` when :attr:`debug_sync` is set (or
        ``POPULORA_ES_DEBUG_SYNC=1``). Returns True without a process group.

        Raises:
            RuntimeError: on every rank, if the ranks' parameters differ.
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
            raise RuntimeError(f"ES parameters differ across ranks after generation {self.generation - 1}: "
                               f"checksums per rank {rows}")
        return True

    # ------------------------------------------------------------------ checkpoint

    def _config(self) -> dict[str, Any]:
        return {
            "pop_size": self.pop_size, "rank": self.rank, "antithetic": self.antithetic,
            "noise_reuse": self.noise_reuse, "group_size": self.group_size,
            "perturb_vectors": self.perturb_vectors,
            "fitness_shaping": self.fitness_shaping if isinstance(self.fitness_shaping, str) else None,
            "params": self.param_names, "shapes": [list(p.param.shape) for p in self._params],
        }

    def state_dict(self) -> dict[str, Any]:
        """A snapshot for an exact resume: params, optimizer state, generation, seed, sigma, config.

        Tensors and plain Python values only, so ``torch.load`` with its
        default ``weights_only=True`` reads it; callables (``param_filter``,
        a shaping function, an LR scheduler) are not stored.
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

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; checked against this ES before anything changes.

        Raises:
            ValueError: not an EggrollES state, or its configuration or
                parameter shapes differ from this ES's (the key is named).
        """
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"not an EggrollES state dict (expected format {_FORMAT!r}, got "
                             f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r})")
        mine, theirs = self._config(), state.get("config", {})
        for key, value in mine.items():
            if key == "fitness_shaping" and (value is None or theirs.get(key) is None):
                continue
            if theirs.get(key) != value:
                raise ValueError(f"checkpoint has {key}={theirs.get(key)!r}, this ES has {value!r}")
        params = state["params"]
        for p in self._params:
            if tuple(params[p.name].shape) != tuple(p.param.shape):
                raise ValueError(f"checkpoint parameter {p.name!r} has shape {tuple(params[p.name].shape)}, "
                                 f"expected {tuple(p.param.shape)}")
        self.optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for p in self._params:
                p.param.copy_(params[p.name])
        self.seed, self.sigma, self.generation = int(state["seed"]), float(state["sigma"]), int(state["generation"])
        self.best_fitness = float(state["best_fitness"])
        self.best_member = None if state["best_member"] is None else tuple(state["best_member"])
        self._factors.clear()
        self._members = None

    def close(self) -> None:
        """Remove the routing hooks from the model (it keeps its trained weights)."""
        self._router.remove()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(pop_size={self.pop_size}, sigma={self.sigma}, rank={self.rank}, "
                f"params={len(self._params)}, generation={self.generation})")
