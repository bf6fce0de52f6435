"""The state of an :class:`~populora.EggrollES`: snapshots, all-or-nothing loads, files, and rank agreement.

:class:`ESState` is the part of :class:`~populora.EggrollES` that reads and
writes its state as a whole: :meth:`~ESState.state_dict` (a snapshot of
copies), :meth:`~ESState.load_state_dict` (validated whole before anything is
written), :meth:`~ESState.save` / :meth:`~ESState.load` (verified files), and,
under torch.distributed, the configuration fingerprint every rank compares at
the first step and the parameter checksum of :meth:`~ESState.check_sync`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from populora import distributed as pd
from populora.checkpoint import atomic_save, load_checkpoint
from populora.checks import check_float, check_index, check_int, check_seed, is_real
from populora.errors import CheckpointError, ConfigMismatchError, PopuloraError
from populora.stats import GenerationStats

if TYPE_CHECKING:
    from populora.adapters import Adapter
    from populora.es.config import EggrollConfig
    from populora.es.factors import MemberFactors
    from populora.es.params import ESParam

__all__ = ["FORMAT", "TORCHEGGROLL_FILES", "ESState"]

FORMAT = "populora.es/1"

TORCHEGGROLL_FILES = (
    "this looks like a torcheggroll (or other) checkpoint: torcheggroll files are not supported; start from a "
    "populora ES (TorchEggrollES keeps torcheggroll's API) and save it with its save()"
)
"""What the error for a plain ``torch.save`` file given to an ES's ``load`` adds."""


