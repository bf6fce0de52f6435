"""Host-side work that runs eagerly under ``torch.compile``, without importing ``torch._dynamo`` up front.

``torch.compiler.disable`` used as a decorator imports ``torch._dynamo`` (seconds) when the decorated module
is imported. :func:`outside_graph` makes the disabled function on its first call instead: that call only
happens under ``torch.compile`` (the callers check ``torch.compiler.is_compiling()``), when dynamo is loaded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["outside_graph"]

F = TypeVar("F", bound=Callable[..., Any])


def outside_graph(fn: F) -> F:
    """``fn`` run outside the traced graph when called under ``torch.compile`` (a graph input, not traced)."""
    disabled: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call  # type: ignore[return-value]
