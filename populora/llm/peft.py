"""One individual as a PEFT LoRA adapter, and a PEFT LoRA adapter into one individual.

A PEFT LoRA layer computes ``base(x) + lora_B(lora_A(x)) * scaling`` with
``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with rsLoRA); an
individual adds ``(x @ down[i]) @ up[i].T``. So, per target:

- :func:`to_peft` writes ``lora_A = down[i].T`` ``(r, d)`` and
  ``lora_B = up[i]`` ``(e, r)`` with ``lora_alpha = r`` (scaling 1), for an
  ``nn.Embedding`` target ``lora_embedding_A = down[i].T`` ``(r, V)`` and
  ``lora_embedding_B = up[i]`` ``(e, r)`` (PEFT's embedding layout), into
  ``adapter_config.json`` + ``adapter_model.safetensors`` under the keys
  ``base_model.model.<target path>.lora_A.weight`` (and so on) that
  ``PeftModel.from_pretrained`` reads;
- :func:`load_peft_` reads ``down = lora_A.T`` and ``up = lora_B * scaling``.

Only ``safetensors`` is needed (imported when called); ``transformers`` is
consulted only to tell whether the model is a causal LM, and only if it is
already imported (a Hugging Face model implies it is).

Example (a plain module; the folder loads with ``PeftModel.from_pretrained``):
    >>> import tempfile, torch
    >>> from torch import nn
    >>> from populora import Population
    >>> from populora.llm import load_peft_, to_peft
    >>> pop = Population(nn.Sequential(nn.Linear(4, 4)), pop_size=2, low_rank=2, init_scale=1.0)
    >>> folder = to_peft(pop, 0, tempfile.mkdtemp() + "/best")
    >>> sorted(p.name for p in folder.iterdir())
    ['adapter_config.json', 'adapter_model.safetensors']
    >>> load_peft_(pop, 1, folder)
    >>> all(torch.equal(d[0], d[1]) and torch.equal(u[0], u[1]) for d, u in pop.factors())
    True
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import secrets
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from populora.checkpoint import check_nesting
from populora.checks import check_bool, check_index
from populora.errors import CheckpointError, InvalidTypeError, InvalidValueError

__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "load_peft_", "to_peft"]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_LINEAR_KEYS = ("lora_A.weight", "lora_B.weight")
_EMBEDDING_KEYS = ("lora_embedding_A", "lora_embedding_B")
# PEFT 0.21's LoRA variants (fields marked `is_lora_variant`) and the options that change what the
# tensors mean or where they apply; DoRA, bias, lora_bias, fan_in_fan_out, layer_replication are checked apart
_VARIANTS = (
    "velora_config",
    "alora_invocation_tokens",
    "monteclora_config",
    "use_bdlora",
    "arrow_config",
    "kasa_config",
    "use_qalora",
    "target_parameters",
    "trainable_token_indices",
)
_TASK_TYPES = ("SEQ_CLS", "SEQ_2_SEQ_LM", "CAUSAL_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION")
_ALL_LINEAR = "all-linear"  # PEFT's shorthand (compared lower-cased)


# ---------------------------------------------------------------------------------------------- export


def to_peft(
    pop: Any,
    individual: int,
    path: str | Path,
    *,
    base_model_name_or_path: str | None = None,
    task_type: str | None = "auto",
) -> Path:
    """Write individual ``individual`` of ``pop`` as a PEFT LoRA adapter folder at ``path``.

    The folder holds ``adapter_config.json`` and ``adapter_model.safetensors``
    (tensors in the adapters' dtype, on CPU): per Linear target
    ``lora_A.weight = down[i].T`` ``(r_t, d)`` and ``lora_B.weight = up[i]``
    ``(e, r_t)``, per Embedding target ``lora_embedding_A = down[i].T``
    ``(r_t, V)`` and ``lora_embedding_B = up[i]`` ``(e, r_t)``, where ``r_t``
    is the target's effective rank ``min(low_rank, d, e)``; ``lora_alpha``
    equals the rank, so PEFT's scaling is exactly 1 and
    ``PeftModel.from_pretrained(base, path)`` computes what
    ``pop(x, individual=i)`` computes. ``r`` is the largest effective rank;
    targets of smaller rank get ``rank_pattern`` / ``alpha_pattern``
    entries. ``target_modules`` lists the full module paths; if PEFT's
    suffix matching would also catch a module that is not a target, it is
    written as an anchored regex instead, so exactly the targets are adapted.

    Written atomically as a folder: into a temporary folder beside ``path``,
    then renamed into place. An existing adapter folder at ``path`` is
    replaced (other files in it, e.g. a README, are carried over); if the
    process dies between the two renames of a replacement, the old folder
    survives as ``.<name>.old-*`` beside it.

    Args:
        pop: a live :class:`~populora.Population`.
        individual: the id ``i`` in ``[0, P)``.
        path: the adapter folder to write.
        base_model_name_or_path: recorded in the config (default: the model's
            ``name_or_path`` when it has a non-empty one, else ``None``).
        task_type: PEFT's task type; ``'auto'`` gives ``'CAUSAL_LM'`` for a
            Hugging Face causal LM and ``None`` otherwise (``PeftModel`` then
            calls the model's forward as it is), or one of PEFT's task types.

    Returns:
        The folder's ``Path``.

    Raises:
        InvalidIndexError: ``individual`` outside ``[0, P)``.
        InvalidValueError: ``path`` exists and is not a PEFT adapter folder
            (nothing is replaced), or an unknown ``task_type``.
    """
    _check_alive(pop)
    i = check_index("individual", _as_index(individual), pop.pop_size)
    path = Path(path)
    if task_type == "auto":
        task_type = "CAUSAL_LM" if _is_causal_lm(pop.model) else None
    elif task_type is not None and task_type not in _TASK_TYPES:
        raise InvalidValueError(f"`task_type` must be 'auto', None or one of {list(_TASK_TYPES)}, got {task_type!r}")
    if base_model_name_or_path is None:
        base_model_name_or_path = getattr(pop.model, "name_or_path", None) or None
    elif not isinstance(base_model_name_or_path, str):
        raise InvalidTypeError(
            f"`base_model_name_or_path` must be a str or None, got {type(base_model_name_or_path).__name__}"
        )
    if path.exists() and not (path.is_dir() and ((path / CONFIG_NAME).is_file() or not any(path.iterdir()))):
        raise InvalidValueError(
            f"{str(path)!r} exists and is not a PEFT adapter folder (no {CONFIG_NAME}); refusing to replace it"
        )

    tensors: dict[str, Tensor] = {}
    ranks: dict[str, int] = {}
    with torch.no_grad():
        for name, (down, up) in zip(pop.target_names, pop.factors()):
            a_key, b_key = _EMBEDDING_KEYS if _is_embedding(pop, name) else _LINEAR_KEYS
            tensors[f"{_PREFIX}{name}.{a_key}"] = down[i].T.detach().cpu().contiguous()
            tensors[f"{_PREFIX}{name}.{b_key}"] = up[i].detach().cpu().contiguous()
            ranks[name] = down.shape[-1]
    r = max(ranks.values())
    config = {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_model_name_or_path,
        "r": r,
        "lora_alpha": r,
        "target_modules": _target_modules(pop.model, list(ranks)),
        "rank_pattern": (pattern := _rank_pattern(ranks, r)),
        "alpha_pattern": dict(pattern),
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "init_lora_weights": True,
        "inference_mode": True,
        "revision": None,
    }
    _write_folder(path, config, tensors)
    return path


def _target_modules(model: nn.Module, names: list[str]) -> list[str] | str:
    """Full paths, or an anchored regex if PEFT's suffix rule (``key.endswith('.' + t)``) over-matches."""
    chosen = set(names)
    over = [key for key, _ in model.named_modules() if key not in chosen and any(key.endswith(f".{t}") for t in names)]
    if over:
        return "^(?:" + "|".join(re.escape(n) for n in names) + ")$"
    return list(names)


def _rank_pattern(ranks: dict[str, int], r: int) -> dict[str, int]:
    """Per-target ranks that differ from ``r`` (PEFT's ``rank_pattern``; ``alpha`` equals it).

    PEFT takes the first key matching ``(.*\\.)?(key)$``; a key may also
    catch a target that has it as a dotted suffix, so such targets are listed
    too, and keys go longest first: then each target's first match is itself.
    """
    odd = {n for n, k in ranks.items() if k != r}
    listed = odd | {n for n in ranks if any(n.endswith(f".{o}") for o in odd)}
    return {re.escape(n): ranks[n] for n in sorted(listed, key=lambda n: (-len(n), n))}


def _write_folder(path: Path, config: dict[str, Any], tensors: dict[str, Tensor]) -> None:
    from safetensors.torch import save_file

    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_folder(parent, f".{path.name}.", ".tmp")
    old: Path | None = None
    try:
        save_file(tensors, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
        for name in (WEIGHTS_NAME, CONFIG_NAME):
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        if path.exists():
            for entry in path.iterdir():  # carry over what is not ours (a README, a tokenizer)
                if entry.name not in (WEIGHTS_NAME, CONFIG_NAME):
                    (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, tmp / entry.name)
            old = _fresh_folder(parent, f".{path.name}.old-", "")
            os.replace(path, old / path.name)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old / path.name, path)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not any(old.iterdir()):
            old.rmdir()
        raise


def _fresh_folder(parent: Path, prefix: str, suffix: str) -> Path:
    """A new empty folder in ``parent`` with the default permissions (``mkdtemp`` would give 0o700)."""
    while True:
        folder = parent / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


def _is_causal_lm(model: nn.Module) -> bool:
    if "transformers" not in sys.modules:  # not a Hugging Face model
        return False
    try:
        from transformers import PreTrainedModel
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return False
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return isinstance(model, PreTrainedModel) and type(model).__name__ in causal


# ---------------------------------------------------------------------------------------------- import


def load_peft_(
    pop: Any,
    individual: int,
    path: str | Path,
    *,
    strict: bool = True,
    optimizer: Any = None,
    optimizer_state: str = "inherit",
) -> None:
    """Load the PEFT LoRA adapter folder ``path`` into individual ``individual`` of ``pop``.

    Per target: ``down = lora_A.T`` and ``up = lora_B * lora_alpha / r``
    (``/ sqrt(r)`` with ``use_rslora``; ``r`` and ``lora_alpha`` from
    ``rank_pattern`` / ``alpha_pattern`` where they name the target), so the
    routed individual computes what ``PeftModel`` computes with this adapter
    on the same base. An adapter of rank ``r`` below the target's effective
    rank ``r_t`` fills the first ``r`` columns, the rest zero; the routed
    output is the same. The factors are computed in at least float32, then
    cast to the adapters' dtype.

    Only the modules ``PeftModel`` adapts are loaded, by PEFT's rules:
    ``target_modules`` as a list matches a module's full name or a
    ``.suffix`` of it (then filtered by ``layers_to_transform`` /
    ``layers_pattern``), as a string it is a regex that must match the whole
    name, ``"all-linear"`` is every linear layer but the output layer; a
    module matching ``exclude_modules`` (same rules) is left out. Tensors
    in the file for any other module are not applied (PEFT ignores them).

    Everything is read and checked before anything is written: a load that
    raises leaves the population exactly as it was.

    Args:
        pop: a live :class:`~populora.Population`.
        individual: the id ``i`` in ``[0, P)``.
        path: a folder with ``adapter_config.json`` and
            ``adapter_model.safetensors`` (as ``save_pretrained`` writes it).
        strict: every target must be adapted by the config and be in the
            file, and every tensor in the file must belong to such a target
            (PEFT itself only warns about missing keys and leaves those
            layers a silent no-op); a copy of
            a target's base weight (``<path>.base_layer.weight``, which
            PEFT saves for the embedding layers it adapts) must equal the
            base model's. With ``strict=False`` the tensors of modules that
            are not adapted targets (and differing base-weight copies) are
            ignored, and the targets the config leaves out or the file does
            not hold get a zero adapter (the base layer, as under PEFT), so
            individual ``i`` computes what
            ``PeftModel`` computes on the targets it shares.

    Raises:
        FileNotFoundError: ``path`` is not a folder holding both files.
        CheckpointError: a file is damaged (not JSON, JSON nested more than
            ``populora.checkpoint.MAX_NESTING`` deep, not safetensors), the
            config is one PEFT's ``LoraConfig`` refuses (a pattern that is not
            a valid regex, ``layers_to_transform`` with a regex
            ``target_modules``, fields of the wrong type), or the tensors
            disagree with the config or with each other (a ``lora_A``
            without its ``lora_B``, ranks that differ).
        InvalidValueError: the adapter is not one populora can represent:
            ``peft_type`` other than ``'LORA'``, ``use_dora``,
            ``bias != 'none'``, ``lora_bias``, ``fan_in_fan_out``,
            ``layer_replication``, the other LoRA variants of PEFT 0.21
            (aLoRA, VeLoRA, MonteCLoRA, BD-LoRA, Arrow, KaSA, QALoRA,
            MiCA), ``target_parameters``, ``trainable_token_indices``,
            ``modules_to_save``, ``ensure_weight_tying``, a null
            ``target_modules`` (PEFT's per-architecture defaults), a
            ``target_modules`` that matches no module of the model;
            a rank above the target's ``r_t``; shapes
            that are not the target's; non-finite values; missing or
            unexpected keys under ``strict=True``.
        InvalidIndexError: ``individual`` outside ``[0, P)``.
    """
    _check_alive(pop)
    i = check_index("individual", _as_index(individual), pop.pop_size)
    strict = check_bool("strict", strict)
    path = Path(path)
    config = _read_config(path)
    tensors = _read_tensors(path)
    where = f"PEFT adapter {str(path)!r}"

    adapted = _adapted_modules(config, pop.model, where)
    factors = pop.factors()
    targets = {
        name: (_is_embedding(pop, name), down.shape[1:], up.shape[1:])
        for name, (down, up) in zip(pop.target_names, factors)
    }
    # PeftModel wraps only the modules its config adapts: tensors of any other module are not applied
    found, unexpected = _match_keys(
        tensors, {n: t for n, t in targets.items() if n in adapted}, pop.model, strict, where
    )
    left_out = [name for name in targets if name not in adapted]
    missing = [name for name in targets if name in adapted and name not in found]
    if strict and (left_out or missing or unexpected):
        parts = []
        if left_out:
            parts.append(
                f"targets the adapter's config does not adapt (its target_modules / exclude_modules / "
                f"layers_to_transform leave them out; PeftModel keeps them as base layers): {left_out}"
            )
        if missing:
            parts.append(f"targets missing from the file: {missing}")
        if unexpected:
            parts.append(f"tensors that belong to no target: {unexpected}{_hint(unexpected, missing)}")
        raise InvalidValueError(
            f"{where} does not fit the population's targets ({'; '.join(parts)}); pass "
            "strict=False to load the targets that match and give the others a zero adapter"
        )

    new = []
    for name, (down, up) in zip(pop.target_names, factors):
        embedding, (d, r_t), (e, _) = targets[name]
        fresh_down = torch.zeros(d, r_t, dtype=down.dtype, device=down.device)
        fresh_up = torch.zeros(e, r_t, dtype=up.dtype, device=up.device)
        if name in found:
            a, b = found[name]
            lora_a, lora_b = tensors[a], tensors[b]
            rank = _check_pair(where, name, a, b, lora_a, lora_b, d, e, r_t, embedding)
            scaling = _scaling(config, name, rank, where)
            wide = torch.promote_types(lora_b.dtype, torch.float32)
            fresh_down[:, :rank] = lora_a.T.to(device=down.device, dtype=down.dtype)
            fresh_up[:, :rank] = (lora_b.to(wide) * scaling).to(device=up.device, dtype=up.dtype)
            if not (torch.isfinite(fresh_down).all() and torch.isfinite(fresh_up).all()):
                raise InvalidValueError(
                    f"{where}: the adapter of {name!r} holds non-finite values "
                    f"(in {a!r} or {b!r}, or after scaling by {scaling} into {up.dtype})"
                )
        new.append((fresh_down, fresh_up))

    pop.set_factors_(i, new, optimizer=optimizer, optimizer_state=optimizer_state)


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise FileNotFoundError(f"no PEFT adapter folder at {str(path)!r}")
    where = f"PEFT adapter {str(path)!r}"
    file = path / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(f"{where} has no {CONFIG_NAME}")
    try:
        config = json.loads(file.read_text())
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError; RecursionError: deep nesting
        raise CheckpointError(
            f"{where}: {CONFIG_NAME} is not valid JSON ({type(err).__name__}: {str(err)[:200]})"
        ) from None
    check_nesting(config, f"{where}: {CONFIG_NAME}", "content")
    if not isinstance(config, dict):
        raise CheckpointError(f"{where}: {CONFIG_NAME} must hold a JSON object, got {type(config).__name__}")
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise InvalidValueError(f"{where} is a {peft_type!r} adapter; only peft_type 'LORA' can be loaded")
    refused = {
        "use_dora": (
            config.get("use_dora", False),
            False,
            "DoRA rescales each weight column by a learned magnitude, which is not a low-rank delta",
        ),
        "bias": (config.get("bias", "none"), "none", "trained biases are not part of a LoRA individual"),
        "lora_bias": (config.get("lora_bias", False), False, "lora_B has a bias, which a LoRA individual lacks"),
        "fan_in_fan_out": (
            config.get("fan_in_fan_out", False),
            False,
            "it is for Conv1D layers (GPT-2 style), "
            "whose weight is stored transposed; populora's targets are nn.Linear / nn.Embedding",
        ),
        "layer_replication": (config.get("layer_replication"), None, "it duplicates layers of the base model"),
        "modules_to_save": (
            config.get("modules_to_save") or None,
            None,
            "it trains full copies of those modules, which a LoRA individual cannot hold",
        ),
        "ensure_weight_tying": (
            config.get("ensure_weight_tying", False),
            False,
            "it shares one adapter between tied layers, which populora does not mirror",
        ),
    }
    for key, (value, wanted, why) in refused.items():
        if value != wanted and not (wanted is False and value is None):
            raise InvalidValueError(f"{where} has {key}={value!r}, expected {wanted!r}: {why}")
    for key in _VARIANTS:
        if config.get(key) not in (None, False, {}, [], ""):
            raise InvalidValueError(
                f"{where} sets {key}={config[key]!r}: a LoRA variant or option whose forward is "
                "not plain LoRA's base(x) + B A x * scaling; only plain LoRA can be loaded"
            )
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.startswith("mica"):
        raise InvalidValueError(
            f"{where} sets init_lora_weights={init!r} (PEFT's MiCA variant); only plain LoRA can be loaded"
        )
    for key in ("r", "lora_alpha"):
        if not _is_number(config.get(key)):
            raise CheckpointError(f"{where}: {CONFIG_NAME} has {key}={config.get(key)!r}, expected a number")
    if not isinstance(config.get("use_rslora", False), bool):
        raise CheckpointError(f"{where}: use_rslora={config['use_rslora']!r}, expected true or false")
    for key in ("rank_pattern", "alpha_pattern"):
        pattern = config.get(key) or {}
        if not isinstance(pattern, Mapping) or not all(
            isinstance(k, str) and _is_number(v) for k, v in pattern.items()
        ):
            raise CheckpointError(f"{where}: {key} must map module patterns to numbers, got {_cut(repr(pattern))}")
        for k in pattern:  # compiled as PEFT's get_pattern_key compiles them
            _regex(rf"(.*\.)?({k})$", where, f"{key} key {k!r}")
    _check_matching_fields(config, where)
    return config


def _regex(pattern: str, where: str, what: str) -> re.Pattern[str]:
    """``re.compile(pattern)``; a pattern Python cannot compile is a damaged config (CheckpointError)."""
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as err:  # nesting, repeat counts beyond C ints
        raise CheckpointError(
            f"{where}: {CONFIG_NAME} has the {what}, which is not a valid regular expression "
            f"({type(err).__name__}: {str(err)[:200]})"
        ) from None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _check_matching_fields(config: Mapping[str, Any], where: str) -> None:
    """The fields that choose which modules PEFT adapts: their types, regexes and the combinations PEFT's
    ``LoraConfig`` refuses (a CheckpointError: PeftModel cannot load such a folder either)."""
    targets, exclude = config.get("target_modules"), config.get("exclude_modules")
    layers, pattern = config.get("layers_to_transform"), config.get("layers_pattern")
    if targets is None:
        raise InvalidValueError(
            f"{where}: target_modules is null: PEFT would pick its own default targets for the "
            "model's architecture, which populora does not mirror; list the modules"
        )
    if not (isinstance(targets, str) or _strings(targets)):
        raise CheckpointError(
            f"{where}: target_modules must be a regex string or a list of module names, got {_cut(repr(targets))}"
        )
    if not (exclude is None or isinstance(exclude, str) or _strings(exclude)):
        raise CheckpointError(
            f"{where}: exclude_modules must be null, a regex string or a list of module names, got "
            f"{_cut(repr(exclude))}"
        )
    if not (layers is None or _is_int(layers) or (isinstance(layers, list) and all(_is_int(v) for v in layers))):
        raise CheckpointError(
            f"{where}: layers_to_transform must be null, an int or a list of ints, got {_cut(repr(layers))}"
        )
    if not (pattern is None or isinstance(pattern, str) or _strings(pattern)):
        raise CheckpointError(
            f"{where}: layers_pattern must be null, a string or a list of strings, got {_cut(repr(pattern))}"
        )
    if isinstance(targets, str) and (layers is not None or pattern is not None):
        raise CheckpointError(
            f"{where}: layers_to_transform / layers_pattern cannot be used with a regex "
            "target_modules (PEFT's LoraConfig refuses it)"
        )
    if pattern and layers is None:
        raise CheckpointError(
            f"{where}: layers_pattern is set without layers_to_transform (PEFT's LoraConfig refuses it)"
        )
    if isinstance(targets, str) and targets.lower() != _ALL_LINEAR:
        _regex(targets, where, f"target_modules {_cut(repr(targets))}")
    if isinstance(exclude, str):
        _regex(exclude, where, f"exclude_modules {_cut(repr(exclude))}")
    for p in [pattern] if isinstance(pattern, str) else pattern or ():
        _regex(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", where, f"layers_pattern {_cut(repr(p))}")


def _adapted_modules(config: Mapping[str, Any], model: nn.Module, where: str) -> set[str]:
    """The names of the modules of ``model`` that ``PeftModel`` wraps with this (checked) config.

    PEFT 0.21's ``check_target_module_exists``: a module whose name matches ``exclude_modules`` (a regex
    string: fullmatch; a list: the name or a ``.suffix``) is left out; else a regex string
    ``target_modules`` must fullmatch the name, ``"all-linear"`` (any case) stands for every
    ``nn.Linear`` / ``Conv1D`` but a Hugging Face model's output layer, and a list matches the name
    itself or a ``.suffix`` of it, where ``layers_to_transform`` then keeps only the listed layers (the
    layer index: the first number after a dotted segment, or after ``layers_pattern``).

    Raises:
        InvalidValueError: no module matches (PeftModel refuses such an adapter).
    """
    targets, exclude = config["target_modules"], config.get("exclude_modules")
    layers, patterns = config.get("layers_to_transform"), config.get("layers_pattern")
    names = [name for name, _ in model.named_modules() if name]
    if isinstance(targets, str) and targets.lower() == _ALL_LINEAR:
        targets = _all_linear(model, config.get("task_type"))
    if isinstance(patterns, str):
        patterns = [patterns]
    use_layers = layers is not None and (not isinstance(layers, list) or len(layers) != 0)

    def excluded(name: str) -> bool:
        if not exclude:
            return False
        if isinstance(exclude, str):
            return re.fullmatch(exclude, name) is not None
        return name in exclude or any(name.endswith(f".{e}") for e in exclude)

    def layer_of(name: str) -> int | None:
        if not patterns:  # the first numbered segment, not the last (an expert index in MoE models)
            match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", name)
        else:
            for p in patterns:
                match = re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", name)
                if match is not None:
                    break
        return None if match is None else int(match["idx"])

    def targeted(name: str) -> bool:
        if isinstance(targets, str):
            return re.fullmatch(targets, name) is not None
        if name in targets:  # an exact name: PEFT applies no layer filter to it
            return True
        if not any(name.endswith(f".{t}") for t in targets):
            return False
        if not use_layers or layers is None:  # (use_layers implies layers)
            return True
        index = layer_of(name)
        return index is not None and (index == layers if isinstance(layers, int) else index in layers)

    adapted = {name for name in names if not excluded(name) and targeted(name)}
    if not adapted:
        raise InvalidValueError(
            f"{where}: its target_modules {_cut(repr(config['target_modules']))} (exclude_modules "
            f"{_cut(repr(exclude))}) match no module of the model, so PeftModel refuses it too"
        )
    return adapted


def _all_linear(model: nn.Module, task_type: Any) -> set[str]:
    """PEFT's ``"all-linear"``: every ``nn.Linear`` (and transformers' ``Conv1D``), less a Hugging Face
    model's output layer (or, for a ``SEQ_CLS`` model without one, its ``score`` / ``classifier`` head)."""
    linear: tuple[type, ...] = (nn.Linear,)
    pretrained = None
    if "transformers" in sys.modules:  # a Hugging Face model implies it is imported
        try:
            from transformers import PreTrainedModel
            from transformers.pytorch_utils import Conv1D
        except ImportError:
            pass
        else:
            linear, pretrained = (nn.Linear, Conv1D), PreTrainedModel
    names = {name for name, module in model.named_modules() if isinstance(module, linear)}
    if pretrained is not None and isinstance(model, pretrained):
        head = model.get_output_embeddings()
        if head is None and task_type == "SEQ_CLS":
            head = next(
                (getattr(model, n) for n in ("score", "classifier") if getattr(model, n, None) is not None), None
            )
        if head is not None:
            names -= {name for name, module in model.named_modules() if module is head}
    return names


def _read_tensors(path: Path) -> dict[str, Tensor]:
    where = f"PEFT adapter {str(path)!r}"
    file = path / WEIGHTS_NAME
    if not file.is_file():
        hint = (
            " (only adapter_model.bin, the pickled format: re-save with safe_serialization=True)"
            if (path / "adapter_model.bin").exists()
            else ""
        )
        raise FileNotFoundError(f"{where} has no {WEIGHTS_NAME}{hint}")
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(file), device="cpu")
    except Exception as err:  # SafetensorError, or an OSError / ValueError on a damaged header
        raise CheckpointError(
            f"{where}: {WEIGHTS_NAME} is damaged or not a safetensors file ({type(err).__name__}: {err})"
        ) from None
    bad = [k for k, t in tensors.items() if not t.is_floating_point()]
    if bad:
        raise CheckpointError(
            f"{where}: tensors {bad} are not floating-point ({', '.join(str(tensors[k].dtype) for k in bad)})"
        )
    return tensors


def _match_keys(
    tensors: Mapping[str, Tensor], targets: Mapping[str, tuple], model: nn.Module, strict: bool, where: str
) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """``{target: (A key, B key)}`` for the targets the file holds, and the keys that fit no target.

    A target's ``base_layer.weight`` (PEFT saves the embedding layers it adapts) fits if it equals the
    base model's weight.
    """
    found: dict[str, tuple[str, str]] = {}
    used: set[str] = set()
    for name, (embedding, _, _) in targets.items():
        a, b = (f"{_PREFIX}{name}.{k}" for k in (_EMBEDDING_KEYS if embedding else _LINEAR_KEYS))
        if a in tensors and b in tensors:
            found[name] = (a, b)
            used.update((a, b))
        elif a in tensors or b in tensors:
            have, lacking = (a, b) if a in tensors else (b, a)
            raise CheckpointError(f"{where} holds {have!r} but not {lacking!r}: the adapter of {name!r} is incomplete")
        # PEFT's save_pretrained also saves the embedding layers it adapts: a copy of the base weight
        copy = f"{_PREFIX}{name}.base_layer.weight"
        if copy in tensors:
            base = model.get_submodule(name).weight
            assert isinstance(base, Tensor)  # an adapted layer's weight
            weight = base.detach()
            saved = tensors[copy]
            if saved.shape == weight.shape and torch.equal(saved, weight.to("cpu", saved.dtype)):
                used.add(copy)
            elif strict:
                raise InvalidValueError(
                    f"{where} holds {copy!r}, a copy of the base layer {name!r} that differs from "
                    f"the base model's (shape {tuple(saved.shape)} vs {tuple(weight.shape)}"
                    "; a resized vocabulary?): a population keeps its base weights; pass "
                    "strict=False to ignore the copy"
                )
    return found, sorted(k for k in tensors if k not in used)


def _hint(unexpected: list[str], missing: list[str]) -> str:
    """Why the keys may not match: PEFT's key prefix absent, or module paths of a model that wraps this one."""
    if not any(k.startswith(_PREFIX) for k in unexpected):
        return f" (PEFT's keys start with {_PREFIX!r}; these do not)"
    for key in unexpected:
        module = key[len(_PREFIX) :].rsplit(".lora_", 1)[0]
        for name in missing:
            if module.endswith(f".{name}"):
                return (
                    f" (the file's module paths carry the extra prefix {module[: -len(name)]!r}: an adapter "
                    "made on a model that wraps this one?)"
                )
    return ""


def _check_pair(
    where: str, name: str, a: str, b: str, lora_a: Tensor, lora_b: Tensor, d: int, e: int, r_t: int, embedding: bool
) -> int:
    """Check ``A (r, d)``, ``B (e, r)`` against a target; return ``r``."""
    if lora_a.dim() != 2 or lora_b.dim() != 2:
        raise CheckpointError(
            f"{where}: {a!r} and {b!r} must be matrices, got shapes {tuple(lora_a.shape)} and {tuple(lora_b.shape)}"
        )
    rank = lora_a.shape[0]
    if rank == 0:
        raise CheckpointError(f"{where}: {a!r} has rank 0 (shape {tuple(lora_a.shape)}); a LoRA rank is >= 1")
    if lora_b.shape[1] != rank:
        raise CheckpointError(
            f"{where}: {a!r} has rank {rank} (shape {tuple(lora_a.shape)}) but {b!r} has rank "
            f"{lora_b.shape[1]} (shape {tuple(lora_b.shape)})"
        )
    if lora_a.shape[1] != d or lora_b.shape[0] != e:
        kind, dims = ("nn.Embedding", "(r, V) and (e, r)") if embedding else ("nn.Linear", "(r, d) and (e, r)")
        raise InvalidValueError(
            f"{where}: target {name!r} is an {kind} with d={d}, e={e}, so {a!r} and {b!r} must be "
            f"{dims} = ({rank}, {d}) and ({e}, {rank}), got {tuple(lora_a.shape)} and "
            f"{tuple(lora_b.shape)}"
        )
    if rank > r_t:
        raise InvalidValueError(
            f"{where}: the adapter of {name!r} has rank {rank}, above the population's rank "
            f"{r_t} on that target (min(low_rank, d, e)); build the population with "
            f"low_rank >= {rank}"
        )
    return rank


def _scaling(config: Mapping[str, Any], name: str, rank: int, where: str) -> float:
    """PEFT's ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA) for one target, patterns included."""
    r = _pattern(config.get("rank_pattern") or {}, name, config["r"])
    alpha = _pattern(config.get("alpha_pattern") or {}, name, config["lora_alpha"])
    if r != rank:
        raise CheckpointError(f"{where}: {CONFIG_NAME} gives {name!r} rank {r}, but its tensors have rank {rank}")
    return float(alpha) / (math.sqrt(rank) if config.get("use_rslora", False) else rank)


def _pattern(pattern: Mapping[str, Any], name: str, default: Any) -> Any:
    """PEFT's ``get_pattern_key``: the first key ``k`` with ``re.match(rf'(.*\\.)?({k})$', name)``."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


# ---------------------------------------------------------------------------------------------- shared


def _check_alive(pop: Any) -> None:
    check = getattr(pop, "_check_alive", None)
    if not callable(check) or not hasattr(pop, "factors"):
        raise InvalidTypeError(f"`pop` must be a populora Population, got {type(pop).__name__}")
    check()


def _as_index(value: Any) -> Any:
    if isinstance(value, Tensor) and value.numel() == 1:
        return value.reshape(())
    return value


def _is_embedding(pop: Any, name: str) -> bool:
    return isinstance(pop.model.get_submodule(name), nn.Embedding)


def _is_number(value: Any) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float64 (JSON has no size limit)
        return False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _cut(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
