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
from typing import Any, NamedTuple

from torch import nn

from populora.routing.router import Router

__all__ = ["hold", "register", "release", "unwind"]


class _Holders(NamedTuple):
    flags: dict[str, bool]  # the user's requires_grad flags, recorded by the first holder
    live: weakref.WeakSet  # the populations holding the model (neither merged nor closed)


_HELD: weakref.WeakKeyDictionary[nn.Module, _Holders] = weakref.WeakKeyDictionary()


def hold(population: Any, model: nn.Module) -> dict[str, bool]:
    """Register ``population`` as live on ``model`` and freeze it; returns the user's flags to restore.

    The flags are the model's own (``{parameter name: requires_grad}``) when
    no other population holds it, else the ones the first holder recorded.
    """
    held = _HELD.get(model)
    if held is None or not held.live:
        held = _HELD[model] = _Holders(
            {name: p.requires_grad for name, p in model.named_parameters()}, weakref.WeakSet()
        )
    model.requires_grad_(False)
    held.live.add(population)
    return held.flags


def register(population: Any, model: nn.Module, flags: dict[str, bool]) -> None:
    """Count ``population`` among ``model``'s live holders (a deep copy of a live population, with its flags)."""
    held = _HELD.get(model)
    if held is None or not held.live:
        held = _HELD[model] = _Holders(dict(flags), weakref.WeakSet())
    held.live.add(population)


def release(population: Any, model: nn.Module, modules: Iterable[nn.Module]) -> None:
    """``population`` lets go of ``model`` (its router already removed); the last holder restores the flags."""
    unwind(modules)
    held = _HELD.get(model)
    if held is None:
        return
    held.live.discard(population)
    if not held.live:
        for name, param in model.named_parameters():
            param.requires_grad_(held.flags.get(name, True))


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
                isinstance(forward, partial) and isinstance(owner, Router) and owner.removed and len(forward.args) >= 2
            ):
                break
            inner = forward.args[1]  # Router wraps as partial(router.layer_forward, i, inner, module)
            if isinstance(inner, MethodType) and inner.__self__ is module and inner.__func__ is type(module).forward:
                del module.forward
            else:
                module.forward = inner
