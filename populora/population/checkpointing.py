"""Population's checkpoint protocol, and its checks before anything is written (all or nothing).

:meth:`Population.state_dict` is torch's: the base model's tensors under
``model.``, the adapter stacks under ``_downs.<t>`` / ``_ups.<t>`` (in the
stored layout: Linear ``down (P, r, d)``, Embedding ``down (P, V, r)``,
``up (P, r, e)``) and, under ``_extra_state``, the *extra state*: the config,
the generator state, ``generation``, ``eval_seed``, the weight scales and the
history. A population's checkpoint file holds the same dict without the
``model.`` keys. Version 0.1's ``Population.state()`` dicts (the *legacy*
layout: ``downs`` / ``ups`` lists beside the counters) are still read.

The functions check plain values and tensors and need no population;
:class:`Checkpointing` is the protocol ``Population`` inherits. Error messages quote shapes in the public layout of
:meth:`Population.factors`: ``down (P, d, r)``, ``up (P, e, r)``.
"""

from __future__ import annotations

import copy
import hashlib
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor, nn

from populora.checkpoint import (
    atomic_save,
    atomic_save_safetensors,
    is_safetensors_file,
    load_checkpoint,
    load_safetensors_checkpoint,
)
from populora.checks import check_float, check_one_of, check_seed, is_int, is_real
from populora.errors import CheckpointError, InvalidTypeError, PopuloraError
from populora.fitness import NAN_POLICIES
from populora.population.host import HostBase
from populora.snapshots import naming
from populora.stats import GenerationStats
from populora.transaction import closing_on_failure

if TYPE_CHECKING:
    from populora.population.host import PopulationHost
    from populora.population.population import Population

__all__: list[str] = []

FORMAT = "populora.population/1"
EXTRA_KEY = "_extra_state"
_LEGACY_KEYS = ("config", "downs", "ups", "generator", "generation", "eval_seed")
_EXTRA_KEYS = ("config", "generator", "generation", "eval_seed")
_CONFIG_KEYS = ("pop_size", "low_rank", "lora_targets")
_GENERATOR_KEY = EXTRA_KEY + ".generator"  # the generator state's tensor in a safetensors checkpoint
_CUDA_GENERATOR_STATE_BYTES = 16  # Philox: seed (8 bytes) and offset (8 bytes)


def public_shape(kind: str, shape: torch.Size | tuple[int, ...], embedding: bool) -> tuple[int, ...]:
    """A stored stack's shape in the layout of :meth:`Population.factors`.

    ``kind`` is ``'down'`` or ``'up'``: Linear ``down (P, r, d) -> (P, d, r)``,
    Embedding ``down (P, V, r)`` as it is, ``up (P, r, e) -> (P, e, r)``.
    """
    shape = tuple(shape)
    if len(shape) != 3 or (kind == "down" and embedding):
        return shape
    return (shape[0], shape[2], shape[1])


def as_state_dict(state: Any) -> Mapping[str, Any]:
    """``state`` in the ``state_dict`` layout: a legacy dict is checked and converted.

    Raises:
        CheckpointError: not a dict, or a damaged legacy dict.
    """
    if isinstance(state, Mapping) and "format" in state:
        return from_legacy(state)
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"a population state must be a dict (from Population.state_dict()), got {type(state).__name__}"
        )
    return state


def check_keys(
    state_dict: Mapping[str, Any],
    own: Mapping[str, Any],
    strict: bool,
    required: bool = False,
    targets: Sequence[str] = (),
) -> None:
    """Under ``strict``, the keys of ``own`` exactly; with ``required``, at least them.

    ``targets``: the population's target paths, to name adapter stacks by target rather than by key.
    """
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    stacks = [k for k in state_dict if k.startswith(("_downs.", "_ups."))]
    held = {k.split(".", 1)[1] for k in stacks}
    if targets and (strict or required) and held and len(held) != len(targets):
        raise CheckpointError(
            f"the population state holds adapters for {len(held)} target(s), this population has "
            f"{len(targets)}: {list(targets)} (a checkpoint of another lora_targets set; the state's adapters are "
            f"{_held(state_dict, stacks, held)})"
        )
    if missing and (strict or required):
        raise CheckpointError(f"the population state lacks the key(s) {_named(missing, targets)}")
    if unexpected and strict:
        raise CheckpointError(f"the population state has unexpected key(s) {_named(unexpected, targets)}")


