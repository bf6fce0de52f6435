"""Populations on a user's model: who holds it, the user's ``requires_grad`` flags, unwrapping.

A population wraps its target layers' forwards in place (see
:mod:`populora.routing`) and freezes the model while it is live. Several
populations may share one model: the first to wrap it records the user's
flags, the model stays frozen while any of them is live, and the last one to
close (or merge) gives the flags back, whatever the order. Each closes its own
wrappers; a wrapper that another population wrapped again stays a
pass-through until that one closes too (:func:`unwind`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from functools import partial
from types import MethodType
from typing import Any

from torch import nn

from populora.routing.front import Router

__all__: list[str] = []

# The live (not merged, not closed) populations on each base model.
_LIVE: weakref.WeakKeyDictionary[nn.Module, weakref.WeakSet] = weakref.WeakKeyDictionary()


def live_on(model: nn.Module) -> list[Any]:
    """The populations wrapping ``model`` that are neither merged nor closed."""
    return [pop for pop in _LIVE.get(model, ()) if not pop._spent]


def hold(population: Any, model: nn.Module) -> dict[str, bool]:
    """Register ``population`` as live on ``model`` and freeze it; returns the user's flags to restore.

    The flags are the model's own (``{parameter name: requires_grad}``) when
    no other population holds it, else the ones the first holder recorded.
    """
    others = live_on(model)
    flags = (
        dict(others[0]._base_requires_grad)
        if others
        else {name: p.requires_grad for name, p in model.named_parameters()}
    )
    model.requires_grad_(False)
    register(population, model)
    return flags


def register(population: Any, model: nn.Module) -> None:
    """Count ``population`` among ``model``'s live holders (a deep copy of a live population, say)."""
    _LIVE.setdefault(model, weakref.WeakSet()).add(population)


def release(population: Any, model: nn.Module, modules: Iterable[nn.Module], flags: dict[str, bool]) -> None:
    """``population`` lets go of ``model`` (its router already removed); the last holder restores ``flags``."""
    unwind(modules)
    live = _LIVE.get(model)
    if live is not None:
        live.discard(population)
    if not live_on(model):
        for name, param in model.named_parameters():
            param.requires_grad_(flags.get(name, True))


def unwind(modules: Iterable[nn.Module]) -> None:
    """Drop the wrappers of removed routers left on top of each module's forward chain.

    A router that is removed while another one wraps its wrapper leaves it in
    the chain as a pass-through; once the outer wrapper is removed too, the
    pass-through is the module's forward. Peel such wrappers until a live one
    (or the class's forward) is on top.
    """
    for module in modules:
        while True:
            forward = vars(module).get("forward")
            owner = getattr(getattr(forward, "func", None), "__self__", None)
            if not (
                isinstance(forward, partial) and isinstance(owner, Router) and owner._removed and len(forward.args) >= 2
            ):
                break
            inner = forward.args[1]  # Router wraps as partial(router._forward, i, inner, module)
            if isinstance(inner, MethodType) and inner.__self__ is module and inner.__func__ is type(module).forward:
                del module.forward
            else:
                module.forward = inner
