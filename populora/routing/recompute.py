"""Gradient checkpointing under a route: the layers recomputed during backward are routed as they were.

Hugging Face models checkpoint their blocks with ``gradient_checkpointing_enable()``: each block's forward
runs through ``torch.utils.checkpoint`` (the function HF stores on the block), and backward runs the block
again to recompute what it did not keep. By then the routed forward has ended and its route is no longer
active, so the recomputed target layers would run unrouted and the gradients would be those of another
model. :func:`follow_checkpointing` wraps each block's checkpoint function once per router: the function it
checkpoints re-enters the route of the forward that called it whenever it runs outside that forward (the
recomputation), and does nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from populora.routing.router import Active, Router

__all__ = ["follow_checkpointing"]

_FUNC = "_gradient_checkpointing_func"  # where Hugging Face keeps a block's checkpoint function


class RoutedCheckpoint:
    """A block's checkpoint function whose recomputation re-enters the route of its forward."""

    def __init__(self, router: Router, inner: Callable[..., Any]):
        self.router, self.inner = router, inner

    def __call__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        router, activation = self.router, self.router.active
        if activation is None:
            return self.inner(function, *args, **kwargs)

        def routed(*a: Any, **k: Any) -> Any:
            if router.active is activation:  # the forward itself
                return function(*a, **k)
            with Active(router, activation):  # the recomputation in backward: the same route again
                return function(*a, **k)

        return self.inner(routed, *args, **kwargs)


def follow_checkpointing(model: nn.Module, router: Router) -> None:
    """Wrap every checkpoint function ``model``'s blocks hold (once per router) with :class:`RoutedCheckpoint`.

    Cheap when there is nothing to do: only models with ``gradient_checkpointing_enable`` (Hugging Face's)
    are walked, and only while they train with gradients enabled (the callers check).
    """
    if not hasattr(model, "gradient_checkpointing_enable"):
        return
    for module in model.modules():
        inner = getattr(module, _FUNC, None)
        if inner is None or _wraps(inner, router):
            continue
        setattr(module, _FUNC, RoutedCheckpoint(router, inner))


def _wraps(fn: Any, router: Router) -> bool:
    """Whether ``fn`` is, or wraps, a :class:`RoutedCheckpoint` of ``router`` (several populations may share
    one model: each wraps the function once)."""
    while isinstance(fn, RoutedCheckpoint):
        if fn.router is router:
            return True
        fn = fn.inner
    return False