def _held(state_dict: Mapping[str, Any], stacks: list[str], held: set[str]) -> str:
    """What a state tells of the targets its adapter stacks belong to: its config's paths if it has them, else the
    target indices of its keys."""
    extra = state_dict.get(EXTRA_KEY)
    config = extra.get("config") if isinstance(extra, Mapping) else None
    paths = config.get("lora_targets") if isinstance(config, Mapping) else None
    indices = sorted(held, key=lambda i: (not i.isdigit(), int(i) if i.isdigit() else 0, i))
    shown = [int(i) if i.isdigit() else i for i in indices]
    keys = sorted(stacks, key=lambda k: (indices.index(k.split(".", 1)[1]), k.startswith("_ups.")))
    if isinstance(paths, (list, tuple)):
        return f"at target indices {shown} in keys {keys}, while its config names {len(paths)}: {list(paths)}"
    return f"at target indices {shown} in keys {keys}, and it holds no extra state to name their paths"


def _named(keys: list[str], targets: Sequence[str]) -> str:
    """``keys``, each adapter stack followed by the target path it belongs to."""
    named = []
    for key in keys:
        kind, _, index = key.partition(".")
        if kind in ("_downs", "_ups") and index.isdigit() and int(index) < len(targets):
            named.append(f"{key!r} ({kind[1:-1]} adapter of {targets[int(index)]!r})")
        else:
            named.append(repr(key))
    return "[" + ", ".join(named) + "]"


def check_tensors(
    state_dict: Mapping[str, Any],
    own: Mapping[str, Tensor],
    targets: Sequence[str],
    embedding: Sequence[bool],
    pop_size: int,
) -> None:
    """Every tensor of ``state_dict`` that ``own`` has too is a tensor of the same shape.

    Adapter stacks are named by target, their shapes quoted in the public layout.
    """
    stacks = {
        f"_{kind}.{t}": (kind[:-1], name, emb)
        for kind in ("downs", "ups")
        for t, (name, emb) in enumerate(zip(targets, embedding))
    }
    for key, value in state_dict.items():
        if key not in own or key == EXTRA_KEY:
            continue
        if key in stacks:
            kind, name, emb = stacks[key]
            check_stack(f"the state's {kind} adapter of {name!r}", value, pop_size)
            if value.shape != own[key].shape:
                raise CheckpointError(
                    f"checkpoint {kind} adapter of {name!r} has shape "
                    f"{public_shape(kind, value.shape, emb)}, expected "
                    f"{public_shape(kind, own[key].shape, emb)}"
                )
        elif not isinstance(value, Tensor):
            raise CheckpointError(f"the state's {key!r} must be a tensor, got {type(value).__name__}")
        elif value.shape != own[key].shape:
            raise CheckpointError(
                f"checkpoint {key!r} has shape {tuple(value.shape)}, expected {tuple(own[key].shape)}"
            )


def from_legacy(state: Mapping[str, Any]) -> dict[str, Any]:
    """A legacy ``Population.state()`` dict, checked, in the ``state_dict`` layout (no ``model.`` keys)."""
    check_legacy(state)
    out: dict[str, Any] = {}
    for kind in ("downs", "ups"):
        for t, stack in enumerate(state[kind]):
            out[f"_{kind}.{t}"] = stack
    out[EXTRA_KEY] = {key: value for key, value in state.items() if key not in ("downs", "ups")}
    return out


