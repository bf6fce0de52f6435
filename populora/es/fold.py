"""The ES delta of an ``nn.Linear`` with a perturbed bias, read in place from the folded stacks.

The routing layer adds a bias with the low-rank delta in one product,
``[h, 1] @ [up; bias]`` (``r + 1`` columns), and builds ``[up; bias]`` by
concatenating the two stacks: a copy of every member's ``up`` on every
forward. :class:`~populora.es.factors.MemberFactors` writes ``up`` and the
bias noise into ONE ``(N, r + 1, e)`` buffer instead (``up`` its rows
``[:r]``, the bias row ``r``), so :func:`folded_apply` reads that buffer as
it is: each forward reads the adapters once and copies none of them. The
product, its shapes and its operands' values are the generic path's, so the
output is bitwise the same.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from populora.adapters import Adapter
from populora.routing.delta import gather_budget
from populora.routing.route import Route

__all__ = ["folded_apply", "folded_stack"]


def folded_stack(up: Tensor, bias: Tensor | None) -> Tensor | None:
    """``(N, r + 1, e)``: the buffer that ``up (N, r, e)`` and ``bias (N, e)`` are views of, else ``None``."""
    if bias is None or up.dim() != 3 or bias.dim() != 2 or up.dtype != bias.dtype or up.device != bias.device:
        return None
    n, r, e = up.shape
    step = (r + 1) * e
    if (
        bias.shape != (n, e)
        or up.stride() != (step, e, 1)
        or bias.stride() != (step, 1)
        or bias.untyped_storage().data_ptr() != up.untyped_storage().data_ptr()
        or bias.storage_offset() != up.storage_offset() + r * e
    ):
        return None
    return up.as_strided((n, r + 1, e), (step, e, 1))


def folded_apply(module: nn.Module, x: Tensor, out: Tensor, route: Route, adapter: Adapter) -> Tensor | None:
    """``out`` plus each group's delta and bias noise, in place; ``None`` (nothing done) outside the folded case.

    Args:
        module: the target layer (an ``nn.Linear``).
        x: ``(n, .., d)`` its input, rows laid out ``(k c)``.
        out: ``(n, .., e)`` its base output.
        route: the active route: equal groups in ``(k c)`` layout (``index`` ``None``, a ``slice``, or ids
            whose gathered stacks fit the router's :func:`~populora.router.gather_budget` in one block).
        adapter: ``down (N, r, d)``, and ``up (N, r, e)`` / ``bias (N, e)`` views of one folded stack.
    """
    down, up, bias = adapter
    index, k = route.index, route.groups
    if (
        type(module) is not nn.Linear
        or route.dest is not None
        or route.n == 0
        or x.dim() < 2
        or x.shape[0] != route.n
        or not out.is_contiguous()
        or not (x.dtype == out.dtype == down.dtype == up.dtype)
        or x.shape[-1] != down.shape[-1]
    ):
        return None
    folded = folded_stack(up, bias)
    if folded is None:
        return None
    if isinstance(index, Tensor):  # a gather per group (e.g. a range of members): one block only, as the router
        rank, e = up.shape[1], out.shape[-1]
        per_group = (rank * e + rank * down.shape[-1] + e) * down.element_size()
        if k * per_group > gather_budget(out.device, (x.numel() + out.numel()) * out.element_size()):
            return None  # the router processes the groups in blocks
        down, folded = down.index_select(0, index), folded.index_select(0, index)
    elif isinstance(index, slice):
        down, folded = down[index], folded[index]
    if down.shape[0] != k:
        return None
    # as the routing layer: (k, r, d) @ (k, d, c*..) -> (k, r, c*..), then [h, 1] @ [up; bias] added in place
    h = torch.bmm(down, x.reshape(k, -1, x.shape[-1]).transpose(1, 2)).transpose(1, 2)  # (k, c*.., r)
    h = torch.cat((h, h.new_ones(*h.shape[:-1], 1)), dim=-1)  # (k, c*.., r+1)
    out.view(k, -1, out.shape[-1]).baddbmm_(h, folded)  # (k, c*.., e) += (k, c*.., r+1) @ (k, r+1, e)
    return out
