"""Finding and validating the layers that receive per-individual adapters.

A target is an ``nn.Linear`` (``delta(x) = (x @ down) @ up.T``) or an
``nn.Embedding`` (row ``t`` of the table moves by ``down[t] @ up.T``).
``lora_targets`` entries are dotted module paths (``'encoder.0.q'``) or glob
patterns (``'*.q'``, ``'layers.*.mlp.*'``); ``None`` selects every
``nn.Linear`` whose own forward runs (routing wraps that forward, see
:mod:`populora.routing`), so ``nn.MultiheadAttention``'s ``out_proj`` is left out.

Tied weights: a layer whose weight is also a parameter of another module
(an LM's ``lm_head.weight is embed_tokens.weight``) is never a target. Merging
its delta would write into the shared tensor, changing the other module too,
so the merged model would not be the individual that was evaluated.
Auto-discovery (``None``) and glob patterns skip such layers with one warning
naming them; an exact path naming one raises :class:`TargetNotFoundError`
naming both modules.

Exclusion: an entry starting with ``!`` removes the layers it matches (a
path or a glob) from what the other entries select, whatever the order:
``["*_proj", "!*.mlp.*"]`` is every projection outside the MLPs. A list of
only exclusions starts from auto-discovery: ``["!lm_head"]`` is every
routable ``nn.Linear`` but ``lm_head``. An exclusion that matches no
``nn.Linear`` / ``nn.Embedding`` of the model raises (a typo would otherwise
exclude nothing); an excluded tied layer is not warned about. Presets for
Llama-family module names are in :mod:`populora.llm.targets`.

Quantized layers: a module whose weight is not a plain floating-point
tensor (bitsandbytes ``Linear4bit`` / ``Linear8bitLt``, GGUF- or
GPTQ-quantized modules, any layer holding a ``Parameter`` subclass or an
integer weight) cannot carry a routed delta that equals a merge, and is
refused with :class:`TargetNotFoundError` naming the module and its type,
by an exact path, by a glob that matches it, and by auto-discovery
(``None``), so a quantized model is never evolved with part of its layers
silently left out. Load the model in a float dtype, or target other layers.
"""

from __future__ import annotations

import difflib
import fnmatch
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from populora.errors import InvalidTypeError, TargetNotFoundError

SUPPORTED = (nn.Linear, nn.Embedding)

__all__ = ["SUPPORTED", "find_targets", "layer_dims", "quantized_reason", "tied_weights", "unroutable_reason"]

# packages whose layers hold quantized weights (a layer of theirs is refused even if its weight looks float)
_QUANTIZED_PACKAGES = (
    "bitsandbytes",
    "auto_gptq",
    "gptqmodel",
    "awq",
    "hqq",
    "optimum.quanto",
    "quanto",
    "torchao",
    "gguf",
    "llama_cpp",
    "eetq",
    "fbgemm_gpu",
    "compressed_tensors",
)


def quantized_reason(module: nn.Module, path: str = "") -> str | None:
    """Why ``module`` looks like a quantized layer (not a plain float ``nn.Linear`` / ``nn.Embedding``), or ``None``.

    A module counts as quantized when its class comes from a quantization
    package (bitsandbytes, GPTQ, AWQ, HQQ, quanto, torchao, GGUF), or its
    ``weight`` is a ``Parameter`` / tensor subclass (``Params4bit``,
    ``Int8Params``) or is not floating point. Modules without a tensor
    ``weight`` of their own are not looked at.

    Example:
        >>> class Linear4bit(nn.Linear):
        ...     pass
        >>> layer = Linear4bit(4, 4)
        >>> layer.weight = nn.Parameter(torch.zeros(8, 1, dtype=torch.uint8), requires_grad=False)
        >>> print(quantized_reason(layer, "q_proj"))
        'q_proj' is a quantized layer (Linear4bit from populora.targets, weight Parameter of dtype torch.uint8)
        >>> quantized_reason(nn.Linear(4, 4)) is None
        True
    """
    weight = getattr(module, "weight", None)
    cls = type(module)
    package = cls.__module__ or ""
    from_package = any(package == q or package.startswith(q + ".") for q in _QUANTIZED_PACKAGES)
    if not isinstance(weight, torch.Tensor):
        if not from_package:
            return None
        held = "no tensor weight"
    else:
        plain = type(weight) in (nn.Parameter, torch.Tensor) and weight.dtype.is_floating_point
        if plain and not from_package:
            return None
        held = f"weight {type(weight).__name__} of dtype {weight.dtype}"
    return f"{path or '<root>'!r} is a quantized layer ({cls.__name__} from {package}, {held})"


def _quantized_error(paths: dict[str, str], how: str) -> TargetNotFoundError:
    shown = "; ".join(list(paths.values())[:5]) + (f"; and {len(paths) - 5} more" if len(paths) > 5 else "")
    return TargetNotFoundError(
        f"{how} {shown}: quantized base layers are not supported yet (a routed delta "
        "on them would not equal a merge); load the model in a float dtype, or exclude "
        "them (a '!pattern' entry) and target plain nn.Linear / nn.Embedding layers"
    )


