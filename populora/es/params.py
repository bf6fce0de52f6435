"""Which parameters ES perturbs, and how each is reached: routed, or through the fallback.

The routed path (:mod:`populora.routing`) perturbs, per member and without
copying weights, inside ONE batched forward:

- ``nn.Linear.weight`` (``(e, d)``): low rank, ``(x down) up^T`` added to the output;
- ``nn.Embedding.weight`` (``(V, e)``): low rank, routed by token;
- ``nn.Linear.bias`` (``(e,)``): full Gaussian noise added to each member's rows.

Every other selected parameter (a LayerNorm gain, a bare ``nn.Parameter``
used in any expression, a convolution kernel, ``nn.MultiheadAttention``'s
packed projections) is *unroutable*: it is perturbed through the fallback
(each member's value materialised and swapped in with
``torch.func.functional_call``; low-rank noise for a 2-D parameter, full
Gaussian noise otherwise), or frozen, as the ES class decides. A parameter
shared by several modules (tied embedding and output head) is one parameter
with one perturbation: routed through each of its owners when all of them are
routable, else through the fallback as a whole.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from populora.errors import InvalidTypeError, InvalidValueError
from populora.targets import unroutable_reason

__all__ = ["ESParam", "Owner", "call_filter", "make_optimizer", "select_params"]


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
        rank: effective low rank ``min(r, R, C)`` for a 2-D parameter, ``None`` for full noise.
        owners: the modules it is routed through (empty for a fallback parameter).
        routed: perturbed by the routed forward (else by the ``functional_call`` fallback).
        why: for a fallback parameter, why the routed path cannot reach it.
    """

    name: str
    param: nn.Parameter
    rank: int | None
    owners: list[Owner] = field(default_factory=list)
    routed: bool = True
    why: str = ""


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
        raise InvalidTypeError(
            f"`param_filter` must take (name, param) or (name), got signature {inspect.signature(fn)}"
        )
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


def _bypassed(model: nn.Module) -> dict[str, str]:
    """Linear layers whose owner never calls their forward (``nn.MultiheadAttention.out_proj``)."""
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            where = f"{path}.out_proj" if path else "out_proj"
            found[where] = (
                f"nn.MultiheadAttention '{path or '<root>'}' uses its out_proj weight directly and "
                "never calls out_proj's forward"
            )
    return found


def _routable(owner: Owner, bypassed: dict[str, str]) -> str | None:
    """Why the routed path cannot perturb this use of a parameter, or ``None`` if it can."""
    module, where = owner.module, owner.path or "<root>"
    if owner.path in bypassed:
        return bypassed[owner.path]
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
    """The parameters ES perturbs, in ``named_parameters()`` order, each marked routed or not.

    Candidates are the parameters that require grad and pass ``param_filter``
    (a tied parameter is one candidate, under its first name). 1-D parameters
    are skipped when ``perturb_vectors`` is False. A candidate is routed when
    every module using it is an ``nn.Linear`` (as weight or bias) or an
    ``nn.Embedding`` (as weight) whose forward the model calls; otherwise it
    is returned with ``routed=False`` and the reason in ``why``.

    Raises:
        InvalidValueError: if nothing is selected.
    """
    owners = _owners(model)
    bypassed = _bypassed(model)
    chosen: list[ESParam] = []
    for name, param in model.named_parameters():
        if not param.requires_grad or not call_filter(param_filter, name, param, param_first=param_first):
            continue
        if param.dim() <= 1 and not perturb_vectors:
            continue
        uses = owners.get(id(param), [])
        problems = [why for why in (_routable(o, bypassed) for o in uses) if why is not None]
        low = min(rank, *param.shape) if param.dim() == 2 else None
        if not problems and param.dim() == 2 and uses and all(o.attr == "weight" for o in uses):
            chosen.append(ESParam(name, param, low, uses))
        elif not problems and param.dim() == 1 and uses and all(o.attr == "bias" for o in uses):
            chosen.append(ESParam(name, param, None, uses))
        else:
            why = "; ".join(dict.fromkeys(problems)) or f"it has shape {tuple(param.shape)}"
            chosen.append(ESParam(name, param, low, [], routed=False, why=why))
    if not chosen:
        raise InvalidValueError(
            "no parameters selected for ES: every parameter was left out by `param_filter`, does not require "
            "grad, or is a 1-D parameter frozen by `perturb_vectors=False`"
        )
    return chosen


def make_optimizer(params: list[ESParam], optimizer: Any, lr: float | None) -> torch.optim.Optimizer:
    """The ES optimizer: ``SGD(lr)`` over ``params`` by default, else ``optimizer`` (or ``optimizer(params)``).

    Raises:
        InvalidTypeError: a factory that does not return a ``torch.optim.Optimizer``.
        InvalidValueError: an optimizer that does not hold every selected parameter (they are named).
    """
    tensors = [p.param for p in params]
    if optimizer is None:
        if lr is None:
            raise InvalidValueError("`lr` must be a number when no `optimizer` is given, got None")
        return torch.optim.SGD(tensors, lr=lr)
    if lr is not None:
        warnings.warn(
            f"`lr={lr}` is ignored because `optimizer` was given; set the learning rate on the "
            "optimizer (and pass lr=None)",
            UserWarning,
            stacklevel=3,
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer(tensors)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidTypeError(
                f"`optimizer` factory must return a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
    held = {id(q) for group in optimizer.param_groups for q in group["params"]}
    missing = [p.name for p in params if id(p.param) not in held]
    if missing:
        raise InvalidValueError(
            f"`optimizer` does not hold the selected parameters {missing}; build it over "
            "model.parameters() or pass a factory `lambda params: torch.optim.Adam(params, lr=...)`"
        )
    return optimizer
