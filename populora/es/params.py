"""Which parameters ES perturbs, and how the routed forward reaches each of them.

The routed path (:mod:`populora.routing`) can perturb, per member and without
copying weights:

- ``nn.Linear.weight`` (``(e, d)``): low rank, ``(x down) up^T`` added to the output;
- ``nn.Embedding.weight`` (``(V, e)``): low rank, routed by token;
- ``nn.Linear.bias`` (``(e,)``): full Gaussian noise added to each member's rows.

Anything else (a LayerNorm gain, a bare ``nn.Parameter`` used in ``forward``,
a convolution kernel, ``nn.MultiheadAttention``'s packed projections) cannot
be perturbed per member in one forward, so it is rejected up front by name;
the message says how to leave it out (``param_filter``, or
``perturb_vectors=False`` for 1-D parameters). A parameter shared by several
modules (tied embedding and output head) is perturbed consistently in each.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from ..errors import TargetNotFoundError
from ..targets import find_targets, unroutable_reason

__all__ = ["ESParam", "Owner", "call_filter", "select_params"]


@dataclass(frozen=True)
class Owner:
    """One module that uses a selected parameter, and as what."""

    path: str
    module: nn.Module
    attr: str  # "weight" or "bias"


@dataclass
class ESParam:
    """A parameter that ES perturbs.

    Attributes:
        name: its name in ``model.named_parameters()``.
        param: the parameter itself.
        rank: effective low rank ``min(r, R, C)`` for a matrix, ``None`` for full noise.
        owners: the modules it is routed through.
    """

    name: str
    param: nn.Parameter
    rank: int | None
    owners: list[Owner] = field(default_factory=list)

    @property
    def is_matrix(self) -> bool:
        return self.rank is not None


def _arity(fn: Callable) -> int:
    """Number of positional arguments ``fn`` wants: 1 or 2 (2 if it cannot be told)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 2
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) == 1 or (not required and len(positional) == 1):
        return 1
    if len(required) > 2:
        raise TypeError(f"`param_filter` must take (name, param) or (name), got signature {inspect.signature(fn)}")
    return 2


def call_filter(fn: Callable | None, name: str, param: nn.Parameter, *, param_first: bool = False) -> bool:
    """Apply a user's parameter filter of either arity.

    A one-argument filter gets the name. A two-argument filter gets
    ``(name, param)``, or ``(param, name)`` with ``param_first`` (the order
    torcheggroll uses). ``None`` keeps everything.
    """
    if fn is None:
        return True
    if _arity(fn) == 1:
        return bool(fn(name))
    return bool(fn(param, name) if param_first else fn(name, param))


def _owners(model: nn.Module) -> dict[int, list[Owner]]:
    found: dict[int, list[Owner]] = {}
    for path, module in model.named_modules():
        for attr, p in module.named_parameters(recurse=False):
            found.setdefault(id(p), []).append(Owner(path, module, attr))
    return found


def _routable(owner: Owner) -> str | None:
    """Why the routed path cannot perturb this use of a parameter, or ``None`` if it can."""
    module, where = owner.module, owner.path or "<root>"
    for kind, attrs in ((nn.Linear, ("weight", "bias")), (nn.Embedding, ("weight",))):
        if isinstance(module, kind) and owner.attr in attrs:
            return unroutable_reason(module, owner.path)
    return f"it is `{owner.attr}` of {type(module).__name__} '{where}'"


def select_params(
    model: nn.Module,
    rank: int,
    param_filter: Callable | None,
    perturb_vectors: bool,
    *,
    param_first: bool = False,
) -> list[ESParam]:
    """The parameters ES perturbs, in ``named_parameters()`` order.

    Candidates are the parameters that require grad and pass ``param_filter``.
    1-D parameters are frozen (skipped) when ``perturb_vectors`` is False.

    Raises:
        ValueError: if nothing is selected, or a selected parameter cannot be
            perturbed by the routed forward (every such parameter is named,
            with the ways to exclude it).
    """
    owners = _owners(model)
    chosen: list[ESParam] = []
    rejected: list[str] = []
    for name, param in model.named_parameters():
        if not param.requires_grad or not call_filter(param_filter, name, param, param_first=param_first):
            continue
        uses = owners.get(id(param), [])
        problems = [why for why in map(_routable, uses) if why is not None]
        is_vector = param.dim() <= 1
        if is_vector and not perturb_vectors:
            continue
        if not problems and param.dim() == 2 and all(o.attr == "weight" for o in uses):
            chosen.append(ESParam(name, param, min(rank, *param.shape), uses))
        elif not problems and param.dim() == 1 and all(o.attr == "bias" for o in uses):
            chosen.append(ESParam(name, param, None, uses))
        else:
            why = "; ".join(problems) or f"it has shape {tuple(param.shape)}"
            rejected.append(f"{name!r} ({why})")
    if rejected:
        raise ValueError(
            "the routed ES forward can only perturb nn.Linear weights and biases and nn.Embedding weights, "
            f"but these selected parameters are something else: {', '.join(rejected)}. Leave them out with "
            "`param_filter` (e.g. param_filter=lambda name: 'norm' not in name), freeze them with "
            "`requires_grad_(False)`, or pass `perturb_vectors=False` to freeze every 1-D parameter"
        )
    if not chosen:
        raise ValueError(
            "no parameters selected for ES: every parameter was left out by `param_filter`, does not require "
            "grad, or is a 1-D parameter frozen by `perturb_vectors=False`"
        )
    _check_unroutable_linears(model, chosen)
    return chosen


def _check_unroutable_linears(model: nn.Module, chosen: list[ESParam]) -> None:
    """Linear layers whose owner bypasses their forward (nn.MultiheadAttention.out_proj) are refused."""
    paths = sorted({o.path for p in chosen for o in p.owners})
    try:
        find_targets(model, paths)
    except TargetNotFoundError as error:
        raise ValueError(f"{error}. Leave its parameters out with `param_filter`") from None