def unroutable_reason(module: nn.Module, path: str = "") -> str | None:
    """Why a routed delta on ``module`` would not equal merging it into the weight, or ``None``."""
    where = path or "<root>"
    for kind in SUPPORTED:
        if isinstance(module, kind):
            if type(module).forward is not kind.forward:
                return (
                    f"{type(module).__name__} '{where}' overrides the forward of {kind.__name__}, so its "
                    "output is not the plain layer's that a low-rank delta (or a merge) assumes"
                )
            if kind is nn.Embedding and module.max_norm is not None:
                return (
                    f"nn.Embedding '{where}' has max_norm={module.max_norm}, which rescales rows of the "
                    "weight in place during forward; a routed delta cannot follow that"
                )
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


def tied_weights(model: nn.Module) -> dict[str, list[str]]:
    """``{path: [other.param, ...]}`` for every supported layer whose ``weight`` another module also holds.

    The same module registered under two paths is not tied (one layer, one
    weight: a merge equals routing it); a weight that is a parameter of a
    different module object is.

    Example:
        >>> head, embed = nn.Linear(4, 10, bias=False), nn.Embedding(10, 4)
        >>> head.weight = embed.weight
        >>> tied_weights(nn.ModuleDict(dict(embed=embed, head=head)))
        {'embed': ['head.weight'], 'head': ['embed.weight']}
    """
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for path, module in model.named_modules(remove_duplicate=True):
        for name, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module, f"{path}.{name}" if path else name))
    tied = {}
    for path, module in model.named_modules(remove_duplicate=True):
        weight = getattr(module, "weight", None) if isinstance(module, SUPPORTED) else None
        if isinstance(weight, nn.Parameter):
            others = [where for owner, where in holders.get(id(weight), []) if owner is not module]
            if others:
                tied[path] = others
    return tied


def _tied_message(path: str, others: list[str]) -> str:
    owners = ", ".join(repr(o.rpartition(".")[0] or o) for o in others)
    return (
        f"'{path}.weight' is the same tensor as {', '.join(repr(o) for o in others)} (tied weights): "
        f"merging an adapter of '{path}' would also change {owners}, "
        "so the merged model would not be the routed individual"
    )


