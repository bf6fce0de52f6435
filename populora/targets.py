"""Finding and validating the layers that receive per-individual adapters.

A target is an ``nn.Linear`` (``delta(x) = (x @ down) @ up.T``) or an
``nn.Embedding`` (row ``t`` of the table moves by ``down[t] @ up.T``).
``lora_targets`` is ``None`` (every ``nn.Linear`` whose own forward runs:
routing wraps that forward, see :mod:`populora.routing`, so
``nn.MultiheadAttention``'s ``out_proj`` is left out), one entry, or a list of
entries, each one of these forms (:data:`TARGET_FORMS` says it in one line):

- a full module path, ``'model.layers.0.self_attn.q_proj'`` (a name with a
  dot, or a number: a ``Sequential`` / ``ModuleList`` index such as ``'0'``);
- a dot-free name without glob characters, ``'q_proj'``: every module whose
  path is that name or ends in ``'.q_proj'``, as PEFT's ``target_modules``
  list matches, so ``["q_proj", "v_proj"]`` is the classic LoRA pair;
- an ``fnmatch`` glob on the full path, ``'*.self_attn.*_proj'``
  (``*`` crosses dots);
- the keyword ``'all-linear'`` (any case, as PEFT): every routable
  ``nn.Linear`` except the output layer, the module a Hugging Face model's
  ``get_output_embeddings()`` returns (a model without that method, a plain
  ``nn.Module``, has none left out: the same layers as ``None``);
- a compiled ``re.Pattern`` (never a plain string, which is a path, name or
  glob): the paths it ``fullmatch``-es, as PEFT's string ``target_modules``.

Presets for Llama-family module names are in :mod:`populora.llm.targets`
(``populora.llm.LLAMA_ATTENTION``, ``LLAMA_MLP``, ``LLAMA_ALL``).

Exclusion: a string entry starting with ``!`` removes the layers it matches
(a path, a dot-free name or a glob, as above) and the modules below them from
what the other entries select, whatever the order: ``["*_proj", "!*.mlp.*"]``
is every projection outside the MLPs, ``["all-linear", "!down_proj"]`` every
linear but the head and the down projections. A list of only exclusions
starts from auto-discovery: ``["!lm_head"]`` is every routable ``nn.Linear``
but ``lm_head``. An exclusion that matches no ``nn.Linear`` /
``nn.Embedding`` of the model raises (a typo would otherwise exclude
nothing); an excluded tied layer is not warned about.

Tied weights: a layer whose weight is also a parameter of another module
(an LM's ``lm_head.weight is embed_tokens.weight``) is never a target. Merging
its delta would write into the shared tensor, changing the other module too,
so the merged model would not be the individual that was evaluated.
Auto-discovery (``None``), ``'all-linear'``, globs, names matching several
layers and patterns skip such layers with one warning naming them; a path (or
a name matching that layer alone) raises :class:`TargetNotFoundError` naming
both modules.

Quantized layers: a module whose weight is not a plain floating-point
tensor (bitsandbytes ``Linear4bit`` / ``Linear8bitLt``, GGUF- or
GPTQ-quantized modules, any layer holding a ``Parameter`` subclass or an
integer weight) cannot carry a routed delta that equals a merge, and is
refused with :class:`TargetNotFoundError` naming the module and its type,
by every form that selects it and by auto-discovery (``None``), so a
quantized model is never evolved with part of its layers silently left
out. Load the model in a float dtype, or target other layers.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from populora.errors import InvalidTypeError, TargetNotFoundError

SUPPORTED = (nn.Linear, nn.Embedding)

__all__ = [
    "ALL_LINEAR",
    "SUPPORTED",
    "TARGET_FORMS",
    "find_targets",
    "layer_dims",
    "output_layers",
    "quantized_reason",
    "select_modules",
    "tied_weights",
    "unroutable_reason",
]

ALL_LINEAR = "all-linear"
"""The keyword entry for every routable ``nn.Linear`` but the output layer (PEFT's ``"all-linear"``)."""

TARGET_FORMS = (
    "a `lora_targets` entry is a full module path ('model.layers.0.self_attn.q_proj'), a dot-free name matched "
    "as a path suffix like PEFT's target_modules ('q_proj' is every '*.q_proj'), an fnmatch glob "
    "('*.self_attn.*_proj'), 'all-linear' (every nn.Linear but the output layer), or a compiled re.Pattern "
    "(fullmatch on the path); '!' before a path, name or glob excludes it; presets: "
    "populora.llm.LLAMA_ATTENTION / LLAMA_MLP / LLAMA_ALL"
)
"""One line on the forms of a ``lora_targets`` entry, appended to the errors for a miss."""

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
    assert isinstance(module, nn.Embedding), "a target is an nn.Linear or an nn.Embedding"
    return module.num_embeddings, module.embedding_dim


def output_layers(model: nn.Module) -> list[str]:
    """Paths of the model's output layer, the one ``'all-linear'`` leaves out (``[]`` when it has none).

    The output layer is what a Hugging Face model's ``get_output_embeddings()`` returns (``lm_head`` of a
    causal LM), as PEFT decides it; a model without that method (a plain ``nn.Module``) has none.

    Example:
        >>> class LM(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.body, self.lm_head = nn.Linear(4, 4), nn.Linear(4, 9)
        ...     def get_output_embeddings(self):
        ...         return self.lm_head
        >>> output_layers(LM()), output_layers(nn.Sequential(nn.Linear(4, 4)))
        (['lm_head'], [])
    """
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, nn.Module):
        return []
    return [p for p, m in model.named_modules(remove_duplicate=False) if m is head]


