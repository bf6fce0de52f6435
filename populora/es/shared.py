"""The first ES layer of a shared batch: its base product computed once, not once per member.

With a shared batch (every member sees the same ``(b, ..)`` rows, the ES
default) the routing front end repeats the rows for each of the ``N``
members, so the first target layer a forward reaches usually gets ``N``
identical copies of the same ``b`` rows: nothing has perturbed them yet.
Its base product ``x W^T + bias`` is then the same for every member, and
:func:`shared_rows_linear` computes it once, on ``b`` rows, and adds each
member's delta to it:

    out[i] = (x_b W^T + bias) + [x_b down_i, 1] @ [up_i; bias_i]      (k, b*.., e)

``x_b down_i`` for all members is one product ``(k r, d) @ (d, b*..)``. The
rows are checked to be copies (one row first, then all of them: a read of
the input, far cheaper than the product it saves), so a model that makes
its rows differ before its first target layer (positional noise, row
indices) takes the ordinary path. Only the first target layer of a forward
is tried, so a forward pays the check at most once. The result equals the
ordinary path's up to float rounding (the base product runs on ``b`` rows
instead of ``N b``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from populora.adapters import Adapter
from populora.es.fold import folded_stack
from populora.routing.delta import gather_budget
from populora.routing.route import Route

__all__ = ["shared_rows_linear"]


def shared_rows_linear(
    module: nn.Module, inner: Callable, x: Tensor, route: Route, adapter: Adapter, times: int, rows: int
) -> Tensor | None:
    """The layer's routed output from one base product over ``rows`` rows, or ``None`` (nothing computed).

    Args:
        module: the target layer; only a plain ``nn.Linear`` running the class's forward qualifies.
        inner: the forward the router wrapped (called on ``(rows, .., d)``).
        x: ``(times * rows, .., d)`` the layer's input, ``times`` groups of ``rows`` rows.
        route: the active route (``times`` groups of ``rows`` rows; ``index`` ``None``, a ``slice`` or ids).
        adapter: ``down (N, r, d)``, ``up (N, r, e)``, optional ``bias (N, e)``.
        times: how many times the front end repeated the user's batch.
        rows: rows of the user's batch.

    Returns:
        ``(times * rows, .., e)`` when every group of rows is a copy of the first, else ``None``.
    """
    down, up, bias = adapter
    index, k = route.index, route.groups
    if (
        type(module) is not nn.Linear
        or getattr(inner, "__func__", None) is not nn.Linear.forward
        or times < 2
        or route.dest is not None
        or k != times
        or route.chunk != rows
        or rows < 1
        or x.dim() < 2
        or x.shape[0] != route.n
        or route.n != k * rows
        or x.shape[-1] != down.shape[-1]
        or any(t is not None and t.dtype != x.dtype for t in (down, up, bias, module.weight))
    ):
        return None
    if not (rows == 1 and x.stride(0) == 0):  # (one row expanded: copies by construction)
        groups = x.reshape(k, -1)  # (k, rows*..*d)
        d = x.shape[-1]
        if not torch.equal(groups[1, :d], groups[0, :d]) or not torch.equal(groups, groups[:1].expand_as(groups)):
            return None  # the rows differ: not a shared batch (any more)
    folded = folded_stack(up, bias)
    if isinstance(index, Tensor):  # gathered stacks (a range of members): within the router's budget, in one go
        per_group = (up.shape[1] * (x.shape[-1] + up.shape[-1]) + up.shape[-1]) * down.element_size()
        if k * per_group > gather_budget(x.device, 2 * x.numel() * x.element_size()):
            return None
    if index is not None:
        take = (lambda t: t.index_select(0, index)) if isinstance(index, Tensor) else (lambda t: t[index])
        down, up = take(down), take(up)
        bias = None if bias is None else take(bias)
        folded = None if folded is None else take(folded)
    if down.shape[0] != k:
        return None
    first = x[:rows]  # (rows, .., d)
    base = inner(first)  # (rows, .., e): the base product, once
    d, e, r = x.shape[-1], base.shape[-1], up.shape[1]
    flat = first.reshape(-1, d)  # (m, d), m = rows*..
    h = (down.reshape(k * r, d) @ flat.T).view(k, r, flat.shape[0]).transpose(1, 2)  # (k, m, r): each x_b down_i
    if bias is not None:  # [h, 1] @ [up; bias]: the bias noise in the same product
        h = torch.cat((h, h.new_ones(*h.shape[:-1], 1)), dim=-1)
        up = folded if folded is not None else torch.cat((up, bias[:, None, :]), dim=1)
    out = torch.baddbmm(base.reshape(1, -1, e), h, up)  # (k, m, e) = base + delta_i, written once
    return out.view(route.n, *x.shape[1:-1], e)