class ESState:
    """State, checkpoints and rank agreement of :class:`~populora.EggrollES` (its base class)."""

    _KIND = "EggrollES"  # the checkpoint kind of save() / load()

    # what EggrollES.__init__ sets (declared for the type checker)
    model: nn.Module
    config: EggrollConfig
    optimizer: torch.optim.Optimizer
    pop_size: int
    rank: int
    sigma: float
    seed: int
    antithetic: bool
    noise_reuse: int
    group_size: int | None
    perturb_vectors: bool
    perturb_unroutable: bool
    fitness_shaping: str | Callable[[Tensor], Tensor]
    generation: int
    best_fitness: float
    best_individual: tuple[int, int] | None
    history: list[GenerationStats]
    _params: list[ESParam]
    _factors: MemberFactors
    _synced: bool
    _asked: tuple[int, float, list[Adapter]] | None

    if TYPE_CHECKING:

        @property
        def param_names(self) -> list[str]: ...

    # ------------------------------------------------------------------ distributed

    def _fingerprint(self) -> dict[str, Any]:
        """What every rank must agree on: compared across ranks at the first step."""
        return {
            **self._config(),
            "sigma": self.sigma,
            "seed": self.seed,
            "generation": self.generation,
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

            details = "; ".join(
                f"{key}: " + ", ".join(f"rank {r}: {show(row.get(key))}" for r, row in enumerate(table))
                for key in differ
            )
            raise ConfigMismatchError(
                f"{type(self).__name__} configuration differs across ranks in {differ} ({details}); build the ES "
                "with the same arguments (and model) on every rank"
            )
        with torch.no_grad():
            pd.sync_if_different_([*self.model.parameters(), *self.model.buffers()], "ES model parameters")
        self._synced = True
        self._factors.clear()
        self._asked = None

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
        mine = mine.to(pd.comm_device())  # the current GPU under NCCL, else the CPU
        table = [torch.empty_like(mine) for _ in range(pd.world_size())]
        dist.all_gather(table, mine)
        rows = [tuple(t.cpu().tolist()) for t in table]
        if len(set(rows)) > 1:
            raise ConfigMismatchError(
                f"ES parameters differ across ranks after generation {self.generation - 1}: checksums per rank {rows}"
            )
        return True

    # ------------------------------------------------------------------ checkpoint

    def _config(self) -> dict[str, Any]:
        return {
            "pop_size": self.pop_size,
            "rank": self.rank,
            "antithetic": self.antithetic,
            "noise_reuse": self.noise_reuse,
            "group_size": self.group_size,
            "perturb_vectors": self.perturb_vectors,
            "perturb_unroutable": self.perturb_unroutable,
            "fitness_shaping": self.fitness_shaping if isinstance(self.fitness_shaping, str) else None,
            "params": self.param_names,
            "shapes": [list(p.param.shape) for p in self._params],
        }

    def _stored_config(self) -> dict[str, Any]:
        """The config as a state holds it: :meth:`EggrollConfig.to_dict`, less the seed (a load restores it)."""
        return {k: v for k, v in self.config.to_dict().items() if k != "seed"}

    def _check_stored_config(self, stored: Any) -> None:
        """A state's ``'eggroll_config'`` equals this ES's (a shaping function is not compared, as before)."""
        if not isinstance(stored, dict):
            raise CheckpointError(
                f"EggrollES state has a bad 'eggroll_config': expected a dict, got {type(stored).__name__}"
            )
        current = self.config.to_dict()
        stored = {**stored, "seed": current["seed"]}
        if isinstance(current["fitness_shaping"], dict) or isinstance(stored.get("fitness_shaping"), dict):
            stored["fitness_shaping"] = current["fitness_shaping"]
        self.config.check_matches(stored, "the EggrollES state")

    def state_dict(self) -> dict[str, Any]:
        """A snapshot for an exact resume: params, optimizer state, generation, seed, sigma, config.

        Every tensor is a copy (nothing shares storage with the live
        parameters or optimizer state), so stepping on afterwards does not
        change a saved state. Tensors and plain Python values only, so
        ``torch.load`` with its default ``weights_only=True`` reads it;
        callables (``param_filter``, a shaping function, an LR scheduler) are
        not stored. The noise is a pure function of ``(seed, name, noise epoch)``:
        no generator state is needed. ``'best_member'`` holds
        :attr:`best_individual` (the key files already hold); ``'history'``
        holds :attr:`history` as ``[generation, best, mean, std]`` rows;
        ``'optimizer_class'`` the optimizer's class (``'populora.optim.ClipUp'``),
        which :meth:`load_state_dict` compares with its own; ``'eggroll_config'`` the
        :class:`~populora.es.config.EggrollConfig` (its ``to_dict``, the seed aside: a load restores the
        state's seed), which a load compares with its own, naming the first field that differs.
        """
        return {
            "format": FORMAT,
            "config": self._config(),
            "eggroll_config": self._stored_config(),
            "seed": self.seed,
            "sigma": self.sigma,
            "generation": self.generation,
            "best_fitness": self.best_fitness,
            "best_member": None if self.best_individual is None else list(self.best_individual),
            "history": [[h.generation, h.best, h.mean, h.std] for h in self.history],
            "params": {p.name: p.param.detach().to("cpu", copy=True) for p in self._params},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "optimizer_class": _class_name(type(self.optimizer)),
        }

    def _checked_state(self, state: Any) -> dict[str, Any]:
        """Every field of a :meth:`state_dict`, validated against this ES; nothing is written.

        Raises:
            CheckpointError: naming the first missing or bad key, or, for a state too damaged to be read
                field by field (an int beyond float64 where a number belongs, a tensor where the config
                holds a list, ...), the builtin error that reading it met.
        """
        try:
            return self._validated_state(state)
        except PopuloraError:
            raise
        except (ArithmeticError, LookupError, TypeError, ValueError, RuntimeError, AttributeError) as error:
            # validation only reads the state, so any error while reading it is damage, never a half-done load
            text = str(error)
            raise CheckpointError(
                f"EggrollES state is damaged ({type(error).__name__} while checking it: "
                f"{text if len(text) <= 200 else text[:197] + '...'}); nothing was loaded"
            ) from None

    def _validated_state(self, state: Any) -> dict[str, Any]:
        """:meth:`_checked_state`'s field-by-field checks (builtin errors on damaged input are left to it)."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise CheckpointError(
                f"not an EggrollES state dict (expected format {FORMAT!r}, got "
                f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r})"
            )
        required = ("config", "seed", "sigma", "generation", "best_fitness", "best_member", "params", "optimizer")
        missing = [key for key in required if key not in state]
        if missing:
            raise CheckpointError(f"EggrollES state is missing {missing}; nothing was loaded")

        def field(key: str, check: Callable[[], Any]) -> Any:
            try:
                return check()
            except PopuloraError as error:
                raise CheckpointError(f"EggrollES state has a bad {key!r}: {error}") from None

        if "eggroll_config" in state:  # states written before 0.6.0 hold none: their 'config' is checked below
            self._check_stored_config(state["eggroll_config"])
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
        if not is_real(best) or math.isnan(best):
            raise CheckpointError(f"EggrollES state has a bad 'best_fitness': expected a number, got {best!r}")
        checked["best_fitness"] = float(best)
        member = state["best_member"]
        if member is not None:
            if not isinstance(member, (list, tuple)) or len(member) != 2:
                raise CheckpointError(
                    f"EggrollES state has a bad 'best_member': expected None or [generation, member], got {member!r}"
                )
            member = (
                field("best_member", lambda: check_int("best_member[0]", member[0], low=0)),
                field("best_member", lambda: check_index("best_member[1]", member[1], self.pop_size)),
            )
        checked["best_member"] = member
        checked["history"] = _checked_history(state.get("history", []))  # states written before history: empty
        params = state["params"]
        if not isinstance(params, dict):
            raise CheckpointError(f"EggrollES state has a bad 'params': expected a dict, got {type(params).__name__}")
        for p in self._params:
            value = params.get(p.name)
            if not isinstance(value, Tensor):
                raise CheckpointError(f"EggrollES state 'params' is missing parameter {p.name!r}")
            if tuple(value.shape) != tuple(p.param.shape):
                raise CheckpointError(
                    f"checkpoint parameter {p.name!r} has shape {tuple(value.shape)}, expected {tuple(p.param.shape)}"
                )
            if not (value.is_floating_point() or value.is_complex()) or not bool(torch.isfinite(value).all()):
                raise CheckpointError(
                    f"checkpoint parameter {p.name!r} must hold finite floats, got dtype "
                    f"{value.dtype} (with non-finite values: {not bool(torch.isfinite(value).all())})"
                )
        extra = sorted(set(params) - set(self.param_names))
        if extra:
            raise CheckpointError(f"EggrollES state 'params' holds parameters this ES does not evolve: {extra}")
        checked["params"] = params
        opt = state["optimizer"]
        groups = opt.get("param_groups") if isinstance(opt, dict) else None
        if not isinstance(groups, list) or not isinstance(opt.get("state"), dict):
            raise CheckpointError(
                "EggrollES state has a bad 'optimizer': expected a torch.optim state_dict "
                "(a dict with 'state' and 'param_groups')"
            )
        ours = self.optimizer.param_groups
        if len(groups) != len(ours) or any(
            not isinstance(g, dict) or len(g.get("params", ())) != len(o["params"]) for g, o in zip(groups, ours)
        ):
            raise CheckpointError(
                f"EggrollES state 'optimizer' has parameter groups of sizes "
                f"{[len(g.get('params', ())) if isinstance(g, dict) else None for g in groups]}, "
                f"this ES's optimizer {[len(o['params']) for o in ours]}"
            )
        _check_optimizer_class(state, self.optimizer)
        checked["optimizer"] = opt
        return checked

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: all or nothing.

        The whole state is validated first (every key present and well
        formed, the configuration and parameter shapes equal to this ES's, the
        optimizer state saved by an optimizer of this ES's class); only then
        is anything written. The state is copied in, so it stays usable
        (loading it twice restores the same point twice).

        The optimizer class is compared by its name (``'ClipUp'``: a class
        that moved to another module still loads). A state saved before the
        class was recorded is accepted when its parameter groups hold exactly
        the options this ES's optimizer's groups hold (with the ones its class
        fills in on load).

        Raises:
            CheckpointError: (a ``ValueError``) not an EggrollES state, a
                missing or bad key, a configuration or parameter shape that
                differs from this ES's (the key is named), or an optimizer
                state of another optimizer class (both named). Nothing has changed.
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
        self.best_fitness, self.best_individual = checked["best_fitness"], checked["best_member"]
        self.history = checked["history"]
        self._factors.clear()
        self._asked = None

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
        state = load_checkpoint(path, kind=self._KIND, foreign_hint=TORCHEGGROLL_FILES)
        try:
            self.load_state_dict(state)
        except CheckpointError as error:
            raise CheckpointError(f"checkpoint {str(path)!r}: {error}") from None


def _checked_history(rows: Any) -> list[GenerationStats]:
    """``[[generation, best, mean, std], ...]`` of a state, as :class:`GenerationStats`; nothing is written.

    Raises:
        CheckpointError: naming the first bad row.
    """
    if not isinstance(rows, (list, tuple)):
        raise CheckpointError(
            f"EggrollES state has a bad 'history': expected a list of [generation, best, mean, "
            f"std] rows, got {type(rows).__name__}"
        )
    history = []
    for i, row in enumerate(rows):
        ok = isinstance(row, (list, tuple)) and len(row) == 4 and all(is_real(v) for v in row)
        if ok:
            generation, best, mean, std = row
            ok = float(generation).is_integer() and generation >= 0 and not math.isnan(std) and std >= 0
        if not ok:
            raise CheckpointError(
                f"EggrollES state has a bad 'history': row {i} is {row!r}, expected "
                "[generation >= 0, best, mean, std >= 0] numbers"
            )
        history.append(GenerationStats(generation=int(generation), best=float(best), mean=float(mean), std=float(std)))
    return history


def _class_name(cls: type) -> str:
    """``'module.QualName'`` of a class (what a state records of its optimizer)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_optimizer_class(state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """The state's optimizer state was saved by an optimizer of ``optimizer``'s class; nothing is written.

    A state with ``'optimizer_class'`` names it (compared by class name); one without (saved before it was
    recorded) must hold, in every parameter group, exactly the options ``optimizer``'s groups hold, counting
    those its class fills in on load (an Adam state lacks ClipUp's ``max_speed``).

    Raises:
        CheckpointError: naming both classes (or the options that do not fit).
    """
    mine = _class_name(type(optimizer))
    if "optimizer_class" in state:
        recorded = state["optimizer_class"]
        if not isinstance(recorded, str) or not recorded:
            raise CheckpointError(
                f"EggrollES state has a bad 'optimizer_class': expected the optimizer's class name (a str such as "
                f"{mine!r}), got {recorded!r}"
            )
        if recorded.rsplit(".", 1)[-1] != type(optimizer).__qualname__.rsplit(".", 1)[-1]:
            raise CheckpointError(
                f"EggrollES state holds the state of a {recorded} optimizer, this ES's optimizer is a {mine}: an "
                "optimizer state loads only into an optimizer of the class that saved it (build the ES with the "
                "checkpoint's optimizer class)"
            )
        return
    for index, (saved, ours) in enumerate(zip(state["optimizer"]["param_groups"], optimizer.param_groups)):
        have = _group_options(type(optimizer), saved)
        need = set(ours) - _NOT_OPTIONS
        missing, foreign = sorted(need - have), sorted(have - need)
        if missing or foreign:
            raise CheckpointError(
                f"EggrollES state records no optimizer class (it was saved before populora recorded it) and its "
                f"optimizer state does not fit this ES's {mine}: parameter group {index} "
                + (f"lacks the option(s) {missing}" if missing else "")
                + (" and " if missing and foreign else "")
                + (f"holds the option(s) {foreign} a {type(optimizer).__name__} has not" if foreign else "")
                + " (a state saved with another optimizer class)"
            )


_NOT_OPTIONS = {"params", "param_names"}


def _group_options(cls: type[torch.optim.Optimizer], group: dict[str, Any]) -> set[str]:
    """The option names of a saved parameter group once ``cls`` has loaded it (its ``__setstate__`` fills in
    options added since the state was saved), found on a bare probe object (no parameters, nothing written)."""
    options = {key: value for key, value in group.items() if key not in _NOT_OPTIONS}
    try:
        probe = cls.__new__(cls)
        probe.__setstate__({"defaults": {}, "state": {}, "param_groups": [{**options, "params": []}]})
        return set(probe.param_groups[0]) - _NOT_OPTIONS
    except Exception:  # an optimizer whose __setstate__ needs more: the saved options as they are
        return set(options)
