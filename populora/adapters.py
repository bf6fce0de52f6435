"""The two layouts of stacked LoRA factors, and the conversions between them.

Shared by every layer (routing, operators, population, ES); imports only torch.

- :class:`Factors` is the public layout, the one users and the operators see:
  ``down (p, d, r)``, ``up (p, e, r)``; individual ``i`` adds
  ``dW_i = up[i] @ down[i].T`` (``(e, d)``) to an ``nn.Linear`` weight, or
  ``down[i] @ up[i].T`` (``(V, e)``) to an ``nn.Embedding`` table.
- :class:`Adapter` is the routing layout, the one the routed matmuls read
  fastest: ``down`` transposed for ``nn.Linear`` (``(p, r, d)``: each
  individual's rows contiguous), kept ``(p, V, r)`` for ``nn.Embedding`` (a
  table gathered by token); ``up`` transposed, ``(p, r, e)``.

:func:`to_adapter` and :func:`to_factors` convert between them: views, no
copies, so writing into one writes the other.

Example:
    >>> import torch
    >>> f = Factors(torch.zeros(4, 3, 2), torch.zeros(4, 5, 2))
    >>> tuple(to_adapter(f, embedding=False).down.shape)
    (4, 2, 3)
    >>> to_factors(to_adapter(f, embedding=False), embedding=False).down.shape == f.down.shape
    True
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

__all__ = ["Adapter", "Factors", "to_adapter", "to_factors", "weight_adapter"]


class Factors(NamedTuple):
    """The two LoRA factors of one target layer.

    ``down`` is ``(p, d, r)`` and ``up`` is ``(p, e, r)``: individual ``i``
    adds ``dW_i = up[i] @ down[i].T`` (shape ``(e, d)``) to the layer.
    """

    down: Tensor
    up: Tensor


class Adapter(NamedTuple):
    """Stacked low-rank factors of one target layer, in the layout the hot path reads.

    Attributes:
        down: ``(p, r, d)`` for ``nn.Linear`` (``down`` transposed, so each
            individual's rows are contiguous for the batched matmul);
            ``(p, V, r)`` for ``nn.Embedding`` (a table gathered by token).
        up: ``(p, r, e)`` (``up`` transposed).
        bias: optional ``(p, e)``, added to every row of its individual (ES
            perturbs biases this way).
    """

    down: Tensor
    up: Tensor
    bias: Tensor | None = None


def to_adapter(factors: Factors, embedding: bool) -> Adapter:
    """``Factors(down (p, d, r), up (p, e, r))`` as an :class:`Adapter` (views).

    Args:
        factors: one target's stacks in the public layout.
        embedding: the target is an ``nn.Embedding`` (``down`` stays ``(p, V, r)``).
    """
    down, up = factors
    return Adapter(down if embedding else down.transpose(1, 2), up.transpose(1, 2))


def to_factors(adapter: Adapter, embedding: bool) -> Factors:
    """An :class:`Adapter` as ``Factors(down (p, d, r), up (p, e, r))`` (views; the bias is dropped).

    Args:
        adapter: one target's stacks in the routing layout.
        embedding: the target is an ``nn.Embedding``.
    """
    down, up = adapter.down, adapter.up
    return Factors(down if embedding else down.transpose(1, 2), up.transpose(1, 2))


def weight_adapter(rows: Tensor, cols: Tensor, embedding: bool, bias: Tensor | None = None) -> Adapter:
    """The :class:`Adapter` that adds ``rows[i].T @ cols[i]`` to a weight ``W (R, C)`` as stored by torch.

    ``nn.Linear`` stores ``W (e, d)`` (``rows`` is ``(p, r, e)``, ``cols``
    ``(p, r, d)``); ``nn.Embedding`` stores ``W (V, e)`` (``rows`` is
    ``(p, r, V)``, ``cols`` ``(p, r, e)``). For factors drawn per weight
    entry layout, as ES noise is.

    Example:
        >>> import torch
        >>> rows, cols = torch.randn(2, 1, 3), torch.randn(2, 1, 4)  # a Linear with W (3, 4)
        >>> a = weight_adapter(rows, cols, embedding=False)
        >>> torch.allclose(a.up[0].T @ a.down[0], rows[0].T @ cols[0])
        True
    """
    if embedding:
        return Adapter(rows.transpose(1, 2), cols, bias)
    return Adapter(cols, rows, bias)