def layer_dims(module: nn.Module) -> tuple[int, int]:
    """``(d, e)`` of a target: in and out features (``num_embeddings, embedding_dim``)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return module.num_embeddings, module.embedding_dim


def find_targets(model: nn.Module, lora_targets: str | Iterable[str] | None) -> dict[str, nn.Module]:
    """Resolve ``lora_targets`` to ``{path: module}`` in the model's module order.

    ``lora_targets``: ``None`` (every routable ``nn.Linear``), a path or glob,
    or a list of them; entries starting with ``!`` exclude what they match
    (see the module docstring).

    Raises:
        TargetNotFoundError: an entry matches nothing (the closest ``nn.Linear``
            paths are listed), names a module that is not ``nn.Linear`` /
            ``nn.Embedding``, names a layer that cannot be routed, names
            (by exact path) a layer whose weight is tied to another module's,
            selects a quantized layer (named with its type), or the
            exclusions leave nothing.
        InvalidTypeError: an entry is not a string.

    Warns:
        UserWarning: once, naming the layers with tied weights that
            auto-discovery or a glob pattern skipped.

    Example:
        >>> model = nn.ModuleDict(dict(q=nn.Linear(4, 4), v=nn.Linear(4, 4), head=nn.Linear(4, 2)))
        >>> list(find_targets(model, ["!head"]))
        ['q', 'v']
    """
    modules = dict(model.named_modules(remove_duplicate=True))
    supported = {p: m for p, m in modules.items() if isinstance(m, SUPPORTED)}
    unroutable = _unroutable(model)
    tied = tied_weights(model)
    quantized = {p: why for p, m in modules.items() if (why := quantized_reason(m, p)) is not None}
    skipped: list[str] = []  # tied layers left out by auto-discovery or a pattern (one warning)

    if lora_targets is None:
        entries: list[str] = []
    elif not isinstance(lora_targets, (str, Iterable)):
        raise InvalidTypeError(
            f"`lora_targets` must be None, a str or a list of str, got {type(lora_targets).__name__} {lora_targets!r}"
        )
    else:
        entries = [lora_targets] if isinstance(lora_targets, str) else list(lora_targets)
        if not entries:
            raise TargetNotFoundError("`lora_targets` is empty; pass None to target every nn.Linear")
        for entry in entries:
            if not isinstance(entry, str):
                raise InvalidTypeError(
                    f"`lora_targets` entries must be str paths or glob patterns, got {type(entry).__name__} {entry!r}"
                )
    excluded = _excluded(model, modules, {**supported, **quantized}, [e[1:] for e in entries if e.startswith("!")])
    includes = [e for e in entries if not e.startswith("!")]
    kept = {p: why for p, why in quantized.items() if p not in excluded}

    if not includes:  # auto-discovery, minus the exclusions
        how = (
            "`lora_targets=None` looks for every nn.Linear"
            if lora_targets is None
            else (f"`lora_targets={lora_targets!r}` (only exclusions) looks for every other nn.Linear")
        )
        if kept:
            raise _quantized_error(kept, how + ", but found")
        found = {
            p: m for p, m in supported.items() if isinstance(m, nn.Linear) and p not in unroutable and p not in excluded
        }
        skipped = [p for p in found if p in tied]
        found = {p: m for p, m in found.items() if p not in tied}
        if not found:
            raise TargetNotFoundError(
                f"{how}, but {type(model).__name__} has none that can be routed"
                + (f" (tied weights skipped: {skipped})" if skipped else "")
                + (f" (excluded: {sorted(p for p in excluded if p in supported)})" if excluded else "")
                + "; pass explicit targets (nn.Linear or nn.Embedding paths)"
            )
        _warn_tied(skipped, tied)
        return found

    chosen: set[str] = set()
    for entry in includes:
        if any(ch in entry for ch in "*?["):
            hit = {p: why for p, why in kept.items() if fnmatch.fnmatchcase(p, entry)}
            if hit:
                raise _quantized_error(hit, f"lora target pattern {entry!r} matches")
            matches = [p for p in supported if fnmatch.fnmatchcase(p, entry)]
            if not matches:
                raise TargetNotFoundError(
                    f"lora target pattern {entry!r} matches no nn.Linear or nn.Embedding; {_suggest(entry, supported)}"
                )
            matches = [p for p in matches if p not in unroutable]
            if not matches:
                raise TargetNotFoundError(
                    f"lora target pattern {entry!r} matches only unroutable layers: "
                    + "; ".join(unroutable[p] for p in unroutable if fnmatch.fnmatchcase(p, entry))
                )
            if all(p in tied for p in matches):
                raise TargetNotFoundError(
                    f"lora target pattern {entry!r} matches only layers with tied weights: "
                    + "; ".join(_tied_message(p, tied[p]) for p in matches)
                )
            skipped += [p for p in matches if p in tied and p not in skipped]
            chosen.update(p for p in matches if p not in tied)
            continue
        if entry not in modules:
            raise TargetNotFoundError(
                f"lora target {entry!r} is not a module of {type(model).__name__}; {_suggest(entry, supported)}"
            )
        if entry in quantized:
            raise _quantized_error({entry: quantized[entry]}, "lora target")
        if entry in unroutable:
            raise TargetNotFoundError(f"lora target {entry!r} cannot be routed: {unroutable[entry]}")
        if entry in tied:
            raise TargetNotFoundError(
                f"lora target {entry!r} cannot be a target: {_tied_message(entry, tied[entry])}; "
                "untie the weights or target other layers"
            )
        if not isinstance(modules[entry], SUPPORTED):
            raise TargetNotFoundError(
                f"lora target {entry!r} is {type(modules[entry]).__name__}; expected nn.Linear or "
                f"nn.Embedding. {_suggest(entry, supported)}"
            )
        chosen.add(entry)
    chosen -= excluded
    if not chosen:
        raise TargetNotFoundError(
            f"`lora_targets={lora_targets!r}` selects no layer: every layer its entries "
            "match is excluded by its '!' entries"
        )
    _warn_tied([p for p in skipped if p not in chosen and p not in excluded], tied)
    return {p: m for p, m in supported.items() if p in chosen}


def _excluded(model: nn.Module, modules: dict[str, nn.Module], layers: dict[str, Any], patterns: list[str]) -> set[str]:
    """Every module path an exclusion matches, with the modules below it (``'!model.layers.0'`` drops that block)."""
    out: set[str] = set()
    for pattern in patterns:
        if not pattern:
            raise TargetNotFoundError("a `lora_targets` exclusion is '!' alone; write '!<path or glob>'")
        glob = any(ch in pattern for ch in "*?[")
        hit = [p for p in modules if p and (fnmatch.fnmatchcase(p, pattern) if glob else p == pattern)]
        below = [p for p in modules if any(p.startswith(h + ".") for h in hit)]
        if not any(p in layers for p in hit + below):
            supported = {p: m for p, m in modules.items() if isinstance(m, SUPPORTED)}
            raise TargetNotFoundError(
                f"lora target exclusion {'!' + pattern!r} matches no nn.Linear or nn.Embedding "
                f"of {type(model).__name__}; {_suggest(pattern, supported)}"
            )
        out.update(hit, below)
    return out


def _warn_tied(skipped: list[str], tied: dict[str, list[str]]) -> None:
    if skipped:
        warnings.warn(
            f"skipped {len(skipped)} layer(s) with tied weights, which cannot be targets: "
            + "; ".join(_tied_message(p, tied[p]) for p in skipped),
            stacklevel=4,
        )


def _suggest(entry: str, supported: dict[str, nn.Module]) -> str:
    linear = [p for p, m in supported.items() if isinstance(m, nn.Linear)] or list(supported)
    close = difflib.get_close_matches(entry, linear, n=3, cutoff=0.0)
    if not close:
        return "the model has no nn.Linear layers"
    return "closest nn.Linear paths: " + ", ".join(repr(p) for p in close)