def check_legacy(state: Any) -> None:
    """Everything in a legacy ``Population.state()`` dict that can be checked without a population.

    Raises:
        CheckpointError: naming the missing or wrong key.
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"a population state must be a dict (from Population.state_dict()), got {type(state).__name__}"
        )
    _check_format(state)
    missing = [key for key in _LEGACY_KEYS if key not in state]
    if missing:
        raise CheckpointError(
            f"the population state lacks the key(s) {missing} (a complete state has {list(_LEGACY_KEYS)})"
        )
    check_extra(state)
    targets = state["config"]["lora_targets"]
    for kind in ("downs", "ups"):
        stacks = state[kind]
        if not isinstance(stacks, (list, tuple)) or len(stacks) != len(targets):
            raise CheckpointError(
                f"the state's {kind!r} must be a list of one tensor per target "
                f"({len(targets)}), got {type(stacks).__name__}"
                + (f" of {len(stacks)}" if isinstance(stacks, (list, tuple)) else "")
            )
        for name, t in zip(targets, stacks):
            check_stack(f"the state's {kind!r} entry of {name!r}", t, state["config"]["pop_size"])


def check_stack(where: str, t: Any, pop_size: int) -> None:
    """``t`` is a 3-D floating-point ``(pop_size, ., .)`` tensor."""
    if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() != 3:
        got = f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
        raise CheckpointError(f"{where} must be a 3-D floating-point tensor, got {got}")
    if t.shape[0] != pop_size:
        raise CheckpointError(f"{where} holds {t.shape[0]} individuals, its config says pop_size={pop_size}")


def _check_format(state: Mapping[str, Any]) -> None:
    if state.get("format") != FORMAT:
        raise CheckpointError(
            f"not a populora population state: 'format' is {state.get('format')!r}, expected {FORMAT!r}"
        )


def check_extra(extra: Any, mine: Mapping[str, Any] | None = None) -> None:
    """The extra state (config, counters, generator, weight scales, history), each value checked.

    ``mine``: ``{pop_size, low_rank, lora_targets}`` of the population it
    must fit, if any.

    Raises:
        CheckpointError: naming the missing or wrong key.
    """
    if not isinstance(extra, Mapping):
        raise CheckpointError(f"the population's extra state must be a dict, got {type(extra).__name__}")
    _check_format(extra)
    missing = [key for key in _EXTRA_KEYS if key not in extra]
    if missing:
        raise CheckpointError(f"the population state lacks the key(s) {missing}")
    config = extra["config"]
    if not isinstance(config, Mapping):
        raise CheckpointError(f"the state's 'config' must be a dict, got {type(config).__name__}")
    missing = [key for key in _CONFIG_KEYS if key not in config]
    if missing:
        raise CheckpointError(f"the state's 'config' lacks the key(s) {missing}")
    for key, low in (("pop_size", 1), ("low_rank", 1)):
        if not is_int(config[key]) or config[key] < low:
            raise CheckpointError(f"the state's config {key!r} must be an int >= {low}, got {config[key]!r}")
    targets = config["lora_targets"]
    if not isinstance(targets, (list, tuple)) or not targets or not all(isinstance(t, str) for t in targets):
        raise CheckpointError(f"the state's config 'lora_targets' must be a non-empty list of str, got {targets!r}")
    for key, value in (mine or {}).items():
        if (list(config[key]) if key == "lora_targets" else config[key]) != value:
            raise CheckpointError(f"checkpoint has {key}={config[key]!r}, this population has {value!r}")
    try:
        if "seed" in config:
            check_seed("seed", config["seed"])
        if "init_scale" in config:
            check_float("init_scale", config["init_scale"], low=0.0)
        if "nan_policy" in config:
            check_one_of("nan_policy", config["nan_policy"], NAN_POLICIES)
    except PopuloraError as err:
        raise CheckpointError(f"the state's config: {err}") from None
    for key in ("generation", "eval_seed"):
        if not is_int(extra[key]) or (key == "generation" and extra[key] < 0):
            raise CheckpointError(
                f"the state's {key!r} must be an int"
                + (" >= 0" if key == "generation" else "")
                + f", got {extra[key]!r}"
            )
    generator = extra["generator"]
    if not isinstance(generator, Tensor) or generator.dtype != torch.uint8 or generator.dim() != 1:
        got = (
            f"{generator.dtype} tensor of shape {tuple(generator.shape)}"
            if isinstance(generator, Tensor)
            else (type(generator).__name__)
        )
        raise CheckpointError(
            f"the state's 'generator' must be a 1-D uint8 tensor (torch.Generator.get_state()), got {got}"
        )
    scales = extra.get("weight_scales")
    if scales is not None and (
        not isinstance(scales, (list, tuple))
        or len(scales) != len(targets)
        or not all(is_real(s) and s > 0 for s in scales)
    ):
        raise CheckpointError(
            f"the state's 'weight_scales' must be a list of one positive float per target "
            f"({len(targets)}), got {scales!r}"
        )
    history = extra.get("history")
    if history is not None and (
        not isinstance(history, (list, tuple))
        or not all(
            isinstance(s, (list, tuple))
            and 3 <= len(s) <= len(GenerationStats._fields)
            and is_int(s[0])
            and all(is_real(v) for v in s[1:3])
            and all(v is None or is_real(v) for v in s[3:])
            for s in history
        )
    ):
        raise CheckpointError(
            "the state's 'history' must be a list of [generation, best, mean, std, validated, "
            "env_steps] entries (the last three may be None or left out)"
        )


def _stats(entry: Sequence[Any]) -> GenerationStats:
    """A checked history entry as ``GenerationStats`` (``env_steps`` an int, the other fields floats or None)."""
    values: list[Any] = [int(entry[0]), float(entry[1]), float(entry[2])]  # GenerationStats' fields, in order
    for field, v in zip(GenerationStats._fields[3:], entry[3:]):
        values.append(None if v is None else int(v) if field == "env_steps" else float(v))
    return GenerationStats(*values)


def restore_generator(saved: Tensor, device: torch.device) -> torch.Generator:
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
            raise CheckpointError(
                f"the state's 'generator' is not a valid {device.type} generator state: {err}"
            ) from None
        return generator
    other = {torch.Generator().get_state().numel(), _CUDA_GENERATOR_STATE_BYTES} - {own}
    if saved.numel() not in other:
        raise CheckpointError(
            f"the state's 'generator' holds {saved.numel()} bytes, which is no generator state "
            f"(a {device.type} generator's has {own}): it is truncated or damaged"
        )
    seed = int.from_bytes(hashlib.sha256(saved.cpu().numpy().tobytes()).digest()[:8], "little")
    generator.manual_seed(seed)
    warnings.warn(
        f"the checkpoint's generator state ({saved.numel()} bytes) is for another device type than "
        f"{device}; reseeded from it, so the run continues deterministically but not bit-identically",
        stacklevel=4,
    )
    return generator


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A Population checkpoint file's state dict, whichever format :meth:`Checkpointing.save` wrote.

    A safetensors file (told by its content, not its name) gives its tensors
    and, under ``_extra_state``, its metadata with the generator state put
    back; the content hash is checked first (see
    :func:`populora.checkpoint.load_safetensors_checkpoint`).
    """
    if not is_safetensors_file(path):
        return load_checkpoint(path, kind="Population")
    tensors, meta = load_safetensors_checkpoint(path, kind="Population")
    if not isinstance(meta, dict) or _GENERATOR_KEY not in tensors:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is a populora safetensors file without the population's "
            f"extra state (metadata and {_GENERATOR_KEY!r})"
        )
    return {
        **{k: v for k, v in tensors.items() if k != _GENERATOR_KEY},
        EXTRA_KEY: {**meta, "generator": tensors[_GENERATOR_KEY]},
    }


