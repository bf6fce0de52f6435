"""Finding and validating the layers that receive per-individual adapters.

A target is an ``nn.Linear`` (``delta(x) = (x @ down) @ up.T``) or an
``nn.Embedding`` (row ``t`` of the table moves by ``down[t] @ up.T``).
``lora_targets`` entries are dotted module paths (``'encoder.0.q'``) or glob
patterns (``'*.q'``, ``'layers.*.mlp.*'``); ``None`` selects every
``nn.Linear`` that a forward hook can route.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable

from torch import nn

from .errors import TargetNotFoundError

SUPPORTED = (nn.Linear, nn.Embedding)

__all__ = ["SUPPORTED", "find_targets", "layer_dims", "unroutable_reason"]


def unroutable_reason(module: nn.Module, path: str = "") -> str | None:
    """Why a routed delta on ``module`` would not equal merging it into the weight, or ``None``."""
    where = path or "<root>"
    for kind in SUPPORTED:
        if isinstance(module, kind):
            if type(module).forward is not kind.forward:
                return (f"{type(module).__name__} '{where}' overrides the forward of {kind.__name__}, so its "
                        "output is not the plain layer's that a low-rank delta (or a merge) assumes")
            if kind is nn.Embedding and module.max_norm is not None:
                return (f"nn.Embedding '{where}' has max_norm={module.max_norm}, which rescales rows of the "
                        "weight in place during forward; a routed delta cannot follow that")
            return None
    return f"'{where}' is {type(module).__name__}; expected nn.Linear or nn.Embedding"


def _unroutable(model: nn.Module) -> dict[str, str]:
    """Supported layers whose adapter would be skipped or would not match a merge.

    ``nn.MultiheadAttention`` passes ``out_proj.weight`` to a functional kernel,
    so ``out_proj``'s forward never runs; subclasses that override the forward
    (or an Embedding with ``max_norm``) would not equal their merged weights.
    """
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            prefix = f"{path}." if path else ""
            found[f"{prefix}out_proj"] = (
                f"nn.MultiheadAttention at '{path or '<root>'}' uses its out_proj weight "
                "directly and never calls out_proj's forward, so an adapter there would "
                "be skipped; build attention from separate nn.Linear layers to evolve it"
            )
        elif isinstance(module, SUPPORTED) and (why := unroutable_reason(module, path)) is not None:
            found[path] = why
    return found


def layer_dims(module: nn.Module) -> tuple[int, int]:
    """``(d, e)`` of a target: in and out features (``num_embeddings, embedding_dim``)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return module.num_embeddings, module.embedding_dim


def find_targets(model: nn.Module, lora_targets: str | Iterable[str] | None) -> dict[str, nn.Module]:
    """Resolve ``lora_targets`` to ``{path: module}`` in the model's module order.

    Raises:
        TargetNotFoundError: an entry matches nothing (the closest ``nn.Linear``
            paths are listed), names a module that is not ``nn.Linear`` /
            ``nn.Embedding``, or names a Linear that cannot be routed.
    """
    modules = dict(model.named_modules(remove_duplicate=True))
    supported = {p: m for p, m in modules.items() if isinstance(m, SUPPORTED)}
    unroutable = _unroutable(model)

    if lora_targets is None:
        found = {p: m for p, m in supported.items() if isinstance(m, nn.Linear) and p not in unroutable}
        if not found:
            raise TargetNotFoundError(
                f"`lora_targets=None` looks for every nn.Linear, but {type(model).__name__} has none "
                "that can be routed; pass explicit targets (nn.Linear or nn.Embedding paths)"
            )
        return found

    entries = [lora_targets] if isinstance(lora_targets, str) else list(lora_targets)
    if not entries:
        raise TargetNotFoundError("`lora_targets` is empty; pass None to target every nn.Linear")

    chosen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, str):
            raise TypeError(f"`lora_targets` entries must be str paths or glob patterns, got {entry!r}")
        if any(ch in entry for ch in "*?["):
            matches = [p for p in supported if fnmatch.fnmatchcase(p, entry)]
            if not matches:
                raise TargetNotFoundError(
                    f"lora target pattern {entry!r} matches no nn.Linear or nn.Embedding; "
                    f"{_suggest(entry, supported)}"
                )
            matches = [p for p in matches if p not in unroutable]
            if not matches:
                raise TargetNotFoundError(f"lora target pattern {entry!r} matches only unroutable layers: "
                                          + "; ".join(unroutable[p] for p in unroutable if fnmatch.fnmatchcase(p, entry)))
            chosen.update(matches)
            continue
        if entry not in modules:
            raise TargetNotFoundError(f"lora target {entry!r} is not a module of {type(model).__name__}; "
                                      f"{_suggest(entry, supported)}")
        if entry in unroutable:
            raise TargetNotFoundError(f"lora target {entry!r} cannot be routed: {unroutable[entry]}")
        if not isinstance(modules[entry], SUPPORTED):
            raise TargetNotFoundError(
                f"lora target {entry!r} is {type(modules[entry]).__name__}; expected nn.Linear or "
                f"nn.Embedding. {_suggest(entry, supported)}"
            )
        chosen.add(entry)
    return {p: m for p, m in supported.items() if p in chosen}


def _suggest(entry: str, supported: dict[str, nn.Module]) -> str:
    linear = [p for p, m in supported.items() if isinstance(m, nn.Linear)] or list(supported)
    close = difflib.get_close_matches(entry, linear, n=3, cutoff=0.0)
    if not close:
        return "the model has no nn.Linear layers"
    return "closest nn.Linear paths: " + ", ".join(repr(p) for p in close)