def _kind(entry: str) -> str:
    """How a string entry (without its ``'!'``) matches: ``'all-linear'``, ``'glob'``, ``'name'`` or ``'path'``."""
    if entry.lower() == ALL_LINEAR:
        return "all-linear"
    if any(ch in entry for ch in "*?["):
        return "glob"
    if "." not in entry and not entry.isdigit():  # an index ('0') names a Sequential slot, not a layer kind
        return "name"
    return "path"


def _matcher(entry: str | re.Pattern) -> Any:
    """``path -> bool`` for a glob, a name (path suffix) or a regex entry."""
    if isinstance(entry, re.Pattern):
        return lambda p: entry.fullmatch(p) is not None
    if _kind(entry) == "glob":
        return lambda p: fnmatch.fnmatchcase(p, entry)
    return lambda p: p == entry or p.endswith("." + entry)


def _describe(entry: str | re.Pattern) -> str:
    if isinstance(entry, re.Pattern):
        return f"lora target regex {entry.pattern!r}"
    return f"lora target pattern {entry!r}" if _kind(entry) == "glob" else f"lora target name {entry!r}"


def find_targets(
    model: nn.Module, lora_targets: str | re.Pattern | Iterable[str | re.Pattern] | None
) -> dict[str, nn.Module]:
    """Resolve ``lora_targets`` to ``{path: module}`` in the model's module order.

    ``lora_targets``: ``None`` (every routable ``nn.Linear``), one entry or a
    list of entries: full paths, dot-free names (matched as a path suffix,
    like PEFT), globs, ``'all-linear'``, compiled ``re.Pattern`` objects, and
    ``'!'`` exclusions (see the module docstring).

    Raises:
        TargetNotFoundError: an entry matches nothing (the closest ``nn.Linear``
            paths or names are listed, with the forms an entry can take), names
            a module that is not ``nn.Linear`` / ``nn.Embedding``, names a layer
            that cannot be routed, names (by path, or a name matching it alone)
            a layer whose weight is tied to another module's, selects a
            quantized layer (named with its type), or the exclusions leave nothing.
        InvalidTypeError: an entry is not a string or a compiled ``re.Pattern``.

    Warns:
        UserWarning: once, naming the layers with tied weights that
            auto-discovery, ``'all-linear'`` or a pattern skipped.

    Example:
        >>> block = nn.ModuleDict(dict(q_proj=nn.Linear(4, 4), v_proj=nn.Linear(4, 4), o_proj=nn.Linear(4, 4)))
        >>> model = nn.ModuleDict(dict(layers=nn.ModuleList([block, block]), head=nn.Linear(4, 2)))
        >>> list(find_targets(model, ["q_proj", "v_proj"]))  # PEFT's list form: names match as path suffixes
        ['layers.0.q_proj', 'layers.0.v_proj']
        >>> list(find_targets(model, ["!head"]))
        ['layers.0.q_proj', 'layers.0.v_proj', 'layers.0.o_proj']
    """
    modules = dict(model.named_modules(remove_duplicate=True))
    supported = {p: m for p, m in modules.items() if isinstance(m, SUPPORTED)}
    unroutable = _unroutable(model)
    tied = tied_weights(model)
    quantized = {p: why for p, m in modules.items() if (why := quantized_reason(m, p)) is not None}
    skipped: list[str] = []  # tied layers left out by auto-discovery or a pattern (one warning)

    if lora_targets is None:
        entries: list[str | re.Pattern] = []
    elif not isinstance(lora_targets, (str, re.Pattern, Iterable)):
        raise InvalidTypeError(
            "`lora_targets` must be None, a str or a list of str (or compiled re.Pattern objects), got "
            f"{type(lora_targets).__name__} {lora_targets!r}"
        )
    else:
        entries = [lora_targets] if isinstance(lora_targets, (str, re.Pattern)) else list(lora_targets)
        if not entries:
            raise TargetNotFoundError("`lora_targets` is empty; pass None to target every nn.Linear")
        for entry in entries:
            if not isinstance(entry, (str, re.Pattern)):
                raise InvalidTypeError(
                    "`lora_targets` entries must be str paths, names or glob patterns, or compiled re.Pattern "
                    f"objects, got {type(entry).__name__} {entry!r}"
                )
            if isinstance(entry, re.Pattern) and not isinstance(entry.pattern, str):
                raise InvalidTypeError(f"a `lora_targets` regex must be a str pattern, got bytes {entry.pattern!r}")
    exclusions = [e[1:] for e in entries if isinstance(e, str) and e.startswith("!")]
    excluded = _excluded(model, modules, {**supported, **quantized}, exclusions)
    includes = [e for e in entries if not (isinstance(e, str) and e.startswith("!"))]
    kept = {p: why for p, why in quantized.items() if p not in excluded}

    if not includes:  # auto-discovery, minus the exclusions
        how = (
            "`lora_targets=None` looks for every nn.Linear"
            if lora_targets is None
            else (f"`lora_targets={lora_targets!r}` (only exclusions) looks for every other nn.Linear")
        )
        if kept:
            raise _quantized_error(kept, how + ", but found")
        found: dict[str, nn.Module] = {
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
        kind = "regex" if isinstance(entry, re.Pattern) else _kind(entry)
        if kind == "all-linear":
            outputs = set(output_layers(model))
            hit = {p: why for p, why in kept.items() if p not in outputs}
            if hit:
                raise _quantized_error(hit, f"lora target {entry!r} (every nn.Linear but the output layer) finds")
            linear = [
                p
                for p, m in supported.items()
                if isinstance(m, nn.Linear) and p not in unroutable and p not in outputs and p not in excluded
            ]
            if not [p for p in linear if p not in tied]:
                raise TargetNotFoundError(
                    f"lora target {entry!r} finds no routable nn.Linear but the output layer "
                    f"{sorted(outputs) or '(none)'} in {type(model).__name__}"
                    + (f" (tied weights skipped: {[p for p in linear if p in tied]})" if linear else "")
                )
            skipped += [p for p in linear if p in tied and p not in skipped]
            chosen.update(p for p in linear if p not in tied)
            continue
        if kind == "name" and [p for p in modules if p and _matcher(entry)(p)] == [entry]:
            kind = "path"  # a root-level module of that name and no other: read it as its path (exact errors)
        if kind != "path":
            chosen.update(_pattern_matches(model, entry, modules, supported, unroutable, tied, kept, skipped))
            continue
        assert isinstance(entry, str)  # a regex's kind is "regex"
        if entry not in modules:
            raise TargetNotFoundError(
                f"lora target {entry!r} is not a module of {type(model).__name__}; "
                f"{_suggest(entry, supported)}; {TARGET_FORMS}"
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
                f"nn.Embedding (a glob such as '{entry}.*' selects the layers inside it). {_suggest(entry, supported)}"
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


def select_modules(model: nn.Module, lora_targets: str | re.Pattern | Iterable[str | re.Pattern]) -> list[str]:
    """The module paths ``lora_targets`` selects, of any module kind, in the model's module order.

    The forms of :func:`find_targets` (a full path, a dot-free name matched as a path suffix, a glob,
    ``'all-linear'``, a compiled ``re.Pattern``, ``'!'`` exclusions) with no restriction to routable
    ``nn.Linear`` / ``nn.Embedding`` layers: ES evolves a module's parameters in place, so a container, a
    norm or a tied layer can be chosen too. An excluded path takes the modules below it along.

    Raises:
        InvalidTypeError: an entry is not a string or a compiled ``re.Pattern``.
        TargetNotFoundError: an entry (included or excluded) matches no module, or the exclusions leave nothing.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 4), nn.LayerNorm(4), nn.Linear(4, 1))
        >>> select_modules(model, ["all-linear", "1"]), select_modules(model, ["*", "!0"])
        (['0', '1', '2'], ['1', '2'])
    """
    entries = [lora_targets] if isinstance(lora_targets, (str, re.Pattern)) else list(lora_targets)
    if not entries:
        raise TargetNotFoundError("`lora_targets` is empty; pass None to select every nn.Linear / nn.Embedding")
    paths = [p for p, _ in model.named_modules(remove_duplicate=True) if p]
    outputs = set(output_layers(model))
    chosen: set[str] = set()
    excluded: set[str] = set()
    for entry in entries:
        if not isinstance(entry, (str, re.Pattern)):
            raise InvalidTypeError(
                f"`lora_targets` entries must be str or compiled re.Pattern objects, got {type(entry).__name__} "
                f"{entry!r}"
            )
        negated = isinstance(entry, str) and entry.startswith("!")
        body = entry[1:] if negated and isinstance(entry, str) else entry
        if isinstance(body, str) and _kind(body) == "all-linear":
            hits = [p for p in paths if isinstance(model.get_submodule(p), nn.Linear) and p not in outputs]
        elif isinstance(body, str) and _kind(body) == "path":
            hits = [body] if body in paths else []
        else:
            hits = [p for p in paths if _matcher(body)(p)]
        if not hits:
            raise TargetNotFoundError(
                f"{'exclusion ' if negated else ''}{_describe(body)} matches no module of {type(model).__name__}; "
                f"{TARGET_FORMS}"
            )
        (excluded if negated else chosen).update(hits)
    if not any(not (isinstance(e, str) and e.startswith("!")) for e in entries):  # only exclusions: all but them
        chosen = {p for p in paths if isinstance(model.get_submodule(p), SUPPORTED)}
    selected = [p for p in paths if p in chosen and not any(p == e or p.startswith(e + ".") for e in excluded)]
    if not selected:
        raise TargetNotFoundError(f"`lora_targets={lora_targets!r}` selects no module: its '!' entries exclude all")
    return selected


def _pattern_matches(
    model: nn.Module,
    entry: str | re.Pattern,
    modules: dict[str, nn.Module],
    supported: Mapping[str, nn.Module],
    unroutable: dict[str, str],
    tied: dict[str, list[str]],
    kept: dict[str, str],
    skipped: list[str],
) -> list[str]:
    """The layers a glob, a name (path suffix) or a regex selects; tied ones go to ``skipped``.

    Raises:
        TargetNotFoundError: it matches a quantized layer, no supported layer, or only unroutable or tied ones.
    """
    match, desc = _matcher(entry), _describe(entry)
    hit = {p: why for p, why in kept.items() if match(p)}
    if hit:
        raise _quantized_error(hit, f"{desc} matches")
    matches = [p for p in supported if match(p)]
    if not matches:
        others = [p for p in modules if p and match(p)]
        if others:
            kinds = sorted({type(modules[p]).__name__ for p in others})
            raise TargetNotFoundError(
                f"{desc} matches {len(others)} module(s) ({', '.join(kinds)}: {others[:3]}) but no nn.Linear or "
                f"nn.Embedding; a glob such as '*.{others[0].rpartition('.')[2]}.*' selects the layers inside "
                f"them; {TARGET_FORMS}"
            )
        shown = entry.pattern if isinstance(entry, re.Pattern) else entry
        raise TargetNotFoundError(
            f"{desc} matches no nn.Linear or nn.Embedding; {_suggest(shown, supported)}; {TARGET_FORMS}"
        )
    routable = [p for p in matches if p not in unroutable]
    if not routable:
        raise TargetNotFoundError(
            f"{desc} matches only unroutable layers: " + "; ".join(unroutable[p] for p in unroutable if match(p))
        )
    if all(p in tied for p in routable):
        raise TargetNotFoundError(
            f"{desc} matches only layers with tied weights: " + "; ".join(_tied_message(p, tied[p]) for p in routable)
        )
    skipped += [p for p in routable if p in tied and p not in skipped]
    return [p for p in routable if p not in tied]


def _excluded(model: nn.Module, modules: dict[str, nn.Module], layers: dict[str, Any], patterns: list[str]) -> set[str]:
    """Every module path an exclusion matches, with the modules below it (``'!model.layers.0'`` drops that block)."""
    out: set[str] = set()
    for pattern in patterns:
        if not pattern:
            raise TargetNotFoundError("a `lora_targets` exclusion is '!' alone; write '!<path, name or glob>'")
        kind = _kind(pattern)
        if kind == "all-linear":
            raise TargetNotFoundError(
                f"'!{pattern}' would exclude every layer; exclusions take a path, a name or a glob ({TARGET_FORMS})"
            )
        match = (lambda p, pattern=pattern: p == pattern) if kind == "path" else _matcher(pattern)
        hit = [p for p in modules if p and match(p)]
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


def _suggest(entry: str, supported: Mapping[str, nn.Module]) -> str:
    """The closest ``nn.Linear`` paths to ``entry`` (or layer names, for a dot-free name)."""
    linear = [p for p, m in supported.items() if isinstance(m, nn.Linear)] or list(supported)
    if not linear:
        return "the model has no nn.Linear layers"
    if "." not in entry and not entry.isdigit() and not any(ch in entry for ch in "*?["):
        names = list(dict.fromkeys(p.rpartition(".")[2] for p in linear))
        close = difflib.get_close_matches(entry, names, n=3, cutoff=0.0)
        return "closest nn.Linear names: " + ", ".join(repr(n) for n in close)
    close = difflib.get_close_matches(entry, linear, n=3, cutoff=0.0)
    return "closest nn.Linear paths: " + ", ".join(repr(p) for p in close)