class CheckedState(NamedTuple):
    """A population state checked by :meth:`Checkpointing.check_state_dict` (nothing written yet).

    Attributes:
        tensors: the module tensors to load (adapters, and the base model's when given).
        extra: the checked extra state (config, generator rebuilt, counters, history), or ``None``.
        layout: ``(pop_size, low_rank, target paths)`` of the population it was checked against.
    """

    tensors: dict[str, Tensor]
    extra: dict[str, Any] | None
    layout: tuple


def _layout(population: PopulationHost) -> tuple:
    return (population.pop_size, population.low_rank, tuple(population.target_names))


class Checkpointing(HostBase):
    """:class:`~populora.Population`'s checkpoint protocol (a mixin ahead of ``nn.Module``).

    torch's ``state_dict`` / ``load_state_dict`` with the generator, counters
    and history as extra state; the all-or-nothing load in two public halves
    (:meth:`check_state_dict`, :meth:`load_checked_state_dict`); snapshots and
    the file helpers. Reads the population through
    :class:`~populora.population.host.PopulationHost`.
    """

    def get_extra_state(self) -> dict[str, Any]:
        """What :meth:`state_dict` holds besides tensors of modules: config, generator, counters, history.

        ``{'format', 'config', 'generator' (uint8 state), 'generation',
        'eval_seed', 'weight_scales', 'history' (``list(GenerationStats)``
        per entry)}``; the generator state is a copy.
        """
        return {
            "format": FORMAT,
            "config": {
                "pop_size": self.pop_size,
                "low_rank": self.low_rank,
                "seed": self.seed,
                "init_scale": self.init_scale,
                "nan_policy": self.nan_policy,
                "lora_targets": list(self.target_names),
            },
            "generator": self.generator.get_state().clone(),
            "generation": self.generation,
            "eval_seed": self.eval_seed,
            "weight_scales": list(self.weight_scales),
            "history": [list(s) for s in self.history],  # GenerationStats' fields, None where not recorded
        }

    def set_extra_state(self, state: Any) -> None:
        """Restore :meth:`get_extra_state` (checked first; called by ``load_state_dict``)."""
        self._write_extra(self._check_extra(state))

    def state_dict(
        self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False, include_model: bool = True
    ) -> dict[str, Any]:
        """torch's state dict: base weights, adapters and (``_extra_state``) generator and counters.

        Like every module's, it holds references to the live tensors (copy it,
        or use :meth:`save`, to keep a snapshot): the base model's under
        ``model.``, the adapter stacks under ``_downs.<t>`` / ``_ups.<t>`` in
        the stored layout (Linear ``down (P, r, d)``, Embedding ``down (P, V, r)``,
        ``up (P, r, e)``; :meth:`factors` gives the public ``(P, d, r)`` /
        ``(P, e, r)`` views), and under ``_extra_state`` the config, the
        generator state, ``generation``, ``eval_seed``, the weight scales and
        :attr:`history`, so ``pop.load_state_dict(other.state_dict())``
        resumes ``other``'s run bit for bit.

        Args:
            include_model: ``False`` leaves out the ``model.`` keys (what a
                checkpoint file holds: the adapters and counters).
        """
        self._check_alive()
        # at run time super() is nn.Module's state_dict (Population's MRO); mypy sees the host protocol's stub
        out = super().state_dict(  # type: ignore[safe-super]
            *args, destination=destination, prefix=prefix, keep_vars=keep_vars
        )
        if not include_model:
            for key in [k for k in out if k.startswith(prefix + "model.")]:
                del out[key]
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Restore :meth:`state_dict` (with or without the ``model.`` keys): all or nothing.

        Everything is checked first (the keys, every tensor's shape, the
        config against this population, the counters and the generator
        state); only then is anything written. A dict without any ``model.``
        key (a checkpoint file's, ``state_dict(include_model=False)``) leaves
        the base model as it is. Version 0.1's ``state()`` dicts are read too.

        Raises:
            CheckpointError: naming the missing, unexpected or wrong key and
                what was expected (shapes in the public layout of
                :meth:`factors`); the population is unchanged.
        """
        return self.load_checked_state_dict(self.check_state_dict(state_dict, strict), assign)

    def check_state_dict(self: PopulationHost, state_dict: Any, strict: bool = True) -> CheckedState:
        """The first half of :meth:`load_state_dict`: ``state_dict`` checked against this population.

        Nothing is written, so a caller holding several objects can check every
        state before it loads any (``Coevolve``, ``SelfPlay``); the result goes
        to :meth:`load_checked_state_dict`.

        Raises:
            CheckpointError: as :meth:`load_state_dict`.
        """
        self._check_alive()
        state_dict = as_state_dict(state_dict)
        own = self.state_dict(keep_vars=True, include_model=any(k.startswith("model.") for k in state_dict))
        # the extra state first: a checkpoint of another target set is named by its target paths
        extra = self._check_extra(state_dict[EXTRA_KEY]) if EXTRA_KEY in state_dict else None
        check_keys(state_dict, own, strict, targets=self.target_names)
        check_tensors(state_dict, own, self.target_names, self._embedding, self.pop_size)
        tensors = {k: v for k, v in state_dict.items() if k != EXTRA_KEY}
        return CheckedState(tensors, extra, _layout(self))

    def load_checked_state_dict(self: PopulationHost, checked: CheckedState, assign: bool = False) -> Any:
        """The second half of :meth:`load_state_dict`: write a state :meth:`check_state_dict` returned.

        Raises:
            InvalidTypeError: ``checked`` is not a :class:`CheckedState`.
            CheckpointError: it was checked against a population of another layout.
        """
        self._check_alive()
        if not isinstance(checked, CheckedState):
            raise InvalidTypeError(
                f"`checked` must be what check_state_dict() returned (a CheckedState), got {type(checked).__name__}"
            )
        if checked.layout != _layout(self):
            raise CheckpointError(
                f"this state was checked against a population of another layout {checked.layout}, not this "
                f"one {_layout(self)}: check it with this population's check_state_dict()"
            )
        # the host is an nn.Module at run time (Population); the protocol cannot say so
        result = nn.Module.load_state_dict(self, checked.tensors, strict=False, assign=assign)  # type: ignore[arg-type]
        if checked.extra is not None:
            self._write_extra(checked.extra)
        return result

    def snapshot(self: PopulationHost, device: str | torch.device | None = None) -> dict[str, Any]:
        """A copy of the adapters and counters (``state_dict(include_model=False)``) sharing no storage.

        For rollback (``load_state_dict(snapshot)`` restores it bit for bit)
        and checkpoints.

        Args:
            device: where the tensors are copied (``None``: where they are; ``"cpu"`` for a file).
        """
        return {
            k: (v.detach().to(device, copy=True) if device is not None else v.detach().clone())
            if isinstance(v, Tensor)
            else copy.deepcopy(v)
            for k, v in self.state_dict(include_model=False).items()
        }

    def transaction_state(self) -> dict[str, Any]:
        """:meth:`snapshot`: what :func:`populora.transaction.transaction` keeps of a population."""
        return self.snapshot()

    def restore_transaction_state(self: PopulationHost, state: dict[str, Any]) -> None:
        """Put back a :meth:`transaction_state` (bit for bit)."""
        self.load_state_dict(state)

    def _check_extra(self, extra: Any) -> dict[str, Any]:
        """The extra state checked against this population, with its generator rebuilt (nothing written)."""
        check_extra(
            extra, {"pop_size": self.pop_size, "low_rank": self.low_rank, "lora_targets": list(self.target_names)}
        )
        converted: dict[str, Any] = {"generation": int(extra["generation"]), "eval_seed": int(extra["eval_seed"])}
        try:  # every conversion happens here, before anything is written
            if extra.get("weight_scales") is not None:
                converted["weight_scales"] = [float(s) for s in extra["weight_scales"]]
            if extra.get("history") is not None:
                converted["history"] = [_stats(s) for s in extra["history"]]
        except (OverflowError, ValueError) as err:
            raise CheckpointError(f"the state's weight scales or history hold a number beyond float64: {err}") from None
        if not all(math.isfinite(s) for s in converted.get("weight_scales", ())):
            raise CheckpointError(f"the state's 'weight_scales' must be finite, got {extra['weight_scales']!r}")
        return {**extra, **converted, "generator": restore_generator(extra["generator"], self.device)}

    def _write_extra(self, extra: Mapping[str, Any]) -> None:
        """Write an extra state :meth:`_check_extra` returned (every value already converted)."""
        self.generator = extra["generator"]
        self.generation = extra["generation"]
        self.eval_seed = extra["eval_seed"]
        # annotated: mypy reads an assignment in a subclass of the host protocol as a new definition
        self.nan_policy: str = extra["config"].get("nan_policy", self.nan_policy)
        if extra.get("weight_scales") is not None:
            self.weight_scales = list(extra["weight_scales"])
        if extra.get("history") is not None:
            self.history = list(extra["history"])

    def save(self, path: str | Path, *, format: str | None = None) -> Path:
        """Write the adapters and counters (``state_dict(include_model=False)``) atomically; no base model.

        Args:
            path: the file to write.
            format: ``'torch'`` (populora's verified ``torch.save`` file) or
                ``'safetensors'`` (the adapter stacks as safetensors tensors,
                the config, counters and history as JSON in its metadata, a
                SHA-256 of the tensors beside them; needs ``safetensors``);
                default ``None``: ``'safetensors'`` for a ``.safetensors``
                suffix, else ``'torch'``. :meth:`load` and
                :meth:`from_checkpoint` read both.

        Returns:
            The ``Path`` written.
        """
        format = check_one_of("format", format, (None, "torch", "safetensors"))
        if format is None:
            format = "safetensors" if Path(path).suffix == ".safetensors" else "torch"
        snapshot = {
            k: v.detach().to("cpu", copy=True) if isinstance(v, Tensor) else v
            for k, v in self.state_dict(include_model=False).items()
        }
        if format == "torch":
            return atomic_save(snapshot, path, kind="Population")
        extra = dict(snapshot.pop(EXTRA_KEY))
        snapshot[_GENERATOR_KEY] = extra.pop("generator")
        return atomic_save_safetensors(snapshot, extra, path, kind="Population")

    def load(self, path: str | Path) -> None:
        """Resume from :meth:`save`'s checkpoint (either format): adapters, generator, counters, history.

        Raises:
            FileNotFoundError: nothing at ``path``.
            CheckpointError: the file is empty, truncated, corrupted, of
                another kind, or does not fit this population (the file is
                named); the population is unchanged.
        """
        state = read_checkpoint(path)
        with naming(path):
            self.load_state_dict(state)

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
        state: Mapping[str, Any] = read_checkpoint(path)
        with naming(path):
            state = as_state_dict(state)
            check_keys(state, {EXTRA_KEY: None}, strict=False, required=True)
            check_extra(state[EXTRA_KEY])
        config = dict(state[EXTRA_KEY]["config"])
        config.update(kwargs)
        population: Any = cls  # a Population at run time (this mixin's host), whose constructor this is
        pop: Population = population(
            model, config.pop("pop_size"), config.pop("low_rank"), config.pop("lora_targets"), **config
        )
        with closing_on_failure() as undo:
            undo.callback(pop.close)  # a file that does not fit gives the user's model back unwrapped
            with naming(path):
                pop.load_state_dict(state)
        return pop
